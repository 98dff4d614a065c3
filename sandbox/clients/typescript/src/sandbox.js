// A live sandbox of the daemon: its commands, files, changes and end.
import { Client, GRACE } from './client.js';
import { CommandFailed, DaemonError, malformed } from './errors.js';
import { Files } from './files.js';
import { Process } from './process.js';
import { Terminal } from './terminal.js';
import { eventOf, execBody, fieldsOf, streamCut } from './result.js';

/** @typedef {import('./client.js').CallOptions} CallOptions */
/** @typedef {import('./result.js').ExecOptions & {callTimeout?: number | null}} RunOptions */

export class Sandbox {
  /** @param {Client} client @param {Record<string, any>} info */
  constructor(client, info) {
    this.client = client;
    this.info = info;
    /** @type {string} */
    this.id = info.id;
  }

  /** A new sandbox known to the proxy as `sandbox` (the id its rules name).
   * @param {string} sandbox @param {import('../index.js').CreateOptions} [opts] */
  static async create(sandbox, opts = {}) {
    if (!sandbox) throw new TypeError("name the sandbox id the rules know: Sandbox.create('ci-bot')");
    const { daemon, key, idempotencyKey, callTimeout, limits, env, ttl, idleTimeout, isolation,
      image, metadata } = opts;
    const client = new Client({ daemon, key });
    const body = fieldsOf({ sandbox, limits, env, ttl, idleTimeout, isolation, image, metadata });
    /** @type {Record<string, string>} */
    const headers = {};
    if (idempotencyKey != null) headers['Idempotency-Key'] = idempotencyKey;
    return new Sandbox(client, await client.call('POST', '/v1/sandboxes', body,
      { headers, callTimeout }));
  }

  /** A live sandbox by its id, made earlier by this caller or another (a harness that
   * restarted, a second worker); DaemonError `no_such_sandbox` / `sandbox_ended` when it is
   * not alive.
   * @param {string} id @param {{daemon?: string, key?: string, callTimeout?: number | null}} [opts] */
  static async connect(id, opts = {}) {
    const { daemon, key, callTimeout } = opts;
    const client = new Client({ daemon, key });
    return new Sandbox(client, await client.call('GET',
      `/v1/sandboxes/${encodeURIComponent(id)}`, undefined, { callTimeout }));
  }

  /** @param {string} [tail] */
  path(tail = '') {
    return `/v1/sandboxes/${encodeURIComponent(this.id)}${tail}`;
  }

  /** Delete it (everything of it); one already gone is fine. @param {CallOptions} [opts] */
  async delete({ callTimeout } = {}) {
    try {
      await this.client.call('DELETE', this.path(), undefined, { callTimeout });
    } catch (err) {
      const gone = err instanceof DaemonError
        && (err.reason === 'no_such_sandbox' || err.reason === 'sandbox_ended');
      if (!gone) throw err;
    }
  }

  /** Change it while it runs: `ttl` seconds left from now, its idle timeout, its labels (all
   * replaced), who it is to the proxy (`sandbox`: another id of the rules).
   * @param {{ttl?: number, idleTimeout?: number, metadata?: Record<string, string>,
   *   sandbox?: string, callTimeout?: number | null}} [changes] */
  async update({ callTimeout, ...changes } = {}) {
    const body = fieldsOf(changes);
    if (!Object.keys(body).length) {
      throw new TypeError('say what to change: ttl, idleTimeout, metadata or sandbox');
    }
    this.info = await this.client.call('PATCH', this.path(), body, { callTimeout });
    return this.info;
  }

  /** Its filesystem as an image of the store (its sandbox id's alone): the image's record.
   * @param {string} [name] @param {CallOptions} [opts] */
  async snapshot(name, { callTimeout } = {}) {
    return this.client.call('POST', this.path('/snapshot'), name == null ? {} : { name },
      { callTimeout });
  }

  /** `n` sandboxes resumed from one memory snapshot of this one, where the daemon's tier can
   * take one (none yet: DaemonError `unsupported`). @param {number} n @param {CallOptions} [opts] */
  async fork(n, { callTimeout } = {}) {
    const made = await this.client.call('POST', this.path('/fork'), { n }, { callTimeout });
    return (made.sandboxes ?? []).map(/** @param {any} info */ (info) => new Sandbox(this.client, info));
  }

  /** Freeze every process of it until `resume()`. @param {CallOptions} [opts] */
  async pause({ callTimeout } = {}) {
    this.info = await this.client.call('POST', this.path('/pause'), undefined, { callTimeout });
  }

  /** @param {CallOptions} [opts] */
  async resume({ callTimeout } = {}) {
    this.info = await this.client.call('POST', this.path('/resume'), undefined, { callTimeout });
  }

  /** @param {CallOptions} [opts] */
  async refresh({ callTimeout } = {}) {
    this.info = await this.client.call('GET', this.path(), undefined, { callTimeout });
    return this.info;
  }

  /** `stdout`/`stderr` Buffers as the command writes them, then `exit` (its Result).
   * `timeout` is the command's (default 600 s; exit 124 past it), `callTimeout` this call's
   * (default: the command's timeout and 30 s). Leaving the loop early ends the command.
   * @param {string[]} argv @param {RunOptions} [opts]
   * @returns {AsyncGenerator<import('../index.js').StreamEvent>} */
  async *stream(argv, opts = {}) {
    const body = execBody(argv, opts, true);
    const timeout = /** @type {number | null} */ (body.timeout);
    const answer = await this.client.open('POST', this.path('/exec'),
      Buffer.from(JSON.stringify(body)), { callTimeout: opts.callTimeout },
      timeout == null ? null : timeout + GRACE);
    try {
      for await (const line of answer.lines()) {
        const event = eventOf(line);
        yield event;
        if (event.kind === 'exit') return;
      }
    } finally {
      answer.close();
    }
    throw streamCut();
  }

