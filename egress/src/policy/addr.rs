//! Address rules and resolution: which addresses are private, and which addresses a
//! connection to a host goes to.
//!
//! The proxy resolves names itself, once, and connects only to the addresses it resolved
//! (never re-resolving, so a name cannot change between the check and the connect). A
//! name from `add_hosts` goes to its address, private or not: naming it is what allows it.
//! An IP literal goes to that address unless it is private. Any other name goes to its
//! resolved addresses with every private one dropped; if none is left the connection is
//! refused with rule `"private address"` (DNS-rebinding protection). Private means the
//! ranges of [`is_private`] plus the host's own addresses given by the caller.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

use super::{Host, Policy};

/// Whether `ip` is in a range a sandbox must never reach unless the name was given with
/// `--add-host`: "this network" 0/8, RFC 1918 (10/8, 172.16/12, 192.168/16), shared
/// 100.64/10, loopback 127/8, link-local 169.254/16 (cloud metadata), IETF 192.0.0/24,
/// documentation (192.0.2/24, 198.51.100/24, 203.0.113/24), benchmarking 198.18/15,
/// multicast 224/4, reserved 240/4 with broadcast. IPv6: `::`, `::1`, unique-local
/// fc00::/7, link-local fe80::/10, site-local fec0::/10, multicast ff00::/8, discard
/// 100::/64, documentation 2001:db8::/32, local NAT64 64:ff9b:1::/48; addresses that embed
/// an IPv4 address (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 64:ff9b::/96,
/// 6to4 2002::/16) are judged by the embedded address.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => is_private_v6(v6),
    }
}

/// [`is_private`], or one of the host's own addresses (`host_addrs`, compared after
/// IPv4-mapped addresses are unwrapped).
pub fn is_private_for(ip: IpAddr, host_addrs: &[IpAddr]) -> bool {
    let ip = ip.to_canonical();
    is_private(ip) || host_addrs.iter().any(|own| own.to_canonical() == ip)
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    const RANGES: &[([u8; 4], u32)] = &[
        ([0, 0, 0, 0], 8),
        ([10, 0, 0, 0], 8),
        ([100, 64, 0, 0], 10),
        ([127, 0, 0, 0], 8),
        ([169, 254, 0, 0], 16),
        ([172, 16, 0, 0], 12),
        ([192, 0, 0, 0], 24),
        ([192, 0, 2, 0], 24),
        ([192, 168, 0, 0], 16),
        ([198, 18, 0, 0], 15),
        ([198, 51, 100, 0], 24),
        ([203, 0, 113, 0], 24),
        ([224, 0, 0, 0], 4),
        ([240, 0, 0, 0], 4),
    ];
    RANGES.iter().any(|&(net, prefix)| in_v4(ip, net, prefix))
}

fn in_v6(ip: Ipv6Addr, net: u128, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == net & mask
}

fn embedded_v4(bits: u128) -> Ipv4Addr {
    Ipv4Addr::from((bits & 0xffff_ffff) as u32)
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    let bits = u128::from(ip);
    if bits <= 1 {
        return true; // `::` and `::1`
    }
    // Forms carrying an IPv4 address: judged by that address.
    if in_v6(ip, 0xffff_0000_0000, 96) || in_v6(ip, 0, 96) || in_v6(ip, 0x64_ff9b << 96, 96) {
        return is_private_v4(embedded_v4(bits));
    }
    if in_v6(ip, 0x2002 << 112, 16) {
        return is_private_v4(embedded_v4(bits >> 80));
    }
    const RANGES: &[(u128, u32)] = &[
        (0xfc00 << 112, 7),
        (0xfe80 << 112, 10),
        (0xfec0 << 112, 10),
        (0xff00 << 112, 8),
        (0x0100 << 112, 64),
        (0x2001_0db8 << 96, 32),
        (0x0064_ff9b_0001 << 80, 48),
    ];
    RANGES.iter().any(|&(net, prefix)| in_v6(ip, net, prefix))
}

/// Name resolution, the seam tests swap: the proxy and the DNS responder ask it for a
/// host's addresses and then apply the address rules themselves.
pub trait Resolve {
    /// Every address `host` (a normalized name, never an IP literal) resolves to, in the
    /// order to try them. An empty list or an error means the host cannot be reached.
    fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The host's resolver through `getaddrinfo` (std's [`ToSocketAddrs`]). It has no timeout
