//! The keeper's end of qemu's monitor (QMP, a JSON protocol over the Unix socket
//! `qmp.sock` in the VM's run directory, which only root reaches): `stop` and `cont`
//! for `sandbox pause` / `resume`.
//!
//! One command per connection: read qemu's greeting, `qmp_capabilities`, the command,
//! each answered by one `return` or `error` line (asynchronous `event` lines between
//! are skipped). qemu serves one monitor client at a time; the keeper's callers are
//! serialized by its pause lock.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long qemu may take to answer one monitor command.
const QMP_TIMEOUT_MS: u64 = 10_000;
/// Most lines read while waiting for one answer (events in between).
const MAX_LINES_PER_ANSWER: usize = 1_000;
/// Longest line accepted from qemu, in bytes.
const MAX_LINE_BYTES: u64 = 1 << 20;

fn proto_err(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

fn read_answer<R: BufRead>(r: &mut R) -> std::io::Result<serde_json::Value> {
    for _ in 0..MAX_LINES_PER_ANSWER {
        let mut line = String::new();
        let n = std::io::Read::take(&mut *r, MAX_LINE_BYTES).read_line(&mut line)?;
        if n == 0 {
            return Err(proto_err("qemu closed its monitor".into()));
        }
        let v: serde_json::Value = serde_json::from_str(line.trim())
            .map_err(|e| proto_err(format!("qemu's monitor said {line:?}: {e}")))?;
        if v.get("return").is_some() || v.get("QMP").is_some() {
            return Ok(v);
        }
        if let Some(e) = v.get("error") {
            return Err(proto_err(format!(
                "qemu refused: {}",
                e["desc"].as_str().unwrap_or("no reason given")
            )));
        }
    }
    Err(proto_err(format!(
        "no answer from qemu's monitor within {MAX_LINES_PER_ANSWER} lines"
    )))
}

/// Runs the argument-less monitor command `command` (`stop`, `cont`) on the monitor at
/// `sock`; returns once qemu has answered (for `stop`: every vCPU has stopped).
pub fn execute(sock: &Path, command: &str) -> std::io::Result<()> {
    let s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_millis(QMP_TIMEOUT_MS)))?;
    s.set_write_timeout(Some(Duration::from_millis(QMP_TIMEOUT_MS)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    read_answer(&mut r)?; // the greeting
    for cmd in ["qmp_capabilities", command] {
        w.write_all(serde_json::json!({ "execute": cmd }).to_string().as_bytes())?;
        w.write_all(b"\n")?;
        read_answer(&mut r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    /// A monitor that greets, then answers each line with `answers` in turn (an event
    /// before each), recording what it was sent.
    fn fake_monitor(
        answers: Vec<&'static str>,
    ) -> (tempfile::TempDir, std::thread::JoinHandle<String>) {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("qmp.sock")).unwrap();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            c.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut seen = String::new();
            let mut r = BufReader::new(c.try_clone().unwrap());
            for a in answers {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                seen.push_str(&line);
                c.write_all(b"{\"event\": \"STOP\", \"timestamp\": {}}\n")
                    .unwrap();
                c.write_all(a.as_bytes()).unwrap();
                c.write_all(b"\n").unwrap();
            }
            let _ = r.read_to_string(&mut String::new());
            seen
        });
        (dir, t)
    }

    #[test]
    fn a_command_negotiates_then_runs_skipping_events() {
        let (dir, t) = fake_monitor(vec!["{\"return\": {}}", "{\"return\": {}}"]);
        execute(&dir.path().join("qmp.sock"), "stop").unwrap();
        let seen = t.join().unwrap();
        assert_eq!(
            seen,
            "{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"stop\"}\n"
        );
    }

    #[test]
    fn an_error_answer_is_reported_with_its_reason() {
        let (dir, t) = fake_monitor(vec![
            "{\"return\": {}}",
            "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}",
        ]);
        let err = execute(&dir.path().join("qmp.sock"), "cont").unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        t.join().unwrap();
    }
}
