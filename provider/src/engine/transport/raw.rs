//! uiw's userspace TCP (`uiw-utcp`) over raw frames (`uiw-rawnet`: AF_XDP or AF_PACKET on
//! one netdev) behind the [`Stream`] seam: what a `uiw up --transport xdp|packet` device's QPs
//! connect over. The same QP numbering, MPA and RTR connect as over the kernel's TCP; an
//! application cannot tell.
//!
//! The stack runs in this process, driven by the provider's own threads: the progress thread
//! waits on the transport's socket (the XSK or packet socket) and timer itself ([`RawTcp::fds`])
//! and turns the stack when frames arrive or a deadline comes ([`RawTcp::turn`]) — no thread of
//! the transport's own sits between an arriving frame and the QP it is for — and an
//! application thread that polls its CQ turns it too, reading the rings directly (a QP's
//! `recv` turns the stack first). Each stream and the listener have an eventfd that the
//! progress thread waits on like a socket (see `uiw_rawnet::nonblock`). Payload is
//! copied between application memory and the stack's buffers (`UserMemory::read`/`write`):
//! the stack owns its buffers, as AF_XDP copy mode and AF_PACKET copy every frame anyway.
//! Received payload is placed straight from the stack's receive buffer (once per byte);
//! payload to send goes through a staging buffer into the stack's send buffer.

use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use uiw_rawnet::nonblock::RawListener;
use uiw_rawnet::probe::Kind;
use uiw_rawnet::stream::{RawStream, Transport};

use super::stream::{Connector, Listener, Stream};
use crate::engine::user_memory::{IoPart, Pinned, UserMemory};

/// How long opening a stream may wait for the kernel to resolve the peer's MAC (ARP).
const ARP_TIMEOUT: Duration = Duration::from_secs(3);

/// How long received data may wait for its ACK to ride on a segment of ours (delayed ACK,
/// RFC 9293 §3.8.6.3; every second full-sized segment is acknowledged at once). An RDMA
/// exchange answers within microseconds — ib_write_lat's reply, a Read Response, the MPA
/// Reply — and a pure ACK ahead of the answer costs the receiver a transmission (a `sendto`
/// on its latency path) and the sender a wake-up for a frame that carries nothing: two
/// frames per message each way, where the kernel's TCP sends one. Far below the 200 ms RTO
/// floor, so an unanswered segment's ACK is not late enough to matter.
pub const ACK_DELAY: Duration = Duration::from_micros(500);

/// The userspace TCP's settings: the interface's MSS, and retransmissions that give up on a
/// silent peer after about `peer_timeout_ms` (`UIW_PEER_TIMEOUT`), as `TCP_USER_TIMEOUT` does
/// on the kernel's sockets — not after the several minutes of utcp's defaults. The RTO backs off
/// from its 200 ms floor up to a ceiling of a quarter of the timeout (at most 1 s, so that a
/// lost segment on a LAN is resent soon), and the connection fails once the backed-off
/// waits add up to the timeout (RFC 6298 §5.5, RFC 9293 §3.8.3's R2).
pub fn tcp_config(mss: usize, peer_timeout_ms: u64) -> uiw_utcp::Config {
    let d = uiw_utcp::Config::default();
    let floor = d.rto_min.as_millis() as u64;
    let ceiling = (peer_timeout_ms / 4).clamp(floor, 1000);
    let (mut waited, mut rto, mut retries) = (0u64, floor, 0u32);
    while waited < peer_timeout_ms {
        waited += rto;
        rto = (rto * 2).min(ceiling);
        retries += 1;
    }
    uiw_utcp::Config {
        mss: mss.min(usize::from(u16::MAX)) as u16,
        ack_delay: ACK_DELAY,
        rto_max: Duration::from_millis(ceiling),
        // utcp fails the connection when a timeout finds `max_retries` already spent.
        max_retries: retries.saturating_sub(1),
        ..d
    }
}

/// A raw-frame transport on one netdev.
pub struct RawTcp {
    transport: Transport,
    name: &'static str,
    /// The MSS the interface allows (MTU − 40), used until a handshake tells the peer's.
    mss: usize,
}

