//! Import of a git revision, read with the `git` program (and loose objects directly).
//!
//! `git rev-parse --verify REV^{commit}` resolves the revision; `git ls-tree -r -z
//! --full-tree COMMIT` lists every tracked path with its mode and object id; blobs that
//! are loose objects are read by the ingest workers themselves ([`gitloose`], all cores);
//! the other contents come from one long-running `git cat-file --batch`, fed object ids by a
//! writer thread while this thread reads the answers (so neither pipe can fill up and
//! stall the other side) and streams each blob into the ingest pipeline. No working
//! tree or index is read or touched; bare repositories work. A blob whose content the
//! store holds from an earlier import (the `gitblobs` table: git blob id → content,
//! pruned by gc with the content; `gitlinks`: git blob id → symlink target) is not
//! asked for at all.
//!
//! Git has no empty directories and no hard links; a submodule (gitlink) is left out
//! with a warning. Every tracked path is kept, even under a directory the default
//! policy excludes (git tracks it); user `--exclude` patterns still apply.

use std::collections::HashMap;

use rusqlite::OptionalExtension;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::import::exclude::Excluder;
use crate::import::gitplan::{Plan, Uses, build_tree, parse_ls_tree, plan};
use crate::import::tar::PathFilter;
use crate::import::{Finish, ImportOptions, ImportReport, Progress};
use crate::import::{gitloose, gitpack};
use crate::ingest::{FileContent, FileJob, Ingest};
use crate::lock::StoreLock;
use crate::snapshot::Source;
use crate::store::Store;
use crate::tree;

/// Longest `cat-file --batch` header line accepted (`<oid> <type> <size>\n`).
const MAX_BATCH_HEADER_BYTES: u64 = 512;

/// A `git` command for `repo`: no system config, no pager, English messages, no
/// environment from a calling git (hooks) redirecting it, no discovery above `repo`.
fn git(repo: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("--no-pager")
        .arg("-C")
        .arg(repo)
        .args(["-c", "core.quotepath=off"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PAGER", "cat")
        .env("LC_ALL", "C");
    for v in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
    ] {
        c.env_remove(v);
    }
    if let Some(parent) = repo.parent() {
        c.env("GIT_CEILING_DIRECTORIES", parent);
    }
    c
}

fn spawn_error(e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::NotFound {
        Error::Unsupported(
            "the `git` program is not installed (or not on PATH); importing a git revision needs it"
                .into(),
        )
    } else {
        Error::io("run", "git")(e)
    }
}

/// Runs a git command to completion; a failure is `Error::Git` with git's stderr.
fn run(repo: &Path, step: &'static str, args: &[&str]) -> Result<Vec<u8>> {
    let out = git(repo).args(args).output().map_err(spawn_error)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(Error::Git {
            step,
            repo: repo.to_path_buf(),
            why: if stderr.is_empty() {
                format!("git exited with {}", out.status)
            } else {
                stderr
            },
        });
    }
    Ok(out.stdout)
}

/// A running `git cat-file --batch`: a writer thread feeds it ids, this side reads.
/// Dropped early (an error), it kills the process and joins its threads.
struct CatFile {
    repo: PathBuf,
    child: Child,
    out: BufReader<ChildStdout>,
    writer: Option<JoinHandle<io::Result<()>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    done: bool,
}

impl CatFile {
    fn start(repo: &Path, oids: Vec<String>) -> Result<CatFile> {
        let mut child = git(repo)
            .args(["cat-file", "--batch", "--buffer"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Git {
                step: "start cat-file",
                repo: repo.to_path_buf(),
                why: "its standard input, output and error are not all pipes".into(),
            });
        };
        let writer = std::thread::Builder::new()
            .name("cowspace-git-feed".into())
            .spawn(move || -> io::Result<()> {
                let mut w = io::BufWriter::new(stdin);
                for oid in oids {
                    w.write_all(oid.as_bytes())?;
                    w.write_all(b"\n")?;
                }
                w.flush()
            })
            .map_err(Error::io("start thread", "git feed"))?;
        let stderr = std::thread::Builder::new()
            .name("cowspace-git-stderr".into())
            .spawn(move || {
                let mut buf = Vec::new();
                let _ = stderr.read_to_end(&mut buf);
                buf
            })
            .map_err(Error::io("start thread", "git stderr"))?;
        Ok(CatFile {
            repo: repo.to_path_buf(),
            child,
            out: BufReader::with_capacity(1 << 20, stdout),
            writer: Some(writer),
            stderr: Some(stderr),
            done: false,
        })
    }

