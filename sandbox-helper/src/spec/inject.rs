//! `--inject HOST=HEADER:@FILE`, `--inject-methods HOST=METHOD,...` and `--upstream-ca
//! FILE`: credentials the egress proxy adds to requests to HOST, read here, host-side,
//! and never placed inside the sandbox (docs/sandbox.md, "Credentials the proxy adds").
//!
//! Everything is checked before the sandbox is made: the host must be an exact name the
//! policy allows, the header an HTTP field name the proxy does not set itself, the file a
//! regular file of at most [`MAX_INJECT_FILE_BYTES`] holding one line (a single final
//! newline is dropped; any other newline, carriage return or control byte is refused).
//! An error names the flag, the host and the file, never the value.
//!
//! With at least one injection the sandbox gets a certificate authority of its own
//! ([`cowspace_egress::inject::ca::CaPem`]): its certificate is installed inside at
//! [`CA_FILE`] with a bundle ([`BUNDLE_FILE`]: the host's system roots and it), which
//! the usual variables name; its key goes to the proxy only.

use std::path::Path;

use cowspace_egress::inject::ca::CaPem;
use cowspace_egress::inject::{InjectConfig, Injection, SecretValue};
use cowspace_egress::policy::{Host, Policy};

use crate::error::{Error, Result};
use crate::paths::refuse_overlap;

/// Largest `--inject` file accepted.
pub const MAX_INJECT_FILE_BYTES: u64 = 16 * 1024;
/// Largest `--upstream-ca` file accepted.
pub const MAX_UPSTREAM_CA_BYTES: u64 = 1 << 20;
/// The directory inside holding the authority's certificate (a read-only tmpfs).
pub const CA_DIR: &str = "/run/cowspace";
/// The sandbox's certificate authority inside.
pub const CA_FILE: &str = "/run/cowspace/egress-ca.pem";
/// The host's system roots and the sandbox's authority, inside.
pub const BUNDLE_FILE: &str = "/run/cowspace/ca-bundle.pem";
/// Where the host's system roots are looked for, in order.
const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// What a sandbox with injections is started with.
#[derive(Clone)]
pub struct InjectPlan {
    /// The rules, the authority and the upstream roots, for the proxy.
    pub config: InjectConfig,
    /// The authority's certificate (PEM), installed inside.
    pub ca_cert_pem: String,
    /// The bundle installed inside.
    pub bundle_pem: String,
}

impl std::fmt::Debug for InjectPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InjectPlan")
            .field("injections", &self.config.injections)
            .finish_non_exhaustive()
    }
}

impl PartialEq for InjectPlan {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config
    }
}

/// The variables every command of a sandbox with injections gets, naming the bundle.
pub fn ca_env() -> [(&'static str, &'static str); 6] {
    [
        ("SSL_CERT_FILE", BUNDLE_FILE),
        ("REQUESTS_CA_BUNDLE", BUNDLE_FILE),
        ("CURL_CA_BUNDLE", BUNDLE_FILE),
        ("NODE_EXTRA_CA_CERTS", CA_FILE),
        ("GIT_SSL_CAINFO", BUNDLE_FILE),
        ("PIP_CERT", BUNDLE_FILE),
    ]
}

fn invalid(msg: String) -> Error {
    Error::InvalidInput(msg)
}

/// Reads a small host file for `flag`, refusing what is not a regular file of at most
/// `max` bytes. The error never quotes the contents.
fn read_small(flag: &str, what: &str, file: &str, max: u64, state_dir: &Path) -> Result<Vec<u8>> {
    let path = std::fs::canonicalize(file)
        .map_err(|e| invalid(format!("{flag} {what}: {file:?}: {e}")))?;
    refuse_overlap(&path, state_dir, flag)?;
    let meta =
        std::fs::metadata(&path).map_err(|e| invalid(format!("{flag} {what}: {file:?}: {e}")))?;
    if !meta.is_file() || meta.len() > max {
        return Err(invalid(format!(
            "{flag} {what}: {file:?} must be a regular file of at most {max} bytes"
        )));
    }
    let bytes =
        std::fs::read(&path).map_err(|e| invalid(format!("{flag} {what}: {file:?}: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(invalid(format!(
            "{flag} {what}: {file:?} must be a regular file of at most {max} bytes"
        )));
    }
    Ok(bytes)
}

