//! TCP connections carried as streams of the agent's channel ([`super::proto`]): both
//! ends of a VM's egress use it, the guest agent (which accepts the connections on the
//! guest's 127.0.0.1) and the keeper (which connects each one to the host-side egress
//! proxy). Standard library only: the guest agent compiles this same file.
//!
//! Each stream has two threads at each end: a reader (socket → `NET_DATA` frames, within
//! the credit the other end gave; `NET_EOF` at the socket's end) and a writer (frames →
//! socket, giving the credit back with `WINDOW` as the bytes are written; `NET_EOF`
//! becomes a half-close). A stream is forgotten once both directions ended, or at once
//! on `NET_CLOSE`. The other end is not trusted: bytes beyond the credit it was given
//! end the stream, so no end queues more than [`NET_WINDOW_BYTES`] per stream, and no
//! end holds more than [`MAX_NET_STREAMS`] streams.
//!
//! No frame is sent while the stream table is locked: a send may wait for the channel,
//! whose other end may be waiting for this table.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};

use super::proto::{Frame, MAX_DATA_BYTES, kind};

/// Credit, in bytes, each direction of a network stream starts with.
pub const NET_WINDOW_BYTES: u64 = 128 * 1024;
/// Most network streams open at once at either end.
pub const MAX_NET_STREAMS: usize = 1024;

/// Sends one frame on the channel; `false` once the channel is gone.
pub type SendFrame = Box<dyn Fn(&Frame) -> bool + Send + Sync>;

enum Msg {
    Data(Vec<u8>),
    Eof,
}

