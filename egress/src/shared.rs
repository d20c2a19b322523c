//! State shared by every connection of one proxy, and the admission check they all use.
//!
//! [`Shared::admit`] is the single gate: the policy decision on the name the client asked
//! for, then the address rules ([`crate::policy::select_targets`]), then the log record,
//! then the statistics. Nothing connects upstream without an `Ok` from it, and the
//! addresses it returns are the only ones a connection may use.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::inject::InjectState;
use crate::log::{DecisionLog, DecisionRecord, Via};
use crate::policy::{
    Decision, Host, Policy, RULE_PRIVATE, RULE_RESOLVE_FAILED, Resolve, TargetError, select_targets,
};
use crate::stats::{HostCounters, StatsTable};

/// Timeout of one upstream connect attempt.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most addresses tried for one upstream connection.
pub const MAX_CONNECT_ADDRS: usize = 4;

/// Why [`Shared::admit`] refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The patterns refused (`deny P`, `default deny`, `invalid host`).
    Policy(Decision),
    /// Every address is private.
    Private,
    /// The name does not resolve.
    Unresolvable(String),
    /// The decision could not be recorded.
    Internal(String),
}

/// What [`Shared::admit`] grants.
pub(crate) struct Admitted {
    /// Where to connect, in order.
    pub targets: Vec<SocketAddr>,
    /// The host's live counters.
    pub counters: Arc<HostCounters>,
}

/// Everything the connection threads share.
pub(crate) struct Shared {
    pub policy: RwLock<Arc<Policy>>,
    pub resolver: Arc<dyn Resolve + Send + Sync>,
    pub host_addrs: Vec<IpAddr>,
    pub log: DecisionLog,
    pub stats: StatsTable,
    pub open: AtomicUsize,
    pub refused: AtomicU64,
    pub stopping: AtomicBool,
    pub inject: RwLock<Arc<InjectState>>,
}

impl Shared {
    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The injection rules in force now.
    pub fn inject(&self) -> Arc<InjectState> {
        self.inject
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records a decision and counts it; `Err` when an allowed record could not be written.
    pub fn record(
        &self,
        host: &Host,
        port: u16,
        via: Via,
        allowed: bool,
        rule: &str,
        client: &Option<String>,
    ) -> io::Result<()> {
        self.record_injected(host, port, via, allowed, rule, client, Vec::new())
    }

    /// [`Shared::record`] naming the headers the connection gets injected.
    #[allow(clippy::too_many_arguments)]
    fn record_injected(
        &self,
        host: &Host,
        port: u16,
        via: Via,
        allowed: bool,
        rule: &str,
        client: &Option<String>,
        injected: Vec<String>,
    ) -> io::Result<()> {
        let host = host.text();
        let mut record = DecisionRecord::now(&host, port, via, allowed, rule, client.clone());
        record.injected = injected;
        let written = self.log.record(&record);
        if via != Via::Dns {
            self.stats.host(&host).decision(allowed && written.is_ok());
        }
        written
    }

    /// The gate: decides, resolves, logs and counts one connection to `host:port`.
    pub fn admit(
        &self,
        host: &Host,
        port: u16,
        via: Via,
        client: &Option<String>,
    ) -> Result<Admitted, Refusal> {
        let policy = self.policy();
        let decision = policy.decide_host(host, port);
        if !decision.allowed {
            let _ = self.record(host, port, via, false, &decision.rule, client);
            return Err(Refusal::Policy(decision));
        }
        let ips = match select_targets(&policy, host, self.resolver.as_ref(), &self.host_addrs) {
            Ok(ips) => ips,
            Err(TargetError::Private(_)) => {
                let _ = self.record(host, port, via, false, RULE_PRIVATE, client);
                return Err(Refusal::Private);
            }
            Err(e @ TargetError::Resolve { .. }) => {
                let _ = self.record(host, port, via, false, RULE_RESOLVE_FAILED, client);
                return Err(Refusal::Unresolvable(e.to_string()));
            }
        };
        let injected = {
            let state = self.inject();
            match via {
                Via::Http => state.headers_for(host),
                Via::Connect if state.tls.is_some() => state.headers_for(host),
                _ => Vec::new(),
            }
        };
        if let Err(e) =
            self.record_injected(host, port, via, true, &decision.rule, client, injected)
        {
            return Err(Refusal::Internal(format!(
                "cannot write the decision log: {e}"
            )));
        }
        let targets = ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect();
        Ok(Admitted {
            targets,
            counters: self.stats.host(&host.text()),
        })
    }

    /// Records a later denial of an admitted connection (`sni mismatch`, `host mismatch`).
    pub fn deny_later(
        &self,
        host: &Host,
        port: u16,
        via: Via,
        rule: &str,
        client: &Option<String>,
    ) {
        let _ = self.record(host, port, via, false, rule, client);
    }
}

/// Connects to the first of `targets` that answers (at most [`MAX_CONNECT_ADDRS`] tried).
pub(crate) fn connect_upstream(targets: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
    for target in targets.iter().take(MAX_CONNECT_ADDRS) {
        match TcpStream::connect_timeout(target, UPSTREAM_CONNECT_TIMEOUT) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = io::Error::new(e.kind(), format!("connect to {target}: {e}")),
        }
    }
    Err(last)
}

/// Keeps [`Shared::open`] counting one connection while alive.
pub(crate) struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    /// Counts a new connection, or `None` when `max` are open.
    pub fn try_new(shared: &Arc<Shared>, max: usize) -> Option<OpenGuard> {
        let prev = shared.open.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            shared.open.fetch_sub(1, Ordering::AcqRel);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(OpenGuard(shared.clone()))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}
