// A command running in a sandbox's background (`Sandbox.start`): its output read from where
// it was left, its stdin, its end.
import { Result, outputEvents } from './result.js';

export class Process {
  /** @param {import('./client.js').Client} client @param {string} sandbox the sandbox's id
   * @param {Record<string, any>} info */
  constructor(client, sandbox, info) {
    this.client = client;
    this.sandbox = sandbox;
    this.pid = Number(info.pid);
    this.info = info;
    /** Where its output was read to: the next `output()` goes on from here. */
    this.offset = 0;
  }

  /** @param {string} [tail] */
  path(tail = '') {
    return `/v1/sandboxes/${encodeURIComponent(this.sandbox)}/processes/${this.pid}${tail}`;
  }

  /** @param {{callTimeout?: number | null}} [opts] */
  async refresh({ callTimeout } = {}) {
    this.info = await this.client.call('GET', this.path(), undefined, { callTimeout });
    return this.info;
  }

  /** `stdout`/`stderr` Buffers from `offset` (default: where the last read ended), `lost` n
   * where the daemon's ring no longer held n bytes, and `exit` (a Result) once it has ended.
   * Without `follow` it stops at what there is now; with it, it waits for more until the
   * process ends (no call limit by default).
   * @param {{offset?: number, follow?: boolean, callTimeout?: number | null}} [opts]
   * @returns {AsyncGenerator<import('../index.js').OutputEvent>} */
  async *output({ offset, follow = false, callTimeout = null } = {}) {
    const start = offset ?? this.offset;
    const answer = await this.client.open('GET', this.path(`/output?offset=${start}&follow=${follow}`),
      null, { callTimeout });
    try {
      for await (const line of answer.lines()) {
        const read = outputEvents(line);
        this.offset = read.offset;
        yield* read.events;
      }
    } finally {
      answer.close();
    }
  }

  /** Bytes to its stdin (at most 1 MiB a call); `close` ends its stdin after them.
   * @param {Buffer | Uint8Array | string} data
   * @param {{close?: boolean, callTimeout?: number | null}} [opts] */
  async write(data, { close = false, callTimeout } = {}) {
    const answer = await this.client.open('POST', this.path(`/stdin?close=${close}`),
      Buffer.from(data), { callTimeout, headers: { 'Content-Type': 'application/octet-stream' } });
    try {
      this.info = JSON.parse((await answer.read()).toString());
    } finally {
      answer.close();
    }
  }

  /** How it ended, once it has (no call limit by default).
   * @param {{callTimeout?: number | null}} [opts] */
  async wait({ callTimeout = null } = {}) {
    return new Result(await this.client.call('GET', this.path('/wait'), undefined, { callTimeout }));
  }

  /** A signal to its process group, sent inside the sandbox: TERM, INT, HUP, QUIT, USR1,
   * USR2 or KILL. @param {string} [name] @param {{callTimeout?: number | null}} [opts] */
  async signal(name = 'TERM', { callTimeout } = {}) {
    this.info = await this.client.call('POST', this.path('/signal'), { signal: name },
      { callTimeout });
  }

  /** @param {{callTimeout?: number | null}} [opts] */
  async kill({ callTimeout } = {}) {
    await this.signal('KILL', { callTimeout });
  }
}
