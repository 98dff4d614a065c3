// The types of @sealgate/sandbox (index.js and src/: plain JavaScript, these written by hand).
/// <reference types="node" />

/** Seconds; `null`: no limit; left out: the call's default (60 s; a command's timeout + 30 s). */
export type CallTimeout = number | null;
export type Bytes = Buffer | Uint8Array | string;

export interface CallOptions {
  callTimeout?: CallTimeout;
}

export interface CreateOptions extends CallOptions {
  /** A socket path or `http(s)://host:port` (default `$SEALGATE_SANDBOXD`, then
   * /run/sealgate/sandboxd.sock). */
  daemon?: string;
  /** The bearer key of a TCP daemon (default `$SEALGATE_SANDBOXD_KEY`). */
  key?: string;
  limits?: { pids?: number; memory?: number | string; cpus?: number | null };
  env?: Record<string, string>;
  ttl?: number;
  idleTimeout?: number;
  isolation?: 'bwrap' | 'gvisor' | 'microvm' | string;
  image?: string;
  metadata?: Record<string, string>;
  /** A retry with the same key and body within 10 minutes gets the sandbox the first made. */
  idempotencyKey?: string;
}

export interface ExecOptions extends CallOptions {
  env?: Record<string, string>;
  /** Default /workspace. */
  cwd?: string;
  stdin?: Bytes;
  /** The command's own limit in seconds (exit 124 past it); `null`: the sandbox's lifetime.
   * Default 600 for run/stream, none for start. */
  timeout?: number | null;
}

export type StreamEvent =
  | { kind: 'stdout' | 'stderr'; data: Buffer }
  | { kind: 'exit'; data: Result };

export type OutputEvent = StreamEvent | { kind: 'lost'; data: number };

/** The sandbox as the daemon answers it (`id`, `sandbox`, `expires_in`, `metadata`, ...). */
export type SandboxInfo = Record<string, any> & { id: string };

export declare const DEFAULT_DAEMON: string;
export declare const TIMEOUT: number;
export declare const GRACE: number;

/** A refusal of the daemon (`reason` its error code, `status` the HTTP status), or the
 * client's own `client_timeout` / `at_capacity` (status 0: never answered). */
export declare class DaemonError extends Error {
  constructor(message: string, how: { reason: string; status: number });
  readonly reason: string;
  readonly status: number;
  /** The same as `reason`. */
  readonly code: string;
}

export declare class CommandFailed extends Error {
  constructor(result: Result);
  readonly result: Result;
}

/** How a command ended. */
export declare class Result {
  constructor(status: Record<string, any>, stdout?: Buffer, stderr?: Buffer);
  /** null when it was lost; 128 + N for signal N; 124 timed out. */
  exitCode: number | null;
  stdout: Buffer;
  stderr: Buffer;
  /** exit | timed_out | killed | lost */
  ending: string;
  signal: number | null;
  usage: Record<string, number>;
  durationMs: number;
  error: string | null;
  truncated: boolean;
  readonly ok: boolean;
  /** stdout as UTF-8. */
  readonly text: string;
  withOutput(stdout: Buffer, stderr: Buffer): Result;
}

export declare class Client {
  constructor(opts?: { daemon?: string; key?: string; timeout?: number | null });
  readonly daemon: string;
  readonly key: string | null;
  readonly timeout: number | null;
  /** A call with a JSON body whose answer is a JSON object (what the others are made of). */
  call(method: string, path: string, body?: unknown,
       opts?: CallOptions & { headers?: Record<string, string> }): Promise<Record<string, any>>;
  list(opts?: CallOptions & { metadata?: Record<string, string> }): Promise<SandboxInfo[]>;
  health(opts?: CallOptions): Promise<Record<string, any>>;
}

export declare class Sandbox {
  constructor(client: Client, info: SandboxInfo);
  static create(sandbox: string, opts?: CreateOptions): Promise<Sandbox>;
  static connect(id: string, opts?: { daemon?: string; key?: string; callTimeout?: number | null }): Promise<Sandbox>;
  readonly client: Client;
  readonly id: string;
  info: SandboxInfo;
  run(argv: string[], opts?: ExecOptions & { check?: boolean }): Promise<Result>;
  /** Leaving the loop early ends the command. */
  stream(argv: string[], opts?: ExecOptions): AsyncGenerator<StreamEvent, void, undefined>;
  /** A retry with the same `idempotencyKey` gets the same process. */
  start(argv: string[], opts?: ExecOptions & { idempotencyKey?: string }): Promise<Process>;
  /** An HTTP request to a port the sandbox serves, through the daemon: the server's answer,
   * whatever its status (the daemon's own refusals throw, `port_unreachable` among them). */
  port(port: number, path?: string, opts?: CallOptions & { method?: string; body?: Bytes;
    headers?: Record<string, string> }): Promise<{ status: number;
    headers: Record<string, string | string[] | undefined>; body: Buffer }>;
  /** A signed URL of a port for a browser (no key needed), for `expiresIn` seconds (by
   * default 3600, or the daemon's maximum TTL when shorter); over the unix socket its path.
   * WebSocket upgrades through it are relayed too. */
  url(port: number, opts?: CallOptions & { expiresIn?: number }): Promise<string>;
  processes(opts?: CallOptions): Promise<Process[]>;
  /** `argv` (a login shell by default) on a terminal inside the sandbox: over Node's global
   * WebSocket (Node >= 22) to a daemon's TCP listener; `unsupported` (a DaemonError) where
   * Node has no WebSocket or the daemon is a unix socket. */
  pty(opts?: { rows?: number; cols?: number; argv?: string[]; env?: Record<string, string>;
    cwd?: string; timeout?: number | null }): Promise<Terminal>;
  /** The bytes written. */
  write(path: string, data: Bytes, opts?: CallOptions & { mode?: number }): Promise<number>;
  read(path: string, opts?: CallOptions): Promise<Buffer>;
  /** The workspace's files beyond write and read. */
  readonly files: Files;
  update(changes: CallOptions & { ttl?: number; idleTimeout?: number;
    metadata?: Record<string, string>; sandbox?: string }): Promise<SandboxInfo>;
  snapshot(name?: string, opts?: CallOptions): Promise<Record<string, any>>;
  /** n copies resumed from one memory snapshot of it (the microVM tier, a sandbox from an
   * image); elsewhere a DaemonError `unsupported` saying why. */
  fork(n: number, opts?: CallOptions): Promise<Sandbox[]>;
  pause(opts?: CallOptions): Promise<void>;
  resume(opts?: CallOptions): Promise<void>;
  refresh(opts?: CallOptions): Promise<SandboxInfo>;
  /** Deletes it; one already gone is fine. */
  delete(opts?: CallOptions): Promise<void>;
}

