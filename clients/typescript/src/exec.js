// `exec` for Node: Node cannot pass file descriptors over a Unix socket (no
// SCM_RIGHTS), which the sandbox keeper's protocol needs, so a command runs through
// `mountctl exec WS -- CMD` as a child process whose stdio is streamed here. mountctl
// forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the command; when
// it dies (SIGKILL included) the keeper kills the command. A pseudo-terminal is made by
// util-linux `script` around `mountctl exec -t` (size set with `stty`; no resize).

import { spawn } from 'node:child_process';
import { StringDecoder } from 'node:string_decoder';
import { constants as osConstants } from 'node:os';

import { ExecTimeoutError, Unsupported } from './errors.js';

/** How long output still buffered in a pipe is read after the command ended. */
const DRAIN_AFTER_EXIT_MS = 200;

function shellQuote(s) {
  return `'${String(s).replace(/'/g, `'\\''`)}'`;
}

/** The argv of `cmd`: a string is run by `sh -c`. */
export function argvOf(cmd) {
  if (typeof cmd === 'string') return ['sh', '-c', cmd];
  const argv = Array.from(cmd, String);
  if (argv.length === 0) throw new TypeError('no command given');
  return argv;
}

function ptySize(pty) {
  if (pty === undefined || pty === null || pty === false) return null;
  if (pty === true) return { rows: 24, cols: 80 };
  if (Array.isArray(pty)) return { rows: pty[0], cols: pty[1] };
  return { rows: pty.rows, cols: pty.cols };
}

/** A command running in a sandbox. */
export class Command {
  constructor(child, { onStdout, onStderr, pty }) {
    this.child = child;
    this.pid = child.pid;
    this.pty = !!pty;
    this._chunks = [];
    this._waiters = [];
    this._callbacks = { stdout: onStdout, stderr: onStderr };
    this._decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
    this._callbackError = null;
    this._started = performance.now();
    this._exit = null;
    this._spawnError = null;
    const open = new Set();
    const finish = () => {
      if (this._done) return;
      this._done = true;
      for (const name of ['stdout', 'stderr']) {
        const tail = this._decoders[name].end();
        if (tail && this._callbacks[name]) this._call(this._callbacks[name], tail);
      }
      child.stdout?.destroy();
      child.stderr?.destroy();
      child.stdin?.destroy();
      this._wake();
      this._resolve(this._result());
    };
    this._finished = new Promise((resolve) => { this._resolve = resolve; });
    for (const name of ['stdout', 'stderr']) {
      const s = child[name];
      if (!s) continue;
      open.add(name);
      s.on('data', (data) => this._emit(name, data));
      s.on('end', () => { open.delete(name); if (this._exit !== null && open.size === 0) finish(); });
      s.on('error', () => {});
    }
    child.stdin?.on('error', () => {});
    child.on('error', (e) => { this._spawnError = e; this._exit = 127; this._error = e.message; finish(); });
    child.on('exit', (code, signal) => {
      this._elapsed = performance.now() - this._started;
      this._exit = code ?? 128 + (osConstants.signals[signal] ?? 9);
      if (open.size === 0) finish();
      else setTimeout(finish, DRAIN_AFTER_EXIT_MS).unref();
    });
  }

  _call(cb, text) {
    try {
      const r = cb(text);
      if (r && typeof r.then === 'function') r.catch((e) => { this._callbackError ??= e; });
    } catch (e) {
      this._callbackError ??= e;
    }
  }

  _emit(stream, data) {
    this._chunks.push({ stream, data });
    this._wake();
    const cb = this._callbacks[stream];
    if (cb) {
      const text = this._decoders[stream].write(data);
      if (text) this._call(cb, text);
    }
  }

  _wake() {
    const w = this._waiters;
    this._waiters = [];
    for (const f of w) f();
  }

  _result() {
    const pick = (name) => Buffer.concat(this._chunks.filter((c) => c.stream === name).map((c) => c.data));
    const stdoutBytes = pick('stdout');
    const stderrBytes = pick('stderr');
    return {
      exitCode: this._exit ?? -1,
      stdout: stdoutBytes.toString('utf8'),
      stderr: stderrBytes.toString('utf8'),
      stdoutBytes,
      stderrBytes,
      pid: this.pid,
      error: this._error ?? null,
      elapsedMs: this._elapsed ?? performance.now() - this._started,
    };
  }

  /** Whether it still runs. */
  get running() { return !this._done; }

  /** The status once it ended, else null. */
  get exitCode() { return this._done ? this._exit : null; }

  /** Waits for the end; `timeoutMs` rejects with ExecTimeoutError (without killing). */
  async wait({ timeoutMs, signal } = {}) {
    const races = [this._finished];
    let timer;
    let onAbort;
    if (timeoutMs !== undefined && timeoutMs !== null) {
      races.push(new Promise((_, reject) => {
        timer = setTimeout(() => reject(new ExecTimeoutError(timeoutMs, this._result())), timeoutMs);
      }));
    }
    if (signal) {
      signal.throwIfAborted();
      races.push(new Promise((_, reject) => {
        onAbort = () => reject(signal.reason);
        signal.addEventListener('abort', onAbort, { once: true });
      }));
    }
    try {
      const r = await Promise.race(races);
      if (this._callbackError) {
        const e = this._callbackError;
        this._callbackError = null;
        throw e;
      }
      return r;
    } finally {
      clearTimeout(timer);
      if (onAbort) signal.removeEventListener('abort', onAbort);
    }
  }

  /** Output pieces `{stream, data}` as they arrive, until it ended. */
  async *[Symbol.asyncIterator]() {
    let i = 0;
    for (;;) {
      while (i >= this._chunks.length && !this._done) {
        await new Promise((resolve) => this._waiters.push(resolve));
      }
      if (i >= this._chunks.length) return;
      yield this._chunks[i++];
    }
  }

  /** `{stream, line}` as lines arrive (without their newline). */
  async *lines() {
    const dec = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
    const buf = { stdout: '', stderr: '' };
    for await (const c of this) {
      buf[c.stream] += dec[c.stream].write(c.data);
      const parts = buf[c.stream].split('\n');
      buf[c.stream] = parts.pop();
      for (const line of parts) yield { stream: c.stream, line };
    }
    for (const stream of ['stdout', 'stderr']) {
      const rest = buf[stream] + dec[stream].end();
      if (rest) yield { stream, line: rest };
    }
  }

  /** Sends a signal (a name or number): SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
   * SIGUSR2 reach the command; SIGKILL kills it (and mountctl). */
  signal(sig) {
    if (this._done) return;
    try { this.child.kill(sig); } catch { /* gone */ }
  }

  /** SIGKILL. */
  kill() { this.signal('SIGKILL'); }

  /** Writes to the command's stdin (`stdin: 'pipe'`) or pseudo-terminal. */
  write(data) {
    if (!this.child.stdin || this.child.stdin.destroyed) {
      throw new TypeError("the command's stdin is not a pipe of this client (give stdin: 'pipe' or pty)");
    }
    return new Promise((resolve, reject) => this.child.stdin.write(data, (e) => (e ? reject(e) : resolve())));
  }

  /** Closes stdin (end of file); a pseudo-terminal gets ^D. */
  closeStdin() {
    if (this.pty) return this.write('\x04');
    this.child.stdin?.end();
    return Promise.resolve();
  }

  /** A pseudo-terminal's size cannot be changed through mountctl from Node. */
  resize() {
    throw new Unsupported('resizing a pseudo-terminal is not available in the Node client (it runs `mountctl exec -t` under `script`)', 'give the size when starting: pty: {rows, cols}');
  }

  /** Kills the command if it still runs and waits for the end. */
  async close() {
    if (!this._done) {
      this.kill();
      await this._finished;
    }
  }

  async [Symbol.asyncDispose]() { await this.close(); }
}

/** Starts `argv` in WS's sandbox through `mountctl`. */
export function startCommand({ mountctl, root, workspace, argv, env, workdir, stdin, pty, onStdout, onStderr }) {
  const size = ptySize(pty);
  const args = ['--root', root, 'exec', workspace];
  for (const [k, v] of Object.entries(env ?? {})) args.push('--env', `${k}=${v}`);
  if (workdir) args.push('--workdir', workdir);
  const feed = (typeof stdin === 'string' && stdin !== 'pipe') || Buffer.isBuffer(stdin) || stdin instanceof Uint8Array ? stdin : null;
  const wantStdin = size !== null || stdin === 'pipe' || feed !== null;
  let file = mountctl;
  let fileArgs;
  if (size !== null) {
    const inner = [mountctl, ...args, '-t', '--', ...argv].map(shellQuote).join(' ');
    const sh = `stty rows ${Number(size.rows)} cols ${Number(size.cols)} 2>/dev/null; exec ${inner}`;
    file = 'script';
    fileArgs = ['-q', '-e', '-c', sh, '/dev/null'];
  } else {
    if (wantStdin) args.push('-i');
    fileArgs = [...args, '--', ...argv];
  }
  const child = spawn(file, fileArgs, { stdio: [wantStdin ? 'pipe' : 'ignore', 'pipe', 'pipe'] });
  const cmd = new Command(child, { onStdout, onStderr, pty: size !== null });
  if (feed !== null) {
    child.stdin.write(feed);
    if (size === null) child.stdin.end();
  }
  return cmd;
}
