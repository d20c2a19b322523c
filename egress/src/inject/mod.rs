//! Credentials added by the proxy: the worker never holds them.
//!
//! An [`Injection`] says "on requests to HOST, set HEADER to VALUE". The values come
//! from the process that manages the proxy, over its control socket
//! ([`crate::ControlRequest::SetInjections`]), and live only in this process's memory:
//! they are never logged, never answered back, and `Debug` does not show them
//! ([`SecretValue`]). The decision log names the headers a connection got
//! (`"injected": ["authorization"]`), never their values.
//!
//! Plain HTTP requests to such a host get the header set by the forward proxy
//! ([`crate::http`]); whatever header of that name the client sent is removed first.
//! `CONNECT` to such a host is the one case where the proxy decrypts: it answers the
//! client's TLS with a leaf certificate for the host signed by a certificate authority
//! made for this sandbox ([`ca`]), and talks TLS to the real host itself, verifying its
//! certificate against the host's roots plus any `--upstream-ca` ([`mitm`]). Every other
//! host's `CONNECT` stays a passthrough tunnel that is never decrypted.
//!
//! A host name's rules apply on every port the policy allows for it; only exact names
//! (no wildcards) carry injections, so a rule never reaches a host it was not written for.

pub mod ca;
pub(crate) mod mitm;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::policy::Host;

/// Longest injected value, in bytes.
pub const MAX_INJECT_VALUE_BYTES: usize = 16 * 1024;
/// Most injection rules of one proxy.
pub const MAX_INJECTIONS: usize = 256;

/// A credential's value. `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretValue(pub String);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretValue(<{} bytes>)", self.0.len())
    }
}

/// One rule: requests to `host` carry `header: value`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Injection {
    /// The exact host name (normalized: lowercase, no trailing dot).
    pub host: String,
    /// The header's name, as it is sent.
    pub header: String,
    /// The header's value.
    pub value: SecretValue,
    /// Methods allowed to this host (uppercase); empty: every method.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
}

/// What the injection rules of one proxy are, as set over the control socket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InjectConfig {
    /// The rules.
    pub injections: Vec<Injection>,
    /// The sandbox's certificate authority, for TLS termination.
    pub ca: Option<ca::CaPem>,
    /// More roots (PEM) to verify upstream hosts with, beside the host's own.
    pub upstream_ca_pem: Option<String>,
}

/// Why a rule is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// The header name is not an HTTP token.
    #[error(
        "header name {0:?} is not an HTTP field name (letters, digits and !#$%&'*+-.^_`|~ only)"
    )]
    HeaderName(String),
    /// The header is one the proxy sets itself.
    #[error("header {0:?} cannot be injected: the proxy sets it from the request's framing")]
    ReservedHeader(String),
    /// The value holds a byte a header cannot carry.
    #[error("the value holds a newline, carriage return or other control byte")]
    Value,
    /// The value is too long.
    #[error("the value is longer than {MAX_INJECT_VALUE_BYTES} bytes")]
    TooLong,
    /// The host is not an exact name.
    #[error("host {0:?} is not an exact host name (no wildcard, port or address)")]
    Host(String),
    /// A method is not an HTTP token.
    #[error("method {0:?} is not an HTTP method name")]
    Method(String),
    /// Too many rules.
    #[error("more than {MAX_INJECTIONS} injection rules")]
    TooMany,
}

/// Checks a PEM file of upstream roots as the proxy will load it; the number of
/// certificates.
pub fn check_upstream_ca(pem: &str) -> Result<usize, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("not a PEM certificate: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("a certificate is refused: {e}"))?;
    }
    match roots.len() {
        0 => Err("holds no PEM certificate".into()),
        n => Ok(n),
    }
}

