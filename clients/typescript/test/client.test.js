// The cowspace Node client against a real daemon. Run by tests/tests/e2e/workspaces/
// clients.rs (`node --test` here) with:
// - COWSPACE_TEST_ROOT: the runtime root (its daemon running);
// - COWSPACE_TEST_TMP: a scratch directory the test may fill;
// - COWSPACE_MOUNTCTL: the mountctl binary exec runs.
// Without COWSPACE_TEST_ROOT the tests needing a daemon are skipped; the version
// handshake is checked against a fake daemon whatever the machine.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'node:http';

import { createHash, randomBytes } from 'node:crypto';

import Client, {
  Busy, Command, CommandFailed, CowspaceError, ExecTimeoutError, Exists, Files, IncompatibleDaemon, InvalidInput,
  IoError, NotFound, PROTOCOL_VERSION, Unsupported, Watch,
} from '../src/index.js';

const ROOT = process.env.COWSPACE_TEST_ROOT;
const TMP = process.env.COWSPACE_TEST_TMP || tmpdir();
const needsDaemon = ROOT ? {} : { skip: 'COWSPACE_TEST_ROOT is not set (run by tests/tests/e2e/workspaces/clients.rs)' };

const MIGRATE = `import sqlite3, sys
db = sqlite3.connect('/workspace/app.db')
db.execute('create table who (name text)')
db.execute('insert into who values (?)', (sys.argv[1],))
db.commit()
(name,) = db.execute('select name from who').fetchone()
open('/workspace/whoami.txt', 'w').write(name)
`;

const TEST_APP = `const test = require('node:test');
const assert = require('node:assert');
const { hello } = require('/workspace/node_modules/greet');
test('greet', () => assert.strictEqual(hello('cow'), 'hello cow'));
test('migrated', () => assert.strictEqual(require('fs').readFileSync('/workspace/whoami.txt', 'utf8'), 'ts-seed'));
`;

/** The seed project: a migration, tests, and a dependency in a read-only cache. */
function makeProject(prefix) {
  const base = mkdtempSync(join(TMP, prefix));
  const src = join(base, 'src');
  const deps = join(base, 'deps');
  mkdirSync(join(src, 'test'), { recursive: true });
  mkdirSync(join(deps, 'greet'), { recursive: true });
  writeFileSync(join(src, 'migrate.py'), MIGRATE);
  writeFileSync(join(src, 'test', 'app.test.cjs'), TEST_APP);
  writeFileSync(join(src, 'README.md'), '# the seed app\n');
  for (let i = 0; i < 400; i++) {
    mkdirSync(join(src, 'data', String(i % 10)), { recursive: true });
    writeFileSync(join(src, 'data', String(i % 10), `f${i}.txt`), `row ${i}\n`);
  }
  writeFileSync(join(deps, 'greet', 'package.json'), JSON.stringify({ name: 'greet', version: '1.0.0', main: 'index.js' }));
  writeFileSync(join(deps, 'greet', 'index.js'), "exports.hello = (n) => 'hello ' + n;\n");
  return { src, deps };
}

function httpGet(port, path) {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, timeout: 5000 }, (res) => {
      const chunks = [];
      res.on('data', (d) => chunks.push(d));
      res.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.end();
  });
}

