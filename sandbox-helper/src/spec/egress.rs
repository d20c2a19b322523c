//! The egress part of a sandbox's spec: the proxy's ports inside, the variables that
//! name them, and the policy the controls ask for.

use sandbox_api::spec::{Controls, Net};

use crate::error::{Error, Result};

/// The HTTP proxy's port on the sandbox's loopback.
pub const EGRESS_HTTP_PORT: u16 = 3128;
/// The SOCKS5 proxy's port on the sandbox's loopback.
pub const EGRESS_SOCKS_PORT: u16 = 1080;
/// The resolver's port on the sandbox's loopback.
pub const EGRESS_DNS_PORT: u16 = 53;

/// The proxy variables every command of an egress sandbox gets (both cases).
pub fn egress_env() -> Vec<(&'static str, String)> {
    let http = format!("http://127.0.0.1:{EGRESS_HTTP_PORT}");
    let socks = format!("socks5h://127.0.0.1:{EGRESS_SOCKS_PORT}");
    let no = "localhost,127.0.0.1,::1".to_string();
    vec![
        ("HTTP_PROXY", http.clone()),
        ("HTTPS_PROXY", http.clone()),
        ("ALL_PROXY", socks.clone()),
        ("NO_PROXY", no.clone()),
        ("http_proxy", http.clone()),
        ("https_proxy", http),
        ("all_proxy", socks),
        ("no_proxy", no),
    ]
}

/// The egress policy the controls ask for: `None` unless `--net egress`; host flags
/// without it are refused, naming the flag.
pub fn egress_policy(net: Net, c: &Controls) -> Result<Option<cowspace_egress::policy::Policy>> {
    use cowspace_egress::policy::{AddHost, HostPattern, Policy};
    if net != Net::Egress {
        for (flag, list) in [
            ("--allow-host", &c.allow_host),
            ("--deny-host", &c.deny_host),
            ("--add-host", &c.add_host),
        ] {
            if let Some(first) = list.first() {
                return Err(Error::InvalidInput(format!(
                    "{flag} {first:?} needs --net egress (the sandbox has no way out with \
                     --net {})",
                    net.as_str()
                )));
            }
        }
        return Ok(None);
    }
    let patterns = |flag: &str, list: &[String]| -> Result<Vec<HostPattern>> {
        list.iter()
            .map(|p| {
                p.parse::<HostPattern>()
                    .map_err(|e| Error::InvalidInput(format!("{flag} {p:?}: {e}")))
            })
            .collect()
    };
    let add_hosts = c
        .add_host
        .iter()
        .map(|a| {
            a.parse::<AddHost>()
                .map_err(|e| Error::InvalidInput(format!("--add-host {a:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(Policy {
        allow: patterns("--allow-host", &c.allow_host)?,
        deny: patterns("--deny-host", &c.deny_host)?,
        add_hosts,
    }))
}
