//! The configuration file: defaults for the runtime root, how workspaces are made and
//! what sandboxes get, so a host's operator sets them once.
//!
//! Read from `/etc/cowspace/config.toml`, then `$XDG_CONFIG_HOME/cowspace/config.toml`
//! (`~/.config/cowspace/config.toml`), a later file's keys over an earlier one's; or, when
//! `$COWSPACE_CONFIG` names a file, from that file alone. A missing file is no error; a
//! file that is not valid TOML, has a key this build does not know, or a value no
//! create or sandbox could use, is (naming the file, the key and what it takes): every
//! value is checked when the file is read, so `mountctl config` finds a bad one. Environment variables and flags override it:
//!
//! ```toml
//! root = "/var/lib/cowspace"          # $COWSPACE_ROOT, --root
//!
//! [create]
//! materializer = "auto"               # $COWSPACE_MATERIALIZER, --materializer
//! lower = "auto"                      # $COWSPACE_LOWER, --lower
//! disk = "20g"                        # --disk (a quota per workspace; none by default)
//!
//! [sandbox]                           # sandbox start / run flags of the same names
//! net = "none"
//! memory = "2g"
//! pids = 1024
//! cpus = 1.5
//! cpuset_cpus = "0-1"
//! allow_host = ["pypi.org", "*.pythonhosted.org:443"]  # with net = "egress" (or --net egress)
//! deny_host = []                      # ... unless the start gives that list itself
//! add_host = ["db.internal:10.0.0.5"]
//!
//! [vm]
//! accept_emulation = false            # run --vm's --accept-emulation
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// Names the one configuration file to read instead of the usual two.
pub const CONFIG_ENV: &str = "COWSPACE_CONFIG";
/// The system's configuration file.
pub const SYSTEM_CONFIG: &str = "/etc/cowspace/config.toml";

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag (or a request's argument).
    Flag,
    /// An environment variable.
    Env(&'static str),
    /// A configuration file.
    File(PathBuf),
    /// Built in.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Flag => f.write_str("flag"),
            Origin::Env(v) => write!(f, "${v}"),
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Default => f.write_str("default"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting<T> {
    pub value: T,
    pub origin: Origin,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    root: Option<PathBuf>,
    #[serde(default)]
    create: CreateSection,
    #[serde(default)]
    sandbox: SandboxSection,
    #[serde(default)]
    vm: VmSection,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmSection {
    accept_emulation: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSection {
    materializer: Option<String>,
    lower: Option<String>,
    disk: Option<Size>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxSection {
    net: Option<String>,
    memory: Option<Size>,
    pids: Option<u64>,
    cpus: Option<f64>,
    cpuset_cpus: Option<String>,
    allow_host: Option<Vec<String>>,
    deny_host: Option<Vec<String>>,
    add_host: Option<Vec<String>>,
    image: Option<String>,
}

/// What a sandbox gets when its start names nothing else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxDefaults {
    pub net: Option<Setting<String>>,
    pub memory: Option<Setting<String>>,
    pub pids: Option<Setting<u64>>,
    pub cpus: Option<Setting<f64>>,
    pub cpuset_cpus: Option<Setting<String>>,
    /// Egress policy lists, for a sandbox with `net = egress` whose start gives none of
    /// that list ([`crate::sandbox::with_defaults`]).
    pub allow_host: Option<Setting<Vec<String>>>,
    pub deny_host: Option<Setting<Vec<String>>>,
    pub add_host: Option<Setting<Vec<String>>>,
    /// `--image` of a sandbox whose start names none (a ref or snapshot id).
    pub image: Option<Setting<String>>,
}

/// The configuration files read, lowest precedence first.
#[derive(Debug, Clone, Default)]
pub struct Config {
    files: Vec<(PathBuf, FileConfig)>,
    /// The files looked for, found or not (for `mountctl config`).
    searched: Vec<PathBuf>,
}

/// The files read when `$COWSPACE_CONFIG` is not set, lowest precedence first.
pub fn default_paths() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(SYSTEM_CONFIG)];
    let user = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".config")));
    if let Some(dir) = user {
        out.push(dir.join("cowspace/config.toml"));
    }
    out
}

const KNOWN: &str = "root; [create] materializer, lower, disk; [sandbox] net, memory, pids, cpus, cpuset_cpus, allow_host, deny_host, add_host, image; [vm] accept_emulation";

