//! Per-workspace disk quotas end to end, as root: a root given a workspaces filesystem
//! with quotas (`init --workspaces-fs`), workspaces made with `--disk`, a worker writing
//! until the kernel refuses it (`EDQUOT`, seen by the writer) while a neighbour writes
//! normally, use and limit in `status` and `list`, a commit at the limit, space given
//! back by a removal, the filesystem brought back after a simulated reboot, and every
//! request that cannot be enforced refused (7) with nothing made.
//!
//! Skips with a reason when not root; fails under `CI=true`. Each root is cleaned up by
//! [`QuotaRoot`]'s `Drop`: workspaces removed, the daemon stopped, the workspaces
//! filesystem unmounted (which frees its loop device).
//!
//! Needs on the host: `mkfs.btrfs`, loop devices, kernel btrfs with qgroups.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cowspace_tests::write_file;
use serde_json::Value;

use crate::workspaces::support::{WsRoot, require_root};

const MIB: u64 = 1 << 20;
/// The size of the test roots' workspaces filesystem (a sparse image).
const FS_SIZE: &str = "1g";
/// The chunk a writer writes at a time.
const CHUNK_BYTES: usize = 1 << 20;
/// The most a writer writes before giving up on being stopped (far past any quota here).
const MAX_WRITE_BYTES: u64 = 256 * MIB;

/// A runtime root whose workspaces live on their own btrfs filesystem with quotas.
pub(crate) struct QuotaRoot {
    pub(crate) ws: WsRoot,
}

impl QuotaRoot {
    pub(crate) fn new() -> QuotaRoot {
        let ws = WsRoot::new();
        let v = ws.t.json(["init", "--workspaces-fs", FS_SIZE]).ok().json();
        assert_eq!(v["workspaces_fs"]["created"], true, "{v}");
        assert_eq!(v["workspaces_fs"]["bytes"], 1u64 << 30, "{v}");
        let q = QuotaRoot { ws };
        assert_eq!(fstype(&q.ws_dir()).as_deref(), Some("btrfs"));
        q
    }

    fn ws_dir(&self) -> PathBuf {
        self.ws.root().join("workspaces")
    }

    fn image(&self) -> PathBuf {
        self.ws.root().join("workspaces.btrfs")
    }
}

impl Drop for QuotaRoot {
    fn drop(&mut self) {
        // Before the root's own guard: workspaces and the daemon first, then the
        // filesystem holding them.
        if let Ok(v) = serde_json::from_str::<Value>(self.ws.t.json(["list"]).stdout.trim()) {
            for r in v.as_array().into_iter().flatten() {
                if let Some(id) = r["id"].as_str() {
                    let _ = self.ws.t.run(["remove", "--force", id]);
                }
            }
        }
        let _ = self.ws.t.run(["daemon", "stop", "--force"]);
        let dir = self.ws_dir();
        if fstype(&dir).as_deref() == Some("btrfs") {
            let ok = Command::new("umount")
                .arg(&dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&dir).status();
            }
        }
    }
}

/// The filesystem type mounted exactly at `dir`, if something is.
fn fstype(dir: &Path) -> Option<String> {
    let out = Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "--mountpoint"])
        .arg(dir)
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!t.is_empty()).then_some(t)
}

/// The loop devices backed by `image` (also once it is deleted), as `losetup -a` lists
/// them.
fn loops_of(image: &Path) -> String {
    let out = Command::new("losetup").arg("-a").output().expect("losetup");
    let name = image.display().to_string();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&name))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes `path` in chunks until the kernel refuses (or `max` bytes): the bytes written
/// and the error the writer saw.
fn write_until_refused(path: &Path, max: u64) -> (u64, Option<std::io::Error>) {
    // At the quota even the new file's inode is refused.
    let mut f = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => return (0, Some(e)),
    };
    let chunk = vec![0x5au8; CHUNK_BYTES];
    let mut written = 0u64;
    while written < max {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) => return (written, Some(e)),
        }
    }
    (written, f.sync_all().err())
}

