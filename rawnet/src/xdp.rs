//! The AF_XDP driver: one XSK socket on queue 0 of an interface, its UMEM and four rings,
//! and the XDP program of [`crate::ebpf`] that redirects uiw's TCP into it.
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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::ebpf;
use crate::{FrameIo, Iface};

const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
const XDP_COPY: u16 = 1 << 1;
const AF_XDP: libc::c_int = 44;

const FRAME: usize = 4096;
const FRAMES: usize = 4096;
const RING: u32 = 2048;
/// XDP_PACKET_HEADROOM: where the kernel puts received data in a chunk (copy mode).
const HEADROOM: usize = 256;

#[repr(C)]
#[derive(Default)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// `struct xdp_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}

/// An mmap()ed region, unmapped on drop.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: Option<RawFd>, len: usize, off: libc::off_t) -> io::Result<Map> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL); checked for MAP_FAILED.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map { ptr: p as *mut u8, len })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing borrows the mapping
        // past the owning struct's lifetime.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// One single-producer/single-consumer ring shared with the kernel.
struct Ring {
    _map: Map,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
}

impl Ring {
    fn new(fd: RawFd, off: &RingOffset, pgoff: libc::off_t, n: u32, desc_size: usize) -> io::Result<Ring> {
        let map = Map::new(Some(fd), off.desc as usize + n as usize * desc_size, pgoff)?;
        // SAFETY: the kernel's offsets lie inside the mapping it sized for `n` entries;
        // producer/consumer are 4-byte aligned u32s the kernel updates atomically.
        unsafe {
            Ok(Ring {
                producer: map.ptr.add(off.producer as usize) as *const AtomicU32,
                consumer: map.ptr.add(off.consumer as usize) as *const AtomicU32,
                desc: map.ptr.add(off.desc as usize),
                mask: n - 1,
                _map: map,
            })
        }
    }
    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `new`).
        unsafe { &*self.producer }
    }
    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }
    fn addr_slot(&self, idx: u32) -> *mut u64 {
        // SAFETY: idx is masked to the ring's entries, each 8 bytes (fill/completion).
        unsafe { (self.desc as *mut u64).add((idx & self.mask) as usize) }
    }
    fn desc_slot(&self, idx: u32) -> *mut Desc {
        // SAFETY: idx is masked to the ring's entries, each a 16-byte xdp_desc (rx/tx).
        unsafe { (self.desc as *mut Desc).add((idx & self.mask) as usize) }
    }
}

/// An AF_XDP socket with its UMEM, bound to queue 0 of one interface, and the XDP program
/// steering uiw's TCP to it.
pub struct XskSocket {
    // Field order is drop order: detach the program first, then close the socket, then
    // unmap the rings and the UMEM.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    /// Ports steered beyond the range (see `FrameIo::steer`).
    ports_map: OwnedFd,
    rx: Ring,
    tx: Ring,
    fill: Ring,
    comp: Ring,
    fd: OwnedFd,
    umem: Map,
    /// UMEM chunks not in any ring (free for TX).
    free: Vec<u64>,
    mode: &'static str,
    tx_pending: bool,
}

