// Type declarations of the cowspace Node client (src/index.js), written by hand.

/// <reference types="node" />

/** The control protocol this client speaks. */
export declare const PROTOCOL_VERSION: 1;

/** The stable error kinds of the protocol. */
export type ErrorKind =
  | 'io' | 'not_found' | 'exists' | 'busy' | 'conflict' | 'unsupported' | 'corrupt' | 'invalid_input';

/** An error answered by the daemon. */
export declare class CowspaceError extends Error {
  static readonly kind: ErrorKind;
  static readonly exitCode: number;
  constructor(message: string, hint?: string | null, kind?: string);
  /** The protocol's kind. */
  readonly kind: ErrorKind | string;
  /** The daemon's hint, null when none. */
  readonly hint: string | null;
  /** The command line's exit code for the kind. */
  readonly exitCode: number;
}
export declare class IoError extends CowspaceError {}
export declare class NotFound extends CowspaceError {}
export declare class Exists extends CowspaceError {}
export declare class Busy extends CowspaceError {}
export declare class Conflict extends CowspaceError {}
export declare class Unsupported extends CowspaceError {}
export declare class Corrupt extends CowspaceError {}
export declare class InvalidInput extends CowspaceError {}
/** The daemon speaks another protocol version (both are named in the message). */
export declare class IncompatibleDaemon extends Unsupported {
  constructor(client: number, daemon: unknown, version: unknown, path: string);
  readonly clientProtocol: number;
  readonly daemonProtocol: unknown;
  readonly daemonVersion: unknown;
}
/** A command ran past its timeout; `result` is what it wrote (and its status when killed). */
export declare class ExecTimeoutError extends Error {
  constructor(timeoutMs: number, result: ExecResult);
  readonly timeoutMs: number;
  readonly result: ExecResult;
}
/** `check: true` and a status other than 0. */
export declare class CommandFailed extends Error {
  constructor(result: ExecResult);
  readonly result: ExecResult;
}
export declare function errorFrom(body: { kind?: string; message?: string; hint?: string | null } | null | undefined): CowspaceError;
export declare function checkVersion(ping: Ping, path: string): void;
export declare function defaultRoot(): string;

// -- records ----------------------------------------------------------------------------

export interface Ping { pong: boolean; version: string; program?: string | null; protocol?: number }

export interface Workspace {
  id: string;
  name: string | null;
  worker: string | null;
  snapshot: string;
  materializer: string;
  lower_kind: 'native' | 'checkout' | 'view' | string;
  lower: string;
  path: string;
  private_dir: string;
  status: 'creating' | 'active' | 'stopped' | 'cleanup_pending' | 'removed' | 'failed' | string;
  created_at: number;
  updated_at: number;
  stopped_at: number | null;
  policies: Record<string, unknown>;
  diagnostics: string[];
  ports: Record<string, number>;
  commits: string[];
  create_ms?: number;
  [key: string]: unknown;
}
export interface Created extends Workspace { elapsed_ms: number }
export interface Removed extends Workspace { removed: true; elapsed_ms: number }

export interface Change {
  path: string;
  change: 'added' | 'modified' | 'deleted' | 'type_changed';
  old_kind?: string;
  new_kind?: string;
  path_hex?: string;
}
export interface Diff { workspace: string; changes: Change[]; patch: string | null }

export interface ImportReport {
  snapshot: string;
  root: string;
  files: number;
  bytes: number;
  files_read: number;
  new_bytes_stored: number;
  parents: string[];
  elapsed_ms: number;
  notes?: string[];
  [key: string]: unknown;
}
export interface CommitReport extends ImportReport {
  unchanged?: boolean;
  pinned_by?: string;
  retention?: Record<string, unknown>;
}
export interface ProgressEvent { event: 'progress'; files_done: number; files_total: number; bytes_done: number }
export interface SnapshotInfo {
  snapshot: string;
  created_at: number;
  message: string | null;
  parents: string[];
  source: unknown;
  files: number;
  bytes: number;
  refs: string[];
  [key: string]: unknown;
}
export interface RefResult { ref: string; snapshot?: string; deleted?: boolean }