    fn error(&self, why: String) -> Error {
        Error::Git {
            step: "read objects",
            repo: self.repo.clone(),
            why,
        }
    }

    fn io_error(&self, e: io::Error) -> Error {
        self.error(format!("reading git cat-file output: {e}"))
    }

    /// Reads the header of the next answer, which must be the blob `oid`; returns its size.
    fn next_blob(&mut self, oid: &str) -> Result<u64> {
        let mut line = Vec::new();
        (&mut self.out)
            .take(MAX_BATCH_HEADER_BYTES)
            .read_until(b'\n', &mut line)
            .map_err(|e| self.io_error(e))?;
        if line.pop() != Some(b'\n') {
            return Err(self.error(format!("git cat-file stopped before answering for {oid}")));
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            [o, "blob", size] if *o == oid => size
                .parse()
                .map_err(|_| self.error(format!("unexpected cat-file header {line:?}"))),
            [o, "missing"] if *o == oid => Err(self.error(format!(
                "object {oid} is missing from the repository (a shallow or partial clone?)"
            ))),
            _ => Err(self.error(format!(
                "unexpected cat-file header {line:?} (asked for blob {oid})"
            ))),
        }
    }

    /// Consumes the newline that ends an answer.
    fn end_blob(&mut self) -> Result<()> {
        let mut nl = [0u8; 1];
        self.out.read_exact(&mut nl).map_err(|e| self.io_error(e))?;
        if nl != *b"\n" {
            return Err(self.error("answer not terminated by a newline".into()));
        }
        Ok(())
    }

    /// Waits for git to exit after every answer was read.
    fn finish(mut self) -> Result<()> {
        self.done = true;
        let fed = self.writer.take().map(|w| w.join());
        let status = self.child.wait().map_err(Error::io("wait for", "git"))?;
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let fed_ok = matches!(fed, Some(Ok(Ok(()))));
        if !status.success() || !fed_ok {
            return Err(self.error(format!(
                "git cat-file failed ({status}): {}",
                String::from_utf8_lossy(&stderr).trim()
            )));
        }
        Ok(())
    }
}

impl Drop for CatFile {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
    }
}

