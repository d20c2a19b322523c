//! `sandbox-helper`: placeholder until the sandbox lands.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    eprintln!("sandbox-helper: not built yet");
    std::process::ExitCode::from(7)
}
