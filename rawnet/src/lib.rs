//! uiw-rawnet: raw-frame drivers for uiw's userspace TCP (`uiw-utcp`).
//!
//! This crate forbids `unsafe_code`: what would need it — sockets of families
//! `AF_PACKET` and `AF_XDP`, the `mmap`ed UMEM and rings, `bpf(2)`, `setns(2)`, the
//! interface ioctls — is `uiw_kabi::raw`'s, uiw's FFI-edge crate, behind safe interfaces.
//! The rest of uiw sees the [`FrameIo`] trait, [`Host`] and [`stream::Transport`].
//!
//! - [`afpacket`]: an `AF_PACKET` socket bound to one interface, a classic BPF filter that
//!   passes only IPv4/TCP to uiw's address and port range, and [`guard::RstGuard`], the
//!   nftables rule that keeps the kernel from answering uiw's flows with RST.
//! - [`xdp`]: an `AF_XDP` socket (copy mode where the driver has no zero-copy, as veth)
//!   and [`ebpf`], the XDP program — assembled here as raw eBPF instructions and loaded
//!   with `bpf(2)`, so running uiw needs no clang, libbpf or aya — that steers uiw's TCP
//!   into the socket and passes everything else (ARP, ND, ssh, …) to the kernel.
//! - [`neigh`]: the peer's MAC from the kernel's neighbour table.
//! - [`host`]: a `Stack` driven over a `FrameIo`.
//! - [`stream`]: `Transport` + `RawStream` — connect/listen/accept and `Read`/`Write`
//!   streams with a progress thread: the shape an engine transport holds.
//! - [`probe`]: whether this process has what a raw-frame transport needs.
//! - [`netns`]: entering a network namespace on the calling thread (tests, test bed).
//! - [`testbed`]: two namespaces over a veth pair with random loss, for tests and benchmarks.

#![forbid(unsafe_code)]

pub mod afpacket;
pub mod ebpf;
pub mod eventfd;
pub mod guard;
pub mod host;
pub mod iface;
pub mod neigh;
pub mod nonblock;
pub mod netns;
pub mod probe;
pub mod stream;
pub mod testbed;
pub mod xdp;

use std::io;
use std::os::fd::RawFd;

pub use host::Host;
pub use iface::Iface;

/// uiw's TCP port range (the provider's QP-number ports, `UIW_PORT_BASE` + 0..4096).
pub const DEFAULT_PORTS: (u16, u16) = (20000, 24095);

/// A queue of Ethernet frames in and out of one interface.
pub trait FrameIo: Send {
    /// Hand up to `budget` received frames to `f`, without blocking; returns how many.
    fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize>;
    /// Queue one frame for transmission. `Ok(false)`: the queue is full, try again after
    /// `flush`/`recv` (the frame was not taken).
    fn send(&mut self, frame: &[u8]) -> io::Result<bool>;
    /// Push queued frames to the wire (a `sendto` kick for AF_XDP).
    fn flush(&mut self) -> io::Result<()>;
    /// A descriptor that polls readable when frames arrive.
    fn fd(&self) -> RawFd;
    /// Short name for `uiw show` and logs ("packet", "xdp (copy)").
    fn kind(&self) -> &'static str;
    /// Frames were queued but not pushed out (the kernel refused the kick): `flush` again
    /// soon, nothing will say when.
    fn tx_waiting(&self) -> bool {
        false
    }
    /// Steer TCP to `port` here too (`on`), or no longer: a port outside uiw's range that a
    /// listener of the stack needs (rdma_cm listens on the port the application names).
    fn steer(&mut self, port: u16, on: bool) -> io::Result<()> {
        let _ = (port, on);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this driver steers only its port range"))
    }
    /// The largest IP packet this driver carries, if smaller than the interface's MTU (AF_XDP
    /// without multi-buffer support on a jumbo-frame link): the stack's MSS must fit it.
    fn max_mtu(&self) -> Option<usize> {
        None
    }
    /// Counters of frames that took several buffers (AF_XDP multi-buffer); zero elsewhere.
    fn multi_buffer(&self) -> MultiBuffer {
        MultiBuffer::default()
    }
}

/// Frames a driver moved in several buffers ([`FrameIo::multi_buffer`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MultiBuffer {
    /// Received in several descriptors and put together.
    pub rx_frames: u64,
    /// Sent as several descriptors.
    pub tx_frames: u64,
    /// Received chains thrown away (out of bounds, longer than the largest frame).
    pub rx_discarded: u64,
}

impl<T: FrameIo + ?Sized> FrameIo for Box<T> {
    fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        (**self).recv(budget, f)
    }
    fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
        (**self).send(frame)
    }
    fn flush(&mut self) -> io::Result<()> {
        (**self).flush()
    }
    fn fd(&self) -> RawFd {
        (**self).fd()
    }
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn tx_waiting(&self) -> bool {
        (**self).tx_waiting()
    }
    fn steer(&mut self, port: u16, on: bool) -> io::Result<()> {
        (**self).steer(port, on)
    }
    fn max_mtu(&self) -> Option<usize> {
        (**self).max_mtu()
    }
    fn multi_buffer(&self) -> MultiBuffer {
        (**self).multi_buffer()
    }
}
