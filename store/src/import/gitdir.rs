//! A checkout whose `.git` is a file naming a repository outside it: a linked worktree
//! (`git worktree add`) or a checkout made with `--separate-git-dir`; or a symlink to
//! one.
//!
//! Its snapshot must hold the repository itself, never the path out of it: a workspace's
//! git would otherwise read and write the developer's repository (its index, its
//! branch), and inside a sandbox the path does not resolve at all. So the import puts a
//! `.git` directory where the file was, made of:
//!
//! - the repository's common directory (objects, refs, config, hooks), without what
//!   belongs to one worktree only: the main worktree's `HEAD` and other pseudo-refs,
//!   index, `logs/HEAD`, per-worktree refs, operation state and submodule repositories
//!   (`modules/`), and the other worktrees' directories (`worktrees/`);
//! - then the checkout's own git directory (its `HEAD`, index, per-worktree refs and
//!   logs, `config.worktree`), without the files that make it a linked one (`commondir`,
//!   `gitdir`, `locked`).
//!
//! The worktree's submodules keep their repositories in its git directory
//! (`modules/`); their `.git` files name them by paths that lead out of the tree, so each
//! is rewritten to name the snapshot's copy ([`LinkedGit::nested`]), and that
//! repository's `core.worktree` to the submodule's directory ([`with_worktree`]).
//!
//! Any checkout's import leaves out `.git/worktrees/` ([`Part::Tree`]), and a commit's
//! snapshot gets a checkout's repository the same way for `create --from-git --dirty
//! patch` (`Store::with_repository`).
//!
//! A workspace's `.git` is thus what `git clone` of the checkout would have made, with
//! the checkout's state: git in the workspace sees the same branch, index and history,
//! and what it writes stays in the workspace. The worktree of a bare repository gets
//! `core.bare = false` appended to its `.git/config` (the common config says `true`).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// Where the repository of a checkout with a `.git` file lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedGit {
    /// The checkout's own git directory (`HEAD`, `index`, ...).
    pub git_dir: PathBuf,
    /// The repository's common directory (objects, refs, config): `git_dir` itself for
    /// a separate git directory.
    pub common_dir: PathBuf,
}

impl LinkedGit {
    /// The repository's config as the snapshot's `.git/config` holds it, and whether
    /// that differs from the file: a bare repository's worktree gets [`NOT_BARE`].
    pub fn snapshot_config(&self) -> (String, bool) {
        let mut config = fs::read_to_string(self.config()).unwrap_or_default();
        if !is_bare(&self.config()) {
            return (config, false);
        }
        if !config.is_empty() && !config.ends_with('\n') {
            config.push('\n');
        }
        config.push_str(NOT_BARE);
        (config, true)
    }

    /// The index file git uses for the checkout.
    pub fn index(&self) -> PathBuf {
        self.git_dir.join("index")
    }

    /// The repository's config file.
    pub fn config(&self) -> PathBuf {
        self.common_dir.join("config")
    }
}

/// The repository `src/.git` names, when `src/.git` is a git file (`gitdir: PATH`) or a
/// symlink whose directory lies outside `src` (canonical). `None` for a `.git`
/// directory, no `.git`, or a git directory inside the tree (imported as it is).
pub fn linked_git(src: &Path) -> Result<Option<LinkedGit>> {
    linked_git_at(src, src)
}

