//! `--workdir`: the working directory of a sandbox's commands.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Where commands start when no `--workdir` is given.
pub const DEFAULT_WORKDIR: &str = "/workspace";
/// Longest `--workdir` accepted (`PATH_MAX`).
const MAX_WORKDIR_BYTES: usize = 4096;

/// Reads `--workdir`: absolute inside the sandbox, or relative to `/workspace`; no `.`,
/// `..` or NUL (the path is used as it is written, inside the sandbox's own view).
pub fn parse_workdir(text: Option<&str>) -> Result<PathBuf> {
    let Some(text) = text else {
        return Ok(PathBuf::from(DEFAULT_WORKDIR));
    };
    let bad = |why: &str| {
        Error::InvalidInput(format!(
            "--workdir {text:?}: {why} (an absolute path inside the sandbox, or one relative \
             to /workspace)"
        ))
    };
    if text.is_empty() || text.len() > MAX_WORKDIR_BYTES || text.contains('\0') {
        return Err(bad("empty, too long or holding NUL"));
    }
    // Checked on the text: `Path::components` drops an inner `.` silently.
    if text.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(bad("`.` and `..` are not allowed"));
    }
    let path = Path::new(DEFAULT_WORKDIR).join(text);
    debug_assert!(
        path.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    );
    Ok(path.components().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workdirs_are_absolute_or_under_the_workspace_and_never_climb() {
        let ok = |t: Option<&str>| parse_workdir(t).unwrap();
        assert_eq!(ok(None), Path::new("/workspace"));
        assert_eq!(ok(Some("/srv/app/")), Path::new("/srv/app"));
        assert_eq!(ok(Some("src")), Path::new("/workspace/src"));
        assert_eq!(ok(Some("/")), Path::new("/"));
        for bad in ["", "../etc", "/srv/../etc", "a/./b", "a\0b"] {
            assert!(parse_workdir(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
