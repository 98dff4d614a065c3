// Terminals and signals through the daemons the tests were pointed at: a terminal over the TCP
// daemon (SEALGATE_TEST_TCP) through Node's global WebSocket, typed, resized and ended; where
// Node has no WebSocket, or the daemon is a unix socket, `unsupported`; a trapped TERM.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Client, Sandbox } from '@sealgate/sandbox';
import { policy, refused, skip, withSandbox } from './helpers.js';

const url = process.env.SEALGATE_TEST_TCP ?? '';
const key = process.env.SEALGATE_TEST_TCP_KEY ?? '';

/** What `terminal` shows until `mark` (bounded).
 * @param {import('@sealgate/sandbox').Terminal} terminal @param {string} mark */
function shown(terminal, mark) {
  return new Promise((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`never shown: ${mark}; saw ${seen}`)), 20000);
    terminal.onData((data) => {
      seen += data.toString();
      if (seen.includes(mark)) {
        clearTimeout(timer);
        resolve(seen);
      }
    });
  });
}

test('a terminal over TCP: typed, resized, its exit status', { skip: url ? false : 'no SEALGATE_TEST_TCP' },
  async () => {
    const sb = await Sandbox.create(policy, { daemon: url, key });
    try {
      if (typeof (/** @type {any} */ (globalThis).WebSocket) !== 'function') {
        await assert.rejects(sb.pty(), refused('unsupported', 0));
        return;
      }
      const terminal = await sb.pty({ rows: 30, cols: 100, argv: ['sh', '-i'] });
      const first = shown(terminal, '30 100');
      terminal.write('stty size\n');
      await first;
      terminal.resize(12, 34);
      const resized = shown(terminal, '12 34');
      const asking = setInterval(() => terminal.write('stty size\n'), 300); // until it shows
      try {
        await resized;
      } finally {
        clearInterval(asking);
      }
      terminal.write('exit 3\n');
      assert.equal((await terminal.wait()).exitCode, 3);
    } finally {
      await sb.delete();
    }
  });

test('no terminal without a WebSocket, nor to a unix socket', { skip }, async () => {
  await withSandbox(async (sb) => {
    await assert.rejects(sb.pty(), refused('unsupported', 0)); // the unix socket's daemon
    const saved = Object.getOwnPropertyDescriptor(globalThis, 'WebSocket');
    Object.defineProperty(globalThis, 'WebSocket', { value: undefined, configurable: true });
    try {
      await assert.rejects(new Sandbox(new Client({ daemon: 'http://127.0.0.1:9' }), sb.info)
        .pty(), refused('unsupported', 0));
    } finally {
      if (saved) Object.defineProperty(globalThis, 'WebSocket', saved);
      else delete (/** @type {any} */ (globalThis)).WebSocket;
    }
  });
});

test('a signal to a background process group', { skip }, async () => {
  await withSandbox(async (sb) => {
    const proc = await sb.start(['sh', '-c',
      "trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.1; done"]);
    for (let i = 0; i < 400; i++) {
      const events = [];
      for await (const event of proc.output({ offset: 0 })) events.push(event);
      if (events.some((e) => e.kind === 'stdout' && String(e.data).includes('ready'))) break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await proc.signal('TERM');
    assert.equal((await proc.wait({ callTimeout: 30 })).exitCode, 3);
    await assert.rejects(proc.signal(/** @type {any} */ ('BOGUS')), refused('bad_request', 400));
  });
});
