//! `mountctl exec WS [-i] [-t] [--env K=V]... [--workdir DIR] -- CMD...`: runs CMD in the
//! workspace's running sandbox and exits with its status.
//!
//! The command is started by the sandbox's own init (see `sandbox_api::serve`), with
//! this process's stdout and stderr (and stdin with `-i`) passed to it as descriptors.
//! A terminal is never passed: without `-t` a terminal on any of them is replaced by a
//! pipe this process copies; with `-t` the command gets a pseudo-terminal of the
//! sandbox and this process copies between it and the terminal (raw mode, window size
//! on `SIGWINCH`). SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded
//! to the command; if this process dies, the command is killed.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use sandbox_api::exec::ExecRequest;
use sandbox_api::keeper::{Client, Started};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH};
use signal_hook::iterator::Signals;

use crate::cli::ExecArgs;
use crate::output::Ctx;

/// How long output still buffered in a relay pipe is copied after the command ended
/// (a background process that inherited the pipe may keep it open for ever).
const RELAY_DRAIN_MS: u64 = 200;

pub fn run(ctx: &Ctx, a: ExecArgs) -> anyhow::Result<ExitCode> {
    let mut env = Vec::new();
    for e in &a.env {
        let (k, v) = e.split_once('=').ok_or_else(|| {
            cowspace::error::Error::Invalid(format!("--env {e:?}: expected KEY=VALUE"))
        })?;
        if k.is_empty() {
            return Err(cowspace::error::Error::Invalid(format!("--env {e:?}: empty key")).into());
        }
        env.push((k.to_string(), v.to_string()));
    }
    let workdir = a.workdir.as_ref().map(|d| {
        if d.starts_with('/') {
            d.clone()
        } else {
            format!("/workspace/{d}")
        }
    });
    let tty = if a.tty {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err(cowspace::error::Error::Invalid(
                "-t needs a terminal on stdin (leave -t out to pass pipes)".into(),
            )
            .into());
        }
        Some(sandbox_api::keeper::terminal_size(stdin.as_fd()).unwrap_or((24, 80)))
    } else {
        None
    };
    // The keeper's socket is named by the sandbox's name (the workspace's name, else its
    // id): tried first, so an exec opens no database; any other spelling of the
    // workspace goes through the registry.
    let state = cowspace_store::layout::Layout::new(&ctx.root).sandbox_state();
    let client = match Client::connect(&state, &a.workspace) {
        Ok(c) => c,
        Err(_) => ctx.runtime()?.sandbox_client(&a.workspace)?,
    };
    let req = ExecRequest {
        argv: a.command.clone(),
        env,
        workdir,
        tty,
    };
    let code = if tty.is_some() {
        exec_tty(&client, &req)?
    } else {
        exec_plain(&client, &req, a.interactive)?
    };
    Ok(ExitCode::from(code))
}

/// Forwards the usual signals to the command until the returned handle is closed.
fn forward_signals(
    client: &Client,
    extra: &[i32],
) -> anyhow::Result<signal_hook::iterator::Handle> {
    let mut sigs = vec![SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];
    sigs.extend_from_slice(extra);
    let mut signals = Signals::new(&sigs).context("install signal handlers")?;
    let handle = signals.handle();
    let conn: OwnedFd = client.as_fd().try_clone_to_owned()?;
    std::thread::spawn(move || {
        for sig in signals.forever() {
            let msg = serde_json::json!({ "signal": sig }).to_string();
            let _ = nix::sys::socket::send(
                std::os::fd::AsRawFd::as_raw_fd(&conn),
                msg.as_bytes(),
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            );
        }
    });
    Ok(handle)
}

/// One output stream of the command: passed as it is, or (a terminal) through a pipe
/// this process copies to it.
enum Out {
    Direct(OwnedFd),
    Relayed(OwnedFd, std::thread::JoinHandle<()>),
}

fn output(fd: BorrowedFd<'_>, is_tty: bool) -> anyhow::Result<Out> {
    if !is_tty {
        return Ok(Out::Direct(fd.try_clone_to_owned()?));
    }
    let (mut r, w) = std::io::pipe()?;
    let mut dst = std::fs::File::from(fd.try_clone_to_owned()?);
    let t = std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 || dst.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    Ok(Out::Relayed(w.into(), t))
}

