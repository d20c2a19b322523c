//! Corpora: the trees benchmarks run on, prepared once and cached.
//!
//! Cache layout (`--cache DIR`): `corpora/<key>/tree/` (the tree), `corpora/<key>/meta.json`
//! (its [`TreeStats`] and where it came from; present only when complete), and lazily
//! `corpora/<key>/repo.git` (a bare git repository holding the tree as one commit).
//! Entries are built under `<key>.partial-<pid>` and renamed into place, so an
//! interrupted preparation leaves nothing that looks complete.

pub mod rng;
pub mod synthetic;
pub mod walk;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cancel::DirGuard;
use crate::proc;
pub use walk::TreeStats;

/// What `--corpus` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorpusSpec {
    Synthetic(synthetic::Spec),
    Linux,
    Path(PathBuf),
}

impl CorpusSpec {
    pub fn parse(s: &str, files: u64, seed: u64) -> Result<Self> {
        Ok(match s {
            "synthetic" => CorpusSpec::Synthetic(synthetic::Spec { files, seed }),
            "linux" => CorpusSpec::Linux,
            p if p.contains('/') || Path::new(p).is_dir() => {
                let path = std::fs::canonicalize(p)
                    .with_context(|| format!("corpus directory {p} does not exist"))?;
                if !path.is_dir() {
                    bail!("corpus {} is not a directory", path.display());
                }
                CorpusSpec::Path(path)
            }
            other => bail!(
                "unknown corpus `{other}`: use synthetic, linux, or a directory path (containing a /)"
            ),
        })
    }

    /// The `--corpus` argument that reproduces this corpus.
    pub fn arg(&self) -> String {
        match self {
            CorpusSpec::Synthetic(_) => "synthetic".into(),
            CorpusSpec::Linux => "linux".into(),
            CorpusSpec::Path(p) => p.display().to_string(),
        }
    }
}

/// Metadata stored next to a cached tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CorpusMeta {
    pub key: String,
    pub kind: String,
    /// How the tree was made (generator version and seed, package and version, path).
    pub source: String,
    pub stats: TreeStats,
}

/// A prepared corpus.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub meta: CorpusMeta,
    pub tree: PathBuf,
    /// The cache entry (for the git repository); `None` for a user path.
    pub entry: Option<PathBuf>,
}

/// Why a corpus cannot be used on this host (reported as a skip, not a failure).
#[derive(Debug)]
pub struct CorpusUnavailable(pub String);

impl std::fmt::Display for CorpusUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CorpusUnavailable {}

/// Prepares (or finds in the cache) the corpus.
pub fn prepare(spec: &CorpusSpec, cache: &Path) -> Result<Corpus> {
    let corpora = cache.join("corpora");
    match spec {
        CorpusSpec::Synthetic(s) => cached(&corpora, &s.cache_key(), |tree| {
            eprintln!(
                "bench: generating synthetic corpus ({} files, seed {})…",
                s.files, s.seed
            );
            synthetic::generate(s, tree)?;
            Ok((
                "synthetic".into(),
                format!(
                    "bench synthetic generator v{} seed {} files {}",
                    synthetic::GENERATOR_VERSION,
                    s.seed,
                    s.files
                ),
            ))
        }),
        CorpusSpec::Linux => {
            let (tarball, version) = linux_source()?;
            cached(&corpora, &format!("linux-{version}"), |tree| {
                eprintln!("bench: extracting {} (once)…", tarball.display());
                let mut xz = Command::new("xz");
                xz.args(["-T0", "-dc"]).arg(&tarball);
                let mut tar = Command::new("tar");
                tar.args(["-x", "--strip-components=1", "-C"])
                    .arg(tree)
                    .arg("-f")
                    .arg("-");
                let sink = tree.with_extension("extract-log");
                // tar writes to the tree, nothing to stdout: route the pipe's "output" to a log.
                proc::pipe_to_file(&mut xz, &mut tar, &sink)?;
                let _ = std::fs::remove_file(&sink);
                Ok((
                    "linux".into(),
                    format!("{} (Debian package linux-source)", tarball.display()),
                ))
            })
        }
        CorpusSpec::Path(p) => {
            eprintln!("bench: hashing {}…", p.display());
            let stats = walk::tree_stats(p)?;
            Ok(Corpus {
                meta: CorpusMeta {
                    key: format!("path-{}", &stats.tree_hash[..12]),
                    kind: "path".into(),
                    source: p.display().to_string(),
                    stats,
                },
                tree: p.clone(),
                entry: None,
            })
        }
    }
}

