//! Builds the guest agent (`guest/agent.rs`, standard library only) as a static binary
//! for the guest (`x86_64-unknown-linux-gnu` with `+crt-static`: no C library in the
//! initramfs), which the helper carries (`vm::initramfs::AGENT`) and puts in the
//! initramfs. The cargo `cowspace-guest-agent` bin target is the same source, built
//! the usual way, so that tests and lints cover it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=guest/agent.rs");
    println!("cargo:rerun-if-changed=src/vm/proto.rs");
    println!("cargo:rerun-if-changed=src/vm/netrelay.rs");
    println!("cargo:rerun-if-changed=guest/net.rs");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"))
        .join("cowspace-guest-agent");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut remap = std::ffi::OsString::from("--remap-path-prefix=");
    remap.push(&dir);
    remap.push("=cowspace");
    let status = Command::new(rustc)
        .args([
            "--edition=2024",
            "--crate-name=cowspace_guest_agent",
            "--crate-type=bin",
            "--target=x86_64-unknown-linux-gnu",
            "-Copt-level=2",
            "-Ctarget-feature=+crt-static",
            "-Cpanic=abort",
            "-Cdebuginfo=0",
            "-Cstrip=symbols",
        ])
        .arg(remap)
        .arg("-o")
        .arg(&out)
        .arg(dir.join("guest/agent.rs"))
        .status()
        .expect("run rustc for the guest agent");
    assert!(
        status.success(),
        "building the static guest agent failed ({status}); it needs the x86_64-unknown-linux-gnu target's static C library (libc6-dev: /usr/lib/x86_64-linux-gnu/libc.a)"
    );
}
