//! `fsd`: the cowspace FUSE daemon. Workspaces and the snapshot view are not served yet;
//! this binary exists so the layout is in place and refuses clearly until they are.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    eprintln!("fsd: the daemon does not serve workspaces yet (see docs/ARCHITECTURE.md)");
    std::process::ExitCode::from(7)
}
