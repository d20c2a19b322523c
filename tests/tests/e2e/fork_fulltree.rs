//! `mountctl fork` of full-tree workspaces (btrfs, reflink, copy) on btrfs and xfs
//! (`reflink=1`) loop filesystems, and of an overlay workspace whose private layer is
//! cloned, not copied, on such a filesystem.
//!
//! Needs on the host: loop devices, `mkfs.btrfs`, `mkfs.xfs`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cowspace_tests::{LoopFs, LoopKind, write_file};

use crate::fork::{diff_set, forks};
use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// A loop filesystem of `kind`, or `None` (skipped, said why) where none can be made
/// outside CI.
fn loop_fs(kind: LoopKind) -> Option<LoopFs> {
    match LoopFs::new(kind) {
        Ok(fs) => Some(fs),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("a {} loop filesystem under CI=true: {why}", kind.name())
        }
        Err(why) => {
            eprintln!("SKIPPED: a {} loop filesystem: {why}", kind.name());
            None
        }
    }
}

fn base(src: &Path) {
    write_file(&src.join("keep.txt"), "keep\n");
    write_file(&src.join("modify.txt"), "before\n");
    write_file(&src.join("delete.txt"), "gone soon\n");
    write_file(&src.join("olddir/inside.txt"), "inside\n");
    write_file(&src.join("linked/a.txt"), "one file, two names\n");
    std::fs::hard_link(src.join("linked/a.txt"), src.join("linked/b.txt")).unwrap();
    write_file(&src.join("untouched/deep/file.txt"), "untouched\n");
}

/// Changes of every kind: new, modified, deleted, renamed directory, hard link, xattr,
/// symlink.
fn changes_of_every_kind(p: &Path) {
    write_file(&p.join("new/deep/file.txt"), "new\n");
    std::fs::write(p.join("modify.txt"), "after\n").unwrap();
    std::fs::remove_file(p.join("delete.txt")).unwrap();
    std::fs::rename(p.join("olddir"), p.join("newdir")).unwrap();
    std::fs::hard_link(p.join("new/deep/file.txt"), p.join("hardlink.txt")).unwrap();
    std::os::unix::fs::symlink("new/deep", p.join("symlink")).unwrap();
    xattr::set(p.join("keep.txt"), "user.note", b"tagged").unwrap();
}

/// What every fork of the changed parent must show.
fn assert_shows_the_changes(fp: &Path, what: &str) {
    let read = |p: &str| std::fs::read_to_string(fp.join(p)).unwrap();
    assert_eq!(read("modify.txt"), "after\n", "{what}");
    assert_eq!(read("keep.txt"), "keep\n", "{what}");
    assert_eq!(read("untouched/deep/file.txt"), "untouched\n", "{what}");
    assert_eq!(read("newdir/inside.txt"), "inside\n", "{what}");
    assert!(
        !fp.join("delete.txt").exists() && !fp.join("olddir").exists(),
        "{what}"
    );
    assert_eq!(
        std::fs::read_link(fp.join("symlink")).unwrap(),
        Path::new("new/deep"),
        "{what}"
    );
    let ino = |p: &str| std::fs::metadata(fp.join(p)).unwrap().ino();
    assert_eq!(
        ino("hardlink.txt"),
        ino("new/deep/file.txt"),
        "{what}: a new hard link is one file in the fork"
    );
    assert_eq!(
        ino("linked/a.txt"),
        ino("linked/b.txt"),
        "{what}: the base's hard link is one file in the fork"
    );
    assert_eq!(
        xattr::get(fp.join("keep.txt"), "user.note")
            .unwrap()
            .as_deref(),
        Some(&b"tagged"[..]),
        "{what}"
    );
}

/// The content of `path` in snapshot `snap` (exported once), `None` where it has none.
fn shown(r: &WsRoot, snap: &str, path: &str) -> Option<String> {
    let dest = r.t.path(&format!("export-{snap}"));
    if !dest.exists() {
        r.t.run(["export", snap, dest.to_str().unwrap()]).ok();
    }
    std::fs::read_to_string(dest.join(path)).ok()
}

