//! A [`Stream`] in memory, for tests: the two ends of a pair of byte pipes, each call moving
//! at most `max_io` bytes (the short reads and writes a real socket makes at any byte
//! boundary), each direction holding at most `capacity` bytes (a full send buffer). It lets
//! the data path be driven, both ends in one thread, with no socket and no clock.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::stream::Stream;
use crate::engine::user_memory::{IoPart, Pinned, UserMemory};

#[derive(Default)]
struct Pipe {
    bytes: VecDeque<u8>,
    /// The writer shut its direction down.
    fin: bool,
}

/// One end of an in-memory stream.
pub struct MemStream {
    rx: Arc<Mutex<Pipe>>,
    tx: Arc<Mutex<Pipe>>,
    max_io: usize,
    capacity: usize,
    /// What [`Stream::readiness`] reports: none (-1), unless a test gives a descriptor for the
    /// progress thread's epoll to hold (it never fires: the test drives both ends).
    readiness: RawFd,
    /// What [`Stream::mss`] reports (1460 unless a test changes it: [`MemStream::mss_knob`]).
    mss: Arc<AtomicUsize>,
    /// Where [`Stream::wake_after`] is recorded, if a test asked ([`MemStream::record_wake_marks`]).
    marks: Option<Arc<Mutex<Vec<usize>>>>,
}

/// Two connected ends.
pub fn pair(max_io: usize, capacity: usize) -> (MemStream, MemStream) {
    let (a, b) = (Arc::new(Mutex::new(Pipe::default())), Arc::new(Mutex::new(Pipe::default())));
    let end = |rx, tx| MemStream { rx, tx, max_io, capacity, readiness: -1, mss: Arc::new(AtomicUsize::new(1460)), marks: None };
    (end(a.clone(), b.clone()), end(b, a))
}

/// A test's hand on the bytes one end sent and the other has not received yet: the wire,
/// for corrupting a byte in flight or reading what was sent.
pub struct Tap(Arc<Mutex<Pipe>>);

impl Tap {
    /// The bytes in flight.
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().bytes.iter().copied().collect()
    }

    /// Flips the bits of `mask` in the `at`-th byte in flight; false if fewer are in flight.
    pub fn flip(&self, at: usize, mask: u8) -> bool {
        match self.0.lock().unwrap().bytes.get_mut(at) {
            Some(b) => {
                *b ^= mask;
                true
            }
            None => false,
        }
    }
}

impl MemStream {
    /// From now on [`Stream::wake_after`] is taken (as a kernel socket takes `SO_RCVLOWAT`)
    /// and each mark asked for is recorded in the list returned.
    pub fn record_wake_marks(&mut self) -> Arc<Mutex<Vec<usize>>> {
        let m = Arc::new(Mutex::new(Vec::new()));
        self.marks = Some(m.clone());
        m
    }

    /// This end, reporting `fd` as its readiness: a QP can then watch it (`Net::watch`), as
    /// it watches a socket, where the test hands the stream to the QP's own code.
    pub fn with_readiness(mut self, fd: RawFd) -> MemStream {
        self.readiness = fd;
        self
    }

    /// A test's hand on the MSS this end reports from now on (a kernel connection's grows as
    /// the peer's window opens).
    pub fn mss_knob(&self) -> Arc<AtomicUsize> {
        self.mss.clone()
    }

    /// The bytes this end sends, as they wait for the other end.
    pub fn tap(&self) -> Tap {
        Tap(self.tx.clone())
    }

    /// Bytes this end sent that the other end has not received yet.
    pub fn unread_by_peer(&self) -> usize {
        self.tx.lock().unwrap().bytes.len()
    }

    fn room(&self) -> usize {
        let p = self.tx.lock().unwrap();
        self.capacity.saturating_sub(p.bytes.len()).min(self.max_io)
    }

    fn push(&self, b: &[u8]) {
        self.tx.lock().unwrap().bytes.extend(b);
    }

    /// Up to `n` received bytes (`None`: nothing now, the peer still open).
    fn take(&self, n: usize) -> Option<Vec<u8>> {
        let mut p = self.rx.lock().unwrap();
        let k = n.min(self.max_io).min(p.bytes.len());
        if k == 0 && !p.fin && n > 0 {
            return None;
        }
        Some(p.bytes.drain(..k).collect())
    }
}

fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

impl Stream for MemStream {
    fn send(&mut self, mem: &dyn UserMemory, parts: &[IoPart<'_>]) -> io::Result<usize> {
        let total: usize = parts.iter().map(IoPart::len).sum();
        let mut room = self.room().min(total);
        if room == 0 && total > 0 {
            return Err(would_block());
        }
        let mut sent = 0;
        for p in parts {
            if room == 0 {
                break;
            }
            let k = p.len().min(room);
            match p {
                IoPart::Bytes(b) => self.push(&b[..k]),
                IoPart::User(pin) => {
                    let mut buf = vec![0u8; k];
                    mem.read(pin, &mut buf);
                    self.push(&buf);
                }
            }
            room -= k;
            sent += k;
        }
        Ok(sent)
    }

    fn recv_placed(&mut self, mem: &dyn UserMemory, dst: &Pinned, tail: &mut [u8]) -> io::Result<usize> {
        let got = self.take(dst.len() + tail.len()).ok_or_else(would_block)?;
        let k = got.len().min(dst.len());
        mem.write(dst, &got[..k]);
        tail[..got.len() - k].copy_from_slice(&got[k..]);
        Ok(got.len())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let got = self.take(buf.len()).ok_or_else(would_block)?;
        buf[..got.len()].copy_from_slice(&got);
        Ok(got.len())
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.room().min(buf.len());
        if k == 0 && !buf.is_empty() {
            return Err(would_block());
        }
        self.push(&buf[..k]);
        Ok(k)
    }

    fn shutdown_write(&mut self) {
        self.tx.lock().unwrap().fin = true;
    }

    fn close_with(&mut self, bytes: &[u8], _timeout: Duration) {
        self.push(bytes);
        self.shutdown_write();
    }

    fn mss(&self) -> usize {
        self.mss.load(Ordering::Relaxed)
    }

    fn wake_after(&mut self, bytes: usize) -> bool {
        match &self.marks {
            Some(m) => {
                m.lock().unwrap().push(bytes);
                true
            }
            None => false,
        }
    }

    fn peer(&self) -> Option<SocketAddr> {
        Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1)))
    }

    fn local(&self) -> Option<SocketAddr> {
        Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2)))
    }

    /// No progress thread serves it: the test drives both ends.
    fn readiness(&self) -> RawFd {
        self.readiness
    }
}