/// [`linked_git`] of the checkout `dir` inside the tree `top` (canonical): `None` also
/// when the repository lies inside `top`.
pub fn linked_git_at(dir: &Path, top: &Path) -> Result<Option<LinkedGit>> {
    let dot = dir.join(".git");
    let named = match fs::symlink_metadata(&dot) {
        Ok(m) if m.is_file() => {
            let text = fs::read_to_string(&dot).map_err(Error::io("read", &dot))?;
            let Some(named) = text.strip_prefix("gitdir:") else {
                return Ok(None);
            };
            PathBuf::from(named.trim())
        }
        // A symlink to a repository elsewhere: git follows it, and so would a workspace.
        Ok(m) if m.file_type().is_symlink() => match fs::metadata(&dot) {
            Ok(t) if t.is_dir() => fs::read_link(&dot).map_err(Error::io("read link", &dot))?,
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let named = named.as_path();
    let unreadable = |what: &str, path: &Path, e: std::io::Error| {
        Error::Invalid(format!(
            "{} names the {what} {}, which cannot be read ({e}); run `git worktree repair` in the checkout, or leave it out (`--exclude .git`)",
            dot.display(),
            path.display()
        ))
    };
    let git_dir = dir.join(named);
    let git_dir =
        fs::canonicalize(&git_dir).map_err(|e| unreadable("git directory", &git_dir, e))?;
    if git_dir.starts_with(top) {
        return Ok(None);
    }
    let commondir = git_dir.join("commondir");
    let common_dir = match fs::read_to_string(&commondir) {
        Ok(c) => {
            let p = git_dir.join(c.trim());
            fs::canonicalize(&p).map_err(|e| unreadable("repository", &p, e))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => git_dir.clone(),
        Err(e) => return Err(Error::io("read", &commondir)(e)),
    };
    for dir in [&git_dir, &common_dir] {
        if !dir.join("HEAD").exists() && !dir.join("objects").is_dir() {
            return Err(unreadable(
                "git directory",
                dir,
                std::io::Error::other("it holds no repository"),
            ));
        }
    }
    Ok(Some(LinkedGit {
        git_dir,
        common_dir,
    }))
}

/// A part of an import: the tree, or one of the two directories that make its `.git`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The checkout, without `.git/worktrees` (the linked worktrees' state); `linked`: its
    /// `.git` file is left out too (the parts below replace it).
    Tree { linked: bool },
    /// The repository's common directory, walked first into `.git`.
    Common,
    /// The checkout's own git directory, walked last into `.git` (its files win).
    GitDir,
}

impl Part {
    /// Whether the entry at `inner` (components below the part's own root) is left out.
    pub fn leaves_out(self, inner: &[Vec<u8>]) -> bool {
        match self {
            // Other worktrees' state is not the tree's: a workspace has none of them.
            Part::Tree { linked } => match inner {
                [git] => linked && git == b".git",
                [git, w] => git == b".git" && w == b"worktrees",
                _ => false,
            },
            Part::Common => worktree_state(inner),
            Part::GitDir => {
                inner.len() == 1
                    && matches!(
                        inner[0].as_slice(),
                        b"commondir" | b"gitdir" | b"locked" | b"worktrees"
                    )
            }
        }
    }
}

/// Whether a path of a repository's common directory belongs to one worktree (the
/// main one): pseudo-refs (`HEAD`, `ORIG_HEAD`, `MERGE_MSG`, ...), the index, state of an
/// operation in progress, per-worktree refs and logs, and the linked worktrees'
/// directories.
pub fn worktree_state(inner: &[Vec<u8>]) -> bool {
    match inner {
        [top] => {
            matches!(
                top.as_slice(),
                b"index"
                    | b"modules"
                    | b"worktrees"
                    | b"config.worktree"
                    | b"sequencer"
                    | b"rebase-merge"
                    | b"rebase-apply"
            ) || top.starts_with(b"sharedindex.")
                || top.starts_with(b"index.")
                || (!top.is_empty() && top.iter().all(|&c| c.is_ascii_uppercase() || c == b'_'))
        }
        [a, b] => matches!(
            (a.as_slice(), b.as_slice()),
            (b"logs", b"HEAD")
                | (b"refs", b"bisect" | b"worktree" | b"rewritten")
                | (b"info", b"sparse-checkout")
        ),
        [a, b, c] => {
            a == b"logs" && b == b"refs" && matches!(c.as_slice(), b"bisect" | b"worktree")
        }
        _ => false,
    }
}

/// The repository of the checkout at `top`, for any checkout: its `.git` directory (also
/// its common directory), or the one a `.git` file names (see [`linked_git`]). `None`
/// when `top` has no `.git`.
pub fn repository_of(top: &Path) -> Result<Option<LinkedGit>> {
    let dot = top.join(".git");
    match fs::symlink_metadata(&dot) {
        Ok(m) if m.is_dir() => Ok(Some(LinkedGit {
            git_dir: dot.clone(),
            common_dir: dot,
        })),
        Ok(m) if m.is_file() => {
            let top = fs::canonicalize(top).map_err(Error::io("resolve", top))?;
            linked_git(&top)
        }
        _ => Ok(None),
    }
}

impl crate::Store {
    /// A snapshot of `base` with the repository `repo` as its `.git` directory (what a
    /// linked worktree's import makes of it, see the module doc), whose parent is `base`:
    /// for a workspace of a commit that is to be a git work tree (`create --from-git
    /// --dirty patch`). `top` is the checkout `base` was made from; with
    /// `opts.served_identity` (and `opts.git_fsmonitor`), the index entries git trusted
    /// there are made to agree with what workspaces serve of `base`, as a directory
    /// import does (docs/git.md). `opts.message` is the new snapshot's message.
    pub fn with_repository(
        &self,
        base: &crate::SnapshotId,
        top: &Path,
        repo: &LinkedGit,
        opts: &crate::ImportOptions,
    ) -> Result<crate::ImportReport> {
        let started_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let snap = self.snapshot(base)?;
        let top = fs::canonicalize(top).map_err(Error::io("resolve", top))?;
        // The rows of the checkout's stat cache: a directory import of it keeps the
        // same paths under `.git`, so either reads an unchanged file once.
        // (Loaded once the edit holds the store lock: gc keeps what the rows name.)
        let mut ed = self.edit(base)?;
        let root_key = top.to_string_lossy().into_owned();
        let cache = self.with_reader(|c| crate::statcache::load(c, &root_key))?;
        let mut known = Known {
            cache,
            started_ns,
            read: Vec::new(),
        };
        let meta = fs::metadata(&repo.common_dir).map_err(Error::io("stat", &repo.common_dir))?;
        let xattrs = crate::xattrs::read_xattrs(&repo.common_dir)?;
        ed.clear_dir(b".git", meta.mode(), xattrs)?;
        if repo.common_dir != repo.git_dir {
            put_tree(&mut ed, &repo.common_dir, Part::Common, &mut known)?;
        }
        put_tree(&mut ed, &repo.git_dir, Part::GitDir, &mut known)?;
        let mode_of = |p: &Path| fs::metadata(p).map_or(0o644, |m| m.mode());
        let (mut config, mut config_changed) = repo.snapshot_config();
        let mut token = None;
        if let Some(served) = &opts.served_identity {
            let mut entries = std::collections::HashMap::new();
            served_entries(self, &snap.root, &mut vec![], &mut entries)?;
            let git = crate::import::refresh::GitFiles {
                index: repo.index(),
                config: config.clone(),
            };
            let hook = opts.git_fsmonitor.as_deref();
            let entry_at = |comps: &[Vec<u8>]| entries.get(comps).cloned();
            let refreshed =
                crate::import::refresh::refreshed_index(&top, &git, true, served, hook, entry_at);
            if let Some(r) = refreshed {
                ed.put_bytes(b".git/index", &r.index, mode_of(&repo.index()))?;
                if let Some(text) = r.config {
                    config = text;
                    config_changed = true;
                }
                token = r.token;
            }
        }
        if config_changed {
            ed.put_bytes(b".git/config", config.as_bytes(), mode_of(&repo.config()))?;
        }
        ed.set_git_fsmonitor(token);
        let contents = ed.read_contents()?;
        let rows = known
            .read
            .into_iter()
            .filter_map(|(path, stamp, n)| {
                let c = contents.get(n).copied().flatten()?;
                (c.size == stamp.size).then_some((path, stamp, c.id, None))
            })
            .collect();
        ed.record_stat_cache(root_key, rows);
        ed.commit(&opts.message, snap.source, None)
    }
}

/// The entries of the tree `id` (at `prefix`) an index entry can agree with, by path, in
/// the form the index rewrite compares (see [`crate::import::gitindex::served_entry`]).
fn served_entries(
    store: &crate::Store,
    id: &crate::TreeId,
    prefix: &mut Vec<Vec<u8>>,
    out: &mut std::collections::HashMap<Vec<Vec<u8>>, crate::tree::Entry>,
) -> Result<()> {
    use crate::import::gitindex::{served_entry, served_symlink};
    use crate::tree::Kind;
    for e in store.tree(id)?.entries {
        prefix.push(e.name.clone());
        match e.kind {
            Kind::Dir => {
                if let Some(t) = e.subtree() {
                    served_entries(store, &t, prefix, out)?;
                }
            }
            Kind::File | Kind::Hardlink => {
                let entry = served_entry(&e.name, e.mode, e.size, e.hash);
                out.insert(prefix.clone(), entry);
            }
            Kind::Symlink => {
                out.insert(prefix.clone(), served_symlink(&e.name, &e.data));
            }
            _ => {}
        }
        prefix.pop();
    }
    Ok(())
}

/// Files of a `.git` being put, and what the stat cache knew of them: the cache of the
/// checkout's root (the same rows a directory import of it keeps), and the files read
/// (path, stamp, content number) for the rows to record.
struct Known {
    cache: crate::statcache::Entries,
    started_ns: i64,
    read: Vec<(Vec<u8>, crate::statcache::Stamp, usize)>,
}

/// Puts the directory `root` into the edit at `.git`, leaving out what `part` leaves out;
/// files whose stamp the stat cache holds are not read again.
fn put_tree(ed: &mut crate::Editor<'_>, root: &Path, part: Part, known: &mut Known) -> Result<()> {
    use crate::statcache::Stamp;
    use std::os::unix::ffi::OsStrExt;
    let mut stack: Vec<(std::path::PathBuf, Vec<Vec<u8>>)> = vec![(root.to_path_buf(), vec![])];
    while let Some((dir, inner)) = stack.pop() {
        let rd = fs::read_dir(&dir).map_err(Error::io("read directory", &dir))?;
        for e in rd {
            let e = e.map_err(Error::io("read directory", &dir))?;
            let mut comps = inner.clone();
            comps.push(e.file_name().as_bytes().to_vec());
            if part.leaves_out(&comps) {
                continue;
            }
            let abs = e.path();
            let path = [b".git".as_slice(), b"/", &comps.join(&b'/')].concat();
            let meta = e.metadata().map_err(Error::io("stat", &abs))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                ed.put_dir(&path, meta.mode(), crate::xattrs::read_xattrs(&abs)?)?;
                stack.push((abs, comps));
            } else if ft.is_file() {
                let xattrs = crate::xattrs::read_xattrs(&abs)?;
                let stamp = Stamp::of(&meta);
                match known.cache.get(&path) {
                    Some(c) if c.stamp == stamp => {
                        let content = crate::FileContent {
                            id: c.content,
                            size: stamp.size,
                        };
                        ed.put_stored_file(&path, content, meta.mode(), xattrs)?;
                    }
                    _ => {
                        let n = ed.put_file_read(&path, abs, meta.mode(), xattrs, None)?;
                        if !stamp.is_racy(known.started_ns) {
                            known.read.push((path, stamp, n));
                        }
                    }
                }
            } else if ft.is_symlink() {
                let target = fs::read_link(&abs).map_err(Error::io("read link", &abs))?;
                ed.put_symlink(&path, target.as_os_str().as_bytes().to_vec(), vec![])?;
            }
            // Sockets, fifos and devices have no place in a git directory.
        }
    }
    Ok(())
}

/// A submodule's `.git` file inside a linked checkout, made to name the submodule's
/// repository where the snapshot's `.git` holds it: its new content, and the fix its
/// repository's config needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestedGitFile {
    /// The file's new content (`gitdir: ` and a path relative to its directory).
    pub content: String,
    /// The submodule's repository, relative to the checkout's git directory (and so to
    /// the snapshot's `.git`): e.g. `modules/sub`.
    pub repo: Vec<Vec<u8>>,
    /// `core.worktree` for that repository's config: the submodule's directory, relative
    /// to the repository as the snapshot holds it.
    pub worktree: String,
}