/// One `--inject HOST=HEADER:@FILE` entry, checked, with its value read.
fn read_one(entry: &str, policy: &Policy, state_dir: &Path) -> Result<Injection> {
    let shape = || {
        invalid(format!(
            "--inject {entry:?}: expected HOST=HEADER:@FILE (e.g. api.example.com=Authorization:@/run/token)"
        ))
    };
    let (host, rest) = entry.split_once('=').ok_or_else(shape)?;
    let (header, file) = rest.split_once(":@").ok_or_else(shape)?;
    if file.is_empty() {
        return Err(shape());
    }
    let parsed = match Host::parse(host) {
        Ok(h @ Host::Name(_)) if !host.contains(['*', ':']) => h,
        _ => {
            return Err(invalid(format!(
                "--inject {host:?}: HOST must be an exact host name (no wildcard, port or \
                 address): credentials go to the one host they are for"
            )));
        }
    };
    if !policy.decide_name(&parsed).allowed {
        return Err(invalid(format!(
            "--inject {host}: {host} is not allowed by the egress policy; add --allow-host {host}"
        )));
    }
    let mut bytes = read_small("--inject", host, file, MAX_INJECT_FILE_BYTES, state_dir)?;
    if bytes.ends_with(b"\n") {
        bytes.pop();
    }
    let value = String::from_utf8(bytes).map_err(|_| {
        invalid(format!(
            "--inject {host}: {file:?} is not UTF-8 text: a header value is one line of text"
        ))
    })?;
    Injection {
        host: host.to_string(),
        header: header.to_string(),
        value: SecretValue(value),
        methods: Vec::new(),
    }
    .checked()
    .map_err(|e| invalid(format!("--inject {host}={header} ({file:?}): {e}")))
}

