//! A sandbox's controls as the runtime asks for them (unvalidated: the helper checks
//! them as if the caller were hostile), and the name rule.

use crate::error::{Error, Result};

/// Longest sandbox name (it is the hostname inside, which is limited to 64 bytes).
pub const MAX_NAME_BYTES: usize = 63;

/// Network policy of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Net {
    /// A network namespace whose only interface is a loopback that stays down.
    None,
    /// A network namespace with its loopback up; nothing else.
    Loopback,
    /// A loopback as [`Net::Loopback`], and a host-side egress proxy (HTTP, SOCKS5 and
    /// DNS on 127.0.0.1 inside) as the only way out, by host policy, default deny
    /// (the helper's `egress` module).
    Egress,
}

impl Net {
    /// The name `--net` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Net::None => "none",
            Net::Loopback => "loopback",
            Net::Egress => "egress",
        }
    }
}

impl std::str::FromStr for Net {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Net::None),
            "loopback" => Ok(Net::Loopback),
            "egress" => Ok(Net::Egress),
            other => Err(Error::InvalidInput(format!(
                "--net {other:?}: expected `none`, `loopback` or `egress`"
            ))),
        }
    }
}

/// What a sandbox is started with besides its workspace and command: the `sandbox
/// start` and `run` flags, the control socket's `sandbox_start` args and the runtime's
/// `SandboxOptions` are all this. Unvalidated.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Controls {
    /// `--net`; `None` means `loopback` when ports are published, else `none`.
    pub net: Option<Net>,
    /// `--memory` (bytes, or with a `k`/`m`/`g` suffix; a JSON number is bytes).
    #[serde(deserialize_with = "bytes_text")]
    pub memory: Option<String>,
    /// `--pids`: most processes at once.
    pub pids: Option<u64>,
    /// `--cpus`: CPU bandwidth in CPUs.
    pub cpus: Option<f64>,
    /// `--cpuset-cpus`: the CPUs its processes may run on (a list such as `0-1,3`).
    pub cpuset_cpus: Option<String>,
    /// `--publish`: internal ports to publish.
    pub publish: Vec<u16>,
    /// `--env K=V`, added to every command's environment.
    pub env: Vec<String>,
    /// `--ro-bind SRC:DST`, read-only binds.
    pub ro_bind: Vec<String>,
    /// `--secret NAME=HOSTFILE`.
    pub secret: Vec<String>,
    /// `--allow-host PATTERN` (with `--net egress`).
    pub allow_host: Vec<String>,
    /// `--deny-host PATTERN` (with `--net egress`).
    pub deny_host: Vec<String>,
    /// `--add-host NAME:ADDR` (with `--net egress`).
    pub add_host: Vec<String>,
    /// `--inject HOST=HEADER:@FILE` (with `--net egress`): the proxy sets HEADER to the
    /// host file FILE's contents on requests to HOST; the file is read host-side only.
    pub inject: Vec<String>,
    /// `--inject-methods HOST=METHOD,...`: the only methods an injected HOST is sent.
    pub inject_methods: Vec<String>,
    /// `--upstream-ca FILE` (PEM): more roots the proxy verifies injected hosts with.
    pub upstream_ca: Option<String>,
    /// `--idle-timeout DURATION` (`30s`, `5m`): a long-lived sandbox is paused after no
    /// exec ran and no traffic went through its published ports for that long, and
    /// resumed by the next exec or connection.
    pub idle_timeout: Option<String>,
    /// `--image NAME`: an image in the store (a ref or snapshot id) whose tree is the
    /// sandbox's root filesystem. The runtime resolves it; the helper gets the image's
    /// mounted lower (`--image-meta`, `--image-data`), never this name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `--io-max`: the most the sandbox reads and writes per second on the host's disks:
    /// `SIZE` (bytes per second, read and write), or any of `rbps=SIZE`, `wbps=SIZE`,
    /// `riops=N`, `wiops=N` separated by commas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_max: Option<String>,
    /// `--io-weight`: the sandbox's share of disk time against others (1 to 10000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_weight: Option<u64>,
    /// `--workdir DIR`: the working directory of the sandbox's commands (the first
    /// command of a run and every exec without its own `--workdir`); absolute inside,
    /// or relative to `/workspace`. Default `/workspace`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// `--image-workdir` (with `--image`): the working directory is the image config's
    /// `WorkingDir`. The runtime resolves it into [`Controls::workdir`]; the helper never
    /// gets it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub image_workdir: bool,
}

/// A size given as text (`"512m"`) or as a number of bytes (the socket's `memory`,
/// `disk`): serde's `deserialize_with` for an `Option<String>` field.
pub fn bytes_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    use serde::Deserialize;
    Ok(match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(serde::de::Error::custom(format!(
                "expected a number of bytes or a size such as \"512m\" or \"20g\", got {other}"
            )));
        }
    })
}

/// Checks a sandbox name: 1 to [`MAX_NAME_BYTES`] of `[A-Za-z0-9_.-]`, starting with a
/// letter or digit (it is the hostname inside and part of cgroup names).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "--name {name:?}: 1 to {MAX_NAME_BYTES} of [A-Za-z0-9_.-], starting with a letter or digit"
        )))
    }
}
