// cowspace: a client of the cowspace daemon's control socket for Node >= 20
// (docs/control-protocol.md). Standard library only. See README.md and index.d.ts.

import { createConnection } from 'node:net';
import { dirname, join } from 'node:path';
import { homedir } from 'node:os';

import { argvOf, Command, startCommand } from './exec.js';
import { Files, readRanges, watchOpen, Watch, writeChunks, MAX_IO_BYTES } from './files.js';
import {
  Busy, CommandFailed, Conflict, Corrupt, CowspaceError, errorFrom, ExecTimeoutError, Exists,
  IncompatibleDaemon, InvalidInput, IoError, NotFound, Unsupported,
} from './errors.js';

export { Files, MAX_IO_BYTES, Watch };
export {
  Busy, Command, CommandFailed, Conflict, Corrupt, CowspaceError, errorFrom, ExecTimeoutError, Exists,
  IncompatibleDaemon, InvalidInput, IoError, NotFound, Unsupported,
};

/** The control protocol this client speaks (a daemon answering another is refused). */
export const PROTOCOL_VERSION = 1;
/** Longest answer line accepted (bytes). */
const MAX_LINE_BYTES = 256 * 1024 * 1024;

/** `$COWSPACE_ROOT`, else `/var/lib/cowspace` for root, else `$XDG_DATA_HOME/cowspace`. */
export function defaultRoot() {
  if (process.env.COWSPACE_ROOT) return process.env.COWSPACE_ROOT;
  if (process.geteuid?.() === 0) return '/var/lib/cowspace';
  return join(process.env.XDG_DATA_HOME || join(homedir(), '.local', 'share'), 'cowspace');
}

/** camelCase option names to the protocol's snake_case; undefined and null left out. */
function args(o) {
  const out = {};
  for (const [k, v] of Object.entries(o)) {
    if (v === undefined || v === null) continue;
    out[k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)] = v;
  }
  return out;
}

/** A files_* / watch request's arguments: a Buffer path goes as `path_hex` (its exact bytes). */
function filesArgs(workspace, path, o = {}) {
  const p = Buffer.isBuffer(path) || path instanceof Uint8Array
    ? { pathHex: Buffer.from(path).toString('hex') }
    : { path: String(path) };
  return args({ workspace, ...p, ...o });
}

function pairs(v, sep) {
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'string') return [v];
  if (Array.isArray(v)) return v.map(String);
  return Object.entries(v).map(([k, x]) => `${k}${sep}${x}`);
}

function strs(v) {
  if (v === undefined || v === null) return undefined;
  return typeof v === 'string' ? [v] : Array.from(v, String);
}

/** Refuses a daemon whose `ping` names another protocol; accepts one naming none. */
export function checkVersion(ping, path) {
  if (ping?.protocol === undefined || ping?.protocol === null) return;
  if (ping.protocol !== PROTOCOL_VERSION) {
    throw new IncompatibleDaemon(PROTOCOL_VERSION, ping.protocol, ping.version, path);
  }
}

/** One connection to the daemon of a runtime root; requests are answered in order. */
export class Client {
  /** Connects (and, unless `checkVersion: false`, checks the protocol version). */
  static async connect(opts = {}) {
    const root = opts.root ?? (opts.socket ? dirname(dirname(opts.socket)) : defaultRoot());
    const path = opts.socket ?? join(root, 'run', 'fsd.sock');
    const sock = await new Promise((resolve, reject) => {
      const s = createConnection(path);
      s.once('connect', () => { s.removeAllListeners('error'); resolve(s); });
      s.once('error', (e) => reject(new IoError(
        `cannot connect to the daemon's socket ${path}: ${e.message}`,
        'start the daemon (`mountctl daemon start`), or name the runtime root',
      )));
    });
    const c = new Client(sock, path, root, opts);
    if (opts.checkVersion !== false) {
      try {
        c.daemon = await c.ping();
        checkVersion(c.daemon, path);
      } catch (e) {
        c.close();
        throw e;
      }
    }
    return c;
  }

  constructor(sock, path, root, opts) {
    this.path = path;
    this.root = root;
    this.mountctl = opts.mountctl ?? process.env.COWSPACE_MOUNTCTL ?? 'mountctl';
    this.daemon = null;
    this._sock = sock;
    this._buf = Buffer.alloc(0);
    this._queue = []; // pending requests, in order: {resolve, reject, onEvent}
    this._closed = null;
    sock.on('data', (d) => this._data(d));
    const fail = (why) => {
      this._closed = why;
      const q = this._queue;
      this._queue = [];
      for (const p of q) p.reject(new IoError(why));
    };
    sock.on('error', (e) => fail(`the daemon's socket failed: ${e.message}`));
    sock.on('close', () => fail('the daemon closed the connection'));
  }