// SAFETY: the raw pointers point into mappings owned by this struct; it is used by one
// thread at a time (&mut self for every ring operation).
unsafe impl Send for XskSocket {}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn setopt<T>(fd: &OwnedFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the type the option expects, its size passed along.
    cvt(unsafe {
        libc::setsockopt(fd.as_raw_fd(), SOL_XDP, name, v as *const T as *const libc::c_void, std::mem::size_of::<T>() as libc::socklen_t)
    })
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
        let ctx = |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("AF_XDP {what}: {e}"));
        // SAFETY: plain socket(2), checked before owning.
        let raw = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(ctx("socket (needs CAP_NET_RAW; kernel with CONFIG_XDP_SOCKETS)")(io::Error::last_os_error()));
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Map::new(None, FRAME * FRAMES, 0).map_err(ctx("UMEM mmap"))?;
        let reg = UmemReg { addr: umem.ptr as u64, len: (FRAME * FRAMES) as u64, chunk_size: FRAME as u32, ..Default::default() };
        setopt(&fd, XDP_UMEM_REG, &reg).map_err(ctx("UMEM registration"))?;
        setopt(&fd, XDP_UMEM_FILL_RING, &RING).map_err(ctx("fill ring"))?;
        setopt(&fd, XDP_UMEM_COMPLETION_RING, &RING).map_err(ctx("completion ring"))?;
        setopt(&fd, XDP_RX_RING, &RING).map_err(ctx("RX ring"))?;
        setopt(&fd, XDP_TX_RING, &RING).map_err(ctx("TX ring"))?;
        let mut off = MmapOffsets::default();
        let mut len = std::mem::size_of::<MmapOffsets>() as libc::socklen_t;
        // SAFETY: `off` is writable for `len` bytes; the kernel writes at most that.
        cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), SOL_XDP, XDP_MMAP_OFFSETS, &mut off as *mut MmapOffsets as *mut libc::c_void, &mut len) })
            .map_err(ctx("ring offsets"))?;
        let raw = fd.as_raw_fd();
        let rx = Ring::new(raw, &off.rx, XDP_PGOFF_RX_RING, RING, 16).map_err(ctx("RX ring mmap"))?;
        let tx = Ring::new(raw, &off.tx, XDP_PGOFF_TX_RING, RING, 16).map_err(ctx("TX ring mmap"))?;
        let fill = Ring::new(raw, &off.fr, XDP_UMEM_PGOFF_FILL_RING, RING, 8).map_err(ctx("fill ring mmap"))?;
        let comp = Ring::new(raw, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, RING, 8).map_err(ctx("completion ring mmap"))?;
        // Half the chunks for receiving (all in the fill ring), half for transmitting.
        let mut free: Vec<u64> = (0..FRAMES as u64).map(|k| k * FRAME as u64).collect();
        let rx_chunks: Vec<u64> = free.split_off(FRAMES / 2);
        let prod = fill.prod().load(Ordering::Relaxed);
        for (k, &a) in rx_chunks.iter().take(RING as usize).enumerate() {
            // SAFETY: slot inside the fill ring; the kernel reads it only after the
            // producer store below.
            unsafe { *fill.addr_slot(prod.wrapping_add(k as u32)) = a };
        }
        fill.prod().store(prod.wrapping_add(RING.min(rx_chunks.len() as u32)), Ordering::Release);
        free.extend(rx_chunks.into_iter().skip(RING as usize));
        let sa = SockaddrXdp { family: AF_XDP as u16, flags: XDP_COPY, ifindex: iface.index, queue_id: 0, shared_umem_fd: 0 };
        // SAFETY: sa is a valid sockaddr_xdp of the size passed.
        cvt(unsafe { libc::bind(raw, &sa as *const SockaddrXdp as *const libc::sockaddr, std::mem::size_of::<SockaddrXdp>() as libc::socklen_t) })
            .map_err(ctx("bind (copy mode, queue 0)"))?;
        let map = ebpf::xsk_map(64)?;
        ebpf::map_set(&map, 0, raw).map_err(ctx("XSK map update"))?;
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
        Ok(XskSocket { _link: link, _prog: prog, _map: map, ports_map, rx, tx, fill, comp, fd, umem, free, mode, tx_pending: false })
    }

    /// Return completed TX chunks to the free list.
    fn reap(&mut self) {
        let cons = self.comp.cons().load(Ordering::Relaxed);
        let prod = self.comp.prod().load(Ordering::Acquire);
        let mut c = cons;
        while c != prod {
            // SAFETY: slots between consumer and producer were published by the kernel.
            let a = unsafe { *self.comp.addr_slot(c) };
            self.free.push(a & !(FRAME as u64 - 1));
            c = c.wrapping_add(1);
        }
        self.comp.cons().store(c, Ordering::Release);
    }

    fn chunk(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let a = addr as usize;
        assert!(a + len <= self.umem.len, "descriptor outside the UMEM");
        // SAFETY: bounds checked against the UMEM mapping, which lives as long as self;
        // the kernel does not write a chunk we own (taken from RX or free for TX).
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(a), len) }
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
        let cons = self.rx.cons().load(Ordering::Relaxed);
        let prod = self.rx.prod().load(Ordering::Acquire);
        let avail = prod.wrapping_sub(cons).min(budget as u32);
        let fprod = self.fill.prod().load(Ordering::Relaxed);
        for k in 0..avail {
            // SAFETY: a descriptor the kernel published (between consumer and producer).
            let d = unsafe { *self.rx.desc_slot(cons.wrapping_add(k)) };
            let len = (d.len as usize).min(FRAME);
            let frame = self.chunk(d.addr, len);
            f(frame);
            // Give the chunk back to the kernel for the next arrival.
            // SAFETY: fill-ring slot; at most RING chunks are ever outstanding, so the
            // ring has room for every chunk the RX ring returned.
            unsafe { *self.fill.addr_slot(fprod.wrapping_add(k)) = d.addr & !(FRAME as u64 - 1) };
        }
        if avail > 0 {
            self.rx.cons().store(cons.wrapping_add(avail), Ordering::Release);
            self.fill.prod().store(fprod.wrapping_add(avail), Ordering::Release);
        }
        Ok(avail as usize)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
        if frame.len() > FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "frame larger than a UMEM chunk"));
        }
        if self.free.is_empty() {
            self.reap();
        }
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        if prod.wrapping_sub(cons) >= RING || self.free.is_empty() {
            return Ok(false); // the caller flushes (kicks) and tries again
        }
        let Some(addr) = self.free.pop() else { return Ok(false) };
        self.chunk(addr, frame.len()).copy_from_slice(frame);
        // SAFETY: a TX slot we own (the ring is not full), published by the producer store.
        unsafe { *self.tx.desc_slot(prod) = Desc { addr, len: frame.len() as u32, options: 0 } };
        self.tx.prod().store(prod.wrapping_add(1), Ordering::Release);
        self.tx_pending = true;
        Ok(true)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Copy mode transmits inside sendto(), a bounded batch (32 frames) per call: kick
        // until the kernel has taken the whole TX ring, or stops making progress.
        let mut rounds = 0;
        while self.tx_pending && rounds < 64 {
            rounds += 1;
            let before = self.tx.cons().load(Ordering::Acquire);
            // SAFETY: a zero-length sendto with no buffer and no address.
            let r = unsafe { libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) | Some(libc::EINTR) => {}
                    _ => return Err(e),
                }
            }
            let after = self.tx.cons().load(Ordering::Acquire);
            let prod = self.tx.prod().load(Ordering::Relaxed);
            if after == prod {
                self.tx_pending = false;
            } else if after == before && r < 0 {
                break; // the kernel is busy: the next poll kicks again
            }
        }
        self.reap();
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn kind(&self) -> &'static str {
        self.mode
    }
}