/// of its own; the C library's (`/etc/resolv.conf` `timeout`/`attempts`) bounds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let mut out: Vec<IpAddr> = Vec::new();
        for addr in (host, 0).to_socket_addrs()? {
            let ip = addr.ip().to_canonical();
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        Ok(out)
    }
}

/// Why a host allowed by the patterns still has nowhere to go.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Every address is private (or the literal is): rule `"private address"`.
    #[error("{0} resolves only to private addresses")]
    Private(String),
    /// The resolver failed or found nothing.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's error.
        source: io::Error,
    },
}

/// The addresses a connection to `host` goes to, by the rules in the module docs.
pub fn select_targets(
    policy: &Policy,
    host: &Host,
    resolver: &dyn Resolve,
    host_addrs: &[IpAddr],
) -> Result<Vec<IpAddr>, TargetError> {
    let added = policy.added_addrs(host);
    if !added.is_empty() {
        return Ok(added);
    }
    let name = match host {
        Host::Ip(ip) if is_private_for(*ip, host_addrs) => {
            return Err(TargetError::Private(host.text()));
        }
        Host::Ip(ip) => return Ok(vec![*ip]),
        Host::Name(name) => name,
    };
    let resolved = resolver
        .resolve(name)
        .map_err(|source| TargetError::Resolve {
            host: name.clone(),
            source,
        })?;
    if resolved.is_empty() {
        let source = io::Error::new(io::ErrorKind::NotFound, "no addresses");
        return Err(TargetError::Resolve {
            host: name.clone(),
            source,
        });
    }
    let public: Vec<IpAddr> = resolved
        .into_iter()
        .map(|ip| ip.to_canonical())
        .filter(|ip| !is_private_for(*ip, host_addrs))
        .collect();
    if public.is_empty() {
        return Err(TargetError::Private(name.clone()));
    }
    Ok(public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_ranges() {
        for s in [
            "0.1.2.3",
            "10.9.9.9",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.8.8.8",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.1.1.1",
            "240.0.0.1",
            "255.255.255.255",
            "203.0.113.7",
            "::",
            "::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:0a00:0001::1",
            "100::1",
        ] {
            assert!(is_private(ip(s)), "{s} must be private");
        }
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
            "2001:db9::1",
        ] {
            assert!(!is_private(ip(s)), "{s} must be public");
        }
        assert!(is_private_for(ip("::ffff:8.8.8.8"), &[ip("8.8.8.8")]));
    }

    struct Fake(HashMap<&'static str, Vec<IpAddr>>);
    impl Resolve for Fake {
        fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
            self.0
                .get(host)
                .cloned()
                .ok_or_else(|| io::Error::other("no such host"))
        }
    }

    #[test]
    fn target_selection() {
        let fake = Fake(HashMap::from([
            ("mixed.test", vec![ip("10.0.0.1"), ip("8.8.8.8")]),
            ("inner.test", vec![ip("127.0.0.1"), ip("::1")]),
            ("mine.test", vec![ip("9.9.9.9")]),
        ]));
        let mut policy = Policy::default();
        policy
            .add_hosts
            .push("inner.test:10.1.1.1".parse().unwrap());
        let sel =
            |h: &str, own: &[IpAddr]| select_targets(&policy, &Host::parse(h).unwrap(), &fake, own);
        assert_eq!(sel("mixed.test", &[]).unwrap(), vec![ip("8.8.8.8")]);
        assert_eq!(sel("inner.test", &[]).unwrap(), vec![ip("10.1.1.1")]);
        assert!(matches!(
            sel("mine.test", &[ip("9.9.9.9")]),
            Err(TargetError::Private(_))
        ));
        assert!(matches!(
            sel("169.254.169.254", &[]),
            Err(TargetError::Private(_))
        ));
        assert!(matches!(
            sel("[::ffff:127.0.0.1]", &[]),
            Err(TargetError::Private(_))
        ));
        assert_eq!(sel("8.8.4.4", &[]).unwrap(), vec![ip("8.8.4.4")]);
        assert!(matches!(
            sel("nowhere.test", &[]),
            Err(TargetError::Resolve { .. })
        ));
    }
}