impl RawTcp {
    /// Opens `kind` on `netdev` for uiw's port range `ports` (needs CAP_NET_RAW and
    /// CAP_NET_ADMIN, and CAP_BPF for AF_XDP).
    pub fn open(netdev: &str, kind: Kind, ports: (u16, u16)) -> io::Result<RawTcp> {
        let iface = uiw_rawnet::Iface::lookup(netdev)?;
        let tcp = tcp_config(iface.mtu.saturating_sub(40).max(536), super::peer_timeout_ms());
        let transport = Transport::open_driven(netdev, kind, ports, tcp)?;
        // The stack's MTU, which the driver may hold below the interface's (xdp without
        // AF_XDP multi-buffer on a jumbo-frame link).
        let mss = transport.mtu().saturating_sub(40).max(536);
        let name = match kind {
            Kind::Xdp => "xdp",
            Kind::Packet => "packet",
        };
        Ok(RawTcp { transport, name, mss })
    }

    /// The driver in use (`xdp (native, copy)`, `packet`).
    pub fn driver(&self) -> &'static str {
        self.transport.kind()
    }

    /// What the progress thread waits on (level-triggered) for [`RawTcp::turn`]: the
    /// driver's socket and the stack's timer.
    pub fn fds(&self) -> [RawFd; 2] {
        self.transport.fds()
    }

    /// Whether `fd` is the readiness descriptor of one of this transport's streams.
    pub fn owns_readiness(&self, fd: RawFd) -> bool {
        self.transport.owns_readiness(fd)
    }

    /// The readiness descriptors of the streams that stack turns fed since the last call
    /// (see `uiw_rawnet::stream::Transport::take_readable`).
    pub fn take_readable(&self, out: &mut Vec<RawFd>) {
        self.transport.take_readable(out)
    }

    /// Frames in, timers, frames out, and the streams' readiness signalled — except those
    /// `quiet` names, which go to `served` for the caller to serve (see
    /// `uiw_rawnet::stream::Transport::turn_serving`); whether it moved anything.
    pub fn turn_serving(&self, quiet: &dyn Fn(RawFd) -> bool, served: &mut Vec<RawFd>) -> bool {
        self.transport.turn_serving(quiet, served)
    }
}

impl Connector for RawTcp {
    fn connect(&self, to: SocketAddrV4) -> io::Result<Box<dyn Stream>> {
        let s = self.transport.connect_start(to, ARP_TIMEOUT)?;
        Ok(Box::new(RawStreamIo { s, mss: self.mss, buf: Vec::new() }))
    }