#[test]
fn full_tree_forks_hold_every_kind_of_change_and_each_side_diverges_alone() {
    require_root!();
    sbx::helper();
    for (kind, materializer) in [
        (LoopKind::Btrfs, "btrfs"),
        (LoopKind::Xfs, "reflink"),
        (LoopKind::Xfs, "copy"),
    ] {
        let Some(fs) = loop_fs(kind) else { return };
        let what = format!("{materializer} on {}", kind.name());
        let r = WsRoot::new_in(fs.mnt());
        let src = r.t.path("src");
        base(&src);
        let snap = r.import(&src, &["--ref", "t/main"]);
        let parent = r.create(&snap, &["--materializer", materializer, "--name", "parent"]);
        let (ws, p) = (parent.id.clone(), parent.path.clone());
        changes_of_every_kind(&p);
        let before = diff_set(&r, &ws);
        assert!(before.len() >= 10, "{what}: {before:?}");

        // A running sandbox is frozen for the copy and thawed after.
        r.t.json(["sandbox", "start", &ws]).ok();
        let v = r.t.json(["fork", &ws, "--count", "3"]).ok().json();
        assert_eq!(v["parent"], ws, "{v}");
        assert!(
            v["frozen_ms"].as_f64().unwrap() > 0.0,
            "{what}: the parent's sandbox was frozen: {v}"
        );
        eprintln!("{what}: fork --count 3, frozen {} ms", v["frozen_ms"]);
        let st = r.t.json(["sandbox", "status", &ws]).ok().json();
        assert_eq!(st["state"], "running", "{what}: thawed after: {st}");
        r.t.json(["sandbox", "stop", &ws]).ok();
        let f = forks(&v);
        assert_eq!(f.len(), 3);
        for (id, fp) in &f {
            r.track(id);
            let st = r.t.json(["status", id]).ok().json();
            assert_eq!(st["parent"], ws, "{st}");
            assert_eq!(st["materializer"], materializer, "{st}");
            assert_eq!(
                diff_set(&r, id),
                before,
                "{what}: the fork's diff is the parent's"
            );
            assert_shows_the_changes(fp, &what);
        }
        // Nothing of the copy it was made from is left beside the parent.
        let private = r.root().join("workspaces").join(&ws);
        let left: Vec<_> = std::fs::read_dir(&private)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("fork-stage"))
            .collect();
        assert!(left.is_empty(), "{what}: {left:?}");

        // Divergent writes: each keeps its own, and its diff says exactly that.
        std::fs::write(p.join("parent-only.txt"), "p\n").unwrap();
        std::fs::write(f[0].1.join("fork0-only.txt"), "0\n").unwrap();
        std::fs::write(f[1].1.join("modify.txt"), "fork1\n").unwrap();
        std::fs::remove_file(f[2].1.join("untouched/deep/file.txt")).unwrap();
        std::fs::write(f[2].1.join("linked/a.txt"), "changed through one name\n").unwrap();
        assert!(!f[0].1.join("parent-only.txt").exists() && !p.join("fork0-only.txt").exists());
        assert_eq!(
            std::fs::read_to_string(p.join("modify.txt")).unwrap(),
            "after\n"
        );
        assert_eq!(
            std::fs::read_to_string(f[2].1.join("linked/b.txt")).unwrap(),
            "changed through one name\n",
            "{what}: the base's hard link stays one file in a fork"
        );
        assert!(p.join("untouched/deep/file.txt").exists());
        let with = |extra: &[(&str, &str)], without: &[&str]| {
            let mut d: Vec<(String, String)> = before
                .iter()
                .filter(|(_, path)| !without.contains(&path.as_str()))
                .cloned()
                .collect();
            d.extend(extra.iter().map(|(c, p)| (c.to_string(), p.to_string())));
            d.sort();
            d
        };
        assert_eq!(
            diff_set(&r, &ws),
            with(&[("added", "parent-only.txt")], &[])
        );
        assert_eq!(
            diff_set(&r, &f[0].0),
            with(&[("added", "fork0-only.txt")], &[])
        );
        assert_eq!(diff_set(&r, &f[1].0), before, "{what}: still modified");
        assert_eq!(
            diff_set(&r, &f[2].0),
            with(
                &[
                    ("deleted", "untouched/deep/file.txt"),
                    ("modified", "linked/a.txt"),
                    ("modified", "linked/b.txt"),
                ],
                &[]
            ),
            "{what}"
        );

        // Commits differ as written.
        let commit = |id: &str| {
            r.t.json(["commit", id]).ok().json()["snapshot"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let (cp, c0, c1, c2) = (
            commit(&ws),
            commit(&f[0].0),
            commit(&f[1].0),
            commit(&f[2].0),
        );
        let all = [&cp, &c0, &c1, &c2];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b, "{what}: the commits differ");
            }
        }
        assert_eq!(shown(&r, &cp, "parent-only.txt").as_deref(), Some("p\n"));
        assert_eq!(shown(&r, &c0, "parent-only.txt"), None);
        assert_eq!(shown(&r, &c0, "fork0-only.txt").as_deref(), Some("0\n"));
        assert_eq!(shown(&r, &c1, "modify.txt").as_deref(), Some("fork1\n"));
        assert_eq!(shown(&r, &c0, "modify.txt").as_deref(), Some("after\n"));
        assert_eq!(shown(&r, &c2, "untouched/deep/file.txt"), None);
        assert_eq!(
            shown(&r, &c2, "linked/b.txt").as_deref(),
            Some("changed through one name\n")
        );
        assert_eq!(
            shown(&r, &cp, "untouched/deep/file.txt").as_deref(),
            Some("untouched\n")
        );

        // A fork of a fork works the same.
        let v = r.t.json(["fork", &f[0].0]).ok().json();
        let (gid, gp) = forks(&v).remove(0);
        r.track(&gid);
        assert_eq!(
            diff_set(&r, &gid),
            with(&[("added", "fork0-only.txt")], &[]),
            "{what}"
        );
        assert_shows_the_changes(&gp, &what);

        // A failed fork (its third name taken) leaves no workspace and no copy.
        r.t.run(["fork", &ws, "--name", "x-3"]).ok();
        let listed = r.t.json(["list"]).ok().json().as_array().unwrap().len();
        r.t.run(["fork", &ws, "--count", "3", "--name", "x"])
            .code(4);
        let after = r.t.json(["list"]).ok().json();
        assert_eq!(after.as_array().unwrap().len(), listed, "{what}: {after}");
        assert!(
            !std::fs::read_dir(&private).unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("fork-stage")),
            "{what}: the copy a failed fork was made from is gone"
        );
        for id in [&ws, &f[0].0, &f[1].0, &f[2].0, &gid] {
            r.discard(id);
        }
        r.discard("x-3");
        r.assert_clean();
        drop(r);
        drop(fs);
    }
}

