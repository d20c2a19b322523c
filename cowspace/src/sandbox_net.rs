//! A running sandbox's network, changed while it runs: its egress policy, its decision
//! log, and ports published or unpublished (`docs/sandbox.md`, "Egress").

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::registry::Record;
use crate::runtime::Runtime;
use crate::sandbox::{from_helper, sandbox_name};

/// A change of a running sandbox's egress policy (`mountctl sandbox policy`, the
/// socket's `sandbox_policy`): applied as reset, removals, allows, denies.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyUpdate {
    /// Patterns added to the allowed hosts.
    pub allow_host: Vec<String>,
    /// Patterns added to the denied hosts (deny wins).
    pub deny_host: Vec<String>,
    /// Patterns taken out of both lists.
    pub remove_host: Vec<String>,
    /// Empty both lists first (the `--add-host` names stay).
    pub reset: bool,
    /// `--inject HOST=HEADER:@FILE` rules added (FILE read host-side by the keeper).
    pub inject: Vec<String>,
    /// `--remove-inject HOST[=HEADER]`: rules taken out.
    pub remove_inject: Vec<String>,
}

impl PolicyUpdate {
    /// The changes in the order they apply, each pattern checked (the error names the
    /// flag and the pattern).
    pub fn changes(&self) -> Result<Vec<cowspace_egress::policy::PolicyChange>> {
        use cowspace_egress::policy::{HostPattern, PolicyChange};
        if self.allow_host.is_empty()
            && self.deny_host.is_empty()
            && self.remove_host.is_empty()
            && !self.reset
            && self.inject.is_empty()
            && self.remove_inject.is_empty()
        {
            return Err(Error::Invalid(
                "no change given: name --allow-host, --deny-host, --remove-host, --reset, \
                 --inject or --remove-inject \
                 (`mountctl sandbox status WS` shows the policy in force)"
                    .into(),
            ));
        }
        let parse = |flag: &str, p: &String| {
            p.parse::<HostPattern>()
                .map_err(|e| Error::Invalid(format!("{flag} {p:?}: {e}")))
        };
        let mut out = Vec::new();
        if self.reset {
            out.push(PolicyChange::Reset);
        }
        for p in &self.remove_host {
            out.push(PolicyChange::Remove(parse("--remove-host", p)?));
        }
        for p in &self.allow_host {
            out.push(PolicyChange::Allow(parse("--allow-host", p)?));
        }
        for p in &self.deny_host {
            out.push(PolicyChange::Deny(parse("--deny-host", p)?));
        }
        Ok(out)
    }
}

impl Runtime {
    /// Changes the egress policy of `ws`'s running sandbox: new connections follow it at
    /// once, established ones are not cut. Answers the policy now in force.
    pub fn sandbox_policy(&self, ws: &str, update: &PolicyUpdate) -> Result<Value> {
        let changes = update.changes()?;
        let rec = self.live_record(ws)?;
        let client = self.client_of(&rec)?;
        let mut v = if update.inject.is_empty() && update.remove_inject.is_empty() {
            client.policy(changes)
        } else {
            client.policy_injecting(changes, update.inject.clone(), update.remove_inject.clone())
        }
        .map_err(from_helper)?;
        v["workspace"] = json!(rec.id);
        Ok(v)
    }

    /// Publishes `port` of `ws`'s running sandbox on a unique 127.0.0.1 host port, now;
    /// answers `{"port", "host_port"}`.
    pub fn sandbox_publish(&self, ws: &str, port: u16) -> Result<Value> {
        let rec = self.live_record(ws)?;
        let mut v = self.client_of(&rec)?.publish(port).map_err(from_helper)?;
        self.refresh_ports(&rec);
        v["workspace"] = json!(rec.id);
        Ok(v)
    }

    /// Stops publishing `port` of `ws`'s running sandbox.
    pub fn sandbox_unpublish(&self, ws: &str, port: u16) -> Result<Value> {
        let rec = self.live_record(ws)?;
        let mut v = self.client_of(&rec)?.unpublish(port).map_err(from_helper)?;
        self.refresh_ports(&rec);
        v["workspace"] = json!(rec.id);
        Ok(v)
    }

    /// The registry's copy of the ports, from the keeper (which holds the truth).
    fn refresh_ports(&self, rec: &Record) {
        if let Ok(c) = self.client_of(rec)
            && let Ok(status) = c.status()
        {
            let _ = self.set_ports(&rec.id, status["ports"].clone());
        }
    }

    /// The egress decisions of `ws`'s running sandbox, oldest first (`tail`: the last
    /// that many), one object each: time, host, port, via, verdict, rule.
    pub fn sandbox_log(&self, ws: &str, tail: Option<usize>) -> Result<Vec<Value>> {
        let path = self.sandbox_log_path(ws)?;
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::io("read the egress log", &path)(e)),
        };
        let mut out: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if let Some(n) = tail {
            let skip = out.len().saturating_sub(n);
            out.drain(..skip);
        }
        Ok(out)
    }

    /// The decision log of `ws`'s running sandbox (`invalid_input` when it was not
    /// started with `--net egress`).
    pub fn sandbox_log_path(&self, ws: &str) -> Result<PathBuf> {
        let rec = self.live_record(ws)?;
        let egress = rec.sandbox.as_ref().is_some_and(|s| s["net"] == "egress");
        if !egress {
            return Err(Error::Invalid(format!(
                "the sandbox of workspace {} was not started with --net egress: it makes no \
                 egress decisions",
                rec.id
            )));
        }
        Ok(sandbox_api::egress_log_path(
            &self.sandbox_state_dir(),
            &sandbox_name(&rec),
        ))
    }
}
