//! The data path of one QP: its posted work requests, and the stream that carries them
//! (a `transport::Stream`: the kernel's TCP, or uiw's own on raw frames) through the sans-IO
//! protocol core (`uiw_wire::conn::Connection`). The data path holds no descriptor: it moves
//! bytes through the `Stream` it is given, which is what lets `tests.rs` drive it with an
//! in-memory stream (the clock it reads for the first-FPDU hold is the engine's
//! `transport::now_ms`).
//!
//! Transmit is zero-copy over the kernel's TCP: FPDU headers and trailers are the engine's,
//! payload goes to `sendmsg` straight from registered memory. Receive places payload straight
//! into registered memory with `readv` (what follows the payload lands in a small staging
//! buffer, so a stream of small messages costs one system call per batch). Completions follow the verbs rules: a send
//! queue completion is released only once its last byte has been handed to TCP — and a lone
//! RDMA Write's, while a thread polls for it, once the peer answered or a bound passed
//! (`answer`; the clock is the poller's, asked through `Env::poller_clock`).

use std::collections::VecDeque;

use uiw_wire::conn::{Completion as WireCompletion, Connection, Event, Failure, SendFlags, State as ConnState, Tx, WcOpcode};
use uiw_wire::placement::{Access, Memory, Placement};
use uiw_wire::rdmap::AtomicOperation;
use uiw_wire::segment::Trailer;
use uiw_wire::{PostError as WirePostError, TaggedError, WcStatus};

use super::access;
use super::cq::{wc_flags, wc_opcode, wc_status, Completion, CqObj};
use super::mr::{AccessError, MrHint, MrTable, Pinned, Span};
use super::srq::SrqObj;
pub use super::transport::Closing;
use super::transport::Stream;
use super::user_memory::UserMemory;
use super::wr::{opcode, send_flags, Payload, PostError, RecvWqe, SendWqe, Sge};

mod answer;
mod rx;
mod tx;
mod wr_table;

use tx::Piece;
pub use wr_table::WrTable;

/// STags of the engine's own Read/Atomic sinks (a Read's local SGE list, an atomic's result
/// buffer): never valid for a peer, which only ever names registered regions (whose STags
/// stay below, see `mr::MAX_INDEX`). The low 24 bits are those of the WR's id on the send
/// queue ([`sink_of`]).
const SINK_TAG: u32 = 0xff00_0000;
/// The bits of a sink STag that come from its WR's id.
const SINK_ID_BITS: u32 = 0x00ff_ffff;

/// Whether `stag` is of the engine's own sinks' (one outstanding or not).
fn is_sink_tag(stag: u32) -> bool {
    stag & !SINK_ID_BITS == SINK_TAG
}

/// The outstanding Read or atomic whose sink `stag` names, found by the id its STag ends
/// with: a send queue spans fewer WRs than 2^24.
fn sink_of(sq: &WrTable<SendEntry>, stag: u32) -> Option<&SendEntry> {
    if !is_sink_tag(stag) {
        return None;
    }
    let id = sq.id_ending(u64::from(stag & SINK_ID_BITS), u64::from(SINK_ID_BITS))?;
    sq.get(id).filter(|e| e.sink == Some(stag))
}

/// Below this, payload is staged and copied; above, it is received straight into place. A
/// receive syscall costs more than copying a few KiB: payload received in place takes one
/// syscall per FPDU, while a staging read takes many small FPDUs at once.
const DIRECT_MIN: usize = 8 * 1024;
/// Bytes read after a payload received in place (its trailer and the next header).
const DIRECT_TAIL: usize = 64;
/// Size of the receive staging buffer on a link whose FPDUs are large (MSS ≥ [`DIRECT_MIN`]:
/// loopback, jumbo frames): a read at an FPDU's header pulls at most this much of its payload
/// through the copy before the rest is received in place.
const STAGE: usize = 16 * 1024;
/// Size of the receive staging buffer on a link whose FPDUs are small (an MSS below
/// [`DIRECT_MIN`]: Ethernet's 1500-byte MTU): every payload is staged, so one read takes
/// dozens of FPDUs. Received in place, each 1448-byte FPDU cost a syscall of its own: uiw
/// moved 64 KiB Writes across a veth at 0.21 GB/s against 1.5 GB/s this way (raw TCP: 1.7).
const STAGE_SMALL_SEGMENTS: usize = 64 * 1024;
/// Emptied transmit buffers a link keeps for reuse (see `Link::spare`): as many as one
/// `sendmsg` takes pieces, and at most this many bytes of them.
const SPARE_BYTES: usize = 128 << 10;
/// The capacity a new engine-owned run starts with (it grows as FPDUs are appended).
const OWN_RUN_MIN: usize = 1024;
/// Transmit backlog limits (pieces of one `sendmsg`, and bytes queued ahead of the socket).
const TX_PIECES: usize = 48;
const TX_BYTES: u64 = 1 << 20;
/// Payload up to this size is copied into the backlog with its header and trailer instead of
/// being sent from registered memory: an iovec entry and a pin cost more than the copy, and
/// consecutive small FPDUs then leave as one contiguous run (one `sendmsg` entry for many
/// messages).
const TX_COPY_MAX: usize = 512;
// Largest FPDU trailer (pad and CRC field): the room a frame keeps for `Trailer::put_at`.
use uiw_wire::segment::TRAILER_MAX;
/// Largest run of engine-owned bytes one backlog piece grows to.
const TX_RUN_MAX: usize = 64 << 10;
/// Bytes sent between two looks at the stream's MSS ([`Link::follow_mss`]): one
/// `getsockopt` per quarter MiB.
const MSS_RECHECK: u64 = 256 << 10;
/// Bytes one pump may receive before the QP is let go (other QPs get their turn, a thread
/// posting to this QP gets in): about 50 µs of copying.
pub const RX_BUDGET: usize = 256 << 10;

