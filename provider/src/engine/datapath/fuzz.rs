//! The data path fed a hostile peer's bytes (issue 10: remote peers are untrusted): the harness
//! of the `datapath_stream` fuzz target (`provider/fuzz`), also run over the committed corpus by
//! `cargo test` (see the tests at the end). Built for tests and with the `fuzzing` feature.
//!
//! [`run`] sets up one QP's [`DataPath`] (MPA responder or initiator) over an in-memory stream
//! (`transport::memory`) with eight registered regions of distinct rights (see [`REGIONS`]),
//! posted receives (on the QP or on an SRQ) and, if the input asks, a posted Send, RDMA Write
//! and RDMA Read; then it writes the input's bytes as the peer's side of the stream, in chunks
//! whose sizes come from the input, and pumps the data path after each. It panics (a finding)
//! when:
//!
//! - anything in the engine panics;
//! - a byte is written outside a registered region (every write is checked where it lands, and
//!   the guard bytes around every region are compared after every pump);
//! - a region is written that the peer may not write: one without `REMOTE_WRITE` (outside the
//!   receive and Read-sink buffers posted into it and not yet completed), of another protection
//!   domain, invalidated, or deregistered before the bytes arrived (one region is deregistered
//!   mid-stream, at a chunk the input picks); or with rights the QP does not grant;
//! - memory is read for the peer that it may not read (no `REMOTE_READ`, outside the gather
//!   lists of the posted sends), or an atomic reaches memory without `REMOTE_ATOMIC` or on a
//!   range the FFI layer would refuse (unaligned, short);
//! - anything is placed (written, or completed successfully) after the data path reported the
//!   QP failed;
//! - a completion is malformed: a status libibverbs does not define or uiw never produces, an
//!   unknown or repeated `wr_id`, the wrong opcode or QP number, more bytes than posted; or,
//!   once the QP is shut down, a posted WR never completed.
//!
//! # Input
//!
//! | byte | meaning |
//! |---|---|
//! | 0 | [`mode`] bits: role, MPA prefix, CRC, SRQ, posted Read, posted Send/Write, pumping on after a failure, a bad receive first |
//! | 1 | the chunk before which region `dereg` is deregistered (`0xff`: never) |
//! | 2 | [`opts`]: the stream's per-call byte limit (bits 0-2), RFC 7306 offered in the prefix, rights the QP withholds |
//! | 3.. | chunks: a size byte, then that many bytes of the peer's stream (see [`chunk`]) |
//!
//! With the MPA prefix bit, the harness writes a valid MPA Request (responder) or Reply
//! (initiator) before the first chunk, so that inputs reach DDP and RDMAP at once. STags are
//! deterministic (`MrTable::with_fixed_keys`): region `i` of [`REGIONS`] has STag
//! `(i + 1) << 8`, and a posted Read's sink STag is `0xff00_0001` (it is posted first).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex as StdMutex};

use parking_lot::Mutex;
use uiw_wire::conn::{Connection, Role};
use uiw_wire::mpa::{encode_rr, FrameKind, IrdOrd, FLAG_CRC, FLAG_UIW_EXT, FLAG_UIW_EXT_ACK};

use super::testkit::{cq, Arena, BASE};
use super::{DataPath, Env, Fatal, Link};
use crate::engine::access::{LOCAL_WRITE, REMOTE_ATOMIC, REMOTE_READ, REMOTE_WRITE, ZERO_BASED};
use crate::engine::cq::{wc_opcode, wc_status, Completion, CqObj};
use crate::engine::events::EventQueue;
use crate::engine::mr::MrTable;
use crate::engine::srq::{Srq, SrqObj};
use crate::engine::transport::memory::{self, MemStream};
use crate::engine::transport::{config, Pending, Stream};
use crate::engine::user_memory::{AtomicOperation, Crc32c, IoPart, Pinned, UserMemory};
use crate::engine::wr::{opcode, send_flags, Payload, RecvWqe, SendWqe, Sge};

