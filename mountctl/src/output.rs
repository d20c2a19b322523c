//! Output conventions: one JSON object on stdout with --json, people's text otherwise;
//! errors mapped to the stable kinds and exit codes of CLI.md.

use std::path::PathBuf;
use std::process::ExitCode;

use cowspace_store::ErrorKind;
use serde_json::json;

/// What every command gets.
#[derive(Debug)]
pub struct Ctx {
    pub root: PathBuf,
    pub json: bool,
    pub quiet: bool,
    /// Draw progress bars (stderr is a terminal).
    pub progress: bool,
    /// The configuration files' defaults (`cowspace::config`).
    pub config: cowspace::config::Config,
    /// `--root`, as given.
    pub root_flag: Option<PathBuf>,
}

impl Ctx {
    /// Prints a command's result: the JSON value, or the human text.
    pub fn emit(&self, value: serde_json::Value, human: impl FnOnce() -> String) {
        use std::io::Write;
        // A closed stdout (`| head`) is not an error of the command.
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(out, "{value}");
        } else {
            let text = human();
            if !text.is_empty() {
                let _ = writeln!(out, "{}", text.trim_end_matches('\n'));
            }
        }
    }

    /// [`Ctx::emit`] for a confirmation of what was done ("removed …"), which
    /// `-q` silences; the JSON object is printed either way.
    pub fn confirm(&self, value: serde_json::Value, human: impl FnOnce() -> String) {
        if self.quiet && !self.json {
            return;
        }
        self.emit(value, human)
    }

    /// A message for people on stderr (never on stdout).
    pub fn note(&self, msg: &str) {
        if !self.quiet {
            eprintln!("{msg}");
        }
    }

    pub fn open(&self) -> anyhow::Result<cowspace_store::Store> {
        Ok(cowspace::remote::open_store(&self.root)?)
    }

    pub fn runtime(&self) -> anyhow::Result<cowspace::runtime::Runtime> {
        Ok(cowspace::runtime::Runtime::open(&self.root)?)
    }
}

fn classify(e: &anyhow::Error) -> (ErrorKind, Option<String>) {
    for cause in e.chain() {
        if let Some(s) = cause.downcast_ref::<cowspace_store::Error>() {
            return (s.kind(), s.hint());
        }
        if let Some(s) = cause.downcast_ref::<cowspace::error::Error>() {
            return (s.kind(), s.hint());
        }
    }
    (ErrorKind::Io, None)
}

/// The error and its causes, joined by ": " as `{e:#}` does, leaving out a cause whose
/// text the message holds already (an error that prints its source itself, as the
/// libraries' `Io` variants do, would otherwise show it twice).
fn message_of(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// Prints an error (JSON on stdout with --json, text on stderr) and gives its exit code.
pub fn report_error(ctx: &Ctx, e: &anyhow::Error) -> ExitCode {
    let (kind, hint) = classify(e);
    let message = message_of(e);
    print_error(kind.as_str(), &message, hint.as_deref(), ctx.json, None);
    ExitCode::from(kind.exit_code())
}

/// Prints an error with an extra JSON payload (fsck's report) and gives its exit code.
pub fn report_error_with(
    ctx: &Ctx,
    kind: ErrorKind,
    message: &str,
    hint: Option<&str>,
    extra: serde_json::Value,
) -> ExitCode {
    print_error(kind.as_str(), message, hint, ctx.json, Some(extra));
    ExitCode::from(kind.exit_code())
}

fn print_error(
    kind: &str,
    message: &str,
    hint: Option<&str>,
    json: bool,
    extra: Option<serde_json::Value>,
) {
    if json {
        let mut v = json!({"error": {"kind": kind, "message": message, "hint": hint}});
        if let Some(serde_json::Value::Object(map)) = extra {
            for (k, val) in map {
                v[k] = val;
            }
        }
        let _ = write_stdout(format!("{v}\n").as_bytes());
    }
    eprintln!("mountctl: {message}");
    if let Some(h) = hint {
        eprintln!("hint: {h}");
    }
}

/// A usage error (exit 2).
pub fn usage_error(text: &str, json: bool) -> ExitCode {
    if json {
        let first = text
            .lines()
            .next()
            .unwrap_or(text)
            .trim_start_matches("error: ");
        let v =
            json!({"error": {"kind": "usage", "message": first, "hint": "see mountctl --help"}});
        let _ = write_stdout(format!("{v}\n").as_bytes());
    }
    eprint!("{text}");
    ExitCode::from(2)
}

/// Whether a write failed because the reader went away (`| head`): a command then ends
/// quietly, as Unix tools do, instead of reporting an error.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes `bytes` to stdout; a reader gone (`| head`) is not an error (see
/// [`is_broken_pipe`]), any other failure is.
pub fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::from(e).context("write to stdout"))
        }
        _ => Ok(()),
    }
}

/// A time in Unix seconds as people read it: `2026-12-06 08:04:11 UTC`.
pub fn date(unix_secs: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs.max(0) as u64);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replacen('T', " ", 1)
        .replace('Z', " UTC")
}

/// [`date`] and how long ago it was (`3 min ago`), for a record shown alone.
pub fn date_ago(unix_secs: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(unix_secs);
    let ago = (now - unix_secs).max(0);
    let words = match ago {
        0..60 => format!("{ago} s ago"),
        60..3600 => format!("{} min ago", ago / 60),
        3600..86400 => format!("{} h ago", ago / 3600),
        _ => format!("{} days ago", ago / 86400),
    };
    format!("{} ({words})", date(unix_secs))
}

/// Human-readable bytes.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A snapshot id in an answer (64 hex digits), shortened for people.
pub fn short(id: &serde_json::Value) -> String {
    let hex = id.as_str().unwrap_or_default();
    hex[..hex.len().min(cowspace_store::id::SHORT_ID_HEX)].to_string()
}

/// The strings of an array in an answer.
pub fn strs(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_as_people_write_them() {
        assert_eq!(date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(date(1_796_545_087), "2026-12-06 08:18:07 UTC");
        assert!(date_ago(1_796_545_087).starts_with("2026-12-06 08:18:07 UTC ("));
    }

    #[test]
    fn a_cause_the_message_holds_already_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(17);
        let e: anyhow::Error = cowspace_store::Error::Io {
            step: "create directory",
            path: "/x".into(),
            source: io,
        }
        .into();
        let m = message_of(&e);
        assert_eq!(m.matches("os error 17").count(), 1, "{m}");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(message_of(&e), "outer: inner");
    }
}
