//! The deterministic synthetic corpus: a seeded tree shaped like a real source
//! repository.
//!
//! Mix (by file count): ~95% small source-like text files (200 B–20 KiB, log-uniform,
//! 4% of them executable scripts), ~3% medium files (20–500 KiB; 70% text, 30%
//! incompressible binary), one large binary (5–50 MiB) per 10,000 files built from
//! 64 KiB blocks of which some repeat blocks shared by all large files (partial
//! redundancy for dedup) and some are low-entropy, ~2% exact duplicates of other
//! files, ~1% symlinks (a few dangling). Directories: about one per 16 files, some
//! deep (a 20-level chain, random nesting up to 24), one wide directory holding ~3%
//! of all files. Names avoid the store's default exclusions (`build`, `dist`, …).
//!
//! Output is a pure function of (`GENERATOR_VERSION`, seed, file count).

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::rng::Rng;

/// Bump when the output for a given seed changes (it is part of the cache key).
pub const GENERATOR_VERSION: u32 = 1;

const SMALL_MIN_BYTES: u64 = 200;
const SMALL_MAX_BYTES: u64 = 20 * 1024;
const MEDIUM_MIN_BYTES: u64 = 20 * 1024;
const MEDIUM_MAX_BYTES: u64 = 500 * 1024;
const LARGE_MIN_BYTES: u64 = 5 << 20;
const LARGE_MAX_BYTES: u64 = 50 << 20;
const LARGE_BLOCK_BYTES: usize = 64 * 1024;
const LARGE_SHARED_POOL_BLOCKS: u64 = 32;
const FILES_PER_LARGE: u64 = 10_000;
const FILES_PER_DIR: u64 = 16;
const MAX_RANDOM_DEPTH: u32 = 24;
const DEEP_CHAIN_DEPTH: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// Regular files plus symlinks.
    pub files: u64,
    pub seed: u64,
}

impl Spec {
    pub fn cache_key(&self) -> String {
        format!(
            "synthetic-v{GENERATOR_VERSION}-s{}-n{}",
            self.seed, self.files
        )
    }
}

const WORDS: &[&str] = &[
    "src",
    "lib",
    "core",
    "net",
    "fs",
    "drivers",
    "include",
    "arch",
    "kernel",
    "mm",
    "tools",
    "scripts",
    "docs",
    "tests",
    "utils",
    "common",
    "api",
    "server",
    "client",
    "proto",
    "config",
    "crypto",
    "io",
    "sched",
    "ipc",
    "sound",
    "media",
    "usb",
    "pci",
    "gpu",
    "display",
    "input",
    "power",
    "block",
    "storage",
    "cache_mgr",
    "parser",
    "lexer",
    "codegen",
    "runtime",
    "vm",
    "gc",
    "alloc",
    "sync",
    "time",
    "log",
    "trace",
    "debug",
    "hal",
    "platform",
    "board",
    "firmware",
    "boot",
    "init",
    "memory",
    "pages",
    "buffer",
    "queue",
    "stream",
    "http",
    "rpc",
    "json",
    "xml",
    "yaml",
    "db",
    "sql",
    "index",
    "query",
    "model",
    "view",
    "controller",
    "ui",
    "widgets",
    "theme",
    "assets",
    "images",
    "fonts",
    "i18n",
    "locale",
    "auth",
    "session",
    "user",
    "admin",
    "plugins",
    "ext",
    "bridge",
    "codec",
    "audio",
    "video",
    "render",
    "shader",
    "mesh",
    "physics",
    "net_core",
    "socket",
    "tcp",
    "udp",
    "dns",
    "tls",
    "cert",
    "hash",
    "cipher",
    "compress",
    "archive",
    "loader",
    "linker",
    "symbol",
    "module",
    "package",
    "registry",
    "schema",
    "types",
    "events",
    "worker",
    "pool",
    "thread",
    "task",
    "timer",
    "clock",
    "irq",
    "dma",
    "regmap",
];

const TOKENS: &[&str] = &[
    "if", "else", "return", "for", "while", "struct", "static", "const", "int", "void", "u32",
    "u64", "size_t", "let", "mut", "fn", "match", "self", "NULL", "0", "1", "-1", "sizeof", "goto",
    "out", "err", "ret", "len", "buf", "ptr", "data", "ctx", "dev", "priv", "flags", "lock",
    "unlock", "count", "index", "offset", "value", "key", "node", "list", "head", "next", "prev",
    "state", "=", "==", "!=", "->", ".", "+", "-", "*", "&", "&&", "||", "(", ")", "{", "}", "[",
    "]", ";", ",", "<", ">", "<<", ">>",
];

