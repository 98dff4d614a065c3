// One HTTP/1.1 call to the daemon over node:http (a unix socket, or TCP with or without TLS),
// within its limit: a timer that ends the request, or the answer being read, when it fires.
import http from 'node:http';
import https from 'node:https';
import { DaemonError, errorOf, timedOut, unreachable } from './errors.js';

const MOST_MS = 2 ** 31 - 1; // setTimeout's largest (about 24.8 days)

/** Where a daemon string points: a socket path, or an `http(s)://host:port` URL.
 * @param {string} daemon */
export function targetOf(daemon) {
  if (!daemon.includes('://')) return { tls: false, options: { socketPath: daemon } };
  const url = new URL(daemon);
  const tls = url.protocol === 'https:';
  if (!tls && url.protocol !== 'http:') throw new TypeError(`not a daemon's URL: ${daemon}`);
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1'); // an IPv6 address without its brackets
  return { tls, options: { host, port: Number(url.port) || (tls ? 443 : 80) } };
}

/** A call's limit in seconds (null: none); `onFire` is what ends the call's I/O. */
class Deadline {
  /** @param {number | null} seconds @param {string} where */
  constructor(seconds, where) {
    this.seconds = seconds;
    this.where = where;
    this.fired = false;
    /** @type {() => void} */
    this.onFire = () => {};
    this.timer = seconds == null ? null : setTimeout(() => {
      this.fired = true;
      this.onFire();
    }, Math.min(Math.max(seconds * 1000, 0), MOST_MS));
  }

  error() {
    return timedOut(this.where, this.seconds ?? 0);
  }

  clear() {
    if (this.timer) clearTimeout(this.timer);
  }
}

/** An answer as it is read, every read within the call's limit; `close()` it when done. */
export class Answer {
  /** @param {http.IncomingMessage} res @param {Deadline} deadline */
  constructor(res, deadline) {
    this.res = res;
    this.status = res.statusCode ?? 0;
    this.deadline = deadline;
    res.on('error', () => {}); // said by the reads; never an unhandled 'error' event
  }

  /** @returns {AsyncGenerator<Buffer>} */
  async *chunks() {
    try {
      for await (const chunk of this.res) yield chunk;
    } catch (err) {
      if (this.deadline.fired) throw this.deadline.error();
      throw new DaemonError(`the daemon's answer was cut: ${/** @type {Error} */ (err).message}`,
        { reason: 'internal_error', status: this.status });
    }
    if (this.deadline.fired) throw this.deadline.error();
  }

  /** The body (its first `most` bytes). */
  async read(most = Infinity) {
    /** @type {Buffer[]} */
    const parts = [];
    let size = 0;
    for await (const chunk of this.chunks()) {
      parts.push(chunk);
      size += chunk.length;
      if (size >= most) break;
    }
    const all = Buffer.concat(parts);
    return size > most ? all.subarray(0, most) : all;
  }

  /** The body's lines (NDJSON), without their newlines. @returns {AsyncGenerator<Buffer>} */
  async *lines() {
    /** @type {Buffer} */
    let rest = Buffer.alloc(0);
    for await (const chunk of this.chunks()) {
      let buf = rest.length ? Buffer.concat([rest, chunk]) : chunk;
      for (let at = buf.indexOf(10); at >= 0; at = buf.indexOf(10)) {
        const line = buf.subarray(0, at);
        buf = buf.subarray(at + 1);
        if (line.length) yield line;
      }
      rest = buf;
    }
    if (rest.length) yield rest;
  }

  /** Ends the call: its connection is closed (a command whose caller left is killed). */
  close() {
    this.deadline.clear();
    this.res.destroy();
  }
}

/**
 * The answer to one request, its body unread; a DaemonError for a refusal (status >= 300), a
 * daemon that cannot be reached (`at_capacity`, status 0) or a call past its limit
 * (`client_timeout`, status 0).
 * @param {{daemon: string, method: string, path: string, body?: Buffer | null,
 *   headers: Record<string, string>, seconds: number | null, forwarded?: boolean}} call
 *   `forwarded`: the answer may be a sandbox server's (a port route), whatever its status;
 *   only the daemon's own refusals (marked X-Sealgate-Error) are errors
 * @returns {Promise<Answer>}
 */
export async function request({ daemon, method, path, body, headers, seconds, forwarded }) {
  const target = targetOf(daemon);
  const deadline = new Deadline(seconds, daemon);
  const answer = await new Promise((resolve, reject) => {
    const req = (target.tls ? https : http).request({
      ...target.options, method, path, headers, agent: false, // a connection per call
    });
    deadline.onFire = () => req.destroy(deadline.error());
    let answered = false;
    req.on('error', (err) => {
      if (answered) return; // the answer's reads say it
      deadline.clear();
      reject(deadline.fired ? deadline.error() : unreachable(daemon, err));
    });
    req.on('response', (res) => {
      answered = true;
      const made = new Answer(res, deadline);
      deadline.onFire = () => res.destroy(deadline.error());
      resolve(made);
    });
    req.end(body ?? undefined);
  });
  if (answer.status >= 300 && (!forwarded || answer.res.headers['x-sealgate-error'])) {
    try {
      throw errorOf(answer.status, await answer.read(1 << 16));
    } finally {
      answer.close();
    }
  }
  return answer;
}
