// Files in and out of a workspace (docs/files.md): ranges and appends for large
// contents, `watch` on a connection of its own, and the E2B-like `Files` view.

import { createConnection } from 'node:net';

import { errorFrom, IoError, NotFound } from './errors.js';

/** Most bytes one files_read or files_write moves (the daemon's bound). */
export const MAX_IO_BYTES = 64 * 1024 * 1024;

/** [offset, length] of the reads covering `length` bytes from `offset` (all: until short). */
export function* readRanges(offset, length, chunk) {
  const size = Math.max(1, Math.min(Math.floor(chunk), MAX_IO_BYTES));
  let pos = Number(offset);
  let left = length ?? null;
  while (left === null || left > 0) {
    const n = left === null ? size : Math.min(size, left);
    yield [pos, n];
    pos += n;
    if (left !== null) left -= n;
  }
}

function toBuffer(x) {
  if (typeof x === 'string') return Buffer.from(x, 'utf8');
  if (Buffer.isBuffer(x)) return x;
  if (x instanceof Uint8Array) return Buffer.from(x.buffer, x.byteOffset, x.byteLength);
  if (x instanceof ArrayBuffer) return Buffer.from(x);
  throw new TypeError('file data is a string, a Uint8Array, or an (async) iterable of them');
}

/** `data` in Buffers of at most `chunk` bytes; at least one (empty for empty data). */
export async function* writeChunks(data, chunk = MAX_IO_BYTES) {
  const size = Math.max(1, Math.min(Math.floor(chunk), MAX_IO_BYTES));
  const isIter = data && typeof data !== 'string' && !(data instanceof Uint8Array) && !(data instanceof ArrayBuffer)
    && (typeof data[Symbol.asyncIterator] === 'function' || typeof data[Symbol.iterator] === 'function');
  const sources = isIter ? data : [data];
  let any = false;
  let pending = [];
  let pendingLen = 0;
  for await (const piece of sources) {
    let b = toBuffer(piece);
    while (b.length) {
      const take = Math.min(size - pendingLen, b.length);
      pending.push(b.subarray(0, take));
      pendingLen += take;
      b = b.subarray(take);
      if (pendingLen === size) {
        yield Buffer.concat(pending);
        any = true;
        pending = [];
        pendingLen = 0;
      }
    }
  }
  if (pendingLen || !any) yield Buffer.concat(pending);
}

/** Changes below a path of a workspace, as they happen: an async iterable of events
 * (`{event, path, from?}`), ended by `close()` (or the AbortSignal given to `watch`),
 * or by the daemon (then `ended` holds its `{ended, why}`). */
export class Watch {
  constructor(sock) {
    this._sock = sock;
    this._buf = Buffer.alloc(0);
    this._events = [];
    this._waiters = [];
    this._error = null;
    /** The daemon's last word once the watch ended (null while it runs). */
    this.ended = null;
    /** The first line: `{event: 'watching', path}`. */
    this.watching = null;
    this._started = new Promise((resolve, reject) => { this._start = { resolve, reject }; });
    sock.on('data', (d) => this._data(d));
    sock.on('error', (e) => this._end(null, new IoError(`the watch's connection failed: ${e.message}`)));
    sock.on('close', () => this._end({ ended: true, why: 'the connection closed' }));
  }

  _data(d) {
    this._buf = this._buf.length ? Buffer.concat([this._buf, d]) : d;
    for (;;) {
      const nl = this._buf.indexOf(10);
      if (nl < 0) return;
      const line = this._buf.subarray(0, nl).toString('utf8');
      this._buf = this._buf.subarray(nl + 1);
      let v;
      try {
        v = JSON.parse(line);
      } catch {
        this._end(null, new IoError(`the daemon answered something that is not JSON: ${line.slice(0, 200)}`));
        return;
      }
      if (v && typeof v === 'object' && 'event' in v) {
        if (this.watching === null) {
          this.watching = v;
          this._start.resolve(this);
        } else {
          this._events.push(v);
          this._wake();
        }
      } else if (v?.ok === true) {
        this._end(v.result ?? { ended: true });
      } else {
        this._end(null, errorFrom(v?.error));
      }
    }
  }

