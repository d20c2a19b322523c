//! Host names, host patterns and `--add-host` entries: parsing, canonical text, matching.
//!
//! A [`Host`] is what a client asked for (a name or an IP literal), normalized once at the
//! edge: lowercase, one trailing dot dropped, IPv4-mapped IPv6 literals turned into IPv4.
//! A [`HostPattern`] is one `--allow-host` / `--deny-host` argument. Refused (with a
//! [`PatternError`] naming the problem and the fix): empty text, `*.` alone, a scheme, a
//! path, a bad port, `*` anywhere but the whole pattern or the first label, invalid label
//! characters, names over 253 bytes, and names whose last label starts with a digit
//! (`127.1`, `0x7f.1`, `2130706433`: the C resolver reads those as IPv4 addresses, so they
//! could dodge an IP pattern; write the dotted address instead).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest host name accepted, in bytes (RFC 1035, without the trailing dot).
pub const MAX_NAME_BYTES: usize = 253;
/// Longest label accepted, in bytes (RFC 1035).
pub const MAX_LABEL_BYTES: usize = 63;

/// Why a host pattern, host name or `--add-host` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Nothing to parse.
    #[error("empty host pattern; give a name like `example.com`, `*.example.com` or `*`")]
    Empty,
    /// `*.` with no domain after it.
    #[error(
        "host pattern `{0}` has nothing after `*.`; write `*.example.com` (subdomains) or `*` (every public host)"
    )]
    BareWildcardDot(String),
    /// A URL was given instead of a host.
    #[error(
        "host pattern `{0}` has a scheme; write the host alone, e.g. `example.com` instead of `https://example.com`"
    )]
    Scheme(String),
    /// A path was given after the host.
    #[error(
        "host pattern `{0}` has a path; write the host alone, e.g. `example.com` instead of `example.com/path`"
    )]
    Path(String),
    /// The `:PORT` suffix is not a number from 1 to 65535.
    #[error("host pattern `{input}` has a bad port `{port}`; a port is a number from 1 to 65535")]
    BadPort {
        /// The whole input.
        input: String,
        /// The text after the last `:`.
        port: String,
    },
    /// `*` somewhere other than the whole pattern or the first label.
    #[error(
        "host pattern `{0}` has `*` in the wrong place; `*` is only allowed as the whole host (`*`) or as the first label (`*.example.com`)"
    )]
    WildcardPlacement(String),
    /// A label is empty, too long or holds a character other than letters, digits, `-`, `_`.
    #[error(
        "host `{input}` has an invalid label `{label}`; labels are 1 to 63 letters, digits, `-` or `_` separated by dots"
    )]
    BadLabel {
        /// The whole input.
        input: String,
        /// The offending label.
        label: String,
    },
    /// The name is longer than [`MAX_NAME_BYTES`].
    #[error("host name `{0}` is longer than 253 bytes; use a shorter name or a `*.` pattern")]
    TooLong(String),
    /// The last label starts with a digit, which resolvers read as a numeric address.
    #[error(
        "host `{0}` ends in a numeric label, which resolvers read as an IPv4 address; write the address in dotted form (`203.0.113.7`)"
    )]
    NumericName(String),
    /// `--add-host` without `:ADDR`.
    #[error(
        "--add-host `{0}` has no address; write NAME:ADDR, e.g. `mirror.internal:10.0.0.5` or `mirror.internal:[fd00::5]`"
    )]
    MissingAddr(String),
    /// `--add-host` with an ADDR that is not an IP address.
    #[error(
        "--add-host `{input}` has a bad address `{addr}`; ADDR is an IPv4 or IPv6 address (`10.0.0.5`, `[fd00::5]`)"
    )]
    BadAddr {
        /// The whole input.
        input: String,
        /// The text after the first `:`.
        addr: String,
    },
    /// `--add-host` whose NAME is a wildcard or an address.
    #[error("--add-host `{0}` has a bad name; NAME is a plain host name such as `mirror.internal`")]
    BadAddHostName(String),
}

