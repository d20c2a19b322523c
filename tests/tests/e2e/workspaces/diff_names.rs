//! `diff WS` names paths as git does: a name that is not UTF-8 (or holds a control
//! character, a quote or a backslash) is listed in double quotes with C escapes and
//! octal bytes, exactly as `git diff --name-only` lists the same name, so a reader can
//! name the file. A change of hard-link membership alone is listed between snapshots.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use cowspace_tests::write_file;
use serde_json::json;

use super::support::{WsRoot, require_root};

/// Names a listing must quote, and one it must not.
const NAMES: [&[u8]; 7] = [
    b"raw\xff",
    b"caf\xc3\xa9",
    b"tab\there",
    b"quo\"te",
    b"back\\slash",
    b"new\nline",
    b"plain name",
];

/// The names `git -c core.quotePath=true diff --cached --name-only` gives the files
/// `NAMES` added to a fresh repository, as it prints them. (Not `git status
/// --porcelain`: it also quotes a name with a space, which git's other listings and
/// patches do not.)
fn git_names(r: &WsRoot) -> BTreeSet<String> {
    let repo = r.t.path("git");
    for (i, n) in NAMES.iter().enumerate() {
        write_file(&repo.join(OsStr::from_bytes(n)), format!("{i}\n"));
    }
    r.t.git(&repo, ["init", "-q"]).ok();
    r.t.git(&repo, ["add", "-A"]).ok();
    let args = [
        "-c",
        "core.quotePath=true",
        "diff",
        "--cached",
        "--name-only",
    ];
    let out = r.t.git(&repo, args).ok();
    out.stdout.lines().map(str::to_string).collect()
}

#[test]
fn workspace_diff_quotes_names_as_git_lists_them() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("base.txt"), "base\n");
    let base = r.import(&src, &[]);
    let want = git_names(&r);
    assert_eq!(want.len(), NAMES.len(), "{want:?}");
    assert!(want.contains("\"raw\\377\""), "git quotes bytes: {want:?}");
    assert!(want.contains("plain name"), "{want:?}");
    for materializer in ["overlay", "fuse", "copy"] {
        let ws = r.create(&base, &["--materializer", materializer]);
        for (i, n) in NAMES.iter().enumerate() {
            write_file(&ws.path.join(OsStr::from_bytes(n)), format!("{i}\n"));
        }
        let listing = r.t.run(["diff", ws.id.as_str()]).ok().stdout;
        let got: BTreeSet<String> = listing
            .lines()
            .map(|l| {
                l.strip_prefix("A ")
                    .unwrap_or_else(|| panic!("{materializer}: diff line {l:?}"))
                    .to_string()
            })
            .collect();
        assert_eq!(got, want, "{materializer}: {listing}");
        // The JSON names the raw bytes as well (`path_hex`, only where not UTF-8).
        let v = r.t.json(["diff", ws.id.as_str()]).ok().json();
        let raw: Vec<&serde_json::Value> = v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c.get("path_hex").is_some())
            .collect();
        assert_eq!(raw.len(), 1, "{materializer}: {v}");
        assert_eq!(raw[0]["path_hex"], "726177ff", "{materializer}: {v}");
        r.discard(&ws.id);
    }
}

/// A name that leaves its group of hard links, bytes, mode and xattrs unchanged: `diff`
/// of the workspace lists nothing (it compares each path's kind, content, mode and
/// xattrs), `commit` records the name as a file of its own, and `diff` of the base and
/// the new snapshot lists it as modified, from `hardlink` to `file`
/// (docs/control-protocol.md).
#[test]
fn hard_link_membership_alone_is_listed_between_snapshots() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("c"), "same\n");
    std::fs::hard_link(src.join("c"), src.join("d")).unwrap();
    let base = r.import(&src, &[]);
    for materializer in ["overlay", "fuse", "copy"] {
        let ws = r.create(&base, &["--materializer", materializer]);
        let (d, tmp) = (ws.path.join("d"), ws.path.join("d.tmp"));
        std::fs::copy(&d, &tmp).unwrap();
        std::fs::rename(&tmp, &d).unwrap();
        let listing = r.t.run(["diff", ws.id.as_str()]).ok().stdout;
        assert_eq!(listing, "", "{materializer}");
        let (new, v, _) = r.commit(&ws.id, &[]);
        assert_ne!(new, base, "{materializer}: {v}");
        let listing = r.t.run(["diff", base.as_str(), new.as_str()]).ok().stdout;
        assert_eq!(listing, "M d\n", "{materializer}");
        let v = r.t.json(["diff", base.as_str(), new.as_str()]).ok().json();
        let c = &v["changes"][0];
        assert_eq!(
            (&c["old_kind"], &c["new_kind"]),
            (&json!("hardlink"), &json!("file")),
            "{materializer}: {v}"
        );
        r.remove(&ws.id);
    }
}
