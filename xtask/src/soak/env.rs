//! The soak's own runtime root: made under /tmp, checked for leftovers, and taken down
//! whatever happened (the [`Env`]'s `Drop`).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};

use super::proc::{self, Mountctl};

/// The project every worker builds and tests: simplejson's source release (its C
/// extension compiled by `setup.py build_ext`, then its own unittest suite), downloaded
/// by `scripts/setup.sh` from PyPI with `pip download --no-binary :all:`.
pub const PROJECT: &str = "simplejson-3.19.3";
/// Where `scripts/setup.sh` keeps it.
pub const DEFAULT_SOURCE: &str = "/var/cache/cowspace/soak/simplejson-3.19.3.tar.gz";
/// Deadline of an administrative command (init, import, fsck, sweep, remove).
pub const ADMIN_DEADLINE: Duration = Duration::from_secs(300);
/// First host uid of sandbox uid ranges and their size (`sandbox-helper/src/alloc.rs`).
const HOST_ID_BASE: u64 = 1_000_000_000;
const IDS_PER_SANDBOX: u64 = 65_536;

/// One soak's runtime root and its sources.
#[derive(Debug)]
pub struct Env {
    pub mc: Mountctl,
    /// Everything the soak makes lives here: `root/` (the runtime root), `src/`,
    /// `baseline/`, `host/` (files copied in and out).
    pub base: PathBuf,
    pub root: PathBuf,
    /// The unpacked project (its parent is imported as the workspaces' snapshot).
    pub src: PathBuf,
    /// Prefix of every workspace name, unique to this run (cgroups are host-wide).
    pub tag: String,
    /// Set once a run is over and cleaned: `Drop` then does nothing.
    pub cleaned: bool,
}

impl Env {
    /// Makes the root (`init --workspaces-fs`), unpacks and imports the project, starts
    /// the daemon.
    pub fn setup(bin_dir: &Path, workspaces_fs: &str) -> Result<Env> {
        let source = std::env::var_os("COWSPACE_SOAK_SOURCE")
            .map_or_else(|| PathBuf::from(DEFAULT_SOURCE), PathBuf::from);
        if !source.is_file() {
            bail!(
                "the soak's project {} is missing: run scripts/setup.sh (it downloads {PROJECT} from PyPI) or point COWSPACE_SOAK_SOURCE at a copy",
                source.display()
            );
        }
        for b in ["mountctl", "fsd", "sandbox-helper"] {
            if !bin_dir.join(b).is_file() {
                bail!(
                    "{} is missing: build the binaries first (`cargo build --workspace --bins`)",
                    bin_dir.join(b).display()
                );
            }
        }
        let tag = format!("soak{}", std::process::id());
        let base = PathBuf::from(format!("/tmp/cowspace-{tag}"));
        if base.exists() {
            bail!(
                "{} exists: a soak of this pid ran before; remove it",
                base.display()
            );
        }
        std::fs::create_dir_all(&base)?;
        // The sandbox's unprivileged uid must traverse to the workspaces (TESTING.md).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711))?;
        // Copies of the binaries: a build in the shared target directory during a long
        // soak must not change what runs (mountctl finds its helpers beside itself).
        let bin = base.join("bin");
        std::fs::create_dir_all(&bin)?;
        for b in ["mountctl", "fsd", "sandbox-helper"] {
            std::fs::copy(bin_dir.join(b), bin.join(b))
                .with_context(|| format!("copying {}", bin_dir.join(b).display()))?;
        }
        let root = base.join("root");
        let mut env = Env {
            mc: Mountctl {
                bin: bin.join("mountctl"),
                root: root.clone(),
            },
            src: base.join("src").join(PROJECT),
            base,
            root,
            tag,
            cleaned: false,
        };
        for d in ["src", "baseline", "host"] {
            std::fs::create_dir_all(env.base.join(d))?;
        }
        let src_parent = env.base.join("src");
        proc::host(
            "tar",
            &[
                "xzf",
                &source.to_string_lossy(),
                "-C",
                &src_parent.to_string_lossy(),
            ],
            None,
            ADMIN_DEADLINE,
        )?;
        env.mc
            .ok(&["init", "--workspaces-fs", workspaces_fs], ADMIN_DEADLINE)?;
        env.mc.ok(
            &[
                "-q",
                "import",
                &src_parent.to_string_lossy(),
                "--ref",
                "soak/base",
            ],
            ADMIN_DEADLINE,
        )?;
        env.mc.ok(&["daemon", "start"], ADMIN_DEADLINE)?;
        env.cleaned = false;
        Ok(env)
    }