/// Bits of input byte 0.
pub mod mode {
    /// The data path is the MPA initiator (else the responder, accepting the Request).
    pub const INITIATOR: u8 = 1 << 0;
    /// The harness writes a valid MPA Request (responder) or Reply (initiator) first.
    pub const PREFIX: u8 = 1 << 1;
    /// The prefix asks for CRC (the data path's own configuration asks for it too).
    pub const CRC: u8 = 1 << 2;
    /// Receives come from an SRQ (else they are posted on the QP).
    pub const SRQ: u8 = 1 << 3;
    /// An RDMA Read is posted (sink STag [`super::SINK_STAG`], in region `sink`).
    pub const READ: u8 = 1 << 4;
    /// A Send and an RDMA Write (from region `src`) are posted.
    pub const SEND: u8 = 1 << 5;
    /// After the data path reports a failure the harness pumps on through the rest of the
    /// input (the failure is sticky: nothing may be placed) before shutting the QP down.
    pub const PUMP_AFTER_FATAL: u8 = 1 << 6;
    /// The first receive has an lkey no region has: a Send into it must fail the QP.
    pub const BAD_RECV: u8 = 1 << 7;
}

/// Bits of input byte 2.
pub mod opts {
    /// Bits 0-2: index into [`MAX_IO`] (bytes per stream call).
    pub const MAX_IO_MASK: u8 = 7;
    /// The prefix offers (Request) or accepts (Reply) the RFC 7306 extensions.
    pub const EXTENSIONS: u8 = 1 << 3;
    /// The QP withholds `REMOTE_WRITE` (`qp_access_flags`).
    pub const NO_QP_WRITE: u8 = 1 << 4;
    /// The QP withholds `REMOTE_READ`.
    pub const NO_QP_READ: u8 = 1 << 5;
    /// The QP withholds `REMOTE_ATOMIC`.
    pub const NO_QP_ATOMIC: u8 = 1 << 6;
    /// The per-call byte limits bits 0-2 choose from.
    pub const MAX_IO: [usize; 8] = [1 << 16, 1, 3, 16, 100, 1460, 4096, 1 << 16];
}

/// Chunk size bytes (after the three header bytes): `1..=0x7f` bytes follow; `0x80..=0xfc`
/// mean `(b - 0x7f) * 64` bytes (64 to 8000); the rest are actions.
pub mod chunk {
    /// The connection's next deadline passes (MPA timeout, the wait for a receive, the grace
    /// after the peer's FIN), as the progress thread would see it.
    pub const TICK: u8 = 0;
    /// A completed receive is posted again (on the QP, or on the SRQ).
    pub const REPOST: u8 = 0xfd;
    /// The peer sends nothing more and pumps: its next bytes arrive later.
    pub const PUMP: u8 = 0xfe;
    /// The peer closes its direction (FIN).
    pub const FIN: u8 = 0xff;
    /// The byte that announces `n` bytes (`n` in 1..=127, or a multiple of 64 up to 8000).
    pub fn len_byte(n: usize) -> u8 {
        match n {
            1..=0x7f => n as u8,
            _ if n % 64 == 0 && (64..=(0xfc - 0x7f) * 64).contains(&n) => (n / 64 + 0x7f) as u8,
            _ => panic!("no chunk byte announces {n} bytes"),
        }
    }
}

/// One registered region of the harness.
#[derive(Debug, Clone, Copy)]
pub struct RegionSpec {
    pub name: &'static str,
    pub len: u64,
    pub access: u32,
    pub pd: u32,
}

const PD: u32 = 1;
const OTHER_PD: u32 = 2;
/// The QP number completions must carry.
pub const QPN: u32 = 0x00_f00d;

/// The regions, registered in this order (region `i` has STag `(i + 1) << 8`).
pub const REGIONS: [RegionSpec; 8] = [
    RegionSpec { name: "rw", len: 4096, access: LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC, pd: PD },
    RegionSpec { name: "ro", len: 4096, access: LOCAL_WRITE | REMOTE_READ, pd: PD },
    RegionSpec { name: "recv", len: 4096, access: LOCAL_WRITE, pd: PD },
    RegionSpec { name: "dereg", len: 4096, access: LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ, pd: PD },
    RegionSpec { name: "sink", len: 4096, access: LOCAL_WRITE, pd: PD },
    RegionSpec { name: "src", len: 4096, access: 0, pd: PD },
    RegionSpec { name: "zb", len: 1000, access: LOCAL_WRITE | REMOTE_WRITE | ZERO_BASED, pd: PD },
    RegionSpec { name: "other_pd", len: 512, access: LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ, pd: OTHER_PD },
];
pub const RW: usize = 0;
pub const RO: usize = 1;
pub const RECV: usize = 2;
pub const DEREG: usize = 3;
pub const SINK: usize = 4;
pub const SRC: usize = 5;
pub const ZB: usize = 6;
pub const OTHER: usize = 7;

