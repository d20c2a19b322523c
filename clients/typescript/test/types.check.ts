// Compiled by `tsc -p tsconfig.json` (no output): the declarations describe a usable API.
import Client, { type ExecResult, type Command, type FileInfo, type WatchEvent, type Watch, Busy, NotFound, CowspaceError, ExecTimeoutError } from 'cowspace';

export async function chain(root: string, src: string): Promise<number> {
  const c = await Client.connect({ root, mountctl: 'mountctl' });
  const rep = await c.import(src, { ref: 'app/main', onProgress: (e) => console.log(e.files_done) });
  const ws = await c.create(rep.snapshot, { name: 'w1' });
  const sb = await c.sandboxStart(ws.id, { publish: [3000], memory: '1g', env: { A: 'b' }, net: 'loopback' });
  const port: number = sb.ports['3000'];
  const r: ExecResult = await c.exec(ws.id, ['make', 'test'], { timeoutMs: 60_000, onStdout: (t) => process.stdout.write(t) });
  const bg: Command = await c.exec(ws.id, 'python3 -m http.server 3000', { background: true });
  for await (const { stream, line } of bg.lines()) { if (stream === 'stderr' && line) break; }
  bg.kill();
  const done: ExecResult = await bg.wait({ timeoutMs: 1000, signal: AbortSignal.timeout(5000) });
  try {
    await c.status('nope');
  } catch (e) {
    if (e instanceof NotFound) console.log(e.kind, e.hint);
    else if (e instanceof CowspaceError) console.log(e.exitCode);
    else if (e instanceof ExecTimeoutError) console.log(e.result.exitCode);
  }
  const info: FileInfo = await c.filesWrite(ws.id, 'a.txt', 'x', { mode: 0o644 });
  const text: string = await c.files(ws.id).read('a.txt');
  const bytes: Buffer = await c.files(ws.id).read('a.txt', { format: 'bytes' });
  for await (const piece of c.filesReadStream(ws.id, 'a.txt', { chunkSize: 1 << 20 })) console.log(piece.length);
  const w: Watch = await c.watch(ws.id, '.', { signal: AbortSignal.timeout(5000) });
  for await (const ev of w) { const e: WatchEvent = ev; if (e.event === 'renamed') console.log(e.from); break; }
  w.close();
  const f = await c.fork(ws.id, { name: 'f', sandbox: true });
  await c.sandboxPause(ws.id);
  await c.sandboxResume(ws.id);
  try { await c.exec(ws.id, 'true'); } catch (e) { if (e instanceof Busy) console.log(e.kind); }
  const cm = await c.commit(ws.id, { ref: 'app/main', message: 'done' });
  await c.remove(ws.id, { force: true });
  c.close();
  return port + r.exitCode + done.exitCode + cm.files + info.size + text.length + bytes.length + f.forks.length;
}
