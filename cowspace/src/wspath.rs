//! Where a workspace asked for with `--path` may live. Not inside the runtime root (its
//! private state, the store and the daemon's views live there, and sweep deletes what it
//! does not know), and not inside another workspace (the outer one's unmount would then
//! be busy for ever, or its removal would delete the inner one's mount point).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::registry::Record;

/// `path` with its existing part resolved (symlinks, `..`): the parent exists when this
/// is asked, the last component need not.
fn resolved(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// Refuses (`Invalid`) a workspace at `path` inside the runtime root `root` or inside
/// the path of one of `others` (the live workspaces), naming which.
pub(crate) fn check_custom_path(path: &Path, root: &Path, others: &[Record]) -> Result<()> {
    let at = resolved(path);
    for root in [root.to_path_buf(), resolved(root)] {
        if at.starts_with(&root) {
            return Err(Error::Invalid(format!(
                "--path {} lies inside the runtime root {}; choose a directory outside it",
                path.display(),
                root.display()
            )));
        }
    }
    for rec in others {
        // A mount whose daemon died answers ENOTCONN: then the recorded path, which
        // was made absolute at its create.
        let theirs = rec.path.canonicalize().unwrap_or_else(|_| rec.path.clone());
        if at.starts_with(&theirs) || at.starts_with(&rec.path) {
            let name = rec
                .name
                .as_deref()
                .map_or_else(String::new, |n| format!(" ({n})"));
            return Err(Error::Invalid(format!(
                "--path {} lies inside workspace {}{name} at {}; choose a directory outside every workspace",
                path.display(),
                rec.id,
                rec.path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_in_the_root_and_in_workspaces_through_symlinks_too() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(root.join("workspaces")).unwrap();
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::os::unix::fs::symlink(&root, tmp.path().join("to-root")).unwrap();
        let rec: Record = serde_json::from_value(serde_json::json!({
            "id": "ws-0123456789abcdef", "name": "outer", "worker": null,
            "snapshot": "00", "materializer": "copy", "lower_kind": "checkout",
            "lower": "/nonexistent", "path": ws, "private_dir": root.join("workspaces/x"),
            "status": "active", "created_at": 0, "updated_at": 0, "stopped_at": null,
            "policies": {}, "diagnostics": [], "ports": {}, "commits": [], "create_ms": 0.0,
        }))
        .unwrap();
        let others = [rec];
        let e = check_custom_path(&root.join("new"), &root, &others).unwrap_err();
        assert!(e.to_string().contains("runtime root"), "{e}");
        let e = check_custom_path(&tmp.path().join("to-root/workspaces/y"), &root, &others)
            .unwrap_err();
        assert!(e.to_string().contains("runtime root"), "{e}");
        let e = check_custom_path(&ws.join("sub/inner"), &root, &others).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("ws-0123456789abcdef") && m.contains("outer"),
            "{m}"
        );
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidInput);
        // Beside them: fine, and so is a name that only starts like the workspace's.
        check_custom_path(&tmp.path().join("beside"), &root, &others).unwrap();
        check_custom_path(&tmp.path().join("ws2"), &root, &others).unwrap();
    }
}