/// A WR's scatter/gather list resolved to registered memory: one run per element, inline for
/// the usual one or two (see `wr::SgeList`).
pub type Runs = smallvec::SmallVec<[Span; 2]>;

/// A posted send-queue WR and where its bytes are.
#[derive(Debug)]
pub struct SendEntry {
    pub wqe: SendWqe,
    /// The gather list resolved to memory (Read: the sink; atomics: the result buffer).
    pub runs: Runs,
    /// Handed to the protocol core.
    pub fed: bool,
    /// The sink STag of a Read or atomic.
    pub sink: Option<u32>,
}

/// A posted receive WR. Its SGEs are checked against registered memory as bytes arrive for
/// them (see [`DataPath::post_recv`]).
#[derive(Debug)]
pub struct RecvEntry {
    pub wqe: RecvWqe,
    /// Bytes the scatter list declares (what the core may place into it).
    pub len: u32,
    /// The protection domain its lkeys belong to (the QP's, or its SRQ's).
    pub pd: u32,
    pub fed: bool,
    /// Taken from the QP's SRQ (given back, not flushed, if the QP fails before using it).
    pub from_srq: bool,
}

/// What a QP's data path needs from its surroundings.
pub struct Env<'a> {
    pub qpn: u32,
    pub pd: u32,
    pub sq_sig_all: bool,
    pub qp_access: u32,
    pub mrs: &'a MrTable,
    pub user_mem: &'a dyn UserMemory,
    pub send_cq: &'a CqObj,
    pub recv_cq: &'a CqObj,
    pub srq: Option<&'a SrqObj>,
    /// Asked of `send_cq` when a completion may wait for the peer's answer (see `answer`): the
    /// engine clock (µs) if a thread polls the CQ for completions and it is not armed for an
    /// event, else `None` (`CqObj::poller_clock`; asked only then, being a clock read and a
    /// lock: not on every pump of a stream of small messages).
    pub poller_clock: fn(&CqObj) -> Option<u64>,
    /// `poller_clock`'s answer, once asked: one reading per `Env`, which lives for one post
    /// or one pump (a lone Write's post asked it up to four times: a clock read and a CQ lock
    /// each, on the path of `ib_write_lat`'s every message).
    pub poller_now: std::cell::Cell<Option<Option<u64>>>,
    /// The QP, told when a transmit pass goes on past a `sendmsg` ([`Holder`]); `None` in
    /// tests.
    pub holder: Option<&'a dyn Holder>,
}

/// What the data path tells its QP while one call of it works for long.
pub trait Holder {
    /// A transmit pass sent and goes on sending (an MPI rank's poll that answers 64 Read
    /// Requests of 1 MiB sends for 13 ms in one pass): the thread that holds the QP is still
    /// serving it, as a poll would (see `lease`: it keeps the QP and the lease alarm away).
    fn still_sending(&self);
}

impl Env<'_> {
    /// [`Env::poller_clock`] of the send CQ, read once per `Env`.
    pub fn poller_clock_now(&self) -> Option<u64> {
        if let Some(now) = self.poller_now.get() {
            return now;
        }
        let now = (self.poller_clock)(self.send_cq);
        self.poller_now.set(Some(now));
        now
    }
}

/// Why a QP's data path stopped: the QP goes to ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fatal {
    /// A Terminate was sent or received.
    Terminated,
    /// The stream failed or the peer went away (reset, broken, protocol failure).
    Lost,
    /// The peer closed its stream in order (a FIN: rdma_disconnect, or its process ended
    /// normally): the connection ends cleanly — rdma_cm reports DISCONNECTED with status
    /// 0, as iw_cm does for a graceful close — though the QP still goes to ERROR.
    Closed,
    /// The MPA Request was rejected.
    Rejected,
    /// A WR failed locally (bad lkey, operation the peer did not negotiate).
    LocalError,
}


/// One stream (see `transport::Stream`) carrying one QP's traffic.
pub struct Link {
    pub conn: Connection,
    pub stream: Box<dyn Stream>,
    pub established: bool,
    tx: VecDeque<Piece>,
    /// Bytes of `tx.front()` already sent.
    tx_skip: usize,
    tx_queued: u64,
    tx_sent: u64,
    /// `tx_sent` when the stream's MSS was last read ([`Link::follow_mss`]).
    mss_checked_at: u64,
    /// Send-queue completions waiting until `tx_sent` reaches their mark (and the first one,
    /// a lone RDMA Write's, maybe for the peer's answer: `answer`).
    held: VecDeque<(u64, Completion)>,
    answer: answer::AnswerWait,
    /// Whether the progress thread paces the stream's wake-ups (see `engine::pace`).
    pub pace: crate::engine::pace::Pace,
    /// Engine-owned buffers sent and emptied, for the next pieces: a stream of small
    /// messages queues one run (or a small payload's copy) per message, and a fresh 4 KiB
    /// allocation for each was 6 % of a 64-byte `ib_send_bw` requester in `malloc`/`free`.
    /// A batch that alternates headers with payload sent from registered memory (an SPDK
    /// target's 4 KiB Writes, each with its response Send) takes a run per message: with
    /// four spares, a `malloc` and a `free` per message were left.
    spare: Vec<Vec<u8>>,
    /// The capacity of the buffers in `spare`.
    spare_bytes: usize,
    stage: Box<[u8]>,
    st_lo: usize,
    st_hi: usize,
    /// The peer hung up (FIN or reset reported with the last readiness): read on past a short
    /// read, until the end of the stream is seen.
    pub peer_hup: bool,
    /// The peer's FIN was read: nothing more arrives (see [`DataPath::pump`]).
    pub peer_eof: bool,
    /// This pump's last read came back short: the socket is empty, and any later arrival
    /// raises a new (edge-triggered) event — no read that would only say EAGAIN.
    drained: bool,
    /// The stream's last send said `WouldBlock` (its buffer is full) and nothing went since:
    /// until the peer reads, or the progress thread sees the socket take bytes again
    /// ([`DataPath::writable`]), a thread that polls the QP can do nothing for its sends (see
    /// `CqObj::drive`).
    tx_blocked: bool,
    /// The wire core's counters as last published to the QP's statistics (`stats::QpStats::sync`).
    pub stats_seen: uiw_wire::conn::Counters,
    /// Bytes queued by [`DataPath::post_direct`] that no `sendmsg` was offered yet (a chain's
    /// FPDUs before its doorbell): the backlog beyond them is what the stream did not take
    /// ([`Link::backed_up`]).
    unrung: u64,
    /// Messages sent by `DataPath::post_direct` and `post_lone_read` (for the tests that
    /// compare them with the general path).
    #[cfg(test)]
    pub(super) direct_sent: u64,
}

