//! `mountctl cp SRC DST`: files between the host and a workspace, through the files API
//! (`cowspace::files`): paths inside the workspace never resolve outside it, and while
//! its sandbox runs what is created belongs to its root. One side is `WS:PATH`; the
//! other a host path, or `-` for a tar stream (stdin as the source, stdout as the
//! destination).
//!
//! As `cp -r` and `docker cp`: a destination that is an existing directory receives the
//! source under its own name; otherwise the destination is the new name (its parent must
//! exist). Modes and symlinks are kept (symlinks copied as links); hard links become
//! separate files; fifos, sockets and devices are skipped with a note.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use cowspace::files::Files;
use serde_json::json;

use super::files::{CHUNK_BYTES, split_target};
use crate::cli::CpArgs;
use crate::output::Ctx;

/// One side of a copy.
enum Side<'a> {
    Ws(&'a str, &'a str),
    Host(&'a Path),
    Stream,
}

fn side(s: &str) -> Side<'_> {
    if s == "-" {
        return Side::Stream;
    }
    // A host path with a colon can be named `./a:b`.
    if !s.starts_with('/')
        && !s.starts_with('.')
        && s.contains(':')
        && let Ok((ws, p)) = split_target(s)
    {
        return Side::Ws(ws, p);
    }
    Side::Host(Path::new(s))
}

/// What one copy did.
#[derive(Default)]
struct Count {
    files: u64,
    dirs: u64,
    symlinks: u64,
    bytes: u64,
    skipped: Vec<String>,
}

pub fn run(ctx: &Ctx, a: CpArgs) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let mut n = Count::default();
    match (side(&a.src), side(&a.dest)) {
        (Side::Host(src), Side::Ws(ws, dest)) => {
            let files = rt.files(ws)?;
            host_meta(src, a.follow_links)?;
            let target = into_ws(&files, Path::new(dest), src.file_name())?;
            host_to_ws(&files, src, &target, a.follow_links, &mut n, 0)?;
        }
        (Side::Ws(ws, src), Side::Host(dest)) => {
            let files = rt.files(ws)?;
            let info = files.stat(src)?;
            let target = match std::fs::metadata(dest) {
                Ok(m) if m.is_dir() => dest.join(base_name(src)),
                _ => dest.to_path_buf(),
            };
            ws_to_host(&files, Path::new(src), &info, &target, &mut n)?;
        }
        (Side::Ws(ws, src), Side::Stream) => {
            let files = rt.files(ws)?;
            let info = files.stat(src)?;
            let mut b = tar::Builder::new(std::io::stdout().lock());
            b.follow_symlinks(false);
            let r = ws_to_tar(
                &files,
                Path::new(src),
                &info,
                &base_name(src),
                &mut b,
                &mut n,
            )
            .and_then(|()| Ok(b.into_inner()?.flush()?));
            // A reader that stopped reading (`| head`) is not an error of the copy.
            if let Err(e) = r {
                let pipe = e.chain().any(|c| {
                    c.downcast_ref::<std::io::Error>()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                });
                if !pipe {
                    return Err(e);
                }
            }
        }
        (Side::Stream, Side::Ws(ws, dest)) => {
            let files = rt.files(ws)?;
            tar_to_ws(&files, Path::new(dest), std::io::stdin().lock(), &mut n)?;
        }
        (Side::Ws(..), Side::Ws(..)) => {
            anyhow::bail!(cowspace::error::Error::Invalid(
                "cp between two workspaces: copy out to the host (or `-`) and in again".into()
            ))
        }
        _ => anyhow::bail!(cowspace::error::Error::Invalid(format!(
            "cp {} {}: one side must be WS:PATH (a workspace's id or name, a colon, a path \
             inside it)",
            a.src, a.dest
        ))),
    }
    for s in &n.skipped {
        ctx.note(&format!("skipped {s}"));
    }
    let v = json!({"files": n.files, "dirs": n.dirs, "symlinks": n.symlinks, "bytes": n.bytes, "skipped": n.skipped});
    if a.dest != "-" {
        ctx.emit(v, || {
            format!(
                "copied {} files, {} directories, {} symlinks ({} bytes)\n",
                n.files, n.dirs, n.symlinks, n.bytes
            )
        });
    }
    Ok(ExitCode::SUCCESS)
}

