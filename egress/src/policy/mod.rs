//! The host policy: allow and deny patterns, `add_hosts`, and the decision for one
//! connection.
//!
//! A decision is made on the host name the client asked for, before any resolution:
//! a matching deny pattern wins, else the first matching allow pattern allows, else the
//! connection is denied by `"default deny"`. A host that is not a valid name or IP literal
//! is denied by `"invalid host"`. Address rules (private ranges, rebinding) come after, in
//! [`addr`]. Policies are plain values: the server swaps a whole [`Policy`] at once.

pub mod addr;
mod pattern;

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

pub use addr::{Resolve, SystemResolver, TargetError, is_private, is_private_for, select_targets};
pub use pattern::{AddHost, Host, HostPattern, MAX_LABEL_BYTES, MAX_NAME_BYTES, PatternError};

/// Rule of a denial when no allow pattern matches.
pub const RULE_DEFAULT_DENY: &str = "default deny";
/// Rule of a denial when every address of the host is private.
pub const RULE_PRIVATE: &str = "private address";
/// Rule of a denial when a TLS ClientHello names another host than the tunnel's.
pub const RULE_SNI_MISMATCH: &str = "sni mismatch";
/// Rule of a denial when an HTTP `Host` header names another host than the target.
pub const RULE_HOST_MISMATCH: &str = "host mismatch";
/// Rule of a denial when the requested host is not a valid name or address.
pub const RULE_INVALID_HOST: &str = "invalid host";
/// Rule of a denial when the name cannot be resolved.
pub const RULE_RESOLVE_FAILED: &str = "resolve failed";
/// Rule of a denial when the first bytes of a tunnel look like TLS but do not parse.
pub const RULE_BAD_CLIENT_HELLO: &str = "malformed client hello";

/// The outcome of checking one host and port against a [`Policy`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Whether the connection may go ahead.
    pub allowed: bool,
    /// What decided: `allow PATTERN`, `deny PATTERN`, `default deny`, or another `RULE_*`.
    pub rule: String,
}

impl Decision {
    /// A denial by `rule`.
    pub fn deny(rule: impl Into<String>) -> Decision {
        Decision {
            allowed: false,
            rule: rule.into(),
        }
    }
}

/// A sandbox's egress policy. Default: nothing allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// `--allow-host` patterns.
    pub allow: Vec<HostPattern>,
    /// `--deny-host` patterns; they win over `allow`.
    pub deny: Vec<HostPattern>,
    /// `--add-host` entries: names resolved to fixed (possibly private) addresses.
    pub add_hosts: Vec<AddHost>,
}

/// One live change (`mountctl sandbox policy WS ...`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyChange {
    /// `--allow-host P`: add P to the allow list (once).
    Allow(HostPattern),
    /// `--deny-host P`: add P to the deny list (once).
    Deny(HostPattern),
    /// `--remove-host P`: remove P from both lists.
    Remove(HostPattern),
    /// `--reset`: empty both lists; `add_hosts` are kept.
    Reset,
}

impl Policy {
    /// Decides a connection to `host` (a name, or an IP literal with or without brackets)
    /// on `port`.
    pub fn decide(&self, host: &str, port: u16) -> Decision {
        match Host::parse(host) {
            Ok(host) => self.decide_host(&host, port),
            Err(_) => Decision::deny(RULE_INVALID_HOST),
        }
    }

    /// [`Policy::decide`] for an already parsed host.
    pub fn decide_host(&self, host: &Host, port: u16) -> Decision {
        if let Some(deny) = self.deny.iter().find(|p| p.matches(host, port)) {
            return Decision::deny(format!("deny {deny}"));
        }
        match self.allow.iter().find(|p| p.matches(host, port)) {
            Some(allow) => Decision {
                allowed: true,
                rule: format!("allow {allow}"),
            },
            None => Decision::deny(RULE_DEFAULT_DENY),
        }
    }

    /// Whether `host` is allowed on some port: an allow pattern names it and no port-less
    /// deny pattern does. Used by the DNS responder, which sees no port.
    pub fn decide_name(&self, host: &Host) -> Decision {
        let denied = self
            .deny
            .iter()
            .find(|p| p.port().is_none() && p.matches_host(host));
        if let Some(deny) = denied {
            return Decision::deny(format!("deny {deny}"));
        }
        match self.allow.iter().find(|p| p.matches_host(host)) {
            Some(allow) => Decision {
                allowed: true,
                rule: format!("allow {allow}"),
            },
            None => Decision::deny(RULE_DEFAULT_DENY),
        }
    }