/// The STags' key byte (`MrTable::with_fixed_keys`).
const KEY: u8 = 0;
/// Guard bytes before, between and after the regions.
const GUARD: u64 = 64;
/// The sink STag of the posted Read (`SINK_TAG | 1`: it is the first WR posted).
pub const SINK_STAG: u32 = super::SINK_TAG | 1;
/// The posted Read: into region `sink` at this offset, this long, from the peer's STag 0x1234.
pub const READ_AT: u64 = 16;
pub const READ_LEN: u32 = 2000;
/// The posted receives (on the QP or the SRQ), in order: `wr_id` and SGEs as (offset into
/// region `recv`, length). `BAD_RECV_ID` goes first with [`mode::BAD_RECV`].
pub const RECEIVES: [(u64, &[(u64, u32)]); 6] = [
    (101, &[(0, 64)]),
    (102, &[(64, 1)]),
    (103, &[(128, 1000)]),
    (104, &[(1200, 16), (1300, 700)]),
    (105, &[]),
    (106, &[(2100, 1900)]),
];
pub const BAD_RECV_ID: u64 = 100;
const SEND_ID: u64 = 201;
const WRITE_ID: u64 = 202;
const READ_ID: u64 = 301;
/// wr_ids of receives posted again ([`chunk::REPOST`]) start here.
const REPOST_ID: u64 = 1000;

/// STag of region `i`.
pub const fn stag(i: usize) -> u32 {
    ((i as u32 + 1) << 8) | KEY as u32
}

/// Where region `i` starts in the arena (offset from `BASE`).
const fn offset(i: usize) -> u64 {
    let mut off = GUARD;
    let mut k = 0;
    while k < i {
        off += REGIONS[k].len + GUARD;
        k += 1;
    }
    off
}

/// Address of region `i` (its iova too, unless zero-based).
pub const fn addr(i: usize) -> u64 {
    BASE + offset(i)
}

/// What the peer addresses as byte 0 of region `i`.
pub const fn iova(i: usize) -> u64 {
    if REGIONS[i].access & ZERO_BASED != 0 {
        0
    } else {
        addr(i)
    }
}

const ARENA_LEN: u64 = offset(REGIONS.len());

/// The guard bytes: a function of the position, so a write that lands shifted shows too.
fn guard_byte(off: u64) -> u8 {
    (off as u8).wrapping_mul(7) ^ 0xa5
}

/// A region's bytes before the run.
fn fill_byte(off: u64) -> u8 {
    (off as u8).wrapping_mul(13).wrapping_add(1)
}

/// The arena before a run: guard bytes around regions of known contents (made once: the
/// fuzzer runs many inputs in one process).
fn initial_image() -> &'static [u8] {
    static IMAGE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        let mut a: Vec<u8> = (0..ARENA_LEN).map(guard_byte).collect();
        for (i, r) in REGIONS.iter().enumerate() {
            for off in offset(i)..offset(i) + r.len {
                a[off as usize] = fill_byte(off);
            }
        }
        a
    })
}

fn region_of(a: u64, len: u64) -> Option<usize> {
    (0..REGIONS.len()).find(|&i| a >= addr(i) && a.checked_add(len).is_some_and(|e| e <= addr(i) + REGIONS[i].len))
}

fn inside(ranges: &[(u64, u64)], a: u64, len: u64) -> bool {
    ranges.iter().any(|&(s, l)| a >= s && a + len <= s + l)
}

/// What the checks of [`Checked`] consult; the harness updates it between pumps.
#[derive(Default)]
struct Watch {
    /// The data path reported the QP failed.
    failed: bool,
    /// Regions deregistered.
    gone: HashSet<usize>,
    /// Posted receives not completed yet: their buffers (address, length) by `wr_id`.
    recv: BTreeMap<u64, Vec<(u64, u64)>>,
    /// The posted Read's sink, until it completes.
    sink: Vec<(u64, u64)>,
    /// The gather lists of the posted Send and Write.
    sources: Vec<(u64, u64)>,
    /// Bytes written into application memory.
    placed: u64,
}

/// The application's memory as the peer may reach it: an [`Arena`] whose every access is
/// checked against the regions' rights and the WRs posted into them.
struct Checked {
    arena: Arena,
    mrs: Arc<MrTable>,
    qp_access: u32,
    watch: StdMutex<Watch>,
}

impl Checked {
    fn region(&self, what: &str, p: &Pinned, n: usize) -> usize {
        let Some(i) = region_of(p.addr(), n as u64) else {
            panic!("{what} of {n} bytes at {:#x}: outside every registered region", p.addr());
        };
        i
    }
}

