//! The fuse workspace's open modes, mounted for real: in the cached mode a file's second
//! open sends the daemon no `OPEN`, and in both modes `O_TRUNC`, `O_APPEND`, `O_EXCL`,
//! writes through `mmap`, writes after a rename and truncates land exactly, through the
//! mount and in the upper directory. Root with /dev/fuse; skipped otherwise, except
//! under `CI=true`.

use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::common::{Env, can_run};
use cowspace_fsd::cow::{CowMount, OpenMode, Serving};

/// Bigger than the lazy copy-up threshold (8 MiB), not a whole number of blocks.
const BIG_BYTES: usize = 9 * 1024 * 1024 + 77;

fn numbers() -> Vec<u8> {
    (1..=1000)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes()
}

fn big() -> Vec<u8> {
    (0..BIG_BYTES).map(|i| (i * 7 % 251) as u8).collect()
}

/// `path` holds `want` through the mount (`ws`) and in the upper directory.
#[track_caller]
fn assert_both(ws: &Path, upper: &Path, name: &str, want: &[u8]) {
    let got = fs::read(ws.join(name)).unwrap();
    assert!(
        got == want,
        "{name} through the mount: {} bytes, want {}",
        got.len(),
        want.len()
    );
    let got = fs::read(upper.join(name)).unwrap();
    assert!(
        got == want,
        "{name} in the upper: {} bytes, want {}",
        got.len(),
        want.len()
    );
}

fn mount(env: &Env, name: &str, mode: OpenMode) -> (CowMount, std::path::PathBuf) {
    let src = env.dir(&format!("{name}-src"));
    fs::write(src.join("a"), b"hello\n").unwrap();
    fs::write(src.join("c"), b"0123456789").unwrap();
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/b"), numbers()).unwrap();
    fs::write(src.join("big"), big()).unwrap();
    let snap = env.import(&src);
    let private = env.dir(&format!("{name}-private"));
    let m = CowMount::mount(
        Arc::clone(&env.store),
        snap,
        &private,
        &env.dir(&format!("{name}-ws")),
        Serving {
            mode,
            ..Serving::default()
        },
    )
    .unwrap();
    (m, private.join("upper"))
}

/// Writes through a shared writable mapping (python3's `mmap`: no `unsafe` here).
fn mmap_write(path: &Path, at: &[(usize, &str)]) {
    let mut script =
        String::from("import mmap,sys\nf=open(sys.argv[1],'r+b')\nm=mmap.mmap(f.fileno(),0)\n");
    for (off, s) in at {
        script.push_str(&format!("m[{off}:{}]=b'{s}'\n", off + s.len()));
    }
    script.push_str("m.flush()\nm.close()\nf.close()\n");
    let st = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .arg(path)
        .status()
        .expect("run python3");
    assert!(st.success(), "mmap write of {}", path.display());
}

/// Writes `dirty` into a new file `path` through a shared mapping kept (no msync) while
/// `finish_copies` runs; then the upper file has the bytes.
fn mapped_until_finished(m: &CowMount, path: &Path, upper: &Path) {
    fs::write(path, b"..........").unwrap();
    let script = "import mmap,sys\nf=open(sys.argv[1],'r+b')\nm=mmap.mmap(f.fileno(),0)\n\
                  m[2:7]=b'dirty'\nprint('ready',flush=True)\nsys.stdin.read()\n";
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    m.finish_copies().unwrap();
    let name = path.file_name().unwrap();
    let got = fs::read(upper.join("d").join(name)).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(got, b"..dirty...", "the upper file after finish_copies");
    fs::remove_file(path).unwrap();
}