impl Link {
    pub fn new(conn: Connection, stream: Box<dyn Stream>) -> Link {
        let stage = if stream.mss() < DIRECT_MIN { STAGE_SMALL_SEGMENTS } else { STAGE };
        Link {
            conn,
            stream,
            established: false,
            tx: VecDeque::new(),
            tx_skip: 0,
            tx_queued: 0,
            tx_sent: 0,
            mss_checked_at: 0,
            held: VecDeque::new(),
            answer: Default::default(),
            pace: Default::default(),
            spare: Vec::new(),
            spare_bytes: 0,
            stage: vec![0u8; stage].into_boxed_slice(),
            st_lo: 0,
            st_hi: 0,
            peer_hup: false,
            peer_eof: false,
            drained: false,
            tx_blocked: false,
            stats_seen: Default::default(),
            unrung: 0,
            #[cfg(test)]
            direct_sent: 0,
        }
    }

    /// Every [`MSS_RECHECK`] bytes sent, reads the stream's MSS again and has the protocol
    /// core size the FPDUs of messages it starts from then on by it (`Connection::set_mss`,
    /// RFC 5044 §4.1: MULPDU follows the current EMSS). A kernel TCP connection's MSS grows
    /// as the peer's window opens — on loopback from 32 KiB at the handshake to 64 KiB once
    /// data flowed —, and FPDUs twice as large halve the per-FPDU work on both sides: 1 MiB
    /// `ib_write_bw` 7.34-7.63 against 6.06-6.59 GB/s, `ib_read_bw` 6.77-6.79 against
    /// 5.69-6.64 (interleaved runs with the MSS forced to 64 KiB).
    fn follow_mss(&mut self) {
        if self.tx_sent < self.mss_checked_at + MSS_RECHECK {
            return;
        }
        self.mss_checked_at = self.tx_sent;
        self.conn.set_mss(self.stream.mss());
    }

    /// Successful send completions held until their bytes leave: flushed if the stream closes
    /// first (see `DataPath::shutdown`).
    pub fn held_successes(&self) -> usize {
        self.held.iter().filter(|(mark, c)| c.status == wc_status::SUCCESS && *mark > self.tx_sent).count()
    }

    /// Whether a lone RDMA Write's completion waits for the peer's answer (its poller should
    /// hold the QP and read the stream itself: see `answer`).
    pub fn awaits_answer(&self) -> bool {
        self.answer.waiting()
    }

    /// Whether a wait for an answer ended without one since the last call (see `answer`).
    pub fn answer_gave_up(&mut self) -> bool {
        self.answer.take_gave_up()
    }

    /// Queues application memory to be sent from where it is.
    fn push_user(&mut self, s: Span) {
        self.tx_queued += s.len();
        if s.len() > 0 {
            self.tx.push_back(Piece::User(s));
        }
    }

    /// Queues engine-owned bytes, appended to the last piece when that is engine-owned too
    /// (headers, trailers and small payloads of consecutive FPDUs form one run).
    fn push_bytes(&mut self, b: &[u8]) {
        self.tx_queued += b.len() as u64;
        if b.is_empty() {
            return;
        }
        if let Some(Piece::Own(v)) = self.tx.back_mut() {
            if v.len() + b.len() <= TX_RUN_MAX {
                v.extend_from_slice(b);
                return;
            }
        }
        let mut v = self.buffer(b.len().max(OWN_RUN_MIN).min(TX_RUN_MAX));
        v.extend_from_slice(b);
        self.tx.push_back(Piece::Own(v));
    }

    /// Queues one FPDU framed in place: `header`, then `n` payload bytes that `fill` writes
    /// (into zeroed memory) and whose trailer (pad and CRC field) it returns. Nothing is queued
    /// if `fill` fails.
    fn push_framed<E>(&mut self, header: &[u8], n: usize, fill: impl FnOnce(&mut [u8]) -> Result<Trailer, E>) -> Result<(), E> {
        let most = header.len() + n + TRAILER_MAX;
        if !matches!(self.tx.back(), Some(Piece::Own(v)) if v.len() + most <= TX_RUN_MAX) {
            let v = self.buffer(most.max(OWN_RUN_MIN).min(TX_RUN_MAX));
            self.tx.push_back(Piece::Own(v));
        }
        let Some(Piece::Own(v)) = self.tx.back_mut() else { unreachable!("an engine-owned run was just ensured") };
        let start = v.len();
        v.extend_from_slice(header);
        v.resize(start + header.len() + n, 0);
        match fill(&mut v[start + header.len()..]) {
            Ok(trailer) => {
                v.extend_from_slice(trailer.as_slice());
                self.tx_queued += (v.len() - start) as u64;
                Ok(())
            }
            Err(e) => {
                v.truncate(start);
                if v.is_empty() {
                    if let Some(Piece::Own(v)) = self.tx.pop_back() {
                        self.recycle(v);
                    }
                }
                Err(e)
            }
        }
    }

