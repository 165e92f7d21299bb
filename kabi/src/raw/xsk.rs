//! An `AF_XDP` socket in copy mode on one queue of an interface: its UMEM (4096 chunks of
//! [`FRAME`] bytes, half for receiving through the fill ring, half for transmitting) and its
//! four single-producer/single-consumer rings, all `mmap`ed memory the kernel reads and
//! writes concurrently. The safe interface hands a received frame out as a slice only while
//! its chunks are this side's (taken off the RX ring, not yet back on the fill ring), copies a
//! frame to send into chunks the kernel does not hold, and checks every descriptor the
//! kernel publishes against the UMEM's and its chunk's bounds. Transmission needs a `sendto`
//! kick in copy mode ([`Xsk::flush`]).
//!
//! Multi-buffer (kernel 6.6+, `XDP_USE_SG`): a frame larger than a chunk — 9000-byte MTU —
//! comes as several RX descriptors, each but the last marked `XDP_PKT_CONTD`, in whichever
//! chunks the fill ring gave the kernel; it is copied together into one buffer (the TCP takes
//! a frame as one slice), each chunk going back to the fill ring as soon as its piece is
//! copied. A frame to send that is larger than a chunk goes out as a chain of TX descriptors
//! marked the same way. Where the kernel refuses `XDP_USE_SG` the socket carries frames of
//! one chunk only ([`Xsk::max_frame`] says how large).
//!
//! Binding the socket is half of it: frames reach it only once an XDP program redirects
//! them into an XSK map holding it (`super::bpf`, `uiw-rawnet`'s `xdp`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

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
/// Bind flag: this side takes a packet in several descriptors (linux/if_xdp.h, 6.6+).
const XDP_USE_SG: u16 = 1 << 4;
/// `xdp_desc.options`: the packet continues in the next descriptor.
const XDP_PKT_CONTD: u32 = 1 << 0;
const AF_XDP: libc::c_int = 44;

/// Bytes per UMEM chunk (one frame).
pub const FRAME: usize = 4096;
const FRAMES: usize = 4096;
const RING: u32 = 2048;
/// XDP_PACKET_HEADROOM: where the kernel puts received data in a chunk (copy mode).
pub const HEADROOM: usize = 256;
/// The bytes of a frame one RX chunk holds (after the headroom).
pub const RX_FRAME: usize = FRAME - HEADROOM;
/// Descriptors one transmitted frame may take: copy mode builds an skb from the first and a
/// page fragment from each further one, and drops a chain that needs more fragments than
/// MAX_SKB_FRAGS (17, its smallest configurable value).
const MAX_TX_DESCS: usize = 17;

/// Counters of the multi-buffer paths.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XskStats {
    /// Frames received in more than one descriptor (put together).
    pub rx_multi: u64,
    /// Frames sent as more than one descriptor.
    pub tx_multi: u64,
    /// Received frames thrown away: a descriptor outside the UMEM or its chunk, a chain of
    /// descriptors longer than the largest frame (or than its descriptors can be).
    pub rx_discarded: u64,
}

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

/// A received frame that came in several descriptors, put back together. Each piece is
/// copied here as its descriptor is read, so that its chunk goes back to the fill ring at
/// once: a chain that never ends holds no chunk, and the RX ring is always drained (a ring
/// left non-empty would keep the socket readable and its poller spinning). A chain longer
/// than the largest frame, or of more descriptors than such a frame takes, or with a
/// descriptor outside its chunk, is discarded up to and including its last descriptor.
struct Reasm {
    buf: Vec<u8>,
    /// The largest frame taken.
    max: usize,
    /// Descriptors of the open chain so far (0: none open).
    descs: usize,
    /// The open chain is being thrown away.
    discarding: bool,
}

/// What one received descriptor completed.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    /// Nothing yet: the frame goes on in the next descriptor.
    More,
    /// A whole frame (and whether it took several descriptors).
    Frame(&'a [u8], bool),
    /// The last descriptor of a frame that was thrown away.
    Discarded,
}

impl Reasm {
    fn new(max: usize) -> Reasm {
        Reasm { buf: Vec::with_capacity(max), max, descs: 0, discarding: false }
    }

    /// The descriptors a frame of `max` bytes takes at most: every one but the last full.
    fn max_descs(&self) -> usize {
        self.max.div_ceil(RX_FRAME).max(1)
    }

