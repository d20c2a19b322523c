//! How a VM run is placed, and the helper's flags for it: below both the sandbox
//! placement ([`crate::sandbox`], which passes them) and [`crate::vm`] (which starts one).

use std::ffi::OsString;
use std::path::Path;

/// How a VM run is placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmRun {
    /// Run under software emulation (TCG), which is no isolation boundary; the run
    /// says `isolation: needs_validation`.
    pub accept_emulation: bool,
}

/// `v` as the helper's `vm-run` and `vm-start` flags (the controls go on
/// `--controls-fd`, those a VM does not enforce yet too, so the helper refuses them by
/// name).
pub(crate) fn helper_flags(v: &VmRun, cache: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut c = OsString::from("--cache-dir=");
    c.push(cache.join("vm"));
    a.push(c);
    if v.accept_emulation {
        a.push("--accept-emulation".into());
    }
    a
}