    /// An empty engine-owned buffer, a spare one if there is one.
    fn buffer(&mut self, capacity: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(v) => {
                self.spare_bytes -= v.capacity();
                v
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// Keeps a buffer whose bytes were sent (or copied on) for [`Link::buffer`]: up to
    /// [`TX_PIECES`] of them and [`SPARE_BYTES`] in all, none larger than a backlog run.
    fn recycle(&mut self, mut v: Vec<u8>) {
        let cap = v.capacity();
        if self.spare.len() < TX_PIECES && cap <= TX_RUN_MAX && self.spare_bytes + cap <= SPARE_BYTES {
            v.clear();
            self.spare_bytes += cap;
            self.spare.push(v);
        }
    }

    fn backlog(&self) -> u64 {
        self.tx_queued - self.tx_sent
    }

    /// Whether bytes offered to the stream are still waiting for it (it did not take them
    /// all): a doorbell then leaves the sending to the stream's room.
    fn backed_up(&self) -> bool {
        self.backlog() > self.unrung
    }
}

/// A QP's work requests and its stream.
#[derive(Default)]
pub struct DataPath {
    pub sq: WrTable<SendEntry>,
    pub rq: WrTable<RecvEntry>,
    pub link: Option<Link>,
    /// Connection-level news for connection management (rdma_cm).
    pub notices: Vec<Notice>,
    /// The regions the QP addressed last (see [`MrHint`]): through a peer's STag (its
    /// Writes, Reads and atomics), and through an lkey of its own work requests — two, so
    /// that a ping-pong whose messages come into one region and go out of another finds both.
    remote_hint: MrHint,
    local_hint: MrHint,
    /// The region a Send's payload was placed into last (a receive's SGE): receive buffers
    /// are often a region of their own, which the send side's hint would keep trading for
    /// its own.
    recv_hint: MrHint,
    /// Every WR takes the general path (the tests' reference for `post_direct`).
    #[cfg(test)]
    pub(super) general_only: bool,
}

/// What the stream's negotiation produced, for rdma_cm.
#[derive(Debug)]
pub enum Notice {
    Established(uiw_wire::conn::Negotiated),
    Rejected(Vec<u8>),
}

impl std::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPath").field("sq", &self.sq.len()).field("rq", &self.rq.len()).field("link", &self.link.is_some()).finish()
    }
}

/// Resolves an SGE list against registered memory with the rights `needed` (local read is
/// always granted). Zero-length SGEs are skipped, as the kernel's providers do.
pub fn resolve(mrs: &MrTable, hint: &MrHint, pd: u32, sges: &[Sge], needed: u32) -> Result<Runs, AccessError> {
    let mut runs = Runs::new();
    for s in sges.iter().filter(|s| s.length > 0) {
        let mr = hint.lookup(mrs, s.lkey).ok_or(AccessError::InvalidStag)?;
        runs.push(mr.span(pd, s.addr, u64::from(s.length), needed)?);
    }
    Ok(runs)
}

/// The run of `runs` that holds byte `offset` of their concatenation, and where in it.
fn run_ref_at(runs: &[Span], mut offset: u64) -> Option<(&Span, u64)> {
    for r in runs {
        if offset < r.len() {
            return Some((r, offset));
        }
        offset -= r.len();
    }
    None
}

fn total(runs: &[Span]) -> u64 {
    runs.iter().map(Span::len).sum()
}

/// The protocol core's view of this QP's memory.
struct Mem<'a> {
    mrs: &'a MrTable,
    hint: &'a MrHint,
    pd: u32,
    qp_access: u32,
    user_mem: &'a dyn UserMemory,
    sq: &'a WrTable<SendEntry>,
}

fn tagged_error(e: AccessError) -> TaggedError {
    match e {
        AccessError::InvalidStag => TaggedError::InvalidStag,
        AccessError::PdMismatch => TaggedError::StagNotAssociated,
        AccessError::BaseBounds => TaggedError::BaseBounds,
        AccessError::AccessRights => TaggedError::AccessRights,
    }
}

impl Memory for Mem<'_> {
    /// RFC 5041 §7.2 / RFC 5040 §7.1: STag, protection domain, bounds, rights of the region and
    /// of the QP (`qp_access_flags`), and 64-bit alignment of an atomic's target address (RFC
    /// 7306 §5.2.1; §8.2's Terminate code comes with `TaggedError::Misaligned`).
    fn check_tagged(&self, stag: u32, to: u64, len: u32, acc: Access) -> Result<(), TaggedError> {
        let needed = match acc {
            Access::LocalWrite => {
                let e = sink_of(self.sq, stag).ok_or(TaggedError::InvalidStag)?;
                let end = to.checked_add(u64::from(len)).ok_or(TaggedError::ToWrap)?;
                return if end <= total(&e.runs) { Ok(()) } else { Err(TaggedError::BaseBounds) };
            }
            Access::RemoteWrite => access::REMOTE_WRITE,
            Access::RemoteRead => access::REMOTE_READ,
            Access::RemoteAtomic => access::REMOTE_ATOMIC,
        };
        let addr = self.hint.check_remote(self.mrs, stag, self.pd, to, u64::from(len), needed).map_err(tagged_error)?.ok_or(TaggedError::InvalidStag)?;
        if self.qp_access & needed == 0 {
            return Err(TaggedError::AccessRights);
        }
        // RFC 7306 §5.2.1: an atomic's target is 64-bit aligned in this process's memory
        // (§8.2 for the Terminate when it is not).
        if acc == Access::RemoteAtomic && addr & 7 != 0 {
            return Err(TaggedError::Misaligned);
        }
        Ok(())
    }

    fn invalidate(&mut self, stag: u32) -> Result<(), TaggedError> {
        if self.mrs.invalidate(stag, self.pd) {
            Ok(())
        } else {
            Err(TaggedError::InvalidStag)
        }
    }

    /// The region may have gone since the check: then the peer gets a Terminate, never a
    /// made-up original value.
    fn atomic(&mut self, stag: u32, to: u64, op: AtomicOperation) -> Result<u64, TaggedError> {
        let mr = self.hint.lookup_remote(self.mrs, stag).ok_or(TaggedError::InvalidStag)?;
        let span = mr.span(self.pd, to, 8, access::REMOTE_ATOMIC).map_err(tagged_error)?;
        let p = span.pin().ok_or(TaggedError::InvalidStag)?;
        Ok(self.user_mem.atomic(&p, op))
    }
}