    /// The sandbox helper's state directory of this root.
    pub fn state(&self) -> PathBuf {
        self.root.join("run/sandbox")
    }

    /// The daemon's pid, from the process table: `fsd --root ROOT`.
    pub fn daemon_pid(&self) -> Option<u32> {
        let needle = format!("--root {}", self.root.display());
        proc::pids_matching(&needle).into_iter().find(|&p| {
            proc::cmdline(p)
                .is_some_and(|c| c.split(' ').next().is_some_and(|b| b.ends_with("/fsd")))
        })
    }

    /// Mount points under this soak's directory, deepest first.
    pub fn mounts(&self) -> Vec<String> {
        let prefix = format!("{}/", self.base.display());
        let mut v: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        v.sort_by_key(|m| std::cmp::Reverse(m.len()));
        v
    }

    /// Names of the run's workspaces (`list --all`).
    pub fn workspaces(&self) -> Result<Vec<serde_json::Value>> {
        let v = self.mc.json(&["list", "--all"], ADMIN_DEADLINE)?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// What a sandbox that has ended may not leave: its processes, cgroups, run
    /// directory, mounts, port leases, uid lease. `info` is its `sandbox start --json`.
    pub fn dead_sandbox_leftovers(&self, info: &serde_json::Value) -> Vec<String> {
        let mut left = Vec::new();
        let name = info["name"].as_str().unwrap_or("?");
        let keeper = info["keeper_pid"].as_u64().unwrap_or(0) as u32;
        for key in ["keeper_pid", "init_pid"] {
            if let Some(p) = info[key].as_u64()
                && proc::alive(p as u32)
                && proc::cmdline(p as u32).is_some_and(|c| c.contains("sandbox-helper"))
            {
                left.push(format!("{name}: process {p} ({key}) still runs"));
            }
        }
        for cg in info["cgroups"].as_array().into_iter().flatten() {
            if let Some(cg) = cg.as_str()
                && Path::new(cg).exists()
            {
                left.push(format!("{name}: cgroup {cg} still exists"));
            }
        }
        let run_dir = self.state().join("run").join(format!("{name}.{keeper}"));
        if run_dir.exists() {
            left.push(format!(
                "{name}: run directory {} still exists",
                run_dir.display()
            ));
        }
        let run_prefix = run_dir.display().to_string();
        for m in self.mounts() {
            if m.starts_with(&run_prefix) {
                left.push(format!("{name}: mount {m} remains"));
            }
        }
        for port in info["ports"].as_object().into_iter().flatten() {
            if let Some(host) = port.1.as_u64() {
                let lock = self.state().join("ports").join(format!("{host}.lock"));
                if lease_held(&lock) {
                    left.push(format!("{name}: port lease {} still held", lock.display()));
                }
            }
        }
        if let Some(base) = info["host_uid_base"].as_u64() {
            let slot = base.saturating_sub(HOST_ID_BASE) / IDS_PER_SANDBOX;
            let lock = self.state().join("ids").join(format!("{slot}.lock"));
            if lease_held(&lock) {
                left.push(format!("{name}: uid lease {} still held", lock.display()));
            }
        }
        left
    }

    /// At the end, with every sandbox stopped and `sweep` run: nothing of a sandbox may
    /// remain (run directories, leases, cgroups named for this run, helper processes).
    pub fn no_sandbox_leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let run = self.state().join("run");
        for e in std::fs::read_dir(&run).into_iter().flatten().flatten() {
            left.push(format!("run directory {} remains", e.path().display()));
        }
        for kind in ["ports", "ids"] {
            for e in std::fs::read_dir(self.state().join(kind))
                .into_iter()
                .flatten()
                .flatten()
            {
                if lease_held(&e.path()) {
                    left.push(format!("lease {} still held", e.path().display()));
                }
            }
        }
        for ctl in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = ctl.path().join("cowspace");
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", self.tag))
                {
                    left.push(format!("cgroup {} remains", e.path().display()));
                }
            }
        }
        for p in proc::pids_matching(&self.state().display().to_string()) {
            left.push(format!(
                "process {p} remains: {}",
                proc::cmdline(p).unwrap_or_default()
            ));
        }
        let run_prefix = run.display().to_string();
        for m in self.mounts() {
            if m.starts_with(&run_prefix) {
                left.push(format!("mount {m} remains"));
            }
        }
        left
    }

    /// Takes everything down: workspaces (their sandboxes with them), the daemon, the
    /// processes of this root, the mounts, the directory. Returns what it had to force.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut forced = Vec::new();
        if self.cleaned {
            return forced;
        }
        if let Ok(list) = self.workspaces() {
            for ws in list {
                if ws["status"].as_str() == Some("removed") {
                    continue;
                }
                let id = ws["id"].as_str().unwrap_or_default().to_string();
                match self
                    .mc
                    .run(&["-q", "remove", "--force", &id], ADMIN_DEADLINE)
                {
                    Ok(o) if o.ok() => {}
                    Ok(o) => forced.push(format!("remove --force {id}: {}", o.describe())),
                    Err(e) => forced.push(format!("remove --force {id}: {e:#}")),
                }
            }
        }
        let _ = self.mc.run(&["-q", "sweep"], ADMIN_DEADLINE);
        match self
            .mc
            .run(&["-q", "daemon", "stop", "--force"], ADMIN_DEADLINE)
        {
            Ok(o) if o.ok() => {}
            Ok(o) => forced.push(format!("daemon stop --force: {}", o.describe())),
            Err(e) => forced.push(format!("daemon stop --force: {e:#}")),
        }
        let needle = self.root.display().to_string();
        let t = std::time::Instant::now();
        while !proc::pids_matching(&needle).is_empty() && t.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(100));
        }
        for p in proc::pids_matching(&needle) {
            forced.push(format!(
                "killed {p}: {}",
                proc::cmdline(p).unwrap_or_default()
            ));
            let _ = proc::kill9(p);
        }
        std::thread::sleep(Duration::from_millis(200));
        for m in self.mounts() {
            let ok = proc::host("umount", &[&m], None, ADMIN_DEADLINE).is_ok();
            if !ok {
                let _ = proc::host("umount", &["-l", &m], None, ADMIN_DEADLINE);
            }
            // The workspaces filesystem and the native lower images are the runtime's
            // own mounts of a run that ends; others would be leftovers.
            if !(m.ends_with("/root/workspaces")
                || m.contains("/root/cache/native/")
                || m.contains("/root/run/view"))
            {
                forced.push(format!("unmounted {m}"));
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.base) {
            forced.push(format!("removing {}: {e}", self.base.display()));
        }
        self.cleaned = true;
        forced
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for f in self.teardown() {
            eprintln!("soak: cleanup: {f}");
        }
    }
}

/// Whether someone holds the `flock` of a lease file (a missing file is no lease).
fn lease_held(path: &Path) -> bool {
    let Ok(f) = File::options().read(true).write(true).open(path) else {
        return false;
    };
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => {
            drop(lock);
            false
        }
        Err(_) => true,
    }
}

/// The set of snapshot ids of the store (`snapshots --json`).
pub fn snapshot_ids(mc: &Mountctl) -> Result<BTreeSet<String>> {
    let v = mc.json(&["snapshots"], ADMIN_DEADLINE)?;
    Ok(v.as_array()
        .context("snapshots: not an array")?
        .iter()
        .filter_map(|s| s["snapshot"].as_str().map(str::to_string))
        .collect())
}
