//! The egress proxy of a `--net egress` sandbox, as the keeper runs it.
//!
//! The sandbox's network namespace keeps only its loopback: no route out. The keeper
//! makes three sockets **inside** that namespace (a thread enters it with `setns`,
//! binds, and leaves; a socket stays in the namespace it was made in): an HTTP proxy on
//! 127.0.0.1:3128, a SOCKS5 proxy on 127.0.0.1:1080 and a resolver on 127.0.0.1:53. It
//! hands them to a process of its own, `sandbox-helper egress-proxy`, which runs in the
//! host's network namespace as uid `nobody`, with no capability, `no_new_privs`, not
//! dumpable, and a parent-death signal: it accepts inside and connects outside, after
//! [`cowspace_egress`] has checked each connection against the policy (default deny).
//!
//! The keeper keeps no copy of those sockets: if the proxy dies (even by `SIGKILL`) they
//! close with it, and a connection to them is refused at once — the sandbox has no way
//! out (fail closed), and its status says so. The policy is changed through a Unix
//! socket pair to the proxy; every decision is a JSON line in the sandbox's log file,
//! `STATE/keep/NAME.egress.log`, which the keeper removes when the sandbox stops.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cowspace_egress::policy::{Policy, PolicyChange};
use nix::sched::CloneFlags;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::spec::{EGRESS_DNS_PORT, EGRESS_HTTP_PORT, EGRESS_SOCKS_PORT};
use crate::syscall::{LinuxSyscall, Syscall};

/// The uid and gid the proxy runs as (`nobody`).
pub const PROXY_UID: u32 = 65534;
/// How long the keeper waits for the proxy's answer on its control socket.
const CONTROL_TIMEOUT_MS: u64 = 5_000;
/// Longest answer read from the proxy's control socket.
const MAX_CONTROL_ANSWER_BYTES: u64 = 16 << 20;

/// The decision log of sandbox `name`.
pub fn log_path(state: &Path, name: &str) -> PathBuf {
    state.join("keep").join(format!("{name}.egress.log"))
}

/// The running proxy of one sandbox, as the keeper holds it.
#[derive(Debug)]
pub struct EgressProxy {
    pid: u32,
    control: Mutex<BufReader<UnixStream>>,
    policy: Mutex<Policy>,
    /// The injection rules and the authority (values and key held here, host-side, to
    /// change them live; never shown).
    injections: Mutex<Option<cowspace_egress::inject::InjectConfig>>,
    /// Why the proxy is gone, once it is.
    lost: Arc<Mutex<Option<String>>>,
    log: PathBuf,
}

/// The three sockets, made inside the namespace `netns`.
fn sockets_inside(netns: &File) -> std::io::Result<(TcpListener, TcpListener, UdpSocket)> {
    let ns = netns.try_clone()?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // Only this thread enters the namespace; it ends right after.
            LinuxSyscall
                .setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(|e| std::io::Error::other(format!("setns: {e}")))?;
            let http = TcpListener::bind((Ipv4Addr::LOCALHOST, EGRESS_HTTP_PORT))?;
            let socks = TcpListener::bind((Ipv4Addr::LOCALHOST, EGRESS_SOCKS_PORT))?;
            let dns = UdpSocket::bind((Ipv4Addr::LOCALHOST, EGRESS_DNS_PORT))?;
            Ok((http, socks, dns))
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the socket thread panicked")))
    })
}

