//! `mountctl init`: create the runtime root. Of a root that exists already it is a no-op
//! that says so (exit 0): scripts and setup steps may run it every time. Anything else
//! at `--root` (a file, a directory holding other things, such as a source checkout) is
//! refused before anything is written there.

use std::path::Path;
use std::process::ExitCode;

use cowspace_store::{Error as StoreError, Store, StoreConfig};
use serde_json::json;

use crate::output::Ctx;

/// What a runtime root holds at its top (and what a half-made one may): a directory
/// holding only these is initialised in place. `lost+found`: the root of a filesystem
/// made for the runtime.
const ROOT_ENTRIES: &[&str] = &[
    "store",
    "cache",
    "workspaces",
    "run",
    "tmp",
    "registry.db",
    "registry.db-wal",
    "registry.db-shm",
    "lost+found",
    cowspace::quota::WORKSPACES_IMAGE,
];

/// How many foreign entries a refusal names.
const MAX_NAMED_ENTRIES: usize = 3;

/// Refuses a `--root` that `init` must not write into: not a directory, or a non-empty
/// directory that is not a runtime root.
fn check_target(root: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("stat {}", root.display()))),
    };
    if !meta.is_dir() {
        return Err(cowspace::error::Error::Invalid(format!(
            "the runtime root {} is not a directory; give `--root` (or $COWSPACE_ROOT) a new \
             or empty directory",
            root.display()
        ))
        .into());
    }
    if cowspace_store::layout::Layout::new(root).index().exists() {
        return Ok(());
    }
    let mut foreign: Vec<String> = std::fs::read_dir(root)
        .map_err(|e| anyhow::Error::new(e).context(format!("list {}", root.display())))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !ROOT_ENTRIES.contains(&n.as_str()))
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    foreign.sort();
    let n = foreign.len();
    let mut named = foreign
        .into_iter()
        .take(MAX_NAMED_ENTRIES)
        .collect::<Vec<_>>()
        .join(", ");
    if n > MAX_NAMED_ENTRIES {
        named.push_str(&format!(" and {} more", n - MAX_NAMED_ENTRIES));
    }
    Err(cowspace::error::Error::Invalid(format!(
        "{} is not empty and is not a cowspace runtime root (it holds {named}): init would \
         write store/, cache/ and workspaces/ among those files; give `--root` (or \
         $COWSPACE_ROOT) a new or empty directory",
        root.display()
    ))
    .into())
}

pub fn run(ctx: &Ctx, workspaces_fs: Option<&str>) -> anyhow::Result<ExitCode> {
    let root = ctx.root.display().to_string();
    check_target(&ctx.root)?;
    // Checked before anything is written.
    let fs_bytes = workspaces_fs
        .map(|s| cowspace::quota::parse_size("--workspaces-fs", s))
        .transpose()?;
    if let Some(b) = fs_bytes
        && b < cowspace::quota::MIN_WORKSPACES_FS_BYTES
    {
        return Err(cowspace::error::Error::Invalid(format!(
            "--workspaces-fs {}: give at least {} MiB (btrfs needs room for its metadata)",
            workspaces_fs.unwrap_or_default(),
            cowspace::quota::MIN_WORKSPACES_FS_BYTES >> 20
        ))
        .into());
    }
    let created = match Store::init(&ctx.root, StoreConfig::default()) {
        Ok(_) => true,
        Err(StoreError::RootExists(_)) => {
            // Opened, so that a damaged root is not passed off as a usable one.
            Store::open(&ctx.root, StoreConfig::default())?;
            false
        }
        Err(e) => return Err(e.into()),
    };
    let mut value = json!({"root": root, "created": created});
    let mut text = if created {
        format!("initialised {root}")
    } else {
        format!("{root} is initialised already; nothing to do")
    };
    if let Some(bytes) = fs_bytes {
        let rt = ctx.runtime()?;
        let has_workspaces = !rt.list(false)?.is_empty();
        let made = cowspace::quota::init_workspaces_fs(&ctx.root, bytes, has_workspaces)?;
        let image = cowspace::quota::image_path(&ctx.root);
        value["workspaces_fs"] = json!({"image": image, "bytes": bytes, "created": made});
        text = if made {
            format!(
                "{text}; its workspaces live in {} ({}, btrfs with quotas)",
                image.display(),
                crate::output::bytes(bytes)
            )
        } else {
            format!(
                "{text}; its workspaces filesystem {} exists",
                image.display()
            )
        };
    }
    ctx.confirm(value, || text);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_new_empty_or_runtime_directory_is_initialised() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        check_target(&root).unwrap();
        std::fs::create_dir(&root).unwrap();
        check_target(&root).unwrap();
        std::fs::create_dir(root.join("store")).unwrap();
        std::fs::create_dir(root.join("lost+found")).unwrap();
        check_target(&root).unwrap();
        std::fs::write(root.join("Cargo.toml"), "").unwrap();
        let e = check_target(&root).unwrap_err().to_string();
        assert!(e.contains("Cargo.toml") && e.contains("not empty"), "{e}");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = check_target(&file).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }
}