/// Where received payload goes (the rest of the run it starts in), or `None` to drop it.
/// `hint`: for a peer's STags; `recv_hint`: for a receive's lkeys.
fn place_at<'a>(
    place: Placement,
    mrs: &'a MrTable,
    hint: &MrHint,
    recv_hint: &'a MrHint,
    sq: &'a WrTable<SendEntry>,
    rq: &'a WrTable<RecvEntry>,
) -> Option<Dst<'a>> {
    match place {
        Placement::Tagged { stag, to } => {
            if is_sink_tag(stag) {
                return Dst::run_at(&sink_of(sq, stag)?.runs, to);
            }
            hint.lookup(mrs, stag)?.span_from(to).map(Dst::Region)
        }
        Placement::Recv { wr_id, offset } => {
            let e = rq.get(wr_id)?;
            let mut at = u64::from(offset);
            for s in e.wqe.sges.iter().filter(|s| s.length > 0) {
                let len = u64::from(s.length);
                if at < len {
                    return Some(Dst::Sge { hint: recv_hint, mrs, pd: e.pd, lkey: s.lkey, addr: s.addr.checked_add(at)?, len: len - at });
                }
                at -= len;
            }
            None
        }
        Placement::Discard => None,
    }
}

/// Where received payload goes ([`place_at`]): a span of a region of its own (what a peer's
/// Write names), the rest of a run of a Read's memory, borrowed from the request, or the rest
/// of a receive's SGE, whose region is found through a hint as bytes arrive: placing into
/// either takes no reference to the region (a locked increment and decrement on every
/// message received).
enum Dst<'a> {
    Region(Span),
    /// A run, and where in it the payload starts.
    Run(&'a Span, u64),
    /// `len` bytes from `addr` (iova space) of the region `lkey` names in protection domain
    /// `pd`, which must allow local write.
    Sge { hint: &'a MrHint, mrs: &'a MrTable, pd: u32, lkey: u32, addr: u64, len: u64 },
}

impl<'a> Dst<'a> {
    /// The rest of the run of `runs` that holds byte `offset` of their concatenation.
    fn run_at(runs: &'a [Span], offset: u64) -> Option<Dst<'a>> {
        run_ref_at(runs, offset).map(|(r, within)| Dst::Run(r, within))
    }

    fn len(&self) -> u64 {
        match self {
            Dst::Region(s) => s.len(),
            Dst::Run(s, at) => s.len() - at,
            Dst::Sge { len, .. } => *len,
        }
    }

    /// Runs `f` on `len` bytes at `offset` of it, pinned for the call (see [`Span::pin_sub`],
    /// [`MrHint::with_pinned`]); `None` (`f` not called) unless they are all inside it and
    /// its region is still registered (and, for a receive's SGE, checks out).
    fn with_pinned<R>(&self, offset: u64, len: u64, f: impl FnOnce(&Pinned) -> R) -> Option<R> {
        match self {
            Dst::Region(s) => s.pin_sub(offset, len).map(|p| f(&p)),
            Dst::Run(s, at) => s.pin_sub(at.checked_add(offset)?, len).map(|p| f(&p)),
            Dst::Sge { hint, mrs, pd, lkey, addr, len: rest } => {
                if offset.checked_add(len)? > *rest {
                    return None;
                }
                hint.with_pinned(mrs, *pd, *lkey, addr.checked_add(offset)?, len, access::LOCAL_WRITE, f)
            }
        }
    }
}

impl DataPath {
    pub fn established(&self) -> bool {
        self.link.as_ref().is_some_and(|l| l.established)
    }

    /// The stream reported room for more bytes (the progress thread saw `EPOLLOUT`): the next
    /// pump sends again (see `Link::tx_blocked`).
    pub fn writable(&mut self) {
        if let Some(l) = self.link.as_mut() {
            l.tx_blocked = false;
        }
    }

    /// Whether sends wait for the stream to report room (see [`DataPath::writable`]).
    pub fn tx_blocked(&self) -> bool {
        self.link.as_ref().is_some_and(|l| l.tx_blocked)
    }

