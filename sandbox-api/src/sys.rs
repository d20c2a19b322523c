//! This crate's only `unsafe`: safe wrappers, each block with its `SAFETY` reason.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of a descriptor just received in an `SCM_RIGHTS` message.
pub fn adopt_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in this process when the message was received;
    // nothing else knows or owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Safe wrapper for `ioctl(fd, TIOCSWINSZ)`: sets a terminal's window size.
pub fn set_window_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which points at `ws`.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCSWINSZ,
            &ws as *const libc::winsize,
        )
    };
    check(ret as libc::c_long).map(drop)
}

/// Safe wrapper for `ioctl(fd, TIOCGWINSZ)`: a terminal's window size (rows, columns).
pub fn window_size(fd: BorrowedFd<'_>) -> io::Result<(u16, u16)> {
    // SAFETY: an all-zero `winsize` is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one `struct winsize` to the pointer, which points at `ws`.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCGWINSZ,
            &mut ws as *mut libc::winsize,
        )
    };
    check(ret as libc::c_long)?;
    Ok((ws.ws_row, ws.ws_col))
}