/// A host a client asked for, normalized: a lowercase name without trailing dot, or an IP
/// address (IPv4-mapped IPv6 turned into IPv4).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as it appears in a request: a name, a dotted IPv4 address, or an IPv6
    /// address with or without brackets.
    pub fn parse(text: &str) -> Result<Host, PatternError> {
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| bad_label(text, text))?;
            let ip = Ipv6Addr::from_str(inner).map_err(|_| bad_label(text, inner))?;
            return Ok(Host::Ip(IpAddr::V6(ip).to_canonical()));
        }
        if let Ok(ip) = IpAddr::from_str(text) {
            return Ok(Host::Ip(ip.to_canonical()));
        }
        normalize_name(text, text).map(Host::Name)
    }

    /// The text used in logs and statistics: the name, or the address without brackets.
    pub fn text(&self) -> String {
        match self {
            Host::Name(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }

    /// `host:port`, with brackets around an IPv6 address.
    pub fn authority(&self, port: u16) -> String {
        match self {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            _ => format!("{}:{port}", self.text()),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

fn bad_label(input: &str, label: &str) -> PatternError {
    PatternError::BadLabel {
        input: input.to_string(),
        label: label.to_string(),
    }
}

/// Lowercases `name`, drops one trailing dot and checks every label.
pub(crate) fn normalize_name(input: &str, name: &str) -> Result<String, PatternError> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name.is_empty() {
        return Err(PatternError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(PatternError::TooLong(input.to_string()));
    }
    for label in name.split('.') {
        let ok_chars = label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if label.is_empty() || label.len() > MAX_LABEL_BYTES || !ok_chars {
            return Err(bad_label(input, label));
        }
    }
    let last = name.rsplit('.').next().unwrap_or_default();
    if last.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return Err(PatternError::NumericName(input.to_string()));
    }
    Ok(name)
}

/// The host part of a [`HostPattern`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PatternHost {
    /// `*`: every host (private addresses are still refused by the address rules).
    Any,
    /// `example.com`: that name only.
    Exact(String),
    /// `*.example.com`: names ending in `.example.com`, any depth; not `example.com` itself.
    Subdomains(String),
    /// `203.0.113.7`, `[2001:db8::1]`: that address only.
    Ip(IpAddr),
}

/// One `--allow-host` / `--deny-host` pattern.
///
/// `example.com` matches that name; `*.example.com` matches every subdomain at any depth
/// (`a.example.com`, `a.b.example.com`) but **not** the apex `example.com` (allow both when
/// both are wanted, as the anchors of DNS zones are separate names); `*` matches every host,
/// names and IP literals alike (private addresses are still refused afterwards by the
/// address rules, see [`crate::policy::addr`]). IP literals match that address only. A `:PORT` suffix restricts the pattern to that
/// port; without it every port matches. Matching is case-insensitive and ignores one
/// trailing dot. Serializes as its canonical text ([`fmt::Display`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    host: PatternHost,
    port: Option<u16>,
}

impl HostPattern {
    /// The port this pattern is limited to, if any.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether the pattern names `host`, ignoring ports.
    pub fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (PatternHost::Any, _) => true,
            (PatternHost::Exact(p), Host::Name(h)) => p == h,
            (PatternHost::Subdomains(p), Host::Name(h)) => {
                h.len() > p.len() + 1
                    && h.ends_with(p.as_str())
                    && h.as_bytes()[h.len() - p.len() - 1] == b'.'
            }
            (PatternHost::Ip(p), Host::Ip(h)) => p == h,
            _ => false,
        }
    }

    /// Whether the pattern names `host` on `port`.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.port.is_none_or(|p| p == port) && self.matches_host(host)
    }
}

fn parse_port(input: &str, port: &str) -> Result<u16, PatternError> {
    let bad = || PatternError::BadPort {
        input: input.to_string(),
        port: port.to_string(),
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match port.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(bad()),
    }
}