    /// Queues a send WR (already checked against the QP caps). A WR whose local memory does not
    /// check out completes with `IBV_WC_LOC_PROT_ERR` and fails the QP, as in the kernel.
    /// With `ring`, the doorbell rings (the socket is written) at once; without, the WR waits
    /// for [`DataPath::doorbell`] (the end of the posted chain).
    pub fn post_send(&mut self, env: &Env, wqe: SendWqe, max_wr: u32, ring: bool) -> Result<Option<Fatal>, PostError> {
        if self.sq.len() >= max_wr as usize {
            return Err(PostError::QueueFull);
        }
        let Ok(len) = u32::try_from(wqe.payload.len()) else {
            return Err(PostError::TooManySges);
        };
        // A Send or Write of one FPDU behind nothing outstanding is framed at once (a small
        // one from its SGEs read through the hint: no runs resolved, no reference to each
        // region taken and dropped). What that path does not take (WRs outstanding, memory that
        // does not check out) goes on below, where a bad SGE fails the WR.
        if self.established() {
            if let Some(fatal) = self.post_direct(env, self.sq.next_id(), &wqe, len, ring) {
                return Ok(fatal);
            }
        }
        let (runs, sink) = match (wqe.opcode, &wqe.payload) {
            (opcode::RDMA_READ, Payload::Sges(s)) => (resolve(env.mrs, &self.local_hint, env.pd, s, access::LOCAL_WRITE), true),
            (opcode::RDMA_READ, Payload::Inline(_)) => return Err(PostError::BadState),
            (opcode::ATOMIC_CMP_AND_SWP | opcode::ATOMIC_FETCH_AND_ADD, Payload::Sges(s)) => {
                let r = resolve(env.mrs, &self.local_hint, env.pd, s, access::LOCAL_WRITE);
                match &r {
                    Ok(runs) if runs.len() != 1 || runs[0].len() < 8 => return Err(PostError::BadState),
                    _ => {}
                }
                (r, true)
            }
            (opcode::ATOMIC_CMP_AND_SWP | opcode::ATOMIC_FETCH_AND_ADD, Payload::Inline(_)) => return Err(PostError::BadState),
            (_, Payload::Sges(s)) => (resolve(env.mrs, &self.local_hint, env.pd, s, 0), false),
            (_, Payload::Inline(_)) => (Ok(Runs::new()), false),
        };
        // Local Invalidate (IBV_DEVICE_MEM_MGT_EXTENSIONS): the STag must name a region of this
        // QP's PD, else the WR fails as a bad local access would.
        let runs = match runs {
            Ok(r) if wqe.opcode == opcode::LOCAL_INV => {
                env.mrs.lookup(wqe.imm_or_inv).filter(|m| m.pd == env.pd).map(|_| r).ok_or(AccessError::InvalidStag)
            }
            r => r,
        };
        let id = self.sq.next_id();
        let Ok(runs) = runs else {
            env.send_cq.push(Completion {
                wr_id: wqe.wr_id,
                status: wc_status::LOC_PROT_ERR,
                opcode: wqe.wc_opcode(),
                qp_num: env.qpn,
                ..Default::default()
            });
            return Ok(Some(Fatal::LocalError));
        };
        let sink = sink.then_some(SINK_TAG | (id as u32 & SINK_ID_BITS));
        let posted = self.sq.insert(SendEntry { wqe, runs, fed: false, sink });
        debug_assert_eq!(posted, id);
        if !self.established() {
            return Ok(None);
        }
        if ring && sink.is_some() {
            if let Some(fatal) = self.post_lone_read(env, id) {
                return Ok(fatal);
            }
        }
        if let Some(f) = self.feed_send(env, id) {
            return Ok(Some(f));
        }
        if !ring {
            return Ok(None);
        }
        Ok(self.doorbell(env))
    }

    /// Sends what was posted, unless the socket is already backed up (then the progress thread
    /// sends when it drains, and these WRs ride along without a system call of their own).
    pub fn doorbell(&mut self, env: &Env) -> Option<Fatal> {
        if !self.established() {
            return None;
        }
        // Doorbell: send now unless the socket is already backed up (then the progress thread
        // sends when it drains, and this WR rides along without a system call of its own).
        let idle = self.link.as_ref().is_some_and(|l| !l.backed_up());
        if idle {
            self.pump_tx(env)
        } else {
            None
        }
    }

    /// Queues a receive WR. Its memory is checked when bytes are placed, as siw does
    /// (`siw_proc_send` checks each SGE as data arrives) and a NIC reads its receive queue's
    /// lkeys: a receive whose buffer is absent or not valid — libfabric posts `lkey` 0
    /// buffers it never means to fill — is accepted here; only a Send that places bytes into
    /// it fails, with a Terminate (DDP catastrophic, as siw) and `IBV_WC_LOC_PROT_ERR`. A
    /// zero-length Send into it completes normally. Nothing of the region is looked up or
    /// referenced here: resolving the SGEs at post time took a reference to the region, given
    /// back when the receive completed — two locked instructions per message received.
    pub fn post_recv(&mut self, env: &Env, wqe: RecvWqe, from_srq: bool) -> Option<Fatal> {
        let id = self.rq.next_id();
        let len = wqe.sges.iter().map(|s| u64::from(s.length)).sum::<u64>().min(u64::from(u32::MAX)) as u32;
        // A receive from an SRQ was posted with the SRQ's protection domain, which may differ
        // from the QP's: its lkeys are checked against the SRQ's (as the kernel does).
        let pd = match (from_srq, env.srq) {
            (true, Some(srq)) => srq.pd,
            _ => env.pd,
        };
        if crate::engine::log::enabled(crate::engine::log::Level::Debug) {
            if let Err(e) = resolve(env.mrs, &self.recv_hint, pd, &wqe.sges, access::LOCAL_WRITE) {
                crate::engine::debug::why(format_args!(
                    "QP 0x{:06x}: receive wr_id {:#x}: {e:?}; accepted, fails if a Send places bytes into it",
                    env.qpn, wqe.wr_id
                ));
            }
        }
        let mut e = RecvEntry { wqe, len, pd, fed: false, from_srq };
        if let Some(l) = self.link.as_mut().filter(|l| l.established) {
            e.fed = l.conn.post_recv(id, len).is_ok();
        }
        let posted = self.rq.insert(e);
        debug_assert_eq!(posted, id);
        None
    }

    /// After MPA: hands every waiting WR to the protocol core, receives first.
    fn feed_all(&mut self, env: &Env) -> Option<Fatal> {
        let l = self.link.as_mut()?;
        for (id, e) in self.rq.iter_mut().filter(|(_, e)| !e.fed) {
            e.fed = l.conn.post_recv(id, e.len).is_ok();
        }
        let ids: Vec<u64> = self.sq.iter().filter(|(_, e)| !e.fed).map(|(id, _)| id).collect();
        for id in ids {
            if let Some(f) = self.feed_send(env, id) {
                return Some(f);
            }
        }
        None
    }

