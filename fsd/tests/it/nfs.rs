//! A workspace served over NFSv3 (`cowspace_fsd::nfs`), driven at the protocol level by a
//! client written against RFC 1813 here (its XDR from `nfs3_types`), and by libnfs's
//! command-line client: mount, lookups, reads, unstable writes and COMMIT, hard links,
//! listings of a large directory resumed from every cookie, handles of another export
//! refused, and malformed calls that never stop the server. No mount: the host's kernel
//! has no NFS client (`docs/TESTING.md`).

use std::fs;
use std::io::{Cursor, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use cowspace_fsd::cow::CowNfs;
use nfs3_types::mount::{dirpath, mountres3};
use nfs3_types::nfs3::*;
use nfs3_types::rpc::{
    accept_stat_data, auth_unix, call_body, msg_body, opaque_auth, reply_body, rpc_msg,
};
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

use crate::common::Env;

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

struct Client {
    s: TcpStream,
    xid: u32,
}

/// What a call got back: its results, or the RPC-level refusal.
enum Got {
    Results(Vec<u8>),
    Refused(String),
}

impl Client {
    fn connect(addr: std::net::SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect to the NFS port");
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        Client { s, xid: 0 }
    }

    fn send_record(&mut self, body: &[u8]) {
        let mut rec = ((body.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
        rec.extend_from_slice(body);
        self.s.write_all(&rec).expect("send a record");
    }

    /// The next reply record; `None` when the server closed the connection.
    fn recv_record(&mut self) -> Option<Vec<u8>> {
        let mut head = [0u8; 4];
        self.s.read_exact(&mut head).ok()?;
        let len = (u32::from_be_bytes(head) & 0x7fff_ffff) as usize;
        let mut body = vec![0u8; len];
        self.s.read_exact(&mut body).ok()?;
        Some(body)
    }

    fn raw(&mut self, prog: u32, vers: u32, proc: u32, args: &[u8]) -> Option<Got> {
        self.xid += 1;
        let cred = opaque_auth::auth_unix(&auth_unix {
            stamp: 1,
            machinename: Opaque::borrowed(b"test"),
            uid: 0,
            gid: 0,
            gids: vec![],
        });
        let msg = rpc_msg {
            xid: self.xid,
            body: msg_body::CALL(call_body {
                rpcvers: 2,
                prog,
                vers,
                proc,
                cred,
                verf: opaque_auth::default(),
            }),
        };
        let mut body = Vec::new();
        msg.pack(&mut body).unwrap();
        body.extend_from_slice(args);
        self.send_record(&body);
        let reply = self.recv_record()?;
        let mut cur = Cursor::new(&reply[..]);
        let (msg, _) = rpc_msg::unpack(&mut cur).expect("a reply header");
        assert_eq!(msg.xid, self.xid, "the reply answers the call");
        Some(match msg.body {
            msg_body::REPLY(reply_body::MSG_ACCEPTED(a)) => match a.reply_data {
                accept_stat_data::SUCCESS => {
                    Got::Results(reply[cur.position() as usize..].to_vec())
                }
                other => Got::Refused(format!("{other:?}")),
            },
            other => Got::Refused(format!("{other:?}")),
        })
    }

    fn call<R: Unpack>(&mut self, prog: u32, proc: u32, args: &impl Pack) -> R {
        let mut a = Vec::new();
        args.pack(&mut a).unwrap();
        match self.raw(prog, 3, proc, &a).expect("a reply") {
            Got::Results(r) => R::unpack(&mut Cursor::new(&r[..])).expect("results").0,
            Got::Refused(why) => panic!("call {proc} refused: {why}"),
        }
    }

    fn mount(&mut self, path: &str) -> mountres3<'static> {
        self.call(MOUNT, 1, &dirpath(Opaque::owned(path.as_bytes().to_vec())))
    }

    fn root(&mut self, path: &str) -> nfs_fh3 {
        match self.mount(path) {
            mountres3::Ok(ok) => nfs_fh3 {
                data: Opaque::owned(ok.fhandle.0.to_vec()),
            },
            mountres3::Err(e) => panic!("mount refused: {e:?}"),
        }
    }

    fn lookup(&mut self, dir: &nfs_fh3, name: &str) -> Result<LOOKUP3resok, nfsstat3> {
        let r: LOOKUP3res = self.call(
            NFS,
            3,
            &LOOKUP3args {
                what: diropargs3 {
                    dir: dir.clone(),
                    name: filename3::from(name.as_bytes().to_vec()),
                },
            },
        );
        match r {
            Nfs3Result::Ok(ok) => Ok(ok),
            Nfs3Result::Err((s, _)) => Err(s),
        }
    }

    fn getattr(&mut self, fh: &nfs_fh3) -> Result<fattr3, nfsstat3> {
        let r: GETATTR3res = self.call(NFS, 1, &GETATTR3args { object: fh.clone() });
        match r {
            Nfs3Result::Ok(ok) => Ok(ok.obj_attributes),
            Nfs3Result::Err((s, _)) => Err(s),
        }
    }

    fn read(&mut self, fh: &nfs_fh3, offset: u64, count: u32) -> (Vec<u8>, bool) {
        let r: READ3res = self.call(
            NFS,
            6,
            &READ3args {
                file: fh.clone(),
                offset,
                count,
            },
        );
        let ok = r.unwrap();
        (ok.data.to_vec(), ok.eof)
    }

    /// Every name of directory `dir`, read `count` bytes at a time from each cookie.
    fn list(&mut self, dir: &nfs_fh3, count: u32) -> Vec<Vec<u8>> {
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let r: READDIR3res = self.call(
                NFS,
                16,
                &READDIR3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: cookieverf3::default(),
                    count,
                },
            );
            let ok = r.unwrap();
            for e in &ok.reply.entries.0 {
                names.push(e.name.as_ref().to_vec());
                cookie = e.cookie;
            }
            if ok.reply.eof {
                return names;
            }
            assert!(
                !ok.reply.entries.0.is_empty(),
                "a listing piece with no entry and no eof"
            );
        }
    }

    /// As [`Client::list`], with READDIRPLUS; each name with its handle's file id.
    fn list_plus(&mut self, dir: &nfs_fh3, maxcount: u32) -> Vec<(Vec<u8>, Option<u64>)> {
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let r: READDIRPLUS3res = self.call(
                NFS,
                17,
                &READDIRPLUS3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: cookieverf3::default(),
                    dircount: maxcount,
                    maxcount,
                },
            );
            let ok = r.unwrap();
            for e in ok.reply.entries.0 {
                let fid = match e.name_attributes {
                    Nfs3Option::Some(a) => Some(a.fileid),
                    Nfs3Option::None => None,
                };
                names.push((e.name.as_ref().to_vec(), fid));
                cookie = e.cookie;
            }
            if ok.reply.eof {
                return names;
            }
        }
    }
}

