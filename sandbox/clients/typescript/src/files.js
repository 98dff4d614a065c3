// `sb.files`: the workspace's files beyond write and read, as the Python client's
// (sandbox/clients/files.py): list, stat, exists, mkdir, remove, rename, a directory in and out
// as tar bytes, and watch. Paths are from /workspace ('' or '/' is the workspace itself).
import { DaemonError, malformed } from './errors.js';

/** @typedef {import('./client.js').CallOptions} CallOptions */
/** @typedef {import('../index.js').Entry} Entry */
/** @typedef {import('../index.js').WatchEvent} WatchEvent */

/** A workspace path as the daemon takes it, from /workspace whether or not it says so.
 * @param {string} path */
function clean(path) {
  let p = path;
  if (p === '/workspace' || p.startsWith('/workspace/')) p = p.slice('/workspace'.length);
  return ['', '.', '/'].includes(p) ? '' : p.replace(/^\/+/, '');
}

/** @param {any} raw @returns {Entry} */
function entryOf(raw) {
  if (raw === null || typeof raw !== 'object' || typeof raw.path !== 'string') {
    throw malformed("the daemon's entry is not one", 200);
  }
  const { name, path, type, size, mode, mtime, target } = raw;
  return { name, path, type, size, mode, mtime, ...(target == null ? {} : { target }) };
}

export class Files {
  /** @param {import('./sandbox.js').Sandbox} sb */
  constructor(sb) {
    this.sb = sb;
  }

  /** @param {string} tail @param {Record<string, string | boolean>} [query] */
  route(tail, query = {}) {
    const said = new URLSearchParams(Object.entries(query).map(([k, v]) => [k, String(v)]));
    return this.sb.path(tail) + (said.size ? `?${said}` : '');
  }

  /** The entries of a directory, by name. @param {string} [path] @param {CallOptions} [opts] */
  async list(path = '', { callTimeout } = {}) {
    const answer = await this.sb.client.call('GET', this.route('/fs/list', { path: clean(path) }),
      undefined, { callTimeout });
    return /** @type {any[]} */ (answer.entries ?? []).map(entryOf);
  }

  /** @param {string} path @param {CallOptions} [opts] */
  async stat(path, { callTimeout } = {}) {
    return entryOf(await this.sb.client.call('GET', this.route('/fs/stat', { path: clean(path) }),
      undefined, { callTimeout }));
  }

  /** @param {string} path @param {CallOptions} [opts] */
  async exists(path, opts = {}) {
    try {
      await this.stat(path, opts);
      return true;
    } catch (err) {
      if (err instanceof DaemonError && err.reason === 'no_such_file') return false;
      throw err;
    }
  }

  /** Make a directory; false when `parents` and it was there already.
   * @param {string} path @param {CallOptions & {parents?: boolean, mode?: number}} [opts] */
  async mkdir(path, { parents = false, mode = 0o755, callTimeout } = {}) {
    const answer = await this.sb.client.call('POST', this.sb.path('/fs/mkdir'),
      { path: clean(path), mode: mode.toString(8), parents }, { callTimeout });
    return Boolean(answer.created);
  }

  /** A file, link or empty directory (a whole tree with `recursive`).
   * @param {string} path @param {CallOptions & {recursive?: boolean}} [opts] */
  async remove(path, { recursive = false, callTimeout } = {}) {
    await this.sb.client.call('DELETE', this.route('/fs', { path: clean(path), recursive }),
      undefined, { callTimeout });
  }

  /** @param {string} source @param {string} target @param {CallOptions} [opts] */
  async rename(source, target, { callTimeout } = {}) {
    await this.sb.client.call('POST', this.sb.path('/fs/rename'),
      { from: clean(source), to: clean(target) }, { callTimeout });
  }

  /** A tar (or gzipped tar) unpacked into the directory `path`, all or nothing
   * (`bad_archive` names the member refused, and nothing changed).
   * @param {Buffer | Uint8Array} data @param {string} [path] @param {CallOptions} [opts] */
  async uploadTar(data, path = '', { callTimeout } = {}) {
    const answer = await this.sb.client.open('PUT', this.route('/tar', { path: clean(path) }),
      Buffer.from(data), { callTimeout, headers: { 'Content-Type': 'application/x-tar' } });
    let raw;
    try {
      raw = await answer.read();
    } finally {
      answer.close();
    }
    return JSON.parse(raw.toString());
  }

  /** The directory `path` as tar bytes: its directories, files and links, never followed.
   * @param {string} [path] @param {CallOptions} [opts] */
  async downloadTar(path = '', { callTimeout } = {}) {
    const answer = await this.sb.client.open('GET', this.route('/tar', { path: clean(path) }),
      null, { callTimeout });
    try {
      return await answer.read();
    } finally {
      answer.close();
    }
  }

  /** The changes under the directory `path`, once its watch is in place: iterate it with
   * `for await`, `close()` it to end the watch in the sandbox. No call limit by default.
   * @param {string} [path] @param {CallOptions & {recursive?: boolean}} [opts] */
  async watch(path = '', { recursive = true, callTimeout = null } = {}) {
    const answer = await this.sb.client.open('GET',
      this.route('/watch', { path: clean(path), recursive }), null, { callTimeout });
    const lines = answer.lines();
    try {
      const first = await lines.next();
      const said = first.done ? null : JSON.parse(first.value.toString());
      if (said?.event !== 'watching') throw malformed('the watch did not start', answer.status);
      return new Watch(answer, lines, said.directories);
    } catch (err) {
      answer.close();
      throw err;
    }
  }
}

export class Watch {
  /** @param {import('./transport.js').Answer} answer @param {AsyncGenerator<Buffer>} lines
   * @param {number} directories */
  constructor(answer, lines, directories) {
    this.answer = answer;
    this.lines = lines;
    /** How many directories it watches. */
    this.directories = directories;
  }

  /** @returns {AsyncGenerator<WatchEvent>} */
  async *[Symbol.asyncIterator]() {
    for await (const line of this.lines) {
      const raw = JSON.parse(line.toString());
      yield { event: raw.event, path: raw.path ?? '', isDir: Boolean(raw.dir),
        ...(raw.from == null ? {} : { source: raw.from }),
        ...(raw.dropped == null ? {} : { dropped: raw.dropped }) };
    }
  }

  /** Ends the watch (in the sandbox too). */
  close() {
    this.answer.close();
  }
}