  _data(d) {
    this._buf = this._buf.length ? Buffer.concat([this._buf, d]) : d;
    for (;;) {
      const nl = this._buf.indexOf(10);
      if (nl < 0) {
        if (this._buf.length > MAX_LINE_BYTES) this._sock.destroy(new Error('answer line too long'));
        return;
      }
      const line = this._buf.subarray(0, nl).toString('utf8');
      this._buf = this._buf.subarray(nl + 1);
      const p = this._queue[0];
      if (!p) continue;
      let v;
      try {
        v = JSON.parse(line);
      } catch (e) {
        this._queue.shift().reject(new IoError(`the daemon answered something that is not JSON: ${line.slice(0, 200)}`));
        continue;
      }
      if (v && typeof v === 'object' && 'event' in v) {
        try { p.onEvent?.(v); } catch { /* the caller's */ }
        continue;
      }
      this._queue.shift();
      if (v?.ok === true) p.resolve(v.result);
      else p.reject(errorFrom(v?.error));
    }
  }

  /** Sends one request (`args` as the protocol names them) and gives its result. Events
   * sent before the answer (an import's progress) go to `onEvent`. An aborted `signal`
   * rejects the promise; the daemon still carries the request out (the connection is
   * closed so its answer is not taken for the next one's). */
  request(op, a, { onEvent, signal } = {}) {
    if (this._closed) return Promise.reject(new IoError(this._closed));
    if (signal?.aborted) return Promise.reject(signal.reason);
    const line = JSON.stringify(a && Object.keys(a).length ? { op, args: a } : { op }) + '\n';
    return new Promise((resolve, reject) => {
      let onAbort;
      const done = (f) => (x) => { if (onAbort) signal.removeEventListener('abort', onAbort); f(x); };
      this._queue.push({ resolve: done(resolve), reject: done(reject), onEvent });
      if (signal) {
        onAbort = () => { reject(signal.reason); this.close(); };
        signal.addEventListener('abort', onAbort, { once: true });
      }
      this._sock.write(line);
    });
  }

  /** Closes the connection. */
  close() {
    this._sock.end();
    this._sock.destroy();
  }

  [Symbol.dispose]() { this.close(); }

  // -- the daemon ---------------------------------------------------------------------
  ping(o = {}) { return this.request('ping', undefined, o); }
  shutdown({ force, signal } = {}) { return this.request('shutdown', args({ force }), { signal }); }
  stats(o = {}) { return this.request('stats', undefined, o); }
  gc({ dryRun, graceSecs, wait, blobCacheMax, signal } = {}) {
    return this.request('gc', args({ dryRun, graceSecs, wait, blobCacheMax }), { signal });
  }
  sweep(o = {}) { return this.request('sweep', undefined, o); }

  // -- snapshots and refs -------------------------------------------------------------
  import(source, { git, ref, message, excludes, noDefaultExcludes, allowDevices, allowExternalSymlinks, zstdLevel, threads, noGitFsmonitor, onProgress, signal } = {}) {
    const a = args({
      source, git, ref, message, excludes, noDefaultExcludes, allowDevices, allowExternalSymlinks,
      zstdLevel, threads, noGitFsmonitor, progress: onProgress ? true : undefined,
    });
    return this.request('import', a, { onEvent: onProgress, signal });
  }
  snapshots(o = {}) { return this.request('snapshots', undefined, o); }
  refs(o = {}) { return this.request('refs', undefined, o); }
  refSet(name, snapshot, { expect, force, signal } = {}) {
    return this.request('ref_set', args({ name, snapshot, expect, force }), { signal });
  }
  refDelete(name, expect, o = {}) { return this.request('ref_delete', args({ name, expect }), o); }
  show(snapshot, path, o = {}) { return this.request('show', args({ snapshot, path }), o); }
  export(snapshot, dest, { tar, signal } = {}) { return this.request('export', args({ snapshot, dest, tar }), { signal }); }
  prepareNative(snapshot, o = {}) { return this.request('prepare_native', args({ snapshot }), o); }

  // -- remotes ------------------------------------------------------------------------
  remotes(o = {}) { return this.request('remotes', undefined, o); }
  push(snapshot, { remote, force, signal } = {}) { return this.request('push', args({ snapshot, remote, force }), { signal }); }
  pull(snapshot, { remote, signal } = {}) { return this.request('pull', args({ snapshot, remote }), { signal }); }
  fetch({ remote, signal } = {}) { return this.request('fetch', args({ remote }), { signal }); }
  remoteGc({ remote, dryRun, grace, signal } = {}) { return this.request('remote_gc', args({ remote, dryRun, grace }), { signal }); }