impl UserMemory for Checked {
    fn recv(&self, _: std::os::fd::RawFd, _: &Pinned, _: &mut [u8]) -> std::io::Result<usize> {
        panic!("the in-memory stream never hands a descriptor to UserMemory::recv")
    }
    fn send(&self, _: std::os::fd::RawFd, _: &[IoPart<'_>]) -> std::io::Result<usize> {
        panic!("the in-memory stream never hands a descriptor to UserMemory::send")
    }

    fn read(&self, src: &Pinned, out: &mut [u8]) {
        let n = out.len().min(src.len());
        if n == 0 {
            return;
        }
        let i = self.region("read", src, n);
        let w = self.watch.lock().unwrap();
        let (a, len) = (src.addr(), n as u64);
        let for_peer = REGIONS[i].access & REMOTE_READ != 0 && self.qp_access & REMOTE_READ != 0;
        assert!(
            !w.gone.contains(&i),
            "read of {n} bytes at {a:#x} in region {} after it was deregistered",
            REGIONS[i].name
        );
        assert!(
            (for_peer && REGIONS[i].pd == PD) || inside(&w.sources, a, len),
            "read of {n} bytes at {a:#x} in region {}: neither remotely readable nor a posted send's",
            REGIONS[i].name
        );
        drop(w);
        self.arena.read(src, out);
    }

    /// The CRC reads bytes about to be sent (what `read` may read) or bytes just placed
    /// (what `write` may write).
    fn crc32c(&self, src: &Pinned, len: usize, crc: &mut Crc32c) {
        let n = len.min(src.len());
        if n == 0 {
            return;
        }
        let i = self.region("checksum", src, n);
        let w = self.watch.lock().unwrap();
        let (a, len, name) = (src.addr(), n as u64, REGIONS[i].name);
        assert!(!w.gone.contains(&i), "checksum of {n} bytes at {a:#x} in region {name} after it was deregistered");
        let readable = REGIONS[i].access & REMOTE_READ != 0 && self.qp_access & REMOTE_READ != 0 && REGIONS[i].pd == PD;
        let writable = REGIONS[i].access & REMOTE_WRITE != 0 && REGIONS[i].pd == PD && self.qp_access & REMOTE_WRITE != 0;
        let ok = readable
            || writable
            || inside(&w.sources, a, len)
            || inside(&w.sink, a, len)
            || w.recv.values().any(|r| inside(r, a, len));
        assert!(ok, "checksum of {n} bytes at {a:#x} in region {name}: neither a posted buffer nor remotely accessible");
        drop(w);
        self.arena.crc32c(src, n, crc);
    }

    fn write(&self, dst: &Pinned, data: &[u8]) {
        let n = data.len().min(dst.len());
        if n == 0 {
            return;
        }
        let i = self.region("write", dst, n);
        let mut w = self.watch.lock().unwrap();
        let (a, len, name) = (dst.addr(), n as u64, REGIONS[i].name);
        assert!(!w.failed, "{n} bytes placed at {a:#x} in region {name} after the QP failed");
        assert!(!w.gone.contains(&i), "{n} bytes placed at {a:#x} in region {name} after it was deregistered");
        let remote = REGIONS[i].access & REMOTE_WRITE != 0 && REGIONS[i].pd == PD && self.qp_access & REMOTE_WRITE != 0;
        let ok = inside(&w.sink, a, len)
            || w.recv.values().any(|r| inside(r, a, len))
            || (remote && self.mrs.lookup_remote(stag(i)).is_some());
        assert!(ok, "{n} bytes placed at {a:#x} in region {name}: not remotely writable (rights, PD, invalidated) nor a posted buffer");
        w.placed += len;
        drop(w);
        self.arena.write(dst, data);
    }

    fn atomic(&self, dst: &Pinned, op: AtomicOperation) -> u64 {
        // What the FFI layer asserts (`ffi::user_memory`): a panic there aborts the application.
        assert!(dst.len() >= 8 && dst.addr() % 8 == 0, "atomic on an unaligned or short range at {:#x}", dst.addr());
        let i = self.region("atomic", dst, 8);
        let w = self.watch.lock().unwrap();
        let name = REGIONS[i].name;
        assert!(!w.failed, "atomic at {:#x} in region {name} after the QP failed", dst.addr());
        assert!(
            REGIONS[i].access & REMOTE_ATOMIC != 0
                && REGIONS[i].pd == PD
                && self.qp_access & REMOTE_ATOMIC != 0
                && !w.gone.contains(&i)
                && self.mrs.lookup_remote(stag(i)).is_some(),
            "atomic at {:#x} in region {name} without remote atomic rights",
            dst.addr()
        );
        drop(w);
        self.arena.atomic(dst, op)
    }
}

/// What a posted WR must complete as.
#[derive(Debug, Clone, Copy)]
struct Posted {
    /// The `ibv_wc_opcode` its completion carries (receives: either receive opcode).
    opcode: u32,
    len: u32,
    recv: bool,
    from_srq: bool,
}

/// What one run produced, for the seeds' tests.
#[derive(Debug, Default)]
pub struct Report {
    pub established: bool,
    pub fatal: Option<Fatal>,
    pub completions: Vec<Completion>,
    /// Bytes written into application memory.
    pub placed: u64,
    /// Bytes the data path sent to the peer.
    pub sent: usize,
    /// Each region's bytes at the end.
    pub regions: Vec<Vec<u8>>,
}

/// Statuses uiw's completions may carry: `uiw_wire::WcStatus` (libibverbs values).
const STATUSES: [u32; 16] = [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 19, 20, 21];

struct Harness {
    mem: Checked,
    mrs: Arc<MrTable>,
    dp: DataPath,
    scq: CqObj,
    rcq: CqObj,
    srq: Option<SrqObj>,
    peer: MemStream,
    pending: Option<Pending>,
    posted: HashMap<u64, Posted>,
    /// The scatter lists of the receives posted, by `wr_id`.
    recv_sges: HashMap<u64, Vec<Sge>>,
    /// Receive WRs completed, which [`chunk::REPOST`] posts again.
    done_recvs: Vec<RecvWqe>,
    reposts: u64,
    pump_after_fatal: bool,
    shut: bool,
    now: u64,
    /// Snapshots that must not change: the regions no peer may write (whole), and the
    /// deregistered region from its deregistration on.
    frozen: Vec<(usize, Vec<u8>)>,
    report: Report,
}

impl Harness {
    /// Runs `f` on the data path with its environment (borrowed apart from it).
    fn with<R>(&mut self, f: impl FnOnce(&mut DataPath, &Env) -> R) -> R {
        let Harness { mem, mrs, dp, scq, rcq, srq, .. } = self;
        let env = Env {
            qpn: QPN,
            pd: PD,
            sq_sig_all: false,
            qp_access: mem.qp_access,
            mrs,
            user_mem: mem,
            send_cq: scq,
            recv_cq: rcq,
            srq: srq.as_ref(),
            poller_clock: |_| None,
            poller_now: Default::default(),
            holder: None,
        };
        f(dp, &env)
    }

