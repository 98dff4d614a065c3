// The client's one error class, and how a refusal, a time-out or an absent daemon are said.

/** The daemon refused a call, or could not be reached, or the call passed its `callTimeout`:
 * `reason` is the daemon's error code (`unknown_sandbox`, `sandbox_ended`, ...; the client's
 * own `client_timeout` and `at_capacity` have status 0: never answered). */
export class DaemonError extends Error {
  /** @param {string} message @param {{reason: string, status: number}} how */
  constructor(message, { reason, status }) {
    super(message);
    this.name = 'DaemonError';
    this.reason = reason;
    this.status = status;
  }

  /** The reason, as the Python client's `code` says it. */
  get code() {
    return this.reason;
  }
}

/** `run(..., {check: true})` of a command that did not exit 0. */
export class CommandFailed extends Error {
  /** @param {import('./result.js').Result} result */
  constructor(result) {
    super(`the command ended with ${result.exitCode} (${result.ending})`);
    this.name = 'CommandFailed';
    this.result = result;
  }
}

/** @param {string} where @param {number} seconds */
export function timedOut(where, seconds) {
  return new DaemonError(`client_timeout: no answer from the sandbox daemon at ${where} within `
    + `this call's ${seconds} s (callTimeout)`, { reason: 'client_timeout', status: 0 });
}

/** @param {string} where @param {Error} err */
export function unreachable(where, err) {
  return new DaemonError(`at_capacity: the sandbox daemon at ${where} cannot be reached: `
    + err.message, { reason: 'at_capacity', status: 0 });
}

/** An answer the client cannot read. @param {string} what @param {number} status */
export function malformed(what, status) {
  return new DaemonError(what, { reason: 'internal_error', status });
}

/** A refusal's body, `{"error": reason, "detail": text}`, as a DaemonError.
 * @param {number} status @param {Buffer} raw */
export function errorOf(status, raw) {
  let reason = 'internal_error';
  let detail = raw.subarray(0, 200).toString();
  try {
    const body = JSON.parse(raw.toString());
    if (typeof body?.error === 'string') {
      reason = body.error;
      detail = String(body.detail ?? '');
    }
  } catch {
    // not JSON: said as it came
  }
  return new DaemonError(`${reason}: ${detail}`, { reason, status });
}
