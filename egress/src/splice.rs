//! Moving bytes from socket to socket through a kernel pipe with `splice(2)`, so they are
//! never copied into this process.
//!
//! A [`KernelPipe`] carries one direction: [`KernelPipe::fill`] splices from the source
//! socket into the pipe (only when the pipe is empty, and at most a given number of bytes,
//! so a body copy never reads past its end), [`KernelPipe::drain`] splices the pipe into
//! the destination until it is empty or the destination would block. Both are
//! non-blocking: the callers own the `poll(2)` loop and its idle timeout (the tunnel's
//! relay, [`copy_exact`] for HTTP bodies). A pipe costs two descriptors and, while bytes
//! are in flight, its pages; it is made only for a direction that carries bulk (past
//! [`SPLICE_AFTER_BYTES`]), and when it cannot be made (out of descriptors, a kernel
//! without `splice`) the callers copy through a user-space buffer instead.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use rustix::pipe::{PipeFlags, SpliceFlags, fcntl_setpipe_size, pipe_with, splice};

use crate::tunnel::IDLE_TIMEOUT;

/// A direction moves through a kernel pipe once it has carried this many bytes (a tunnel),
/// or when this many are still to come (an HTTP body): below it, a pipe's two descriptors
/// and its syscalls cost more than the copy they save.
pub const SPLICE_AFTER_BYTES: u64 = 64 * 1024;
/// Capacity asked of each pipe (the kernel's default is 64 KiB; more means fewer splices
/// per byte). Best effort: past `/proc/sys/fs/pipe-user-pages-soft` an unprivileged
/// process keeps the smaller pipe it got.
pub const PIPE_BYTES: usize = 256 * 1024;

/// One direction's pipe and the bytes in it.
#[derive(Debug)]
pub(crate) struct KernelPipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes spliced in and not yet out.
    pending: usize,
    /// Most bytes asked of one splice into the pipe.
    capacity: usize,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

fn interrupted(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted
}

const FLAGS: SpliceFlags = SpliceFlags::MOVE.union(SpliceFlags::NONBLOCK);

