//! The egress proxy of a cowspace sandbox: the only way out of a sandbox started with
//! `--net egress`, default deny.
//!
//! The sandbox's network namespace has only loopback. A privileged helper creates three
//! sockets inside it (an HTTP proxy listener on 127.0.0.1:3128, a SOCKS5 listener on
//! 127.0.0.1:1080, a DNS socket on 127.0.0.1:53) and hands them to a host-side process,
//! which serves them with [`Egress`]. Every connection is checked against a [`Policy`] on
//! the host name the client asked for, then against the address rules (private ranges
//! refused unless named by `--add-host`, names resolved once by the proxy itself), and is
//! recorded as one JSON line in the decision log. Everything fails closed: a parse error,
//! an ambiguity, a timeout or an internal error refuses the connection.
//!
//! Codemap: [`policy`] (patterns, decisions, address rules, the [`Resolve`] seam),
//! [`http`] (HTTP/1.1 forward proxy and `CONNECT`), `tunnel` (first-bytes inspection:
//! TLS SNI via [`tls`], HTTP `Host`; then the relay), `splice` (bulk bytes socket to
//! socket through a kernel pipe), [`socks`] (SOCKS5), [`dns`] (the
//! responder inside), [`log`] and [`stats`] (evidence), [`server`] (threads and limits),
//! [`control`] (the JSON-lines control seam), [`inject`] (credentials added by the proxy,
//! TLS terminated for their hosts only).
//!
//! # Example
//! ```no_run
//! use std::net::{TcpListener, UdpSocket};
//! use std::sync::Arc;
//! use cowspace_egress::{Egress, Listeners, Policy, SystemResolver};
//!
//! # fn main() -> std::io::Result<()> {
//! let listeners = Listeners {
//!     http: TcpListener::bind("127.0.0.1:3128")?,
//!     socks: TcpListener::bind("127.0.0.1:1080")?,
//!     dns: UdpSocket::bind("127.0.0.1:53")?,
//! };
//! let mut policy = Policy::default();
//! policy.allow.push("pypi.org:443".parse().expect("valid pattern"));
//! policy.allow.push("*.pythonhosted.org".parse().expect("valid pattern"));
//! let log = std::fs::OpenOptions::new().create(true).append(true).open("/tmp/egress.jsonl")?;
//! let egress = Egress::start(listeners, policy, log, Arc::new(SystemResolver))?;
//! println!("{}", serde_json::to_string(&egress.stats()).expect("serializable"));
//! egress.stop();
//! # Ok(())
//! # }
//! ```
//!
//! The embedding process must ignore `SIGPIPE` (Rust binaries do by default): a write to a
//! socket the peer closed must fail with `EPIPE`, not kill the process.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod control;
pub mod dns;
mod framing;
pub mod http;
pub mod inject;
pub mod log;
pub mod policy;
pub mod server;
mod shared;
pub mod socks;
mod splice;
pub mod stats;
pub mod tls;
mod tunnel;

pub use control::{ControlClient, ControlError, ControlRequest, ControlResponse, serve_control};
pub use framing::{HEAD_TIMEOUT, MAX_HEAD_BYTES};
pub use log::{DecisionRecord, Verdict, Via};
pub use policy::{
    AddHost, Decision, Host, HostPattern, PatternError, Policy, PolicyChange, Resolve,
    SystemResolver, is_private,
};
pub use server::{Egress, Listeners, Options};
pub use shared::UPSTREAM_CONNECT_TIMEOUT;
pub use stats::{HostStats, Stats};
pub use tunnel::{FIRST_BYTES_TIMEOUT, IDLE_TIMEOUT, MAX_FIRST_BYTES};
