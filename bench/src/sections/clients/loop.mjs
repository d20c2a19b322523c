// One method of bench's clients section: N create+remove and N `exec -- /bin/true`
// through the Node client (`client`) or the raw control socket (`raw`), timed one by one
// inside this process (so Node's start-up is not counted). Prints one JSON line:
// {"create_remove": [s, ...], "exec": [s, ...]}.
//
// argv: MODE ROOT SNAPSHOT WORKSPACE ITERATIONS WARMUP CLIENT_INDEX MOUNTCTL
//
// Node cannot pass descriptors over a Unix socket (no SCM_RIGHTS), which the keeper's
// exec needs; the raw way to exec from Node is `mountctl exec` as a child process, which
// is also what the client runs.

import { createConnection } from 'node:net';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [mode, root, snapshot, workspace, iters, warm, clientIndex, mountctl] = process.argv.slice(2);
const iterations = Number(iters);
const warmup = Number(warm);
const sockPath = join(root, 'run', 'fsd.sock');

class Raw {
  async open() {
    this.s = createConnection(sockPath);
    await new Promise((resolve, reject) => { this.s.once('connect', resolve); this.s.once('error', reject); });
    this.buf = '';
    this.waiting = null;
    this.s.setEncoding('utf8');
    this.s.on('data', (d) => {
      this.buf += d;
      const nl = this.buf.indexOf('\n');
      if (nl >= 0 && this.waiting) {
        const line = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        const w = this.waiting;
        this.waiting = null;
        w(line);
      }
    });
  }

  async request(op, args) {
    const line = await new Promise((resolve) => {
      this.waiting = resolve;
      this.s.write(JSON.stringify({ op, args }) + '\n');
    });
    const v = JSON.parse(line);
    if (!v.ok) throw new Error(`${op}: ${JSON.stringify(v.error)}`);
    return v.result;
  }

  async createRemove() {
    const ws = await this.request('create', { snapshot });
    await this.request('remove', { workspace: ws.id, force: true });
  }

  async execTrue() {
    const code = await new Promise((resolve, reject) => {
      const c = spawn(mountctl, ['--root', root, 'exec', workspace, '--', '/bin/true'], { stdio: 'ignore' });
      c.on('error', reject);
      c.on('exit', (code) => resolve(code));
    });
    if (code !== 0) throw new Error(`/bin/true exited ${code}`);
  }

  close() { this.s.destroy(); }
}

class WithClient {
  async open() {
    const { Client } = await import(pathToFileURL(clientIndex).href);
    this.c = await Client.connect({ root, mountctl });
  }

  async createRemove() {
    const ws = await this.c.create(snapshot);
    await this.c.remove(ws.id, { force: true });
  }

  async execTrue() {
    const r = await this.c.exec(workspace, ['/bin/true']);
    if (r.exitCode !== 0) throw new Error(`/bin/true exited ${r.exitCode}`);
  }

  close() { this.c.close(); }
}

const m = mode === 'client' ? new WithClient() : new Raw();
await m.open();
const out = { create_remove: [], exec: [] };
for (const [name, f] of [['create_remove', () => m.createRemove()], ['exec', () => m.execTrue()]]) {
  for (let i = 0; i < warmup + iterations; i++) {
    const t0 = performance.now();
    await f();
    const t = (performance.now() - t0) / 1e3;
    if (i >= warmup) out[name].push(t);
  }
}
m.close();
console.log(JSON.stringify(out));
