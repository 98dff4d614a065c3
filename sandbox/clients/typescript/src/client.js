// One daemon, a connection per call: the calls every Sandbox and Process make through it.
import { DaemonError, malformed } from './errors.js';
import { request } from './transport.js';

export const DEFAULT_DAEMON = '/run/sealgate/sandboxd.sock';
export const TIMEOUT = 60; // seconds: a call's limit unless it names one
export const GRACE = 30; // an exec's: its command's timeout and this, for the answer after it

const BODILESS = new Set(['GET', 'HEAD', 'DELETE']);

/** @typedef {{headers?: Record<string, string>, callTimeout?: number | null,
 *   forwarded?: boolean}} CallOptions */

export class Client {
  /** `daemon`: a socket path or `http(s)://host:port` (default `$SEALGATE_SANDBOXD`, then
   * /run/sealgate/sandboxd.sock); `key`: its bearer key (default `$SEALGATE_SANDBOXD_KEY`);
   * `timeout`: the seconds of a call that names none (null: no limit).
   * @param {{daemon?: string, key?: string, timeout?: number | null}} [opts] */
  constructor({ daemon, key, timeout } = {}) {
    this.daemon = daemon || process.env.SEALGATE_SANDBOXD || DEFAULT_DAEMON;
    /** @type {string | null} */
    this.key = key || process.env.SEALGATE_SANDBOXD_KEY || null;
    this.timeout = timeout === undefined ? TIMEOUT : timeout;
  }

  /** The answer, its body unread (`close()` it). @param {string} method @param {string} path
   * @param {Buffer | null} [body] @param {CallOptions} [opts] @param {number | null} [fallback]
   *   the limit when `callTimeout` is not given (default: the client's) */
  open(method, path, body = null, { headers, callTimeout, forwarded } = {},
    fallback = this.timeout) {
    /** @type {Record<string, string>} */
    // A port's request (`forwarded`) carries its caller's content type, or none: its body is
    // not the daemon's JSON.
    const sent = { ...(forwarded ? {} : { 'Content-Type': 'application/json' }), ...headers };
    if (body || !BODILESS.has(method)) sent['Content-Length'] = String(body?.length ?? 0);
    if (this.key) sent.Authorization = `Bearer ${this.key}`;
    const seconds = callTimeout === undefined ? fallback : callTimeout;
    return request({ daemon: this.daemon, method, path, body, headers: sent, seconds,
      forwarded });
  }

  /** A call with a JSON body (or none) whose answer is a JSON object.
   * @param {string} method @param {string} path @param {unknown} [body]
   * @param {CallOptions} [opts] @returns {Promise<Record<string, any>>} */
  async call(method, path, body, opts = {}) {
    const data = body === undefined ? null : Buffer.from(JSON.stringify(body));
    const answer = await this.open(method, path, data, opts);
    let raw;
    try {
      raw = await answer.read();
    } finally {
      answer.close();
    }
    let parsed;
    try {
      parsed = JSON.parse(raw.toString());
    } catch (err) {
      throw malformed(`the daemon's answer is not JSON: ${/** @type {Error} */ (err).message}`,
        answer.status);
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
      throw malformed('the daemon answered with something other than an object', answer.status);
    }
    return parsed;
  }

  /** The live sandboxes; with `metadata`, those whose labels have all of these.
   * @param {{metadata?: Record<string, string>, callTimeout?: number | null}} [opts] */
  async list({ metadata, callTimeout } = {}) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(metadata ?? {})) {
      query.append(`metadata.${name}`, value);
    }
    const tail = query.toString() ? `?${query}` : '';
    const listed = await this.call('GET', `/v1/sandboxes${tail}`, undefined, { callTimeout });
    return /** @type {Record<string, any>[]} */ (listed.sandboxes);
  }

  /** `{ready, problem, pool, ...}`; a daemon not ready answers `{ready: false, problem}`.
   * @param {{callTimeout?: number | null}} [opts] */
  async health({ callTimeout } = {}) {
    try {
      return await this.call('GET', '/v1/health', undefined, { callTimeout });
    } catch (err) {
      if (err instanceof DaemonError && err.status === 503) {
        return { ready: false, problem: err.message };
      }
      throw err;
    }
  }
}