fn name(s: &str) -> filename3<'static> {
    filename3::from(s.as_bytes().to_vec())
}

const MANY: usize = 100_000;

fn serve(env: &Env, tag: &str) -> (CowNfs, std::path::PathBuf) {
    let src = env.dir(&format!("{tag}-src"));
    fs::write(src.join("a"), b"hello\n").unwrap();
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/b"), b"bee\n").unwrap();
    let many = src.join("many");
    fs::create_dir_all(&many).unwrap();
    for i in 0..MANY {
        fs::write(many.join(format!("f{i:06}")), b"").unwrap();
    }
    let snap = env.import(&src);
    let private = env.dir(&format!("{tag}-private"));
    let served = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).expect("serve over NFS");
    (served, private)
}

#[test]
fn a_workspace_over_nfs_reads_writes_links_and_lists_from_every_cookie() {
    let env = Env::new("nfs-proto");
    let (served, private) = serve(&env, "w");
    let mut c = Client::connect(served.addr());

    // The export is reached by its path only.
    assert!(matches!(c.mount("/"), mountres3::Err(_)));
    assert!(matches!(
        c.mount("/0123456789abcdef0123456789abcdef"),
        mountres3::Err(_)
    ));
    let root = c.root(served.export_path());
    assert_eq!(c.getattr(&root).unwrap().type_, ftype3::NF3DIR);

    // Reads from the snapshot.
    let a = c.lookup(&root, "a").unwrap().object;
    assert_eq!(c.read(&a, 0, 4096), (b"hello\n".to_vec(), true));
    assert_eq!(c.lookup(&root, "nope").err(), Some(nfsstat3::NFS3ERR_NOENT));
    let d = c.lookup(&root, "d").unwrap().object;
    let dotdot = c.lookup(&d, "..").unwrap().object;
    assert_eq!(
        c.getattr(&dotdot).unwrap().fileid,
        c.getattr(&root).unwrap().fileid
    );

    // An unstable write reaches the workspace; COMMIT answers the same verifier.
    let w: WRITE3res = c.call(
        NFS,
        7,
        &WRITE3args {
            file: a.clone(),
            offset: 0,
            count: 5,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(b"HELLO"),
        },
    );
    let w = w.unwrap();
    assert_eq!(w.count, 5);
    let cm: COMMIT3res = c.call(
        NFS,
        21,
        &COMMIT3args {
            file: a.clone(),
            offset: 0,
            count: 0,
        },
    );
    assert_eq!(cm.unwrap().verf, w.verf);
    assert_eq!(c.read(&a, 0, 4096).0, b"HELLO\n");
    served.finish_copies().unwrap();
    assert_eq!(fs::read(private.join("upper/a")).unwrap(), b"HELLO\n");

    // A guarded create, twice.
    let create = |how| CREATE3args {
        where_: diropargs3 {
            dir: root.clone(),
            name: name("new"),
        },
        how,
    };
    let r: CREATE3res = c.call(NFS, 8, &create(createhow3::GUARDED(sattr3::default())));
    let new = match r.unwrap().obj {
        Nfs3Option::Some(fh) => fh,
        Nfs3Option::None => panic!("CREATE gave no handle"),
    };
    let again: CREATE3res = c.call(NFS, 8, &create(createhow3::GUARDED(sattr3::default())));
    assert!(matches!(
        again,
        Nfs3Result::Err((nfsstat3::NFS3ERR_EXIST, _))
    ));
    let _: WRITE3res = c.call(
        NFS,
        7,
        &WRITE3args {
            file: new.clone(),
            offset: 0,
            count: 3,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(b"new"),
        },
    );

    // A hard link: one inode, two names, both in the upper.
    let l: LINK3res = c.call(
        NFS,
        15,
        &LINK3args {
            file: new.clone(),
            link: diropargs3 {
                dir: d.clone(),
                name: name("new2"),
            },
        },
    );
    l.unwrap();
    let n2 = c.lookup(&d, "new2").unwrap();
    let attr = c.getattr(&new).unwrap();
    assert_eq!(attr.nlink, 2);
    assert_eq!(c.getattr(&n2.object).unwrap().fileid, attr.fileid);
    let (m1, m2) = (
        fs::metadata(private.join("upper/new")).unwrap(),
        fs::metadata(private.join("upper/d/new2")).unwrap(),
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(m1.ino(), m2.ino(), "the link is a hard link in the upper");

    // Rename, then remove.
    let r: RENAME3res = c.call(
        NFS,
        14,
        &RENAME3args {
            from: diropargs3 {
                dir: root.clone(),
                name: name("new"),
            },
            to: diropargs3 {
                dir: root.clone(),
                name: name("renamed"),
            },
        },
    );
    r.unwrap();
    assert_eq!(c.lookup(&root, "new").err(), Some(nfsstat3::NFS3ERR_NOENT));
    let rm: REMOVE3res = c.call(
        NFS,
        12,
        &REMOVE3args {
            object: diropargs3 {
                dir: root.clone(),
                name: name("renamed"),
            },
        },
    );
    rm.unwrap();
    assert_eq!(c.getattr(&n2.object).unwrap().nlink, 1);

    // 100,000 names, in pieces of 8 KiB and of 64 KiB, each exactly once.
    let many = c.lookup(&root, "many").unwrap().object;
    for count in [8 * 1024, 64 * 1024] {
        let mut names = c.list(&many, count);
        names.retain(|n| n != b"." && n != b"..");
        assert_eq!(names.len(), MANY, "READDIR in pieces of {count} bytes");
        names.sort();
        names.dedup();
        assert_eq!(names.len(), MANY, "a name listed twice");
    }
    let plus = c.list_plus(&many, 32 * 1024);
    let files: Vec<_> = plus
        .iter()
        .filter(|(n, _)| n != b"." && n != b"..")
        .collect();
    assert_eq!(files.len(), MANY);
    assert!(
        files.iter().all(|(_, f)| f.is_some()),
        "every entry has attributes"
    );

    // A listing resumed while the directory changes shows each remaining name once.
    let first: READDIR3res = c.call(
        NFS,
        16,
        &READDIR3args {
            dir: many.clone(),
            cookie: 0,
            cookieverf: cookieverf3::default(),
            count: 4096,
        },
    );
    let first = first.unwrap();
    let cookie = first.reply.entries.0.last().unwrap().cookie;
    let rm: REMOVE3res = c.call(
        NFS,
        12,
        &REMOVE3args {
            object: diropargs3 {
                dir: many.clone(),
                name: name("f099999"),
            },
        },
    );
    rm.unwrap();
    let mut rest = Vec::new();
    let mut cookie = cookie;
    loop {
        let r: READDIR3res = c.call(
            NFS,
            16,
            &READDIR3args {
                dir: many.clone(),
                cookie,
                cookieverf: cookieverf3::default(),
                count: 64 * 1024,
            },
        );
        let ok = r.unwrap();
        for e in &ok.reply.entries.0 {
            rest.push(e.name.as_ref().to_vec());
            cookie = e.cookie;
        }
        if ok.reply.eof {
            break;
        }
    }
    let seen: Vec<_> = first
        .reply
        .entries
        .0
        .iter()
        .map(|e| e.name.as_ref().to_vec())
        .collect();
    assert!(
        rest.iter().all(|n| !seen.contains(n)),
        "a name listed before the cookie came again"
    );
    assert!(
        !rest.contains(&b"f099999".to_vec()),
        "a removed name listed"
    );

    // Handles of another export, or of no shape this server makes.
    let mut other = root.data.to_vec();
    other[0] ^= 0xff;
    let stale = nfs_fh3 {
        data: Opaque::owned(other),
    };
    assert_eq!(c.getattr(&stale).err(), Some(nfsstat3::NFS3ERR_STALE));
    let short = nfs_fh3 {
        data: Opaque::owned(vec![1, 2, 3]),
    };
    assert_eq!(c.getattr(&short).err(), Some(nfsstat3::NFS3ERR_BADHANDLE));
}

#[test]
fn malformed_calls_never_stop_the_server() {
    let env = Env::new("nfs-garbage");
    let src = env.dir("src");
    fs::write(src.join("a"), b"x").unwrap();
    let snap = env.import(&src);
    let private = env.dir("private");
    let served = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap();
    let mut c = Client::connect(served.addr());
    let root = c.root(served.export_path());

    // Every procedure with truncated arguments, absurd lengths, or noise after a valid
    // handle: an answer (GARBAGE_ARGS or a status) or a closed connection, never more.
    let mut handle = Vec::new();
    root.pack(&mut handle).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let mut cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 4],
        (u32::MAX).to_be_bytes().to_vec(),
        [handle.clone(), u32::MAX.to_be_bytes().to_vec()].concat(),
        [
            handle.clone(),
            0x7fff_fff0u32.to_be_bytes().to_vec(),
            vec![b'a'; 16],
        ]
        .concat(),
    ];
    for n in [3, 17, 64, 300] {
        cases.push(noise(n));
        cases.push([handle.clone(), noise(n)].concat());
    }
    for proc in 0..=22 {
        for args in &cases {
            for prog in [NFS, MOUNT] {
                if c.raw(prog, 3, proc, args).is_none() {
                    c = Client::connect(served.addr());
                }
            }
        }
    }
    // Records that are not calls at all, and a header announcing 2 GiB.
    let mut raw = TcpStream::connect(served.addr()).unwrap();
    raw.write_all(&[0x80, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    raw.write_all(&[0xff, 0xff, 0xff, 0xff]).unwrap();
    drop(raw);
    // A wrong RPC version is denied, a wrong program refused.
    assert!(matches!(c.raw(NFS, 2, 1, &handle), Some(Got::Refused(_))));
    assert!(matches!(c.raw(100_000, 2, 0, &[]), Some(Got::Refused(_))));

    let mut fresh = Client::connect(served.addr());
    let root = fresh.root(served.export_path());
    assert_eq!(fresh.getattr(&root).unwrap().type_, ftype3::NF3DIR);
    let a = fresh.lookup(&root, "a").unwrap().object;
    assert_eq!(fresh.read(&a, 0, 10).0, b"x");
}

/// libnfs's client (`nfs-ls`, `nfs-cat`, `nfs-cp`: an NFSv3 implementation not ours)
/// lists, reads and writes the served workspace.
#[test]
fn an_independent_nfs_client_lists_reads_and_writes_the_workspace() {
    if std::process::Command::new("nfs-ls")
        .arg("--help")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "nfs-ls missing under CI (scripts/setup.sh installs libnfs-utils)"
        );
        eprintln!("skipped: nfs-ls not installed (apt-get install libnfs-utils)");
        return;
    }
    let env = Env::new("nfs-libnfs");
    let src = env.dir("src");
    fs::write(src.join("a"), b"hello\n").unwrap();
    fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..3000 {
        fs::write(src.join(format!("d/f{i:04}")), b"").unwrap();
    }
    let snap = env.import(&src);
    let private = env.dir("private");
    let served = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap();
    let port = served.addr().port();
    let url = |path: &str| {
        format!(
            "nfs://127.0.0.1{}{path}?version=3&nfsport={port}&mountport={port}",
            served.export_path()
        )
    };
    let run = |args: &[&str]| {
        let out = std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cat = run(&["nfs-cat", &url("/a")]);
    assert_eq!(cat, "hello\n");
    let listing = run(&["nfs-ls", &url("/d")]);
    let names = listing.lines().filter(|l| l.contains(" f")).count();
    assert_eq!(names, 3000, "nfs-ls of d:\n{listing}");
    let local = env.path("in");
    fs::write(&local, b"from libnfs\n").unwrap();
    run(&["nfs-cp", local.to_str().unwrap(), &url("/d/written")]);
    served.finish_copies().unwrap();
    assert_eq!(
        fs::read(private.join("upper/d/written")).unwrap(),
        b"from libnfs\n"
    );
    assert_eq!(run(&["nfs-cat", &url("/d/written")]), "from libnfs\n");
    // Another export's path is refused.
    let wrong = format!("nfs://127.0.0.1/0000/a?version=3&nfsport={port}&mountport={port}");
    let out = std::process::Command::new("nfs-cat")
        .arg(&wrong)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a wrong export path was served");
}