/// The injections the controls ask for, with the authority made for `name`: `None`
/// without `--inject`. Refuses the inject flags without `--net egress` (`policy` None).
pub fn read_injections(
    c: &sandbox_api::spec::Controls,
    policy: Option<&Policy>,
    state_dir: &Path,
    name: &str,
) -> Result<Option<InjectPlan>> {
    if c.inject.is_empty() {
        if let Some(m) = c.inject_methods.first() {
            return Err(invalid(format!(
                "--inject-methods {m:?} needs an --inject for its host"
            )));
        }
        if let Some(f) = &c.upstream_ca {
            return Err(invalid(format!(
                "--upstream-ca {f:?} is for hosts with --inject: give --inject HOST=HEADER:@FILE"
            )));
        }
        return Ok(None);
    }
    let Some(policy) = policy else {
        return Err(invalid(format!(
            "--inject {:?} needs --net egress (the proxy adds the credential; without it the \
             sandbox has no proxy)",
            c.inject[0]
                .split_once('=')
                .map_or(c.inject[0].as_str(), |(h, _)| h)
        )));
    };
    if c.inject.len() > cowspace_egress::inject::MAX_INJECTIONS {
        return Err(invalid(format!(
            "more than {} --inject entries",
            cowspace_egress::inject::MAX_INJECTIONS
        )));
    }
    let mut injections = c
        .inject
        .iter()
        .map(|e| read_one(e, policy, state_dir))
        .collect::<Result<Vec<_>>>()?;
    for entry in &c.inject_methods {
        let (host, list) = entry.split_once('=').ok_or_else(|| {
            invalid(format!(
                "--inject-methods {entry:?}: expected HOST=METHOD,... (e.g. api.example.com=GET,HEAD)"
            ))
        })?;
        let host = Host::parse(host)
            .map(|h| h.text())
            .map_err(|_| invalid(format!("--inject-methods {host:?}: not a host name")))?;
        let methods: Vec<String> = list.split(',').map(|m| m.trim().to_string()).collect();
        let mut found = false;
        for inj in injections.iter_mut().filter(|i| i.host == host) {
            found = true;
            for m in &methods {
                if !cowspace_egress::inject::is_token(m) {
                    return Err(invalid(format!(
                        "--inject-methods {host}: {m:?} is not an HTTP method"
                    )));
                }
                let m = m.to_ascii_uppercase();
                if !inj.methods.contains(&m) {
                    inj.methods.push(m);
                }
            }
        }
        if !found {
            return Err(invalid(format!(
                "--inject-methods {host}: no --inject names {host}"
            )));
        }
    }
    let upstream_ca_pem = match &c.upstream_ca {
        None => None,
        Some(file) => {
            let bytes = read_small("--upstream-ca", "", file, MAX_UPSTREAM_CA_BYTES, state_dir)?;
            let pem = String::from_utf8(bytes)
                .map_err(|_| invalid(format!("--upstream-ca {file:?}: not a PEM file")))?;
            cowspace_egress::inject::check_upstream_ca(&pem)
                .map_err(|e| invalid(format!("--upstream-ca {file:?}: {e}")))?;
            Some(pem)
        }
    };
    let ca = CaPem::generate(&format!("cowspace egress CA of sandbox {name}")).map_err(|e| {
        Error::Egress {
            step: "make the sandbox's certificate authority",
            source: std::io::Error::other(e.to_string()),
        }
    })?;
    let mut bundle_pem = SYSTEM_BUNDLES
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    if !bundle_pem.is_empty() && !bundle_pem.ends_with('\n') {
        bundle_pem.push('\n');
    }
    bundle_pem.push_str(&ca.cert_pem);
    Ok(Some(InjectPlan {
        ca_cert_pem: ca.cert_pem.clone(),
        bundle_pem,
        config: InjectConfig {
            injections,
            ca: Some(ca),
            upstream_ca_pem,
        },
    }))
}