const HEADERS: &[&str] = &[
    "// SPDX-License-Identifier: GPL-2.0\n",
    "/* SPDX-License-Identifier: MIT */\n/*\n * Copyright (C) The Example Authors.\n */\n",
    "# Licensed under the Apache License, Version 2.0 (the \"License\");\n# you may not use this file except in compliance with the License.\n",
];

#[derive(Debug, Clone)]
enum Kind {
    Text { size: u64, exec: bool },
    Binary { size: u64 },
    Large { size: u64 },
    Symlink { target: PathBuf },
}

#[derive(Debug, Clone)]
struct FilePlan {
    dir: usize,
    name: String,
    kind: Kind,
    /// Content seed; duplicates share their source's seed and kind.
    content_seed: u64,
}

struct Plan {
    dirs: Vec<PathBuf>,
    files: Vec<FilePlan>,
}

fn plan(spec: &Spec) -> Plan {
    let mut rng = Rng::derive(spec.seed, 0x7EE);
    let ndirs = (spec.files / FILES_PER_DIR).max(4) as usize;
    let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
    let mut depth: Vec<u32> = vec![0];
    let mut taken: HashSet<PathBuf> = HashSet::new();
    let unique = |parent: &Path, base: String, taken: &mut HashSet<PathBuf>| -> PathBuf {
        let mut p = parent.join(&base);
        let mut n = 1;
        while !taken.insert(p.clone()) {
            n += 1;
            p = parent.join(format!("{base}{n}"));
        }
        p
    };
    // A deep chain, as in vendored or generated code.
    if spec.files >= 1000 {
        for level in 0..DEEP_CHAIN_DEPTH {
            let parent = dirs.len() - 1;
            let name = if level == 0 {
                "deep".to_string()
            } else {
                format!("level{level}")
            };
            let p = unique(&dirs[parent].clone(), name, &mut taken);
            dirs.push(p);
            depth.push(depth[parent] + 1);
        }
    }
    let wide = dirs.len();
    let p = unique(Path::new(""), "generated".into(), &mut taken);
    dirs.push(p);
    depth.push(1);
    while dirs.len() < ndirs {
        let n = dirs.len();
        let mut parent = if rng.chance(0.6) {
            n - 1 - rng.index(8.min(n))
        } else {
            rng.index(n)
        };
        if depth[parent] >= MAX_RANDOM_DEPTH {
            parent = 0;
        }
        let base = WORDS[rng.index(WORDS.len())].to_string();
        let p = unique(&dirs[parent].clone(), base, &mut taken);
        dirs.push(p);
        depth.push(depth[parent] + 1);
    }

    let nlarge = (spec.files / FILES_PER_LARGE).max(1);
    let mut large_at = HashSet::new();
    while (large_at.len() as u64) < nlarge.min(spec.files) {
        large_at.insert(rng.below(spec.files));
    }

    let mut files: Vec<FilePlan> = Vec::with_capacity(spec.files as usize);
    let mut dedup_sources: Vec<usize> = Vec::new();
    for i in 0..spec.files {
        let dir = if rng.chance(0.03) {
            wide
        } else {
            // Skewed towards early directories: some wide, many small.
            ((rng.unit() * rng.unit()) * dirs.len() as f64) as usize
        };
        let content_seed = rng.next_u64();
        let (kind, ext, seed) = if large_at.contains(&i) {
            let ext = ["bin", "img", "dat", "pak"][rng.index(4)];
            (
                Kind::Large {
                    size: rng.log_uniform(LARGE_MIN_BYTES, LARGE_MAX_BYTES),
                },
                ext,
                content_seed,
            )
        } else if !files.is_empty() && rng.chance(0.01) {
            let t = rng.index(files.len());
            let target = if rng.chance(0.05) {
                PathBuf::from(format!("missing-{i}"))
            } else if let Kind::Symlink { .. } = files[t].kind {
                PathBuf::from(&files[t].name) // a link to a link name, maybe dangling
            } else {
                relative(&dirs[dir], &dirs[files[t].dir].join(&files[t].name))
            };
            (Kind::Symlink { target }, "lnk", content_seed)
        } else if !dedup_sources.is_empty() && rng.chance(0.02) {
            let src = &files[dedup_sources[rng.index(dedup_sources.len())]];
            let ext = src.name.rsplit('.').next().unwrap_or("txt");
            let ext: &'static str = EXTS.iter().find(|e| **e == ext).copied().unwrap_or("txt");
            (src.kind.clone(), ext, src.content_seed)
        } else if rng.chance(0.03) {
            let size = rng.log_uniform(MEDIUM_MIN_BYTES, MEDIUM_MAX_BYTES);
            if rng.chance(0.3) {
                (
                    Kind::Binary { size },
                    ["png", "jpg", "woff2", "gz"][rng.index(4)],
                    content_seed,
                )
            } else {
                (
                    Kind::Text { size, exec: false },
                    ["c", "json", "md", "svg"][rng.index(4)],
                    content_seed,
                )
            }
        } else {
            let size = rng.log_uniform(SMALL_MIN_BYTES, SMALL_MAX_BYTES);
            if rng.chance(0.04) {
                (Kind::Text { size, exec: true }, "sh", content_seed)
            } else {
                let ext = [
                    "c", "h", "rs", "py", "js", "ts", "go", "md", "txt", "toml", "S",
                ][rng.index(11)];
                (Kind::Text { size, exec: false }, ext, content_seed)
            }
        };
        let base = if rng.chance(0.5) {
            format!(
                "{}_{}.{ext}",
                WORDS[rng.index(WORDS.len())],
                WORDS[rng.index(WORDS.len())]
            )
        } else {
            format!("{}.{ext}", WORDS[rng.index(WORDS.len())])
        };
        let name = unique(&dirs[dir].clone(), base, &mut taken)
            .file_name()
            .expect("unique() joins a file name")
            .to_string_lossy()
            .into_owned();
        if matches!(kind, Kind::Text { .. } | Kind::Binary { .. }) {
            dedup_sources.push(files.len());
        }
        files.push(FilePlan {
            dir,
            name,
            kind,
            content_seed: seed,
        });
    }
    Plan { dirs, files }
}