/// The smallest `[sandbox] memory` and `pids` the sandbox helper accepts (its
/// `MIN_MEMORY_BYTES` and `MIN_PIDS`), and the range of `cpus` it takes: a file asking for
/// less is refused when read, not at the first sandbox.
const MIN_SANDBOX_MEMORY_BYTES: u64 = 4 << 20;
const MIN_SANDBOX_PIDS: u64 = 2;
const SANDBOX_CPUS: std::ops::RangeInclusive<f64> = 0.01..=1024.0;
/// The highest CPU number a `cpuset_cpus` list may name.
const MAX_CPU_INDEX: u32 = 65_535;

fn env(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Config {
    /// Reads the configuration (see the module docs).
    pub fn load() -> Result<Config> {
        match std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty()) {
            Some(p) => {
                let p = PathBuf::from(p);
                if !p.is_file() {
                    return Err(Error::Invalid(format!(
                        "${CONFIG_ENV} names {}, which is not a file: point it at a \
                         config.toml, or unset it to read {SYSTEM_CONFIG} and the user's",
                        p.display()
                    )));
                }
                Config::from_files(&[p])
            }
            None => Config::from_files(&default_paths()),
        }
    }

    /// Reads these files, lowest precedence first; missing ones are skipped.
    pub fn from_files(paths: &[PathBuf]) -> Result<Config> {
        let mut c = Config::default();
        for p in paths {
            c.searched.push(p.clone());
            let text = match std::fs::read_to_string(p) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("read", p)(e)),
            };
            let file: FileConfig = toml::from_str(&text).map_err(|e| {
                Error::Invalid(format!(
                    "{}: {}(the keys there are: {KNOWN})",
                    p.display(),
                    e.to_string().trim_end().to_string() + " "
                ))
            })?;
            check(p, &file)?;
            c.files.push((p.clone(), file));
        }
        Ok(c)
    }

    /// The highest-precedence file value of a key.
    fn file<T>(&self, get: impl Fn(&FileConfig) -> Option<T>) -> Option<Setting<T>> {
        self.files.iter().rev().find_map(|(p, f)| {
            get(f).map(|value| Setting {
                value,
                origin: Origin::File(p.clone()),
            })
        })
    }

    fn resolve<T: Clone>(
        &self,
        flag: Option<T>,
        env_name: &'static str,
        parse_env: impl Fn(String) -> Option<T>,
        get: impl Fn(&FileConfig) -> Option<T>,
    ) -> Option<Setting<T>> {
        if let Some(value) = flag {
            return Some(Setting {
                value,
                origin: Origin::Flag,
            });
        }
        if let Some(value) = env(env_name).and_then(parse_env) {
            return Some(Setting {
                value,
                origin: Origin::Env(env_name),
            });
        }
        self.file(get)
    }

    /// The runtime root: the flag, `$COWSPACE_ROOT`, the file's `root`, else the
    /// built-in default (`/var/lib/cowspace` for root, else under `$XDG_DATA_HOME`).
    pub fn root(&self, flag: Option<PathBuf>) -> Setting<PathBuf> {
        self.resolve(
            flag,
            "COWSPACE_ROOT",
            |v| Some(PathBuf::from(v)),
            |f| f.root.clone(),
        )
        .unwrap_or_else(|| Setting {
            value: cowspace_store::layout::default_root(),
            origin: Origin::Default,
        })
    }

    /// How a workspace is made when its create names no materializer.
    pub fn materializer(&self, flag: Option<String>) -> Setting<String> {
        self.resolve(flag, "COWSPACE_MATERIALIZER", Some, |f| {
            f.create.materializer.clone()
        })
        .unwrap_or_else(|| Setting {
            value: "auto".into(),
            origin: Origin::Default,
        })
    }

    /// An overlay workspace's lower when its create names none.
    pub fn lower(&self, flag: Option<String>) -> Setting<String> {
        self.resolve(flag, "COWSPACE_LOWER", Some, |f| f.create.lower.clone())
            .unwrap_or_else(|| Setting {
                value: "auto".into(),
                origin: Origin::Default,
            })
    }

    /// A workspace's disk quota when its create names none (`[create] disk`): none
    /// unless set.
    pub fn disk(&self, flag: Option<String>) -> Option<Setting<String>> {
        if let Some(value) = flag {
            return Some(Setting {
                value,
                origin: Origin::Flag,
            });
        }
        self.file(|f| f.create.disk.as_ref().map(memory_text))
    }

    /// What sandboxes get when their start names nothing else.
    pub fn sandbox(&self) -> SandboxDefaults {
        SandboxDefaults {
            net: self.file(|f| f.sandbox.net.clone()),
            memory: self.file(|f| f.sandbox.memory.as_ref().map(memory_text)),
            pids: self.file(|f| f.sandbox.pids),
            cpus: self.file(|f| f.sandbox.cpus),
            cpuset_cpus: self.file(|f| f.sandbox.cpuset_cpus.clone()),
            allow_host: self.file(|f| f.sandbox.allow_host.clone()),
            deny_host: self.file(|f| f.sandbox.deny_host.clone()),
            add_host: self.file(|f| f.sandbox.add_host.clone()),
            image: self.file(|f| f.sandbox.image.clone()),
        }
    }

    /// Whether VM runs accept software emulation (`[vm] accept_emulation`).
    pub fn vm_accept_emulation(&self) -> Option<Setting<bool>> {
        self.file(|f| f.vm.accept_emulation)
    }

    /// Every setting with its effective value and origin (`mountctl config`); `root`
    /// as given (a flag, if any).
    pub fn effective(&self, root_flag: Option<PathBuf>) -> Value {
        let row = |key: &str, value: Value, origin: &Origin| json!({"key": key, "value": value, "from": origin.to_string()});
        let root = self.root(root_flag);
        let m = self.materializer(None);
        let l = self.lower(None);
        let mut rows = vec![
            row("root", json!(root.value), &root.origin),
            row("create.materializer", json!(m.value), &m.origin),
            row("create.lower", json!(l.value), &l.origin),
        ];
        let s = self.sandbox();
        fn json_of<T: serde::Serialize>(s: Option<Setting<T>>) -> Option<(Value, Origin)> {
            s.map(|x| (json!(x.value), x.origin))
        }
        // What applies when nothing sets a key (`value` is null then): `default`.
        for (key, v, default) in [
            ("create.disk", json_of(self.disk(None)), "no quota"),
            (
                "sandbox.net",
                json_of(s.net),
                "none (loopback when ports are published)",
            ),
            ("sandbox.memory", json_of(s.memory), "no limit"),
            ("sandbox.pids", json_of(s.pids), "no limit"),
            ("sandbox.cpus", json_of(s.cpus), "no limit"),
            (
                "sandbox.cpuset_cpus",
                json_of(s.cpuset_cpus),
                "every online CPU",
            ),
            (
                "sandbox.allow_host",
                json_of(s.allow_host),
                "no host (egress denies by default)",
            ),
            ("sandbox.deny_host", json_of(s.deny_host), "none"),
            ("sandbox.add_host", json_of(s.add_host), "none"),
            (
                "sandbox.image",
                json_of(s.image),
                "none (the host's /usr, /bin, /lib*)",
            ),
            (
                "vm.accept_emulation",
                json_of(self.vm_accept_emulation()),
                "false (software emulation refused)",
            ),
        ] {
            let (value, origin) = v.unwrap_or((Value::Null, Origin::Default));
            let mut r = row(key, value, &origin);
            r["default"] = json!(default);
            rows.push(r);
        }
        let read: Vec<String> = self
            .files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        let searched: Vec<String> = self
            .searched
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        json!({"settings": rows, "files_read": read, "files_searched": searched})
    }
}

