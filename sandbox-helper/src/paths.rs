//! The host paths and sandbox paths a spec names: each taken as given, checked without
//! following a symlink a worker could have planted, and kept apart from the helper's
//! state directory.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

pub(crate) fn canonical_dir(path: &Path, flag: &str) -> Result<PathBuf> {
    let canon = std::fs::canonicalize(path)
        .map_err(|e| Error::InvalidInput(format!("{flag} {}: {e}", path.display())))?;
    if !canon.is_dir() {
        return Err(Error::InvalidInput(format!(
            "{flag} {}: not a directory",
            path.display()
        )));
    }
    Ok(canon)
}

/// The host path of a `--ro-bind` source, taken as given and never through a symlink.
///
/// A runtime may bind a path that lies in some workspace (a shared build output, another
/// worker's results), whose contents, links included, a worker made. Resolving links on
/// the host (`canonicalize`) would let a planted `share -> /etc` or `up ->
/// ../../../etc` hand the host's files to the sandbox that gets the bind. So: a relative
/// source is joined to the helper's working directory lexically; `.` components are
/// dropped; `..` is refused (it would mean something else after a symlinked directory
/// than it seems to); every component, the last one included, must not be a symlink
/// (the one that is is named); and the path must open with `openat2(RESOLVE_NO_SYMLINKS)`,
/// which the detached mount is later cloned through again.
pub(super) fn bind_source(entry: &str, src: &str) -> Result<PathBuf> {
    let given = Path::new(src);
    if src.is_empty() {
        return Err(Error::InvalidInput(format!(
            "--ro-bind {entry:?}: empty source"
        )));
    }
    if given.components().any(|c| c == Component::ParentDir) {
        return Err(Error::InvalidInput(format!(
            "--ro-bind {entry:?}: the source {src:?} contains `..`: bind sources are \
             taken as given, never resolved; write the path without `..`"
        )));
    }
    let absolute = if given.is_absolute() {
        given.to_path_buf()
    } else {
        // The kernel's path of the working directory has no symlinks in it; it is
        // walked below like the rest anyway.
        std::env::current_dir()
            .map_err(|e| {
                Error::InvalidInput(format!(
                    "--ro-bind {entry:?}: relative source and no working directory: {e}"
                ))
            })?
            .join(given)
    };
    let mut path = PathBuf::from("/");
    let mut walked = PathBuf::from("/");
    for part in absolute.components() {
        let Component::Normal(part) = part else {
            continue;
        };
        walked.push(part);
        let meta = std::fs::symlink_metadata(&walked).map_err(|e| {
            Error::InvalidInput(format!(
                "--ro-bind {entry:?}: source {}: {e}",
                walked.display()
            ))
        })?;
        if meta.file_type().is_symlink() {
            return Err(symlink_refused(entry, &walked));
        }
        path.push(part);
    }
    crate::sys::open_path_no_symlinks(&path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            symlink_refused(entry, &path)
        } else {
            Error::InvalidInput(format!(
                "--ro-bind {entry:?}: source {}: {e}",
                path.display()
            ))
        }
    })?;
    Ok(path)
}

fn symlink_refused(entry: &str, link: &Path) -> Error {
    let to = std::fs::read_link(link)
        .map(|t| format!(" (to {})", t.display()))
        .unwrap_or_default();
    Error::InvalidInput(format!(
        "--ro-bind {entry:?}: {} is a symlink{to}: bind sources are opened without \
         following symlinks, so a link planted in a shared directory cannot hand other \
         host files to the sandbox; bind the directory or file itself, by a path without \
         symlinks, if that is what is meant",
        link.display()
    ))
}

/// `--suspend-host-mount` unmounts `--dir`: allowed only for a cowspace workspace of the
/// runtime root whose state directory this is (`<root>/run/sandbox`), i.e. an overlay
/// whose upper layer lies in `<root>/workspaces/`, never for any other mount.
pub(super) fn check_suspendable(
    workspace: &Path,
    overlay: Option<&crate::overlay::Layers>,
    state_dir: &Path,
) -> Result<()> {
    let Some(layers) = overlay else {
        return Err(Error::InvalidInput(format!(
            "--suspend-host-mount: {} is not an overlay mount",
            workspace.display()
        )));
    };
    let state = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let workspaces = state
        .parent()
        .filter(|run| run.ends_with("run"))
        .and_then(Path::parent)
        .map(|root| root.join("workspaces"));
    match workspaces {
        Some(w) if layers.upper_parent.starts_with(&w) && layers.upper_parent != w => Ok(()),
        _ => Err(Error::InvalidInput(format!(
            "--suspend-host-mount: the overlay at {} is not a workspace of the runtime root \
             of --state-dir {} (its upper layer is in {})",
            workspace.display(),
            state_dir.display(),
            layers.upper_parent.display()
        ))),
    }
}