export interface SandboxStatus {
  name: string;
  provider: string;
  isolation: unknown;
  keeper_pid: number;
  init_pid: number;
  host_uid_base: number;
  ports: Record<string, number>;
  net: string;
  limits: Record<string, unknown>;
  cgroups: string[];
  started_at: number;
  host_mount: string;
  workspace: string;
  path: string;
  state?: string;
  processes?: number;
  memory_bytes?: number | null;
  oom_kills?: number | null;
  execs_running?: number;
  paused_at?: number | null;
  paused_by?: 'request' | 'idle' | null;
  idle_timeout_ms?: number | null;
  uptime_s?: number;
  egress?: Record<string, unknown>;
  [key: string]: unknown;
}
export interface PolicyResult { policy: { allow: string[]; deny: string[]; add_hosts: string[] }; allows_nothing: boolean; workspace: string }
export interface PortResult { port: number; host_port: number; unpublished?: true; workspace: string }
export interface Decision { time: unknown; host: string; port: number; via: string; verdict: string; rule: string | null }
export interface Stopped { stopped: true; oom_kills: number; workspace: string }

/** How a command ended. */
export interface ExecResult {
  /** Its status (128 + N when killed by signal N; 127: no such command). */
  exitCode: number;
  stdout: string;
  stderr: string;
  stdoutBytes: Buffer;
  stderrBytes: Buffer;
  /** The pid of the `mountctl exec` (or `script`) process on the host. */
  pid: number | undefined;
  error: string | null;
  elapsedMs: number;
}
export interface Output { stream: 'stdout' | 'stderr'; data: Buffer }

/** An entry of a workspace's tree (uid and gid as seen inside while a sandbox runs). */
export interface FileInfo {
  /** Relative to the workspace's root (`.` for the root). */
  path: string;
  /** The path's exact bytes in hex, when they are not UTF-8. */
  path_hex?: string;
  kind: 'file' | 'dir' | 'symlink' | 'fifo' | 'socket' | 'char_device' | 'block_device' | string;
  size: number;
  /** Permission bits. */
  mode: number;
  mtime: number;
  uid: number;
  gid: number;
  /** A symlink's target. */
  target?: string;
}
/** A change seen by `watch` (`rescan`: events were lost, look again). */
export interface WatchEvent {
  event: 'created' | 'modified' | 'removed' | 'renamed' | 'rescan' | string;
  path: string;
  /** A rename's old path. */
  from?: string;
}
export interface ForkResult { parent: string; forks: Array<Workspace & { parent: string }>; frozen_ms: number; elapsed_ms: number }
export interface Paused { paused: true; paused_at: number; paused_by: 'request' | 'idle' | string; elapsed_ms: number; workspace: string }
export interface Resumed { resumed: true; paused_ms: number; paused_by: string; elapsed_ms: number; workspace: string }

// -- options ----------------------------------------------------------------------------

export interface CallOptions { signal?: AbortSignal }
type Pairs = string | string[] | Record<string, string>;

export interface ConnectOptions {
  /** The runtime root (default: defaultRoot()). */
  root?: string;
  /** The socket path (default: ROOT/run/fsd.sock). */
  socket?: string;
  /** The mountctl binary exec runs (default: $COWSPACE_MOUNTCTL, else `mountctl` on PATH). */
  mountctl?: string;
  /** Ping first and refuse another protocol version (default true). */
  checkVersion?: boolean;
}

export interface ImportOptions extends CallOptions {
  git?: string;
  ref?: string;
  message?: string;
  excludes?: string[];
  noDefaultExcludes?: boolean;
  allowDevices?: boolean;
  allowExternalSymlinks?: boolean;
  zstdLevel?: number;
  threads?: number;
  noGitFsmonitor?: boolean;
  onProgress?: (e: ProgressEvent) => void;
}

export interface CreateOptions extends CallOptions {
  name?: string;
  materializer?: 'auto' | 'overlay' | 'fuse' | 'btrfs' | 'reflink' | 'copy';
  lower?: 'auto' | 'native' | 'checkout' | 'view';
  path?: string;
  worker?: string;
}

export interface CommitOptions extends CallOptions {
  ref?: string;
  expect?: string;
  message?: string;
  allowEmpty?: boolean;
  includeExcluded?: boolean;
}

