//! The AF_XDP driver: one XSK socket on queue 0 of an interface (its UMEM and four rings are
//! `uiw_kabi::raw::xsk`'s, behind a safe interface), and the XDP program of [`crate::ebpf`]
//! that redirects uiw's TCP into it.
//!
//! Copy mode (`XDP_COPY`): veth has no zero-copy (the bind answers EOPNOTSUPP), and copy
//! mode works on every driver. Frames are 4 KiB UMEM chunks, so the MTU is limited to
//! 4096 − 256 (XDP headroom) − 14 bytes; a jumbo-frame link needs the AF_PACKET driver (or
//! XDP multi-buffer, not done). Transmission needs a `sendto` kick in copy mode
//! (`flush`). The program is attached in native (driver) mode where the driver has it, else
//! in generic (skb) mode, through a BPF link that the kernel removes when the socket's owner
//! closes it or exits.
//!
//! Only queue 0 is bound: on a multi-queue NIC set `ethtool -L <if> combined 1`, or frames
//! on other queues go to the kernel (which, under [`crate::guard::RstGuard`], drops them).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use uiw_kabi::raw::xsk::{Xsk, FRAME, HEADROOM};

use crate::ebpf;
use crate::{FrameIo, Iface};

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
}

impl XskSocket {
    /// Open on queue 0 of `iface`, steering TCP to `iface.ip` on `ports`. Needs CAP_NET_RAW,
    /// CAP_NET_ADMIN and CAP_BPF (root); errors say which step failed.
    pub fn open(iface: &Iface, ports: (u16, u16)) -> io::Result<XskSocket> {
        if iface.mtu + 14 > FRAME - HEADROOM {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: MTU {} is larger than an AF_XDP copy-mode frame allows ({}); use the packet transport", iface.name, iface.mtu, FRAME - HEADROOM - 14),
            ));
        }
        let xsk = Xsk::open(iface.index, 0)?;
        let map = ebpf::xsk_map(64)?;
        ebpf::map_set(&map, 0, xsk.fd()).map_err(|e| io::Error::new(e.kind(), format!("AF_XDP XSK map update: {e}")))?;
        let ports_map = ebpf::port_set(MAX_STEERED)?;
        let prog = ebpf::load_xdp(&ebpf::program(map.as_raw_fd(), ports_map.as_raw_fd(), iface.ip, ports))?;
        let (link, mode) = match ebpf::attach_xdp(&prog, iface.index, ebpf::XDP_FLAGS_DRV_MODE) {
            Ok(l) => (l, "xdp (native, copy)"),
            Err(_) => (
                ebpf::attach_xdp(&prog, iface.index, ebpf::XDP_FLAGS_SKB_MODE)
                    .map_err(|e| io::Error::new(e.kind(), format!("attaching the XDP program to {}: {e} (is another XDP program attached?)", iface.name)))?,
                "xdp (generic, copy)",
            ),
        };
        Ok(XskSocket { _link: link, _prog: prog, _map: map, ports_map, xsk, mode })
    }
}

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
}