    fn feed_send(&mut self, env: &Env, id: u64) -> Option<Fatal> {
        let l = self.link.as_mut()?;
        let e = self.sq.get_mut(id)?;
        let w = &e.wqe;
        let len = w.payload.len() as u32;
        let c = &mut l.conn;
        if w.flags & send_flags::FENCE != 0 {
            let _ = c.post_fence();
        }
        let solicited = w.flags & send_flags::SOLICITED != 0;
        let imm = u32::from_be(w.imm_or_inv);
        let r = match w.opcode {
            opcode::SEND => c.post_send(id, SendFlags { solicited, invalidate: None }, len),
            opcode::LOCAL_INV => c.post_local(id),
            opcode::SEND_WITH_INV => c.post_send(id, SendFlags { solicited, invalidate: Some(w.imm_or_inv) }, len),
            opcode::SEND_WITH_IMM => c.post_send_imm(id, SendFlags { solicited, invalidate: None }, len, imm),
            opcode::RDMA_WRITE => c.post_write(id, w.rkey, w.remote_addr, len, None),
            opcode::RDMA_WRITE_WITH_IMM => c.post_write(id, w.rkey, w.remote_addr, len, Some(u64::from(imm))),
            opcode::RDMA_READ => c.post_read(id, e.sink.unwrap_or(0), 0, w.rkey, w.remote_addr, len),
            opcode::ATOMIC_FETCH_AND_ADD => {
                c.post_atomic(id, AtomicOperation::fetch_add(w.compare_add), (e.sink.unwrap_or(0), 0), w.rkey, w.remote_addr)
            }
            opcode::ATOMIC_CMP_AND_SWP => {
                let op = AtomicOperation::cmp_swap(w.compare_add, w.swap);
                c.post_atomic(id, op, (e.sink.unwrap_or(0), 0), w.rkey, w.remote_addr)
            }
            _ => Err(WirePostError::NotSupported),
        };
        e.fed = true;
        match r {
            Ok(()) => None,
            Err(_) => {
                // The peer did not negotiate RFC 7306 (or the opcode has no iWARP message):
                // complete in error here rather than draw a Terminate from the peer.
                let e = self.sq.remove(id)?;
                env.send_cq.push(Completion {
                    wr_id: e.wqe.wr_id,
                    status: wc_status::LOC_QP_OP_ERR,
                    opcode: e.wqe.wc_opcode(),
                    qp_num: env.qpn,
                    ..Default::default()
                });
                Some(Fatal::LocalError)
            }
        }
    }

    /// Turns protocol events into completions and state changes.
    #[inline]
    pub fn drain_events(&mut self, env: &Env) -> Option<Fatal> {
        // Called after every receive and send, mostly with nothing queued: that case costs
        // a load, not a call that moves an `Option<Event>` out of the queue.
        match &self.link {
            Some(l) if l.conn.has_events() => self.take_events(env),
            _ => None,
        }
    }

    fn take_events(&mut self, env: &Env) -> Option<Fatal> {
        let mut fatal = None;
        loop {
            let Some(l) = self.link.as_mut() else {
                return fatal;
            };
            let Some(ev) = l.conn.poll_event() else {
                return fatal;
            };
            match ev {
                Event::Established(neg) => {
                    l.established = true;
                    if l.conn.tx_held() {
                        // the hold's clock starts now
                        l.conn.handle_timeout(super::transport::now_ms());
                    }
                    self.notices.push(Notice::Established(neg));
                    if let Some(f) = self.feed_all(env) {
                        fatal = fatal.or(Some(f));
                    }
                }
                Event::Completion(c) => {
                    if let Some(f) = self.complete(env, c) {
                        fatal = fatal.or(Some(f));
                    }
                }
                Event::Terminated { sent, term } => {
                    crate::engine::debug::why(format_args!("Terminate {}: {term:?}", if sent { "sent" } else { "received" }));
                    fatal = fatal.or(Some(Fatal::Terminated))
                }
                Event::Failed(Failure::PeerClosed) => fatal = fatal.or(Some(Fatal::Lost)),
                Event::Failed(f) => {
                    crate::engine::debug::why(format_args!("connection failed: {f:?}"));
                    fatal = fatal.or(Some(Fatal::Lost))
                }
                Event::Rejected { private_data, .. } => {
                    self.notices.push(Notice::Rejected(private_data));
                    fatal = fatal.or(Some(Fatal::Rejected));
                }
                Event::Closed => {}
                Event::ConnectRequest(_) => {}
            }
        }
    }

