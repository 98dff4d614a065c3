// A command on a terminal in a sandbox (`Sandbox.pty`): the daemon's WebSocket at
// GET /v1/sandboxes/{id}/pty (docs/sandbox-api.md, "Terminals"), through Node's own global
// WebSocket (Node >= 22; Node 20 has it only behind --experimental-websocket). Without one,
// or for a daemon on a unix socket (which a WebSocket cannot reach), it says `unsupported`
// rather than bring a dependency.
import { DaemonError } from './errors.js';
import { Result } from './result.js';

/** @param {string} why */
function unsupported(why) {
  return new DaemonError(`unsupported: ${why}`, { reason: 'unsupported', status: 0 });
}

export class Terminal {
  /** @param {any} ws an open WebSocket */
  constructor(ws) {
    this.ws = ws;
    /** The command's status once it has ended. @type {Result | null} */
    this.result = null;
    /** @type {((data: Buffer) => void)[]} */
    this.listeners = [];
    /** @type {Promise<Result>} */
    this.ended = new Promise((resolve, reject) => {
      ws.addEventListener('message', (/** @type {any} */ event) => {
        if (typeof event.data !== 'string') {
          const data = Buffer.from(event.data);
          for (const listener of this.listeners) listener(data);
          return;
        }
        const said = JSON.parse(event.data);
        if (!('exit' in said)) { // a refusal (a command that could not start has its exit)
          reject(new DaemonError(`${said.error}: ${said.detail}`,
            { reason: String(said.error), status: 101 }));
        } else {
          this.result = new Result(said);
          resolve(this.result);
        }
      });
      ws.addEventListener('close', (/** @type {any} */ event) => reject(new DaemonError(
        `the terminal closed without a status (close code ${event.code})`,
        { reason: 'internal_error', status: 101 })));
    });
    this.ended.catch(() => {}); // said to whoever waits; never an unhandled rejection
  }

  /** @param {import('./client.js').Client} client @param {string} path
   * @param {Record<string, unknown>} message the exec, the first frame */
  static async open(client, path, message) {
    const WebSocketClass = /** @type {any} */ (globalThis).WebSocket;
    if (typeof WebSocketClass !== 'function') {
      throw unsupported(`this Node (${process.version}) has no global WebSocket: Node >= 22, `
        + 'or node --experimental-websocket');
    }
    if (!/^https?:\/\//.test(client.daemon)) {
      throw unsupported('a WebSocket cannot reach a daemon on a unix socket: '
        + 'use its TCP listener (http(s)://host:port and its key)');
    }
    const url = client.daemon.replace(/^http/, 'ws').replace(/\/+$/, '') + path;
    // Node's WebSocket (undici's) takes headers beside the URL: the daemon's bearer key.
    const ws = new WebSocketClass(url,
      { headers: client.key ? { Authorization: `Bearer ${client.key}` } : {} });
    ws.binaryType = 'arraybuffer';
    await new Promise((resolve, reject) => {
      ws.addEventListener('open', resolve, { once: true });
      ws.addEventListener('error', () => reject(new DaemonError(
        `the daemon at ${client.daemon} refused the terminal or cannot be reached`,
        { reason: 'at_capacity', status: 0 })), { once: true });
    });
    const terminal = new Terminal(ws);
    ws.send(JSON.stringify(message));
    return terminal;
  }

  /** What the terminal shows, as it comes. @param {(data: Buffer) => void} listener */
  onData(listener) {
    this.listeners.push(listener);
  }

  /** Typed into the terminal. @param {Buffer | Uint8Array | string} data */
  write(data) {
    this.ws.send(Buffer.from(data));
  }

  /** @param {number} rows @param {number} cols */
  resize(rows, cols) {
    this.ws.send(JSON.stringify({ resize: { rows, cols } }));
  }

  /** Its status once it has ended. @returns {Promise<Result>} */
  wait() {
    return this.ended;
  }

  /** Ends it: the daemon kills the command. */
  close() {
    this.ws.close(1000);
  }
}
