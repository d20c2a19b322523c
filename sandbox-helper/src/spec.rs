//! What a sandbox is asked to be: the validated input of [`crate::run`].
//!
//! Everything here is checked as if the caller were hostile, before anything is created.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

mod egress;
pub mod inject;
mod limits;
mod workdir;

pub use crate::cgroup::Limits;
use crate::paths::{
    bind_source, canonical_dir, check_suspendable, normalize_target, refuse_overlap,
};
pub use egress::{EGRESS_DNS_PORT, EGRESS_HTTP_PORT, EGRESS_SOCKS_PORT, egress_env, egress_policy};
use limits::check_cpus_fit;
pub use limits::parse_bytes;
pub use workdir::{DEFAULT_WORKDIR, parse_workdir};

pub use sandbox_api::spec::{Controls, MAX_NAME_BYTES, Net};
/// Smallest memory limit accepted (init and a shell must fit).
pub const MIN_MEMORY_BYTES: u64 = 4 << 20;
/// Smallest pids limit accepted (the sandbox init and the command).
pub const MIN_PIDS: u64 = 2;
/// Most `--publish`, `--env` or `--ro-bind` entries accepted.
pub const MAX_LIST_ENTRIES: usize = 64;
/// Shortest `--idle-timeout`, in milliseconds (a pause between two keystrokes helps no
/// one).
pub const MIN_IDLE_TIMEOUT_MS: u64 = 1_000;
/// Longest `--idle-timeout`, in seconds (30 days).
pub const MAX_IDLE_TIMEOUT_S: u64 = 30 * 24 * 3600;
/// The environment variables copied from the helper's own environment when set.
pub const ENV_ALLOWLIST: [&str; 2] = ["TERM", "LANG"];
/// `PATH` inside the sandbox unless `--env PATH=...` is given.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Largest `--secret` file accepted.
pub const MAX_SECRET_BYTES: u64 = 1 << 20;
/// Where secrets appear inside the sandbox (a private read-only tmpfs).
pub const SECRETS_DIR: &str = "/run/secrets";
/// `CAP_NET_RAW`: raw and packet sockets. Not in the sandbox's bounding set unless
/// asked for (`--cap-net-raw`); ping works without it, through ICMP datagram sockets.
pub const CAP_NET_RAW: u32 = 13;
/// Paths inside the sandbox a `--ro-bind` may not be placed at or under.
const RESERVED_TARGETS: [&str; 13] = [
    "/run",
    "/proc",
    "/dev",
    "/workspace",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/root",
];

/// A read-only bind of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoBind {
    /// Host path: absolute, without `.` or `..`, and no component of it a symlink (it
    /// is the path as given, never resolved; see [`bind_source`]).
    pub source: PathBuf,
    /// Absolute path inside the sandbox, normalized.
    pub target: PathBuf,
}

/// A secret handed to the sandbox as a file in `/run/secrets`, never in an argument or
/// the environment. `Debug` does not show the contents.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    /// File name under `/run/secrets`.
    pub name: String,
    /// The contents (read from the host file when validated).
    pub contents: Vec<u8>,
}

/// Reads `--ro-bind SRC:DST` entries: each source taken as given, never through a
/// symlink ([`bind_source`]), not the host root, outside `state_dir`; each target
/// normalized and not one the sandbox reserves.
pub fn read_ro_binds(entries: &[String], state_dir: &Path) -> Result<Vec<RoBind>> {
    let mut ro_binds = Vec::new();
    for entry in entries {
        let (src, dst) = entry
            .split_once(':')
            .ok_or_else(|| Error::InvalidInput(format!("--ro-bind {entry:?}: expected SRC:DST")))?;
        let source = bind_source(entry, src)?;
        if source == Path::new("/") {
            return Err(Error::InvalidInput(
                "--ro-bind of the host root refused".into(),
            ));
        }
        refuse_overlap(&source, state_dir, "--ro-bind")?;
        let target = normalize_target(dst).ok_or_else(|| {
            Error::InvalidInput(format!(
                "--ro-bind {entry:?}: the target {dst:?} must be an absolute path inside the \
                 sandbox without `..` (e.g. /opt/data)"
            ))
        })?;
        if RESERVED_TARGETS
            .iter()
            .any(|r| target == Path::new(r) || target.starts_with(r))
            || target == Path::new("/")
        {
            return Err(Error::InvalidInput(format!(
                "--ro-bind {entry:?}: {} is reserved by the sandbox: a target may not be / \
                 nor at or under {} (e.g. /opt/data or /mnt/data)",
                target.display(),
                RESERVED_TARGETS.join(", ")
            )));
        }
        ro_binds.push(RoBind { source, target });
    }
    Ok(ro_binds)
}

