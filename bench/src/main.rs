//! `bench`: placeholder until the harness lands.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    eprintln!("bench: not built yet");
    std::process::ExitCode::from(7)
}
