//! The CLI's own reference, generated from its `clap` grammar so it cannot drift:
//! `docs/cli.md` (checked by a test; `COWSPACE_UPDATE_DOCS=1 cargo test -p mountctl
//! cli_reference` rewrites it) and the man pages (`mountctl man-pages DIR`).

use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::Cli;

/// Every command path with its command, depth first (`mountctl`, `mountctl ref`,
/// `mountctl ref set`, ...); hidden and help commands left out.
fn commands() -> Vec<(String, clap::Command)> {
    fn walk(prefix: &str, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
        out.push((prefix.to_string(), cmd.clone()));
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() || sub.get_name() == "help" {
                continue;
            }
            walk(&format!("{prefix} {}", sub.get_name()), sub, out);
        }
    }
    let mut root = Cli::command();
    root.build();
    let mut out = Vec::new();
    walk("mountctl", &root, &mut out);
    out
}

#[cfg(test)]
const PREAMBLE: &str = "# `mountctl` command-line reference\n\n\
Generated from the program's own grammar (`mountctl/src/cli.rs`); a test fails when it \
differs (`COWSPACE_UPDATE_DOCS=1 cargo test -p mountctl cli_reference` rewrites it). Man \
pages: `mountctl man-pages DIR`; shell completions: `mountctl completions bash|zsh|fish`.\n\n\
## Exit codes\n\n\
| code | kind | example |\n| --- | --- | --- |\n\
| 0 | ok | |\n\
| 1 | `io` (other failure) | disk full |\n\
| 2 | usage | unknown flag |\n\
| 3 | `not_found` | no such snapshot, ref, workspace or running sandbox |\n\
| 4 | `exists` | workspace name taken, a sandbox already running |\n\
| 5 | `busy` | removing a workspace whose processes still run; the host holds a workspace a sandbox would share |\n\
| 6 | `conflict` | ref moved since `--expect` |\n\
| 7 | `unsupported` | materializer or sandbox control not available on this host |\n\
| 8 | `corrupt` | a chunk's content does not match its hash |\n\
| 9 | `invalid_input` | bad path, unsafe tar entry, malformed id or name |\n\n\
`exec` and `run` exit with the command's status instead (128 + N when it was killed by \
signal N, 127 when it does not exist, 126 when it cannot be executed). An `import` stopped \
by SIGINT or SIGTERM exits 128 + N after saying what it leaves (`--json`: error kind \
`interrupted`). With `--json`, a \
failure prints `{\"error\": {\"kind\": ..., \"message\": ..., \"hint\": ...}}` on stdout.\n";

/// The Markdown reference.
#[cfg(test)]
pub fn cli_reference() -> String {
    let mut out = String::from(PREAMBLE);
    for (path, mut cmd) in commands() {
        let help = cmd.render_long_help().to_string();
        out.push_str(&format!(
            "\n## `{path}`\n\n```text\n{}\n```\n",
            help.trim_end()
        ));
    }
    out
}

/// Writes one man page per command into `dir`; gives how many.
pub fn write_man_pages(dir: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let all = commands();
    for (path, cmd) in &all {
        let name = path.replace(' ', "-");
        let cmd = cmd.clone().name(name.clone());
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut buf)
            .with_context(|| format!("render the man page of {path}"))?;
        let file = dir.join(format!("{name}.1"));
        std::fs::write(&file, buf).with_context(|| format!("write {}", file.display()))?;
    }
    Ok(all.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_reference_is_current() {
        let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        let want = cli_reference();
        if std::env::var_os("COWSPACE_UPDATE_DOCS").is_some() {
            std::fs::write(&doc, &want).unwrap();
        }
        let have = std::fs::read_to_string(&doc).unwrap_or_default();
        assert!(
            have == want,
            "docs/cli.md differs from the CLI's grammar: run \
             `COWSPACE_UPDATE_DOCS=1 cargo test -p mountctl cli_reference` and commit it"
        );
    }

    /// Every argument and flag of every command says what it is (`--help`, the man pages
    /// and docs/cli.md show it), and snapshot arguments say how short a prefix may be.
    #[test]
    fn every_argument_has_help() {
        let mut missing = Vec::new();
        for (path, cmd) in commands() {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path}: {id}"));
                }
            }
        }
        assert!(missing.is_empty(), "no help text for: {missing:#?}");
        for path in [
            "mountctl show",
            "mountctl export",
            "mountctl create",
            "mountctl diff",
        ] {
            let (_, mut cmd) = commands().into_iter().find(|(p, _)| p == path).unwrap();
            let help = cmd.render_long_help().to_string();
            assert!(help.contains("at least 6 hex digits"), "{path}: {help}");
        }
    }

    #[test]
    fn every_command_has_a_man_page_and_completions_name_them() {
        let tmp = tempfile::tempdir().unwrap();
        let n = write_man_pages(tmp.path()).unwrap();
        assert!(n > 20, "{n} man pages");
        for page in ["mountctl.1", "mountctl-sandbox-start.1", "mountctl-exec.1"] {
            let text = std::fs::read_to_string(tmp.path().join(page)).unwrap();
            assert!(text.contains(".TH"), "{page} is no man page");
        }
        let mut cmd = Cli::command();
        let mut buf = Vec::new();
        clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, "mountctl", &mut buf);
        let script = String::from_utf8(buf).unwrap();
        assert!(
            script.contains("sandbox") && script.contains("exec"),
            "bash completion"
        );
    }
}