impl Store {
    /// Imports revision `rev` of the git repository at `repo` (bare or not) as a new
    /// snapshot, reading objects with the `git` program. No working tree is touched.
    pub fn import_git(&self, repo: &Path, rev: &str, opts: &ImportOptions) -> Result<ImportReport> {
        let started = Instant::now();
        let (repo, commit) = resolve_commit(repo, rev, opts)?;
        let listing = run(
            &repo,
            "list tree",
            // (No `-l`: a size costs git a look at each blob, 1.2 s for the Linux tree's
            // loose objects, and `cat-file` says it for those read.)
            &["ls-tree", "-r", "-z", "--full-tree", &commit],
        )?;
        let lines = parse_ls_tree(&listing).map_err(|why| Error::Git {
            step: "list tree",
            repo: repo.clone(),
            why,
        })?;

        // Git tracks every path listed: the default exclusions spare them all.
        let mut excluder = Excluder::new(opts.default_excludes, &opts.excludes)?;
        excluder.set_tracked(lines.iter().map(|l| l.path.as_slice()));
        let mut filter = PathFilter::new(&excluder);
        let repo_name = repo.display().to_string();
        let unsafe_entry = |path: &[u8], why: String| Error::UnsafeEntry {
            archive: format!("{repo_name} at {commit}"),
            entry: String::from_utf8_lossy(path).into_owned(),
            why,
        };
        let Plan {
            planned,
            uses,
            mut order,
            warnings,
        } = plan(lines, &mut filter, &unsafe_entry)?;

        let _lock = StoreLock::shared(self)?;
        // What interrupted imports stored is found stored, not compressed again.
        let resumed = self.adopt_orphans()?;
        // Blobs stored before, by their git id: not read again (the lock keeps gc, which
        // forgets ids whose content it deletes, away until the commit).
        let (mut contents, mut targets) = self.with_reader(|c| {
            let files = order.iter().map(|(o, _)| o).filter(|o| uses[*o].file);
            let links = order.iter().map(|(o, _)| o).filter(|o| uses[*o].link);
            Ok((known_blobs(c, files)?, known_links(c, links)?))
        })?;
        order.retain(|(o, _)| {
            let u = uses[o];
            (u.file && !contents.contains_key(o)) || (u.link && !targets.contains_key(o))
        });
        // Dropped unfinished on any error below: the session's packs are removed.
        let mut ingest = Ingest::start(self)?;
        let total = planned.len() as u64;
        let mut bytes_done = 0u64;
        let mut files_done = 0u64;
        let mut done = |bytes: u64| {
            files_done += 1;
            bytes_done += bytes;
            if let Some(p) = &opts.progress {
                p(Progress {
                    files_done,
                    files_total: total,
                    bytes_done,
                });
            }
        };
        let mut read = Reading {
            repo: &repo,
            order: &order,
            uses: &uses,
            ingest: &mut ingest,
            contents: &mut contents,
            done: &mut done,
        };
        read.with_workers()?;
        read.with_cat_file(&mut targets)?;
        let learned: Vec<(Vec<u8>, FileContent)> = order
            .iter()
            .filter_map(|(o, _)| Some((hex::decode(o).ok()?, *contents.get(o)?)))
            .collect();
        let learned_links: Vec<(Vec<u8>, Vec<u8>)> = order
            .iter()
            .filter_map(|(o, _)| Some((hex::decode(o).ok()?, targets.get(o)?.clone())))
            .collect();
        let builder = build_tree(planned, &contents, &targets, &unsafe_entry)?;

        let finish = Finish {
            builder,
            slots: Vec::new(),
            source: Source::Git {
                repo: repo_name.clone(),
                rev: rev.to_string(),
                commit: commit.clone(),
            },
            policy: excluder.policy().clone(),
            excluded: filter.excluded,
            files_read: order.len() as u64,
            warnings,
            started,
            opts,
            git_fsmonitor: None,
            resumed,
        };
        finish.run(self, ingest, |tx| {
            record_blobs(tx, &learned)?;
            record_links(tx, &learned_links)
        })
    }
}

/// Checks the input of [`Store::import_git`] (before anything is read or created) and
/// resolves `rev`: the repository's canonical path and the commit's id (hex).
fn resolve_commit(repo: &Path, rev: &str, opts: &ImportOptions) -> Result<(PathBuf, String)> {
    match std::fs::metadata(repo) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::Invalid(format!(
                "{} is not a directory (a git repository is)",
                repo.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::SourceMissing(repo.to_path_buf()));
        }
        Err(e) => return Err(Error::io("stat", repo)(e)),
    }
    let repo = std::fs::canonicalize(repo).map_err(Error::io("resolve", repo))?;
    if rev.is_empty() || rev.starts_with('-') || rev.contains(['\0', '\n']) {
        return Err(Error::Invalid(format!(
            "{rev:?} is not a usable git revision"
        )));
    }
    if let Some(name) = &opts.ref_name {
        crate::refs::check_ref_name(name)?;
    }
    let spec = format!("{rev}^{{commit}}");
    let commit =
        run(&repo, "resolve revision", &["rev-parse", "--verify", &spec]).map_err(|e| match e {
            Error::Git { step, repo, why } => Error::Git {
                step,
                repo,
                why: format!("{rev:?} does not name a commit here: {why}"),
            },
            e => e,
        })?;
    let commit = String::from_utf8_lossy(&commit).trim().to_string();
    if commit.is_empty() || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Git {
            step: "resolve revision",
            repo,
            why: format!("unexpected rev-parse output {commit:?}"),
        });
    }
    Ok((repo, commit))
}

/// Reading the blobs a revision needs and the store does not hold (`order`) into the
/// ingest session.
struct Reading<'a, 's, D: FnMut(u64)> {
    repo: &'a Path,
    order: &'a [(String, Option<u64>)],
    uses: &'a HashMap<String, Uses>,
    ingest: &'a mut Ingest<'s>,
    /// Files' contents, by blob id: filled as they are stored.
    contents: &'a mut HashMap<String, FileContent>,
    /// Called with each blob's size once it is stored (the progress).
    done: &'a mut D,
}