/// Bytes in use on the filesystem holding `path`, after a sync.
fn used_bytes(path: &Path) -> u64 {
    nix::unistd::sync();
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    (s.blocks() - s.blocks_free()) * s.fragment_size()
}

#[test]
fn overlay_forks_clone_the_private_layer_on_a_reflink_filesystem() {
    require_root!();
    const PRIVATE_BYTES: usize = 64 << 20;
    const FORKS: u64 = 4;
    for kind in [LoopKind::Xfs, LoopKind::Btrfs] {
        let Some(fs) = loop_fs(kind) else { return };
        let r = WsRoot::new_in(fs.mnt());
        let src = r.t.path("src");
        write_file(&src.join("readme.txt"), "base\n");
        let snap = r.import(&src, &[]);
        let parent = r.create(&snap, &["--materializer", "overlay"]);
        // 64 MiB written through the workspace, incompressible, into its private layer.
        let mut bytes = vec![0u8; PRIVATE_BYTES];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for chunk in bytes.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        std::fs::write(parent.path.join("big.bin"), &bytes).unwrap();
        let before = used_bytes(fs.mnt());
        let v =
            r.t.json(["fork", &parent.id, "--count", &FORKS.to_string()])
                .ok()
                .json();
        let grown = used_bytes(fs.mnt()).saturating_sub(before);
        eprintln!(
            "{}: fork --count {FORKS} of a {} MiB private layer: disk grew {} KiB",
            kind.name(),
            PRIVATE_BYTES >> 20,
            grown >> 10
        );
        // A copy per fork would add FORKS x 64 MiB; clones add metadata only.
        assert!(
            grown < PRIVATE_BYTES as u64 / 4,
            "{}: {grown} bytes more after {FORKS} forks of a {PRIVATE_BYTES}-byte layer",
            kind.name()
        );
        for (id, fp) in forks(&v) {
            r.track(&id);
            assert!(
                std::fs::read(fp.join("big.bin")).unwrap() == bytes,
                "the fork holds the parent's bytes"
            );
        }
        // Each fork's writes are its own: the clone is copy-on-write.
        let (f0, p0) = forks(&v).remove(0);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(p0.join("big.bin"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"fork 0 writes here").unwrap();
        drop(f);
        assert!(std::fs::read(parent.path.join("big.bin")).unwrap() == bytes);
        r.discard(&parent.id);
        for (id, _) in forks(&v) {
            r.discard(&id);
        }
        let _ = f0;
        r.assert_clean();
        drop(r);
        drop(fs);
    }
}
