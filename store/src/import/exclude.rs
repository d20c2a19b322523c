//! The exclusion policy: which paths an import leaves out.
//!
//! - Default exclusions: directories of heavy, regenerable artifacts
//!   ([`DEFAULT_EXCLUDED_DIRS`]), unless git tracks a path under them.
//! - User patterns (`--exclude GLOB`): a pattern without `/` matches a name at any depth;
//!   with `/` it matches the path from the source root (a leading `/` is ignored); a
//!   trailing `/` restricts it to directories. `*` does not cross `/`; `**` does.
//! - Lockfiles and manifests ([`ALWAYS_KEPT_FILES`]) are never excluded by a pattern
//!   (they still go when their whole directory does).

use std::collections::{HashMap, HashSet};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{Error, Result};
use crate::id::TreeId;
use crate::snapshot::Policy;
use crate::store::Store;
use crate::tree::Kind;

/// Directory names excluded by default.
pub const DEFAULT_EXCLUDED_DIRS: &[&str] = &[
    "node_modules",
    "bower_components",
    "target",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".eggs",
    "dist",
    "build",
    "coverage",
    "htmlcov",
    ".nyc_output",
    ".next",
    ".nuxt",
    ".svelte-kit",
    ".turbo",
    ".parcel-cache",
    ".gradle",
    ".terraform",
    ".cache",
];

/// File names that no pattern excludes: lockfiles and manifests.
pub const ALWAYS_KEPT_FILES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "pyproject.toml",
    "poetry.lock",
    "uv.lock",
    "pdm.lock",
    "Pipfile",
    "Pipfile.lock",
    "requirements.txt",
    "setup.py",
    "setup.cfg",
    "go.mod",
    "go.sum",
    "Gemfile",
    "Gemfile.lock",
    "composer.json",
    "composer.lock",
    "mix.exs",
    "mix.lock",
    "flake.nix",
    "flake.lock",
    "pom.xml",
    "build.gradle",
    "build.gradle.kts",
    "gradle.lockfile",
    "Package.swift",
    "Package.resolved",
];

/// A compiled exclusion policy.
#[derive(Debug, Clone)]
pub struct Excluder {
    policy: Policy,
    names: GlobSet,
    paths: GlobSet,
    names_dir_only: GlobSet,
    paths_dir_only: GlobSet,
    /// Directories (root-relative, `/`-joined) that contain a git-tracked path.
    tracked_dirs: HashSet<Vec<u8>>,
}

impl Excluder {
    /// Compiles the policy; a malformed pattern is invalid input naming it.
    pub fn new(default_excludes: bool, patterns: &[String]) -> Result<Excluder> {
        let mut names = GlobSetBuilder::new();
        let mut paths = GlobSetBuilder::new();
        let mut names_dir = GlobSetBuilder::new();
        let mut paths_dir = GlobSetBuilder::new();
        for raw in patterns {
            let mut p = raw.as_str();
            if p.is_empty() {
                return Err(Error::Invalid("an empty --exclude pattern".into()));
            }
            let dir_only = p.ends_with('/') && p.len() > 1;
            if dir_only {
                p = &p[..p.len() - 1];
            }
            let anchored = p.contains('/');
            let p = p.trim_start_matches('/');
            let glob = GlobBuilder::new(p)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| Error::Invalid(format!("--exclude {raw:?}: {e}")))?;
            match (anchored, dir_only) {
                (false, false) => names.add(glob),
                (true, false) => paths.add(glob),
                (false, true) => names_dir.add(glob),
                (true, true) => paths_dir.add(glob),
            };
        }
        let build = |b: GlobSetBuilder| {
            b.build()
                .map_err(|e| Error::Invalid(format!("--exclude patterns: {e}")))
        };
        Ok(Excluder {
            policy: Policy {
                default_excludes,
                excludes: patterns.to_vec(),
                dirty: None,
            },
            names: build(names)?,
            paths: build(paths)?,
            names_dir_only: build(names_dir)?,
            paths_dir_only: build(paths_dir)?,
            tracked_dirs: HashSet::new(),
        })
    }

    /// Tells the policy which paths git tracks (so default exclusions spare them).
    pub fn set_tracked<'a>(&mut self, tracked: impl IntoIterator<Item = &'a [u8]>) {
        for path in tracked {
            let mut end = path.len();
            while let Some(i) = path[..end].iter().rposition(|&b| b == b'/') {
                if !self.tracked_dirs.insert(path[..i].to_vec()) {
                    break;
                }
                end = i;
            }
        }
    }

    /// The policy as recorded in the snapshot.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether to leave out the entry at `rel` (root-relative, `/`-joined) named `name`.
    pub fn excludes(&self, rel: &[u8], name: &[u8], is_dir: bool) -> bool {
        let name_s = String::from_utf8_lossy(name);
        let rel_s = String::from_utf8_lossy(rel);
        if is_dir {
            if self.policy.default_excludes
                && DEFAULT_EXCLUDED_DIRS.contains(&name_s.as_ref())
                && !self.tracked_dirs.contains(rel)
            {
                return true;
            }
            if self.names_dir_only.is_match(name_s.as_ref())
                || self.paths_dir_only.is_match(rel_s.as_ref())
            {
                return true;
            }
        } else if ALWAYS_KEPT_FILES.contains(&name_s.as_ref()) {
            return false;
        }
        self.names.is_match(name_s.as_ref()) || self.paths.is_match(rel_s.as_ref())
    }
}

