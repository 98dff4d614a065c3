// Background processes through a real daemon: output from an offset and again from the start,
// stdin written and closed, wait, kill, and the list of them.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { all, refused, skip, text, withSandbox } from './helpers.js';

const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

describe('background processes', { skip }, () => {
  test('output from an offset, stdin, wait', () => withSandbox(async (sb) => {
    const proc = await sb.start(['sh', '-c', 'for i in 1 2 3; do echo line $i; done; '
      + 'echo oops >&2; read answer; echo got $answer; exit 7']);
    assert.equal(proc.info.state, 'running');
    assert.ok(proc.pid >= 1);
    let seen = '';
    const deadline = Date.now() + 10_000;
    while (!seen.includes('line 3') && Date.now() < deadline) { // not following: what is there
      seen += text(await all(proc.output()));
      await sleep(50);
    }
    assert.equal(seen, 'line 1\nline 2\nline 3\n');
    const mark = proc.offset;
    assert.ok(mark >= seen.length);
    // A second reader from the start sees it all again, in order.
    const again = await all(proc.output({ offset: 0 }));
    assert.equal(text(again), seen);
    assert.ok(['', 'oops\n'].includes(text(again, 'stderr')));
    await proc.write('forty-two\n', { close: true });
    const rest = await all(proc.output({ offset: mark, follow: true }));
    assert.equal(text(rest), 'got forty-two\n');
    const last = rest.at(-1);
    assert.ok(last?.kind === 'exit' && last.data.exitCode === 7, JSON.stringify(last));
    assert.equal((await proc.wait()).exitCode, 7);
    const listed = await sb.processes();
    const mine = listed.find((p) => p.pid === proc.pid);
    assert.equal(mine?.info.state, 'exited');
    assert.equal(mine?.info.argv[0], 'sh');
    await assert.rejects(proc.write('late'), refused('bad_request', 400)); // stdin was closed
  }));

  test('stdin given at the start; kill', () => withSandbox(async (sb) => {
    const cat = await sb.start(['cat'], { stdin: 'given at the start\n' });
    await cat.write('and after\n', { close: true }); // its stdin stays open until closed
    const result = await cat.wait({ callTimeout: 20 });
    assert.ok(result.ok);
    assert.equal(text(await all(cat.output({ offset: 0 }))), 'given at the start\nand after\n');
    const sleeper = await sb.start(['sleep', '300']);
    await sleeper.kill();
    const ended = await sleeper.wait({ callTimeout: 20 });
    assert.equal(ended.ending, 'killed');
    assert.notEqual(ended.exitCode, 0);
    await assert.rejects(sb.client.call('GET', `/v1/sandboxes/${sb.id}/processes/999`),
      refused('no_such_process', 404));
    const once = await sb.start(['sleep', '301'], { idempotencyKey: 'start-once' });
    const again = await sb.start(['sleep', '301'], { idempotencyKey: 'start-once' });
    assert.equal(again.pid, once.pid); // a retry gets the same process
  }));

  test('a port the sandbox serves, through the daemon', () => withSandbox(async (sb) => {
    await sb.write('hello.txt', 'served from the sandbox\n');
    await sb.start(['python3', '-m', 'http.server', '8000', '--bind', '127.0.0.1',
      '--directory', '/workspace']);
    const deadline = Date.now() + 20_000;
    let got;
    while (!got && Date.now() < deadline) {
      try {
        got = await sb.port(8000, '/hello.txt');
      } catch (err) {
        refused('port_unreachable', 502)(err); // not listening yet; anything else throws
        await sleep(100);
      }
    }
    assert.equal(got?.status, 200);
    assert.equal(got?.body.toString(), 'served from the sandbox\n');
    const missing = await sb.port(8000, '/nothing-here'); // the server's 404, not an error
    assert.equal(missing.status, 404);
    assert.equal(missing.headers['x-sealgate-error'], undefined);
    await assert.rejects(sb.port(8001), refused('port_unreachable', 502));
  }));
});
