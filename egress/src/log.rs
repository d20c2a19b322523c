//! The decision log: one JSON line per decision, appended to a file the caller opened.
//!
//! Every check the proxy makes ends in a [`DecisionRecord`] (`time`, `host`, `port`, `via`,
//! `verdict`, `rule`, optional `client`), written with one `write` call per line so lines
//! from concurrent connections never interleave (open the file with `O_APPEND`). DNS
//! lookups carry no port and are logged with port 0.
//!
//! Bound: the crate only gets an open [`File`], so it cannot rotate it. Past
//! [`MAX_LOG_BYTES`] it stops writing *allowed* records (denials are the evidence that
//! matters most) and past [`MAX_LOG_HARD_BYTES`] it stops writing anything; every record
//! not written is counted in [`DecisionLog::dropped`] (reported in the statistics). A write
//! error on an allowed decision is returned so the caller can refuse the connection: no
//! allowed connection happens without its record, except the counted ones past the bound.

use std::fs::File;
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Past this many bytes in the log file, allowed records are no longer written.
pub const MAX_LOG_BYTES: u64 = 16 * 1024 * 1024;
/// Past this many bytes in the log file, no record is written.
pub const MAX_LOG_HARD_BYTES: u64 = 32 * 1024 * 1024;

/// Which proxy made a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// A plain HTTP request through the HTTP proxy.
    Http,
    /// A `CONNECT` tunnel through the HTTP proxy.
    Connect,
    /// A SOCKS5 `CONNECT`.
    Socks,
    /// A DNS lookup.
    Dns,
}

/// The outcome of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The connection (or lookup) went ahead.
    Allowed,
    /// It was refused.
    Denied,
}

/// One line of the decision log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// RFC 3339 UTC with milliseconds, e.g. `2026-01-02T03:04:05.678Z`.
    pub time: String,
    /// The host as the client named it (normalized).
    pub host: String,
    /// The port, 0 for DNS lookups.
    pub port: u16,
    /// Which proxy decided.
    pub via: Via,
    /// Allowed or denied.
    pub verdict: Verdict,
    /// The rule that decided (`allow P`, `deny P`, `default deny`, `private address`, ...).
    pub rule: String,
    /// The client's socket address, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The headers the proxy sets on this connection's requests (`--inject`): names
    /// only, never values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<String>,
}

impl DecisionRecord {
    /// A record stamped now.
    pub fn now(
        host: &str,
        port: u16,
        via: Via,
        allowed: bool,
        rule: &str,
        client: Option<String>,
    ) -> Self {
        DecisionRecord {
            time: rfc3339_millis(SystemTime::now()),
            host: host.to_string(),
            port,
            via,
            verdict: if allowed {
                Verdict::Allowed
            } else {
                Verdict::Denied
            },
            rule: rule.to_string(),
            client,
            injected: Vec::new(),
        }
    }
}

/// The append-only decision log over a caller-opened file.
#[derive(Debug)]
pub struct DecisionLog {
    file: Mutex<(File, u64)>,
    dropped: AtomicU64,
}

impl DecisionLog {
    /// Wraps `file`; its current length counts toward the bound.
    pub fn new(file: File) -> DecisionLog {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        DecisionLog {
            file: Mutex::new((file, len)),
            dropped: AtomicU64::new(0),
        }
    }

    /// Appends `record` as one line, or counts it as dropped past the bound.
    pub fn record(&self, record: &DecisionRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let allowed = record.verdict == Verdict::Allowed;
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let (file, len) = &mut *guard;
        let bound = if allowed {
            MAX_LOG_BYTES
        } else {
            MAX_LOG_HARD_BYTES
        };
        if *len + line.len() as u64 > bound {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        match file.write_all(&line).and_then(|()| file.flush()) {
            Ok(()) => {
                *len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Records not written (past the bound or after a write error).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Formats `t` as RFC 3339 UTC with milliseconds.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom};
    use std::time::Duration;

    #[test]
    fn time_format() {
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_251_199_123); // leap year end of Feb
        assert_eq!(rfc3339_millis(t), "2024-02-29T23:59:59.123Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_millis(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn lines_and_bound() {
        let mut tmp = tempfile::tempfile().unwrap();
        let log = DecisionLog::new(tmp.try_clone().unwrap());
        let rec = DecisionRecord::now("a.test", 443, Via::Connect, true, "allow a.test", None);
        log.record(&rec).unwrap();
        let denied = DecisionRecord::now(
            "b.test",
            0,
            Via::Dns,
            false,
            "default deny",
            Some("x".into()),
        );
        log.record(&denied).unwrap();
        let mut text = String::new();
        tmp.seek(SeekFrom::Start(0)).unwrap();
        tmp.read_to_string(&mut text).unwrap();
        let lines: Vec<DecisionRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, vec![rec.clone(), denied.clone()]);
        assert!(!text.lines().next().unwrap().contains("client"));
        assert!(text.contains(r#""via":"dns","verdict":"denied""#));

        let full = DecisionLog::new(tempfile::tempfile().unwrap());
        full.file.lock().unwrap().1 = MAX_LOG_BYTES;
        full.record(&rec).unwrap();
        assert_eq!(full.dropped(), 1, "allowed records stop at the soft bound");
        full.record(&denied).unwrap();
        assert_eq!(full.dropped(), 1, "denials continue to the hard bound");
    }
}