fn base_name(p: &str) -> PathBuf {
    Path::new(p)
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_else(|| "workspace".into())
}

fn host_meta(p: &Path, follow: bool) -> anyhow::Result<std::fs::Metadata> {
    if follow {
        std::fs::metadata(p)
    } else {
        std::fs::symlink_metadata(p)
    }
    .with_context(|| format!("read {}", p.display()))
}

/// Where a source named `name` lands for destination `dest` inside the workspace.
fn into_ws(files: &Files, dest: &Path, name: Option<&std::ffi::OsStr>) -> anyhow::Result<PathBuf> {
    match (files.stat(dest), name) {
        (Ok(i), Some(n)) if i.kind == "dir" => Ok(dest.join(n)),
        _ => Ok(dest.to_path_buf()),
    }
}

/// Depth bound of a copy (symlink loops with `-L` end here).
const MAX_DEPTH: usize = 256;

fn host_to_ws(
    files: &Files,
    src: &Path,
    dest: &Path,
    follow: bool,
    n: &mut Count,
    depth: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        depth <= MAX_DEPTH,
        "{}: deeper than {MAX_DEPTH} directories (a symlink loop?)",
        src.display()
    );
    let m = host_meta(src, follow)?;
    let ft = m.file_type();
    let mode = m.permissions().mode() & 0o7777;
    if ft.is_dir() {
        match files.mkdir(dest, false, Some(mode)) {
            Ok(_) => {}
            Err(e) if files.stat(dest).is_ok_and(|i| i.kind == "dir") => drop(e),
            Err(e) => return Err(e.into()),
        }
        n.dirs += 1;
        let mut names: Vec<_> = std::fs::read_dir(src)
            .with_context(|| format!("read {}", src.display()))?
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for name in names {
            host_to_ws(
                files,
                &src.join(&name),
                &dest.join(&name),
                follow,
                n,
                depth + 1,
            )?;
        }
    } else if ft.is_symlink() {
        let t = std::fs::read_link(src)?;
        if files.stat(dest).is_ok() {
            files.remove(dest, false)?;
        }
        files.symlink(dest, &t)?;
        n.symlinks += 1;
    } else if ft.is_file() {
        let mut f = std::fs::File::open(src).with_context(|| format!("open {}", src.display()))?;
        let mut first = true;
        loop {
            let mut buf = Vec::with_capacity(CHUNK_BYTES as usize);
            (&mut f).take(CHUNK_BYTES).read_to_end(&mut buf)?;
            if buf.is_empty() && !first {
                break;
            }
            files.write(dest, &buf, Some(mode), !first)?;
            n.bytes += buf.len() as u64;
            first = false;
            if (buf.len() as u64) < CHUNK_BYTES {
                break;
            }
        }
        n.files += 1;
    } else {
        n.skipped.push(format!(
            "{} (not a file, directory or symlink)",
            src.display()
        ));
    }
    let _ = m.ino();
    Ok(())
}

fn ws_to_host(
    files: &Files,
    src: &Path,
    info: &cowspace::files::FileInfo,
    dest: &Path,
    n: &mut Count,
) -> anyhow::Result<()> {
    match info.kind {
        "dir" => {
            match std::fs::create_dir(dest) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dest.is_dir() => {}
                Err(e) => return Err(e).with_context(|| format!("mkdir {}", dest.display())),
            }
            std::fs::set_permissions(dest, std::fs::Permissions::from_mode(info.mode))?;
            n.dirs += 1;
            for child in files.list(src, false)? {
                let path = child.exact_path();
                let name = path.file_name().unwrap_or_default();
                ws_to_host(files, &src.join(name), &child, &dest.join(name), n)?;
            }
        }
        "symlink" => {
            let _ = std::fs::remove_file(dest);
            std::os::unix::fs::symlink(info.target.as_deref().unwrap_or(""), dest)
                .with_context(|| format!("symlink {}", dest.display()))?;
            n.symlinks += 1;
        }
        "file" => {
            let mut out = std::fs::File::create(dest)
                .with_context(|| format!("create {}", dest.display()))?;
            let mut offset = 0;
            loop {
                let chunk = files.read(src, offset, Some(CHUNK_BYTES))?;
                if chunk.is_empty() {
                    break;
                }
                out.write_all(&chunk)?;
                offset += chunk.len() as u64;
            }
            out.set_permissions(std::fs::Permissions::from_mode(info.mode))?;
            n.files += 1;
            n.bytes += offset;
        }
        other => n.skipped.push(format!("{} (a {other})", src.display())),
    }
    Ok(())
}