impl KernelPipe {
    /// A new empty pipe, non-blocking and close-on-exec.
    pub fn new() -> io::Result<KernelPipe> {
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let capacity = fcntl_setpipe_size(&write, PIPE_BYTES)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))
            .unwrap_or(rustix::pipe::PIPE_BUF)
            .max(rustix::pipe::PIPE_BUF);
        Ok(KernelPipe {
            read,
            write,
            pending: 0,
            capacity,
        })
    }

    /// Whether every byte spliced in has been spliced out.
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Splices up to `max` bytes (and at most the pipe's capacity) from `from` into the
    /// empty pipe: `Ok(Some(0))` at the end of `from`, `Ok(None)` when it has nothing now.
    pub fn fill(&mut self, from: impl AsFd, max: u64) -> io::Result<Option<usize>> {
        assert!(self.is_empty(), "fill of a pipe still holding bytes");
        let len = usize::try_from(max)
            .unwrap_or(usize::MAX)
            .min(self.capacity);
        if len == 0 {
            return Ok(Some(0));
        }
        loop {
            match splice(&from, None, &self.write, None, len, FLAGS) {
                Ok(n) => {
                    assert!(n <= len, "splice moved more than asked");
                    self.pending = n;
                    return Ok(Some(n));
                }
                Err(e) => {
                    let e = io::Error::from(e);
                    if would_block(&e) {
                        return Ok(None);
                    }
                    if !interrupted(&e) {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Splices the pipe's bytes into `to` until the pipe is empty or `to` would block.
    pub fn drain(&mut self, to: impl AsFd) -> io::Result<()> {
        while self.pending > 0 {
            match splice(&self.read, None, &to, None, self.pending, FLAGS) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    assert!(n <= self.pending, "splice moved more than the pipe held");
                    self.pending -= n;
                }
                Err(e) => {
                    let e = io::Error::from(e);
                    if would_block(&e) {
                        return Ok(());
                    }
                    if !interrupted(&e) {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Copies exactly `n` bytes from `from` to `to` through `pipe` (or, with `n` `None`, up to
/// `from`'s end), counting them with `count` as they are read. Both sockets are made
/// non-blocking for the copy and blocking again after it, whatever its outcome. Fails with
/// `UnexpectedEof` when `from` ends early, `TimedOut` after [`IDLE_TIMEOUT`] without
/// progress either way.
pub(crate) fn copy_exact(
    pipe: &mut KernelPipe,
    from: &TcpStream,
    to: &TcpStream,
    n: Option<u64>,
    count: &dyn Fn(usize),
) -> io::Result<()> {
    from.set_nonblocking(true)?;
    let result = to
        .set_nonblocking(true)
        .and_then(|()| copy_nonblocking(pipe, from, to, n, count));
    let restored = from
        .set_nonblocking(false)
        .and_then(|()| to.set_nonblocking(false));
    result.and(restored)
}

fn copy_nonblocking(
    pipe: &mut KernelPipe,
    from: &TcpStream,
    to: &TcpStream,
    n: Option<u64>,
    count: &dyn Fn(usize),
) -> io::Result<()> {
    let timeout = PollTimeout::try_from(IDLE_TIMEOUT).unwrap_or(PollTimeout::MAX);
    let mut left = n.unwrap_or(u64::MAX);
    loop {
        if pipe.is_empty() {
            if left == 0 {
                return Ok(());
            }
            match pipe.fill(from, left)? {
                Some(0) if n.is_none() => return Ok(()),
                Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Some(k) => {
                    count(k);
                    left -= k as u64;
                }
                None => {}
            }
        }
        pipe.drain(to)?;
        if pipe.is_empty() && left == 0 {
            return Ok(());
        }
        let mut fds = if pipe.is_empty() {
            [PollFd::new(from.as_fd(), PollFlags::POLLIN)]
        } else {
            [PollFd::new(to.as_fd(), PollFlags::POLLOUT)]
        };
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(io::ErrorKind::TimedOut.into()),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    #[test]
    fn copies_exactly_n_and_leaves_the_rest_unread() {
        let (mut src_w, src_r) = pair();
        let (dst_w, mut dst_r) = pair();
        let body = pattern(3 * PIPE_BYTES + 12_345);
        let next = b"GET /next HTTP/1.1\r\n\r\n";
        let writer = std::thread::spawn(move || {
            src_w.write_all(&body).unwrap();
            src_w.write_all(next).unwrap();
            src_w
        });
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 3 * PIPE_BYTES + 12_345];
            dst_r.read_exact(&mut got).unwrap();
            got
        });
        let counted = Cell::new(0);
        let mut pipe = KernelPipe::new().unwrap();
        let n = (3 * PIPE_BYTES + 12_345) as u64;
        copy_exact(&mut pipe, &src_r, &dst_w, Some(n), &|k| {
            counted.set(counted.get() + k)
        })
        .unwrap();
        assert_eq!(counted.get() as u64, n);
        assert_eq!(reader.join().unwrap(), pattern(n as usize));
        let _src_w = writer.join().unwrap();
        // The next message is still in the source, byte for byte, and the socket blocks.
        let mut rest = vec![0u8; next.len()];
        (&src_r).read_exact(&mut rest).unwrap();
        assert_eq!(rest, next);
        assert!(pipe.is_empty());
    }

    #[test]
    fn early_end_fails_and_sockets_are_blocking_again() {
        let (mut src_w, src_r) = pair();
        let (dst_w, _dst_r) = pair();
        src_w.write_all(&pattern(1000)).unwrap();
        src_w.shutdown(Shutdown::Write).unwrap();
        let mut pipe = KernelPipe::new().unwrap();
        let err = copy_exact(&mut pipe, &src_r, &dst_w, Some(5000), &|_| {}).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // Blocking again: a read with a timeout waits instead of failing at once.
        dst_w
            .set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
        let started = std::time::Instant::now();
        assert!((&dst_w).read(&mut [0u8; 1]).is_err());
        assert!(started.elapsed() >= std::time::Duration::from_millis(40));
    }

    #[test]
    fn to_end_copies_everything() {
        let (mut src_w, src_r) = pair();
        let (dst_w, mut dst_r) = pair();
        let body = pattern(PIPE_BYTES + 99);
        let sent = body.clone();
        let writer = std::thread::spawn(move || {
            src_w.write_all(&sent).unwrap();
        });
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            dst_r.read_to_end(&mut got).unwrap();
            got
        });
        let mut pipe = KernelPipe::new().unwrap();
        let counted = Cell::new(0);
        copy_exact(&mut pipe, &src_r, &dst_w, None, &|k| {
            counted.set(counted.get() + k)
        })
        .unwrap();
        writer.join().unwrap();
        drop(dst_w);
        assert_eq!(counted.get(), body.len());
        assert_eq!(reader.join().unwrap(), body);
    }
}