    /// One descriptor's bytes (`None`: the descriptor was out of bounds) and whether the
    /// frame continues in the next one.
    fn push<'a>(&'a mut self, piece: Option<&'a [u8]>, contd: bool) -> Step<'a> {
        if self.descs == 0 && !contd {
            // The usual case: the frame is this one descriptor, lent where it lies.
            return match piece {
                Some(p) if p.len() <= self.max => Step::Frame(p, false),
                _ => Step::Discarded,
            };
        }
        if self.descs == 0 {
            self.buf.clear();
            self.discarding = false;
        }
        self.descs += 1;
        match piece {
            Some(p) if !self.discarding && self.descs <= self.max_descs() && self.buf.len() + p.len() <= self.max => {
                self.buf.extend_from_slice(p)
            }
            _ => self.discarding = true,
        }
        if contd {
            return Step::More;
        }
        self.descs = 0;
        if self.discarding {
            Step::Discarded
        } else {
            Step::Frame(&self.buf, true)
        }
    }
}

/// The bytes a descriptor points at, if they lie inside the UMEM and inside one chunk.
fn piece(umem: &Map, addr: u64, len: u32) -> Option<&[u8]> {
    let (a, len) = (usize::try_from(addr).ok()?, len as usize);
    if a % FRAME + len > FRAME || a.checked_add(len)? > umem.len {
        return None;
    }
    // SAFETY: bounds checked against the UMEM mapping, which outlives the borrow of `umem`;
    // the caller lends it only while the chunk is this side's (taken off the RX ring, not
    // yet back on the fill ring), so the kernel does not write it meanwhile.
    Some(unsafe { std::slice::from_raw_parts(umem.ptr.add(a), len) })
}

/// An AF_XDP socket bound to one queue, with its UMEM and rings.
pub struct Xsk {
    // Field order is drop order: unmap the rings, close the socket, unmap the UMEM.
    rx: Ring,
    tx: Ring,
    fill: Ring,
    comp: Ring,
    fd: OwnedFd,
    umem: Map,
    /// UMEM chunks not in any ring (free for TX).
    free: Vec<u64>,
    tx_pending: bool,
    /// Bound with `XDP_USE_SG`: frames may take several descriptors.
    sg: bool,
    reasm: Reasm,
    stats: XskStats,
}

// SAFETY: the raw pointers point into mappings owned by this struct; it is used by one
// thread at a time (&mut self for every ring operation).
unsafe impl Send for Xsk {}

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