impl FromStr for HostPattern {
    type Err = PatternError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(PatternError::Empty);
        }
        if input.contains("://") {
            return Err(PatternError::Scheme(input.to_string()));
        }
        if input.contains('/') {
            return Err(PatternError::Path(input.to_string()));
        }
        // Split off the port: `[v6]:port`, a bare IPv6 address (no port), or `host:port`.
        let (host, port) = if let Some(rest) = input.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| bad_label(input, input))?;
            let ip = Ipv6Addr::from_str(inner).map_err(|_| bad_label(input, inner))?;
            let port = match after {
                "" => None,
                _ => {
                    let p = after
                        .strip_prefix(':')
                        .ok_or_else(|| bad_label(input, after))?;
                    Some(parse_port(input, p)?)
                }
            };
            let host = PatternHost::Ip(IpAddr::V6(ip).to_canonical());
            return Ok(HostPattern { host, port });
        } else if let Ok(ip) = Ipv6Addr::from_str(input) {
            let host = PatternHost::Ip(IpAddr::V6(ip).to_canonical());
            return Ok(HostPattern { host, port: None });
        } else if let Some((h, p)) = input.rsplit_once(':') {
            (h, Some(parse_port(input, p)?))
        } else {
            (input, None)
        };
        if host == "*." {
            return Err(PatternError::BareWildcardDot(input.to_string()));
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        let host = if host.is_empty() {
            return Err(PatternError::Empty);
        } else if host == "*" {
            PatternHost::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            if domain.contains('*') {
                return Err(PatternError::WildcardPlacement(input.to_string()));
            }
            PatternHost::Subdomains(normalize_name(input, domain)?)
        } else if host.contains('*') {
            return Err(PatternError::WildcardPlacement(input.to_string()));
        } else if let Ok(ip) = IpAddr::from_str(host) {
            PatternHost::Ip(ip.to_canonical())
        } else {
            PatternHost::Exact(normalize_name(input, host)?)
        };
        Ok(HostPattern { host, port })
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            PatternHost::Any => f.write_str("*")?,
            PatternHost::Exact(name) => f.write_str(name)?,
            PatternHost::Subdomains(name) => write!(f, "*.{name}")?,
            PatternHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}")?,
            PatternHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// One `--add-host NAME:ADDR`: NAME resolves to ADDR for this sandbox, and naming it is
/// what allows ADDR when it is private. It does not allow NAME by itself: an allow pattern
/// must still match NAME. Several entries for one NAME give it several addresses, tried in
/// order. Serializes as `NAME:ADDR` (IPv6 bracketed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AddHost {
    /// The normalized name (lowercase, no trailing dot).
    pub name: String,
    /// The address it resolves to.
    pub addr: IpAddr,
}

impl FromStr for AddHost {
    type Err = PatternError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let Some((name, addr)) = input.split_once(':') else {
            return Err(PatternError::MissingAddr(input.to_string()));
        };
        if addr.is_empty() {
            return Err(PatternError::MissingAddr(input.to_string()));
        }
        let bare = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        let bad_addr = || PatternError::BadAddr {
            input: input.to_string(),
            addr: addr.to_string(),
        };
        let addr = IpAddr::from_str(bare)
            .map_err(|_| bad_addr())?
            .to_canonical();
        if name.is_empty() {
            return Err(PatternError::BadAddHostName(input.to_string()));
        }
        if name.contains('*') || IpAddr::from_str(name).is_ok() {
            return Err(PatternError::BadAddHostName(input.to_string()));
        }
        let name = normalize_name(input, name)?;
        Ok(AddHost { name, addr })
    }
}

impl fmt::Display for AddHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(ip) => write!(f, "{}:{ip}", self.name),
            IpAddr::V6(ip) => write!(f, "{}:[{ip}]", self.name),
        }
    }
}

