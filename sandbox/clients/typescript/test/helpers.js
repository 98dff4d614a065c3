// What the tests share: the daemon they were pointed at (SEALGATE_SANDBOXD, its socket) and the
// sandbox id of the proxy's rules to create under (SEALGATE_TEST_SANDBOX, default ci-bot).
import { Sandbox } from '@sealgate/sandbox';

export const daemon = process.env.SEALGATE_SANDBOXD ?? '';
export const policy = process.env.SEALGATE_TEST_SANDBOX || 'ci-bot';
/** Another id of the rules, for `update({sandbox})` (SEALGATE_TEST_OTHER_SANDBOX). */
export const other = process.env.SEALGATE_TEST_OTHER_SANDBOX ?? '';
/** Why the tests that need a daemon skip: none was named. */
export const skip = daemon ? false : 'no daemon: set SEALGATE_SANDBOXD to its socket';

/** A sandbox for `use`, deleted after it whatever happened.
 * @template T @param {(sb: Sandbox) => Promise<T>} use
 * @param {import('@sealgate/sandbox').CreateOptions} [opts] */
export async function withSandbox(use, opts = {}) {
  const sb = await Sandbox.create(policy, { daemon, ...opts });
  try {
    return await use(sb);
  } finally {
    await sb.delete();
  }
}

/** The bytes of one kind of events.
 * @param {import('@sealgate/sandbox').OutputEvent[]} events @param {string} [kind] */
export function text(events, kind = 'stdout') {
  return Buffer.concat(events.flatMap((e) => (e.kind === kind && Buffer.isBuffer(e.data) ? [e.data] : [])))
    .toString();
}

/** @template T @param {AsyncIterable<T>} items */
export async function all(items) {
  /** @type {T[]} */
  const got = [];
  for await (const item of items) got.push(item);
  return got;
}

/** A predicate for assert.rejects: a DaemonError of this reason (and status).
 * @param {string} reason @param {number} [status] */
export function refused(reason, status) {
  return (/** @type {any} */ err) => {
    if (err?.name !== 'DaemonError' || err.reason !== reason) throw err;
    if (status !== undefined && err.status !== status) throw err;
    return true;
  };
}
