// Request bodies, results and the events of a command's stream or a process's output.
import { malformed } from './errors.js';

/** How a command ended. `exitCode` is null when it was lost; a signal shows as 128 + N, a
 * timeout as 124 with `ending` "timed_out". */
export class Result {
  /** @param {Record<string, any>} status @param {Buffer} [stdout] @param {Buffer} [stderr] */
  constructor(status, stdout = Buffer.alloc(0), stderr = Buffer.alloc(0)) {
    /** @type {number | null} */
    this.exitCode = status.exit ?? null;
    this.stdout = stdout;
    this.stderr = stderr;
    /** @type {string} exit | timed_out | killed | lost */
    this.ending = String(status.ending ?? 'exit');
    /** @type {number | null} */
    this.signal = status.signal ?? null;
    /** @type {Record<string, number>} */
    this.usage = { ...(status.usage ?? {}) };
    this.durationMs = Number(status.duration_ms ?? 0);
    /** @type {string | null} e.g. the command was not found */
    this.error = status.error ?? null;
    this.truncated = Boolean(status.truncated);
  }

  get ok() {
    return this.exitCode === 0;
  }

  get text() {
    return this.stdout.toString();
  }

  /** This result with the command's output. @param {Buffer} stdout @param {Buffer} stderr */
  withOutput(stdout, stderr) {
    return Object.assign(new Result({}), this, { stdout, stderr });
  }
}

/** @typedef {{env?: Record<string, string>, cwd?: string, stdin?: Buffer | Uint8Array | string,
 *   timeout?: number | null}} ExecOptions */

/** @param {string[]} argv @param {ExecOptions} opts @param {boolean} stream */
export function execBody(argv, { env, cwd, stdin, timeout }, stream) {
  if (!Array.isArray(argv)) {
    throw new TypeError('argv is an array of strings, not one string (no shell is implied)');
  }
  /** @type {Record<string, unknown>} */
  const body = { argv: [...argv], timeout: timeout === undefined ? 600 : timeout, stream };
  if (env && Object.keys(env).length) body.env = { ...env };
  if (cwd != null) body.cwd = cwd;
  if (stdin != null && stdin.length) body.stdin = Buffer.from(stdin).toString('base64');
  return body;
}

/** A PATCH's or a create's body: the fields given, their names as the API spells them.
 * @param {Record<string, unknown>} fields */
export function fieldsOf(fields) {
  /** @type {Record<string, unknown>} */
  const body = {};
  for (const [name, value] of Object.entries(fields)) {
    if (value != null) body[name === 'idleTimeout' ? 'idle_timeout' : name] = value;
  }
  return body;
}

/** One line of an exec's stream. @param {Buffer} line
 * @returns {import('../index.js').StreamEvent} */
export function eventOf(line) {
  try {
    const event = JSON.parse(line.toString());
    if ('exit' in event) return { kind: 'exit', data: new Result(event) };
    const kind = 'stdout' in event ? 'stdout' : 'stderr';
    if (typeof event[kind] !== 'string') throw new TypeError(kind);
    return { kind, data: Buffer.from(event[kind], 'base64') };
  } catch {
    throw malformed("the daemon's stream held a line that is not an event", 200);
  }
}

/** One line of a background process's output: the offset it ends at and its events.
 * @param {Buffer} line
 * @returns {{offset: number, events: import('../index.js').OutputEvent[]}} */
export function outputEvents(line) {
  try {
    const event = JSON.parse(line.toString());
    let offset = Number(event.offset);
    if (!Number.isInteger(offset)) throw new TypeError('offset');
    /** @type {import('../index.js').OutputEvent[]} */
    const events = [];
    if ('lost' in event) events.push({ kind: 'lost', data: Number(event.lost) });
    else if ('exit' in event) events.push({ kind: 'exit', data: new Result(event) });
    for (const kind of /** @type {const} */ (['stdout', 'stderr'])) {
      if (kind in event) {
        const data = Buffer.from(event[kind], 'base64');
        offset += data.length;
        events.push({ kind, data });
      }
    }
    return { offset, events };
  } catch {
    throw malformed("the daemon's output held a line that is not an event", 200);
  }
}

export function streamCut() {
  return malformed("the command's stream ended without its exit status", 200);
}