export interface SandboxOptions extends CallOptions {
  net?: 'none' | 'loopback' | 'egress';
  allowHost?: string | string[];
  denyHost?: string | string[];
  /** `NAME:ADDR` strings, or {NAME: ADDR}. */
  addHost?: Pairs;
  /** Bytes, or a size such as "512m". */
  memory?: number | string;
  pids?: number;
  cpus?: number;
  cpusetCpus?: string;
  publish?: number | number[];
  /** `K=V` strings, or {K: V}. */
  env?: Pairs;
  /** `SRC:DST` strings, or {SRC: DST}. */
  roBind?: Pairs;
  /** `NAME=FILE` strings, or {NAME: FILE}. */
  secret?: Pairs;
  vm?: boolean;
  acceptEmulation?: boolean;
  /** Paused after this long without an exec or published-port traffic ("30s", "5m", or milliseconds). */
  idleTimeout?: string | number;
}

/** A path inside a workspace; a Buffer names a file by its exact bytes (sent as `path_hex`). */
export type FilePath = string | Uint8Array;
/** File contents: a string (UTF-8), bytes, or an (async) iterable of them (a Readable). */
export type FileData = string | Uint8Array | Iterable<string | Uint8Array> | AsyncIterable<string | Uint8Array>;

export interface ReadOptions extends CallOptions {
  offset?: number;
  /** At most this many bytes (default: to the end). */
  length?: number;
  /** Bytes per request (at most and default 64 MiB). */
  chunkSize?: number;
}
export interface WriteOptions extends CallOptions {
  /** Permission bits of a new file. */
  mode?: number;
  /** Add to the file instead of replacing it. */
  append?: boolean;
  /** Bytes per request (at most and default 64 MiB): a first write, then appends. */
  chunkSize?: number;
}

/** Most bytes one files_read or files_write request moves. */
export declare const MAX_IO_BYTES: number;

/** Changes below a path of a workspace, as they happen (`Client.watch`); close it when done. */
export declare class Watch implements AsyncIterable<WatchEvent> {
  /** The daemon's first line (`{event: 'watching', path}`). */
  readonly watching: Record<string, unknown> | null;
  /** The daemon's last word once the watch ended (`{ended: true, why}`), null while it runs. */
  readonly ended: { ended: boolean; why?: string } | null;
  /** The next event within `timeoutMs` (default: no bound), or null (none came, or it ended). */
  get(opts?: { timeoutMs?: number }): Promise<WatchEvent | null>;
  [Symbol.asyncIterator](): AsyncIterator<WatchEvent>;
  close(): void;
  [Symbol.dispose](): void;
  [Symbol.asyncDispose](): Promise<void>;
}

/** A workspace's files, shaped as E2B's `sandbox.files` (`Client.files(ws)`). */
export declare class Files {
  readonly client: Client;
  readonly workspace: string;
  read(path: FilePath, o?: CallOptions & { format?: 'text' }): Promise<string>;
  read(path: FilePath, o: CallOptions & { format: 'bytes' }): Promise<Buffer>;
  readStream(path: FilePath, o?: ReadOptions): AsyncGenerator<Buffer, void, unknown>;
  write(path: FilePath, data: FileData, o?: WriteOptions): Promise<FileInfo>;
  append(path: FilePath, data: FileData, o?: WriteOptions): Promise<FileInfo>;
  list(path?: FilePath, o?: CallOptions & { recursive?: boolean }): Promise<FileInfo[]>;
  getInfo(path: FilePath, o?: CallOptions): Promise<FileInfo>;
  stat(path: FilePath, o?: CallOptions): Promise<FileInfo>;
  exists(path: FilePath, o?: CallOptions): Promise<boolean>;
  /** Makes the directory and its missing parents. */
  makeDir(path: FilePath, o?: CallOptions & { mode?: number }): Promise<FileInfo>;
  /** Removes the file, link or directory (with what it holds). */
  remove(path: FilePath, o?: CallOptions): Promise<void>;
  rename(oldPath: FilePath, newPath: string, o?: CallOptions): Promise<FileInfo>;
  symlink(path: FilePath, target: string, o?: CallOptions): Promise<FileInfo>;
  watchDir(path?: FilePath, o?: CallOptions): Promise<Watch>;
}

