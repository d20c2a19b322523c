#!/usr/bin/env python3
"""Two builds' fuse workspaces, A/B: walks, reads and writes through each build's daemon.

Usage (root): scripts/ab-fuse-server.py ROUNDS OLD_BIN_DIR NEW_BIN_DIR
(each directory holds a `mountctl` and the `fsd` beside it, as `cargo build --release
-p cowspace-fsd -p mountctl` leaves them).

Makes a 20,000-file tree (200 directories, 1-8 KiB files) once at /tmp/ab-src, imports
it into one runtime root per build (untimed), then for ROUNDS rounds, alternating which
build goes first: a fresh `--materializer fuse` workspace; a cold `find -type f` (after
drop_caches), a warm one, a cold read of every file (`cat`), and 1,000 creates of 1 KiB,
100 renames, 100 deletes. Prints each round and the medians with the ratio NEW/OLD.
Removes its workspaces and stops its daemons at the end (the roots stay for a look).
"""
import os, subprocess, time, json, statistics, shutil, sys
BIN={'old': sys.argv[2], 'new': sys.argv[3]}
SRC='/tmp/ab-src'
if not os.path.exists(SRC+'/.done'):
    shutil.rmtree(SRC, ignore_errors=True)
    for d in range(200):
        os.makedirs(f'{SRC}/d{d:03}/sub', exist_ok=True)
        for f in range(100):
            p=f'{SRC}/d{d:03}/{"sub/" if f%2 else ""}f{f:03}.txt'
            with open(p,'wb') as fh: fh.write((f'{d} {f} '*((f%8+1)*60)).encode())
    open(SRC+'/.done','w').close()
def sh(cmd, **kw): return subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True, **kw)
def drop(): open('/proc/sys/vm/drop_caches','w').write('3\n')
res={'old':{}, 'new':{}}
roots={}
for v in ['old','new']:
    R=f'/tmp/ab-R-{v}'
    if os.path.exists(R):
        subprocess.run(f'{BIN[v]}/mountctl --root {R} daemon stop', shell=True, capture_output=True)
        shutil.rmtree(R, ignore_errors=True)
    sh(f'{BIN[v]}/mountctl --root {R} init')
    sh(f'{BIN[v]}/mountctl --root {R} import {SRC} --ref base')
    roots[v]=R
def t(cmd):
    s=time.perf_counter(); sh(cmd); return time.perf_counter()-s
rounds=int(sys.argv[1])
for r in range(rounds):
    for v in (['old','new'] if r%2==0 else ['new','old']):
        R=roots[v]; m=f'{BIN[v]}/mountctl --root {R}'
        out=sh(f'{m} create base --materializer fuse --json').stdout
        ws=json.loads(out); path=ws['path']; wid=ws['id']
        drop(); a=t(f'find {path} -type f | wc -l')
        b=t(f'find {path} -type f | wc -l')
        drop(); c=t(f'find {path} -type f -exec cat {{}} + > /dev/null')
        d=t(f"python3 -c \"import os\nfor i in range(1000):\n open('{path}/new%d'%i,'wb').write(b'x'*1024)\nfor i in range(100): os.rename('{path}/new%d'%i,'{path}/ren%d'%i)\nfor i in range(100,200): os.unlink('{path}/new%d'%i)\"")
        sh(f'{m} remove {wid} --force')
        for k,x in zip(['walk_cold','walk_warm','read_all','write'],[a,b,c,d]):
            res[v].setdefault(k,[]).append(x)
        print(v, r, ' '.join(f'{k}={x*1000:.1f}ms' for k,x in zip(['walk_cold','walk_warm','read_all','write'],[a,b,c,d])), flush=True)
for v in ['old','new']:
    subprocess.run(f'{BIN[v]}/mountctl --root {roots[v]} daemon stop', shell=True, capture_output=True)
print('median ms (old -> new, ratio new/old):')
for k in ['walk_cold','walk_warm','read_all','write']:
    o=statistics.median(res['old'][k]); n=statistics.median(res['new'][k])
    print(f'{k}: {o*1000:.1f} -> {n*1000:.1f} ({n/o:.2f}x)')