impl LinkedGit {
    /// What the `.git` file at `at` (components from the checkout's top; `file` its path
    /// on the host) becomes when it names a repository inside the checkout's own git
    /// directory (a submodule's, under `modules/`), which the snapshot holds in `.git`.
    /// `None` for any other file (kept as it is).
    pub fn nested(&self, file: &Path, at: &[Vec<u8>]) -> Option<NestedGitFile> {
        use std::os::unix::ffi::OsStrExt;
        let text = fs::read_to_string(file).ok()?;
        let named = Path::new(text.strip_prefix("gitdir:")?.trim());
        let target = fs::canonicalize(file.parent()?.join(named)).ok()?;
        let rel = target.strip_prefix(&self.git_dir).ok()?;
        let repo: Vec<Vec<u8>> = rel
            .components()
            .map(|c| c.as_os_str().as_bytes().to_vec())
            .collect();
        if repo.is_empty() || at.len() < 2 {
            return None;
        }
        let dir = &at[..at.len() - 1];
        let join = |c: &[Vec<u8>]| String::from_utf8_lossy(&c.join(&b'/')).into_owned();
        Some(NestedGitFile {
            content: format!("gitdir: {}.git/{}\n", "../".repeat(dir.len()), join(&repo)),
            worktree: format!("{}{}", "../".repeat(repo.len() + 1), join(dir)),
            repo,
        })
    }
}