fn disk_of(v: &Value) -> (u64, u64) {
    let d = &v["disk"];
    (
        d["used_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("no disk.used_bytes: {v}")),
        d["limit_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("no disk.limit_bytes: {v}")),
    )
}

fn source(q: &QuotaRoot) -> String {
    let src = q.ws.t.path("src");
    write_file(&src.join("README"), "quota test\n");
    write_file(&src.join("lib/a.txt"), "a\n".repeat(1000));
    q.ws.import(&src, &["--ref", "base"])
}

#[test]
fn quota_a_worker_at_its_limit_gets_edquot_while_a_neighbour_writes_and_commit_works() {
    require_root!();
    let q = QuotaRoot::new();
    source(&q);
    let limit = 24 * MIB;
    let a = q.ws.create("base", &["--disk", "24m"]);
    let b =
        q.ws.create("base", &["--disk", "24m", "--materializer", "fuse"]);
    let c = q.ws.create("base", &[]);

    // A fills its quota while B writes 8 MiB at the same time.
    let a_file = a.path.join("fill.bin");
    let filler = std::thread::spawn(move || write_until_refused(&a_file, MAX_WRITE_BYTES));
    let (b_written, b_err) = write_until_refused(&b.path.join("eight.bin"), 8 * MIB);
    let (a_written, a_err) = filler.join().expect("the writer thread");
    assert!(b_err.is_none(), "the neighbour's write failed: {b_err:?}");
    assert_eq!(b_written, 8 * MIB);
    let a_err = a_err.expect("the writer was never refused");
    eprintln!(
        "writer refused after {:.1} MiB of a {} MiB quota: {a_err}",
        a_written as f64 / MIB as f64,
        limit / MIB
    );
    assert_eq!(
        a_err.raw_os_error(),
        Some(libc::EDQUOT),
        "the writer's error: {a_err}"
    );
    assert!(
        a_written <= limit && a_written >= limit - 4 * MIB,
        "{a_written} bytes written under a {limit}-byte quota"
    );

    // status (JSON and text) and list report use and limit.
    let st = q.ws.status(&a.id);
    let (used, lim) = disk_of(&st);
    eprintln!("status: used {used} of {lim}");
    assert_eq!(lim, limit, "{st}");
    assert!(used >= limit - 4 * MIB && used <= limit + MIB, "{st}");
    let text = q.ws.t.run(["status", &a.id]).ok().stdout;
    assert!(text.contains("disk") && text.contains("24.0 MiB"), "{text}");
    let list = q.ws.t.json(["list"]).ok().json();
    let of = |id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not listed: {list}"))
    };
    assert_eq!(disk_of(&of(&b.id)).1, limit);
    assert!(disk_of(&of(&b.id)).0 >= 8 * MIB);
    assert!(
        of(&c.id)["disk"].is_null(),
        "a workspace without a quota: {list}"
    );

    // A workspace without a quota and the store keep working.
    let (c_written, c_err) = write_until_refused(&c.path.join("free.bin"), 32 * MIB);
    assert!(c_err.is_none() && c_written == 32 * MIB, "{c_err:?}");
    source(&q);

    // Commit at the limit works and takes the file.
    let (snap, _, _) = q.ws.commit(&a.id, &[]);
    let shown = q.ws.t.json(["show", &snap, "fill.bin"]).ok().json();
    assert_eq!(shown["entry"]["size"].as_u64(), Some(a_written), "{shown}");

    // Removing the file gives the space back: the worker writes again.
    std::fs::remove_file(a.path.join("fill.bin")).unwrap();
    Command::new("sync").status().unwrap();
    let (used_after, _) = disk_of(&q.ws.status(&a.id));
    assert!(
        used_after < MIB,
        "after removing the file: {used_after} bytes used"
    );
    let (again, err) = write_until_refused(&a.path.join("again.bin"), 8 * MIB);
    assert!(err.is_none() && again == 8 * MIB, "{err:?}");

    // A fork keeps its parent's quota.
    let forks = q.ws.t.json(["fork", &a.id]).ok().json();
    let fork = forks["forks"][0]["id"]
        .as_str()
        .expect("fork id")
        .to_string();
    q.ws.track(&fork);
    assert_eq!(disk_of(&q.ws.status(&fork)).1, limit);

    for id in [&a.id, &b.id, &c.id, &fork] {
        q.ws.discard(id);
    }
}

#[test]
fn quota_requests_that_cannot_be_enforced_are_refused_and_nothing_is_made() {
    require_root!();
    // A root on the host's filesystem (no quotas there).
    let plain = WsRoot::new();
    let src = plain.t.path("src");
    write_file(&src.join("f"), "x\n");
    plain.import(&src, &["--ref", "base"]);
    let e = plain
        .create_out("base", &["--disk", "10m"])
        .error(7, "unsupported");
    let msg = e["message"].as_str().unwrap();
    let hint = e["hint"].as_str().unwrap();
    assert!(msg.contains("--disk") && msg.contains("btrfs"), "{e}");
    assert!(hint.contains("init --workspaces-fs"), "{e}");
    let e = plain
        .create_out("base", &["--inodes", "1000"])
        .error(7, "unsupported");
    assert!(e["message"].as_str().unwrap().contains("inodes"), "{e}");
    // Bad sizes are bad input.
    plain
        .create_out("base", &["--disk", "ten"])
        .error(9, "invalid_input");
    assert_eq!(
        plain.list_all(),
        serde_json::json!([]),
        "a refused create left a record"
    );
    assert_eq!(plain.ws_dirs(), Vec::<String>::new());

    // A root with workspaces does not get a workspaces filesystem under them.
    let w = plain.create("base", &[]);
    let e = plain
        .t
        .json(["init", "--workspaces-fs", FS_SIZE])
        .error(9, "invalid_input");
    assert!(
        e["message"].as_str().unwrap().contains("holds workspaces"),
        "{e}"
    );
    assert!(!plain.root().join("workspaces.btrfs").exists());
    plain.discard(&w.id);
    plain.assert_clean();

    // A workspaces filesystem too small for btrfs, or of no size, makes no root.
    let fresh = cowspace_tests::TestRoot::uninitialised();
    for bad in ["10m", "big"] {
        fresh
            .json(["init", "--workspaces-fs", bad])
            .error(9, "invalid_input");
        assert!(
            !fresh.root().exists(),
            "init --workspaces-fs {bad} made the root"
        );
    }

    // On a root with quotas: inodes still refused, and so is a full-tree materializer.
    let q = QuotaRoot::new();
    source(&q);
    q.ws.create_out("base", &["--disk", "10m", "--inodes", "10"])
        .error(7, "unsupported");
    let e =
        q.ws.create_out("base", &["--disk", "10m", "--materializer", "copy"])
            .error(7, "unsupported");
    assert!(e["hint"].as_str().unwrap().contains("overlay"), "{e}");
    assert_eq!(q.ws.list_all(), serde_json::json!([]));
    assert_eq!(q.ws.ws_dirs(), Vec::<String>::new());

    // The configuration's `[create] disk` is the quota of a create that names none.
    let config = q.ws.t.path("config.toml");
    write_file(&config, "[create]\ndisk = \"8m\"\n");
    let env = [("COWSPACE_CONFIG", config.as_os_str())];
    let v =
        q.ws.t
            .run_env(["--json", "create", "base"], &env)
            .ok()
            .json();
    let id = v["id"].as_str().expect("id").to_string();
    q.ws.track(&id);
    assert_eq!(disk_of(&q.ws.status(&id)).1, 8 * MIB);
    q.ws.discard(&id);
}

#[test]
fn quota_workspaces_filesystem_comes_back_after_a_reboot_with_its_workspaces() {
    require_root!();
    let q = QuotaRoot::new();
    let image = q.image();
    assert!(!loops_of(&image).is_empty(), "no loop device for {image:?}");
    source(&q);
    let w = q.ws.create("base", &["--disk", "16m"]);
    write_file(&w.path.join("kept.txt"), "written before the reboot\n");
    let (_, err) = write_until_refused(&w.path.join("fill.bin"), MAX_WRITE_BYTES);
    assert_eq!(err.and_then(|e| e.raw_os_error()), Some(libc::EDQUOT));

    // A reboot: the daemon and every mount gone.
    q.ws.t.run(["daemon", "stop", "--force"]);
    let st = Command::new("umount")
        .arg("-R")
        .arg(q.ws_dir())
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(fstype(&q.ws_dir()), None);
    assert_eq!(loops_of(&image), "", "the loop device outlived its unmount");

    // `recover` mounts the workspaces filesystem and the workspace, full as it was.
    q.ws.t.run(["recover", &w.id]).ok();
    assert_eq!(fstype(&q.ws_dir()).as_deref(), Some("btrfs"));
    assert_eq!(
        std::fs::read_to_string(w.path.join("kept.txt")).unwrap(),
        "written before the reboot\n"
    );
    let (used, lim) = disk_of(&q.ws.status(&w.id));
    assert_eq!(lim, 16 * MIB);
    assert!(used >= 12 * MIB, "{used}");
    // Still limited: nothing more fits until something goes.
    let (_, err) = write_until_refused(&w.path.join("more.bin"), MAX_WRITE_BYTES);
    assert_eq!(err.and_then(|e| e.raw_os_error()), Some(libc::EDQUOT));
    let _ = std::fs::remove_file(w.path.join("more.bin"));

    // A sandbox starts in a workspace at its quota, and its worker meets the quota.
    let helper = crate::sandbox::support::helper();
    let env = [("COWSPACE_SANDBOX_HELPER", helper.as_os_str())];
    let out = q.ws.t.run_env(
        [
            "run",
            &w.id,
            "--",
            "sh",
            "-c",
            // More than the headroom the sandbox's set-up lends for a moment (4 MiB): a
            // few bytes could land in it, if the write came before the limit is put back.
            "head -c 8388608 /dev/zero > /workspace/more.bin && sync /workspace/more.bin",
        ],
        &env,
    );
    assert_ne!(
        out.code, 0,
        "a write past the quota in the sandbox: {out:?}"
    );
    assert!(out.stderr.contains("Disk quota exceeded"), "{}", out.stderr);
    assert_eq!(
        disk_of(&q.ws.status(&w.id)).1,
        16 * MIB,
        "the quota was put back"
    );
    std::fs::remove_file(w.path.join("fill.bin")).unwrap();
    let _ = std::fs::remove_file(w.path.join("more.bin"));
    q.ws.t
        .run_env(
            [
                "run",
                &w.id,
                "--",
                "sh",
                "-c",
                "head -c 4194304 /dev/zero > /workspace/ok.bin",
            ],
            &env,
        )
        .ok();
    q.ws.discard(&w.id);

    // The guard's cleanup frees the loop device.
    let dir = q.ws_dir();
    drop(q);
    assert_eq!(fstype(&dir), None);
    assert_eq!(loops_of(&image), "");
}
