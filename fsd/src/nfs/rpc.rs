//! ONC RPC over TCP (RFC 5531): record marking, the call header and its credentials,
//! the reply header. The message types are `nfs3_types`'s; the credentials are read by
//! hand because its `auth_unix` reserves room for as many group ids as a hostile length
//! field names before reading them.

use std::io::{self, Read, Write};

use nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_flavor, auth_stat, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg,
};
use nfs3_types::xdr_codec::{Pack, Unpack};

/// Largest record taken: a WRITE of [`super::MAX_IO`] and its header. A larger one ends
/// the connection.
pub const MAX_RECORD: usize = super::MAX_IO as usize + 64 * 1024;

/// The next record of `r` (its fragments joined); `None` at the end of the stream.
pub fn read_record(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    loop {
        let mut head = [0u8; 4];
        match r.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && out.is_empty() => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let head = u32::from_be_bytes(head);
        let len = (head & 0x7fff_ffff) as usize;
        if out.len() + len > MAX_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a record over {MAX_RECORD} bytes"),
            ));
        }
        let start = out.len();
        out.resize(start + len, 0);
        r.read_exact(&mut out[start..])?;
        if head & 0x8000_0000 != 0 {
            return Ok(Some(out));
        }
    }
}

/// Writes `body` as one record.
pub fn write_record(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| *l <= 0x7fff_ffff)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "reply too large"))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(len | 0x8000_0000).to_be_bytes());
    out.extend_from_slice(body);
    w.write_all(&out)
}

/// Who a call says it comes from (`AUTH_UNIX`), else nobody.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Its other groups (at most 16).
    pub groups: Vec<u32>,
}

const NOBODY: u32 = 65534;

/// A parsed call: its header, and where its arguments start in the record.
pub struct Call {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc: u32,
    pub caller: Caller,
    pub args_at: usize,
}

/// Why a record is not a call this server answers with results.
pub enum Refused {
    /// Not even an RPC call: the connection is closed.
    Garbage,
    /// A call with an RPC version other than 2, or credentials that do not parse.
    Denied { xid: u32, why: rejected_reply },
}

/// Reads the call header of `record`.
pub fn parse_call(record: &[u8]) -> Result<Call, Refused> {
    let mut cur = io::Cursor::new(record);
    let (msg, _) = rpc_msg::unpack(&mut cur).map_err(|_| Refused::Garbage)?;
    let msg_body::CALL(call) = msg.body else {
        return Err(Refused::Garbage);
    };
    let xid = msg.xid;
    if call.rpcvers != 2 {
        return Err(Refused::Denied {
            xid,
            why: rejected_reply::rpc_mismatch(2, 2),
        });
    }
    let caller = match call.cred.flavor {
        auth_flavor::AUTH_UNIX => auth_unix(&call.cred.body).ok_or(Refused::Denied {
            xid,
            why: rejected_reply::auth_error(auth_stat::AUTH_BADCRED),
        })?,
        _ => Caller {
            uid: NOBODY,
            gid: NOBODY,
            groups: Vec::new(),
        },
    };
    Ok(Call {
        xid,
        prog: call.prog,
        vers: call.vers,
        proc: call.proc,
        caller,
        args_at: cur.position() as usize,
    })
}

/// The uid and gid of an `AUTH_UNIX` body (RFC 5531 appendix A): stamp, machine name of
/// at most 255 bytes, uid, gid, at most 16 group ids.
fn auth_unix(body: &[u8]) -> Option<Caller> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?))
    };
    let name_len = word(4)? as usize;
    if name_len > 255 {
        return None;
    }
    let at = 8 + name_len.div_ceil(4) * 4;
    let uid = word(at)?;
    let gid = word(at + 4)?;
    let groups = word(at + 8)? as usize;
    if groups > 16 || body.len() < at + 12 + 4 * groups {
        return None;
    }
    let groups = (0..groups)
        .map(|i| word(at + 12 + 4 * i))
        .collect::<Option<_>>()?;
    Some(Caller { uid, gid, groups })
}

/// The header of a reply to `xid`: accepted with `data`, or denied.
pub fn reply_header(xid: u32, accepted: Result<accept_stat_data, rejected_reply>) -> Vec<u8> {
    let body = match accepted {
        Ok(data) => reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: data,
        }),
        Err(why) => reply_body::MSG_DENIED(why),
    };
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(body),
    };
    let mut out = Vec::with_capacity(msg.packed_size() + 128);
    // Packing into a Vec fails only for objects over 4 GiB.
    let _ = msg.pack(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_with_too_many_groups_or_a_long_name_are_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&3u32.to_be_bytes());
        b.extend_from_slice(b"abc\0");
        b.extend_from_slice(&1000u32.to_be_bytes());
        b.extend_from_slice(&100u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&5u32.to_be_bytes());
        let c = auth_unix(&b).expect("a valid credential");
        assert_eq!((c.uid, c.gid, c.groups), (1000, 100, vec![5]));
        let mut many = b.clone();
        many[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(auth_unix(&many).is_none());
        let mut long = b.clone();
        long[4..8].copy_from_slice(&4096u32.to_be_bytes());
        assert!(auth_unix(&long).is_none());
        assert!(auth_unix(&b[..20]).is_none());
    }

    #[test]
    fn records_join_fragments_and_refuse_oversized_ones() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&2u32.to_be_bytes());
        wire.extend_from_slice(b"ab");
        wire.extend_from_slice(&(1u32 | 0x8000_0000).to_be_bytes());
        wire.extend_from_slice(b"c");
        let mut r = io::Cursor::new(wire);
        assert_eq!(read_record(&mut r).unwrap().unwrap(), b"abc");
        assert!(read_record(&mut r).unwrap().is_none());
        let huge = (0x7fff_ffffu32 | 0x8000_0000).to_be_bytes();
        assert!(read_record(&mut io::Cursor::new(huge)).is_err());
    }
}