    fn post_recv(&mut self, wqe: RecvWqe) {
        let ranges: Vec<(u64, u64)> = wqe.sges.iter().filter(|s| s.lkey == stag(RECV)).map(|s| (s.addr, u64::from(s.length))).collect();
        let len = wqe.sges.iter().map(|s| s.length).sum();
        let from_srq = self.srq.is_some();
        self.recv_sges.insert(wqe.wr_id, wqe.sges.to_vec());
        self.posted.insert(wqe.wr_id, Posted { opcode: wc_opcode::RECV, len, recv: true, from_srq });
        self.mem.watch.lock().unwrap().recv.insert(wqe.wr_id, ranges);
        match &self.srq {
            Some(srq) => srq.inner.lock().post(wqe).expect("the SRQ has room"),
            None => assert_eq!(self.with(|dp, env| dp.post_recv(env, wqe, false)), None),
        }
    }

    fn post_send(&mut self, wqe: SendWqe, wc: u32) {
        let len = wqe.payload.len() as u32;
        self.posted.insert(wqe.wr_id, Posted { opcode: wc, len, recv: false, from_srq: false });
        let r = self.with(|dp, env| dp.post_send(env, wqe, 16, true));
        assert_eq!(r, Ok(None), "posting before the connection is up fails nothing");
    }