/** A workspace entry as the sandbox saw it (never followed: a link is a `symlink`). */
export interface Entry {
  name: string;
  /** From /workspace. */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  /** Permission bits. */
  mode: number;
  mtime: number;
  /** A symlink's, as written. */
  target?: string;
}

/** One change under a watch; `overflow`: events were dropped (`dropped` of them, when the
 * daemon's queue dropped them): look again. */
export interface WatchEvent {
  event: 'create' | 'modify' | 'chmod' | 'delete' | 'rename' | 'overflow';
  path: string;
  isDir: boolean;
  /** A rename's old path. */
  source?: string;
  dropped?: number;
}

/** `sb.files`: paths from /workspace ('' or '/' the workspace itself). */
export declare class Files {
  constructor(sb: Sandbox);
  list(path?: string, opts?: CallOptions): Promise<Entry[]>;
  stat(path: string, opts?: CallOptions): Promise<Entry>;
  exists(path: string, opts?: CallOptions): Promise<boolean>;
  /** False when `parents` and it was there already. */
  mkdir(path: string, opts?: CallOptions & { parents?: boolean; mode?: number }): Promise<boolean>;
  remove(path: string, opts?: CallOptions & { recursive?: boolean }): Promise<void>;
  rename(source: string, target: string, opts?: CallOptions): Promise<void>;
  /** All or nothing: a DaemonError `bad_archive` names the member refused. */
  uploadTar(data: Bytes, path?: string, opts?: CallOptions):
    Promise<{ path: string; size: number; entries: number }>;
  downloadTar(path?: string, opts?: CallOptions): Promise<Buffer>;
  /** Once the watch is in place. No call limit by default. */
  watch(path?: string, opts?: CallOptions & { recursive?: boolean }): Promise<Watch>;
}

/** A watch in place: `for await` its events; `close()` ends it in the sandbox too. */
export declare class Watch {
  readonly directories: number;
  [Symbol.asyncIterator](): AsyncGenerator<WatchEvent, void, undefined>;
  close(): void;
}

/** A background process (`Sandbox.start`). */
export declare class Process {
  constructor(client: Client, sandbox: string, info: Record<string, any>);
  readonly client: Client;
  readonly sandbox: string;
  readonly pid: number;
  info: Record<string, any>;
  /** Where its output was read to; the next output() goes on from here. */
  offset: number;
  /** From `offset` (default: `this.offset`); `follow` waits until it ends. No call limit by
   * default. */
  output(opts?: CallOptions & { offset?: number; follow?: boolean }):
    AsyncGenerator<OutputEvent, void, undefined>;
  write(data: Bytes, opts?: CallOptions & { close?: boolean }): Promise<void>;
  /** No call limit by default. */
  wait(opts?: CallOptions): Promise<Result>;
  /** A signal to its process group, sent inside the sandbox (default TERM). */
  signal(name?: 'TERM' | 'INT' | 'HUP' | 'QUIT' | 'USR1' | 'USR2' | 'KILL',
    opts?: CallOptions): Promise<void>;
  kill(opts?: CallOptions): Promise<void>;
  refresh(opts?: CallOptions): Promise<Record<string, any>>;
}

/** A command on a terminal in a sandbox (`Sandbox.pty`), over Node's global WebSocket. */
export declare class Terminal {
  /** Its status once it has ended. */
  result: Result | null;
  /** What the terminal shows, as it comes. */
  onData(listener: (data: Buffer) => void): void;
  /** Typed into the terminal. */
  write(data: Bytes): void;
  resize(rows: number, cols: number): void;
  /** Its status once it has ended; a DaemonError for a refusal or a close without one. */
  wait(): Promise<Result>;
  /** Ends it: the daemon kills the command. */
  close(): void;
}