fn ws_to_tar<W: Write>(
    files: &Files,
    src: &Path,
    info: &cowspace::files::FileInfo,
    name: &Path,
    b: &mut tar::Builder<W>,
    n: &mut Count,
) -> anyhow::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_mode(info.mode);
    h.set_mtime(info.mtime.max(0) as u64);
    h.set_uid(info.uid.into());
    h.set_gid(info.gid.into());
    match info.kind {
        "dir" => {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            b.append_data(&mut h, name, std::io::empty())?;
            n.dirs += 1;
            for child in files.list(src, false)? {
                let path = child.exact_path();
                let cname = path.file_name().unwrap_or_default();
                ws_to_tar(files, &src.join(cname), &child, &name.join(cname), b, n)?;
            }
        }
        "symlink" => {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, name, info.target.as_deref().unwrap_or(""))?;
            n.symlinks += 1;
        }
        "file" => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(info.size);
            let reader = WsReader {
                files,
                path: src,
                offset: 0,
                buf: Vec::new(),
                pos: 0,
            };
            b.append_data(&mut h, name, reader.take(info.size))?;
            n.files += 1;
            n.bytes += info.size;
        }
        other => n.skipped.push(format!("{} (a {other})", src.display())),
    }
    Ok(())
}

/// A workspace file read in chunks through the files API.
struct WsReader<'a> {
    files: &'a Files,
    path: &'a Path,
    offset: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for WsReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            self.buf = self
                .files
                .read(self.path, self.offset, Some(CHUNK_BYTES))
                .map_err(std::io::Error::other)?;
            self.pos = 0;
            self.offset += self.buf.len() as u64;
            if self.buf.is_empty() {
                return Ok(0);
            }
        }
        let k = out.len().min(self.buf.len() - self.pos);
        out[..k].copy_from_slice(&self.buf[self.pos..self.pos + k]);
        self.pos += k;
        Ok(k)
    }
}

fn tar_to_ws(files: &Files, dest: &Path, input: impl Read, n: &mut Count) -> anyhow::Result<()> {
    let mut ar = tar::Archive::new(input);
    for entry in ar.entries()? {
        let mut e = entry?;
        let path = e.path()?.into_owned();
        // Names are taken as inside paths: an absolute or `..` name is refused, never
        // followed out (the files API checks again).
        let rel = cowspace::files::inside_path(&path)?;
        let target = dest.join(&rel);
        let mode = e.header().mode().unwrap_or(0o644) & 0o7777;
        match e.header().entry_type() {
            tar::EntryType::Directory => {
                if rel.as_os_str().is_empty() {
                    continue;
                }
                files.mkdir(&target, true, Some(mode))?;
                n.dirs += 1;
            }
            tar::EntryType::Symlink => {
                let t = e.link_name()?.map(|l| l.into_owned()).unwrap_or_default();
                if files.stat(&target).is_ok() {
                    files.remove(&target, false)?;
                }
                files.symlink(&target, &t)?;
                n.symlinks += 1;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut first = true;
                loop {
                    let mut buf = Vec::with_capacity(CHUNK_BYTES as usize);
                    (&mut e).take(CHUNK_BYTES).read_to_end(&mut buf)?;
                    if buf.is_empty() && !first {
                        break;
                    }
                    files.write(&target, &buf, Some(mode), !first)?;
                    n.bytes += buf.len() as u64;
                    first = false;
                    if (buf.len() as u64) < CHUNK_BYTES {
                        break;
                    }
                }
                n.files += 1;
            }
            other => n
                .skipped
                .push(format!("{} (tar entry type {other:?})", path.display())),
        }
    }
    Ok(())
}