/// `--cpuset-cpus`: a CPU list of this host's online CPUs, in the kernel's format.
pub fn parse_cpuset(text: Option<&str>) -> Result<Option<String>> {
    let Some(text) = text else {
        return Ok(None);
    };
    let cpus = crate::cgroup::cpuset::parse_list(text)
        .map_err(|e| Error::InvalidInput(format!("--cpuset-cpus {text:?}: {e}")))?;
    let online = crate::cgroup::cpuset::online()?;
    if let Some(missing) = cpus.iter().find(|c| !online.contains(c)) {
        return Err(Error::InvalidInput(format!(
            "--cpuset-cpus {text:?}: this host has no CPU {missing} online (its CPUs: {})",
            crate::cgroup::cpuset::format_list(&online)
        )));
    }
    Ok(Some(crate::cgroup::cpuset::format_list(&cpus)))
}

/// Reads `--secret NAME=HOSTFILE` entries: unique names of `[A-Za-z0-9_.-]` not starting
/// with a dot, regular files of at most [`MAX_SECRET_BYTES`] outside `state_dir`.
pub fn read_secrets(entries: &[String], state_dir: &Path) -> Result<Vec<Secret>> {
    let mut secrets: Vec<Secret> = Vec::new();
    for entry in entries {
        let (name, file) = entry.split_once('=').ok_or_else(|| {
            Error::InvalidInput(format!("--secret {entry:?}: expected NAME=HOSTFILE"))
        })?;
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_BYTES
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok || secrets.iter().any(|s| s.name == name) {
            return Err(Error::InvalidInput(format!(
                "--secret {name:?}: a unique name of [A-Za-z0-9_.-], not starting with a dot"
            )));
        }
        let path = std::fs::canonicalize(file)
            .map_err(|e| Error::InvalidInput(format!("--secret {name}: {file:?}: {e}")))?;
        refuse_overlap(&path, state_dir, "--secret")?;
        let meta = std::fs::metadata(&path)
            .map_err(|e| Error::InvalidInput(format!("--secret {name}: {file:?}: {e}")))?;
        if !meta.is_file() || meta.len() > MAX_SECRET_BYTES {
            return Err(Error::InvalidInput(format!(
                "--secret {name}: {file:?} must be a regular file of at most {MAX_SECRET_BYTES} bytes"
            )));
        }
        let contents = std::fs::read(&path)
            .map_err(|e| Error::InvalidInput(format!("--secret {name}: {file:?}: {e}")))?;
        secrets.push(Secret {
            name: name.to_string(),
            contents,
        });
    }
    Ok(secrets)
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({:?}, {} bytes)", self.name, self.contents.len())
    }
}

