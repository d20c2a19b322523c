//! One message per `SOCK_SEQPACKET` packet, with descriptors (`SCM_RIGHTS`): the
//! keeper's socket and the setup socket of a sandbox's init.

use std::io::IoSliceMut;
use std::os::fd::{OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// Receives one message of at most [`crate::exec::MAX_EXEC_REQUEST_BYTES`] + 64 bytes and up to
/// `max_fds` descriptors. An empty message is the peer's end.
pub fn recv_msg(sock: RawFd, max_fds: usize) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    // The packet's length first (`MSG_PEEK | MSG_TRUNC` gives it whole, consuming
    // nothing, descriptors included), so each message gets a buffer of its own size: no
    // request-sized allocation for the small answers and signals that make most traffic.
    let len = loop {
        match nix::sys::socket::recv(sock, &mut [], MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    if len == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if len > crate::exec::MAX_EXEC_REQUEST_BYTES + 64 {
        // Consumed and refused (its descriptors are closed with it).
        let _ = nix::sys::socket::recv(sock, &mut [], MsgFlags::empty());
        return Err(std::io::Error::other("message too long"));
    }
    let mut buf = vec![0u8; len];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = loop {
        match recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                fds.push(crate::sys::adopt_received_fd(fd));
            }
        }
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) || msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(std::io::Error::other("message too long"));
    }
    let n = msg.bytes;
    if fds.len() > max_fds {
        return Err(std::io::Error::other("too many descriptors"));
    }
    buf.truncate(n);
    Ok((buf, fds))
}

/// Sends one message with descriptors.
pub fn send_msg(sock: RawFd, msg: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let iov = [std::io::IoSlice::new(msg)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => return other.map(drop).map_err(Into::into),
        }
    }
}