  // -- workspaces ---------------------------------------------------------------------
  create(snapshot, { name, materializer, lower, path, worker, signal } = {}) {
    return this.request('create', args({ snapshot, name, materializer, lower, path, worker }), { signal });
  }
  list({ all, signal } = {}) { return this.request('list', args({ all }), { signal }); }
  status(workspace, o = {}) { return this.request('status', args({ workspace }), o); }
  diff(workspace, { patch, includeExcluded, signal } = {}) {
    return this.request('diff', args({ workspace, patch, includeExcluded }), { signal });
  }
  commit(workspace, { ref, expect, message, allowEmpty, includeExcluded, signal } = {}) {
    return this.request('commit', args({ workspace, ref, expect, message, allowEmpty, includeExcluded }), { signal });
  }
  /** Without `force`, `Busy` while a sandbox runs or the workspace has uncommitted changes. */
  remove(workspace, { force, signal } = {}) { return this.request('remove', args({ workspace, force }), { signal }); }
  /** New workspaces holding what `workspace` shows now (its base and a copy of its changes). */
  fork(workspace, { name, count, sandbox, signal } = {}) {
    return this.request('fork', args({ workspace, name, count, sandbox }), { signal });
  }
  recover(workspace, o = {}) { return this.request('recover', args({ workspace }), o); }
  mountWorkspace(workspace, o = {}) { return this.request('mount_workspace', args({ workspace }), o); }
  unmountWorkspace(workspace, o = {}) { return this.request('unmount_workspace', args({ workspace }), o); }
  finishCopies(workspace, o = {}) { return this.request('finish_copies', args({ workspace }), o); }

  // -- sandboxes ----------------------------------------------------------------------
  sandboxStart(workspace, { net, allowHost, denyHost, addHost, memory, pids, cpus, cpusetCpus, publish, env, roBind, secret, vm, acceptEmulation, idleTimeout, signal } = {}) {
    const a = args({
      workspace, vm, acceptEmulation, net,
      allowHost: strs(allowHost), denyHost: strs(denyHost), addHost: pairs(addHost, ':'),
      memory, pids, cpus, cpusetCpus,
      publish: publish === undefined ? undefined : (typeof publish === 'number' ? [publish] : Array.from(publish, Number)),
      env: pairs(env, '='), roBind: pairs(roBind, ':'), secret: pairs(secret, '='),
      idleTimeout: typeof idleTimeout === 'number' ? `${Math.max(1, Math.round(idleTimeout / 1000))}s` : idleTimeout,
    });
    return this.request('sandbox_start', a, { signal });
  }
  sandboxStatus(workspace, o = {}) { return this.request('sandbox_status', args({ workspace }), o); }
  async sandboxList(o = {}) { return (await this.request('sandbox_list', undefined, o)).sandboxes ?? []; }
  sandboxStop(workspace, o = {}) { return this.request('sandbox_stop', args({ workspace }), o); }
  sandboxPolicy(workspace, { allowHost, denyHost, removeHost, reset, signal } = {}) {
    const a = args({ workspace, allowHost: strs(allowHost), denyHost: strs(denyHost), removeHost: strs(removeHost), reset });
    return this.request('sandbox_policy', a, { signal });
  }
  sandboxPublish(workspace, port, o = {}) { return this.request('sandbox_publish', args({ workspace, port }), o); }
  sandboxUnpublish(workspace, port, o = {}) { return this.request('sandbox_unpublish', args({ workspace, port }), o); }
  sandboxLog(workspace, { tail, signal } = {}) { return this.request('sandbox_log', args({ workspace, tail }), { signal }); }

  /** Freezes every process of the sandbox (memory kept); `exec` is `Busy` until resumed. */
  sandboxPause(workspace, o = {}) { return this.request('sandbox_pause', args({ workspace }), o); }
  sandboxResume(workspace, o = {}) { return this.request('sandbox_resume', args({ workspace }), o); }
  sandboxSuspend(workspace, o = {}) { return this.request('sandbox_suspend', args({ workspace }), o); }

