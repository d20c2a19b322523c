//! The `reflink` materializer's probe: whether the runtime root's filesystem clones files.
//! The materializer itself is `copy.rs`'s [`super::copy::Copied`] with `Fill::Clone`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::materializer::fulltree;

/// Clones a small file in the runtime root's `tmp/` once per root and process.
pub(crate) fn trial_clone(root_tmp: &Path) -> std::result::Result<(), String> {
    static PROBED: Mutex<Option<HashMap<PathBuf, std::result::Result<(), String>>>> =
        Mutex::new(None);
    let mut g = PROBED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = g.get_or_insert_with(HashMap::new).get(root_tmp) {
        return r.clone();
    }
    let r = (|| {
        fs::create_dir_all(root_tmp)
            .map_err(|e| format!("cannot create {}: {e}", root_tmp.display()))?;
        let a = root_tmp.join(format!("reflink-probe-{}-a", std::process::id()));
        let b = root_tmp.join(format!("reflink-probe-{}-b", std::process::id()));
        let out = (|| {
            fs::write(&a, b"cowspace reflink probe\n")
                .map_err(|e| format!("cannot write {}: {e}", a.display()))?;
            let src =
                fs::File::open(&a).map_err(|e| format!("cannot open {}: {e}", a.display()))?;
            let dst =
                fs::File::create(&b).map_err(|e| format!("cannot create {}: {e}", b.display()))?;
            crate::sys::ficlone(&dst, &src).map_err(|e| {
                format!(
                    "the runtime root is on {}, which cannot clone files (FICLONE: {e}); reflink needs btrfs or xfs made with reflink=1",
                    fulltree::fs_name(root_tmp)
                )
            })
        })();
        let _ = fs::remove_file(&a);
        let _ = fs::remove_file(&b);
        out
    })();
    g.get_or_insert_with(HashMap::new)
        .insert(root_tmp.to_path_buf(), r.clone());
    r
}