/// The rules after a live change (`sandbox policy --inject`, `--remove-inject`): removals
/// first, then additions, each checked as at start against `policy` (the policy after
/// the same request's host changes). Needs a sandbox started with `--inject`: its
/// authority is installed inside only then.
pub fn live_update(
    current: Option<&InjectConfig>,
    policy: &Policy,
    add: &[String],
    remove: &[String],
    state_dir: &Path,
) -> Result<InjectConfig> {
    let Some(current) = current.filter(|c| c.ca.is_some()) else {
        return Err(Error::NotStartedWith(
            "the sandbox was not started with --inject: its certificate authority is \
             installed inside only at start; stop it and start it with --inject"
                .into(),
        ));
    };
    let mut config = current.clone();
    for entry in remove {
        let (host, header) = match entry.split_once('=') {
            Some((h, v)) => (h, Some(v)),
            None => (entry.as_str(), None),
        };
        let host = Host::parse(host)
            .map(|h| h.text())
            .map_err(|_| invalid(format!("--remove-inject {entry:?}: not a host name")))?;
        let before = config.injections.len();
        config.injections.retain(|i| {
            !(i.host == host && header.is_none_or(|h| i.header.eq_ignore_ascii_case(h)))
        });
        if config.injections.len() == before {
            return Err(invalid(format!(
                "--remove-inject {entry:?}: no such rule (`mountctl sandbox status WS` lists \
                 them under egress.injections)"
            )));
        }
    }
    for entry in add {
        let rule = read_one(entry, policy, state_dir)?;
        config
            .injections
            .retain(|i| !(i.host == rule.host && i.header.eq_ignore_ascii_case(&rule.header)));
        config.injections.push(rule);
    }
    if config.injections.len() > cowspace_egress::inject::MAX_INJECTIONS {
        return Err(invalid(format!(
            "more than {} --inject entries",
            cowspace_egress::inject::MAX_INJECTIONS
        )));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls(inject: &[String]) -> sandbox_api::spec::Controls {
        sandbox_api::spec::Controls {
            inject: inject.to_vec(),
            ..Default::default()
        }
    }

    fn policy() -> Policy {
        serde_json::from_str(r#"{"allow":["api.test:443"]}"#).unwrap()
    }

    #[test]
    fn values_are_read_checked_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let good = file("good", "Bearer s3cr3t\n");
        let plan = read_injections(
            &controls(&[format!("api.test=Authorization:@{good}")]),
            Some(&policy()),
            &state,
            "w1",
        )
        .unwrap()
        .unwrap();
        assert_eq!(plan.config.injections[0].value.0, "Bearer s3cr3t");
        assert!(plan.bundle_pem.ends_with(&plan.ca_cert_pem));
        assert!(!format!("{plan:?}").contains("s3cr3t"));
        assert!(!plan.ca_cert_pem.contains("PRIVATE KEY"));
        let two = file("two", "Bearer s3cr3t\nX-Evil: 1\n");
        let cr = file("cr", "Bearer s3cr3t\r");
        for (entry, says) in [
            (format!("api.test=Authorization:@{two}"), "newline"),
            (format!("api.test=Authorization:@{cr}"), "newline"),
            (
                format!("other.test=Authorization:@{good}"),
                "--allow-host other.test",
            ),
            (format!("*.test=Authorization:@{good}"), "exact host name"),
            (format!("api.test=Bad Name:@{good}"), "header name"),
            (
                format!("api.test=Authorization@{good}"),
                "HOST=HEADER:@FILE",
            ),
            (
                "api.test=Authorization:@/nonexistent".to_string(),
                "/nonexistent",
            ),
        ] {
            let e = read_injections(
                &controls(std::slice::from_ref(&entry)),
                Some(&policy()),
                &state,
                "w1",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(says), "{entry}: {e}");
            assert!(!e.contains("s3cr3t"), "{entry}: {e}");
        }
        let e = read_injections(
            &controls(&[format!("api.test=Authorization:@{good}")]),
            None,
            &state,
            "w1",
        )
        .unwrap_err();
        assert!(e.to_string().contains("--net egress"), "{e}");
        let mut c = controls(&[format!("api.test=Authorization:@{good}")]);
        c.inject_methods = vec!["other.test=GET".into()];
        let e = read_injections(&c, Some(&policy()), &state, "w1").unwrap_err();
        assert!(
            e.to_string().contains("no --inject names other.test"),
            "{e}"
        );
        c.inject_methods = vec!["api.test=get,HEAD".into()];
        let plan = read_injections(&c, Some(&policy()), &state, "w1")
            .unwrap()
            .unwrap();
        assert_eq!(plan.config.injections[0].methods, vec!["GET", "HEAD"]);
    }

    #[test]
    fn live_changes_need_a_started_authority_and_name_missing_rules() {
        let dir = tempfile::tempdir().unwrap();
        let e = live_update(None, &policy(), &[], &["api.test".into()], dir.path()).unwrap_err();
        assert!(e.to_string().contains("not started with --inject"), "{e}");
        let good = dir.path().join("v");
        std::fs::write(&good, "v").unwrap();
        let plan = read_injections(
            &controls(&[format!("api.test=Authorization:@{}", good.display())]),
            Some(&policy()),
            &dir.path().join("state"),
            "w1",
        )
        .unwrap()
        .unwrap();
        let e = live_update(
            Some(&plan.config),
            &policy(),
            &[],
            &["api.test=X-Other".into()],
            dir.path(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no such rule"), "{e}");
        let after = live_update(
            Some(&plan.config),
            &policy(),
            &[],
            &["API.test=authorization".into()],
            dir.path(),
        )
        .unwrap();
        assert!(after.injections.is_empty() && after.ca.is_some());
    }
}
