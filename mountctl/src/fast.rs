//! The fast path of the hot commands: `create`, `remove`, `list` and `status` when the
//! root's daemon runs.
//!
//! An agent runtime calls these once per worker, so their cost is a process start plus
//! one request on the control socket. This path reads the arguments by hand (a grammar
//! that is a strict subset of `cli.rs`'s), loads only the configuration (it picks the
//! root and a create's defaults) and sends the request through the same functions as the
//! full command line, which print the answer or the error the same way. It builds no
//! `clap` command tree and sets up no logging: a request to the daemon logs nothing here.
//!
//! Anything else goes to the full command line, before any request is sent: a command
//! line this grammar does not read exactly as `clap` would (help, `-v`, `--`, a repeated
//! or unknown flag, a value starting with `-`, an empty or non-UTF-8 argument), an
//! unreadable configuration, `$RUST_LOG`, or no daemon answering from this mount
//! namespace. `clap` stays the one definition of the grammar (`docs/cli.md`); the unit
//! tests below check that what this path reads, `clap` reads the same.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::CreateArgs;
use crate::commands::workspace;
use crate::output::{Ctx, report_error};

/// A hot command, as read from the command line.
#[derive(Debug, PartialEq)]
pub enum Hot {
    Create {
        snapshot: String,
        name: Option<String>,
        materializer: Option<String>,
        lower: Option<String>,
        path: Option<PathBuf>,
        worker: Option<String>,
    },
    Remove {
        workspace: String,
        force: bool,
    },
    List {
        all: bool,
    },
    Status {
        workspace: String,
    },
}

/// The global flags this path reads, and the command.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub root: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
    pub command: Hot,
}

/// The most arguments this path reads; a longer command line goes to `clap`.
const MAX_ARGS: usize = 32;

/// Reads `args` (without the program name) when they are a hot command in the subset
/// this path knows; `None` otherwise.
pub fn parse(args: &[OsString]) -> Option<Parsed> {
    if args.len() > MAX_ARGS {
        return None;
    }
    // Only UTF-8, non-empty words; `--` and a lone `-` are left to clap.
    let words: Vec<&str> = args
        .iter()
        .map(|a| {
            a.to_str()
                .filter(|s| !s.is_empty() && *s != "-" && *s != "--")
        })
        .collect::<Option<_>>()?;
    let mut root = None;
    let mut json = false;
    let mut quiet = false;
    let mut sub: Option<&str> = None;
    // Flags that take a value, set at most once each, and positional words.
    let mut values: Vec<(&str, &str)> = Vec::new();
    let mut switches: Vec<&str> = Vec::new();
    let mut positional: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        i += 1;
        if !w.starts_with('-') {
            match sub {
                None => sub = Some(w),
                Some(_) => positional.push(w),
            }
            continue;
        }
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (w, None),
        };
        let takes_value = match flag {
            "--root" => true,
            "--name" | "--materializer" | "--lower" | "--path" | "--worker" => {
                if sub != Some("create") {
                    return None;
                }
                true
            }
            "--json" | "--quiet" | "-q" => false,
            "--force" if sub == Some("remove") => false,
            "--all" if sub == Some("list") => false,
            _ => return None,
        };
        if !takes_value {
            if inline.is_some() {
                return None;
            }
            // `-q` and `--quiet` are one flag.
            let name = if flag == "-q" { "--quiet" } else { flag };
            if switches.contains(&name) {
                return None;
            }
            switches.push(name);
            match name {
                "--json" => json = true,
                "--quiet" => quiet = true,
                _ => {}
            }
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = *words.get(i)?;
                i += 1;
                v
            }
        };
        // clap would read such a value as a flag (or refuse it): its call.
        if value.is_empty() || value.starts_with('-') || values.iter().any(|(f, _)| *f == flag) {
            return None;
        }
        values.push((flag, value));
        if flag == "--root" {
            root = Some(PathBuf::from(value));
        }
    }
    let value = |f: &str| {
        values
            .iter()
            .find(|(name, _)| *name == f)
            .map(|(_, v)| v.to_string())
    };
    let flag = |f: &str| switches.contains(&f);
    let command = match (sub?, positional.as_slice()) {
        ("create", [snapshot]) => Hot::Create {
            snapshot: snapshot.to_string(),
            name: value("--name"),
            materializer: value("--materializer"),
            lower: value("--lower"),
            path: value("--path").map(PathBuf::from),
            worker: value("--worker"),
        },
        ("remove", [ws]) => Hot::Remove {
            workspace: ws.to_string(),
            force: flag("--force"),
        },
        ("list", []) => Hot::List { all: flag("--all") },
        ("status", [ws]) => Hot::Status {
            workspace: ws.to_string(),
        },
        _ => return None,
    };
    Some(Parsed {
        root,
        json,
        quiet,
        command,
    })
}