    /// Takes the completions out of the CQs and checks them.
    fn drain_cqs(&mut self) {
        let failed = self.mem.watch.lock().unwrap().failed;
        for (q, recv) in [(&self.scq, false), (&self.rcq, true)] {
            while let Some(c) = q.lock_q().pop() {
                assert_eq!(c.qp_num, QPN, "{c:?}");
                assert!(STATUSES.contains(&c.status), "completion with status {}: {c:?}", c.status);
                let Some(p) = self.posted.remove(&c.wr_id) else {
                    panic!("completion of a WR that is not outstanding (unknown, or completed before): {c:?}");
                };
                assert_eq!(p.recv, recv, "completion on the wrong CQ: {c:?}");
                if recv {
                    assert!(matches!(c.opcode, wc_opcode::RECV | wc_opcode::RECV_RDMA_WITH_IMM), "{c:?}");
                } else {
                    assert_eq!(c.opcode, p.opcode, "{c:?}");
                }
                if c.status == wc_status::SUCCESS {
                    assert!(c.byte_len <= p.len, "{} bytes completed of {} posted: {c:?}", c.byte_len, p.len);
                    assert!(!(failed && (recv || p.opcode == wc_opcode::RDMA_READ)), "placement completed after the QP failed: {c:?}");
                }
                let mut w = self.mem.watch.lock().unwrap();
                if recv {
                    w.recv.remove(&c.wr_id);
                } else if c.wr_id == READ_ID {
                    w.sink.clear();
                }
                drop(w);
                if recv && c.wr_id != BAD_RECV_ID {
                    let sges = self.recv_sges[&c.wr_id].clone();
                    self.done_recvs.push(RecvWqe { wr_id: c.wr_id, sges: sges.into() });
                }
                self.report.completions.push(c);
            }
        }
    }

    /// Guard bytes and regions that must not change.
    fn check_memory(&self) {
        let m = self.mem.arena.0.lock().unwrap();
        let image = initial_image();
        for start in std::iter::once(0).chain((0..REGIONS.len()).map(|i| offset(i) + REGIONS[i].len)) {
            let g = start as usize..(start + GUARD) as usize;
            if m[g.clone()] != image[g.clone()] {
                let at = g.clone().find(|&o| m[o] != image[o]).unwrap();
                panic!("guard byte at {:#x} overwritten", BASE + at as u64);
            }
        }
        for (i, snap) in &self.frozen {
            let o = offset(*i) as usize;
            assert!(m[o..o + snap.len()] == snap[..], "region {} changed though no peer may write it", REGIONS[*i].name);
        }
    }

    /// After every pump: what went out, completions, memory.
    fn after_pump(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.peer.recv(&mut buf) {
            if n == 0 {
                break;
            }
            self.report.sent += n;
        }
        self.drain_cqs();
        self.check_memory();
    }

    fn failed(&mut self, f: Fatal) {
        self.report.fatal.get_or_insert(f);
        self.mem.watch.lock().unwrap().failed = true;
        if !self.pump_after_fatal {
            self.shutdown();
        }
    }

    /// The QP goes to ERROR (`Qp::stop_locked`): the stream closes, every WR completes.
    fn shutdown(&mut self) {
        if self.shut {
            return;
        }
        self.shut = true;
        self.mem.watch.lock().unwrap().failed = true;
        let _ = self.with(|dp, env| dp.shutdown(env, true));
        self.pending = None;
        self.after_pump();
    }

    /// Serves the stream after the peer's bytes arrived (or a deadline passed).
    fn serve(&mut self) {
        if self.shut {
            return;
        }
        if let Some(p) = self.pending.as_mut() {
            match p.read_request() {
                None => return,
                Some(Err(())) => {
                    // The listener drops such a stream; the QP never sees it (its WRs stay
                    // posted until the end of the run flushes them).
                    self.pending = None;
                    return;
                }
                Some(Ok(_)) => {
                    let mut p = self.pending.take().unwrap();
                    if p.conn.accept(4, 4, b"fuzz", self.now).is_err() {
                        return;
                    }
                    self.dp.link = Some(Link::new(p.conn, p.stream));
                }
            }
        }
        for _ in 0..1_000_000 {
            let before = self.peer.unread_by_peer();
            let (more, fatal) = self.with(|dp, env| dp.pump(env));
            self.report.established |= self.dp.established();
            self.after_pump();
            if let Some(f) = fatal {
                self.failed(f);
                if self.shut {
                    return;
                }
            }
            // The in-memory stream reads short whatever is queued: pump while bytes go.
            if !more && self.peer.unread_by_peer() >= before {
                return;
            }
        }
        panic!("the data path kept pumping without an end");
    }

    /// A deadline passes, as `Qp::handle_timeout` sees it.
    fn tick(&mut self) {
        if self.shut {
            return;
        }
        let Some(l) = self.dp.link.as_mut() else { return };
        let Some(d) = l.conn.poll_timeout() else { return };
        self.now = self.now.max(d);
        l.conn.handle_timeout(self.now);
        let f = self.with(|dp, env| dp.drain_events(env));
        self.after_pump();
        match f {
            Some(f) => self.failed(f),
            None => self.serve(),
        }
    }