const EXTS: &[&str] = &[
    "c", "h", "rs", "py", "js", "ts", "go", "md", "txt", "toml", "S", "sh", "json", "svg", "png",
    "jpg", "woff2", "gz", "bin", "img", "dat", "pak",
];

/// `to` relative to directory `from` (both relative to the tree root).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<_> = from.components().collect();
    let t: Vec<_> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut p = PathBuf::new();
    for _ in common..f.len() {
        p.push("..");
    }
    for c in &t[common..] {
        p.push(c);
    }
    p
}

fn text(seed: u64, size: u64, exec: bool, out: &mut Vec<u8>) {
    let mut rng = Rng::new(seed);
    out.clear();
    if exec {
        out.extend_from_slice(b"#!/bin/sh\nset -eu\n");
    }
    if rng.chance(0.7) {
        out.extend_from_slice(HEADERS[rng.index(HEADERS.len())].as_bytes());
    }
    while (out.len() as u64) < size {
        if rng.chance(0.1) {
            out.extend_from_slice(b"\n");
            continue;
        }
        let indent = rng.index(4);
        out.extend(std::iter::repeat_n(b' ', indent * 4));
        if rng.chance(0.12) {
            out.extend_from_slice(b"/* ");
            for _ in 0..rng.index(8) + 2 {
                out.extend_from_slice(WORDS[rng.index(WORDS.len())].as_bytes());
                out.push(b' ');
            }
            out.extend_from_slice(b"*/\n");
            continue;
        }
        for k in 0..rng.index(9) + 2 {
            if k > 0 {
                out.push(b' ');
            }
            if rng.chance(0.3) {
                out.extend_from_slice(WORDS[rng.index(WORDS.len())].as_bytes());
                if rng.chance(0.3) {
                    out.extend_from_slice(b"_");
                    out.extend_from_slice(TOKENS[rng.index(TOKENS.len())].as_bytes());
                }
            } else {
                out.extend_from_slice(TOKENS[rng.index(TOKENS.len())].as_bytes());
            }
        }
        out.extend_from_slice(b";\n");
    }
    out.truncate(size as usize);
    if let Some(last) = out.last_mut() {
        *last = b'\n';
    }
}

fn binary(seed: u64, size: u64, out: &mut Vec<u8>) {
    let mut rng = Rng::new(seed);
    out.clear();
    out.resize(size as usize, 0);
    rng.fill(out);
    let n = out.len().min(8);
    out[..n].copy_from_slice(&b"\x89BENCH\r\n"[..n]);
}

