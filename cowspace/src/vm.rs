//! VM placements of workspaces: one-shot runs (`mountctl run WS --vm -- CMD`) and
//! long-lived VM sandboxes (`mountctl sandbox start WS --vm`, then `exec`, `status`,
//! `stop` as for any sandbox: the helper's keeper serves them alike).
//!
//! The privileged work is `sandbox-helper vm-run`'s (the helper's `vm` module): it finds
//! qemu, virtiofsd, the guest kernel and the initramfs (cached under
//! `<root>/cache/vm/`), refuses software emulation unless it was accepted, and runs the
//! command in a qemu `microvm` with the workspace's own host mount shared in by
//! virtio-fs. This module claims the workspace for the run, as a namespace sandbox's run
//! does ([`Runtime::sandbox_run`]), and passes the helper its flags.

use crate::error::Result;
use crate::runtime::Runtime;
use crate::sandbox::SandboxOptions;

pub use crate::vmrun::VmRun;

impl Runtime {
    /// Runs `command` in a one-shot VM of workspace `ws` and gives its exit status; the
    /// command's stdout and stderr are this process's. Refusals (7: software emulation
    /// not accepted, no qemu, virtiofsd or guest kernel, a control a VM does not enforce
    /// yet) come back as the helper's exit status with its message on stderr; nothing is
    /// started then. Signals to this process end the VM.
    pub fn vm_run(
        &self,
        ws: &str,
        o: &SandboxOptions,
        v: &VmRun,
        command: &[String],
        json: bool,
    ) -> Result<u8> {
        self.one_shot(ws, o, command, json, Some(v))
    }

    /// Starts a long-lived VM sandbox of workspace `ws` and returns its status once the
    /// guest is up (`provider: "vm"`, `isolation` with its reason). Refused as
    /// [`Runtime::vm_run`] is, before anything starts; `exists` when a sandbox runs.
    pub fn vm_start(&self, ws: &str, o: &SandboxOptions, v: &VmRun) -> Result<serde_json::Value> {
        self.start_sandbox(ws, o, Some(v))
    }
}