  _end(ended, error) {
    if (this.ended !== null) return;
    this.ended = ended ?? { ended: true, why: error?.message ?? 'ended' };
    if (error && !this._error) this._error = error;
    if (this.watching === null) {
      if (error) this._start.reject(error);
      else this._start.resolve(this);
    }
    this._sock.destroy();
    this._wake();
  }

  _wake() {
    const w = this._waiters;
    this._waiters = [];
    for (const f of w) f();
  }

  async _next(timeoutMs) {
    const deadline = timeoutMs === undefined || timeoutMs === null ? null : Date.now() + timeoutMs;
    while (this._events.length === 0 && this.ended === null) {
      let timer;
      const woke = new Promise((resolve) => {
        this._waiters.push(resolve);
        if (deadline !== null) timer = setTimeout(() => resolve('timeout'), Math.max(0, deadline - Date.now()));
      });
      const why = await woke;
      clearTimeout(timer);
      if (why === 'timeout') return null;
    }
    if (this._events.length) return this._events.shift();
    if (this._error) {
      const e = this._error;
      this._error = null;
      throw e;
    }
    return null;
  }

  /** The next event within `timeoutMs`, or null (none came, or the watch ended). */
  get({ timeoutMs } = {}) { return this._next(timeoutMs); }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      const e = await this._next();
      if (e === null) return;
      yield e;
    }
  }

  /** Ends the watch (the daemon stops watching). */
  close() { this._end({ ended: true, why: 'closed by the client' }); }

  [Symbol.dispose]() { this.close(); }
  async [Symbol.asyncDispose]() { this.close(); }
}

/** Opens a watch: resolves once the daemon watches (its `watching` line), rejects with
 * its error (NotFound, InvalidInput, ...). */
export function watchOpen(path, a, signal) {
  if (signal?.aborted) return Promise.reject(signal.reason);
  const sock = createConnection(path);
  const w = new Watch(sock);
  sock.once('connect', () => sock.write(JSON.stringify({ op: 'watch', args: a }) + '\n'));
  if (signal) {
    const onAbort = () => {
      w._end({ ended: true, why: 'aborted' }, signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    sock.once('close', () => signal.removeEventListener('abort', onAbort));
  }
  return w._started.catch((e) => {
    if (e instanceof IoError && /ECONNREFUSED|ENOENT/.test(e.message)) {
      throw new IoError(`cannot connect to the daemon's socket ${path}: ${e.message}`, 'start the daemon (`mountctl daemon start`), or name the runtime root');
    }
    throw e;
  });
}

/** A workspace's files, shaped as E2B's `sandbox.files` (`client.files(ws)`). */
export class Files {
  constructor(client, workspace) {
    this.client = client;
    this.workspace = workspace;
  }

  /** The contents: a string (UTF-8; default) or, with `format: 'bytes'`, a Buffer. */
  async read(path, { format = 'text', signal } = {}) {
    const b = await this.client.filesRead(this.workspace, path, { signal });
    return format === 'bytes' ? b : b.toString('utf8');
  }

  readStream(path, o = {}) { return this.client.filesReadStream(this.workspace, path, o); }
  write(path, data, o = {}) { return this.client.filesWrite(this.workspace, path, data, o); }
  append(path, data, o = {}) { return this.client.filesWrite(this.workspace, path, data, { ...o, append: true }); }
  list(path = '.', o = {}) { return this.client.filesList(this.workspace, path, o); }
  getInfo(path, o = {}) { return this.client.filesStat(this.workspace, path, o); }
  stat(path, o = {}) { return this.client.filesStat(this.workspace, path, o); }

  async exists(path, o = {}) {
    try {
      await this.client.filesStat(this.workspace, path, o);
      return true;
    } catch (e) {
      if (e instanceof NotFound) return false;
      throw e;
    }
  }

  /** Makes the directory and its missing parents (no error when it exists). */
  makeDir(path, { mode, signal } = {}) { return this.client.filesMkdir(this.workspace, path, { parents: true, mode, signal }); }
  /** Removes the file, link or directory (with what it holds). */
  async remove(path, o = {}) { await this.client.filesRemove(this.workspace, path, { ...o, recursive: true }); }
  rename(oldPath, newPath, o = {}) { return this.client.filesRename(this.workspace, oldPath, newPath, o); }
  symlink(path, target, o = {}) { return this.client.filesSymlink(this.workspace, path, target, o); }
  watchDir(path = '.', o = {}) { return this.client.watch(this.workspace, path, o); }
}