/// The linux-source tarball and its version, or why it is unavailable.
fn linux_source() -> Result<(PathBuf, String)> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("linux-source-") && n.ends_with(".tar.xz"))
    });
    found.sort();
    let Some(tarball) = found.pop() else {
        return Err(CorpusUnavailable(
            "the Linux corpus needs the distribution's kernel source tarball \
             (/usr/src/linux-source-*.tar.xz), which is not installed; install it with: \
             apt-get install -y linux-source"
                .into(),
        )
        .into());
    };
    if proc::which("xz").is_none() {
        return Err(
            CorpusUnavailable("xz is not installed (apt-get install -y xz-utils)".into()).into(),
        );
    }
    let name = tarball
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let short = name
        .trim_start_matches("linux-source-")
        .trim_end_matches(".tar.xz");
    // The package version (e.g. 6.1.172-1) pins the exact tree; fall back to the file name.
    let pkg = format!("linux-source-{short}");
    let version = proc::run(Command::new("dpkg-query").args(["-W", "-f=${Version}", &pkg]))
        .ok()
        .map(|v| String::from_utf8_lossy(&v).trim().to_string())
        .filter(|v| !v.is_empty())
        .map_or_else(|| short.to_string(), |v| format!("{short}-{v}"));
    Ok((tarball, version))
}

fn cached(
    corpora: &Path,
    key: &str,
    build: impl FnOnce(&Path) -> Result<(String, String)>,
) -> Result<Corpus> {
    let entry = corpora.join(key);
    let meta_path = entry.join("meta.json");
    if let Ok(bytes) = std::fs::read(&meta_path) {
        let meta: CorpusMeta = serde_json::from_slice(&bytes)
            .with_context(|| format!("reading {}", meta_path.display()))?;
        return Ok(Corpus {
            meta,
            tree: entry.join("tree"),
            entry: Some(entry),
        });
    }
    if entry.exists() {
        // An entry without meta.json is incomplete (made by an older, interrupted run).
        crate::cancel::remove_tree(&entry)?;
    }
    let partial = DirGuard::create(corpora.join(format!("{key}.partial-{}", std::process::id())))?;
    let tree = partial.path().join("tree");
    std::fs::create_dir(&tree)?;
    let (kind, source) = build(&tree)?;
    crate::cancel::check()?;
    eprintln!("bench: hashing the corpus…");
    let stats = walk::tree_stats(&tree)?;
    let meta = CorpusMeta {
        key: key.to_string(),
        kind,
        source,
        stats,
    };
    std::fs::write(
        partial.path().join("meta.json"),
        serde_json::to_vec_pretty(&meta)?,
    )?;
    std::fs::rename(partial.path(), &entry)
        .with_context(|| format!("renaming into {}", entry.display()))?;
    partial.keep();
    Ok(Corpus {
        meta,
        tree: entry.join("tree"),
        entry: Some(entry),
    })
}

/// Removes `*.partial-<pid>` entries whose process is gone.
pub fn sweep_partials(cache: &Path) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(cache.join("corpora")) else {
        return Ok(());
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((_, pid)) = name.rsplit_once(".partial-")
            && let Ok(pid) = pid.parse::<u32>()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            eprintln!("bench: removing leftover {}", e.path().display());
            crate::cancel::remove_tree(&e.path())?;
        }
    }
    Ok(())
}