fn large(seed: u64, corpus_seed: u64, size: u64, w: &mut impl Write) -> Result<()> {
    let mut rng = Rng::new(seed);
    let mut block = vec![0u8; LARGE_BLOCK_BYTES];
    let mut left = size as usize;
    while left > 0 {
        let n = left.min(LARGE_BLOCK_BYTES);
        let roll = rng.unit();
        if roll < 0.25 {
            // A block shared by all large files of the corpus (dedup material).
            Rng::derive(corpus_seed, 0xB10C + rng.below(LARGE_SHARED_POOL_BLOCKS)).fill(&mut block);
        } else if roll < 0.45 {
            // Low-entropy: a short pattern with sparse noise (compresses well).
            let mut pat = [0u8; 256];
            rng.fill(&mut pat);
            for (i, b) in block.iter_mut().enumerate() {
                *b = pat[i % 256];
            }
            for _ in 0..64 {
                let at = rng.index(LARGE_BLOCK_BYTES);
                block[at] = rng.next_u64() as u8;
            }
        } else {
            rng.fill(&mut block);
        }
        w.write_all(&block[..n])?;
        left -= n;
    }
    Ok(())
}

/// Writes the corpus into `out` (an empty directory).
pub fn generate(spec: &Spec, out: &Path) -> Result<()> {
    let plan = plan(spec);
    for d in plan.dirs.iter().skip(1) {
        std::fs::create_dir_all(out.join(d)).with_context(|| format!("mkdir {}", d.display()))?;
    }
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let plan = &plan;
                s.spawn(move || -> Result<()> {
                    let mut buf = Vec::new();
                    for f in plan.files.iter().skip(w).step_by(workers) {
                        crate::cancel::check()?;
                        let path = out.join(&plan.dirs[f.dir]).join(&f.name);
                        write_one(spec, f, &path, &mut buf)
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("generator thread panicked"))??;
        }
        Ok(())
    })
}

fn write_one(spec: &Spec, f: &FilePlan, path: &Path, buf: &mut Vec<u8>) -> Result<()> {
    match &f.kind {
        Kind::Text { size, exec } => {
            text(f.content_seed, *size, *exec, buf);
            std::fs::write(path, &buf[..])?;
            if *exec {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
            }
        }
        Kind::Binary { size } => {
            binary(f.content_seed, *size, buf);
            std::fs::write(path, &buf[..])?;
        }
        Kind::Large { size } => {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
            large(f.content_seed, spec.seed, *size, &mut w)?;
            w.flush()?;
        }
        Kind::Symlink { target } => std::os::unix::fs::symlink(target, path)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::walk::tree_stats;

    #[test]
    fn same_seed_same_tree_hash() {
        let spec = Spec {
            files: 1200,
            seed: 42,
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        generate(&spec, a.path()).unwrap();
        generate(&spec, b.path()).unwrap();
        let (sa, sb) = (tree_stats(a.path()).unwrap(), tree_stats(b.path()).unwrap());
        assert_eq!(sa, sb);
        assert!(
            sa.files > 1000 && sa.symlinks > 0 && sa.executables > 0,
            "{sa:?}"
        );
        assert!(sa.max_depth >= DEEP_CHAIN_DEPTH as u64, "{sa:?}");

        let c = tempfile::tempdir().unwrap();
        generate(
            &Spec {
                files: 1200,
                seed: 43,
            },
            c.path(),
        )
        .unwrap();
        assert_ne!(tree_stats(c.path()).unwrap().tree_hash, sa.tree_hash);
    }

    #[test]
    fn sizes_within_bounds_and_no_default_excluded_names() {
        let p = plan(&Spec {
            files: 5000,
            seed: 1,
        });
        let excluded = [
            "node_modules",
            "target",
            "dist",
            "build",
            "coverage",
            "venv",
            ".cache",
        ];
        for d in &p.dirs {
            for c in d.components() {
                assert!(
                    !excluded.contains(&c.as_os_str().to_str().unwrap()),
                    "{}",
                    d.display()
                );
            }
        }
        let large = p
            .files
            .iter()
            .filter(|f| matches!(f.kind, Kind::Large { .. }))
            .count();
        assert_eq!(large, 1);
        for f in &p.files {
            match f.kind {
                Kind::Text { size, .. } | Kind::Binary { size } => {
                    assert!((SMALL_MIN_BYTES..=MEDIUM_MAX_BYTES).contains(&size))
                }
                Kind::Large { size } => {
                    assert!((LARGE_MIN_BYTES..=LARGE_MAX_BYTES).contains(&size))
                }
                Kind::Symlink { .. } => {}
            }
        }
    }

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative(Path::new("a/b"), Path::new("a/c/f")),
            PathBuf::from("../c/f")
        );
        assert_eq!(
            relative(Path::new(""), Path::new("x/f")),
            PathBuf::from("x/f")
        );
        assert_eq!(
            relative(Path::new("x"), Path::new("x/f")),
            PathBuf::from("f")
        );
    }
}