impl EgressProxy {
    /// Starts the proxy of sandbox `name` (whose network namespace is `netns`) with
    /// `policy`. Nothing is reachable before the policy is set: the proxy starts with an
    /// empty one.
    pub fn launch(netns: &File, policy: Policy, state: &Path, name: &str) -> Result<EgressProxy> {
        let failed =
            |step: &'static str| move |e: std::io::Error| Error::Egress { step, source: e };
        let (http, socks, dns) =
            sockets_inside(netns).map_err(failed("make the proxy's sockets inside the sandbox"))?;
        let log = log_path(state, name);
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(failed("create the decision log's directory"))?;
        }
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&log)
            .map_err(failed("create the decision log"))?;
        let (ours, theirs) = UnixStream::pair().map_err(failed("make the control socket"))?;
        let exe = std::env::current_exe().map_err(failed("find the helper's program"))?;
        let first = crate::sys::EGRESS_CHILD_FIRST_FD;
        let mut cmd = Command::new(exe);
        cmd.arg("egress-proxy")
            .arg(format!("--name={name}"))
            .arg(format!("--http-fd={first}"))
            .arg(format!("--socks-fd={}", first + 1))
            .arg(format!("--dns-fd={}", first + 2))
            .arg(format!("--control-fd={}", first + 3))
            .arg(format!("--log-fd={}", first + 4))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Nothing of the caller's: a pipe held here would keep `sandbox start`
            // waiting for its end. The proxy reports through its control socket and log.
            .stderr(Stdio::null())
            .env_clear();
        crate::sys::egress_child_pre_exec(
            &mut cmd,
            [
                http.as_raw_fd(),
                socks.as_raw_fd(),
                dns.as_raw_fd(),
                theirs.as_raw_fd(),
                log_file.as_raw_fd(),
            ],
            PROXY_UID,
            PROXY_UID,
        );
        let mut child = cmd.spawn().map_err(failed("start the egress proxy"))?;
        // The keeper keeps none of the proxy's sockets (see the module's doc).
        drop((http, socks, dns, theirs, log_file));
        let pid = child.id();
        let lost = Arc::new(Mutex::new(None));
        {
            let lost = lost.clone();
            std::thread::Builder::new()
                .name("egress-wait".into())
                .spawn(move || {
                    use std::os::unix::process::ExitStatusExt;
                    let why = match child.wait() {
                        Ok(s) => match (s.code(), s.signal()) {
                            (_, Some(sig)) => {
                                format!("the egress proxy (pid {pid}) was killed by signal {sig}")
                            }
                            (Some(c), _) => {
                                format!("the egress proxy (pid {pid}) exited with status {c}")
                            }
                            _ => format!("the egress proxy (pid {pid}) ended"),
                        },
                        Err(e) => {
                            format!("the egress proxy (pid {pid}) could not be waited for: {e}")
                        }
                    };
                    *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                })
                .map_err(failed("watch the egress proxy"))?;
        }
        ours.set_read_timeout(Some(Duration::from_millis(CONTROL_TIMEOUT_MS)))
            .map_err(failed("configure the control socket"))?;
        let proxy = EgressProxy {
            pid,
            control: Mutex::new(BufReader::new(ours)),
            policy: Mutex::new(Policy::default()),
            injections: Mutex::new(None),
            lost,
            log,
        };
        proxy.set(policy)?;
        Ok(proxy)
    }

    /// One request to the proxy and its answer's `ok` body.
    fn ask(&self, req: &Value) -> Result<Value> {
        let failed = |e: std::io::Error| Error::Egress {
            step: "talk to the egress proxy",
            source: e,
        };
        let mut c = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = req.to_string();
        line.push('\n');
        c.get_mut().write_all(line.as_bytes()).map_err(failed)?;
        let mut answer = String::new();
        std::io::Read::take(&mut *c, MAX_CONTROL_ANSWER_BYTES)
            .read_line(&mut answer)
            .map_err(failed)?;
        let v: Value = serde_json::from_str(&answer)
            .map_err(|e| failed(std::io::Error::other(format!("unreadable answer: {e}"))))?;
        if v["ok"] != true {
            return Err(failed(std::io::Error::other(
                v["error"].as_str().unwrap_or("refused").to_string(),
            )));
        }
        Ok(v)
    }

    fn set(&self, policy: Policy) -> Result<()> {
        self.ask(&json!({"op": "set_policy", "policy": policy}))?;
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
        Ok(())
    }

    /// Gives the proxy its injection rules and authority (over the control socket: never
    /// in an argument, the environment or a file).
    pub fn set_injections(&self, config: cowspace_egress::inject::InjectConfig) -> Result<()> {
        if let Some(why) = self.lost() {
            return Err(Error::EgressLost(why));
        }
        let kept = config.clone();
        let request = cowspace_egress::control::ControlRequest::SetInjections { config };
        let req = serde_json::to_value(&request).map_err(|e| Error::Egress {
            step: "encode the injection rules",
            source: std::io::Error::other(e.to_string()),
        })?;
        self.ask(&req)?;
        *self.injections.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
        Ok(())
    }

    /// [`EgressProxy::change`] with injection rules added (`HOST=HEADER:@FILE`, files
    /// read here) and removed (`HOST[=HEADER]`); everything is checked before anything
    /// changes.
    pub fn change_with_injections(
        &self,
        changes: &[PolicyChange],
        add: &[String],
        remove: &[String],
    ) -> Result<Policy> {
        if let Some(why) = self.lost() {
            return Err(Error::EgressLost(why));
        }
        let mut p = self.policy();
        p.apply(changes);
        let state = self
            .log
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        let current = self
            .injections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let config = crate::spec::inject::live_update(current.as_ref(), &p, add, remove, &state)?;
        self.set(p.clone())?;
        self.set_injections(config)?;
        Ok(p)
    }

    /// Applies `changes` in order and gives the policy now in force (for new
    /// connections; established ones are not cut).
    pub fn change(&self, changes: &[PolicyChange]) -> Result<Policy> {
        if let Some(why) = self.lost() {
            return Err(Error::EgressLost(why));
        }
        let mut p = self.policy();
        p.apply(changes);
        self.set(p.clone())?;
        Ok(p)
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Why the proxy is gone, once it is.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `egress` part of the sandbox's status.
    pub fn status(&self) -> Value {
        let policy = self.policy();
        let mut v = json!({
            "state": "running",
            "proxy_pid": self.pid,
            "http_proxy": format!("127.0.0.1:{EGRESS_HTTP_PORT}"),
            "socks_proxy": format!("127.0.0.1:{EGRESS_SOCKS_PORT}"),
            "resolver": format!("127.0.0.1:{EGRESS_DNS_PORT}"),
            "allows_nothing": policy.allow.is_empty(),
            "policy": policy,
            "log": self.log,
        });
        if let Some(config) = &*self.injections.lock().unwrap_or_else(|p| p.into_inner()) {
            // The rules by host and header: never a value.
            v["injections"] = config
                .injections
                .iter()
                .map(|i| {
                    let mut r = json!({"host": i.host, "header": i.header});
                    if !i.methods.is_empty() {
                        r["methods"] = json!(i.methods);
                    }
                    r
                })
                .collect();
            v["ca_file"] = json!(crate::spec::inject::CA_FILE);
        }
        match self.lost() {
            Some(why) => {
                v["state"] = json!("lost");
                v["reason"] = json!(format!(
                    "{why}: the sandbox has no way out (its proxy's sockets closed with it); \
                     stop and start it again"
                ));
            }
            None => match self.ask(&json!({"op": "stats"})) {
                Ok(a) => v["stats"] = a["stats"].clone(),
                Err(e) => v["stats_error"] = json!(e.to_string()),
            },
        }
        v
    }

    /// Ends the proxy (its sockets close with it) and removes the decision log.
    pub fn stop(&self) {
        if self.lost().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The descriptors `sandbox-helper egress-proxy` is given.
#[derive(Debug, Clone, Copy)]
pub struct ProxyFds {
    pub http: i32,
    pub socks: i32,
    pub dns: i32,
    pub control: i32,
    pub log: i32,
}

/// The proxy process's body: serves until the keeper closes the control socket (or
/// dies: the parent-death signal ends this process then).
pub fn serve_process(fds: ProxyFds) -> Result<()> {
    let failed = |step: &'static str| move |e: std::io::Error| Error::Egress { step, source: e };
    crate::sys::set_not_dumpable().map_err(failed("make the proxy not dumpable"))?;
    if nix::unistd::geteuid().is_root() {
        return Err(Error::Egress {
            step: "check the proxy's privileges",
            source: std::io::Error::other("the egress proxy must not run as root"),
        });
    }
    let adopt = |fd: i32| crate::sys::adopt_received_fd(fd);
    let listeners = cowspace_egress::server::Listeners {
        http: TcpListener::from(adopt(fds.http)),
        socks: TcpListener::from(adopt(fds.socks)),
        dns: UdpSocket::from(adopt(fds.dns)),
    };
    let control = UnixStream::from(adopt(fds.control));
    let log = File::from(adopt(fds.log));
    // The host's own addresses are refused like private ones (unless named by
    // `--add-host`): a public address of this host must not reach its services.
    let host_addrs: Vec<std::net::IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter_map(|i| i.address)
                .filter_map(|a| {
                    a.as_sockaddr_in()
                        .map(|v4| std::net::IpAddr::V4(v4.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
                })
                .collect()
        })
        .unwrap_or_default();
    let egress = cowspace_egress::server::Egress::start_with(
        listeners,
        Policy::default(),
        log,
        Arc::new(cowspace_egress::policy::SystemResolver),
        cowspace_egress::server::Options { host_addrs },
    )
    .map_err(failed("start the egress proxy"))?;
    let served = cowspace_egress::control::serve_control(control, &egress);
    egress.stop();
    served.map_err(failed("serve the keeper's requests"))?;
    Ok(())
}