/// A validated sandbox request.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The sandbox's name: its hostname, and part of its cgroup's name.
    pub name: String,
    /// The workspace directory on the host (canonical), seen at `/workspace`.
    pub workspace: PathBuf,
    /// Network policy.
    pub net: Net,
    /// Limits.
    pub limits: Limits,
    /// Internal ports to publish on a unique 127.0.0.1 host port each.
    pub publish: Vec<u16>,
    /// The egress policy, with [`Net::Egress`].
    pub egress: Option<cowspace_egress::policy::Policy>,
    /// `--inject`: credentials the proxy adds, and the sandbox's certificate authority.
    pub inject: Option<inject::InjectPlan>,
    /// The command's environment (the allowlist, defaults and `--env`).
    pub env: BTreeMap<String, String>,
    /// Extra read-only binds.
    pub ro_binds: Vec<RoBind>,
    /// Secrets, as files in `/run/secrets`.
    pub secrets: Vec<Secret>,
    /// Keep [`CAP_NET_RAW`] in the bounding set (`--cap-net-raw`).
    pub cap_net_raw: bool,
    /// The command and its arguments.
    pub command: Vec<String>,
    /// When the workspace is an overlay mount: its layers, which the sandbox mounts as
    /// a new overlay inside its user namespace (overlayfs cannot be idmapped).
    pub overlay: Option<crate::overlay::Layers>,
    /// Unmount the host's overlay at `workspace` while the sandbox is set up, so its
    /// upper layer is not under two live overlays during the run (the caller mounts it
    /// again afterwards). Only for an overlay whose upper layer is a workspace of the
    /// runtime root that owns the state directory.
    pub suspend_host_mount: bool,
    /// A long-lived sandbox (`sandbox-helper start`): no command; init waits for execs
    /// and the helper keeps serving them until stopped. An overlay workspace is then
    /// mounted once by the helper on idmapped layers, for the host and the sandbox
    /// alike ([`crate::share`]).
    pub keep: bool,
    /// The sandbox's overlay is the one mount shared with the host ([`crate::share`]):
    /// always for a long-lived sandbox of an overlay workspace, and for a run with
    /// `--share-host-mount`.
    pub share_host_mount: bool,
    /// `--idle-timeout`: the keeper pauses the sandbox after this long without an exec
    /// or published-port traffic (only for a long-lived sandbox).
    pub idle_timeout: Option<std::time::Duration>,
    /// `--image-meta` and `--image-data`: the sandbox's root is an overlay of this
    /// image's tree with a private writable layer ([`crate::image`]).
    pub image: Option<crate::image::ImageRoot>,
    /// `--image-user`: the uid and gid (of the sandbox's user namespace) commands run
    /// as; root when `None`.
    pub user: Option<(u32, u32)>,
    /// `--workdir`: where the first command and every exec without its own start.
    pub workdir: PathBuf,
}

/// Unvalidated input, as parsed from the command line.
#[derive(Debug, Clone, Default)]
pub struct SpecInput {
    /// `--name`.
    pub name: String,
    /// `--dir`.
    pub dir: PathBuf,
    /// The limits, network and what is passed in.
    pub controls: Controls,
    /// The command.
    pub command: Vec<String>,
    /// `--suspend-host-mount`.
    pub suspend_host_mount: bool,
    /// `start` rather than `run`: a long-lived sandbox without a command.
    pub keep: bool,
    /// `--share-host-mount` (implied by `keep` for an overlay workspace).
    pub share_host_mount: bool,
    /// `--cap-net-raw`.
    pub cap_net_raw: bool,
    /// `--image-meta` and `--image-data` (both or neither).
    pub image: Option<(PathBuf, PathBuf)>,
    /// `--image-user UID:GID`.
    pub image_user: Option<String>,
}