export interface PolicyOptions extends CallOptions {
  allowHost?: string | string[];
  denyHost?: string | string[];
  removeHost?: string | string[];
  reset?: boolean;
}

export interface SpawnOptions extends CallOptions {
  /** Added to the command's environment. */
  env?: Record<string, string>;
  /** Working directory inside (relative: under /workspace). */
  workdir?: string;
  /** Fed to the command, or 'pipe' to write with Command.write. Default: none. */
  stdin?: string | Uint8Array | 'pipe';
  /** A pseudo-terminal of the sandbox (through util-linux `script`; no resize). */
  pty?: boolean | [number, number] | { rows: number; cols: number };
  onStdout?: (text: string) => unknown;
  onStderr?: (text: string) => unknown;
}

export interface ExecOptions extends SpawnOptions {
  /** Kill it and reject with ExecTimeoutError after this many milliseconds. */
  timeoutMs?: number;
  /** Give the running Command at once. */
  background?: boolean;
  /** Reject with CommandFailed on a status other than 0. */
  check?: boolean;
}

/** A command running in a sandbox (through `mountctl exec`). */
export declare class Command implements AsyncIterable<Output> {
  readonly pid: number | undefined;
  readonly running: boolean;
  readonly exitCode: number | null;
  wait(opts?: { timeoutMs?: number; signal?: AbortSignal }): Promise<ExecResult>;
  [Symbol.asyncIterator](): AsyncIterator<Output>;
  lines(): AsyncIterable<{ stream: 'stdout' | 'stderr'; line: string }>;
  signal(sig: NodeJS.Signals | number): void;
  kill(): void;
  write(data: string | Uint8Array): Promise<void>;
  closeStdin(): Promise<void>;
  /** Throws Unsupported: the Node client cannot resize its pseudo-terminal. */
  resize(rows: number, cols: number): never;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** One connection to the daemon; every method rejects with the CowspaceError of the kind. */
export declare class Client {
  static connect(opts?: ConnectOptions): Promise<Client>;
  readonly path: string;
  readonly root: string;
  readonly mountctl: string;
  /** What ping answered at connect (null with checkVersion: false). */
  daemon: Ping | null;
  request(op: string, args?: Record<string, unknown>, opts?: CallOptions & { onEvent?: (e: Record<string, unknown>) => void }): Promise<any>;
  close(): void;
  [Symbol.dispose](): void;

  ping(o?: CallOptions): Promise<Ping>;
  shutdown(o?: CallOptions & { force?: boolean }): Promise<{ stopping: true }>;
  stats(o?: CallOptions): Promise<Record<string, unknown>>;
  gc(o?: CallOptions & { dryRun?: boolean; graceSecs?: number; wait?: boolean; blobCacheMax?: number }): Promise<Record<string, unknown>>;
  sweep(o?: CallOptions): Promise<Record<string, string[]>>;

  import(source: string, o?: ImportOptions): Promise<ImportReport>;
  snapshots(o?: CallOptions): Promise<SnapshotInfo[]>;
  refs(o?: CallOptions): Promise<Record<string, string>>;
  refSet(name: string, snapshot: string, o?: CallOptions & { expect?: string; force?: boolean }): Promise<RefResult>;
  refDelete(name: string, expect: string, o?: CallOptions): Promise<RefResult>;
  show(snapshot: string, path?: string, o?: CallOptions): Promise<Record<string, any>>;
  export(snapshot: string, dest: string, o?: CallOptions & { tar?: boolean }): Promise<Record<string, unknown>>;
  prepareNative(snapshot: string, o?: CallOptions): Promise<{ snapshot: string; preparing: boolean }>;

  remotes(o?: CallOptions): Promise<unknown>;
  push(snapshot: string, o?: CallOptions & { remote?: string; force?: boolean }): Promise<unknown>;
  pull(snapshot: string, o?: CallOptions & { remote?: string }): Promise<unknown>;
  fetch(o?: CallOptions & { remote?: string }): Promise<unknown>;
  remoteGc(o?: CallOptions & { remote?: string; dryRun?: boolean; grace?: number }): Promise<unknown>;