/// `config` (a git config file's text) with `core.worktree` set to `value`, as git
/// writes it; `None` when git cannot.
pub fn with_worktree(config: &str, value: &str, tmp: &Path) -> Option<String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    fs::create_dir_all(tmp).ok()?;
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = tmp.join(format!("submodule-config.{}.{n}", std::process::id()));
    fs::write(&path, config).ok()?;
    let ok = Command::new("git")
        .args(["config", "--file"])
        .arg(&path)
        .args(["core.worktree", value])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let text = fs::read_to_string(&path).ok();
    let _ = fs::remove_file(&path);
    text.filter(|_| ok)
}

/// The lines appended to the `.git/config` of a bare repository's worktree.
pub const NOT_BARE: &str = "# cowspace: the worktree of a bare repository, made a repository of its own\n[core]\n\tbare = false\n";

/// Whether the config file at `path` makes its repository bare (`core.bare`), as git
/// reads it. False when git cannot say.
pub fn is_bare(config: &Path) -> bool {
    Command::new("git")
        .args(["config", "--file"])
        .arg(config)
        .args(["--type=bool", "--get", "core.bare"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii() == b"true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<Vec<u8>> {
        s.split('/').map(|c| c.as_bytes().to_vec()).collect()
    }

    #[test]
    fn one_worktree_state_is_told_from_the_repository() {
        for s in [
            "HEAD",
            "ORIG_HEAD",
            "FETCH_HEAD",
            "MERGE_MSG",
            "COMMIT_EDITMSG",
            "index",
            "index.lock",
            "sharedindex.0123",
            "worktrees",
            "modules",
            "config.worktree",
            "rebase-merge",
            "logs/HEAD",
            "refs/bisect",
            "refs/worktree",
            "logs/refs/bisect",
            "info/sparse-checkout",
        ] {
            assert!(worktree_state(&p(s)), "{s}");
        }
        for s in [
            "objects",
            "refs",
            "refs/heads",
            "refs/heads/HEAD_LIKE",
            "logs",
            "logs/refs/heads/main",
            "packed-refs",
            "config",
            "hooks",
            "info/exclude",
            "shallow",
            "description",
        ] {
            assert!(!worktree_state(&p(s)), "{s}");
        }
        assert!(Part::GitDir.leaves_out(&p("commondir")));
        assert!(Part::GitDir.leaves_out(&p("gitdir")));
        assert!(!Part::GitDir.leaves_out(&p("HEAD")));
        assert!(!Part::GitDir.leaves_out(&p("logs/HEAD")));
        assert!(Part::Tree { linked: true }.leaves_out(&p(".git")));
        assert!(!Part::Tree { linked: false }.leaves_out(&p(".git")));
        assert!(!Part::Tree { linked: true }.leaves_out(&p("d/.git")));
        assert!(Part::Tree { linked: false }.leaves_out(&p(".git/worktrees")));
        assert!(!Part::Tree { linked: false }.leaves_out(&p(".git/objects")));
        assert!(!Part::Tree { linked: false }.leaves_out(&p("d/.git/worktrees")));
    }

    #[test]
    fn a_submodule_of_a_linked_checkout_names_the_snapshot_s_git() {
        let tmp = tempfile::tempdir().unwrap();
        let tmp = fs::canonicalize(tmp.path()).unwrap();
        let wt_dir = tmp.join("main/.git/worktrees/wt");
        fs::create_dir_all(wt_dir.join("modules/lib/modules/inner")).unwrap();
        let l = LinkedGit {
            git_dir: wt_dir.clone(),
            common_dir: tmp.join("main/.git"),
        };
        let top = tmp.join("wt");
        fs::create_dir_all(top.join("ext/lib/inner")).unwrap();
        fs::write(
            top.join("ext/lib/.git"),
            "gitdir: ../../../main/.git/worktrees/wt/modules/lib\n",
        )
        .unwrap();
        let at = |s: &str| {
            s.split('/')
                .map(|c| c.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        let n = l
            .nested(&top.join("ext/lib/.git"), &at("ext/lib/.git"))
            .unwrap();
        assert_eq!(n.content, "gitdir: ../../.git/modules/lib\n");
        assert_eq!(n.repo, at("modules/lib"));
        assert_eq!(n.worktree, "../../../ext/lib");
        // Nested one level more, with an absolute path.
        let inner = wt_dir.join("modules/lib/modules/inner");
        fs::write(
            top.join("ext/lib/inner/.git"),
            format!("gitdir: {}\n", inner.display()),
        )
        .unwrap();
        let n = l
            .nested(&top.join("ext/lib/inner/.git"), &at("ext/lib/inner/.git"))
            .unwrap();
        assert_eq!(
            n.content,
            "gitdir: ../../../.git/modules/lib/modules/inner\n"
        );
        assert_eq!(n.worktree, "../../../../../ext/lib/inner");
        // A repository elsewhere is left as it is.
        fs::create_dir_all(tmp.join("other")).unwrap();
        fs::write(top.join("ext/lib/.git"), "gitdir: ../../../other\n").unwrap();
        assert_eq!(
            l.nested(&top.join("ext/lib/.git"), &at("ext/lib/.git")),
            None
        );

        let config = "[core]\n\tbare = false\n\tworktree = ../../../../../../wt/ext/lib\n";
        let fixed = with_worktree(config, "../../../ext/lib", &tmp.join("t")).unwrap();
        assert!(fixed.contains("worktree = ../../../ext/lib\n"), "{fixed}");
        assert!(!fixed.contains("wt/ext"), "{fixed}");
    }

    #[test]
    fn a_git_file_naming_a_directory_outside_is_linked() {
        let tmp = tempfile::tempdir().unwrap();
        let tmp = fs::canonicalize(tmp.path()).unwrap();
        let common = tmp.join("repo.git");
        let wt_dir = common.join("worktrees/wt");
        fs::create_dir_all(common.join("objects")).unwrap();
        fs::create_dir_all(&wt_dir).unwrap();
        fs::write(common.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(wt_dir.join("HEAD"), "ref: refs/heads/wt\n").unwrap();
        fs::write(wt_dir.join("commondir"), "../..\n").unwrap();
        let src = tmp.join("wt");
        fs::create_dir_all(&src).unwrap();
        assert_eq!(linked_git(&src).unwrap(), None, "no .git");
        fs::write(src.join(".git"), format!("gitdir: {}\n", wt_dir.display())).unwrap();
        let l = linked_git(&src).unwrap().unwrap();
        assert_eq!(l.git_dir, wt_dir);
        assert_eq!(l.common_dir, common);
        assert_eq!(l.index(), wt_dir.join("index"));

        // Relative, and a separate git dir (no commondir).
        fs::write(src.join(".git"), "gitdir: ../repo.git\n").unwrap();
        let l = linked_git(&src).unwrap().unwrap();
        assert_eq!(
            (l.git_dir.clone(), l.common_dir),
            (common.clone(), common.clone())
        );

        // Inside the tree: imported as it is.
        fs::create_dir_all(src.join("modules/x/objects")).unwrap();
        fs::write(src.join(".git"), "gitdir: modules/x\n").unwrap();
        assert_eq!(linked_git(&src).unwrap(), None);

        // Gone: a clear error with the fix.
        fs::write(src.join(".git"), "gitdir: /nonexistent/wt\n").unwrap();
        let e = linked_git(&src).unwrap_err().to_string();
        assert!(
            e.contains("/nonexistent/wt") && e.contains("git worktree repair"),
            "{e}"
        );

        // Not a git file at all.
        fs::write(src.join(".git"), "something else\n").unwrap();
        assert_eq!(linked_git(&src).unwrap(), None);

        // A symlink to the repository, relative or not; to a file, nothing.
        fs::remove_file(src.join(".git")).unwrap();
        std::os::unix::fs::symlink("../repo.git", src.join(".git")).unwrap();
        let l = linked_git(&src).unwrap().unwrap();
        assert_eq!(
            (l.git_dir.clone(), l.common_dir),
            (common.clone(), common.clone())
        );
        fs::remove_file(src.join(".git")).unwrap();
        std::os::unix::fs::symlink(common.join("HEAD"), src.join(".git")).unwrap();
        assert_eq!(linked_git(&src).unwrap(), None);
    }
}