fn exec_plain(client: &Client, req: &ExecRequest, interactive: bool) -> anyhow::Result<u8> {
    let stdin: OwnedFd = if interactive {
        let i = std::io::stdin();
        if i.is_terminal() {
            let (r, mut w) = std::io::pipe()?;
            std::thread::spawn(move || {
                let mut src = std::io::stdin();
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = src.read(&mut buf) {
                    if n == 0 || w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            r.into()
        } else {
            i.as_fd().try_clone_to_owned()?
        }
    } else {
        std::fs::File::open("/dev/null")?.into()
    };
    let out = output(std::io::stdout().as_fd(), std::io::stdout().is_terminal())?;
    let err = output(std::io::stderr().as_fd(), std::io::stderr().is_terminal())?;
    let fd_of = |o: &Out| match o {
        Out::Direct(f) | Out::Relayed(f, _) => f.try_clone(),
    };
    let (o, e) = (fd_of(&out)?, fd_of(&err)?);
    let started = client.exec(req, Some([stdin.as_fd(), o.as_fd(), e.as_fd()]))?;
    drop((stdin, o, e));
    // Our copies of the pipes' write ends go, so a relay ends when the command's do.
    let relays: Vec<std::thread::JoinHandle<()>> = [out, err]
        .into_iter()
        .filter_map(|o| match o {
            Out::Relayed(w, t) => {
                drop(w);
                Some(t)
            }
            Out::Direct(_) => None,
        })
        .collect();
    let code = match started {
        Started::Running { .. } => {
            let handle = forward_signals(client, &[])?;
            let code = client.wait()?;
            handle.close();
            code
        }
        Started::Refused { message, exit, .. } => {
            eprintln!("mountctl: {message}");
            exit
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_millis(RELAY_DRAIN_MS);
    for t in relays {
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let _ = std::io::stdout().flush();
    Ok(code)
}

/// Puts the terminal back as it was on drop.
struct RawMode(nix::sys::termios::Termios);

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.0,
        );
    }
}

fn exec_tty(client: &Client, req: &ExecRequest) -> anyhow::Result<u8> {
    let master = match client.exec(req, None)? {
        Started::Running {
            master: Some(m), ..
        } => m,
        Started::Running { master: None, .. } => {
            anyhow::bail!("the sandbox gave no pseudo-terminal")
        }
        Started::Refused { message, exit, .. } => {
            eprintln!("mountctl: {message}");
            return Ok(exit);
        }
    };
    let saved = nix::sys::termios::tcgetattr(std::io::stdin())?;
    let mut raw = saved.clone();
    nix::sys::termios::cfmakeraw(&mut raw);
    nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, &raw)?;
    let _restore = RawMode(saved);
    let mut to_master = std::fs::File::from(master.try_clone()?);
    std::thread::spawn(move || {
        let mut src = std::io::stdin();
        let mut buf = [0u8; 4096];
        while let Ok(n) = src.read(&mut buf) {
            if n == 0 || to_master.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut from_master = std::fs::File::from(master.try_clone()?);
    let copier = std::thread::spawn(move || {
        let mut out = std::io::stdout();
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from_master.read(&mut buf) {
            if n == 0 || out.write_all(&buf[..n]).is_err() {
                break;
            }
            let _ = out.flush();
        }
    });
    // SIGWINCH resizes the pseudo-terminal; the other signals reach the command.
    let mut winch = Signals::new([SIGWINCH]).context("install the SIGWINCH handler")?;
    let winch_handle = winch.handle();
    let m2 = master.try_clone()?;
    std::thread::spawn(move || {
        for _ in winch.forever() {
            if let Ok((r, c)) = sandbox_api::keeper::terminal_size(std::io::stdin().as_fd()) {
                let _ = sandbox_api::keeper::set_terminal_size(m2.as_fd(), r, c);
            }
        }
    });
    let handle = forward_signals(client, &[])?;
    let code = client.wait()?;
    handle.close();
    winch_handle.close();
    let deadline = std::time::Instant::now() + Duration::from_millis(RELAY_DRAIN_MS);
    while !copier.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(code)
}
