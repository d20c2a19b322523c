//! Links the `mountctl` program as a position-dependent executable on Linux.
//!
//! A position-independent one (rustc's default) makes the dynamic loader apply every
//! relative relocation of this large program at each start, before `main`: tens of
//! thousands of them, most of a millisecond and a page fault per page they touch, on
//! every `mountctl create` an agent runtime makes. Linked `-no-pie` the linker resolves
//! them once (the code is still compiled position-independent, which links either way).
//! Only this binary: the daemon and the privileged helper keep full address-space
//! randomisation. Measured in docs/BENCHMARKS.md, "The CLI and the socket".

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=mountctl=-no-pie");
    }
}