/// Served again (a daemon restart), the export keeps its path, port and root handle; a
/// handle the new server did not give out is stale until its name is looked up again,
/// which gives the same handle.
#[test]
fn served_again_the_export_keeps_its_path_and_root_and_stale_handles_are_found_again() {
    let env = Env::new("nfs-restart");
    let src = env.dir("src");
    fs::write(src.join("a"), b"hello\n").unwrap();
    let snap = env.import(&src);
    let private = env.dir("private");
    let first = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap();
    let (addr, path) = (first.addr(), first.export_path().to_string());
    let mut c = Client::connect(addr);
    let root = c.root(&path);
    let a = c.lookup(&root, "a").unwrap().object;
    drop(c);
    drop(first);

    let again = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap();
    assert_eq!(again.addr(), addr, "the same port");
    assert_eq!(again.export_path(), path, "the same export path");
    let mut c = Client::connect(addr);
    assert_eq!(
        c.getattr(&root).unwrap().type_,
        ftype3::NF3DIR,
        "the old root handle"
    );
    assert_eq!(c.getattr(&a).err(), Some(nfsstat3::NFS3ERR_STALE));
    let found = c.lookup(&root, "a").unwrap().object;
    assert_eq!(found, a, "looked up again, the same handle");
    assert_eq!(c.read(&a, 0, 100).0, b"hello\n");
    // A handle of an inode no lookup gave (a forged number under the right key).
    let mut forged = a.data.to_vec();
    forged[16] ^= 0x5a;
    let forged = nfs_fh3 {
        data: Opaque::owned(forged),
    };
    assert_eq!(c.getattr(&forged).err(), Some(nfsstat3::NFS3ERR_STALE));
}
