//! The guest's initramfs: busybox, our `/init`, the guest agent and the virtio modules
//! (network ones included, loaded only for a VM that publishes ports), written as a
//! `newc` cpio archive by [`Cpio`] (no cpio binary), byte for byte the same for the same
//! inputs, and cached under `<cache>/<hash>/initrd.cpio` where `<hash>` is the BLAKE3 of
//! the archive (every input: [`FORMAT_VERSION`], the init script, the agent, busybox,
//! each module's name and bytes). A change of any input makes a new directory; an existing one is reused.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Bumped when the archive's layout changes, so old cache entries are not reused.
pub const FORMAT_VERSION: &str = "cowspace-initramfs-2";
/// The guest's first pid 1: sets up, then `exec`s the agent.
pub const INIT_SCRIPT: &str = include_str!("init.sh");
/// The guest agent (`guest/agent.rs`), linked statically by the build script.
pub const AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cowspace-guest-agent"));
/// Where the agent is in the guest.
pub const AGENT_PATH: &str = "bin/cowspace-agent";
/// The modules in the image, in load order (each needs the ones before it); `/init`
/// loads the last three (the network) only when the kernel command line asks for it.
pub const MODULES: [(&str, &str); 9] = [
    ("virtio_ring", "drivers/virtio/virtio_ring.ko"),
    ("virtio", "drivers/virtio/virtio.ko"),
    ("virtio_mmio", "drivers/virtio/virtio_mmio.ko"),
    ("fuse", "fs/fuse/fuse.ko"),
    ("virtiofs", "fs/fuse/virtiofs.ko"),
    ("virtio_console", "drivers/char/virtio_console.ko"),
    ("failover", "net/core/failover.ko"),
    ("net_failover", "drivers/net/net_failover.ko"),
    ("virtio_net", "drivers/net/virtio_net.ko"),
];
/// Largest input file taken into the archive (busybox is ~2 MiB, modules far less).
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// A `newc` ("070701") cpio archive being written in memory: owner 0:0, mtime 0, inode
/// numbers in order of addition, so the bytes depend only on what is added.
#[derive(Default)]
pub struct Cpio {
    out: Vec<u8>,
    next_ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.next_ino += 1;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [
            self.next_ino,
            mode,
            0,
            0,
            nlink,
            0,
            u32::try_from(data.len()).expect("input files are bounded by MAX_INPUT_BYTES"),
            0,
            0,
            rdev.0,
            rdev.1,
            u32::try_from(name.len() + 1).expect("short names"),
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// Adds a directory.
    pub fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, (0, 0), &[]);
    }

    /// Adds a regular file with permission bits `perm`.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, S_IFREG | (perm & 0o7777), (0, 0), data);
    }

    /// Adds a character device node.
    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | (perm & 0o7777), (major, minor), &[]);
    }

    /// Ends the archive (the `TRAILER!!!` entry) and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

/// Where the initramfs's inputs are on the host.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// A statically linked busybox.
    pub busybox: PathBuf,
    /// The guest kernel's `lib/modules/<version>/kernel` directory.
    pub modules: PathBuf,
}