impl Spec {
    /// Validates `input`. `state_dir` is the helper's state directory, which must never
    /// become visible inside the sandbox.
    pub fn validate(input: SpecInput, state_dir: &Path) -> Result<Spec> {
        validate_name(&input.name)?;
        if input.command.is_empty() && !input.keep {
            return Err(Error::InvalidInput("no command given after `--`".into()));
        }
        if input.keep && !input.command.is_empty() {
            return Err(Error::InvalidInput(
                "a long-lived sandbox takes no command: run commands with `exec`".into(),
            ));
        }
        if input.keep && input.suspend_host_mount {
            return Err(Error::InvalidInput(
                "--suspend-host-mount is for one-shot runs: a long-lived sandbox shares the \
                 host's mount"
                    .into(),
            ));
        }
        for list in [
            input.controls.env.len(),
            input.controls.ro_bind.len(),
            input.controls.publish.len(),
            input.controls.secret.len(),
            input.controls.allow_host.len(),
            input.controls.deny_host.len(),
            input.controls.add_host.len(),
        ] {
            if list > MAX_LIST_ENTRIES {
                return Err(Error::InvalidInput(format!(
                    "more than {MAX_LIST_ENTRIES} --env, --ro-bind, --publish, --secret, \
                     --allow-host, --deny-host or --add-host entries"
                )));
            }
        }
        let workspace = canonical_dir(&input.dir, "--dir")?;
        if workspace == Path::new("/") {
            return Err(Error::InvalidInput(
                "--dir /: the host root cannot be a workspace".into(),
            ));
        }
        refuse_overlap(&workspace, state_dir, "--dir")?;
        let overlay = crate::overlay::detect(&workspace, &input.name)?;
        if let Some(layers) = &overlay {
            for layer in layers.lowers.iter().chain([&layers.upper_parent]) {
                refuse_overlap(layer, state_dir, "--dir (a layer of its overlay)")?;
            }
        }
        if input.suspend_host_mount && input.share_host_mount {
            return Err(Error::InvalidInput(
                "--suspend-host-mount and --share-host-mount exclude each other".into(),
            ));
        }
        let share_host_mount = overlay.is_some() && (input.keep || input.share_host_mount);
        if input.share_host_mount && overlay.is_none() {
            return Err(Error::InvalidInput(format!(
                "--share-host-mount: {} is not an overlay mount",
                workspace.display()
            )));
        }
        if let Some(layers) = &overlay
            && !share_host_mount
        {
            crate::overlay::require_userns_mountable(layers, &workspace)?;
        }
        if input.suspend_host_mount || share_host_mount {
            check_suspendable(&workspace, overlay.as_ref(), state_dir)?;
        }

        let net = match (input.controls.net, input.controls.publish.is_empty()) {
            (Some(Net::None), false) => {
                return Err(Error::InvalidInput(
                    "--publish needs a loopback inside: use --net loopback (or leave --net out)"
                        .into(),
                ));
            }
            (Some(net), _) => net,
            (None, true) => Net::None,
            (None, false) => Net::Loopback,
        };

        let egress = egress_policy(net, &input.controls)?;
        let idle_timeout = parse_idle_timeout(input.controls.idle_timeout.as_deref())?;
        if idle_timeout.is_some() && !input.keep {
            return Err(Error::InvalidInput(
                "--idle-timeout is for a long-lived sandbox (`sandbox start`): a one-shot run \
                 ends with its command"
                    .into(),
            ));
        }

        let mut publish = input.controls.publish.clone();
        publish.sort_unstable();
        if let Some(w) = publish.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::InvalidInput(format!(
                "--publish {} is given twice: each internal port is published once, on one \
                 host port",
                w[0]
            )));
        }
        if publish.contains(&0) {
            return Err(Error::InvalidInput("--publish 0: not a port".into()));
        }

        let cpuset = parse_cpuset(input.controls.cpuset_cpus.as_deref())?;
        let limits = Limits {
            memory_bytes: input
                .controls
                .memory
                .as_deref()
                .map(parse_bytes)
                .transpose()?,
            pids: input.controls.pids,
            cpus: input.controls.cpus,
            cpuset,
            io_max: input
                .controls
                .io_max
                .as_deref()
                .map(|t| crate::cgroup::io::IoMax::for_workspace(t, &workspace, overlay.as_ref()))
                .transpose()?,
            io_weight: input.controls.io_weight,
        };
        if let Some(w) = limits.io_weight
            && !(1..=crate::cgroup::io::MAX_IO_WEIGHT).contains(&w)
        {
            return Err(Error::InvalidInput(format!(
                "--io-weight {w}: expected 1 to {}",
                crate::cgroup::io::MAX_IO_WEIGHT
            )));
        }
        if let Some(m) = limits.memory_bytes
            && m < MIN_MEMORY_BYTES
        {
            return Err(Error::InvalidInput(format!(
                "--memory {m}: at least {MIN_MEMORY_BYTES} bytes"
            )));
        }
        if let Some(p) = limits.pids
            && p < MIN_PIDS
        {
            return Err(Error::InvalidInput(format!(
                "--pids {p}: at least {MIN_PIDS} (the sandbox init counts)"
            )));
        }
        if let Some(c) = limits.cpus
            && !(c.is_finite() && (0.01..=1024.0).contains(&c))
        {
            return Err(Error::InvalidInput(format!(
                "--cpus {c}: expected 0.01 to 1024"
            )));
        }
        if let Some(c) = limits.cpus {
            check_cpus_fit(c, crate::cgroup::cpuset::online()?.len())?;
        }

        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
        env.insert("HOME".to_string(), "/root".to_string());
        env.insert("HOSTNAME".to_string(), input.name.clone());
        // git's fsmonitor hook, which imports name in a checkout's `.git/config`
        // (docs/git.md), reads the workspace's private state, which the sandbox does not
        // show: git looks at every file instead of failing to run the hook. `--env`
        // overrides it.
        for (k, v) in [
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "core.fsmonitor"),
            ("GIT_CONFIG_VALUE_0", "false"),
        ] {
            env.insert(k.to_string(), v.to_string());
        }
        for key in ENV_ALLOWLIST {
            if let Ok(value) = std::env::var(key) {
                env.insert(key.to_string(), value);
            }
        }
        if egress.is_some() {
            // Tools that honour these go through the proxy; the policy is enforced
            // whether they do or not (docs/sandbox.md, "Egress").
            for (k, v) in egress_env() {
                env.insert(k.to_string(), v);
            }
        }
        let inject =
            inject::read_injections(&input.controls, egress.as_ref(), state_dir, &input.name)?;
        if inject.is_some() {
            for (k, v) in inject::ca_env() {
                env.insert(k.to_string(), v.to_string());
            }
        }
        for entry in &input.controls.env {
            let (k, v) = entry.split_once('=').ok_or_else(|| {
                Error::InvalidInput(format!("--env {entry:?}: expected KEY=VALUE"))
            })?;
            if k.is_empty() || k.contains('\0') || v.contains('\0') {
                return Err(Error::InvalidInput(format!(
                    "--env {entry:?}: bad key or value"
                )));
            }
            env.insert(k.to_string(), v.to_string());
        }

        let ro_binds = read_ro_binds(&input.controls.ro_bind, state_dir)?;

        let secrets = read_secrets(&input.controls.secret, state_dir)?;
        if input.controls.image_workdir {
            return Err(Error::InvalidInput(
                "--image-workdir is resolved by the runtime into --workdir, never given to \
                 the helper"
                    .into(),
            ));
        }
        let workdir = parse_workdir(input.controls.workdir.as_deref())?;
        if input.controls.image.is_some() {
            return Err(Error::InvalidInput(
                "the image is given to the helper as its mounted lower (--image-meta and \
                 --image-data), never by name"
                    .into(),
            ));
        }
        let image = input
            .image
            .as_ref()
            .map(|(meta, data)| crate::image::ImageRoot::validate(meta, data, state_dir))
            .transpose()?;
        let user = input
            .image_user
            .as_deref()
            .map(crate::image::parse_user)
            .transpose()?;

        Ok(Spec {
            name: input.name,
            workspace,
            net,
            limits,
            publish,
            egress,
            inject,
            env,
            ro_binds,
            secrets,
            cap_net_raw: input.cap_net_raw,
            command: input.command,
            overlay,
            suspend_host_mount: input.suspend_host_mount,
            keep: input.keep,
            share_host_mount,
            idle_timeout,
            image,
            user,
            workdir,
        })
    }
}