/// Fixed identity and settings for every git command bench runs: no user config,
/// no signing, no background maintenance racing the measurements. The repository's own
/// config still applies: in cowspace workspaces of an imported checkout that names
/// cowspace's fsmonitor hook (docs/git.md), which the baselines' checkouts do not.
pub fn git() -> Command {
    let mut c = Command::new("git");
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z")
        .args([
            "-c",
            "user.name=cowspace bench",
            "-c",
            "user.email=bench@cowspace.invalid",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
            "-c",
            "safe.directory=*",
        ]);
    // The hook runs the mountctl bench measures, which need not be on PATH.
    if let Some(m) = crate::mountctl::LOCATED.get() {
        c.env("COWSPACE_MOUNTCTL", m);
    }
    c
}

impl Corpus {
    /// The bare repository holding the tree as one commit (built once, cached).
    pub fn git_repo(&self, scratch: &Path) -> Result<PathBuf> {
        let base = self.entry.clone().unwrap_or_else(|| scratch.to_path_buf());
        let repo = base.join("repo.git");
        if repo.join("bench-complete").exists() {
            return Ok(repo);
        }
        crate::cancel::remove_tree(&repo)?;
        let partial =
            DirGuard::create(base.join(format!("repo.git.partial-{}", std::process::id())))?;
        eprintln!("bench: building the corpus' git repository (once)…");
        let gd = partial.path();
        proc::run(git().arg("init").arg("-q").arg("--bare").arg(gd))?;
        let with_tree = |c: &mut Command| {
            c.arg("--git-dir")
                .arg(gd)
                .arg("--work-tree")
                .arg(&self.tree);
        };
        let mut add = git();
        with_tree(&mut add);
        // -f: the repository must hold the whole tree even where the tree's own
        // .gitignore says otherwise (Debian's linux-source ignores `/*`).
        proc::run(add.args(["add", "-A", "-f"]))?;
        crate::cancel::check()?;
        let mut commit = git();
        with_tree(&mut commit);
        proc::run(commit.args(["commit", "-q", "-m", "corpus"]))?;
        let mut b = git();
        proc::run(b.arg("--git-dir").arg(gd).args(["branch", "-M", "main"]))?;
        // Packed, as a real clone would be.
        let mut gc = git();
        proc::run(
            gc.arg("--git-dir")
                .arg(gd)
                .args(["repack", "-a", "-d", "-q"]),
        )?;
        let mut prune = git();
        proc::run(prune.arg("--git-dir").arg(gd).args(["prune-packed"]))?;
        std::fs::write(gd.join("bench-complete"), b"")?;
        std::fs::rename(gd, &repo)?;
        partial.keep();
        Ok(repo)
    }

    /// A normal git checkout of the tree (the tree plus a standalone `.git` holding
    /// its one commit, packed; built once by cloning [`Corpus::git_repo`], cached):
    /// what a user's working copy looks like, and the source every materialize method
    /// copies, mounts or imports.
    pub fn git_checkout(&self, scratch: &Path) -> Result<PathBuf> {
        let repo = self.git_repo(scratch)?;
        let base = self.entry.clone().unwrap_or_else(|| scratch.to_path_buf());
        let co = base.join("checkout");
        if co.join(".git/bench-complete").exists() {
            return Ok(co);
        }
        crate::cancel::remove_tree(&co)?;
        let partial =
            DirGuard::create(base.join(format!("checkout.partial-{}", std::process::id())))?;
        eprintln!("bench: cloning the corpus' git checkout (once)…");
        proc::run(
            git()
                .args(["clone", "-q", "--no-hardlinks"])
                .arg(&repo)
                .arg(partial.path()),
        )?;
        std::fs::write(partial.path().join(".git/bench-complete"), b"")?;
        std::fs::rename(partial.path(), &co)?;
        partial.keep();
        Ok(co)
    }
}