macro_rules! serde_as_text {
    ($ty:ty, $what:literal) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse()
                    .map_err(|e| serde::de::Error::custom(format!("{}: {e}", $what)))
            }
        }
    };
}
serde_as_text!(HostPattern, "host pattern");
serde_as_text!(AddHost, "add-host");

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPattern {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }
    fn h(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn canonical_forms() {
        for (input, canon) in [
            ("Example.COM.", "example.com"),
            ("*.Example.com:8080", "*.example.com:8080"),
            ("*", "*"),
            ("*:443", "*:443"),
            ("203.0.113.7", "203.0.113.7"),
            ("[2001:db8::1]:443", "[2001:db8::1]:443"),
            ("2001:db8::1", "[2001:db8::1]"),
            ("[::ffff:203.0.113.7]", "203.0.113.7"),
            ("a_b.example.com:1", "a_b.example.com:1"),
        ] {
            assert_eq!(p(input).to_string(), canon, "{input}");
            assert_eq!(p(canon).to_string(), canon, "{canon} round trip");
        }
    }

    #[test]
    fn refusals_name_problem_and_fix() {
        let cases: &[(&str, &str)] = &[
            ("", "empty host pattern"),
            ("*.", "nothing after `*.`"),
            ("http://x.com", "has a scheme"),
            ("x.com/y", "has a path"),
            ("x.com:0", "bad port `0`"),
            ("x.com:65536", "bad port `65536`"),
            ("x.com:8o", "bad port `8o`"),
            ("x.com:", "bad port ``"),
            ("a.*.com", "`*` in the wrong place"),
            ("*x.com", "`*` in the wrong place"),
            ("*.*.com", "`*` in the wrong place"),
            ("exa mple.com", "invalid label `exa mple`"),
            ("a..com", "invalid label ``"),
            ("127.1", "numeric label"),
            ("0x7f.1", "numeric label"),
            ("[::1", "invalid label"),
        ];
        for (input, needle) in cases {
            let err = input.parse::<HostPattern>().expect_err(input).to_string();
            assert!(err.contains(needle), "{input}: {err}");
        }
        let long = format!("{}.com", "a.".repeat(130));
        assert!(matches!(
            long.parse::<HostPattern>(),
            Err(PatternError::TooLong(_))
        ));
        let label = format!("{}.com", "a".repeat(64));
        assert!(matches!(
            label.parse::<HostPattern>(),
            Err(PatternError::BadLabel { .. })
        ));
    }

    #[test]
    fn matching_apex_depth_port_and_ip() {
        let sub = p("*.example.com");
        assert!(sub.matches(&h("a.example.com"), 1));
        assert!(sub.matches(&h("A.B.Example.com."), 1));
        assert!(
            !sub.matches(&h("example.com"), 1),
            "apex is not a subdomain"
        );
        assert!(!sub.matches(&h("badexample.com"), 1));
        let port = p("example.com:443");
        assert!(port.matches(&h("example.com"), 443));
        assert!(!port.matches(&h("example.com"), 80));
        assert!(p("*").matches(&h("10.0.0.1"), 5));
        assert!(p("[::ffff:203.0.113.7]").matches(&h("203.0.113.7"), 5));
        assert!(p("203.0.113.7").matches(&h("[::ffff:203.0.113.7]"), 5));
        assert!(!p("example.com").matches(&h("203.0.113.7"), 5));
    }

    #[test]
    fn add_host_parse() {
        let a: AddHost = "Mirror.Internal:10.0.0.5".parse().unwrap();
        assert_eq!(a.to_string(), "mirror.internal:10.0.0.5");
        let b: AddHost = "m:[fd00::5]".parse().unwrap();
        assert_eq!(b.to_string(), "m:[fd00::5]");
        let c: AddHost = "m:fd00::5".parse().unwrap();
        assert_eq!(c, b);
        for (bad, needle) in [
            ("mirror", "has no address"),
            ("mirror:", "has no address"),
            ("mirror:nope", "bad address `nope`"),
            (":10.0.0.1", "bad name"),
            ("*.x:10.0.0.1", "bad name"),
            ("a b:10.0.0.1", "invalid label"),
        ] {
            let err = bad.parse::<AddHost>().expect_err(bad).to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn serde_as_canonical_text() {
        let json = serde_json::to_string(&p("*.Example.com:443")).unwrap();
        assert_eq!(json, "\"*.example.com:443\"");
        let back: HostPattern = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p("*.example.com:443"));
        assert!(serde_json::from_str::<HostPattern>("\"a.*.b\"").is_err());
    }
}