fn read_input(path: &Path) -> Result<Vec<u8>> {
    let meta = fs::metadata(path).map_err(|source| Error::OpenSource {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.len() > MAX_INPUT_BYTES {
        return Err(Error::InvalidInput(format!(
            "{}: {} bytes, more than the {MAX_INPUT_BYTES} an initramfs input may have",
            path.display(),
            meta.len()
        )));
    }
    fs::read(path).map_err(|source| Error::OpenSource {
        path: path.to_path_buf(),
        source,
    })
}

/// The archive for `inputs` and its BLAKE3 hash (hex).
pub fn build(inputs: &Inputs) -> Result<(Vec<u8>, String)> {
    let busybox = read_input(&inputs.busybox)?;
    let mut modules = Vec::new();
    for (name, rel) in MODULES {
        modules.push((name, read_input(&inputs.modules.join(rel))?));
    }
    let mut a = Cpio::default();
    for d in [
        "bin",
        "dev",
        "lib",
        "lib/modules",
        "proc",
        "root",
        "sys",
        "tmp",
    ] {
        a.dir(d);
    }
    a.dir("workspace");
    a.char_dev("dev/console", 0o600, 5, 1);
    a.file("init", 0o755, INIT_SCRIPT.as_bytes());
    a.file("bin/busybox", 0o755, &busybox);
    a.file(AGENT_PATH, 0o755, AGENT);
    for (name, bytes) in &modules {
        a.file(&format!("lib/modules/{name}.ko"), 0o644, bytes);
    }
    let bytes = a.finish();
    let mut h = blake3::Hasher::new();
    h.update(FORMAT_VERSION.as_bytes());
    h.update(&bytes);
    Ok((bytes, h.finalize().to_hex().to_string()))
}

/// The cached initramfs for `inputs` under `cache` (built and stored atomically when
/// missing) and its hash.
pub fn cached(inputs: &Inputs, cache: &Path) -> Result<(PathBuf, String)> {
    let (bytes, hash) = build(inputs)?;
    let dir = cache.join(&hash[..32]);
    let path = dir.join("initrd.cpio");
    if fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok((path, hash));
    }
    let io = |source| Error::StateDir {
        path: dir.clone(),
        source,
    };
    fs::create_dir_all(&dir).map_err(io)?;
    let tmp = dir.join(format!(".initrd.{}", std::process::id()));
    let mut f = fs::File::create(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    fs::rename(&tmp, &path).map_err(io)?;
    Ok((path, hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(a: &[u8], at: usize, i: usize) -> u32 {
        let s = std::str::from_utf8(&a[at + 6 + i * 8..at + 14 + i * 8]).unwrap();
        u32::from_str_radix(s, 16).unwrap()
    }

    #[test]
    fn newc_entries_are_aligned_and_parse_back() {
        let mut a = Cpio::default();
        a.dir("bin");
        a.file("bin/x", 0o755, b"hello");
        let out = a.finish();
        assert_eq!(out.len() % 4, 0);
        let mut at = 0;
        let mut names = Vec::new();
        while at < out.len() {
            assert_eq!(&out[at..at + 6], b"070701");
            let size = field(&out, at, 6) as usize;
            let namesize = field(&out, at, 11) as usize;
            let name = &out[at + 110..at + 110 + namesize - 1];
            names.push(String::from_utf8(name.to_vec()).unwrap());
            let data_at = (at + 110 + namesize).next_multiple_of(4);
            if names.last().unwrap() == "bin/x" {
                assert_eq!(&out[data_at..data_at + size], b"hello");
                assert_eq!(field(&out, at, 1), S_IFREG | 0o755);
            }
            at = (data_at + size).next_multiple_of(4);
        }
        assert_eq!(names, ["bin", "bin/x", "TRAILER!!!"]);
    }

    #[test]
    fn the_agent_is_a_static_x86_64_executable() {
        let a = AGENT;
        assert_eq!(&a[..4], b"\x7fELF");
        assert_eq!(a[4], 2, "64-bit");
        assert_eq!(u16::from_le_bytes([a[18], a[19]]), 62, "x86-64");
        let le64 = |at: usize| u64::from_le_bytes(a[at..at + 8].try_into().unwrap());
        let le16 = |at: usize| u16::from_le_bytes([a[at], a[at + 1]]) as usize;
        let (phoff, phentsize, phnum) = (le64(0x20) as usize, le16(0x36), le16(0x38));
        assert!(phnum > 0);
        for i in 0..phnum {
            let at = phoff + i * phentsize;
            let p_type = u32::from_le_bytes(a[at..at + 4].try_into().unwrap());
            // PT_INTERP (3): a dynamic loader the initramfs does not have.
            assert_ne!(p_type, 3, "the guest agent asks for a dynamic loader");
        }
    }

    #[test]
    fn same_inputs_same_bytes() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("mods");
        for (_, rel) in MODULES {
            let p = m.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, rel.as_bytes()).unwrap();
        }
        let bb = d.path().join("busybox");
        fs::write(&bb, b"bb").unwrap();
        let inputs = Inputs {
            busybox: bb.clone(),
            modules: m,
        };
        let (a, ha) = build(&inputs).unwrap();
        let (b, hb) = build(&inputs).unwrap();
        assert_eq!((a, &ha), (b, &hb));
        let (p1, _) = cached(&inputs, &d.path().join("cache")).unwrap();
        fs::write(&bb, b"bb2").unwrap();
        let (p2, hc) = cached(&inputs, &d.path().join("cache")).unwrap();
        assert_ne!(ha, hc, "a changed input gives a new image");
        assert_ne!(p1, p2);
        assert!(p1.is_file() && p2.is_file());
    }
}