  /** Run a command to its end: its output and how it ended (CommandFailed for a non-zero
   * exit with `check`). @param {string[]} argv @param {RunOptions & {check?: boolean}} [opts] */
  async run(argv, opts = {}) {
    /** @type {Buffer[][]} */
    const [out, err] = [[], []];
    for await (const event of this.stream(argv, opts)) {
      if (event.kind === 'exit') {
        const result = event.data.withOutput(Buffer.concat(out), Buffer.concat(err));
        if (opts.check && !result.ok) throw new CommandFailed(result);
        return result;
      }
      (event.kind === 'stdout' ? out : err).push(event.data);
    }
    throw streamCut();
  }

  /** A command in the background: its handle at once (no time limit unless `timeout`).
   * @param {string[]} argv @param {RunOptions & {idempotencyKey?: string}} [opts] */
  async start(argv, opts = {}) {
    const body = execBody(argv, { ...opts, timeout: opts.timeout ?? null }, false);
    /** @type {Record<string, string>} */
    const headers = {};
    if (opts.idempotencyKey != null) headers['Idempotency-Key'] = opts.idempotencyKey;
    const info = await this.client.call('POST', this.path('/exec'), { ...body, background: true },
      { headers, callTimeout: opts.callTimeout });
    return new Process(this.client, this.id, info);
  }

  /** `argv` (by default a login shell) on a terminal of `rows` x `cols` inside the sandbox,
   * over Node's global WebSocket (`Terminal`; `unsupported` where Node has none).
   * @param {{rows?: number, cols?: number, argv?: string[], env?: Record<string, string>,
   *   cwd?: string, timeout?: number | null}} [opts] */
  async pty({ rows = 24, cols = 80, argv, env, cwd, timeout = null } = {}) {
    /** @type {Record<string, unknown>} */
    const message = { tty: { rows, cols }, timeout };
    if (argv) message.argv = argv;
    if (env) message.env = env;
    if (cwd) message.cwd = cwd;
    return Terminal.open(this.client, this.path('/pty'), message);
  }

  /** An HTTP request to `port` of the sandbox's own loopback, through the daemon (no one else
   * can reach it): the server's status, headers and body, whatever the status.
   * @param {number} port @param {string} [path]
   * @param {{method?: string, body?: Buffer | Uint8Array | string,
   *   headers?: Record<string, string>, callTimeout?: number | null}} [opts] */
  async port(port, path = '/', { method = 'GET', body, headers, callTimeout } = {}) {
    const where = this.path(`/ports/${Math.trunc(port)}/${path.replace(/^\/+/, '')}`);
    const answer = await this.client.open(method, where, body == null ? null : Buffer.from(body),
      { headers, callTimeout, forwarded: true });
    try {
      return { status: answer.status, headers: answer.res.headers, body: await answer.read() };
    } finally {
      answer.close();
    }
  }

  /** A URL of `port` to hand to a browser: signed for this sandbox and port, usable without
   * the daemon's key for `expiresIn` seconds (default an hour, or the daemon's longest time to
   * live if shorter), or until the daemon restarts. Over the unix socket, whose address no
   * browser can use, its path.
   * @param {number} port @param {{expiresIn?: number, callTimeout?: number | null}} [opts] */
  async url(port, { expiresIn, callTimeout } = {}) {
    const body = expiresIn === undefined ? { port } : { port, expires_in: expiresIn };
    const made = await this.client.call('POST', this.path('/urls'), body, { callTimeout });
    return made.url ?? made.path;
  }

  /** Its background processes (the ended ones it still keeps included).
   * @param {CallOptions} [opts] */
  async processes({ callTimeout } = {}) {
    const listed = await this.client.call('GET', this.path('/processes'), undefined, { callTimeout });
    return listed.processes.map(/** @param {any} info */ (info) => new Process(this.client, this.id, info));
  }

  /** Write a file of the workspace (parents made); the bytes written.
   * @param {string} path @param {Buffer | Uint8Array | string} data
   * @param {{mode?: number, callTimeout?: number | null}} [opts] */
  async write(path, data, { mode = 0o644, callTimeout } = {}) {
    const answer = await this.client.open('PUT', `${this.filePath(path)}?mode=${mode.toString(8)}`,
      Buffer.from(data), { callTimeout, headers: { 'Content-Type': 'application/octet-stream' } });
    let raw;
    try {
      raw = await answer.read();
    } finally {
      answer.close();
    }
    let size;
    try {
      size = JSON.parse(raw.toString()).size;
    } catch {
      // said below
    }
    if (!Number.isInteger(size)) {
      throw malformed("the daemon's answer to a write has no size", answer.status);
    }
    return /** @type {number} */ (size);
  }

  /** The workspace's files beyond write and read (`Files`). */
  get files() {
    return new Files(this);
  }

  /** A file of the workspace. @param {string} path @param {CallOptions} [opts] */
  async read(path, { callTimeout } = {}) {
    const answer = await this.client.open('GET', this.filePath(path), null, { callTimeout });
    try {
      return await answer.read();
    } finally {
      answer.close();
    }
  }

  /** @param {string} path */
  filePath(path) {
    return this.path(`/files/${path.replace(/^\/+/, '').split('/').map(encodeURIComponent).join('/')}`);
  }
}
