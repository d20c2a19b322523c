//! The `freezer` controller: every process of the group stopped where it is, its memory
//! kept, until thawed (`sandbox pause` / `resume`, and the keeper's idle pause).
//!
//! v1: `freezer.state` takes `FROZEN` or `THAWED` and reads `FREEZING` until every task
//! has stopped. v2: `cgroup.freeze` takes `1` or `0` (a core file of every non-root
//! group, not a controller listed in `cgroup.controllers`), and `cgroup.events` says
//! `frozen 1` once it is done. The group is created with the sandbox when the host has
//! a freezer, and sets no limit: it is only written when the sandbox is paused. A group
//! must be thawed before its processes can die of `SIGKILL` (a frozen task does not run
//! its signal handling): [`super::Group::destroy`] thaws first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Limits;
use super::{Controller, GroupDir, Version, read, write};
use crate::error::{Error, Result};

/// How long a freeze may stay in transition (`FREEZING`) before it is reported.
pub const FREEZE_TIMEOUT_MS: u64 = 5_000;
/// Pause between looks at a freeze in transition.
const FREEZE_POLL_MS: u64 = 1;

/// Creates nothing beyond the group directory: the freezer has no limit to set.
pub struct FreezerController;

impl Controller for FreezerController {
    fn apply(&self, _dir: &GroupDir<'_>, _limits: &Limits) -> Result<()> {
        Ok(())
    }
}

/// The freezer of one sandbox's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freezer {
    /// The group directory.
    pub dir: PathBuf,
    /// The version of its hierarchy.
    pub version: Version,
}

impl Freezer {
    /// The freezer among a sandbox's group directories: the one with `freezer.state`
    /// (v1) or `cgroup.freeze` (v2); `None` when the host has no freezer.
    pub fn find(dirs: &[PathBuf]) -> Option<Freezer> {
        dirs.iter().find_map(|d| {
            if d.join("freezer.state").is_file() {
                Some(Freezer {
                    dir: d.clone(),
                    version: Version::V1,
                })
            } else if d.join("cgroup.freeze").is_file() {
                Some(Freezer {
                    dir: d.clone(),
                    version: Version::V2,
                })
            } else {
                None
            }
        })
    }

    /// The file written to freeze or thaw.
    fn control(&self) -> PathBuf {
        match self.version {
            Version::V1 => self.dir.join("freezer.state"),
            Version::V2 => self.dir.join("cgroup.freeze"),
        }
    }

    /// Freezes every process of the group; returns once all are stopped (or fails after
    /// [`FREEZE_TIMEOUT_MS`], thawing again: never left half-frozen).
    pub fn freeze(&self) -> Result<()> {
        self.freeze_within(Duration::from_millis(FREEZE_TIMEOUT_MS))
    }

    /// [`Freezer::freeze`] with its timeout.
    pub fn freeze_within(&self, timeout: Duration) -> Result<()> {
        let value = match self.version {
            Version::V1 => "FROZEN",
            Version::V2 => "1",
        };
        write(&self.control(), value, "freeze")?;
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.thaw();
                return Err(Error::Cgroup {
                    step: "freeze (still in transition after the timeout; thawed again)",
                    path: self.control(),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                });
            }
            std::thread::sleep(Duration::from_millis(FREEZE_POLL_MS));
        }
    }

    /// Thaws the group: its processes run again.
    pub fn thaw(&self) -> Result<()> {
        let value = match self.version {
            Version::V1 => "THAWED",
            Version::V2 => "0",
        };
        write(&self.control(), value, "thaw")
    }

    /// Whether the group is frozen completely (not in transition, not thawed).
    pub fn is_frozen(&self) -> Result<bool> {
        Ok(match self.version {
            Version::V1 => read(&self.control(), "read freezer.state")? == "FROZEN",
            Version::V2 => read(&self.dir.join("cgroup.events"), "read cgroup.events")?
                .lines()
                .any(|l| l.trim() == "frozen 1"),
        })
    }
}

/// Thaws the group directory `dir` if it is a freezer group (before its processes are
/// killed); nothing otherwise.
pub fn thaw_dir(dir: &Path) {
    if let Some(f) = Freezer::find(&[dir.to_path_buf()]) {
        let _ = f.thaw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::testing::Fixture;

    #[test]
    fn apply_writes_nothing() {
        for version in [Version::V1, Version::V2] {
            let fx = Fixture::new(version);
            FreezerController
                .apply(&fx.dir(), &Limits::default())
                .unwrap();
            assert!(fx.files().is_empty());
        }
    }

    #[test]
    fn v1_freezes_and_thaws_through_freezer_state() {
        let fx = Fixture::new(Version::V1);
        fx.offer("freezer.state", "THAWED\n");
        let f = Freezer::find(&[fx.dir().path.to_path_buf()]).unwrap();
        assert_eq!(f.version, Version::V1);
        assert!(!f.is_frozen().unwrap());
        // A plain file reads back what was written, as the kernel's does once every task
        // has stopped.
        f.freeze().unwrap();
        assert_eq!(fx.read("freezer.state"), "FROZEN");
        assert!(f.is_frozen().unwrap());
        f.thaw().unwrap();
        assert_eq!(fx.read("freezer.state"), "THAWED");
        assert!(!f.is_frozen().unwrap());
    }

    #[test]
    fn v2_freezes_through_cgroup_freeze_and_waits_for_the_event() {
        let fx = Fixture::new(Version::V2);
        fx.offer("cgroup.freeze", "0\n");
        fx.offer("cgroup.events", "populated 1\nfrozen 1\n");
        let f = Freezer::find(&[fx.dir().path.to_path_buf()]).unwrap();
        assert_eq!(f.version, Version::V2);
        f.freeze().unwrap();
        assert_eq!(fx.read("cgroup.freeze"), "1");
        f.thaw().unwrap();
        assert_eq!(fx.read("cgroup.freeze"), "0");
    }

    #[test]
    fn a_freeze_that_never_completes_is_thawed_and_reported() {
        let fx = Fixture::new(Version::V2);
        fx.offer("cgroup.freeze", "0\n");
        fx.offer("cgroup.events", "populated 1\nfrozen 0\n");
        let f = Freezer::find(&[fx.dir().path.to_path_buf()]).unwrap();
        let err = f.freeze_within(Duration::from_millis(20)).unwrap_err();
        assert!(err.to_string().contains("thawed again"), "{err}");
        assert_eq!(fx.read("cgroup.freeze"), "0", "never left frozen");
    }

    #[test]
    fn groups_without_a_freezer_file_have_no_freezer() {
        let fx = Fixture::new(Version::V1);
        fx.offer("pids.max", "max\n");
        assert_eq!(Freezer::find(&[fx.dir().path.to_path_buf()]), None);
        thaw_dir(fx.dir().path); // nothing to do, nothing written
        assert_eq!(fx.files(), ["pids.max"]);
    }
}