/// A memory size in the file: text (`"2g"`) or a number of bytes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

fn memory_text(v: &Size) -> String {
    match v {
        Size::Bytes(n) => n.to_string(),
        Size::Text(s) => s.clone(),
    }
}

/// Refuses values no create or sandbox could use, naming the file, the key and the
/// choices, so a typo is found when the file is read, not at the hundredth create.
fn check(p: &Path, f: &FileConfig) -> Result<()> {
    let bad = |key: &str, value: &str, choices: &str| {
        Err(Error::Invalid(format!(
            "{}: {key} = {value:?}: choose {choices}",
            p.display()
        )))
    };
    if let Some(m) = &f.create.materializer
        && m != "auto"
        && crate::materializer::MaterializerKind::parse(m).is_err()
    {
        return bad(
            "create.materializer",
            m,
            "auto, overlay, fuse, btrfs, reflink, copy or nfs",
        );
    }
    if let Some(l) = &f.create.lower
        && !matches!(l.as_str(), "auto" | "native" | "view" | "checkout")
    {
        return bad("create.lower", l, "auto, native, view or checkout");
    }
    if let Some(d) = &f.create.disk
        && crate::quota::parse_size("create.disk", &memory_text(d)).is_err()
    {
        return bad(
            "create.disk",
            &memory_text(d),
            "a size such as 20g, or bytes",
        );
    }
    if let Some(n) = &f.sandbox.net
        && !matches!(n.as_str(), "none" | "loopback" | "egress")
    {
        return bad("sandbox.net", n, "none, loopback or egress");
    }
    check_sandbox(p, &f.sandbox)?;
    if let Some(r) = &f.root
        && !r.is_absolute()
    {
        return bad("root", &r.display().to_string(), "an absolute path");
    }
    Ok(())
}

