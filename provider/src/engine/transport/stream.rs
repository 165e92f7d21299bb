//! The seam between the engine and what carries its byte streams: a [`Stream`] (one
//! connection, non-blocking), a [`Listener`] (connections to one address), and a
//! [`Connector`] (opens both). The data path (`datapath`), the progress thread (`net`) and the
//! QPs (`qp`) only ever hold these; the kernel's TCP ([`super::kernel`]) is one
//! implementation, a userspace TCP over raw frames another.
//!
//! Every call is non-blocking (`io::ErrorKind::WouldBlock` when nothing can move now) except
//! [`Stream::close_with`], which an application thread uses to refuse a connection. The
//! progress thread learns when to call again from [`Stream::readiness`]: a descriptor it
//! registers edge-triggered with epoll (for the kernel's TCP, the socket itself). The contract
//! on that edge is the kernel socket's: after a call that came back short (`recv` returned
//! less than asked, `send` took less than offered or said `WouldBlock`), the descriptor
//! signals again once more can be received, sent, or the stream ended.
//!
//! Payload moves between the stream and application memory through [`UserMemory`] and
//! [`Pinned`] ranges only (see `super::super::user_memory`): an implementation that has a
//! descriptor gives it to `UserMemory::send`/`recv` (one `sendmsg`/`readv`, no copy), one
//! that has not copies with `UserMemory::read`/`write`.

use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::engine::user_memory::{IoPart, Pinned, UserMemory};

/// Whether `e` is a [`Stream`]'s "nothing can move now": `EAGAIN` from a kernel socket (an
/// integer compare: every empty `recv` of a spinning poller asks, and `io::Error::kind`'s
/// table of errnos was 2 % of such a poller's time in user space), or `WouldBlock` from a
/// transport of our own.
pub fn would_block(e: &io::Error) -> bool {
    match e.raw_os_error() {
        // EWOULDBLOCK is EAGAIN on Linux.
        Some(code) => code == libc::EAGAIN,
        None => e.kind() == io::ErrorKind::WouldBlock,
    }
}

/// One byte stream (a TCP connection, RFC 9293) carrying MPA (RFC 5044).
pub trait Stream: Send {
    /// Sends from the gather list `parts` (engine bytes and pinned application memory) as far
    /// as the stream takes them now; returns how many bytes went (in order, from the front).
    fn send(&mut self, mem: &dyn UserMemory, parts: &[IoPart<'_>]) -> io::Result<usize>;

    /// Receives into `dst` (pinned application memory: the payload of an FPDU, placed in
    /// place) and what follows it into `tail`; returns the total (0: the peer closed).
    fn recv_placed(&mut self, mem: &dyn UserMemory, dst: &Pinned, tail: &mut [u8]) -> io::Result<usize>;

    /// Receives into an engine buffer (0: the peer closed).
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;

    /// Sends engine bytes (MPA messages, a Terminate, what a closing stream still owes).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;

    /// Ends the sending direction (FIN after what was sent).
    fn shutdown_write(&mut self);

    /// Sends `bytes` waiting up to `timeout`, then closes both directions: refusing a
    /// connection from an application thread, which may wait a little.
    fn close_with(&mut self, bytes: &[u8], timeout: Duration);

    /// Payload bytes per segment towards the peer now (MPA's FPDU size, RFC 5044 §8). It may
    /// change over the stream's life (a kernel TCP connection's grows as the peer's window
    /// opens): the data path asks again now and then (`Link::follow_mss`).
    fn mss(&self) -> usize;

    /// Who is at the other end.
    fn peer(&self) -> Option<SocketAddr>;

    /// This end's address and port (what rdma_cm reports as the source of a connection).
    fn local(&self) -> Option<SocketAddr>;

    /// The descriptor the progress thread waits on, edge-triggered (see the module doc).
    fn readiness(&self) -> RawFd;

    /// Whether [`Stream::readiness`] polls readable exactly while bytes, or the end of the
    /// stream, wait to be read — a kernel socket's does — so that one `poll` of several
    /// streams' descriptors can tell which of them a `recv` would find empty (`CqObj::drive`).
    /// A raw transport's descriptor signals its stack's turns, not this stream's input: no.
    fn readiness_is_input(&self) -> bool {
        false
    }

    /// Readiness need not report arrivals until `bytes` wait (1: every arrival): the progress
    /// thread paces a hot one-way stream and serves it again by a deadline of its own (see
    /// `engine::pace`). Returns whether the transport does so; one that cannot tell ignores
    /// it (the default).
    fn wake_after(&mut self, bytes: usize) -> bool {
        let _ = bytes;
        false
    }

    /// In a forked child: lets go of the parent's stream without touching anything the
    /// parent's threads may have held locked at the fork, and without ending the parent's
    /// connection. A kernel socket just closes this process's descriptor (the default).
    fn abandon(self: Box<Self>) {
        drop(self);
    }
}

/// Connections to one local address.
pub trait Listener: Send {
    /// The next connection made to it, or `WouldBlock` if there is none now.
    fn accept(&self) -> io::Result<Box<dyn Stream>>;

    /// Readable (level-triggered) while connections wait to be accepted.
    fn readiness(&self) -> RawFd;
}

/// What opens streams and listeners: one per kind of transport (and per interface, for a
/// transport of its own).
pub trait Connector: Send + Sync {
    /// Starts a connection to `to` without waiting for it: the stream becomes writable when
    /// it is established, and fails (`send`/`recv` errors) if it cannot be.
    fn connect(&self, to: SocketAddrV4) -> io::Result<Box<dyn Stream>>;

    /// Listens on `at`.
    fn listen(&self, at: SocketAddrV4) -> io::Result<Box<dyn Listener>>;

    /// What `uiw show` and logs call it (`tcp`, `xdp`, `packet`).
    fn name(&self) -> &'static str;
}