    fn repost(&mut self) {
        if self.shut || self.done_recvs.is_empty() {
            return;
        }
        let mut w = self.done_recvs.remove(0);
        self.reposts += 1;
        w.wr_id = REPOST_ID + self.reposts;
        if self.srq.is_none() {
            // What `Qp::post_recv` does in ERROR: no WR reaches a failed QP's data path.
            if self.mem.watch.lock().unwrap().failed {
                return;
            }
        }
        self.post_recv(w);
        self.serve();
    }

    fn deregister(&mut self, i: usize) {
        assert!(self.mrs.deregister(stag(i)).is_some());
        self.mem.watch.lock().unwrap().gone.insert(i);
        let o = offset(i);
        self.frozen.push((i, self.mem.arena.get(BASE + o, REGIONS[i].len as usize)));
    }

    /// The end of the input: the QP is destroyed; every WR has completed exactly once (those
    /// an SRQ holds, taken or not, are back in it).
    fn finish(mut self) -> Report {
        self.shutdown();
        let in_srq = self.srq.as_ref().map_or(0, |s| s.inner.lock().len());
        let left: Vec<(&u64, &Posted)> = self.posted.iter().filter(|(_, p)| !p.from_srq).collect();
        assert!(left.is_empty(), "WRs never completed: {left:?}");
        let srq_left = self.posted.values().filter(|p| p.from_srq).count();
        assert_eq!(srq_left, in_srq, "receives of the SRQ neither completed nor given back");
        self.report.placed = self.mem.watch.lock().unwrap().placed;
        self.report.regions = (0..REGIONS.len()).map(|i| self.mem.arena.get(addr(i), REGIONS[i].len as usize)).collect();
        self.report
    }
}

fn recv_sges(wr_id: u64) -> Vec<Sge> {
    RECEIVES
        .iter()
        .find(|(id, _)| *id == wr_id)
        .map(|(_, s)| s.iter().map(|&(o, l)| Sge { addr: addr(RECV) + o, length: l, lkey: stag(RECV) }).collect())
        .unwrap_or_default()
}

fn send_wqe(wr_id: u64, op: u32, sges: Vec<Sge>, remote_addr: u64, rkey: u32) -> SendWqe {
    SendWqe {
        wr_id,
        opcode: op,
        flags: send_flags::SIGNALED,
        payload: Payload::Sges(sges.into()),
        remote_addr,
        rkey,
        imm_or_inv: 0,
        compare_add: 0,
        swap: 0,
    }
}

/// The MPA frame the harness writes first with [`mode::PREFIX`].
fn prefix(initiator_dp: bool, crc: bool, ext: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let io = Some(IrdOrd { ird: 4, ord: 4, ..Default::default() });
    let flags = if crc { FLAG_CRC } else { 0 };
    if initiator_dp {
        encode_rr(FrameKind::Reply, flags | if ext { FLAG_UIW_EXT_ACK } else { 0 }, 2, io, b"peer", &mut out);
    } else {
        encode_rr(FrameKind::Request, flags | if ext { FLAG_UIW_EXT } else { 0 }, 2, io, b"peer", &mut out);
    }
    out
}

/// One run: see the module documentation.
pub fn run(data: &[u8]) -> Report {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let (m, dereg_at, o) = (byte(0), byte(1), byte(2));
    let input = data.get(3..).unwrap_or(&[]);

    // Memory: guard bytes around regions of known contents, registered in a fixed order.
    let arena = Arena::with(initial_image().to_vec());
    let mrs = Arc::new(MrTable::with_fixed_keys(16, KEY));
    for (i, r) in REGIONS.iter().enumerate() {
        let mr = mrs.register(r.pd, addr(i), r.len, addr(i), r.access).expect("the harness's regions register");
        assert_eq!(mr.stag, stag(i));
    }
    let mut qp_access = REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
    for (bit, right) in [(opts::NO_QP_WRITE, REMOTE_WRITE), (opts::NO_QP_READ, REMOTE_READ), (opts::NO_QP_ATOMIC, REMOTE_ATOMIC)] {
        if o & bit != 0 {
            qp_access &= !right;
        }
    }

    // The stream: the data path's end, and the peer's, which this harness writes.
    let initiator = m & mode::INITIATOR != 0;
    let crc = m & mode::CRC != 0;
    let (ours, peer) = memory::pair(opts::MAX_IO[usize::from(o & opts::MAX_IO_MASK)], 1 << 20);
    let mss = ours.mss();
    let role = if initiator { Role::Initiator } else { Role::Responder };
    let mut cfg = config(role, 4, 4, b"uiw".to_vec(), mss);
    cfg.crc = crc;
    cfg.first_fpdu_hold_ms = 0;
    let conn = Connection::new(cfg, 0);
    let (link, pending) = if initiator {
        (Some(Link::new(conn, Box::new(ours))), None)
    } else {
        (None, Some(Pending::new(conn, Box::new(ours))))
    };
    let srq = (m & mode::SRQ != 0).then(|| {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let unread = b.try_clone().unwrap();
        let mut s = Srq::new(64, 4);
        s.limit = 3;
        SrqObj {
            handle: AtomicU64::new(0),
            pd: PD,
            inner: Mutex::new(s),
            async_sink: Arc::new(EventQueue::new(a, unread, 16)),
            async_events_reported: AtomicU32::new(0),
            users: AtomicU32::new(1),
            qps: Mutex::new(Vec::new()),
        }
    });
    let frozen = [RO, SRC, OTHER].iter().map(|&i| (i, arena.get(addr(i), REGIONS[i].len as usize))).collect();
    let mut h = Harness {
        mem: Checked { arena, mrs: mrs.clone(), qp_access, watch: StdMutex::new(Watch::default()) },
        mrs,
        dp: DataPath { link, ..DataPath::default() },
        scq: cq(),
        rcq: cq(),
        srq,
        peer,
        pending,
        posted: HashMap::new(),
        recv_sges: HashMap::new(),
        done_recvs: Vec::new(),
        reposts: 0,
        pump_after_fatal: m & mode::PUMP_AFTER_FATAL != 0,
        shut: false,
        now: 0,
        frozen,
        report: Report::default(),
    };

    // Work requests, the Read first (its sink STag is then SINK_STAG).
    if m & mode::READ != 0 {
        let sges = vec![
            Sge { addr: addr(SINK) + READ_AT, length: 1000, lkey: stag(SINK) },
            Sge { addr: addr(SINK) + 2048, length: READ_LEN - 1000, lkey: stag(SINK) },
        ];
        let ranges = sges.iter().map(|s| (s.addr, u64::from(s.length))).collect();
        h.mem.watch.lock().unwrap().sink = ranges;
        h.post_send(send_wqe(READ_ID, opcode::RDMA_READ, sges, 0x4000, 0x1234), wc_opcode::RDMA_READ);
    }
    if m & mode::SEND != 0 {
        let send = Sge { addr: addr(SRC), length: 100, lkey: stag(SRC) };
        let write = Sge { addr: addr(SRC) + 100, length: 700, lkey: stag(SRC) };
        h.mem.watch.lock().unwrap().sources = vec![(send.addr, 100), (write.addr, 700)];
        h.post_send(send_wqe(SEND_ID, opcode::SEND, vec![send], 0, 0), wc_opcode::SEND);
        h.post_send(send_wqe(WRITE_ID, opcode::RDMA_WRITE, vec![write], 0x8000, 0x4321), wc_opcode::RDMA_WRITE);
    }
    if m & mode::BAD_RECV != 0 {
        h.post_recv(RecvWqe { wr_id: BAD_RECV_ID, sges: smallvec::smallvec![Sge { addr: addr(RECV), length: 64, lkey: 0xdead_0000 }] });
    }
    for (id, _) in RECEIVES {
        h.post_recv(RecvWqe { wr_id: id, sges: recv_sges(id).into() });
    }

    if m & mode::PREFIX != 0 {
        feed(&mut h, &prefix(initiator, crc, o & opts::EXTENSIONS != 0));
    }
    h.serve();

    let mut rest = input;
    let mut n = 0u32;
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if n == u32::from(dereg_at) {
            h.deregister(DEREG);
        }
        n += 1;
        match b {
            chunk::TICK => h.tick(),
            chunk::REPOST => h.repost(),
            chunk::PUMP => h.serve(),
            chunk::FIN => {
                h.peer.shutdown_write();
                if let Some(l) = h.dp.link.as_mut() {
                    // The progress thread's EPOLLRDHUP.
                    l.peer_hup = true;
                }
                h.serve();
            }
            _ => {
                let len = if b < 0x80 { usize::from(b) } else { usize::from(b - 0x7f) * 64 };
                let (now, later) = rest.split_at(len.min(rest.len()));
                rest = later;
                feed(&mut h, now);
            }
        }
    }
    h.finish()
}

/// The peer's bytes into the stream (what does not fit in its buffer is lost, as if the
/// peer gave up), then the data path is served.
fn feed(h: &mut Harness, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match h.peer.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(_) => break,
        }
    }
    h.serve();
}

#[cfg(test)]
mod tests;