impl<D: FnMut(u64)> Reading<'_, '_, D> {
    /// Files' blobs are read on the ingest workers, in the tree's order (a worker
    /// groups the small files it reads together, `crate::group`, and a directory's
    /// files compress better together than files in the order of their ids: Linux
    /// tree, 236.4 MiB stored in id order, 223.6 MiB as from the directory): loose
    /// ones without git (`gitloose`), the others (packed, or behind an alternate)
    /// through `gix-odb` (`gitpack`). What is not found there (a loose object a
    /// concurrent `git gc` packed meanwhile, one `gix-odb` does not have) and every
    /// symlink target come from `git cat-file` ([`Reading::with_cat_file`]); so does
    /// everything when the repository has replacement objects (`git replace`), which
    /// `cat-file` applies.
    fn with_workers(&mut self) -> Result<()> {
        let replaced = !run(
            self.repo,
            "list replacement objects",
            &["for-each-ref", "--count=1", "refs/replace/"],
        )?
        .is_empty();
        let Some(objects) = object_dir(self.repo).filter(|_| !replaced) else {
            return Ok(());
        };
        let files: Vec<(usize, &str)> = self
            .order
            .iter()
            .enumerate()
            .filter_map(|(i, (o, _))| {
                let u = self.uses[o];
                (u.file && !u.link).then_some((i, o.as_str()))
            })
            .collect();
        let mut loose: HashMap<usize, gitloose::Found> =
            gitloose::find(&objects, files.iter().copied())
                .into_iter()
                .map(|f| (f.index, f))
                .collect();
        let odb = gitpack::Odb::open(&objects);
        for (i, o) in files {
            let (path, at, git_object) = match (loose.remove(&i), &odb) {
                (Some(f), _) => (f.path, Some((f.dir, f.name)), None),
                (None, Some(odb)) => match gix_hash::ObjectId::from_hex(o.as_bytes()) {
                    Ok(oid) => {
                        let odb = odb.clone();
                        let path = self.repo.join(format!("<object {o}>"));
                        (path, None, Some(gitpack::Wanted { odb, oid }))
                    }
                    Err(_) => continue,
                },
                (None, None) => continue,
            };
            let job = FileJob {
                slot: i,
                path,
                git_loose: at.is_some(),
                at,
                xattrs: false,
                git_object,
            };
            self.ingest.submit(job, 0)?;
            while let Some((i, r)) = self.ingest.next_result(false) {
                blob_arrived(&self.order[i].0, r, self.contents, self.done)?;
            }
        }
        while let Some((i, r)) = self.ingest.next_result(true) {
            blob_arrived(&self.order[i].0, r, self.contents, self.done)?;
        }
        Ok(())
    }

    /// Reads what is still missing (files the workers did not find, symlink targets,
    /// into `targets`) through one `git cat-file --batch`.
    fn with_cat_file(&mut self, targets: &mut HashMap<String, Vec<u8>>) -> Result<()> {
        let rest: Vec<&(String, Option<u64>)> = self
            .order
            .iter()
            .filter(|(o, _)| {
                let u = self.uses[o];
                (u.file && !self.contents.contains_key(o)) || (u.link && !targets.contains_key(o))
            })
            .collect();
        let mut cat = CatFile::start(self.repo, rest.iter().map(|(o, _)| o.clone()).collect())?;
        for (oid, listed) in rest {
            let size = cat.next_blob(oid)?;
            if let Some(listed) = listed
                && size != *listed
            {
                return Err(cat.error(format!(
                    "blob {oid} has {size} bytes, ls-tree said {listed}"
                )));
            }
            let u = self.uses[oid];
            if u.link {
                if size == 0 || size > tree::MAX_TARGET_BYTES as u64 {
                    return Err(cat.error(format!(
                        "symlink blob {oid} has an unusable length ({size} bytes)"
                    )));
                }
                let mut target = Vec::with_capacity(size as usize);
                (&mut cat.out)
                    .take(size)
                    .read_to_end(&mut target)
                    .map_err(|e| cat.io_error(e))?;
                if u.file {
                    let c = self.ingest.store_reader(target.as_slice(), size)?;
                    self.contents.insert(oid.clone(), c);
                }
                targets.insert(oid.clone(), target);
            } else {
                let c = self
                    .ingest
                    .store_reader((&mut cat.out).take(size), size)
                    .map_err(|e| match e {
                        Error::Io { source, .. } => cat.io_error(source),
                        e => e,
                    })?;
                if c.size != size {
                    return Err(cat.error(format!("blob {oid} ended after {} bytes", c.size)));
                }
                self.contents.insert(oid.clone(), c);
            }
            cat.end_blob()?;
            (self.done)(size);
        }
        cat.finish()
    }
}