  // -- files --------------------------------------------------------------------------
  /** The workspace's files, E2B-like: `c.files(ws).write('a.txt', data)`. */
  files(workspace) { return new Files(this, workspace); }
  filesStat(workspace, path, o = {}) { return this.request('files_stat', filesArgs(workspace, path), o); }
  async filesList(workspace, path = '.', { recursive, signal } = {}) {
    return (await this.request('files_list', filesArgs(workspace, path, { recursive }), { signal })).entries ?? [];
  }
  /** The file's bytes from `offset` (`length` at most; all by default) as Buffers of
   * `chunkSize` (at most 64 MiB), one request each. */
  async *filesReadStream(workspace, path, { offset = 0, length, chunkSize = MAX_IO_BYTES, signal } = {}) {
    for (const [off, n] of readRanges(offset, length, chunkSize)) {
      const r = await this.request('files_read', filesArgs(workspace, path, { offset: off, length: n }), { signal });
      const data = Buffer.from(r.data ?? '', 'base64');
      if (data.length) yield data;
      if (data.length < n) return;
    }
  }
  /** The file's bytes (a Buffer), read in ranges of 64 MiB. */
  async filesRead(workspace, path, o = {}) {
    const parts = [];
    for await (const p of this.filesReadStream(workspace, path, o)) parts.push(p);
    return Buffer.concat(parts);
  }
  /** Writes `data` (string, Uint8Array, or an (async) iterable of them such as a
   * Readable) to `path`: a first write plus appends of at most 64 MiB. */
  async filesWrite(workspace, path, data, { mode, append, chunkSize = MAX_IO_BYTES, signal } = {}) {
    let info;
    let i = 0;
    for await (const piece of writeChunks(data, chunkSize)) {
      const a = filesArgs(workspace, path, { data: piece.toString('base64'), mode, append: append || i > 0 ? true : undefined });
      info = await this.request('files_write', a, { signal });
      i++;
    }
    return info;
  }
  filesMkdir(workspace, path, { parents, mode, signal } = {}) {
    return this.request('files_mkdir', filesArgs(workspace, path, { parents, mode }), { signal });
  }
  filesRemove(workspace, path, { recursive, signal } = {}) {
    return this.request('files_remove', filesArgs(workspace, path, { recursive }), { signal });
  }
  filesRename(workspace, path, to, o = {}) { return this.request('files_rename', filesArgs(workspace, path, { to }), o); }
  filesSymlink(workspace, path, target, o = {}) { return this.request('files_symlink', filesArgs(workspace, path, { to: target }), o); }
  /** Watches the tree below `path` on a connection of its own: a Watch (an async
   * iterable of events; close it, or abort `signal`). In place when this resolves. */
  watch(workspace, path = '.', { signal } = {}) { return watchOpen(this.path, filesArgs(workspace, path), signal); }

  // -- exec ---------------------------------------------------------------------------
  /** The `exec` operation: the keeper socket of the running sandbox (`NotFound` when none). */
  async keeperSocket(workspace, o = {}) { return (await this.request('exec', args({ workspace }), o)).socket; }

  /** Starts `cmd` in the workspace's running sandbox; gives the running Command. */
  async spawn(workspace, cmd, { env, workdir, stdin, pty, onStdout, onStderr, signal } = {}) {
    const argv = argvOf(cmd);
    // Asked first, so that "no sandbox" is a typed NotFound rather than mountctl's exit
    // 3, and a sandbox paused by request a typed Busy (as the keeper answers).
    const st = await this.sandboxStatus(workspace, { signal });
    if (st?.state === 'paused' && st?.paused_by !== 'idle') {
      throw new Busy(`the sandbox of ${workspace} is paused (since ${st.paused_at ?? '?'}): no exec until it is resumed`, 'resume it (sandboxResume)');
    }
    const c = startCommand({ mountctl: this.mountctl, root: this.root, workspace, argv, env, workdir, stdin, pty, onStdout, onStderr });
    if (signal) {
      const onAbort = () => c.kill();
      signal.addEventListener('abort', onAbort, { once: true });
      c._finished.then(() => signal.removeEventListener('abort', onAbort));
    }
    return c;
  }

  /** Runs `cmd` and gives its ExecResult (or, with `background`, the running Command). */
  async exec(workspace, cmd, opts = {}) {
    const { timeoutMs, background, check, signal } = opts;
    const c = await this.spawn(workspace, cmd, opts);
    if (background) return c;
    let res;
    try {
      res = await c.wait({ timeoutMs, signal });
    } catch (e) {
      c.kill();
      const partial = await c._finished;
      if (e instanceof ExecTimeoutError) throw new ExecTimeoutError(timeoutMs, partial);
      throw e;
    }
    if (res.exitCode === 127 && /command not found/.test(res.stderr)) res.error = res.stderr.trim().replace(/^mountctl: /, '');
    if (check && res.exitCode !== 0) throw new CommandFailed(res);
    return res;
  }
}

export default Client;