/// Whether `name` is an HTTP token (RFC 9110 `tchar`).
pub fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl Injection {
    /// Checks the rule (host, header name, value, methods) and normalizes host and methods.
    pub fn checked(mut self) -> Result<Injection, InjectError> {
        match Host::parse(&self.host) {
            Ok(Host::Name(n)) if !self.host.contains(['*', ':']) => self.host = n,
            _ => return Err(InjectError::Host(self.host)),
        }
        if !is_token(&self.header) {
            return Err(InjectError::HeaderName(self.header));
        }
        let lower = self.header.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "host"
                | "content-length"
                | "transfer-encoding"
                | "connection"
                | "te"
                | "trailer"
                | "upgrade"
                | "keep-alive"
                | "expect"
        ) || lower.starts_with("proxy-")
        {
            return Err(InjectError::ReservedHeader(self.header));
        }
        if self.value.0.len() > MAX_INJECT_VALUE_BYTES {
            return Err(InjectError::TooLong);
        }
        if self
            .value
            .0
            .bytes()
            .any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(InjectError::Value);
        }
        for m in &mut self.methods {
            if !is_token(m) {
                return Err(InjectError::Method(m.clone()));
            }
            *m = m.to_ascii_uppercase();
        }
        Ok(self)
    }
}

/// The rules in force and the TLS terminator, swapped as a whole.
#[derive(Debug, Default)]
pub(crate) struct InjectState {
    pub rules: Vec<Injection>,
    pub tls: Option<Arc<mitm::Terminator>>,
}