/// The object directory of `repo` (its common one, for a linked worktree); `None` when
/// git does not say (every object is then read through `git cat-file`).
fn object_dir(repo: &Path) -> Option<PathBuf> {
    let args = [
        "rev-parse",
        "--path-format=absolute",
        "--git-path",
        "objects",
    ];
    let out = run(repo, "find objects", &args).ok()?;
    let dir = PathBuf::from(String::from_utf8(out).ok()?.trim_end_matches('\n'));
    dir.is_absolute().then_some(dir)
}

/// Takes the result of a blob `oid` read by a worker: its content, or nothing when it
/// was not there (a loose object that vanished before it was opened, where a concurrent
/// `git gc` packed it; an object `gix-odb` does not find): it is then read through `git
/// cat-file`.
fn blob_arrived(
    oid: &str,
    r: Result<(FileContent, crate::ingest::Xattrs)>,
    contents: &mut HashMap<String, FileContent>,
    done: &mut impl FnMut(u64),
) -> Result<()> {
    match r {
        Ok((c, _)) => {
            contents.insert(oid.to_string(), c);
            done(c.size);
            Ok(())
        }
        Err(Error::Io {
            step: "open",
            source,
            ..
        }) if source.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What the store holds of the git blobs `oids` (hex), by id: their content.
fn known_blobs<'a>(
    conn: &rusqlite::Connection,
    oids: impl Iterator<Item = &'a String>,
) -> Result<HashMap<String, FileContent>> {
    let sql = "SELECT content, size FROM gitblobs WHERE oid = ?1";
    let rows = known_by_oid(conn, sql, "read git blob ids", oids, |r| {
        Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?))
    })?;
    rows.into_iter()
        .map(|(oid, (content, size))| {
            let id = crate::ContentId::from_slice(&content)?;
            let size = size as u64;
            Ok((oid, FileContent { id, size }))
        })
        .collect()
}

/// The symlink targets known of the git blobs `oids` (hex), by id.
fn known_links<'a>(
    conn: &rusqlite::Connection,
    oids: impl Iterator<Item = &'a String>,
) -> Result<HashMap<String, Vec<u8>>> {
    let sql = "SELECT target FROM gitlinks WHERE oid = ?1";
    known_by_oid(conn, sql, "read git symlink targets", oids, |r| r.get(0))
}

/// The row `sql` (one `oid` parameter, raw) finds for each of `oids` (hex), by id.
fn known_by_oid<'a, T>(
    conn: &rusqlite::Connection,
    sql: &str,
    step: &'static str,
    oids: impl Iterator<Item = &'a String>,
    row: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<HashMap<String, T>> {
    let mut stmt = conn.prepare_cached(sql).map_err(Error::db(step))?;
    let mut out = HashMap::new();
    for oid in oids {
        let Ok(raw) = hex::decode(oid) else { continue };
        let found = stmt
            .query_row([&raw], &row)
            .optional()
            .map_err(Error::db(step))?;
        if let Some(v) = found {
            out.insert(oid.clone(), v);
        }
    }
    Ok(out)
}

/// Records symlink targets of git blobs (raw ids), in the import's transaction.
fn record_links(conn: &rusqlite::Connection, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    crate::store::insert_many(
        conn,
        "INSERT OR REPLACE INTO gitlinks (oid, target)",
        2,
        rows,
        |st, i, (oid, target)| {
            st.raw_bind_parameter(i, &oid[..])?;
            st.raw_bind_parameter(i + 1, &target[..])
        },
    )
    .map_err(Error::db("record git symlink targets"))
}

/// Records the content stored for git blobs (raw ids), in the import's transaction.
fn record_blobs(conn: &rusqlite::Connection, rows: &[(Vec<u8>, FileContent)]) -> Result<()> {
    crate::store::insert_many(
        conn,
        "INSERT OR REPLACE INTO gitblobs (oid, content, size)",
        3,
        rows,
        |st, i, (oid, c)| {
            st.raw_bind_parameter(i, &oid[..])?;
            st.raw_bind_parameter(i + 1, &c.id.as_bytes()[..])?;
            st.raw_bind_parameter(i + 2, c.size as i64)
        },
    )
    .map_err(Error::db("record git blob ids"))
}