impl Xsk {
    /// Opens a socket with its UMEM and rings and binds it, copy mode, to queue `queue` of
    /// interface `ifindex`, for frames of up to `max_frame` bytes (Ethernet header included;
    /// see [`Xsk::max_frame`] for what it got). Needs CAP_NET_RAW (root); errors say which
    /// step failed.
    pub fn open(ifindex: u32, queue: u32, max_frame: usize) -> io::Result<Xsk> {
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
        // Copy mode turns every TX descriptor into an skb charged to the socket's send
        // buffer until the peer took it: let the TX ring, not the default buffer (~200 KB,
        // a tenth of the ring), bound what is in flight, or a kick fails with EAGAIN under
        // bulk and the frames wait for the next turn. FORCE (root) may exceed wmem_max.
        let bytes: libc::c_int = 16 << 20;
        for o in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            // SAFETY: an int option: pointer and length match, `bytes` outlives the call.
            let r = unsafe {
                libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, o, &bytes as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t)
            };
            if r == 0 {
                break;
            }
        }
        let bind = |flags: u16| {
            let sa = SockaddrXdp { family: AF_XDP as u16, flags, ifindex, queue_id: queue, shared_umem_fd: 0 };
            // SAFETY: sa is a valid sockaddr_xdp of the size passed.
            cvt(unsafe { libc::bind(raw, &sa as *const SockaddrXdp as *const libc::sockaddr, std::mem::size_of::<SockaddrXdp>() as libc::socklen_t) })
        };
        // Multi-buffer where the kernel has it (6.6+); one it does not know the flag of
        // answers EINVAL before looking at anything else, and the socket stays unbound.
        let sg = match bind(XDP_COPY | XDP_USE_SG) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                bind(XDP_COPY).map_err(ctx("bind (copy mode)"))?;
                false
            }
            Err(e) => return Err(ctx("bind (copy mode, multi-buffer)")(e)),
        };
        let max = if sg { max_frame.min(MAX_TX_DESCS * FRAME) } else { max_frame.min(RX_FRAME) };
        Ok(Xsk { rx, tx, fill, comp, fd, umem, free, tx_pending: false, sg, reasm: Reasm::new(max), stats: XskStats::default() })
    }

    /// The largest frame this socket carries: what `open` asked for, or less — one RX chunk
    /// ([`RX_FRAME`]) if the kernel has no multi-buffer support.
    pub fn max_frame(&self) -> usize {
        self.reasm.max
    }

    /// Whether the socket is bound with `XDP_USE_SG` (frames larger than a chunk).
    pub fn multi_buffer(&self) -> bool {
        self.sg
    }

    pub fn stats(&self) -> XskStats {
        self.stats
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Frames wait in the TX ring for a kick the kernel refused (its socket buffer full):
    /// the next [`Xsk::flush`] retries; nothing signals when it would succeed.
    pub fn tx_waiting(&self) -> bool {
        self.tx_pending
    }

    /// Return completed TX chunks to the free list.
    fn reap(&mut self) {
        let cons = self.comp.cons().load(Ordering::Relaxed);
        let prod = self.comp.prod().load(Ordering::Acquire);
        let mut c = cons;
        while c != prod {
            // SAFETY: slots between consumer and producer were published by the kernel.
            let a = unsafe { *self.comp.addr_slot(c) } & !(FRAME as u64 - 1);
            if a < self.umem.len as u64 {
                self.free.push(a);
            }
            c = c.wrapping_add(1);
        }
        self.comp.cons().store(c, Ordering::Release);
    }

    /// A chunk free for TX (from `free`, whose addresses are chunk starts inside the UMEM).
    fn chunk_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let a = addr as usize;
        assert!(a % FRAME + len <= FRAME && a.checked_add(len).is_some_and(|end| end <= self.umem.len), "descriptor outside the UMEM");
        // SAFETY: bounds checked against the UMEM mapping, which lives as long as self;
        // the kernel neither reads nor writes a chunk free for TX (not in any ring).
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(a), len) }
    }

    /// Hands up to `budget` received frames to `f`, without blocking; returns how many. Each
    /// chunk goes back to the kernel (the fill ring) after `f` returns; a frame in several
    /// descriptors is lent from the buffer it was put together in.
    pub fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let cons = self.rx.cons().load(Ordering::Relaxed);
        let prod = self.rx.prod().load(Ordering::Acquire);
        let avail = prod.wrapping_sub(cons).min(RING);
        let fprod = self.fill.prod().load(Ordering::Relaxed);
        let (mut taken, mut refilled, mut frames) = (0u32, 0u32, 0usize);
        while taken < avail && frames < budget {
            // SAFETY: a descriptor the kernel published (between consumer and producer).
            let d = unsafe { *self.rx.desc_slot(cons.wrapping_add(taken)) };
            taken += 1;
            match self.reasm.push(piece(&self.umem, d.addr, d.len), d.options & XDP_PKT_CONTD != 0) {
                Step::More => {}
                Step::Frame(frame, multi) => {
                    f(frame);
                    frames += 1;
                    self.stats.rx_multi += u64::from(multi);
                }
                Step::Discarded => self.stats.rx_discarded += 1,
            }
            // Give the chunk back to the kernel for the next arrival (one outside the UMEM
            // is not ours to give).
            let chunk = d.addr & !(FRAME as u64 - 1);
            if chunk < self.umem.len as u64 {
                // SAFETY: fill-ring slot; at most RING chunks are ever outstanding, so the
                // ring has room for every chunk the RX ring returned.
                unsafe { *self.fill.addr_slot(fprod.wrapping_add(refilled)) = chunk };
                refilled += 1;
            }
        }
        if taken > 0 {
            self.rx.cons().store(cons.wrapping_add(taken), Ordering::Release);
            self.fill.prod().store(fprod.wrapping_add(refilled), Ordering::Release);
        }
        Ok(frames)
    }

    /// Queues one frame for transmission (copied into free chunks: several, chained with
    /// `XDP_PKT_CONTD`, if it is larger than one). `Ok(false)`: no room, try again after
    /// [`Xsk::flush`] (the frame was not taken).
    pub fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
        let n = frame.len().div_ceil(FRAME).max(1);
        if (n > 1 && !self.sg) || n > MAX_TX_DESCS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {} bytes is larger than this AF_XDP socket takes ({})", frame.len(), self.max_frame())));
        }
        if self.free.len() < n {
            self.reap();
        }
        let prod = self.tx.prod().load(Ordering::Relaxed);
        let cons = self.tx.cons().load(Ordering::Acquire);
        if RING.saturating_sub(prod.wrapping_sub(cons)) < n as u32 || self.free.len() < n {
            return Ok(false); // the caller flushes (kicks) and tries again
        }
        for k in 0..n {
            let part = &frame[k * FRAME..frame.len().min((k + 1) * FRAME)];
            let Some(addr) = self.free.pop() else { unreachable!("checked above") };
            self.chunk_mut(addr, part.len()).copy_from_slice(part);
            let options = if k + 1 < n { XDP_PKT_CONTD } else { 0 };
            // SAFETY: a TX slot we own (the ring has room for all n), published by the
            // producer store below, all n at once: the kernel never sees half a chain.
            unsafe { *self.tx.desc_slot(prod.wrapping_add(k as u32)) = Desc { addr, len: part.len() as u32, options } };
        }
        self.tx.prod().store(prod.wrapping_add(n as u32), Ordering::Release);
        self.tx_pending = true;
        self.stats.tx_multi += u64::from(n > 1);
        Ok(true)
    }

    /// Pushes the queued frames to the wire (`sendto` kicks) and takes back completed chunks.
    pub fn flush(&mut self) -> io::Result<()> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame in several descriptors is put together; a single descriptor is lent as is.
    #[test]
    fn chains_are_put_together() {
        let mut r = Reasm::new(9014);
        assert_eq!(r.push(Some(&[1, 2, 3][..]), false), Step::Frame(&[1, 2, 3], false));
        let a = vec![7u8; RX_FRAME];
        let b = vec![8u8; RX_FRAME];
        let c = vec![9u8; 9014 - 2 * RX_FRAME];
        assert_eq!(r.push(Some(&a), true), Step::More);
        assert_eq!(r.push(Some(&b), true), Step::More);
        let Step::Frame(f, true) = r.push(Some(&c), false) else { panic!("no frame") };
        assert_eq!(f.len(), 9014);
        assert!(f[..RX_FRAME].iter().all(|&x| x == 7) && f[RX_FRAME..2 * RX_FRAME].iter().all(|&x| x == 8) && f[2 * RX_FRAME..].iter().all(|&x| x == 9));
        // And the next frame starts afresh.
        assert_eq!(r.push(Some(&[4][..]), false), Step::Frame(&[4], false));
        assert_eq!(r.push(Some(&[5][..]), true), Step::More);
        assert_eq!(r.push(Some(&[6][..]), false), Step::Frame(&[5, 6], true));
    }

    /// A chain longer than the largest frame, one that never ends, one of empty descriptors
    /// and one with a descriptor out of bounds are discarded — once each, at their last
    /// descriptor — holding at most one frame's bytes meanwhile; what follows is received.
    #[test]
    fn hostile_chains_are_discarded() {
        let mut r = Reasm::new(9014);
        let full = vec![0u8; RX_FRAME];
        // Too many bytes: 4 full chunks > 9014.
        for _ in 0..4 {
            assert_eq!(r.push(Some(&full), true), Step::More);
        }
        assert_eq!(r.push(Some(&full), false), Step::Discarded);
        assert_eq!(r.push(Some(&[1][..]), false), Step::Frame(&[1], false));
        // A chain that goes on and on: never a frame, never more than `max` bytes held.
        for _ in 0..100_000 {
            assert_eq!(r.push(Some(&full), true), Step::More);
            assert!(r.buf.len() <= 9014);
        }
        assert_eq!(r.push(None, false), Step::Discarded);
        // Empty descriptors: bytes stay within bounds, their count does not.
        for _ in 0..r.max_descs() + 1 {
            assert_eq!(r.push(Some(&[]), true), Step::More);
        }
        assert_eq!(r.push(Some(&[2][..]), false), Step::Discarded);
        // A descriptor out of bounds in the middle, or alone.
        assert_eq!(r.push(Some(&[3][..]), true), Step::More);
        assert_eq!(r.push(None, true), Step::More);
        assert_eq!(r.push(Some(&[3][..]), false), Step::Discarded);
        assert_eq!(r.push(None, false), Step::Discarded);
        // A single descriptor larger than the largest frame; a chain of more descriptors
        // than the largest frame takes (one, at 1514 bytes), however short.
        let mut small = Reasm::new(1514);
        assert_eq!(small.push(Some(&full), false), Step::Discarded);
        assert_eq!(small.push(Some(&[1, 2][..]), true), Step::More);
        assert_eq!(small.push(Some(&[3][..]), false), Step::Discarded);
        assert_eq!(small.push(Some(&[4][..]), false), Step::Frame(&[4], false));
    }

    /// `piece` lends only what lies inside the UMEM and inside one chunk.
    #[test]
    fn descriptors_out_of_bounds_are_refused() {
        let m = Map::new(None, 2 * FRAME, 0).unwrap();
        assert_eq!(piece(&m, HEADROOM as u64, RX_FRAME as u32).map(|p| p.len()), Some(RX_FRAME));
        assert!(piece(&m, HEADROOM as u64, RX_FRAME as u32 + 1).is_none(), "into the next chunk");
        assert!(piece(&m, FRAME as u64 + 4000, 200).is_none(), "across the UMEM's end");
        assert!(piece(&m, 2 * FRAME as u64, 1).is_none(), "past the UMEM");
        assert!(piece(&m, u64::MAX, 1).is_none());
        assert!(piece(&m, u64::MAX - 4095, 4096).is_none());
    }
}