fn exact_writes(mode: OpenMode) {
    let env = Env::new("cowspace-cowopen-");
    let (m, upper) = mount(&env, mode.as_str(), mode);
    let ws = env.path(&format!("{}-ws", mode.as_str()));

    // Reads of unmodified files, twice.
    for _ in 0..3 {
        assert_eq!(fs::read(ws.join("a")).unwrap(), b"hello\n");
        assert_eq!(fs::read(ws.join("d/b")).unwrap(), numbers());
    }
    match mode {
        OpenMode::Cached => assert_eq!(m.opens(), 1, "only the first open reaches the daemon"),
        OpenMode::Passthrough => assert!(m.opens() >= 6, "every open is a request"),
    }

    // O_TRUNC of a file read (and cached) before.
    fs::write(ws.join("a"), b"xy").unwrap();
    assert_both(&ws, &upper, "a", b"xy");

    // O_APPEND, twice.
    let mut want = numbers();
    for tail in ["APP\n", "APP2\n"] {
        let mut f = OpenOptions::new()
            .append(true)
            .open(ws.join("d/b"))
            .unwrap();
        f.write_all(tail.as_bytes()).unwrap();
        drop(f);
        want.extend_from_slice(tail.as_bytes());
        assert_both(&ws, &upper, "d/b", &want);
    }

    // O_EXCL makes a new file once, with its mode.
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(ws.join("new"))
        .unwrap();
    f.write_all(b"n1").unwrap();
    drop(f);
    let again = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(ws.join("new"));
    assert_eq!(again.unwrap_err().kind(), ErrorKind::AlreadyExists);
    assert_both(&ws, &upper, "new", b"n1");
    let perm = fs::metadata(ws.join("new")).unwrap().permissions().mode();
    assert_eq!(perm & 0o7777, 0o640);

    // Writes through mmap of an unmodified large file (a lazy copy-up).
    let mut want = big();
    let _ = fs::read(ws.join("big")).unwrap();
    mmap_write(&ws.join("big"), &[(5, "MMMMM"), (BIG_BYTES - 3, "ZZZ")]);
    want[5..10].copy_from_slice(b"MMMMM");
    want[BIG_BYTES - 3..].copy_from_slice(b"ZZZ");
    m.finish_copies().unwrap();
    assert_both(&ws, &upper, "big", &want);

    // A mapping still dirty (no msync, still mapped) is written back before a commit
    // reads the upper directory (`finish_copies`).
    mapped_until_finished(&m, &ws.join("d/renamed-not-yet"), &upper);

    // A write after a rename, through a descriptor opened before it and one after.
    let f = OpenOptions::new().write(true).open(ws.join("new")).unwrap();
    fs::rename(ws.join("new"), ws.join("d/renamed")).unwrap();
    f.write_all_at(b"Q", 1).unwrap();
    drop(f);
    let f = OpenOptions::new()
        .write(true)
        .open(ws.join("d/renamed"))
        .unwrap();
    f.write_all_at(b"R", 2).unwrap();
    drop(f);
    assert_both(&ws, &upper, "d/renamed", b"nQR");

    // A rename over a file read before: the name shows the new file.
    fs::write(ws.join("x"), b"xxx").unwrap();
    fs::rename(ws.join("x"), ws.join("a")).unwrap();
    assert_both(&ws, &upper, "a", b"xxx");
    // Removed and made again.
    fs::remove_file(ws.join("a")).unwrap();
    fs::write(ws.join("a"), b"again").unwrap();
    assert_both(&ws, &upper, "a", b"again");

    // An unmodified file opened for writing, deleted, then written and truncated
    // through its descriptor.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(ws.join("c"))
        .unwrap();
    fs::remove_file(ws.join("c")).unwrap();
    f.write_all_at(b"AB", 8).unwrap();
    f.set_len(11).unwrap();
    let mut got = vec![0u8; 16];
    let n = f.read_at(&mut got, 0).unwrap();
    assert_eq!(
        &got[..n],
        b"01234567AB\0",
        "the deleted open file reads as written"
    );
    assert_eq!(f.metadata().unwrap().len(), 11);
    drop(f);
    assert!(!ws.join("c").exists());

    // ftruncate.
    let f = OpenOptions::new().write(true).open(ws.join("d/b")).unwrap();
    f.set_len(3).unwrap();
    drop(f);
    assert_both(&ws, &upper, "d/b", b"1\n2");
    drop(m);
}

#[test]
fn cached_mode_opens_without_requests_and_writes_exactly() {
    if !can_run() {
        return;
    }
    exact_writes(OpenMode::Cached);
}

#[test]
fn passthrough_mode_writes_exactly() {
    if !can_run() {
        return;
    }
    exact_writes(OpenMode::Passthrough);
}