impl InjectState {
    /// Builds the state from a checked configuration.
    pub fn new(config: InjectConfig) -> Result<InjectState, String> {
        if config.injections.len() > MAX_INJECTIONS {
            return Err(InjectError::TooMany.to_string());
        }
        let rules = config
            .injections
            .into_iter()
            .map(|i| {
                let (host, header) = (i.host.clone(), i.header.clone());
                i.checked()
                    .map_err(|e| format!("injection for {host} ({header}): {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tls = match config.ca {
            Some(ca) => Some(Arc::new(mitm::Terminator::new(
                &ca,
                config.upstream_ca_pem.as_deref(),
            )?)),
            None => None,
        };
        Ok(InjectState { rules, tls })
    }

    /// The rules for `host` (none for an address).
    pub fn for_host(&self, host: &Host) -> Vec<&Injection> {
        match host {
            Host::Name(n) => self.rules.iter().filter(|r| &r.host == n).collect(),
            Host::Ip(_) => Vec::new(),
        }
    }

    /// The header names `host` gets, lowercase, each once.
    pub fn headers_for(&self, host: &Host) -> Vec<String> {
        let mut names: Vec<String> = self
            .for_host(host)
            .iter()
            .map(|r| r.header.to_ascii_lowercase())
            .collect();
        names.dedup();
        names
    }

    /// The methods `host`'s rules allow (empty: every method).
    pub fn allowed_methods(&self, host: &Host) -> Vec<String> {
        let mut all: Vec<String> = self
            .for_host(host)
            .iter()
            .flat_map(|r| r.methods.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Whether `method` may go to `host`: every rule of the host naming methods must
    /// name it.
    /// The body of a method refusal, naming the rule.
    pub fn method_refusal(&self, host: &Host, port: u16, method: &str) -> String {
        let allowed = self.allowed_methods(host);
        let why = if allowed.is_empty() {
            "a host with injected credentials is never sent TRACE or TRACK (the answer \
             would echo the credential)"
                .to_string()
        } else {
            format!(
                "the injected host allows {} only; change it with --inject-methods",
                allowed.join(",")
            )
        };
        format!(
            "cowspace: {method} to {} denied by method rule: {why}",
            host.authority(port)
        )
    }

    /// `TRACE` and `TRACK` never go to a host with rules: the answer would echo the
    /// injected header back to the worker.
    pub fn method_allowed(&self, host: &Host, method: &str) -> bool {
        let rules = self.for_host(host);
        if !rules.is_empty() && ["TRACE", "TRACK"].contains(&method) {
            return false;
        }
        rules
            .iter()
            .all(|r| r.methods.is_empty() || r.methods.iter().any(|m| m == method))
    }
}

/// A list of header fields, as the proxy holds them.
pub(crate) type Fields = Vec<(String, Vec<u8>)>;

/// `headers` without any named by `rules`, then the rules' headers (one per name, the
/// first rule naming it wins).
pub(crate) fn rewrite(headers: &[(String, Vec<u8>)], rules: &[&Injection]) -> (Fields, Fields) {
    let named = |n: &str| rules.iter().any(|r| r.header.eq_ignore_ascii_case(n));
    let kept = headers.iter().filter(|(n, _)| !named(n)).cloned().collect();
    let mut added: Vec<(String, Vec<u8>)> = Vec::new();
    for r in rules {
        if !added.iter().any(|(n, _)| n.eq_ignore_ascii_case(&r.header)) {
            added.push((r.header.clone(), r.value.0.as_bytes().to_vec()));
        }
    }
    (kept, added)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, header: &str, value: &str) -> Injection {
        Injection {
            host: host.into(),
            header: header.into(),
            value: SecretValue(value.into()),
            methods: Vec::new(),
        }
    }

    #[test]
    fn rules_are_checked() {
        assert_eq!(
            rule("API.Example.com.", "Authorization", "Bearer x")
                .checked()
                .unwrap()
                .host,
            "api.example.com"
        );
        for (h, n, v) in [
            ("*.x.com", "A", "v"),
            ("x.com:443", "A", "v"),
            ("10.0.0.1", "A", "v"),
            ("x.com", "Bad Name", "v"),
            ("x.com", "A:B", "v"),
            ("x.com", "A\nB", "v"),
            ("x.com", "Host", "v"),
            ("x.com", "Proxy-Authorization", "v"),
            ("x.com", "A", "v\r\nX-Evil: 1"),
            ("x.com", "A", "v\n"),
        ] {
            assert!(rule(h, n, v).checked().is_err(), "{h} {n} {v:?}");
        }
        let long = "a".repeat(MAX_INJECT_VALUE_BYTES + 1);
        assert_eq!(
            rule("x.com", "A", &long).checked(),
            Err(InjectError::TooLong)
        );
    }

    #[test]
    fn debug_never_shows_the_value() {
        let r = rule("x.com", "Authorization", "Bearer hunter2");
        assert!(!format!("{r:?}").contains("hunter2"));
        let c = InjectConfig {
            injections: vec![r],
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn rewrite_replaces_the_clients_header() {
        let r = rule("x.com", "Authorization", "Bearer good");
        let headers = vec![
            ("authorization".to_string(), b"Bearer evil".to_vec()),
            ("Accept".to_string(), b"*/*".to_vec()),
            ("AUTHORIZATION".to_string(), b"Basic evil".to_vec()),
        ];
        let (kept, added) = rewrite(&headers, &[&r]);
        assert_eq!(kept, vec![("Accept".to_string(), b"*/*".to_vec())]);
        assert_eq!(
            added,
            vec![("Authorization".to_string(), b"Bearer good".to_vec())]
        );
    }

    #[test]
    fn methods_rule() {
        let mut r = rule("x.com", "A", "v");
        r.methods = vec!["get".into(), "HEAD".into()];
        let state = InjectState::new(InjectConfig {
            injections: vec![r],
            ..Default::default()
        })
        .unwrap();
        let host = Host::parse("x.com").unwrap();
        assert!(state.method_allowed(&host, "GET"));
        assert!(!state.method_allowed(&host, "POST"));
        let open = InjectState::new(InjectConfig {
            injections: vec![rule("x.com", "A", "v")],
            ..Default::default()
        })
        .unwrap();
        assert!(open.method_allowed(&host, "DELETE"));
        assert!(
            !open.method_allowed(&host, "TRACE"),
            "TRACE would echo the value"
        );
        assert!(state.method_allowed(&Host::parse("y.com").unwrap(), "POST"));
        assert_eq!(state.headers_for(&host), vec!["a".to_string()]);
    }
}
