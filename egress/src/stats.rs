//! Per-host connection statistics: connections allowed and denied, bytes each way.
//!
//! Counters are atomics behind one `Arc` per host, so a relaying connection adds bytes
//! without a lock. The table holds at most [`MAX_STATS_HOSTS`] hosts; further hosts are
//! counted under [`OTHER_HOSTS_KEY`] so a client cannot grow host memory without bound.
//! DNS lookups are logged but not counted here: these are connection statistics.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Most hosts tracked one by one.
pub const MAX_STATS_HOSTS: usize = 10_000;
/// The key counting every host past [`MAX_STATS_HOSTS`].
pub const OTHER_HOSTS_KEY: &str = "(other hosts)";

/// Counters for one host (or the totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStats {
    /// Connections allowed.
    pub allowed: u64,
    /// Connections denied.
    pub denied: u64,
    /// Bytes sent from the sandbox to the host.
    pub bytes_up: u64,
    /// Bytes received from the host for the sandbox.
    pub bytes_down: u64,
}

/// A snapshot of the proxy's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Per host (as the client named it).
    pub hosts: BTreeMap<String, HostStats>,
    /// Sums over every host.
    pub totals: HostStats,
    /// Client connections open now (HTTP, SOCKS).
    pub connections_open: u64,
    /// Client connections refused because [`crate::server::MAX_OPEN_CONNECTIONS`] were open.
    pub connections_refused: u64,
    /// Decision records not written to the log (see [`crate::log`]).
    pub log_records_dropped: u64,
}

/// Live counters of one host.
#[derive(Debug, Default)]
pub struct HostCounters {
    allowed: AtomicU64,
    denied: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl HostCounters {
    /// Counts one decision.
    pub fn decision(&self, allowed: bool) {
        let c = if allowed { &self.allowed } else { &self.denied };
        c.fetch_add(1, Ordering::Relaxed);
    }
    /// Counts bytes from the sandbox to the host.
    pub fn up(&self, n: usize) {
        self.bytes_up.fetch_add(n as u64, Ordering::Relaxed);
    }
    /// Counts bytes from the host to the sandbox.
    pub fn down(&self, n: usize) {
        self.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
    }
    fn snapshot(&self) -> HostStats {
        HostStats {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
    }
}

/// The table of live counters.
#[derive(Debug, Default)]
pub struct StatsTable {
    hosts: Mutex<HashMap<String, Arc<HostCounters>>>,
}

impl StatsTable {
    /// The counters of `host`, created on first use.
    pub fn host(&self, host: &str) -> Arc<HostCounters> {
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = hosts.get(host) {
            return c.clone();
        }
        let key = if hosts.len() >= MAX_STATS_HOSTS {
            OTHER_HOSTS_KEY
        } else {
            host
        };
        hosts.entry(key.to_string()).or_default().clone()
    }

    /// Per-host counters and their totals; the caller fills the connection fields.
    pub fn snapshot(&self) -> Stats {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let mut stats = Stats::default();
        for (host, c) in hosts.iter() {
            let s = c.snapshot();
            stats.totals.allowed += s.allowed;
            stats.totals.denied += s.denied;
            stats.totals.bytes_up += s.bytes_up;
            stats.totals.bytes_down += s.bytes_down;
            stats.hosts.insert(host.clone(), s);
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_totals() {
        let t = StatsTable::default();
        t.host("a").decision(true);
        t.host("a").up(10);
        t.host("b").decision(false);
        t.host("a").down(7);
        let s = t.snapshot();
        assert_eq!(
            s.hosts["a"],
            HostStats {
                allowed: 1,
                denied: 0,
                bytes_up: 10,
                bytes_down: 7
            }
        );
        assert_eq!(
            s.totals,
            HostStats {
                allowed: 1,
                denied: 1,
                bytes_up: 10,
                bytes_down: 7
            }
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["hosts"]["b"]["denied"], 1);
        assert_eq!(json["connections_open"], 0);
    }
}