    /// Reports a completion of the protocol core; `Some` when the work request failed here
    /// after all (an atomic whose result buffer went): the QP fails.
    fn complete(&mut self, env: &Env, c: WireCompletion) -> Option<Fatal> {
        if c.is_recv() {
            let Some(e) = self.rq.remove(c.wr_id) else {
                return None;
            };
            let mut out = Completion {
                wr_id: e.wqe.wr_id,
                status: c.status.as_u32(),
                opcode: if c.opcode == WcOpcode::RecvRdmaWithImm { wc_opcode::RECV_RDMA_WITH_IMM } else { wc_opcode::RECV },
                byte_len: c.byte_len,
                qp_num: env.qpn,
                solicited: c.solicited,
                ..Default::default()
            };
            if let Some(imm) = c.imm {
                out.wc_flags |= wc_flags::WITH_IMM;
                out.imm_or_inv = (imm as u32).to_be();
            } else if let Some(stag) = c.invalidated {
                out.wc_flags |= wc_flags::WITH_INV;
                out.imm_or_inv = stag;
            }
            env.recv_cq.push(out);
            return None;
        }
        let Some(e) = self.sq.remove(c.wr_id) else {
            return None;
        };
        let mut status = c.status;
        if let (Some(v), WcStatus::Success) = (c.atomic_result, c.status) {
            match e.runs.first().and_then(Span::pin) {
                Some(p) => env.user_mem.write(&p, &v.to_ne_bytes()),
                // The result buffer's region was deregistered meanwhile: the original value is
                // written nowhere, and the atomic fails, as a Read whose memory went does.
                None => status = WcStatus::LocProtErr,
            }
        }
        // Local Invalidate takes effect in posting order: peers can no longer address the
        // region with that STag (as after a peer's Send with Invalidate, RFC 5040 §5.2); the
        // application may still use it locally, until it deregisters it.
        if e.wqe.opcode == opcode::LOCAL_INV && status == WcStatus::Success {
            env.mrs.invalidate(e.wqe.imm_or_inv, env.pd);
        }
        self.report_send(env, &e.wqe, status, c.byte_len, true);
        (status != c.status).then_some(Fatal::LocalError)
    }

    /// Reports the completion of send-queue WR `wqe` (taken off the send queue): to the send
    /// CQ if it is signaled or failed — at once, or held until its bytes have left the backlog
    /// (and a lone RDMA Write's, polled for, maybe until the peer's answer: `answer`).
    /// `rung`: the WR ended its posted chain (a Write reported as it is posted, ahead of the
    /// rest of its chain, is not lone).
    fn report_send(&mut self, env: &Env, wqe: &SendWqe, status: WcStatus, byte_len: u32, rung: bool) {
        let signaled = env.sq_sig_all || wqe.flags & send_flags::SIGNALED != 0;
        if status == WcStatus::Success && !signaled {
            return;
        }
        let out = Completion {
            wr_id: wqe.wr_id,
            status: status.as_u32(),
            opcode: wqe.wc_opcode(),
            byte_len,
            qp_num: env.qpn,
            ..Default::default()
        };
        let lone_write = rung && out.opcode == wc_opcode::RDMA_WRITE && status == WcStatus::Success && self.sq.is_empty();
        let Some(l) = self.link.as_mut() else {
            env.send_cq.push(out);
            return;
        };
        // The application's only WR, polled for: it may wait for the peer's answer.
        let waits = lone_write && l.held.is_empty() && env.poller_clock_now().is_some_and(|now| l.answer.start(now, l.conn.counters().rx_msgs));
        if waits || l.backlog() > 0 || !l.held.is_empty() {
            // Behind completions still held: after them, in posting order.
            l.held.push_back((l.tx_queued, out));
        } else {
            env.send_cq.push(out);
        }
    }

    /// The QP is going to ERROR (or being destroyed): closes the stream and completes every
    /// outstanding WR — held send completions whose bytes never left become flushes — in
    /// posting order. Receives taken from an SRQ and never used go back to it.
    pub fn shutdown(&mut self, env: &Env, deliver: bool) -> Option<Closing> {
        let mut tail = Vec::new();
        if let Some(l) = self.link.as_mut() {
            // The transmit backlog holds whole FPDUs (header, payload, trailer are queued
            // together): all of it goes out, so the peer never sees a stream cut mid-FPDU.
            // Payload still in application memory is copied now, while it is registered.
            let mut cut = false;
            for (i, p) in l.tx.iter().enumerate() {
                let skip = if i == 0 { l.tx_skip } else { 0 };
                match p.bytes(skip) {
                    Some(b) => tail.extend_from_slice(b),
                    None => {
                        let Piece::User(s) = p else { continue };
                        // A region being deregistered cannot be read any more: then the stream
                        // ends without the rest (and without a Terminate, which could not be
                        // framed after a partial FPDU).
                        match s.pin_from(skip as u64) {
                            Some(pin) => {
                                let n = tail.len();
                                tail.resize(n + pin.len(), 0);
                                env.user_mem.read(&pin, &mut tail[n..]);
                            }
                            None => {
                                cut = true;
                                break;
                            }
                        }
                    }
                }
            }
            l.tx.clear();
            if cut {
                tail.clear();
            }
            // After an error the core has only the Terminate left to send (RFC 5040 §6: it
            // goes out before the stream is closed).
            if !cut && l.conn.state() == ConnState::Error {
                while let Some(Tx::Bytes(b)) = l.conn.next_tx() {
                    tail.extend_from_slice(&b);
                }
            }
            l.conn.close();
        }
        let _ = self.drain_events(env);
        let mut closing = None;
        if let Some(mut l) = self.link.take() {
            let sent = l.tx_sent;
            for (mark, mut c) in l.held.drain(..) {
                // A completion held past its bytes (waiting for an answer) reports them sent.
                if c.status == wc_status::SUCCESS && mark > sent {
                    c.status = wc_status::WR_FLUSH_ERR;
                }
                if deliver {
                    env.send_cq.push(c);
                }
            }
            closing = Some(Closing { stream: l.stream, bytes: tail });
        }
        for e in self.sq.take_all() {
            if deliver {
                env.send_cq.push(e.wqe.flushed(env.qpn));
            }
        }
        for e in self.rq.take_all() {
            match (e.from_srq, env.srq) {
                (true, Some(srq)) => srq.give_back(e.wqe),
                _ if deliver => env.recv_cq.push(e.wqe.flushed(env.qpn)),
                _ => {}
            }
        }
        closing
    }

    /// `ibv_modify_qp` to RESET: forget everything.
    pub fn reset(&mut self) {
        self.sq.clear();
        self.rq.clear();
        self.link = None;
    }
}


#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
#[cfg(test)]
mod tests;
#[cfg(any(test, feature = "fuzzing"))]
pub mod testkit;