    fn listen(&self, at: SocketAddrV4) -> io::Result<Box<dyn Listener>> {
        let l = self.transport.listen_nonblocking(at.port())?;
        Ok(Box::new(RawListenerIo { l, mss: self.mss }))
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

struct RawListenerIo {
    l: RawListener,
    mss: usize,
}

impl Listener for RawListenerIo {
    fn accept(&self) -> io::Result<Box<dyn Stream>> {
        let s = self.l.try_accept()?;
        Ok(Box::new(RawStreamIo { s, mss: self.mss, buf: Vec::new() }))
    }

    fn readiness(&self) -> RawFd {
        self.l.fd()
    }
}

/// The next `bytes` of a read of `[placed bytes of application memory, then a tail]`, `*at`
/// bytes into it: the part for the memory goes to `place(offset, bytes)`, the rest to `tail`.
fn scatter(mut bytes: &[u8], at: &mut usize, placed: usize, place: &mut dyn FnMut(usize, &[u8]), tail: &mut [u8]) {
    if *at < placed {
        let k = bytes.len().min(placed - *at);
        place(*at, &bytes[..k]);
        bytes = &bytes[k..];
        *at += k;
    }
    if !bytes.is_empty() {
        let t = *at - placed;
        tail[t..t + bytes.len()].copy_from_slice(bytes);
        *at += bytes.len();
    }
}

/// One raw-transport stream.
struct RawStreamIo {
    s: RawStream,
    mss: usize,
    /// Payload to send, read from application memory for the stack (kept between calls).
    buf: Vec<u8>,
}

impl Stream for RawStreamIo {
    fn send(&mut self, mem: &dyn UserMemory, parts: &[IoPart<'_>]) -> io::Result<usize> {
        let total: usize = parts.iter().map(IoPart::len).sum();
        // Copy no more than the stack takes now; with no room, offer one byte, which either
        // goes (room appeared meanwhile) or registers the wait for room.
        let want = total.min(self.s.send_capacity().max(1));
        self.buf.clear();
        for p in parts {
            let k = p.len().min(want - self.buf.len());
            if k == 0 {
                break;
            }
            match p {
                IoPart::Bytes(b) => self.buf.extend_from_slice(&b[..k]),
                IoPart::User(pin) => {
                    let at = self.buf.len();
                    self.buf.resize(at + k, 0);
                    mem.read(pin, &mut self.buf[at..]);
                }
            }
        }
        self.s.try_write(&self.buf)
    }

    fn recv_placed(&mut self, mem: &dyn UserMemory, dst: &Pinned, tail: &mut [u8]) -> io::Result<usize> {
        // Straight from the stack's receive buffer into registered memory (then `tail`): each
        // byte is copied once, as the kernel's `readv` does for the kernel-TCP transport.
        let mut at = 0;
        let mut place = |off: usize, bytes: &[u8]| {
            if let Some(part) = dst.sub(off, bytes.len()) {
                mem.write(&part, bytes);
            }
        };
        self.s.try_read_with(dst.len() + tail.len(), &mut |bytes| scatter(bytes, &mut at, dst.len(), &mut place, tail))
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.s.try_read(buf)
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.s.try_write(buf)
    }

    fn shutdown_write(&mut self) {
        self.s.shutdown_write();
    }

    fn close_with(&mut self, bytes: &[u8], timeout: Duration) {
        let end = Instant::now() + timeout;
        let mut at = 0;
        while at < bytes.len() && Instant::now() < end {
            match self.s.try_write(&bytes[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break,
            }
        }
        self.s.shutdown_write();
    }

    fn mss(&self) -> usize {
        let m = self.s.mss();
        if m > 536 {
            m
        } else {
            self.mss
        }
    }

    fn peer(&self) -> Option<SocketAddr> {
        self.s.peer().map(SocketAddr::V4)
    }

    fn local(&self) -> Option<SocketAddr> {
        self.s.local().map(SocketAddr::V4)
    }

    fn readiness(&self) -> RawFd {
        self.s.fd().unwrap_or(-1)
    }

    /// The stack, its lock and its thread are the parent's: closing would take a lock a
    /// parent thread may have held at the fork. The copy is left as it is.
    fn abandon(self: Box<Self>) {
        std::mem::forget(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum of the backed-off RTOs before the connection fails, from the floor (utcp
    /// gives up at the timeout after the `max_retries`-th retransmission).
    fn give_up_ms(c: &uiw_utcp::Config) -> u64 {
        let (mut t, mut rto) = (0, c.rto_min.as_millis() as u64);
        for _ in 0..=c.max_retries {
            t += rto;
            rto = (rto * 2).min(c.rto_max.as_millis() as u64);
        }
        t
    }

    /// A read lent in slices that end anywhere — inside the memory part, exactly at its end,
    /// across it, inside the tail — lands in order, each byte in its place.
    #[test]
    fn scatter_puts_each_byte_in_memory_then_the_tail() {
        let data: Vec<u8> = (0..20).collect();
        for cuts in [vec![3, 4, 3, 10], vec![5, 15], vec![7, 13], vec![20], vec![1; 20], vec![2, 3, 15]] {
            let (mut mem, mut tail, mut at, mut from) = (vec![0u8; 5], vec![0u8; 15], 0, 0);
            for c in cuts.iter().copied() {
                let mut place = |off: usize, b: &[u8]| mem[off..off + b.len()].copy_from_slice(b);
                scatter(&data[from..from + c], &mut at, 5, &mut place, &mut tail);
                from += c;
            }
            assert_eq!(at, 20, "cuts {cuts:?}");
            assert_eq!((&mem[..], &tail[..]), (&data[..5], &data[5..]), "cuts {cuts:?}");
        }
    }

    #[test]
    fn a_silent_peer_fails_the_stream_after_about_the_peer_timeout() {
        for timeout in [1_000, 3_000, 10_000, 60_000] {
            let c = tcp_config(1460, timeout);
            let t = give_up_ms(&c);
            assert!(t >= timeout && t < timeout + 1_000, "{timeout} ms: gives up after {t} ms ({c:?})");
            assert!(c.rto_max <= Duration::from_secs(1) && c.rto_max >= c.rto_min);
        }
        // utcp's own default would wait minutes.
        assert!(give_up_ms(&uiw_utcp::Config::default()) > 300_000);
        assert_eq!(tcp_config(8960, 10_000).mss, 8960);
    }
}