/// A base snapshot's recorded exclusion policy applied to a workspace's changes, as
/// `commit` and `diff` do by default: a new path is left out when the policy excludes it
/// or a directory above it. What the base holds is never left out (the import kept it:
/// a directory git tracked, say), so a change to it is always captured.
#[derive(Debug)]
pub struct ChangeFilter {
    excluder: Excluder,
    root: TreeId,
    /// Directories decided so far: whether each is left out.
    dirs: HashMap<Vec<u8>, bool>,
    /// The paths left out, topmost only (as an import counts them).
    tops: HashSet<Vec<u8>>,
}

impl ChangeFilter {
    /// The filter of `policy` over the base tree `root`; `None` when the policy leaves
    /// nothing out.
    pub fn new(policy: &Policy, root: TreeId) -> Result<Option<ChangeFilter>> {
        if !policy.default_excludes && policy.excludes.is_empty() {
            return Ok(None);
        }
        Ok(Some(ChangeFilter {
            excluder: Excluder::new(policy.default_excludes, &policy.excludes)?,
            root,
            dirs: HashMap::new(),
            tops: HashSet::new(),
        }))
    }

    /// Whether the change at `path` (`/`-joined from the root) is left out; `is_dir`:
    /// whether it is a directory in the workspace.
    pub fn left_out(&mut self, store: &Store, path: &[u8], is_dir: bool) -> Result<bool> {
        let comps: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let Some((last, parents)) = comps.split_last() else {
            return Ok(false);
        };
        let mut prefix = Vec::with_capacity(path.len());
        for c in parents {
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(c);
            let out = match self.dirs.get(&prefix) {
                Some(&out) => out,
                None => {
                    // The pattern first: the base is read only for a name it excludes.
                    let out = self.excluder.excludes(&prefix, c, true)
                        && !self.in_base(store, &prefix)?;
                    self.dirs.insert(prefix.clone(), out);
                    out
                }
            };
            if out {
                self.tops.insert(prefix);
                return Ok(true);
            }
        }
        let whole = comps.join(&b'/');
        let out = self.excluder.excludes(&whole, last, is_dir) && !self.in_base(store, &whole)?;
        if out {
            self.tops.insert(whole);
        }
        Ok(out)
    }

    /// How many paths were left out so far (a directory counts once, not its content).
    pub fn left_out_count(&self) -> u64 {
        self.tops.len() as u64
    }

    /// Whether the base has an entry at `path`.
    fn in_base(&self, store: &Store, path: &[u8]) -> Result<bool> {
        let mut tree = store.tree(&self.root)?;
        let comps: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        for (i, c) in comps.iter().enumerate() {
            let Some(e) = tree.get(c) else {
                return Ok(false);
            };
            if i + 1 == comps.len() {
                return Ok(true);
            }
            match (e.kind, e.subtree()) {
                (Kind::Dir, Some(t)) => tree = store.tree(&t)?,
                _ => return Ok(false),
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_patterns() {
        let mut x = Excluder::new(
            true,
            &["*.log".into(), "/docs/gen/".into(), "a/*.tmp".into()],
        )
        .unwrap();
        assert!(x.excludes(b"node_modules", b"node_modules", true));
        assert!(x.excludes(b"web/node_modules", b"node_modules", true));
        assert!(
            !x.excludes(b"node_modules", b"node_modules", false),
            "only directories"
        );
        assert!(x.excludes(b"x/y.log", b"y.log", false));
        assert!(x.excludes(b"docs/gen", b"gen", true));
        assert!(!x.excludes(b"docs/gen", b"gen", false));
        assert!(x.excludes(b"a/b.tmp", b"b.tmp", false));
        assert!(
            !x.excludes(b"a/c/b.tmp", b"b.tmp", false),
            "* does not cross /"
        );
        assert!(!x.excludes(b"src/main.rs", b"main.rs", false));
        x.set_tracked([&b"build/keep.sh"[..]]);
        assert!(
            !x.excludes(b"build", b"build", true),
            "git tracks a path under it"
        );
        assert!(x.excludes(b"sub/build", b"build", true));
        let y = Excluder::new(false, &["*.lock".into()]).unwrap();
        assert!(!y.excludes(b"node_modules", b"node_modules", true));
        assert!(
            !y.excludes(b"Cargo.lock", b"Cargo.lock", false),
            "lockfiles are kept"
        );
        assert!(y.excludes(b"other.lock", b"other.lock", false));
    }

    #[test]
    fn bad_pattern_is_invalid_input() {
        let e = Excluder::new(true, &["a[".into()]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a["));
    }
}