/// Parses `--idle-timeout` (humantime: `30s`, `5m`, `1h 30m`), within
/// [`MIN_IDLE_TIMEOUT_MS`] and [`MAX_IDLE_TIMEOUT_S`].
pub fn parse_idle_timeout(text: Option<&str>) -> Result<Option<std::time::Duration>> {
    let Some(text) = text else {
        return Ok(None);
    };
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        Error::InvalidInput(format!(
            "--idle-timeout {text:?}: {e} (expected a duration such as 30s, 5m or 1h)"
        ))
    })?;
    if d < std::time::Duration::from_millis(MIN_IDLE_TIMEOUT_MS)
        || d > std::time::Duration::from_secs(MAX_IDLE_TIMEOUT_S)
    {
        return Err(Error::InvalidInput(format!(
            "--idle-timeout {text:?}: expected {MIN_IDLE_TIMEOUT_MS} ms to {} days",
            MAX_IDLE_TIMEOUT_S / 86_400
        )));
    }
    Ok(Some(d))
}

impl Spec {
    /// Capabilities kept in the bounding set beyond [`crate::init::KEPT_CAPS`], as asked.
    pub fn extra_caps(&self) -> &'static [u32] {
        if self.cap_net_raw {
            &[CAP_NET_RAW]
        } else {
            &[]
        }
    }
}

