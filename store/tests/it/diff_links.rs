//! A change of hard-link membership alone (a name that joins or leaves a group of hard
//! links, its bytes, mode and xattrs unchanged) is a change of the tree a commit records:
//! `diff` between two snapshots lists it as modified, both ways, with the kinds that say
//! why (`file` and `hardlink`).

use std::fs;

use cowspace_store::diff::Change;
use cowspace_store::{ImportOptions, Kind, Store, StoreConfig};

#[test]
fn diff_lists_a_name_joining_or_leaving_a_hard_link_group() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let import = |name: &str, linked: &str| {
        let src = tmp.path().join(name);
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("c"), "same\n").unwrap();
        for other in ["d", "e"] {
            if other == linked {
                fs::hard_link(src.join("c"), src.join(other)).unwrap();
            } else {
                fs::write(src.join(other), "same\n").unwrap();
            }
        }
        store
            .import_dir(&src, &ImportOptions::new())
            .unwrap()
            .snapshot
    };
    // `d` is `c`'s second name in one, `e` in the other; the bytes are the same.
    let (a, b) = (import("a", "d"), import("b", "e"));
    let kinds = |from, to| -> Vec<(String, Change, Option<Kind>, Option<Kind>)> {
        store
            .diff_snapshots(from, to)
            .unwrap()
            .into_iter()
            .map(|c| (c.path, c.change, c.old_kind, c.new_kind))
            .collect()
    };
    let (file, link) = (Some(Kind::File), Some(Kind::Hardlink));
    assert_eq!(
        kinds(&a, &b),
        [
            ("d".into(), Change::Modified, link, file),
            ("e".into(), Change::Modified, file, link),
        ]
    );
    assert_eq!(
        kinds(&b, &a),
        [
            ("d".into(), Change::Modified, file, link),
            ("e".into(), Change::Modified, link, file),
        ]
    );
    assert_eq!(kinds(&a, &a), []);
}