    /// The `add_hosts` addresses of `host`, in order (empty when it has none).
    pub fn added_addrs(&self, host: &Host) -> Vec<IpAddr> {
        match host {
            Host::Name(name) => self
                .add_hosts
                .iter()
                .filter(|a| &a.name == name)
                .map(|a| a.addr)
                .collect(),
            Host::Ip(_) => Vec::new(),
        }
    }

    /// Applies `changes` in order.
    pub fn apply(&mut self, changes: &[PolicyChange]) {
        for change in changes {
            match change {
                PolicyChange::Allow(p) if !self.allow.contains(p) => self.allow.push(p.clone()),
                PolicyChange::Deny(p) if !self.deny.contains(p) => self.deny.push(p.clone()),
                PolicyChange::Allow(_) | PolicyChange::Deny(_) => {}
                PolicyChange::Remove(p) => {
                    self.allow.retain(|q| q != p);
                    self.deny.retain(|q| q != p);
                }
                PolicyChange::Reset => {
                    self.allow.clear();
                    self.deny.clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy {
            allow: allow.iter().map(|s| s.parse().unwrap()).collect(),
            deny: deny.iter().map(|s| s.parse().unwrap()).collect(),
            add_hosts: Vec::new(),
        }
    }

    #[test]
    fn deny_wins_and_rules_are_named() {
        let p = policy(&["*.example.com", "pypi.org:443"], &["evil.example.com"]);
        assert_eq!(p.decide("a.example.com", 80).rule, "allow *.example.com");
        assert!(p.decide("a.example.com", 80).allowed);
        assert_eq!(
            p.decide("EVIL.example.com.", 443),
            Decision::deny("deny evil.example.com")
        );
        assert_eq!(
            p.decide("example.com", 443),
            Decision::deny(RULE_DEFAULT_DENY)
        );
        assert!(p.decide("pypi.org", 443).allowed);
        assert_eq!(p.decide("pypi.org", 80), Decision::deny(RULE_DEFAULT_DENY));
        assert_eq!(p.decide("bad host", 80), Decision::deny(RULE_INVALID_HOST));
        assert!(!Policy::default().decide("example.com", 443).allowed);
    }

    #[test]
    fn dns_view_ignores_ports_but_not_portless_denies() {
        let p = policy(&["pypi.org:443", "*.x.test"], &["a.x.test:80", "b.x.test"]);
        let host = |s: &str| Host::parse(s).unwrap();
        assert!(p.decide_name(&host("pypi.org")).allowed);
        assert!(p.decide_name(&host("a.x.test")).allowed);
        assert_eq!(p.decide_name(&host("b.x.test")).rule, "deny b.x.test");
        assert!(!p.decide_name(&host("other.test")).allowed);
    }

    #[test]
    fn apply_changes() {
        let mut p = policy(&["a.test"], &["b.test"]);
        p.add_hosts.push("m.test:10.0.0.1".parse().unwrap());
        let pat = |s: &str| s.parse::<HostPattern>().unwrap();
        p.apply(&[
            PolicyChange::Allow(pat("c.test")),
            PolicyChange::Allow(pat("c.test")),
            PolicyChange::Remove(pat("b.test")),
            PolicyChange::Deny(pat("a.test")),
        ]);
        assert_eq!(p.allow, vec![pat("a.test"), pat("c.test")]);
        assert_eq!(p.deny, vec![pat("a.test")]);
        p.apply(&[PolicyChange::Remove(pat("a.test"))]);
        assert_eq!(p.allow, vec![pat("c.test")]);
        assert!(p.deny.is_empty());
        p.apply(&[PolicyChange::Reset]);
        assert!(p.allow.is_empty() && p.deny.is_empty());
        assert_eq!(p.add_hosts.len(), 1);
    }

    #[test]
    fn serde_round_trip_and_unknown_fields_refused() {
        let mut p = policy(&["*.example.com:443"], &["x.example.com"]);
        p.add_hosts.push("m.test:[fd00::1]".parse().unwrap());
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
        assert!(serde_json::from_str::<Policy>(r#"{"alow":["x.com"]}"#).is_err());
        assert!(serde_json::from_str::<Policy>(r#"{"allow":["http://x.com"]}"#).is_err());
    }
}
