//! The AF_XDP driver: one XSK socket on queue 0 of an interface (its UMEM and four rings are
//! `uiw_kabi::raw::xsk`'s, behind a safe interface), and the XDP program of [`crate::ebpf`]
//! that redirects uiw's TCP into it.
//!
//! Copy mode (`XDP_COPY`): veth has no zero-copy (the bind answers EOPNOTSUPP), and copy
//! mode works on every driver. UMEM chunks are 4 KiB; a frame larger than one chunk minus
//! the XDP headroom (3840 bytes, an MTU above 3826) — a 9000-byte MTU — travels as AF_XDP
//! multi-buffer (kernel 6.6+): several descriptors per frame, the socket bound with
//! `XDP_USE_SG`, the program loaded with `BPF_F_XDP_HAS_FRAGS` (veth refuses a program
//! without it in native mode once the MTU exceeds a page; the program reads only the
//! headers, inside the first buffer, checked against `data_end`). A kernel without
//! multi-buffer support gets a stack whose MSS fits one chunk ([`FrameIo::max_mtu`]): the
//! peer sends segments that fit, and `kind` says "MSS clamped". Transmission needs a `sendto`
//! kick in copy mode (`flush`). The program is attached in native (driver) mode where the
//! driver has it, else in generic (skb) mode, through a BPF link that the kernel removes when
//! the socket's owner closes it or exits.
//!
//! Only queue 0 is bound: on a multi-queue NIC set `ethtool -L <if> combined 1`, or frames
//! on other queues go to the kernel (which, under [`crate::guard::RstGuard`], drops them).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use uiw_kabi::raw::xsk::{Xsk, XskStats};

use crate::ebpf;
use crate::{FrameIo, Iface, MultiBuffer};

/// An AF_XDP socket with its UMEM, bound to queue 0 of one interface, and the XDP program
/// steering uiw's TCP to it.
pub struct XskSocket {
    // Field order is drop order: detach the program first, then close the socket.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    /// Ports steered beyond the range (see `FrameIo::steer`).
    ports_map: OwnedFd,
    xsk: Xsk,
    mode: &'static str,
    /// The MTU the socket carries, when less than the interface's (no multi-buffer).
    clamp: Option<usize>,
}

impl XskSocket {
    /// Open on queue 0 of `iface`, steering TCP to `iface.ip` on `ports`. Needs CAP_NET_RAW,
    /// CAP_NET_ADMIN and CAP_BPF (root); errors say which step failed.
    pub fn open(iface: &Iface, ports: (u16, u16)) -> io::Result<XskSocket> {
        let xsk = Xsk::open(iface.index, 0, iface.mtu + ETH_HDR)?;
        // Without multi-buffer a frame must fit one chunk: the stack then announces an MSS
        // that fits (see the module doc), rather than refuse a jumbo-frame link.
        let clamp = (xsk.max_frame() < iface.mtu + ETH_HDR).then(|| xsk.max_frame() - ETH_HDR);
        let map = ebpf::xsk_map(64)?;
        ebpf::map_set(&map, 0, xsk.fd()).map_err(|e| io::Error::new(e.kind(), format!("AF_XDP XSK map update: {e}")))?;
        let ports_map = ebpf::port_set(MAX_STEERED)?;
        // Multi-buffer aware when the socket is: a frame the driver splits into buffers then
        // reaches the program, and the socket, whole.
        let prog = ebpf::load_xdp(&ebpf::program(map.as_raw_fd(), ports_map.as_raw_fd(), iface.ip, ports), xsk.multi_buffer())?;
        let (link, native) = match ebpf::attach_xdp(&prog, iface.index, ebpf::XDP_FLAGS_DRV_MODE) {
            Ok(l) => (l, true),
            Err(_) => (
                ebpf::attach_xdp(&prog, iface.index, ebpf::XDP_FLAGS_SKB_MODE)
                    .map_err(|e| io::Error::new(e.kind(), format!("attaching the XDP program to {}: {e} (is another XDP program attached?)", iface.name)))?,
                false,
            ),
        };
        let mode = match (native, clamp.is_some()) {
            (true, false) => "xdp (native, copy)",
            (false, false) => "xdp (generic, copy)",
            (true, true) => "xdp (native, copy, MSS clamped to one 4 KiB chunk: no AF_XDP multi-buffer)",
            (false, true) => "xdp (generic, copy, MSS clamped to one 4 KiB chunk: no AF_XDP multi-buffer)",
        };
        Ok(XskSocket { _link: link, _prog: prog, _map: map, ports_map, xsk, mode, clamp })
    }

    /// The socket's counters (frames in several descriptors, frames discarded).
    pub fn stats(&self) -> XskStats {
        self.xsk.stats()
    }
}

const ETH_HDR: usize = 14;

/// Ports a socket steers beyond its range at most (rdma_cm listeners of one process).
pub const MAX_STEERED: u32 = 256;

impl FrameIo for XskSocket {
    fn steer(&mut self, port: u16, on: bool) -> io::Result<()> {
        if on {
            ebpf::map_set(&self.ports_map, u32::from(port), 1)
        } else {
            ebpf::map_delete(&self.ports_map, u32::from(port))
        }
    }

    fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.xsk.recv(budget, f)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
        self.xsk.send(frame)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.xsk.flush()
    }

    fn fd(&self) -> RawFd {
        self.xsk.fd()
    }

    fn kind(&self) -> &'static str {
        self.mode
    }

    fn tx_waiting(&self) -> bool {
        self.xsk.tx_waiting()
    }

    fn max_mtu(&self) -> Option<usize> {
        self.clamp
    }

    fn multi_buffer(&self) -> MultiBuffer {
        let s = self.xsk.stats();
        MultiBuffer { rx_frames: s.rx_multi, tx_frames: s.tx_multi, rx_discarded: s.rx_discarded }
    }
}