async function httpGetWhenUp(port, path, ms = 60_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await httpGet(port, path);
    } catch (e) {
      if (Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

// The install runs npm inside the sandbox when it has one there, else copies (the
// install of a local package is the same either way: a directory under node_modules).
const INSTALL = 'mkdir -p node_modules && if command -v npm >/dev/null; then npm install --offline --no-audit --no-fund --no-save /deps/greet; else cp -r /deps/greet node_modules/greet; fi && echo installed greet';

test('the seed chain: import, create, sandbox, install, tests, a server, commit, remove', needsDaemon, async () => {
  const { src, deps } = makeProject('ts-seed-');
  const c = await Client.connect({ root: ROOT });
  try {
    assert.equal(c.daemon.pong, true);
    const events = [];
    const rep = await c.import(src, { ref: 'ts/seed', message: 'seed app', onProgress: (e) => events.push(e) });
    assert.equal(rep.snapshot.length, 64);
    assert.ok(rep.files > 400, JSON.stringify(rep));
    assert.ok(events.length > 0 && events.at(-1).event === 'progress');
    assert.equal((await c.refs())['ts/seed'], rep.snapshot);
    assert.ok((await c.snapshots()).some((s) => s.snapshot === rep.snapshot));

    const ws = await c.create('ts/seed', { name: 'ts-seed', worker: 'node-tests' });
    console.log(JSON.stringify({ workspace: ws.id }));
    try {
      assert.equal(ws.status, 'active');
      assert.ok((await c.list()).some((w) => w.id === ws.id));
      assert.equal((await c.status('ts-seed')).id, ws.id);
      const sb = await c.sandboxStart(ws.id, { publish: [3000], roBind: { [deps]: '/deps' }, memory: '1g', pids: 512 });
      const port = Number(sb.ports['3000']);
      assert.ok((await c.sandboxList()).some((s) => s.workspace === ws.id));

      // The install, streamed to a callback.
      let out = '';
      let r = await c.exec(ws.id, INSTALL, { onStdout: (t) => { out += t; }, timeoutMs: 300_000 });
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      assert.match(out, /installed greet/);
      await c.exec(ws.id, ['python3', 'migrate.py', 'ts-seed'], { check: true });
      // The tests: node's runner inside when the sandbox has node, else python's.
      const hasNode = (await c.exec(ws.id, 'command -v node')).exitCode === 0;
      r = hasNode
        ? await c.exec(ws.id, ['node', '--test', 'test/'], { timeoutMs: 300_000 })
        : await c.exec(ws.id, ['python3', '-c', "import json; assert json.load(open('node_modules/greet/package.json'))['name'] == 'greet'; assert open('whoami.txt').read() == 'ts-seed'; print('# pass 2')"]);
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      assert.match(r.stdout, /# pass 2/);

      // A server in the background, reached through the published port.
      const server = await c.exec(ws.id, ['python3', '-m', 'http.server', '3000'], { background: true });
      assert.ok(server instanceof Command && server.running);
      assert.equal(await httpGetWhenUp(port, '/whoami.txt'), 'ts-seed');
      assert.equal((await c.sandboxStatus(ws.id)).state, 'running');
      server.kill();
      const done = await server.wait({ timeoutMs: 60_000 });
      assert.equal(done.exitCode, 137);

      // One that outlives its exec, published later.
      await c.exec(ws.id, 'nohup python3 -m http.server 3001 >/dev/null 2>&1 </dev/null &', { check: true });
      const pub = await c.sandboxPublish(ws.id, 3001);
      assert.equal(pub.port, 3001);
      assert.match(await httpGetWhenUp(pub.host_port, '/README.md'), /the seed app/);
      await assert.rejects(c.sandboxPublish(ws.id, 3001), Exists);
      assert.equal((await c.sandboxUnpublish(ws.id, 3001)).unpublished, true);
      await assert.rejects(c.sandboxPolicy(ws.id, { allowHost: 'example.com' }), InvalidInput);

      await execFeatures(c, ws.id);

      assert.equal((await c.sandboxStop(ws.id)).stopped, true);
      await assert.rejects(c.sandboxStatus(ws.id), NotFound);
      const d = await c.diff(ws.id, { includeExcluded: true });
      const paths = new Set(d.changes.map((x) => x.path));
      assert.ok(paths.has('whoami.txt') && paths.has('node_modules'), JSON.stringify(d));
      const cm = await c.commit(ws.id, { ref: 'ts/seed', message: 'installed and tested', includeExcluded: true });
      assert.deepEqual(cm.parents, [rep.snapshot]);
      assert.equal((await c.refs())['ts/seed'], cm.snapshot);
      const shown = await c.show(cm.snapshot, 'whoami.txt');
      assert.equal(shown.entry.size, 'ts-seed'.length);
    } finally {
      const removed = await c.remove(ws.id, { force: true });
      assert.equal(removed.status, 'removed');
    }
    assert.ok(!existsSync(ws.path));
    assert.ok(!(await c.list()).some((w) => w.id === ws.id));
  } finally {
    c.close();
  }
});

async function execFeatures(c, id) {
  let r = await c.exec(id, 'echo out; echo err >&2; exit 7');
  assert.deepEqual([r.exitCode, r.stdout, r.stderr], [7, 'out\n', 'err\n']);
  await assert.rejects(c.exec(id, 'exit 3', { check: true }), CommandFailed);
  r = await c.exec(id, ['no-such-command']);
  assert.equal(r.exitCode, 127);
  assert.match(r.error ?? '', /no-such-command/);
  assert.equal((await c.exec(id, ['cat'], { stdin: 'fed\n' })).stdout, 'fed\n');
  assert.equal((await c.exec(id, ['pwd'], { workdir: 'node_modules' })).stdout, '/workspace/node_modules\n');
  assert.equal((await c.exec(id, 'echo "$A"', { env: { A: 'from-env' } })).stdout, 'from-env\n');
  // Lines as they arrive, from an async iterator.
  const cmd = await c.spawn(id, 'for i in 1 2 3; do echo line$i; sleep 0.05; done; echo bye >&2');
  const lines = [];
  for await (const l of cmd.lines()) lines.push(l);
  assert.deepEqual(lines, [
    { stream: 'stdout', line: 'line1' }, { stream: 'stdout', line: 'line2' },
    { stream: 'stdout', line: 'line3' }, { stream: 'stderr', line: 'bye' },
  ]);
  assert.equal((await cmd.wait()).exitCode, 0);
  // stdin written while it runs.
  const cat = await c.spawn(id, ['cat'], { stdin: 'pipe' });
  await cat.write('piped\n');
  await cat.closeStdin();
  assert.equal((await cat.wait({ timeoutMs: 60_000 })).stdout, 'piped\n');
  // A signal reaches the command.
  const sl = await c.exec(id, ['sleep', '60'], { background: true });
  await new Promise((res) => setTimeout(res, 300));
  sl.signal('SIGTERM');
  assert.equal((await sl.wait({ timeoutMs: 60_000 })).exitCode, 143);
  // A timeout kills it.
  const t0 = Date.now();
  const te = await c.exec(id, 'echo started; sleep 60', { timeoutMs: 1000 }).catch((e) => e);
  assert.ok(te instanceof ExecTimeoutError, String(te));
  assert.equal(te.result.exitCode, 137);
  assert.equal(te.result.stdout, 'started\n');
  assert.ok(Date.now() - t0 < 30_000);
  // An AbortSignal kills it too.
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 300);
  await assert.rejects(c.exec(id, ['sleep', '60'], { signal: ac.signal }), { name: 'AbortError' });
  // A pseudo-terminal of the sandbox, with its size.
  r = await c.exec(id, 'tty; stty size', { pty: { rows: 30, cols: 100 }, timeoutMs: 60_000 });
  assert.equal(r.exitCode, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /\/dev\/pts\//);
  assert.match(r.stdout, /30 100/);
  const term = await c.spawn(id, ['sh', '-c', 'read x; echo got-$x'], { pty: true });
  assert.throws(() => term.resize(40, 120), Unsupported);
  await term.write('hi\n');
  assert.match((await term.wait({ timeoutMs: 60_000 })).stdout, /got-hi/);
}

test('errors: a missing workspace, exec with no sandbox, a bad argument', needsDaemon, async () => {
  const base = mkdtempSync(join(TMP, 'ts-err-'));
  mkdirSync(join(base, 'src'));
  writeFileSync(join(base, 'src', 'a.txt'), 'a\n');
  const c = await Client.connect({ root: ROOT });
  try {
    const e = await c.status('no-such-workspace').catch((x) => x);
    assert.ok(e instanceof NotFound && e instanceof CowspaceError, String(e));
    assert.equal(e.kind, 'not_found');
    assert.equal(e.exitCode, 3);
    assert.match(e.message, /no-such-workspace/);
    await assert.rejects(c.remove('no-such-workspace'), NotFound);
    await c.import(join(base, 'src'), { ref: 'ts/err' });
    const ws = await c.create('ts/err');
    console.log(JSON.stringify({ workspace: ws.id }));
    try {
      await assert.rejects(c.exec(ws.id, ['true']), NotFound);
      const bad = await c.request('sandbox_start', { workspace: ws.id, memroy: '1g' }).catch((x) => x);
      assert.ok(bad instanceof InvalidInput, String(bad));
      assert.match(bad.message, /memroy/);
      await assert.rejects(c.sandboxStatus(ws.id), NotFound);
      await assert.rejects(c.request('frobnicate'), (x) => x instanceof InvalidInput && /frobnicate/.test(x.message));
      await assert.rejects(c.sandboxStart(ws.id, { net: 'bogus' }), InvalidInput);
      // The connection still answers after errors, in order.
      const [a, b] = await Promise.all([c.status(ws.id), c.status('nope').catch((x) => x)]);
      assert.equal(a.id, ws.id);
      assert.ok(b instanceof NotFound);
      // An aborted request rejects with the abort's reason.
      await assert.rejects(c.ping({ signal: AbortSignal.abort() }), { name: 'AbortError' });
    } finally {
      const c2 = await Client.connect({ root: ROOT });
      await c2.remove(ws.id, { force: true });
      c2.close();
    }
  } finally {
    c.close();
  }
});

/** Events of `w` until every path of `want` was seen (or `ms` passed). */
async function collect(w, want, ms = 60_000) {
  const seen = [];
  const deadline = Date.now() + ms;
  while (!want.every((p) => seen.some((e) => e.path === p))) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    const ev = await w.get({ timeoutMs: left });
    if (ev === null) break;
    seen.push(ev);
  }
  return seen;
}

test('files while a sandbox runs, watch, fork, pause and resume', needsDaemon, async () => {
  const base = mkdtempSync(join(TMP, 'ts-files-'));
  mkdirSync(join(base, 'src', 'lib'), { recursive: true });
  writeFileSync(join(base, 'src', 'README.md'), '# files\n');
  writeFileSync(join(base, 'src', 'lib', 'a.js'), 'exports.a = 1;\n');
  const c = await Client.connect({ root: ROOT });
  let forkIds = [];
  let id;
  try {
    await c.import(join(base, 'src'), { ref: 'ts/files' });
    const ws = await c.create('ts/files', { name: 'ts-files' });
    id = ws.id;
    console.log(JSON.stringify({ workspace: id }));
    await c.sandboxStart(id, { idleTimeout: '10m' });
    assert.equal((await c.sandboxStatus(id)).idle_timeout_ms, 600_000);

    // Written by the client while the sandbox runs, read from inside: root's there.
    assert.equal((await c.filesMkdir(id, 'notes/deep', { parents: true })).kind, 'dir');
    const info = await c.filesWrite(id, 'notes/hello.txt', 'hello from the host\n', { mode: 0o640 });
    assert.deepEqual([info.kind, info.size, info.mode], ['file', 20, 0o640]);
    let r = await c.exec(id, 'cat notes/hello.txt; ls -ln notes/hello.txt', { check: true });
    const lines = r.stdout.split('\n');
    assert.equal(lines[0], 'hello from the host');
    assert.deepEqual(lines[1].split(/\s+/).slice(2, 4), ['0', '0'], r.stdout);
    const st = await c.filesStat(id, '/notes/hello.txt');
    assert.deepEqual([st.uid, st.gid, st.size], [0, 0, 20]);
    assert.equal((await c.filesRead(id, 'notes/hello.txt', { offset: 6, length: 4 })).toString(), 'from');
    await c.exec(id, 'printf inside > notes/deep/in.txt', { check: true });
    const files = c.files(id);
    assert.ok(files instanceof Files);
    assert.equal(await files.read('notes/deep/in.txt'), 'inside');

    // Large contents in ranges and appends (small ones here), from a stream too.
    const blob = randomBytes(10_000);
    assert.equal((await c.filesWrite(id, 'notes/blob.bin', blob, { chunkSize: 3000 })).size, 10_000);
    const pieces = [];
    for await (const p of c.filesReadStream(id, 'notes/blob.bin', { chunkSize: 4096 })) pieces.push(p);
    assert.deepEqual(pieces.map((p) => p.length), [4096, 4096, 1808]);
    assert.ok(Buffer.concat(pieces).equals(blob));
    async function* gen() { yield 'ab'; yield Buffer.from('cd'); }
    assert.equal((await files.append('notes/blob.bin', gen())).size, 10_004);
    r = await c.exec(id, ['sha256sum', 'notes/blob.bin'], { check: true });
    const sum = createHash('sha256').update(blob).update('abcd').digest('hex');
    assert.equal(r.stdout.split(' ')[0], sum);

    // Listings.
    const top = new Map((await c.filesList(id)).map((e) => [e.path, e]));
    assert.equal(top.get('notes').kind, 'dir');
    assert.ok(top.has('README.md') && !top.has('notes/hello.txt'));
    const every = new Set((await files.list('.', { recursive: true })).map((e) => e.path));
    for (const p of ['lib/a.js', 'notes/hello.txt', 'notes/deep/in.txt', 'notes/blob.bin']) assert.ok(every.has(p), p);

    // A path climbing above the root is refused.
    for (const call of [
      () => c.filesRead(id, '../../etc/passwd'),
      () => c.filesWrite(id, 'notes/../../escape.txt', 'x'),
      () => c.filesList(id, '..'),
    ]) {
      const e = await call().catch((x) => x);
      assert.ok(e instanceof InvalidInput, String(e));
      assert.equal(e.exitCode, 9);
    }
    await assert.rejects(c.filesStat(id, 'no/such/file'), NotFound);

    // Rename, symlink, remove.
    assert.equal((await c.filesRename(id, 'notes/hello.txt', 'notes/renamed.txt')).path, 'notes/renamed.txt');
    assert.equal(await files.exists('notes/hello.txt'), false);
    assert.equal((await c.exec(id, 'cat notes/renamed.txt')).stdout, 'hello from the host\n');
    const link = await files.symlink('notes/link', 'renamed.txt');
    assert.deepEqual([link.kind, link.target], ['symlink', 'renamed.txt']);
    await c.filesRemove(id, 'notes/link');
    await assert.rejects(c.filesRemove(id, 'notes'), CowspaceError);
    await files.remove('notes');
    assert.equal(await files.exists('notes'), false);
    assert.equal((await c.exec(id, 'test -e notes || echo gone')).stdout, 'gone\n');

    // A watch sees a file made inside the sandbox and one written by the client.
    {
      const w = await c.watch(id);
      assert.ok(w instanceof Watch);
      assert.equal(w.watching.event, 'watching');
      await c.exec(id, 'echo made > from-inside.txt', { check: true });
      await files.write('from-client.txt', 'written\n');
      const seen = await collect(w, ['from-inside.txt', 'from-client.txt']);
      w.close();
      const events = new Map(seen.map((e) => [e.path, e.event]));
      assert.ok(['created', 'modified'].includes(events.get('from-inside.txt')), JSON.stringify(seen));
      // A write is atomic: a temporary file renamed over the target.
      assert.ok(['created', 'modified', 'renamed'].includes(events.get('from-client.txt')), JSON.stringify(seen));
      assert.ok(w.ended);
    }
    // An AbortSignal ends a watch's iteration with its reason.
    {
      const ac = new AbortController();
      const w = await files.watchDir('.', { signal: ac.signal });
      setTimeout(() => ac.abort(), 200);
      await assert.rejects((async () => { for await (const _ of w) { /* none */ } })(), { name: 'AbortError' });
    }
    await assert.rejects(c.watch(id, '../up'), InvalidInput);

    // Pause: exec is refused as Busy until resumed.
    const p = await c.sandboxPause(id);
    assert.equal(p.paused, true);
    assert.equal(p.paused_by, 'request');
    assert.equal((await c.sandboxStatus(id)).state, 'paused');
    const busy = await c.exec(id, ['true']).catch((x) => x);
    assert.ok(busy instanceof Busy, String(busy));
    assert.equal(busy.exitCode, 5);
    await assert.rejects(c.sandboxPause(id), InvalidInput);
    assert.equal((await c.sandboxResume(id)).resumed, true);
    assert.equal((await c.sandboxStatus(id)).state, 'running');
    assert.equal((await c.exec(id, 'cat from-client.txt')).stdout, 'written\n');

    // A fork shows the parent's change; removing one with changes needs force.
    const f = await c.fork(id, { name: 'ts-files-fork' });
    forkIds = f.forks.map((x) => x.id);
    console.log(JSON.stringify({ forks: forkIds }));
    assert.equal(f.parent, id);
    assert.equal(forkIds.length, 1);
    assert.equal(f.forks[0].parent, id);
    assert.equal((await c.filesRead(forkIds[0], 'from-client.txt')).toString(), 'written\n');
    assert.equal(await c.files(forkIds[0]).read('from-inside.txt'), 'made\n');
    await c.filesWrite(forkIds[0], 'fork-only.txt', 'f');
    assert.equal(await files.exists('fork-only.txt'), false);
    await assert.rejects(c.remove(forkIds[0]), Busy);
  } finally {
    for (const fid of forkIds) assert.equal((await c.remove(fid, { force: true })).status, 'removed');
    if (id) await c.remove(id, { force: true });
    c.close();
  }
});

/** A socket answering every request with `answer`. */
async function fakeDaemon(answer) {
  const dir = mkdtempSync(join(TMP, 'fake-fsd-'));
  const path = join(dir, 'fsd.sock');
  const server = createServer((s) => {
    s.on('data', (d) => {
      for (const _ of d.toString().split('\n').slice(0, -1)) s.write(JSON.stringify({ ok: true, result: answer }) + '\n');
    });
    s.on('error', () => {});
  });
  await new Promise((r) => server.listen(path, r));
  return { path, close: () => { server.close(); rmSync(dir, { recursive: true, force: true }); } };
}

test('the version handshake refuses another protocol, naming both', async () => {
  const d = await fakeDaemon({ pong: true, version: '9.0.0', protocol: 99 });
  try {
    const e = await Client.connect({ socket: d.path }).catch((x) => x);
    assert.ok(e instanceof IncompatibleDaemon, String(e));
    assert.equal(e.kind, 'unsupported');
    assert.match(e.message, /protocol 99/);
    assert.match(e.message, new RegExp(`protocol ${PROTOCOL_VERSION}`));
  } finally {
    d.close();
  }
  for (const answer of [{ pong: true, version: '0.1.0' }, { pong: true, version: '0.1.0', protocol: PROTOCOL_VERSION }]) {
    const ok = await fakeDaemon(answer);
    try {
      const c = await Client.connect({ socket: ok.path });
      assert.deepEqual(c.daemon, answer);
      c.close();
    } finally {
      ok.close();
    }
  }
  const none = await Client.connect({ socket: join(TMP, 'no-such-dir', 'fsd.sock') }).catch((x) => x);
  assert.ok(none instanceof IoError);
  assert.match(none.hint, /mountctl daemon start/);
});