/// What this end may still send, and whether the stream is gone.
#[derive(Default)]
struct Credit {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

struct Entry {
    tx: Sender<Msg>,
    /// The writer's end of `tx`, until the socket is attached.
    rx: Option<Receiver<Msg>>,
    /// Bytes the other end may still send before this end gives credit back.
    budget: u64,
    credit: Arc<Credit>,
    /// A handle of the socket, to cut it on `NET_CLOSE`.
    sock: Option<TcpStream>,
    /// This end sent `NET_EOF` / the other end's `NET_EOF` was written.
    eof_sent: bool,
    eof_got: bool,
}

/// The network streams of one channel.
pub struct Relay {
    send: SendFrame,
    streams: Mutex<HashMap<u32, Entry>>,
}

impl Relay {
    /// A relay sending its frames with `send`.
    pub fn new(send: SendFrame) -> Arc<Relay> {
        Arc::new(Relay {
            send,
            streams: Mutex::new(HashMap::new()),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Entry>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Streams open now.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether no stream is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes stream `id`, its socket to come ([`Relay::attach`]); frames for it are
    /// queued (within the credit) until then. `false`: the table is full or `id` is
    /// taken.
    pub fn open(&self, id: u32) -> bool {
        let mut t = self.table();
        if t.len() >= MAX_NET_STREAMS || t.contains_key(&id) {
            return false;
        }
        let (tx, rx) = channel();
        let credit = Arc::new(Credit::default());
        credit.state.lock().unwrap_or_else(|e| e.into_inner()).0 = NET_WINDOW_BYTES;
        t.insert(
            id,
            Entry {
                tx,
                rx: Some(rx),
                budget: NET_WINDOW_BYTES,
                credit,
                sock: None,
                eof_sent: false,
                eof_got: false,
            },
        );
        true
    }

    /// Gives stream `id` its socket and starts relaying it. A stream closed meanwhile
    /// drops the socket (the connection closes).
    pub fn attach(self: &Arc<Self>, id: u32, sock: TcpStream) {
        let (rx, credit, handles) = {
            let mut t = self.table();
            let Some(e) = t.get_mut(&id) else {
                return;
            };
            let (Ok(r), Ok(w), Ok(c)) = (sock.try_clone(), sock.try_clone(), sock.try_clone())
            else {
                drop(t);
                self.close(id, true);
                return;
            };
            e.sock = Some(c);
            let Some(rx) = e.rx.take() else {
                return;
            };
            (rx, e.credit.clone(), (r, w))
        };
        let (r, w) = handles;
        let relay = self.clone();
        let spawned = std::thread::Builder::new()
            .name("net-writer".into())
            .stack_size(64 * 1024)
            .spawn(move || relay.write_loop(id, w, rx));
        let relay = self.clone();
        let spawned = spawned.and_then(|_| {
            std::thread::Builder::new()
                .name("net-reader".into())
                .stack_size(64 * 1024)
                .spawn(move || relay.read_loop(id, r, &credit))
        });
        if spawned.is_err() {
            self.close(id, true);
        }
    }

    /// Ends stream `id` at this end: its socket is cut, and with `tell` the other end is
    /// sent `NET_CLOSE`.
    pub fn close(&self, id: u32, tell: bool) {
        let gone = self.table().remove(&id);
        if let Some(e) = gone {
            end(&e);
            if tell {
                (self.send)(&Frame::new(id, kind::NET_CLOSE, Vec::new()));
            }
        }
    }

    /// Ends every stream (the channel is gone).
    pub fn close_all(&self) {
        let all: Vec<Entry> = self.table().drain().map(|(_, e)| e).collect();
        for e in &all {
            end(e);
        }
    }

    /// Takes a frame of a network stream (`NET_DATA`, `NET_EOF`, `NET_CLOSE`, `WINDOW`);
    /// `false` for any other kind. Frames of unknown streams are dropped: the stream
    /// ended at this end already.
    pub fn handle(&self, f: Frame) -> bool {
        match f.kind {
            kind::NET_DATA => {
                let mut t = self.table();
                let Some(e) = t.get_mut(&f.stream) else {
                    return true;
                };
                let n = f.payload.len() as u64;
                if n > e.budget || e.eof_got {
                    // Beyond the credit given, or data after the end: the other end
                    // broke the protocol, and the stream ends.
                    drop(t);
                    self.close(f.stream, true);
                    return true;
                }
                e.budget -= n;
                let _ = e.tx.send(Msg::Data(f.payload));
            }
            kind::NET_EOF => {
                if let Some(e) = self.table().get_mut(&f.stream) {
                    let _ = e.tx.send(Msg::Eof);
                }
            }
            kind::NET_CLOSE => self.close(f.stream, false),
            kind::WINDOW => {
                let t = self.table();
                if let (Some(e), Some(n)) = (t.get(&f.stream), f.as_i32()) {
                    let mut s = e.credit.state.lock().unwrap_or_else(|e| e.into_inner());
                    s.0 =
                        s.0.saturating_add(u64::from(n as u32))
                            .min(NET_WINDOW_BYTES);
                    e.credit.cv.notify_all();
                }
            }
            _ => return false,
        }
        true
    }

    /// Notes one direction's end; forgets the stream once both ended.
    fn ended(&self, id: u32, sent: bool) {
        let mut t = self.table();
        let Some(e) = t.get_mut(&id) else {
            return;
        };
        if sent {
            e.eof_sent = true;
        } else {
            e.eof_got = true;
        }
        if e.eof_sent && e.eof_got {
            t.remove(&id);
        }
    }

    fn read_loop(&self, id: u32, mut sock: TcpStream, credit: &Credit) {
        let mut buf = vec![0u8; MAX_DATA_BYTES];
        loop {
            let n = match sock.read(&mut buf) {
                Ok(0) => {
                    if self.table().contains_key(&id) {
                        (self.send)(&Frame::new(id, kind::NET_EOF, Vec::new()));
                        self.ended(id, true);
                    }
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(id, true);
                    return;
                }
            };
            {
                let mut s = credit.state.lock().unwrap_or_else(|e| e.into_inner());
                while s.0 < n as u64 && !s.1 {
                    s = credit.cv.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                if s.1 {
                    return;
                }
                s.0 -= n as u64;
            }
            if !(self.send)(&Frame::new(id, kind::NET_DATA, buf[..n].to_vec())) {
                self.close(id, false);
                return;
            }
        }
    }

    fn write_loop(&self, id: u32, mut sock: TcpStream, rx: Receiver<Msg>) {
        // Ends when the stream is forgotten (its sender goes with it).
        while let Ok(m) = rx.recv() {
            match m {
                Msg::Data(b) => {
                    if sock.write_all(&b).is_err() {
                        self.close(id, true);
                        return;
                    }
                    let known = match self.table().get_mut(&id) {
                        Some(e) => {
                            e.budget += b.len() as u64;
                            true
                        }
                        None => false,
                    };
                    if !known {
                        return;
                    }
                    (self.send)(&Frame::int(id, kind::WINDOW, b.len() as i32));
                }
                Msg::Eof => {
                    let _ = sock.shutdown(Shutdown::Write);
                    self.ended(id, false);
                }
            }
        }
    }
}

/// Cuts a forgotten stream's socket and wakes its reader.
fn end(e: &Entry) {
    if let Some(s) = &e.sock {
        let _ = s.shutdown(Shutdown::Both);
    }
    e.credit.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
    e.credit.cv.notify_all();
}