/// The `[sandbox]` limits and egress lists, checked as the helper and the egress proxy
/// would check them (the host's own CPUs aside: the file may serve several hosts).
fn check_sandbox(p: &Path, s: &SandboxSection) -> Result<()> {
    let bad = |key: &str, value: String, want: String| {
        Err(Error::Invalid(format!(
            "{}: sandbox.{key} = {value}: {want}",
            p.display()
        )))
    };
    match &s.memory {
        Some(Size::Text(t)) => match sandbox_api::size::parse(t).ok() {
            Some(n) if n >= MIN_SANDBOX_MEMORY_BYTES => {}
            Some(_) => {
                return bad(
                    "memory",
                    format!("{t:?}"),
                    format!("at least {MIN_SANDBOX_MEMORY_BYTES} bytes (4m)"),
                );
            }
            None => {
                return bad(
                    "memory",
                    format!("{t:?}"),
                    "expected bytes, or a number with a k, m, g or t suffix (\"512m\") that fits in 64 bits".into(),
                );
            }
        },
        Some(Size::Bytes(n)) if *n < MIN_SANDBOX_MEMORY_BYTES => {
            return bad(
                "memory",
                n.to_string(),
                format!("at least {MIN_SANDBOX_MEMORY_BYTES} bytes (4m)"),
            );
        }
        _ => {}
    }
    if let Some(n) = s.pids
        && n < MIN_SANDBOX_PIDS
    {
        return bad(
            "pids",
            n.to_string(),
            format!("at least {MIN_SANDBOX_PIDS} (the sandbox's init counts)"),
        );
    }
    if let Some(c) = s.cpus
        && !(c.is_finite() && SANDBOX_CPUS.contains(&c))
    {
        return bad(
            "cpus",
            c.to_string(),
            format!(
                "expected {} to {}",
                SANDBOX_CPUS.start(),
                SANDBOX_CPUS.end()
            ),
        );
    }
    if let Some(l) = &s.cpuset_cpus
        && !cpu_list_ok(l)
    {
        return bad(
            "cpuset_cpus",
            format!("{l:?}"),
            "expected a CPU list such as \"0-1,3\" (numbers and ranges, low to high)".into(),
        );
    }
    // The parsers' messages name the flag (`--add-host ...`): the file has a key.
    let why = |e: cowspace_egress::policy::PatternError| {
        let m = e.to_string();
        match m.strip_prefix("--") {
            Some(rest) => rest
                .split_once(' ')
                .map_or(m.clone(), |(_, r)| r.to_string()),
            None => m,
        }
    };
    for (key, list) in [("allow_host", &s.allow_host), ("deny_host", &s.deny_host)] {
        for v in list.iter().flatten() {
            if let Err(e) = v.parse::<cowspace_egress::policy::HostPattern>() {
                return bad(key, format!("[.. {v:?} ..]"), why(e));
            }
        }
    }
    for v in s.add_host.iter().flatten() {
        if let Err(e) = v.parse::<cowspace_egress::policy::AddHost>() {
            return bad("add_host", format!("[.. {v:?} ..]"), why(e));
        }
    }
    Ok(())
}