  create(snapshot: string, o?: CreateOptions): Promise<Created>;
  list(o?: CallOptions & { all?: boolean }): Promise<Workspace[]>;
  status(workspace: string, o?: CallOptions): Promise<Workspace>;
  diff(workspace: string, o?: CallOptions & { patch?: boolean; includeExcluded?: boolean }): Promise<Diff>;
  commit(workspace: string, o?: CommitOptions): Promise<CommitReport>;
  /** Without `force`, `Busy` while a sandbox runs or the workspace has uncommitted changes. */
  remove(workspace: string, o?: CallOptions & { force?: boolean }): Promise<Removed>;
  /** New workspaces holding what `workspace` shows now (`count` 1 to 64; `sandbox`: started with the parent's controls). */
  fork(workspace: string, o?: CallOptions & { name?: string; count?: number; sandbox?: boolean }): Promise<ForkResult>;
  recover(workspace: string, o?: CallOptions): Promise<Workspace>;
  mountWorkspace(workspace: string, o?: CallOptions): Promise<Record<string, unknown>>;
  unmountWorkspace(workspace: string, o?: CallOptions): Promise<Record<string, unknown>>;
  finishCopies(workspace: string, o?: CallOptions): Promise<Record<string, unknown>>;

  sandboxStart(workspace: string, o?: SandboxOptions): Promise<SandboxStatus>;
  sandboxStatus(workspace: string, o?: CallOptions): Promise<SandboxStatus>;
  sandboxList(o?: CallOptions): Promise<SandboxStatus[]>;
  sandboxStop(workspace: string, o?: CallOptions): Promise<Stopped>;
  sandboxPolicy(workspace: string, o?: PolicyOptions): Promise<PolicyResult>;
  sandboxPublish(workspace: string, port: number, o?: CallOptions): Promise<PortResult>;
  sandboxUnpublish(workspace: string, port: number, o?: CallOptions): Promise<PortResult>;
  sandboxLog(workspace: string, o?: CallOptions & { tail?: number }): Promise<{ decisions: Decision[] }>;
  /** Freezes the sandbox (memory kept): exec is Busy until sandboxResume. */
  sandboxPause(workspace: string, o?: CallOptions): Promise<Paused>;
  sandboxResume(workspace: string, o?: CallOptions): Promise<Resumed>;
  /** Unsupported where the host cannot (the error says why). */
  sandboxSuspend(workspace: string, o?: CallOptions): Promise<Record<string, unknown>>;

  files(workspace: string): Files;
  filesStat(workspace: string, path: FilePath, o?: CallOptions): Promise<FileInfo>;
  filesList(workspace: string, path?: FilePath, o?: CallOptions & { recursive?: boolean }): Promise<FileInfo[]>;
  filesRead(workspace: string, path: FilePath, o?: ReadOptions): Promise<Buffer>;
  filesReadStream(workspace: string, path: FilePath, o?: ReadOptions): AsyncGenerator<Buffer, void, unknown>;
  filesWrite(workspace: string, path: FilePath, data: FileData, o?: WriteOptions): Promise<FileInfo>;
  filesMkdir(workspace: string, path: FilePath, o?: CallOptions & { parents?: boolean; mode?: number }): Promise<FileInfo>;
  filesRemove(workspace: string, path: FilePath, o?: CallOptions & { recursive?: boolean }): Promise<{ removed: string }>;
  filesRename(workspace: string, path: FilePath, to: string, o?: CallOptions): Promise<FileInfo>;
  filesSymlink(workspace: string, path: FilePath, target: string, o?: CallOptions): Promise<FileInfo>;
  /** Watches the tree below `path` on a connection of its own (in place when this resolves). */
  watch(workspace: string, path?: FilePath, o?: CallOptions): Promise<Watch>;

  keeperSocket(workspace: string, o?: CallOptions): Promise<string>;
  spawn(workspace: string, cmd: string | string[], o?: SpawnOptions): Promise<Command>;
  exec(workspace: string, cmd: string | string[], o: ExecOptions & { background: true }): Promise<Command>;
  exec(workspace: string, cmd: string | string[], o?: ExecOptions & { background?: false }): Promise<ExecResult>;
}

export default Client;
