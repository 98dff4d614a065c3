// @sealgate/sandbox: the client of `sealgate sandboxd` (docs/sandbox-api.md) for Node >= 20,
// with nothing but Node's own modules. Its types are index.d.ts.
export { Client, DEFAULT_DAEMON, GRACE, TIMEOUT } from './src/client.js';
export { CommandFailed, DaemonError } from './src/errors.js';
export { Files, Watch } from './src/files.js';
export { Process } from './src/process.js';
export { Result } from './src/result.js';
export { Sandbox } from './src/sandbox.js';
export { Terminal } from './src/terminal.js';