/// Whether `text` is a CPU list in the kernel's format (`0-1,3`).
fn cpu_list_ok(text: &str) -> bool {
    let num = |t: &str| {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u32>().ok())
            .flatten()
            .filter(|n| *n <= MAX_CPU_INDEX)
    };
    !text.is_empty()
        && text.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => matches!((num(a), num(b)), (Some(a), Some(b)) if a <= b),
            None => num(part).is_some(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn vm_accept_emulation_is_read_and_a_wrong_type_refused() {
        let d = tempfile::tempdir().unwrap();
        let f = write(d.path(), "c.toml", "[vm]\naccept_emulation = true\n");
        let c = Config::from_files(std::slice::from_ref(&f)).unwrap();
        let s = c.vm_accept_emulation().unwrap();
        assert_eq!((s.value, s.origin), (true, Origin::File(f)));
        assert!(Config::default().vm_accept_emulation().is_none());
        let bad = write(d.path(), "b.toml", "[vm]\naccept_emulation = \"yes\"\n");
        let e = Config::from_files(&[bad]).unwrap_err().to_string();
        assert!(e.contains("accept_emulation"), "{e}");
    }

    #[test]
    fn a_later_file_overrides_an_earlier_one_key_by_key() {
        let d = tempfile::tempdir().unwrap();
        let sys = write(
            d.path(),
            "sys.toml",
            "root = \"/srv/cow\"\n[create]\nmaterializer = \"overlay\"\nlower = \"view\"\n[sandbox]\nmemory = 8388608\npids = 64\n",
        );
        let user = write(
            d.path(),
            "user.toml",
            "[create]\nlower = \"checkout\"\n[sandbox]\nmemory = \"2g\"\n",
        );
        let missing = d.path().join("missing.toml");
        let c = Config::from_files(&[sys.clone(), user.clone(), missing]).unwrap();
        assert_eq!(
            c.file(|f| f.root.clone()).unwrap().value,
            PathBuf::from("/srv/cow")
        );
        let m = c.file(|f| f.create.materializer.clone()).unwrap();
        assert_eq!(
            (m.value.as_str(), m.origin),
            ("overlay", Origin::File(sys.clone()))
        );
        let l = c.file(|f| f.create.lower.clone()).unwrap();
        assert_eq!(
            (l.value.as_str(), l.origin),
            ("checkout", Origin::File(user.clone()))
        );
        let s = c.sandbox();
        assert_eq!(s.memory.unwrap().value, "2g");
        assert_eq!(
            s.pids.unwrap(),
            Setting {
                value: 64,
                origin: Origin::File(sys)
            }
        );
        assert!(s.net.is_none());
        // A flag beats every file.
        assert_eq!(c.lower(Some("native".into())).origin, Origin::Flag);
        let v = c.effective(Some(PathBuf::from("/flag/root")));
        assert_eq!(v["settings"][0]["from"], "flag");
        assert_eq!(v["files_read"].as_array().unwrap().len(), 2);
        assert_eq!(v["files_searched"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_the_key_and_the_choices() {
        let d = tempfile::tempdir().unwrap();
        for (text, want) in [
            ("[create]\nmaterialiser = \"overlay\"\n", "materialiser"),
            ("[create]\nmaterializer = \"zfs\"\n", "create.materializer"),
            ("[create]\nlower = \"disk\"\n", "create.lower"),
            (
                "[sandbox]\nnet = \"host\"\n",
                "choose none, loopback or egress",
            ),
            ("root = \"relative\"\n", "absolute"),
            ("root = [\n", "config.toml"),
            ("[sandbox]\nmemory = 1.5\n", "memory = 1.5"),
            (
                "[sandbox]\nmemory = \"lots\"\n",
                "sandbox.memory = \"lots\"",
            ),
            (
                "[sandbox]\nmemory = \"99999999999999g\"\n",
                "fits in 64 bits",
            ),
            ("[sandbox]\nmemory = 1024\n", "at least"),
            ("[sandbox]\npids = 1\n", "sandbox.pids = 1"),
            ("[sandbox]\ncpus = 0.0\n", "sandbox.cpus = 0"),
            ("[sandbox]\ncpus = 5000\n", "sandbox.cpus"),
            ("[sandbox]\ncpuset_cpus = \"3-1\"\n", "sandbox.cpuset_cpus"),
            ("[sandbox]\ncpuset_cpus = \"all\"\n", "sandbox.cpuset_cpus"),
            (
                "[sandbox]\nallow_host = [\"https://x.org\"]\n",
                "sandbox.allow_host",
            ),
            ("[sandbox]\ndeny_host = [\"\"]\n", "sandbox.deny_host"),
            ("[sandbox]\nadd_host = [\"db\"]\n", "sandbox.add_host"),
            ("[sandbox]\nallow_host = \"pypi.org\"\n", "allow_host"),
        ] {
            let p = write(d.path(), "config.toml", text);
            let e = Config::from_files(&[p]).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("config.toml"), "{text:?}: {e}");
        }
    }

    #[test]
    fn good_sandbox_values_are_read() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "config.toml",
            "[sandbox]\nnet = \"egress\"\nmemory = \"512m\"\npids = 64\ncpus = 1.5\n\
             cpuset_cpus = \"0-1,3\"\nallow_host = [\"pypi.org\", \"*.example.com:443\"]\n\
             deny_host = [\"evil.example.com\"]\nadd_host = [\"db.internal:10.0.0.5\"]\n",
        );
        let s = Config::from_files(std::slice::from_ref(&p))
            .unwrap()
            .sandbox();
        assert_eq!(
            s.allow_host.unwrap().value,
            ["pypi.org", "*.example.com:443"]
        );
        assert_eq!(s.add_host.unwrap().origin, Origin::File(p));
        assert_eq!(s.net.unwrap().value, "egress");
    }

    #[test]
    fn the_default_image_applies_to_a_sandbox_that_names_none() {
        use crate::sandbox::{SandboxOptions, with_defaults};
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "config.toml",
            "[sandbox]\nimage = \"img/python\"\n",
        );
        let defaults = Config::from_files(&[p]).unwrap().sandbox();
        let o = with_defaults(SandboxOptions::default(), &defaults);
        assert_eq!(o.image.as_deref(), Some("img/python"));
        let own = SandboxOptions {
            image: Some("img/node".into()),
            ..Default::default()
        };
        assert_eq!(
            with_defaults(own, &defaults).image.as_deref(),
            Some("img/node")
        );
    }

    #[test]
    fn egress_lists_apply_only_to_egress_sandboxes_that_give_none() {
        use crate::sandbox::{SandboxOptions, with_defaults};
        use sandbox_api::spec::Net;
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "config.toml",
            "[sandbox]\nallow_host = [\"pypi.org\"]\nadd_host = [\"db:10.0.0.5\"]\n",
        );
        let defaults = Config::from_files(&[p]).unwrap().sandbox();
        let egress = SandboxOptions {
            net: Some(Net::Egress),
            ..Default::default()
        };
        let o = with_defaults(egress.clone(), &defaults);
        assert_eq!(
            (o.allow_host, o.add_host),
            (
                vec!["pypi.org".to_string()],
                vec!["db:10.0.0.5".to_string()]
            )
        );
        assert!(o.deny_host.is_empty());
        let own = with_defaults(
            SandboxOptions {
                allow_host: vec!["example.com".into()],
                ..egress
            },
            &defaults,
        );
        assert_eq!(
            own.allow_host,
            ["example.com"],
            "the flags' list wins whole"
        );
        assert_eq!(own.add_host, ["db:10.0.0.5"], "another list still defaults");
        let none = with_defaults(SandboxOptions::default(), &defaults);
        assert!(
            none.allow_host.is_empty() && none.add_host.is_empty(),
            "not egress"
        );
        // `net = egress` from the file counts as egress.
        let d2 = tempfile::tempdir().unwrap();
        let p = write(
            d2.path(),
            "config.toml",
            "[sandbox]\nnet = \"egress\"\ndeny_host = [\"x.org\"]\n",
        );
        let o = with_defaults(
            SandboxOptions::default(),
            &Config::from_files(&[p]).unwrap().sandbox(),
        );
        assert_eq!(
            (o.net, o.deny_host),
            (Some(Net::Egress), vec!["x.org".to_string()])
        );
    }

    #[test]
    fn nothing_configured_gives_the_built_in_defaults() {
        let c = Config::from_files(&[]).unwrap();
        assert_eq!(c.materializer(None).value, "auto");
        assert!(c.sandbox() == SandboxDefaults::default());
    }
}