/// Runs a hot command through the root's daemon: its exit code, or `None` when the full
/// command line must run it (nothing was sent to a daemon then).
pub fn run(args: &[OsString]) -> Option<ExitCode> {
    if std::env::var_os("RUST_LOG").is_some() {
        return None;
    }
    let p = parse(args)?;
    // An unreadable configuration is the full command line's to report.
    let config = cowspace::config::Config::load().ok()?;
    let ctx = Ctx {
        root: config.root(p.root.clone()).value,
        config,
        root_flag: p.root,
        json: p.json,
        quiet: p.quiet,
        progress: std::io::stderr().is_terminal() && !p.quiet,
    };
    let answered = match p.command {
        Hot::Create {
            snapshot,
            name,
            materializer,
            lower,
            path,
            worker,
        } => workspace::create_through_daemon(
            &ctx,
            &CreateArgs {
                snapshot: Some(snapshot),
                from_git: None,
                dirty: "refuse".into(),
                name,
                materializer,
                lower,
                path,
                worker,
                // `--disk` and `--inodes` are the full command line's.
                disk: None,
                inodes: None,
            },
        ),
        Hot::Remove { workspace, force } => {
            workspace::remove_through_daemon(&ctx, &workspace, force)
        }
        Hot::List { all } => workspace::list_through_daemon(&ctx, all),
        Hot::Status { workspace } => workspace::status_through_daemon(&ctx, &workspace),
    };
    match answered {
        Ok(code) => code,
        Err(e) => Some(report_error(&ctx, &e)),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn words(line: &str) -> Vec<OsString> {
        line.split(' ').map(OsString::from).collect()
    }

    /// What clap makes of the same line, in this module's terms.
    fn by_clap(line: &str) -> Option<Parsed> {
        let mut argv = vec![OsString::from("mountctl")];
        argv.extend(words(line));
        let cli = Cli::try_parse_from(argv).ok()?;
        let command = match cli.command {
            Command::Create(a) => {
                assert_eq!(a.from_git, None);
                assert_eq!(a.dirty, "refuse", "the default this path passes on");
                Hot::Create {
                    snapshot: a.snapshot?,
                    name: a.name,
                    materializer: a.materializer,
                    lower: a.lower,
                    path: a.path,
                    worker: a.worker,
                }
            }
            Command::Remove { workspace, force } => Hot::Remove { workspace, force },
            Command::List { all } => Hot::List { all },
            Command::Status { workspace } => Hot::Status { workspace },
            _ => return None,
        };
        assert_eq!(cli.verbose, 0);
        Some(Parsed {
            root: cli.root,
            json: cli.json,
            quiet: cli.quiet,
            command,
        })
    }

    #[test]
    fn what_this_path_reads_clap_reads_the_same() {
        let taken = [
            "create base",
            "create base --json",
            "--json create base",
            "--root /r --json create base --lower native",
            "--root=/r create --name=n base --materializer overlay --path rel/p --worker w1 -q",
            "create base --json --root /r --quiet",
            "remove ws-1",
            "remove ws-1 --force --json",
            "--quiet remove --force ws-1",
            "list",
            "list --all --json",
            "status n --json",
            "-q status n",
            "--root /r status ws-1",
        ];
        for line in taken {
            let ours = parse(&words(line));
            assert!(ours.is_some(), "not taken: {line}");
            assert_eq!(ours, by_clap(line), "{line}");
        }
    }

    #[test]
    fn anything_else_goes_to_clap() {
        let left = [
            "",
            "create",
            "create a b",
            "create base --from-git /x",
            "create base --dirty patch",
            "create base --name",
            "create base --name --json",
            "create base --name a --name b",
            "create base --name=",
            "create -- base",
            "create base -v",
            "create base --help",
            "create base -h",
            "create base -qv",
            "create base --json --json",
            "create base -q --quiet",
            "create base --json=true",
            "create base --all",
            "--name n create base",
            "base create",
            "remove",
            "remove ws --force --force",
            "remove ws --all",
            "list extra",
            "list --force",
            "status",
            "status a b",
            "status -x",
            "commit ws",
            "--version",
            "-V",
            "--root",
            "--root --json list",
            "--root /a --root /b list",
            "list -",
            "lis",
            "sweep",
        ];
        for line in left {
            assert_eq!(parse(&words(line)), None, "taken: {line:?}");
        }
        let long: Vec<OsString> = std::iter::repeat_n(OsString::from("--json"), MAX_ARGS + 1)
            .chain([OsString::from("list")])
            .collect();
        assert_eq!(parse(&long), None);
        // Not UTF-8.
        use std::os::unix::ffi::OsStringExt;
        let bad = vec![
            OsString::from("status"),
            OsString::from_vec(vec![0xff, 0xfe]),
        ];
        assert_eq!(parse(&bad), None);
    }
}