/// Refuses a host path that is, contains, or is inside the state directory.
pub(crate) fn refuse_overlap(path: &Path, state_dir: &Path, flag: &str) -> Result<()> {
    // A state directory not made yet is compared as an absolute path.
    let state = std::fs::canonicalize(state_dir)
        .or_else(|_| std::path::absolute(state_dir))
        .unwrap_or_else(|_| state_dir.to_path_buf());
    if path.starts_with(&state) || state.starts_with(path) {
        return Err(Error::InvalidInput(format!(
            "{flag} {}: overlaps the helper's state directory {}",
            path.display(),
            state.display()
        )));
    }
    Ok(())
}

/// An absolute, `..`-free, normalized path inside the sandbox.
pub(super) fn normalize_target(dst: &str) -> Option<PathBuf> {
    let path = Path::new(dst);
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_workspace_of_the_state_dirs_root_may_be_suspended() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let state = root.join("run/sandbox");
        std::fs::create_dir_all(&state).unwrap();
        let overlay_at = |upper_parent: &Path| {
            let line = format!(
                "36 27 0:45 / /ws/mnt rw - overlay cowspace rw,lowerdir=/l,upperdir={0}/upper,workdir={0}/work,userxattr\n",
                upper_parent.display()
            );
            crate::overlay::detect_in(&line, Path::new("/ws/mnt"))
                .unwrap()
                .unwrap()
        };
        let ws = Path::new("/ws/mnt");
        let ours = overlay_at(&root.join("workspaces/ws-1"));
        assert!(check_suspendable(ws, Some(&ours), &state).is_ok());
        for other in [
            overlay_at(Path::new("/var/lib/containers/x")),
            overlay_at(&root.join("workspaces")),
            overlay_at(&root.join("elsewhere/ws-1")),
        ] {
            let e = check_suspendable(ws, Some(&other), &state).unwrap_err();
            assert!(e.to_string().contains("not a workspace"), "{e}");
        }
        let e = check_suspendable(ws, None, &state).unwrap_err();
        assert!(e.to_string().contains("not an overlay"), "{e}");
        // A state directory not at <root>/run/sandbox names no runtime root.
        let e = check_suspendable(ws, Some(&ours), &root.join("elsewhere")).unwrap_err();
        assert!(e.to_string().contains("not a workspace"), "{e}");
    }

    #[test]
    fn bind_sources_are_taken_as_given_and_never_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let shared = base.join("shared");
        std::fs::create_dir_all(shared.join("out/sub")).unwrap();
        std::os::unix::fs::symlink("/etc", shared.join("share")).unwrap();
        std::os::unix::fs::symlink("../../../../../../../etc", shared.join("up")).unwrap();
        std::os::unix::fs::symlink("out", shared.join("alias")).unwrap();
        let refused = |src: &Path| {
            let entry = format!("{}:/deps", src.display());
            bind_source(&entry, &src.to_string_lossy())
                .unwrap_err()
                .to_string()
        };
        // Last component, middle component, a relative chain up to the host root, and a
        // link that stays inside the shared directory: all named, none followed.
        for (src, link) in [
            (shared.join("share"), shared.join("share")),
            (shared.join("share/ssl"), shared.join("share")),
            (shared.join("up"), shared.join("up")),
            (shared.join("up/passwd"), shared.join("up")),
            (shared.join("alias/sub"), shared.join("alias")),
        ] {
            let e = refused(&src);
            assert!(
                e.contains(&format!("{} is a symlink", link.display())),
                "{src:?}: {e}"
            );
            assert!(e.contains("without following symlinks"), "{e}");
        }
        assert!(refused(&shared.join("share")).contains("(to /etc)"));
        let e = refused(&shared.join("out/../share"));
        assert!(e.contains("`..`"), "{e}");
        assert!(refused(&shared.join("missing")).contains("No such file"));
        // A plain path is kept as given (`.` and doubled slashes dropped).
        let src = format!("{}//out/./sub", shared.display());
        assert_eq!(bind_source("x", &src).unwrap(), shared.join("out/sub"));
        // Relative sources are joined to the working directory, lexically.
        let cwd = std::env::current_dir().unwrap();
        let rel = bind_source("x", "src").unwrap();
        assert_eq!(rel, cwd.join("src"));
        assert!(
            bind_source("x", "../x")
                .unwrap_err()
                .to_string()
                .contains("`..`")
        );
    }
}