/// Checks a sandbox name: 1 to 63 bytes of `[A-Za-z0-9_.-]`, starting alphanumeric.
pub fn validate_name(name: &str) -> Result<()> {
    sandbox_api::spec::validate_name(name).map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(dir: &Path) -> SpecInput {
        SpecInput {
            name: "w1".into(),
            dir: dir.to_path_buf(),
            command: vec!["/bin/true".into()],
            ..SpecInput::default()
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("worker-1.a_b").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn state_dir_and_reserved_targets_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir(&ws).unwrap();

        let mut i = input(&state);
        assert!(
            Spec::validate(i.clone(), &state).is_err(),
            "state dir as workspace"
        );
        i.dir = tmp.path().to_path_buf();
        assert!(
            Spec::validate(i.clone(), &state).is_err(),
            "parent of state dir"
        );
        let not_yet = ws.join("state-not-made-yet");
        i.dir = ws.clone();
        assert!(
            Spec::validate(i.clone(), &not_yet).is_err(),
            "future state dir inside"
        );
        i.controls.ro_bind = vec![format!("{}:/deps", state.display())];
        assert!(
            Spec::validate(i.clone(), &state).is_err(),
            "state dir bound"
        );
        i.controls.ro_bind = vec![format!("{}:/etc/x", ws.display())];
        let e = Spec::validate(i.clone(), &state).unwrap_err().to_string();
        assert!(
            e.contains("/etc/x is reserved") && e.contains("/run, /proc, /dev, /workspace"),
            "reserved target, the reserved places listed: {e}"
        );
        i.controls.ro_bind = vec![format!("{}:/deps/../etc", ws.display())];
        assert!(Spec::validate(i.clone(), &state).is_err(), "dot-dot target");
        i.controls.ro_bind = vec![format!("{}:relative", ws.display())];
        let e = Spec::validate(i.clone(), &state).unwrap_err().to_string();
        assert!(
            e.contains("must be an absolute path"),
            "relative target: {e}"
        );
        i.controls.ro_bind = vec![format!("{}:/deps/cache", ws.display())];
        let spec = Spec::validate(i, &state).unwrap();
        assert_eq!(spec.ro_binds[0].target, Path::new("/deps/cache"));
        assert_eq!(spec.net, Net::None);
    }

    #[test]
    fn secrets_are_read_checked_and_not_shown_by_debug() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let mut i = input(tmp.path());
        i.dir = tmp.path().join("ws");
        std::fs::create_dir(&i.dir).unwrap();
        let file = tmp.path().join("token");
        std::fs::write(&file, "s3cr3t").unwrap();
        i.controls.secret = vec![format!("api-token={}", file.display())];
        let spec = Spec::validate(i.clone(), &state).unwrap();
        assert_eq!(spec.secrets[0].contents, b"s3cr3t");
        assert!(!format!("{spec:?}").contains("s3cr3t"));
        for bad in ["../x", ".hidden", "a/b", ""] {
            i.controls.secret = vec![format!("{bad}={}", file.display())];
            assert!(Spec::validate(i.clone(), &state).is_err(), "{bad:?}");
        }
        i.controls.secret = vec![
            format!("a={}", file.display()),
            format!("a={}", file.display()),
        ];
        assert!(Spec::validate(i.clone(), &state).is_err(), "duplicate");
        i.controls.secret = vec![format!("d={}", tmp.path().display())];
        assert!(Spec::validate(i, &state).is_err(), "directory");
    }

    #[test]
    fn publish_implies_loopback_and_refuses_none() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let mut i = input(tmp.path());
        i.dir = tmp.path().join("ws");
        std::fs::create_dir(&i.dir).unwrap();
        i.controls.publish = vec![3000, 3000];
        let e = Spec::validate(i.clone(), &state).unwrap_err().to_string();
        assert!(e.contains("--publish 3000 is given twice"), "{e}");
        i.controls.publish = vec![3000, 3001];
        let spec = Spec::validate(i.clone(), &state).unwrap();
        assert_eq!(spec.net, Net::Loopback);
        assert_eq!(spec.publish, vec![3000, 3001]);
        i.controls.net = Some(Net::None);
        assert!(Spec::validate(i, &state).is_err());
    }

    #[test]
    fn net_raw_is_dropped_unless_asked_for() {
        assert!(!crate::init::KEPT_CAPS.contains(&CAP_NET_RAW));
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let mut i = input(tmp.path());
        i.dir = tmp.path().join("ws");
        std::fs::create_dir(&i.dir).unwrap();
        assert!(
            Spec::validate(i.clone(), &state)
                .unwrap()
                .extra_caps()
                .is_empty()
        );
        i.cap_net_raw = true;
        let spec = Spec::validate(i, &state).unwrap();
        assert_eq!(spec.extra_caps(), [CAP_NET_RAW]);
    }

    #[test]
    fn limits_are_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let mut i = input(tmp.path());
        i.dir = tmp.path().join("ws");
        std::fs::create_dir(&i.dir).unwrap();
        i.controls.memory = Some("1k".into());
        assert!(Spec::validate(i.clone(), &state).is_err());
        i.controls.memory = None;
        i.controls.pids = Some(1);
        assert!(Spec::validate(i.clone(), &state).is_err());
        i.controls.pids = None;
        i.controls.cpus = Some(f64::NAN);
        assert!(Spec::validate(i, &state).is_err());
    }

    #[test]
    fn idle_timeout_is_a_bounded_duration_for_long_lived_sandboxes_only() {
        use std::time::Duration;
        assert_eq!(parse_idle_timeout(None).unwrap(), None);
        assert_eq!(
            parse_idle_timeout(Some("5m")).unwrap(),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            parse_idle_timeout(Some("1h 30m")).unwrap(),
            Some(Duration::from_secs(5400))
        );
        for bad in ["", "5", "soon", "10ms", "365days"] {
            let e = parse_idle_timeout(Some(bad)).unwrap_err();
            assert_eq!(e.kind(), crate::Kind::InvalidInput, "{bad}");
            assert!(e.to_string().contains("--idle-timeout"), "{e}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let mut i = input(tmp.path());
        i.dir = tmp.path().join("ws");
        std::fs::create_dir(&i.dir).unwrap();
        i.controls.idle_timeout = Some("2s".into());
        let e = Spec::validate(i.clone(), &state).unwrap_err();
        assert!(e.to_string().contains("long-lived"), "{e}");
        i.keep = true;
        i.command.clear();
        let spec = Spec::validate(i, &state).unwrap();
        assert_eq!(spec.idle_timeout, Some(Duration::from_secs(2)));
    }
}
