//! The per-QP connection state machine: MPA negotiation (RFC 5044 §7,
//! RFC 6581), DDP placement rules (RFC 5041 §5–§7), RDMAP operations and
//! Terminate handling (RFC 5040 §5–§7), RFC 7306 extensions between uiw
//! peers.
//!
//! # API
//!
//! Sans-IO in the style of `quinn-proto`: the engine owns the socket and the
//! clock.
//!
//! * Bytes in: [`Connection::handle_bytes`] (copying convenience, needs a
//!   [`MemoryIo`]), or the zero-copy pull API: [`Connection::rx_want`] says
//!   whether the next bytes are framing ([`RxWant::Bytes`]: read at most `n`
//!   bytes and pass them to [`Connection::rx_bytes`]) or payload
//!   ([`RxWant::Place`]: `recv()` at most `len` bytes straight into the
//!   memory named by the [`Placement`], then report them with
//!   [`Connection::rx_placed`]).
//! * Bytes out: [`Connection::poll_transmit`] (copying) or
//!   [`Connection::next_tx`], which yields small control frames as bytes and
//!   data segments as a header + a payload [`Source`] + a trailer to compute
//!   once the payload is at hand (`sendmsg` with an iovec, no copy).
//! * [`Connection::poll_event`]: establishment, completions (with ibverbs
//!   status), Terminates, close.
//! * [`Connection::poll_timeout`] / [`Connection::handle_timeout`] with the
//!   caller's clock in milliseconds.
//! * Work requests: [`Connection::post_send`], [`Connection::post_write`],
//!   [`Connection::post_read`], [`Connection::post_atomic`],
//!   [`Connection::post_recv`].
//!
//! ```
//! use uiw_wire::conn::{Config, Connection, Event, Role, SendFlags};
//! use uiw_wire::placement::{Access, Memory, MemoryIo, Placement, Source};
//! use uiw_wire::TaggedError;
//!
//! // A toy memory: one buffer per side, receive buffers by wr_id.
//! #[derive(Default)]
//! struct Mem { send: Vec<u8>, recv: Vec<u8> }
//! impl Memory for Mem {
//!     fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
//!         Err(TaggedError::InvalidStag)
//!     }
//! }
//! impl MemoryIo for Mem {
//!     fn read(&self, src: Source, out: &mut [u8]) {
//!         if let Source::Wr { offset, .. } = src {
//!             out.copy_from_slice(&self.send[offset as usize..][..out.len()]);
//!         }
//!     }
//!     fn write(&mut self, dst: Placement, data: &[u8]) {
//!         if let Placement::Recv { offset, .. } = dst {
//!             self.recv[offset as usize..][..data.len()].copy_from_slice(data);
//!         }
//!     }
//! }
//!
//! let mut a = Connection::new(Config::new(Role::Initiator), 0);
//! let mut b = Connection::new(Config::new(Role::Responder), 0);
//! let (mut ma, mut mb) = (Mem { send: b"hello".to_vec(), ..Default::default() },
//!                         Mem { recv: vec![0; 16], ..Default::default() });
//! b.post_recv(7, 16).unwrap();
//! let mut wire = Vec::new();
//! // Pump bytes both ways until nothing moves.
//! let mut posted = false;
//! for _ in 0..10 {
//!     while a.poll_transmit(&mut wire, &ma) {}
//!     let mut off = 0;
//!     while off < wire.len() { off += b.handle_bytes(&wire[off..], &mut mb); }
//!     wire.clear();
//!     while b.poll_transmit(&mut wire, &mb) {}
//!     let mut off = 0;
//!     while off < wire.len() { off += a.handle_bytes(&wire[off..], &mut ma); }
//!     wire.clear();
//!     if a.is_established() && !posted {
//!         a.post_send(1, SendFlags::default(), 5).unwrap();
//!         posted = true;
//!     }
//! }
//! let mut got = None;
//! while let Some(ev) = b.poll_event() {
//!     if let Event::Completion(c) = ev { got = Some(c); }
//! }
//! let c = got.unwrap();
//! assert_eq!((c.wr_id, c.byte_len), (7, 5));
//! assert_eq!(&mb.recv[..5], b"hello");
//! ```

use std::collections::VecDeque;

use crate::crc::Crc32c;
use crate::ddp::{qn, BufferModel, DdpHeader};
use crate::error::{PostError, TermCode, WcStatus};
use crate::mpa::{self, FrameKind, IrdOrd, RrFrame};
use crate::placement::{Access, Memory, MemoryIo, Placement, Source};
use crate::rdmap::{
    AtomicOp, AtomicOperation, AtomicRequest, AtomicResponse, Opcode, RdmapCtrl, ReadRequest,
    Terminate,
    IMMEDIATE_LEN,
};
use crate::segment::{
    self, DataHeader, Deframer, FrameError, RxEvent, RxSegment, Segmenter, Target,
    Trailer,
};

/// Upper word of an Immediate Data message that announces a Send with
/// Immediate (uiw peers only; see [`Connection::post_send_imm`]): "uiw\x01".
pub const SEND_IMM_TAG: u32 = 0x7569_7701;

/// Which end of the TCP connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sends the MPA Request (the TCP active side).
    Initiator,
    /// Answers with the MPA Reply.
    Responder,
}

/// Which zero-length RTR messages to offer (initiator) or accept/prefer
/// (responder), RFC 6581 §5.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rtr {
    pub write: bool,
    pub read: bool,
    pub send: bool,
}

/// Connection parameters.
#[derive(Clone, Debug)]
pub struct Config {
    pub role: Role,
    /// MPA revision to use (1 or 2). A responder answers revision 1 requests
    /// with revision 1 regardless.
    pub revision: u8,
    /// Request (initiator) or require (responder) CRC.
    pub crc: bool,
    /// Inbound RDMA Read Requests we accept concurrently.
    pub ird: u16,
    /// Outbound RDMA Reads we issue concurrently.
    pub ord: u16,
    /// Peer-to-peer mode (RFC 6581 §5): use an RTR message.
    pub p2p: bool,
    pub rtr: Rtr,
    /// Offer RFC 7306 extensions (used only if the peer offers them too).
    pub extensions: bool,
    /// TCP MSS: FPDU sizing.
    pub mss: usize,
    /// ULP private data for the Request/Reply (≤ 512 − 4 bytes).
    pub private_data: Vec<u8>,
    /// Time allowed for MPA negotiation (and the RTR), milliseconds: what the peer's stack
    /// answers (a Responder's wait for the Request, the RTR after an accept).
    pub mpa_timeout_ms: u64,
    /// Initiator: time allowed for the MPA Reply, milliseconds. The Reply waits for the
    /// responder's application to accept (rdma_cm's CONNECT_REQUEST, then `rdma_accept`),
    /// so it is an application's latency, not the stack's: a server that sets up its buffers
    /// between the two on a busy host takes seconds. siw allows 10 s
    /// (`MPAREQ_TIMEOUT`), cxgb4 60 s (`ep_timeout_secs`); the default is cxgb4's.
    pub reply_timeout_ms: u64,
    /// Responder: report the Request as [`Event::ConnectRequest`] and wait
    /// for [`Connection::accept`] / [`Connection::reject`] (rdma_cm's
    /// listen/accept flow) instead of answering at once with this config.
    pub manual_accept: bool,
    /// Largest ULPDU accepted from the peer (RFC 5044 §4.1: a sender never
    /// exceeds its MULPDU, at most [`mpa::MAX_ULPDU`]). A longer one ends the
    /// stream with a Terminate (DDP, local catastrophic) before its payload
    /// is read.
    pub max_rx_ulpdu: usize,
    /// How long a Send (or Immediate Data) that finds no receive posted waits for one,
    /// milliseconds; 0: Terminate at once (DDP untagged "no buffer", RFC 5041 §7.2, what
    /// the kernel's siw does). While it waits the connection reads nothing more, so TCP's
    /// own flow control holds the peer back — the local counterpart of InfiniBand's RNR
    /// retry, which iWARP lacks on the wire. Past the wait: the same Terminate.
    pub rnr_wait_ms: u64,
    /// Split messages into near-equal FPDUs within MULPDU ([`Segmenter::even`]) instead of
    /// full ones and a short tail (siw's way, the default: its captures match byte for byte).
    pub even_segments: bool,
    /// Initiator: hold the first FPDU (the RTR in P2P mode) this long (ms)
    /// after the MPA Reply when the responder is not a uiw peer. The kernel's
    /// siw sends its Reply before it hooks the socket to the QP
    /// (`siw_accept`), and an FPDU that arrives in between is not read until
    /// another segment comes — a request/response ULP then waits forever.
    /// 0: no hold. The hold starts at the first [`Connection::handle_timeout`]
    /// after the Reply (which [`Connection::poll_timeout`] asks for at once).
    pub first_fpdu_hold_ms: u64,
}

impl Config {
    pub fn new(role: Role) -> Config {
        Config {
            role,
            revision: 2,
            crc: false,
            ird: 16,
            ord: 16,
            p2p: false,
            rtr: Rtr {
                write: true,
                read: true,
                send: false,
            },
            extensions: false,
            mss: 1460,
            private_data: Vec::new(),
            mpa_timeout_ms: 10_000,
            reply_timeout_ms: 60_000,
            manual_accept: false,
            max_rx_ulpdu: mpa::MAX_ULPDU,
            rnr_wait_ms: 0,
            even_segments: false,
            first_fpdu_hold_ms: 0,
        }
    }
}

/// Connection state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Initiator: Request sent, waiting for the Reply.
    WaitReply,
    /// Responder: waiting for the Request.
    WaitRequest,
    /// Responder with `manual_accept`: Request reported, waiting for
    /// `accept` or `reject`.
    WaitAccept,
    /// P2P: waiting for the peer's RTR (responder) — we may not send yet.
    WaitRtr,
    /// Data transfer.
    Established,
    /// A Terminate was sent or received, or the stream broke. Work requests
    /// are flushed; the engine should close the socket once `next_tx` is
    /// empty.
    Error,
    /// MPA negotiation rejected (either side).
    Rejected,
    /// Orderly close.
    Closed,
}

/// Result of MPA negotiation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub revision: u8,
    pub crc: bool,
    /// Our effective IRD and ORD.
    pub ird: u16,
    pub ord: u16,
    pub p2p: bool,
    pub extensions: bool,
    /// The peer's ULP private data (IRD/ORD words removed).
    pub private_data: Vec<u8>,
}

/// libibverbs `enum ibv_wc_opcode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    /// `IBV_WC_LOCAL_INV`: a work request that sends nothing (see [`Connection::post_local`]).
    LocalInv = 6,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub status: WcStatus,
    pub byte_len: u32,
    /// RFC 7306 Immediate Data (receive side).
    pub imm: Option<u64>,
    /// STag invalidated by a Send with Invalidate (receive side).
    pub invalidated: Option<u32>,
    /// Solicited event (Send with SE / Immediate Data with SE).
    pub solicited: bool,
    /// Original remote value of an atomic (requester side); also written to
    /// the result buffer by the copying API.
    pub atomic_result: Option<u64>,
}

impl Completion {
    fn new(wr_id: u64, opcode: WcOpcode, status: WcStatus, byte_len: u32) -> Completion {
        Completion {
            wr_id,
            opcode,
            status,
            byte_len,
            imm: None,
            invalidated: None,
            solicited: false,
            atomic_result: None,
        }
    }
    /// Receive-queue completion (vs send queue).
    pub fn is_recv(&self) -> bool {
        (self.opcode as u32) >= 128
    }
}

/// What an MPA Request asked for (responder, `manual_accept`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    pub revision: u8,
    pub crc: bool,
    /// The initiator's IRD/ORD words (RFC 6581), if present.
    pub ird_ord: Option<IrdOrd>,
    pub extensions: bool,
    /// ULP private data (IRD/ORD words removed).
    pub private_data: Vec<u8>,
}

/// Connection events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Responder with `manual_accept`: an MPA Request arrived; answer with
    /// `accept` or `reject`.
    ConnectRequest(ConnectRequest),
    /// MPA negotiation done; RDMA traffic may flow.
    Established(Negotiated),
    /// The MPA Request was rejected (by us, or by the peer); the peer's
    /// private data is given.
    Rejected {
        by_peer: bool,
        private_data: Vec<u8>,
    },
    Completion(Completion),
    /// A Terminate was sent (`sent`) or received. The connection is in
    /// [`State::Error`].
    Terminated {
        sent: bool,
        term: Terminate,
    },
    /// A stream-level failure without Terminate (bad MPA frame, timeout,
    /// peer closed the socket).
    Failed(Failure),
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Invalid MPA Request/Reply (RFC 5044 §8 code 4).
    BadMpaFrame,
    /// Markers requested by the peer's Reply, or other unsupported mode.
    Unsupported,
    /// MPA negotiation or RTR timed out.
    Timeout,
    /// The peer closed the TCP stream.
    PeerClosed,
}

/// Send variants (RFC 5040 §4.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags {
    pub solicited: bool,
    /// Invalidate this STag at the peer (Send with Invalidate).
    pub invalidate: Option<u32>,
}

impl SendFlags {
    /// The RDMAP opcode of a Send with these flags (RFC 5040 §4.3: Send, Send with Invalidate,
    /// with Solicited Event, both), and where it goes: the Send queue's message `msn`, the
    /// STag to invalidate in the reserved ULP field (RFC 5041 §4.4).
    fn message(self, msn: u32) -> (Opcode, Target) {
        let op = match (self.solicited, self.invalidate.is_some()) {
            (false, false) => Opcode::Send,
            (false, true) => Opcode::SendInv,
            (true, false) => Opcode::SendSe,
            (true, true) => Opcode::SendSeInv,
        };
        (op, Target::Untagged { qn: qn::SEND, msn, rsvd_ulp: self.invalidate.unwrap_or(0) })
    }
}

/// A message [`Connection::send_lone`] may frame at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoneMsg {
    /// A Send (RFC 5040 §4.3: Send, Send with Solicited Event, with Invalidate).
    Send(SendFlags),
    /// An RDMA Write into the peer's buffer `(stag, to)` (RFC 5040 §4.3).
    Write { stag: u32, to: u64 },
}

/// What the receive side needs next (zero-copy API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxWant {
    /// Read at most this many bytes and give them to `rx_bytes`.
    Bytes(usize),
    /// Receive at most `len` payload bytes directly into `place`, then call
    /// `rx_placed` with them.
    Place { len: u32, place: Placement },
    /// Nothing more is accepted (error/closed): discard input.
    Discard,
    /// Do not read now (waiting for `accept`/`reject`).
    Wait,
}

/// One transmit unit (zero-copy API).
#[derive(Debug)]
pub enum Tx {
    /// Send these bytes as they are (MPA frames, control FPDUs).
    Bytes(Vec<u8>),
    /// A data segment: send `header`, then `payload_len` bytes from
    /// `source`, then `trailer(&[payload slices])`.
    Segment(TxSegment),
}

#[derive(Debug)]
pub struct TxSegment {
    pub header: DataHeader,
    pub payload_len: u32,
    pub source: Source,
    pub crc: bool,
}

impl TxSegment {
    /// Pad and CRC for this segment, once the payload is at hand (all
    /// `payload_len` bytes of it, in order): without CRC only its length
    /// counts ([`TxSegment::trailer_no_crc`]).
    #[inline]
    pub fn trailer(&self, payload: &[&[u8]]) -> Trailer {
        if !self.crc {
            return self.trailer_no_crc();
        }
        let mut crc = self.crc_start();
        for p in payload {
            crc.update(p);
        }
        self.trailer_after(crc)
    }

    /// The CRC register after this segment's header, for a payload the
    /// caller checksums where it lies (see [`TxSegment::trailer_after`]).
    pub fn crc_start(&self) -> Crc32c {
        let mut c = Crc32c::new();
        c.update(self.header.as_slice());
        c
    }

    /// Pad and CRC once `crc`, from [`TxSegment::crc_start`], has seen all
    /// `payload_len` payload bytes in order (RFC 5044 §6). The engine reads
    /// them in place from registered memory, so it never copies a payload
    /// to checksum it.
    pub fn trailer_after(&self, crc: Crc32c) -> Trailer {
        debug_assert!(self.crc);
        segment::trailer_from_crc(crc, self.header.as_slice(), self.payload_len as usize)
    }

    /// Pad and (zero) CRC field of a segment on a connection without CRC:
    /// needs only the payload length, so the engine can send the payload
    /// straight from application memory without looking at it.
    pub fn trailer_no_crc(&self) -> Trailer {
        debug_assert!(!self.crc);
        segment::trailer_for_len(self.header.as_slice(), self.payload_len as usize)
    }
}

#[derive(Clone, Debug)]
struct Posted {
    /// Send-queue sequence number (completion ordering).
    seq: u64,
    wr: SqWr,
}

#[derive(Clone, Debug)]
enum SqWr {
    Send {
        wr_id: u64,
        flags: SendFlags,
        len: u32,
        imm: Option<u32>,
    },
    Write {
        wr_id: u64,
        stag: u32,
        to: u64,
        len: u32,
        imm: Option<u64>,
    },
    Read {
        wr_id: u64,
        local_stag: u32,
        local_to: u64,
        stag: u32,
        to: u64,
        len: u32,
    },
    Atomic {
        wr_id: u64,
        op: AtomicOperation,
        result: (u32, u64),
        stag: u32,
        to: u64,
    },
    /// Standalone Immediate Data message.
    Imm {
        wr_id: u64,
        imm: u64,
        solicited: bool,
    },
    /// IBV_SEND_FENCE: what follows waits for outstanding Reads/Atomics.
    Fence,
    /// A work request with no message (Local Invalidate): completes, in order, when it
    /// reaches the head of the send queue.
    Local { wr_id: u64 },
}

impl SqWr {
    fn wr_id(&self) -> u64 {
        match *self {
            SqWr::Send { wr_id, .. }
            | SqWr::Write { wr_id, .. }
            | SqWr::Read { wr_id, .. }
            | SqWr::Atomic { wr_id, .. }
            | SqWr::Imm { wr_id, .. }
            | SqWr::Local { wr_id } => wr_id,
            SqWr::Fence => u64::MAX,
        }
    }
    fn wc_opcode(&self) -> WcOpcode {
        match self {
            SqWr::Send { .. } | SqWr::Imm { .. } | SqWr::Fence => WcOpcode::Send,
            SqWr::Local { .. } => WcOpcode::LocalInv,
            SqWr::Write { .. } => WcOpcode::RdmaWrite,
            SqWr::Read { .. } => WcOpcode::RdmaRead,
            SqWr::Atomic { op, .. } => match op.op() {
                AtomicOp::FetchAdd => WcOpcode::FetchAdd,
                AtomicOp::CompareSwap => WcOpcode::CompSwap,
            },
        }
    }
}

/// Traffic counters of one connection, monotonic from its start. What they count, after
/// MPA negotiation (the MPA frames and the RFC 6581 RTR are not counted):
/// - `*_fpdus`: FPDUs (RFC 5044 §4) handed to / taken from the stream;
/// - `*_msgs`: RDMAP messages (RFC 5040 §4: Send variants, RDMA Write, Read Request,
///   Read Response, Terminate, and RFC 7306's Atomic Request/Response and Immediate Data);
///   a message counts once, with its last FPDU;
/// - `*_bytes`: DDP payload bytes of data-carrying messages (Send, Write, Read Response) —
///   the application's bytes, without headers, markers or CRC;
/// - `*_terminates`: Terminate messages (RFC 5040 §5.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub tx_fpdus: u64,
    pub rx_fpdus: u64,
    pub tx_msgs: u64,
    pub rx_msgs: u64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub tx_terminates: u64,
    pub rx_terminates: u64,
}

/// Message being segmented for transmission.
struct OutMsg {
    seg: Segmenter,
    source: Source,
    on_done: Option<(u64, Completion)>,
    /// Control FPDU to send right before (Send with Immediate).
    pre: Option<Vec<u8>>,
    /// Control FPDU to send right after (Write with Immediate).
    then: Option<Vec<u8>>,
    /// Read Response: counts against IRD until fully sent.
    is_read_resp: bool,
}

enum TxItem {
    Msg(OutMsg),
    Control {
        bytes: Vec<u8>,
        on_done: Option<(u64, Completion)>,
        /// An Atomic Response: counted against IRD (`irq_busy`) until it goes out.
        resp: bool,
    },
}

#[derive(Clone, Copy, Debug)]
struct ReadWr {
    seq: u64,
    wr_id: u64,
    local_stag: u32,
    local_to: u64,
    len: u32,
    done: u32,
    rtr: bool,
}

#[derive(Clone, Copy, Debug)]
struct AtomicWr {
    seq: u64,
    wr_id: u64,
    req_id: u32,
    result: (u32, u64),
    opcode: WcOpcode,
}

#[derive(Clone, Copy, Debug)]
struct RecvWr {
    wr_id: u64,
    len: u32,
    done: u32,
}

/// State of the segment being received.
#[derive(Clone, Copy, Debug)]
struct RxCur {
    seg: RxSegment,
    place: Placement,
    /// Payload bytes of this segment placed so far.
    done: u32,
}

/// An error found while receiving, to be reported by Terminate.
#[derive(Clone, Copy, Debug)]
struct Fault {
    code: TermCode,
    /// Echo the segment's headers (M/D, and R for Read Requests).
    echo: bool,
}

impl Fault {
    fn echo(code: TermCode) -> Fault {
        Fault { code, echo: true }
    }
    fn bare(code: TermCode) -> Fault {
        Fault { code, echo: false }
    }
}

/// One iWARP connection (one QP on one TCP stream).
pub struct Connection {
    counters: Counters,
    /// The RTR control FPDU queued in `tx_follow` at establishment: not counted as traffic.
    tx_rtr_uncounted: bool,
    cfg: Config,
    state: State,
    neg: Option<Negotiated>,
    deadline: Option<u64>,
    /// Transmission after the MPA Reply is held (`Config::first_fpdu_hold_ms`):
    /// `Some(None)` until the hold's clock starts, then `Some(Some(until))`.
    tx_hold: Option<Option<u64>>,
    events: VecDeque<Event>,
    // MPA phase
    mpa_in: Vec<u8>,
    mpa_out: Vec<u8>,
    /// Initiator in P2P mode: RTR still to send (queued control FPDU).
    rtr_kind: Option<RtrKind>,
    // transmit
    mulpdu: usize,
    even_segments: bool,
    crc: bool,
    sq: VecDeque<Posted>,
    /// Send-queue completions in posting order: slot i is sequence
    /// `sq_head + i`; released from the front once filled (ibverbs CQ
    /// order even though Reads complete after later Writes are sent).
    sq_slots: VecDeque<Option<Completion>>,
    sq_head: u64,
    /// The send-queue sequence number and `wr_id` of the message whose last segment the
    /// latest [`Connection::next_tx`] handed out, completing it: what
    /// [`Connection::abort_source`] fails if that segment cannot be framed after all.
    tx_completed_last: Option<(u64, u64)>,
    rsp: VecDeque<TxItem>,
    cur_tx: Option<OutMsg>,
    tx_follow: VecDeque<Vec<u8>>,
    tx_msn: [u32; qn::COUNT],
    orq: VecDeque<ReadWr>,
    atomics: VecDeque<AtomicWr>,
    next_atomic_id: u32,
    /// Read responses queued or in transmission (IRD accounting).
    irq_busy: u32,
    // receive
    deframer: Deframer,
    rx_cur: Option<RxCur>,
    /// A Send or Immediate Data waiting for a receive (see [`Config::rnr_wait_ms`]), and
    /// when that wait ends (set on the first `handle_timeout` after it began).
    rx_stalled: Option<RxSegment>,
    stall_deadline: Option<u64>,
    rx_msn: [u32; qn::COUNT],
    recvq: VecDeque<RecvWr>,
    recv_cur: Option<RecvWr>,
    /// Immediate data announced for the next Send (`post_send_imm`).
    rx_send_imm: Option<u32>,
    /// Bytes of the last inbound RDMA Write (byte_len of a Write with Immediate).
    rx_write_len: u32,
    /// Expected next (STag, TO) of an in-progress inbound Write.
    write_cont: Option<(u32, u64)>,
    terminate_sent: bool,
    /// Request held for `accept`/`reject`.
    pending_req: Option<(mpa::RrHeader, Vec<u8>)>,
    /// Atomic result to store for the copying API: ((stag, to), value).
    pending_atomic_store: Option<((u32, u64), u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RtrKind {
    Write,
    Read,
    Send,
}

const MPA_HDR: usize = mpa::RR_HDR_LEN;

impl Connection {
    /// Create a connection; `now_ms` is the caller's clock. An initiator
    /// queues its MPA Request immediately.
    pub fn new(cfg: Config, now_ms: u64) -> Connection {
        let mut c = Connection {
            state: if cfg.role == Role::Initiator {
                State::WaitReply
            } else {
                State::WaitRequest
            },
            neg: None,
            deadline: Some(now_ms.saturating_add(if cfg.role == Role::Initiator {
                cfg.reply_timeout_ms
            } else {
                cfg.mpa_timeout_ms
            })),
            tx_hold: None,
            events: VecDeque::new(),
            mpa_in: Vec::new(),
            mpa_out: Vec::new(),
            rtr_kind: None,
            mulpdu: mpa::mulpdu(cfg.mss),
            even_segments: cfg.even_segments,
            crc: false,
            sq: VecDeque::new(),
            sq_slots: VecDeque::new(),
            sq_head: 0,
            tx_completed_last: None,
            rsp: VecDeque::new(),
            cur_tx: None,
            tx_follow: VecDeque::new(),
            tx_msn: [1; qn::COUNT],
            orq: VecDeque::new(),
            atomics: VecDeque::new(),
            next_atomic_id: 1,
            irq_busy: 0,
            deframer: Deframer::new(false),
            rx_cur: None,
            rx_stalled: None,
            stall_deadline: None,
            rx_msn: [1; qn::COUNT],
            recvq: VecDeque::new(),
            recv_cur: None,
            rx_send_imm: None,
            rx_write_len: 0,
            write_cont: None,
            terminate_sent: false,
            pending_req: None,
            pending_atomic_store: None,
            counters: Counters::default(),
            tx_rtr_uncounted: false,
            cfg,
        };
        if c.cfg.role == Role::Initiator {
            let mut flags = 0;
            if c.cfg.crc {
                flags |= mpa::FLAG_CRC;
            }
            if c.cfg.extensions {
                flags |= mpa::FLAG_UIW_EXT;
            }
            let io = (c.cfg.revision >= 2).then_some(IrdOrd {
                ird: c.cfg.ird,
                ord: c.cfg.ord,
                p2p: c.cfg.p2p,
                send_rtr: c.cfg.p2p && c.cfg.rtr.send,
                write_rtr: c.cfg.p2p && c.cfg.rtr.write,
                read_rtr: c.cfg.p2p && c.cfg.rtr.read,
            });
            let rev = c.cfg.revision.clamp(1, 2);
            mpa::encode_rr(
                FrameKind::Request,
                flags,
                rev,
                io,
                &c.cfg.private_data,
                &mut c.mpa_out,
            );
        }
        c
    }

    /// Traffic counters (see [`Counters`]).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn is_established(&self) -> bool {
        self.state == State::Established
    }

    /// True once the connection is finished (Terminate sent or received,
    /// rejected, failed or closed) and everything still owed to the peer
    /// (Reject reply, Terminate) has been handed out: the engine may close
    /// the socket.
    pub fn wants_close(&self) -> bool {
        matches!(self.state, State::Error | State::Rejected | State::Closed)
            && self.mpa_out.is_empty()
            && self.rsp.is_empty()
    }

    /// Negotiated parameters, once known.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.neg.as_ref()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether [`Connection::poll_event`] has something to return.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Next deadline (ms on the caller's clock), if any. A held first FPDU
    /// (`Config::first_fpdu_hold_ms`) asks for a call at once (0), then at
    /// the end of the hold.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = self.deadline;
        let mut earliest = |x: u64| t = Some(t.map_or(x, |d| d.min(x)));
        if self.rx_stalled.is_some() {
            // 0 until the first handle_timeout starts the wait's clock.
            earliest(self.stall_deadline.unwrap_or(0));
        }
        match self.tx_hold {
            Some(None) => earliest(0),
            Some(Some(h)) => earliest(h),
            None => {}
        }
        t
    }

    /// Whether transmission is held after the MPA Reply (see
    /// `Config::first_fpdu_hold_ms`); `next_tx` returns nothing meanwhile.
    pub fn tx_held(&self) -> bool {
        self.tx_hold.is_some()
    }

    pub fn handle_timeout(&mut self, now_ms: u64) {
        match self.tx_hold {
            Some(None) => self.tx_hold = Some(Some(now_ms.saturating_add(self.cfg.first_fpdu_hold_ms))),
            Some(Some(t)) if now_ms >= t => self.tx_hold = None,
            _ => {}
        }
        if let Some(seg) = self.rx_stalled {
            match self.stall_deadline {
                None => self.stall_deadline = Some(now_ms.saturating_add(self.cfg.rnr_wait_ms)),
                Some(d) if now_ms >= d => {
                    self.rx_stalled = None;
                    self.stall_deadline = None;
                    let f = Fault::echo(TermCode::DDP_U_NO_BUFFER);
                    let st = self.fault_status(&f, &seg);
                    self.terminate(f, Some(&seg), st);
                }
                Some(_) => {}
            }
        }
        if let Some(d) = self.deadline {
            if now_ms >= d
                && matches!(
                    self.state,
                    State::WaitReply | State::WaitRequest | State::WaitRtr
                )
            {
                self.deadline = None;
                self.fail(Failure::Timeout);
            }
        }
    }

    /// The engine saw EOF (or a reset) on the socket.
    pub fn handle_eof(&mut self) {
        match self.state {
            State::Error | State::Closed | State::Rejected => {}
            _ => self.fail(Failure::PeerClosed),
        }
    }

    /// Orderly close: flush outstanding work (WR_FLUSH_ERR) and report
    /// `Closed`. The engine then shuts the socket down.
    pub fn close(&mut self) {
        if self.state == State::Closed {
            return;
        }
        self.flush_all(None);
        self.state = State::Closed;
        self.tx_hold = None;
        self.deadline = None;
        self.events.push_back(Event::Closed);
    }

    // ------------------------------------------------------------------
    // Posting
    // ------------------------------------------------------------------

    fn can_post(&self) -> Result<(), PostError> {
        match self.state {
            State::Error | State::Closed | State::Rejected => Err(PostError::InvalidState),
            _ => Ok(()),
        }
    }

    /// Post a receive buffer of `len` bytes (the engine keeps its SGL by
    /// `wr_id`).
    pub fn post_recv(&mut self, wr_id: u64, len: u32) -> Result<(), PostError> {
        self.can_post()?;
        self.recvq.push_back(RecvWr {
            wr_id,
            len,
            done: 0,
        });
        self.resume_stalled();
        Ok(())
    }

    /// The engine could not place the current segment's bytes (the memory did not check out:
    /// its region was deregistered after the segment's header was checked). Into a receive
    /// (a Send) or the Read's local memory (a Read Response): Terminate (DDP catastrophic,
    /// RFC 5041 §7.2, as siw), the receive or the Read completes with `LocProtErr`. Into a
    /// region of ours that a peer's Write names: the STag is no longer valid — Terminate
    /// (DDP tagged, Invalid STag, RFC 5041 §7.2; siw checks the STag of every segment). The
    /// connection goes to ERROR, everything else is flushed.
    pub fn fail_placement(&mut self) {
        if let Some(cur) = self.rx_cur {
            let read_response = cur.seg.ddp.rdmap.op() == Some(Opcode::ReadResponse);
            if matches!(cur.place, Placement::Recv { .. }) || read_response {
                self.terminate(
                    Fault::echo(TermCode::DDP_LOCAL_CATASTROPHIC),
                    Some(&cur.seg),
                    WcStatus::LocProtErr,
                );
            } else if matches!(cur.place, Placement::Tagged { .. }) {
                self.terminate(Fault::echo(TermCode::DDP_T_INVALID_STAG), Some(&cur.seg), WcStatus::GeneralErr);
            }
        }
    }

    /// Whether a Send waits for a receive (nothing more is read until one is posted).
    pub fn rx_stalled(&self) -> bool {
        self.rx_stalled.is_some()
    }

    /// A receive was posted: the Send that waited for one goes on.
    fn resume_stalled(&mut self) {
        let Some(seg) = self.rx_stalled.take() else {
            return;
        };
        self.stall_deadline = None;
        // A stalled segment is an untagged Send or Immediate Data (`starved`): taking a
        // receive for it touches no registered memory.
        if let Err(f) = self.on_segment(seg, &mut NoMemory) {
            let st = self.fault_status(&f, &seg);
            self.terminate(f, Some(&seg), st);
        }
    }

    /// A Send or Immediate Data message that needs a receive while none is posted, and
    /// that passes every check `on_segment` makes before it would take one: it may wait
    /// ([`Config::rnr_wait_ms`]) instead of drawing a Terminate.
    fn starved(&self, seg: &RxSegment) -> bool {
        if self.cfg.rnr_wait_ms == 0
            || self.state != State::Established
            || self.recv_cur.is_some()
            || !self.recvq.is_empty()
        {
            return false;
        }
        let d = &seg.ddp;
        let BufferModel::Untagged { qn: q, msn, mo, .. } = d.model else {
            return false;
        };
        let Some(op) = d.rdmap.op() else {
            return false;
        };
        if q != qn::SEND
            || msn != self.rx_msn[q as usize]
            || mo != 0
            || d.dv != crate::ddp::DDP_VERSION
            || d.rdmap.rv != crate::rdmap::RDMAP_VERSION
            || (op.is_extension() && !self.neg.as_ref().is_some_and(|n| n.extensions))
        {
            return false;
        }
        match op {
            op if op.is_send() => true,
            // Immediate Data consumes a receive unless it announces a Send with Immediate.
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                let b = self.deframer.control();
                d.last
                    && b.len() >= 8
                    && u64::from_be_bytes(b[..8].try_into().unwrap()) >> 32 != u64::from(SEND_IMM_TAG)
            }
            _ => false,
        }
    }

    /// Receives posted and not yet used.
    pub fn recv_posted(&self) -> usize {
        self.recvq.len()
    }

    /// Post a Send of `len` bytes taken from the work request's gather list.
    pub fn post_send(&mut self, wr_id: u64, flags: SendFlags, len: u32) -> Result<(), PostError> {
        self.can_post()?;
        self.push_sq(SqWr::Send {
            wr_id,
            flags,
            len,
            imm: None,
        });
        Ok(())
    }

    /// Post a Send with Immediate Data (`IBV_WR_SEND_WITH_IMM`), uiw peers
    /// only. RFC 7306 has no such message (§4.1 Figure 2 defines Immediate
    /// Data alone, and a Write followed by one as Write with Immediate, §6),
    /// so it goes out as an Immediate Data message whose upper word is
    /// [`SEND_IMM_TAG`] followed by the Send: a uiw receiver consumes one
    /// receive for the pair and reports one completion carrying `imm`. The
    /// two messages are well-formed RFC 7306 / RFC 5040 ones, but the pairing
    /// is uiw's: an RFC 7306 receiver that is not uiw would complete one
    /// receive with the tagged word (§6.3: each Immediate Data message
    /// consumes an untagged buffer) and another with the Send.
    pub fn post_send_imm(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        len: u32,
        imm: u32,
    ) -> Result<(), PostError> {
        self.can_post_ext()?;
        self.push_sq(SqWr::Send {
            wr_id,
            flags,
            len,
            imm: Some(imm),
        });
        Ok(())
    }

    /// Post an RDMA Write to `(stag, to)`; with `imm`, an RFC 7306 Immediate
    /// Data message follows (Write with Immediate).
    pub fn post_write(
        &mut self,
        wr_id: u64,
        stag: u32,
        to: u64,
        len: u32,
        imm: Option<u64>,
    ) -> Result<(), PostError> {
        self.can_post()?;
        if imm.is_some() && !self.ext_ok() {
            return Err(PostError::NotSupported);
        }
        self.push_sq(SqWr::Write {
            wr_id,
            stag,
            to,
            len,
            imm,
        });
        Ok(())
    }

    /// Frames a lone message at once: a Send or RDMA Write whose payload fits one FPDU
    /// (MULPDU, RFC 5044 §4.1), posted when nothing else waits to go out or to complete.
    ///
    /// The connection moves exactly as [`Connection::post_send`] (or
    /// [`Connection::post_write`]) followed by [`Connection::next_tx`] would move it — the
    /// message takes the next MSN of the Send queue (RFC 5041 §5.1), the next send-queue
    /// sequence number, and counts as one FPDU and one message —, and the caller gets the
    /// segment `next_tx` would have handed out and the completion it would have queued as an
    /// event. What that path goes through on the way (the posted-WR queue, the message being
    /// transmitted, the completion slots, the event queue) is skipped: on a ping-pong of small
    /// messages it was a fifth of a post's cost. The caller must frame the segment: the
    /// message is sent as far as the connection knows (its payload is read before this call,
    /// so it cannot turn out to be gone after it, as [`Connection::abort_source`] handles).
    ///
    /// `None`, and nothing changed: the message must take the general path.
    pub fn send_lone(&mut self, wr_id: u64, msg: LoneMsg, len: u32) -> Option<(TxSegment, Completion)> {
        if !self.tx_idle() || !self.sq_slots.is_empty() || len as usize > self.mulpdu {
            return None;
        }
        let (op, target, wc) = match msg {
            LoneMsg::Send(flags) => {
                let (op, target) = flags.message(self.tx_msn[qn::SEND as usize]);
                (op, target, WcOpcode::Send)
            }
            LoneMsg::Write { stag, to } => (Opcode::Write, Target::Tagged { stag, to }, WcOpcode::RdmaWrite),
        };
        let plan = self.segmenter(op, target, len, self.mulpdu).next()?;
        if !plan.last {
            return None;
        }
        if let LoneMsg::Send(_) = msg {
            self.next_msn(qn::SEND);
        }
        self.sq_head += 1;
        self.tx_completed_last = None;
        self.counters.tx_fpdus += 1;
        self.counters.tx_bytes += u64::from(plan.payload_len);
        self.counters.tx_msgs += 1;
        let seg = TxSegment {
            header: plan.header,
            payload_len: plan.payload_len,
            source: Source::Wr { wr_id, offset: 0 },
            crc: self.crc,
        };
        Some((seg, Completion::new(wr_id, wc, WcStatus::Success, len)))
    }

    /// Our ORD as negotiated (the peer's IRD, RFC 6581): how many Reads and Atomics may be
    /// outstanding at once; 0 before negotiation, or where none were granted.
    fn ord(&self) -> usize {
        self.neg.as_ref().map(|n| n.ord).unwrap_or(0) as usize
    }

    /// Reads and Atomics outstanding: what counts against the peer's IRD, our ORD (RFC 6581;
    /// RFC 7306 §5.2 for Atomics).
    fn ord_used(&self) -> usize {
        self.orq.iter().filter(|r| !r.rtr).count() + self.atomics.len()
    }

    /// Whether nothing waits to go out: the next message posted would be the next one
    /// handed out.
    fn tx_idle(&self) -> bool {
        self.state == State::Established
            && self.tx_hold.is_none()
            && self.mpa_out.is_empty()
            && self.cur_tx.is_none()
            && self.tx_follow.is_empty()
            && self.rsp.is_empty()
            && self.sq.is_empty()
    }

    /// Frames a lone RDMA Read Request at once (RFC 5040 §4.4): a Read posted when nothing
    /// else waits to go out and the peer's IRD (our ORD, RFC 6581) has room for it. The
    /// connection moves exactly as [`Connection::post_read`] followed by
    /// [`Connection::next_tx`] would move it (the Read takes the next sequence number and the
    /// next MSN of the Read Request queue, and is outstanding until its response), and the
    /// caller gets the FPDU `next_tx` would have handed out, framed whole without the heap.
    /// The Read completes when its response has been placed, as any. `None`, and nothing
    /// changed: the Read takes the general path.
    pub fn read_lone(&mut self, wr_id: u64, local_stag: u32, local_to: u64, stag: u32, to: u64, len: u32) -> Option<segment::ReadRequestFpdu> {
        let ord = self.ord();
        if !self.tx_idle() || ord == 0 || self.ord_used() >= ord {
            return None;
        }
        let seq = self.sq_head + self.sq_slots.len() as u64;
        self.sq_slots.push_back(None);
        self.tx_completed_last = None;
        let read = ReadWr { seq, wr_id, local_stag, local_to, len, done: 0, rtr: false };
        let body = self.read_outstanding(read, stag, to);
        let msn = self.next_msn(qn::READ_REQUEST);
        let d = DdpHeader::untagged(qn::READ_REQUEST, msn, 0, 0, true, RdmapCtrl::new(Opcode::ReadRequest));
        let fpdu = segment::read_request_fpdu(self.crc, &d, &body);
        self.count_tx_control();
        Some(fpdu)
    }

    /// Post an RDMA Read of `len` bytes from the peer's `(stag, to)` into our
    /// `(local_stag, local_to)`. At most ORD reads are outstanding; later
    /// ones wait (and so does everything posted after them).
    pub fn post_read(
        &mut self,
        wr_id: u64,
        local_stag: u32,
        local_to: u64,
        stag: u32,
        to: u64,
        len: u32,
    ) -> Result<(), PostError> {
        self.can_post()?;
        self.push_sq(SqWr::Read {
            wr_id,
            local_stag,
            local_to,
            stag,
            to,
            len,
        });
        Ok(())
    }

    /// Post an RFC 7306 atomic (§5) on the peer's 8 bytes at `(stag, to)`; the
    /// original value is returned in the completion and stored at
    /// `result = (local_stag, local_to)` by the copying API. The libibverbs
    /// operations are [`AtomicOperation::fetch_add`] and
    /// [`AtomicOperation::cmp_swap`].
    pub fn post_atomic(
        &mut self,
        wr_id: u64,
        op: AtomicOperation,
        result: (u32, u64),
        stag: u32,
        to: u64,
    ) -> Result<(), PostError> {
        self.can_post_ext()?;
        self.push_sq(SqWr::Atomic {
            wr_id,
            op,
            result,
            stag,
            to,
        });
        Ok(())
    }

    /// Post a standalone RFC 7306 Immediate Data message.
    pub fn post_immediate(
        &mut self,
        wr_id: u64,
        imm: u64,
        solicited: bool,
    ) -> Result<(), PostError> {
        self.can_post_ext()?;
        self.push_sq(SqWr::Imm {
            wr_id,
            imm,
            solicited,
        });
        Ok(())
    }

    /// Fence (IBV_SEND_FENCE on the next work request): work requests
    /// posted after this are not started before all earlier RDMA Reads and
    /// Atomics have completed.
    pub fn post_fence(&mut self) -> Result<(), PostError> {
        self.can_post()?;
        self.sq.push_back(Posted {
            seq: u64::MAX,
            wr: SqWr::Fence,
        });
        Ok(())
    }

    /// Post a work request that puts nothing on the wire (`IBV_WR_LOCAL_INV`): its
    /// completion comes in posting order, once every work request posted before it has
    /// started; the engine does the work when it sees that completion.
    pub fn post_local(&mut self, wr_id: u64) -> Result<(), PostError> {
        self.can_post()?;
        self.push_sq(SqWr::Local { wr_id });
        Ok(())
    }

    fn push_sq(&mut self, wr: SqWr) {
        let seq = self.sq_head + self.sq_slots.len() as u64;
        self.sq_slots.push_back(None);
        self.sq.push_back(Posted { seq, wr });
    }

    /// Record a send-queue completion and release those now in order.
    fn sq_complete(&mut self, seq: u64, c: Completion) {
        let i = seq.wrapping_sub(self.sq_head) as usize;
        if let Some(slot) = self.sq_slots.get_mut(i) {
            *slot = Some(c);
        }
        while let Some(Some(_)) = self.sq_slots.front() {
            let c = self.sq_slots.pop_front().unwrap().unwrap();
            self.sq_head += 1;
            self.events.push_back(Event::Completion(c));
        }
    }

    /// Post an RFC 7306 operation even though it was not negotiated (tests
    /// of the peer's "unexpected opcode" handling).
    #[doc(hidden)]
    pub fn post_immediate_unchecked(&mut self, wr_id: u64, imm: u64) {
        self.push_sq(SqWr::Imm {
            wr_id,
            imm,
            solicited: false,
        });
    }

    /// [`Self::can_post`] for an RFC 7306 operation: also `NotSupported` unless both
    /// peers offered the extensions.
    fn can_post_ext(&self) -> Result<(), PostError> {
        self.can_post()?;
        if self.ext_ok() {
            Ok(())
        } else {
            Err(PostError::NotSupported)
        }
    }

    fn ext_ok(&self) -> bool {
        match &self.neg {
            Some(n) => n.extensions,
            None => self.cfg.extensions,
        }
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------

    /// Copying convenience: append the next transmit unit to `out`.
    /// Returns false when there is nothing to send now.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>, mem: &impl MemoryIo) -> bool {
        match self.next_tx() {
            None => false,
            Some(Tx::Bytes(b)) => {
                out.extend_from_slice(&b);
                true
            }
            Some(Tx::Segment(s)) => {
                out.extend_from_slice(s.header.as_slice());
                let start = out.len();
                out.resize(start + s.payload_len as usize, 0);
                if s.payload_len > 0 {
                    mem.read(s.source, &mut out[start..]);
                }
                let t = s.trailer(&[&out[start..]]);
                out.extend_from_slice(t.as_slice());
                true
            }
        }
    }

    /// Whether [`Connection::next_tx`] may hand out something now: when false, it would hand
    /// out nothing (a poll of an idle stream need not ask).
    pub fn tx_pending(&self) -> bool {
        !self.mpa_out.is_empty()
            || match self.state {
                State::Established => {
                    self.tx_hold.is_none()
                        && (self.cur_tx.is_some() || !self.tx_follow.is_empty() || !self.rsp.is_empty() || !self.sq.is_empty())
                }
                State::Error => !self.rsp.is_empty(),
                _ => false,
            }
    }

    /// Zero-copy transmit: the next unit to send. Handing out the last
    /// segment of a Send or Write completes it (as siw does).
    pub fn next_tx(&mut self) -> Option<Tx> {
        self.tx_completed_last = None;
        if !self.mpa_out.is_empty() {
            return Some(Tx::Bytes(std::mem::take(&mut self.mpa_out)));
        }
        match self.state {
            State::Established if self.tx_hold.is_some() => return None,
            State::Established => {}
            State::Error => {
                // Only a pending Terminate goes out.
                return self.rsp.pop_front().and_then(|i| match i {
                    TxItem::Control { bytes, .. } => {
                        self.count_tx_control();
                        Some(Tx::Bytes(bytes))
                    }
                    TxItem::Msg(_) => None,
                });
            }
            _ => return None,
        }
        if let Some(m) = &mut self.cur_tx {
            if let Some(p) = m.pre.take() {
                self.count_tx_control();
                return Some(Tx::Bytes(p));
            }
            if let Some(plan) = m.seg.next() {
                self.counters.tx_fpdus += 1;
                self.counters.tx_bytes += u64::from(plan.payload_len);
                self.counters.tx_msgs += u64::from(plan.last);
                let seg = TxSegment {
                    header: plan.header,
                    payload_len: plan.payload_len,
                    source: m.source.advance(plan.msg_offset),
                    crc: self.crc,
                };
                if plan.last {
                    let m = self.cur_tx.take().unwrap();
                    if m.is_read_resp {
                        self.irq_busy = self.irq_busy.saturating_sub(1);
                    }
                    if let Some(t) = m.then {
                        self.tx_follow.push_back(t);
                    }
                    if let Some((seq, c)) = m.on_done {
                        self.tx_completed_last = Some((seq, c.wr_id));
                        self.sq_complete(seq, c);
                    }
                }
                return Some(Tx::Segment(seg));
            }
            self.cur_tx = None;
        }
        if let Some(b) = self.tx_follow.pop_front() {
            if std::mem::take(&mut self.tx_rtr_uncounted) {
                return Some(Tx::Bytes(b));
            }
            self.count_tx_control();
            return Some(Tx::Bytes(b));
        }
        if let Some(item) = self.rsp.pop_front() {
            match item {
                TxItem::Control { bytes, on_done, resp } => {
                    if resp {
                        self.irq_busy = self.irq_busy.saturating_sub(1);
                    }
                    if let Some((seq, c)) = on_done {
                        self.sq_complete(seq, c);
                    }
                    self.count_tx_control();
                    return Some(Tx::Bytes(bytes));
                }
                TxItem::Msg(m) => {
                    self.cur_tx = Some(m);
                    return self.next_tx();
                }
            }
        }
        let front = self.sq.front()?;
        if let SqWr::Fence = front.wr {
            if self.orq.iter().any(|r| !r.rtr) || !self.atomics.is_empty() {
                return None;
            }
            self.sq.pop_front();
            return self.next_tx();
        }
        let front = self.sq.front()?;
        if let SqWr::Read { wr_id, .. } = front.wr {
            let seq = front.seq;
            let ord = self.ord();
            if ord == 0 {
                // No outbound reads negotiated (e.g. siw as a rev-1 peer).
                self.sq.pop_front();
                self.sq_complete(
                    seq,
                    Completion::new(wr_id, WcOpcode::RdmaRead, WcStatus::LocQpOpErr, 0),
                );
                return self.next_tx();
            }
            if self.ord_used() >= ord {
                return None; // wait for a Read/Atomic Response (ORD)
            }
        }
        if let SqWr::Atomic { .. } = front.wr {
            // RFC 7306 §5.2: Atomic Requests count against the peer's IRD (our ORD) with the
            // Reads; the responder Terminates a requester that overruns it.
            let ord = self.ord();
            if ord > 0 && self.ord_used() >= ord {
                return None;
            }
        }
        let wr = self.sq.pop_front().unwrap();
        self.start_sq(wr);
        self.next_tx()
    }

    /// One single-FPDU control message handed out (Read Request, atomics, Immediate Data,
    /// Terminate).
    fn count_tx_control(&mut self) {
        self.counters.tx_fpdus += 1;
        self.counters.tx_msgs += 1;
    }

    /// The segmenter of one outgoing message (see [`Config::even_segments`]).
    fn segmenter(&self, op: Opcode, target: Target, len: u32, mulpdu: usize) -> Segmenter {
        if self.even_segments {
            Segmenter::even(op, target, len, mulpdu)
        } else {
            Segmenter::new(op, target, len, mulpdu)
        }
    }

    fn control_fpdu(&self, ddp: &DdpHeader, body: &[u8], payload: &[u8]) -> Vec<u8> {
        // Room for the whole FPDU at once: grown as its three parts were appended, the buffer
        // was allocated and then moved once more.
        let mut v = Vec::with_capacity(mpa::fpdu_len(segment::MAX_HDR + body.len() + payload.len()));
        segment::encode_fpdu(ddp, body, payload, self.crc, &mut v);
        v
    }

    /// One untagged single-FPDU message on queue `q` (the next MSN of that queue): Read and
    /// Atomic Requests/Responses, Immediate Data, Terminate, the Send RTR.
    fn control_message(&mut self, q: u32, op: Opcode, body: &[u8], payload: &[u8]) -> Vec<u8> {
        let msn = self.next_msn(q);
        let d = DdpHeader::untagged(q, msn, 0, 0, true, RdmapCtrl::new(op));
        self.control_fpdu(&d, body, payload)
    }

    fn next_msn(&mut self, q: u32) -> u32 {
        let m = self.tx_msn[q as usize];
        self.tx_msn[q as usize] = m.wrapping_add(1);
        m
    }

    fn start_sq(&mut self, p: Posted) {
        let wc = p.wr.wc_opcode();
        let seq = p.seq;
        match p.wr {
            SqWr::Send {
                wr_id,
                flags,
                len,
                imm,
            } => {
                let pre = imm.map(|v| {
                    let word = (u64::from(SEND_IMM_TAG) << 32) | u64::from(v);
                    self.control_message(qn::SEND, Opcode::ImmediateData, &[], &word.to_be_bytes())
                });
                let (op, target) = flags.message(self.next_msn(qn::SEND));
                self.cur_tx = Some(OutMsg {
                    seg: self.segmenter(op, target, len, self.mulpdu),
                    source: Source::Wr { wr_id, offset: 0 },
                    on_done: Some((seq, Completion::new(wr_id, wc, WcStatus::Success, len))),
                    pre,
                    then: None,
                    is_read_resp: false,
                });
            }
            SqWr::Write {
                wr_id,
                stag,
                to,
                len,
                imm,
            } => {
                let then = imm.map(|v| {
                    self.control_message(qn::SEND, Opcode::ImmediateData, &[], &v.to_be_bytes())
                });
                self.cur_tx = Some(OutMsg {
                    seg: self.segmenter(
                        Opcode::Write,
                        Target::Tagged { stag, to },
                        len,
                        self.mulpdu,
                    ),
                    source: Source::Wr { wr_id, offset: 0 },
                    on_done: Some((seq, Completion::new(wr_id, wc, WcStatus::Success, len))),
                    pre: None,
                    then,
                    is_read_resp: false,
                });
            }
            SqWr::Read {
                wr_id,
                local_stag,
                local_to,
                stag,
                to,
                len,
            } => {
                let read = ReadWr { seq, wr_id, local_stag, local_to, len, done: 0, rtr: false };
                self.send_read_request(read, stag, to);
            }
            SqWr::Atomic {
                wr_id,
                op,
                result,
                stag,
                to,
            } => {
                let req_id = self.next_atomic_id;
                self.next_atomic_id = self.next_atomic_id.wrapping_add(1);
                // RFC 7306 §5.2.1: masks and unused fields as the operation defines them
                // (a plain FetchAdd sends Add Mask 0, Compare Data 0, Compare Mask all ones).
                let body = AtomicRequest::new(req_id, stag, to, op);
                let mut b = [0u8; crate::rdmap::ATOMIC_REQ_LEN];
                body.encode(&mut b);
                let bytes =
                    self.control_message(qn::ATOMIC_REQUEST, Opcode::AtomicRequest, &b, &[]);
                self.atomics.push_back(AtomicWr {
                    seq,
                    wr_id,
                    req_id,
                    result,
                    opcode: wc,
                });
                self.tx_follow.push_back(bytes);
            }
            SqWr::Fence => {}
            SqWr::Local { wr_id } => {
                self.sq_complete(seq, Completion::new(wr_id, wc, WcStatus::Success, 0));
            }
            SqWr::Imm {
                wr_id,
                imm,
                solicited,
            } => {
                let op = if solicited {
                    Opcode::ImmediateDataSe
                } else {
                    Opcode::ImmediateData
                };
                let bytes = self.control_message(qn::SEND, op, &[], &imm.to_be_bytes());
                self.sq_complete(seq, Completion::new(wr_id, wc, WcStatus::Success, 0));
                self.tx_follow.push_back(bytes);
            }
        }
    }

    /// Queues the Read Request of `read` for the peer's `(stag, to)`.
    fn send_read_request(&mut self, read: ReadWr, stag: u32, to: u64) {
        let b = self.read_outstanding(read, stag, to);
        let bytes = self.control_message(qn::READ_REQUEST, Opcode::ReadRequest, &b, &[]);
        self.tx_follow.push_back(bytes);
    }

    /// `read`, from the peer's `(stag, to)`, is outstanding from now on (until its response is
    /// placed); returns its Read Request's body (RFC 5040 §4.4).
    fn read_outstanding(&mut self, read: ReadWr, stag: u32, to: u64) -> [u8; crate::rdmap::READ_REQ_LEN] {
        let rr = ReadRequest {
            sink_stag: read.local_stag,
            sink_to: read.local_to,
            size: read.len,
            src_stag: stag,
            src_to: to,
        };
        let mut b = [0u8; crate::rdmap::READ_REQ_LEN];
        rr.encode(&mut b);
        self.orq.push_back(read);
        b
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------

    /// What the receive side needs next.
    pub fn rx_want(&self) -> RxWant {
        match self.state {
            State::WaitReply | State::WaitRequest => {
                let need = if self.mpa_in.len() < MPA_HDR {
                    MPA_HDR
                } else {
                    MPA_HDR + u16::from_be_bytes([self.mpa_in[18], self.mpa_in[19]]) as usize
                };
                RxWant::Bytes(need.saturating_sub(self.mpa_in.len()).max(1))
            }
            State::Error | State::Closed | State::Rejected => RxWant::Discard,
            State::WaitAccept => RxWant::Wait,
            State::Established | State::WaitRtr if self.rx_stalled.is_some() => RxWant::Wait,
            State::Established | State::WaitRtr => match self.deframer.want() {
                segment::Want::Header(n) | segment::Want::Trailer(n) => RxWant::Bytes(n),
                segment::Want::Payload(n) => match &self.rx_cur {
                    Some(c) => RxWant::Place {
                        len: n,
                        place: c.place.advance(c.done),
                    },
                    None => RxWant::Place {
                        len: n,
                        place: Placement::Discard,
                    },
                },
            },
        }
    }

    /// Copying convenience: consume stream bytes, placing payload through
    /// `mem`. Returns the number of bytes consumed (call again with the
    /// rest); 0 only while waiting for `accept`/`reject`.
    pub fn handle_bytes(&mut self, data: &[u8], mem: &mut impl MemoryIo) -> usize {
        if data.is_empty() {
            return 0;
        }
        let n = match self.rx_want() {
            RxWant::Wait => 0,
            RxWant::Discard => data.len(),
            RxWant::Bytes(_) => self.rx_bytes(data, mem),
            RxWant::Place { len, place } => {
                let n = (len as usize).min(data.len());
                mem.write(place, &data[..n]);
                self.rx_placed(&data[..n], mem);
                n
            }
        };
        self.store_atomic_result(mem);
        n
    }

    /// Copying convenience over [`Connection::rx_staged`], as
    /// [`Connection::handle_bytes`] is over the one-step API: the payload
    /// is written through `mem` once the call returns (nothing in the call
    /// reads it). Returns the bytes consumed; 0 where `rx_staged` stops at
    /// once (a Send waiting for a receive, an event not yet taken, input
    /// outside an established stream: `handle_bytes` takes that step).
    pub fn handle_staged(&mut self, data: &[u8], mem: &mut impl MemoryIo) -> usize {
        let mut writes = Vec::new();
        let n = self.rx_staged(data, mem, |at, bytes| {
            writes.push((at, bytes.to_vec()));
            bytes.len()
        });
        for (at, bytes) in writes {
            mem.write(at, &bytes);
        }
        // An Atomic Response's completion stops `rx_staged`: one result at most.
        self.store_atomic_result(mem);
        n
    }

    /// Copying API: an Atomic Response's original value goes to the
    /// requester's result buffer (the zero-copy API hands it out in the
    /// completion instead).
    fn store_atomic_result(&mut self, mem: &mut impl MemoryIo) {
        if let Some(((stag, to), v)) = self.pending_atomic_store.take() {
            mem.write(Placement::Tagged { stag, to }, &v.to_ne_bytes());
        }
    }

    /// Zero-copy API: consume framing bytes (MPA frames, headers, trailers).
    /// Returns bytes consumed; if the deframer is in a payload state the
    /// bytes are treated as payload to be *discarded* (use `rx_placed`).
    pub fn rx_bytes(&mut self, data: &[u8], mem: &mut impl Memory) -> usize {
        match self.state {
            State::WaitReply | State::WaitRequest => self.rx_mpa(data),
            State::WaitAccept => 0,
            State::Error | State::Closed | State::Rejected => data.len(),
            State::Established | State::WaitRtr => {
                if let segment::Want::Payload(_) = self.deframer.want() {
                    return self.rx_placed(data, mem);
                }
                self.rx_stream(data, mem)
            }
        }
    }

    /// Zero-copy API for bytes already read into a buffer of the caller's
    /// (a staging buffer): takes framing and payload alike, one FPDU after
    /// another, placing payload through `place(placement, bytes)`, which
    /// writes a prefix of `bytes` at `placement` and returns its length
    /// (0: not placed, nothing written). Stops where `data` ends, where
    /// `place` placed nothing, where the connection has an event to hand out
    /// (a completion frees a receive the next Send may name), or where the
    /// receive side wants anything but framing or payload bytes (a Send
    /// waiting for a receive, input after an error): the caller takes it
    /// from there with [`Connection::rx_want`]. Returns the bytes consumed.
    ///
    /// The same steps as `rx_want`, `rx_bytes` and `rx_placed` in a loop of
    /// the caller's, in one call: a small FPDU staged whole is a header, a
    /// payload and a trailer.
    pub fn rx_staged(&mut self, data: &[u8], mem: &mut impl Memory, mut place: impl FnMut(Placement, &[u8]) -> usize) -> usize {
        let mut n = 0;
        while n < data.len() && self.state == State::Established && self.rx_stalled.is_none() && self.events.is_empty() {
            let rest = &data[n..];
            let k = match self.deframer.want() {
                segment::Want::Header(_) | segment::Want::Trailer(_) => self.rx_stream(rest, mem),
                segment::Want::Payload(len) => match self.rx_cur.as_ref().map(|c| c.place.advance(c.done)) {
                    Some(Placement::Discard) | None => self.rx_stream(rest, mem),
                    Some(at) => {
                        let chunk = &rest[..rest.len().min(len as usize)];
                        let placed = place(at, chunk).min(chunk.len());
                        if placed == 0 {
                            break;
                        }
                        self.rx_stream(&chunk[..placed], mem)
                    }
                },
            };
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }

    /// Zero-copy API: `placed` payload bytes were written at the placement
    /// returned by `rx_want`. Returns bytes accounted.
    pub fn rx_placed(&mut self, placed: &[u8], mem: &mut impl Memory) -> usize {
        if !matches!(self.state, State::Established | State::WaitRtr) {
            return placed.len();
        }
        self.rx_stream(placed, mem)
    }

    /// Zero-copy API on a connection without CRC: `n` payload bytes were
    /// written at the placement returned by `rx_want`, and the engine need
    /// not show them (nothing but a CRC would look at them). Returns bytes
    /// accounted. With CRC on, use [`Connection::rx_placed_in_place`].
    pub fn rx_placed_len(&mut self, n: usize, mem: &mut impl Memory) -> usize {
        debug_assert!(!self.crc);
        self.rx_placed_in_place(n, |_, _| {}, mem)
    }

    /// Zero-copy API: `n` payload bytes were written at the placement
    /// returned by `rx_want` (received straight into registered memory),
    /// and the engine checksums them where they are: with CRC in use,
    /// `crc(k, c)` must update `c` with the first `k` placed bytes, read
    /// back in place (RFC 5044 §6). The segment completes only once its
    /// trailer arrived and the CRC matched; on a mismatch the stream is
    /// terminated with the MPA CRC error and nothing of it completes (RFC
    /// 5044 §8). Returns bytes accounted (at most the payload left).
    pub fn rx_placed_in_place(&mut self, n: usize, crc: impl FnOnce(usize, &mut Crc32c), mem: &mut impl Memory) -> usize {
        if !matches!(self.state, State::Established | State::WaitRtr) {
            return n;
        }
        let (k, ev) = self.deframer.feed_placed(n, crc);
        self.rx_event(ev, mem);
        k
    }

    /// The stream's MSS is now `mss`: messages segmented from here on use FPDUs up to the
    /// MULPDU it gives ([`mpa::mulpdu`]); one already in segmentation keeps its FPDU size.
    /// MULPDU follows the current EMSS (RFC 5044 §4.1), which grows over a connection's
    /// life: Linux bounds the MSS by half the largest window the peer has offered, 32 KiB on
    /// a fresh loopback connection and 64 KiB once data has flowed. siw likewise sizes each
    /// FPDU from the socket's current `mss_cache` (`siw_update_tcpseg`). Receivers take FPDUs
    /// of any size up to their own limit ([`Config::max_rx_ulpdu`]), so the sender alone
    /// decides.
    pub fn set_mss(&mut self, mss: usize) {
        self.mulpdu = mpa::mulpdu(mss);
    }

    /// The largest ULPDU this side puts in one FPDU now (see [`Connection::set_mss`]).
    pub fn mulpdu(&self) -> usize {
        self.mulpdu
    }

    /// Whether MPA CRC32c is in use on this connection (known once
    /// established).
    pub fn crc(&self) -> bool {
        self.crc
    }

    fn rx_stream(&mut self, data: &[u8], mem: &mut impl Memory) -> usize {
        let (n, ev) = match self.deframer.feed(data) {
            Ok(x) => x,
            Err(e) => {
                let code = match e {
                    FrameError::UlpduTooShort(_) => TermCode::DDP_LOCAL_CATASTROPHIC,
                    FrameError::ControlTooLong(_) => TermCode::DDP_LOCAL_CATASTROPHIC,
                    FrameError::UlpduTooLong(_) => TermCode::DDP_LOCAL_CATASTROPHIC,
                };
                self.terminate(Fault::bare(code), None, WcStatus::GeneralErr);
                return data.len();
            }
        };
        self.rx_event(ev, mem);
        n
    }

    /// What a deframer event does to the connection.
    fn rx_event(&mut self, ev: Option<RxEvent>, mem: &mut impl Memory) {
        match ev {
            None => {}
            Some(RxEvent::Segment(seg)) if self.starved(&seg) => {
                self.rx_stalled = Some(seg);
                self.stall_deadline = None;
            }
            Some(RxEvent::Segment(seg)) => {
                if let Err(f) = self.on_segment(seg, mem) {
                    let st = self.fault_status(&f, &seg);
                    self.terminate(f, Some(&seg), st);
                }
            }
            Some(RxEvent::Payload(k)) => {
                if let Some(c) = &mut self.rx_cur {
                    c.done += k as u32;
                }
            }
            Some(RxEvent::End { crc_ok }) => {
                if !crc_ok {
                    self.terminate(Fault::bare(TermCode::MPA_CRC), None, WcStatus::GeneralErr);
                } else if let Some(cur) = self.rx_cur.take() {
                    if let Err(f) = self.on_segment_end(cur, mem) {
                        let st = self.fault_status(&f, &cur.seg);
                        self.terminate(f, Some(&cur.seg), st);
                    }
                }
            }
        }
    }

    fn fault_status(&self, f: &Fault, seg: &RxSegment) -> WcStatus {
        match seg.ddp.rdmap.op() {
            Some(Opcode::ReadResponse) => WcStatus::LocProtErr,
            Some(op)
                if op.is_send()
                    && f.code == TermCode::DDP_U_NO_BUFFER
                    && self.recv_cur.is_some() =>
            {
                WcStatus::LocLenErr
            }
            _ => WcStatus::GeneralErr,
        }
    }

    fn rx_mpa(&mut self, data: &[u8]) -> usize {
        let want = match self.rx_want() {
            RxWant::Bytes(n) => n,
            _ => return 0,
        };
        let take = want.min(data.len());
        self.mpa_in.extend_from_slice(&data[..take]);
        let parsed = match RrFrame::parse(&self.mpa_in) {
            Ok((f, _)) => Some((f.hdr, f.private_data.to_vec())),
            Err(crate::error::WireError::Truncated { .. }) => None,
            Err(_) => {
                self.fail(Failure::BadMpaFrame);
                return data.len();
            }
        };
        if let Some((hdr, pd)) = parsed {
            self.mpa_in.clear();
            let frame = RrFrame {
                hdr,
                private_data: &pd,
            };
            match (self.cfg.role, hdr.kind) {
                (Role::Responder, FrameKind::Request) => self.on_request(&frame),
                (Role::Initiator, FrameKind::Reply) => self.on_reply(&frame),
                _ => self.fail(Failure::BadMpaFrame),
            }
        }
        take
    }

    fn on_request(&mut self, f: &RrFrame<'_>) {
        let rev = f.hdr.revision;
        if rev == 0 || rev > 2 {
            self.fail(Failure::BadMpaFrame);
            return;
        }
        let rev = rev.min(self.cfg.revision.max(1));
        let enhanced = rev == 2 && f.hdr.enhanced();
        let peer = f.ird_ord();
        let mut flags = 0;
        let crc = f.hdr.crc() || self.cfg.crc;
        if crc {
            flags |= mpa::FLAG_CRC;
        }
        let ext = self.cfg.extensions && f.hdr.flags & mpa::FLAG_UIW_EXT != 0;
        if ext {
            flags |= mpa::FLAG_UIW_EXT_ACK;
        }
        if f.hdr.markers() {
            // We never do markers: reject, as siw does.
            let io = if enhanced {
                Some(IrdOrd::default())
            } else {
                None
            };
            mpa::encode_rr(
                FrameKind::Reply,
                flags | mpa::FLAG_REJECT,
                rev,
                io,
                &[],
                &mut self.mpa_out,
            );
            self.state = State::Rejected;
            self.deadline = None;
            self.events.push_back(Event::Rejected {
                by_peer: false,
                private_data: f.ulp_private_data().to_vec(),
            });
            return;
        }
        if self.cfg.manual_accept && self.pending_req.is_none() {
            self.pending_req = Some((f.hdr, f.private_data.to_vec()));
            self.state = State::WaitAccept;
            self.deadline = None;
            self.events.push_back(Event::ConnectRequest(ConnectRequest {
                revision: f.hdr.revision,
                crc: f.hdr.crc(),
                ird_ord: peer,
                extensions: f.hdr.flags & mpa::FLAG_UIW_EXT != 0,
                private_data: f.ulp_private_data().to_vec(),
            }));
            return;
        }
        // RFC 6581 §5: our IRD covers the initiator's ORD, our ORD is
        // limited by its IRD.
        let (ird, ord) = match peer {
            Some(p) => (
                self.cfg
                    .ird
                    .min(p.ord.max(if p.p2p && p.read_rtr { 1 } else { 0 })),
                self.cfg.ord.min(p.ird),
            ),
            None => (self.cfg.ird, self.cfg.ord),
        };
        let mut p2p = false;
        let mut reply_io = enhanced.then(|| IrdOrd {
            ird,
            ord,
            ..Default::default()
        });
        if let (Some(p), Some(io)) = (peer, reply_io.as_mut()) {
            if p.p2p && self.cfg.p2p {
                // Choose one RTR: zero-length Write preferred (as siw).
                let pick = if p.write_rtr && self.cfg.rtr.write {
                    Some(RtrKind::Write)
                } else if p.read_rtr && self.cfg.rtr.read {
                    Some(RtrKind::Read)
                } else if p.send_rtr && self.cfg.rtr.send {
                    Some(RtrKind::Send)
                } else {
                    None
                };
                if let Some(k) = pick {
                    p2p = true;
                    io.p2p = true;
                    io.write_rtr = k == RtrKind::Write;
                    io.read_rtr = k == RtrKind::Read;
                    io.send_rtr = k == RtrKind::Send;
                    if k == RtrKind::Read && io.ird == 0 {
                        io.ird = 1;
                    }
                    self.rtr_kind = Some(k);
                }
            }
        }
        let (ird, ord) = reply_io.map(|io| (io.ird, io.ord)).unwrap_or((ird, ord));
        mpa::encode_rr(
            FrameKind::Reply,
            flags,
            rev,
            reply_io,
            &self.cfg.private_data,
            &mut self.mpa_out,
        );
        self.crc = crc;
        self.deframer = Deframer::new(crc).with_max_ulpdu(self.cfg.max_rx_ulpdu);
        let neg = Negotiated {
            revision: rev,
            crc,
            ird,
            ord,
            p2p,
            extensions: ext,
            private_data: f.ulp_private_data().to_vec(),
        };
        self.neg = Some(neg.clone());
        if p2p {
            self.state = State::WaitRtr;
        } else {
            self.state = State::Established;
            self.deadline = None;
            self.events.push_back(Event::Established(neg));
        }
    }

    /// Responder (`manual_accept`): answer the pending Request with our
    /// IRD/ORD and private data. `now_ms` starts the RTR timeout (P2P).
    pub fn accept(
        &mut self,
        ird: u16,
        ord: u16,
        private_data: &[u8],
        now_ms: u64,
    ) -> Result<(), PostError> {
        if self.state != State::WaitAccept {
            return Err(PostError::InvalidState);
        }
        let (hdr, pd) = self.pending_req.clone().ok_or(PostError::InvalidState)?;
        self.cfg.ird = ird;
        self.cfg.ord = ord;
        self.cfg.private_data = private_data.to_vec();
        self.deadline = Some(now_ms.saturating_add(self.cfg.mpa_timeout_ms));
        self.on_request(&RrFrame {
            hdr,
            private_data: &pd,
        });
        Ok(())
    }

    /// Responder (`manual_accept`): reject the pending Request (R=1).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), PostError> {
        if self.state != State::WaitAccept {
            return Err(PostError::InvalidState);
        }
        let (hdr, _) = self.pending_req.take().ok_or(PostError::InvalidState)?;
        let rev = hdr.revision.min(self.cfg.revision.max(1));
        let io = if rev == 2 && hdr.enhanced() {
            Some(IrdOrd::default())
        } else {
            None
        };
        mpa::encode_rr(
            FrameKind::Reply,
            mpa::FLAG_REJECT,
            rev,
            io,
            private_data,
            &mut self.mpa_out,
        );
        self.state = State::Rejected;
        Ok(())
    }

    fn on_reply(&mut self, f: &RrFrame<'_>) {
        self.deadline = None;
        if f.hdr.reject() {
            self.state = State::Rejected;
            self.events.push_back(Event::Rejected {
                by_peer: true,
                private_data: f.ulp_private_data().to_vec(),
            });
            return;
        }
        if f.hdr.markers() || f.hdr.revision == 0 || f.hdr.revision > self.cfg.revision.max(1) {
            self.fail(if f.hdr.markers() {
                Failure::Unsupported
            } else {
                Failure::BadMpaFrame
            });
            return;
        }
        let crc = f.hdr.crc() || self.cfg.crc;
        // Only a uiw responder sets the acknowledgement bit; siw echoes our offer bit.
        let ext = self.cfg.extensions && f.hdr.flags & mpa::FLAG_UIW_EXT_ACK != 0;
        // Our IRD stays as offered: the responder's ORD is ≤ it (RFC 6581).
        let (ird, mut ord) = (self.cfg.ird, self.cfg.ord);
        let mut p2p = false;
        if let Some(p) = f.ird_ord() {
            ord = ord.min(p.ird);
            if p.p2p && self.cfg.p2p {
                let k = if p.write_rtr {
                    Some(RtrKind::Write)
                } else if p.read_rtr {
                    Some(RtrKind::Read)
                } else if p.send_rtr {
                    Some(RtrKind::Send)
                } else {
                    None
                };
                p2p = k.is_some();
                self.rtr_kind = k;
            }
        }
        self.crc = crc;
        self.deframer = Deframer::new(crc).with_max_ulpdu(self.cfg.max_rx_ulpdu);
        let neg = Negotiated {
            revision: f.hdr.revision,
            crc,
            ird,
            ord,
            p2p,
            extensions: ext,
            private_data: f.ulp_private_data().to_vec(),
        };
        self.neg = Some(neg.clone());
        self.state = State::Established;
        // siw's P2P responder hooks its RTR reader after the Reply too (siw_accept), so the
        // RTR is held as well.
        if self.cfg.first_fpdu_hold_ms > 0 && !ext {
            self.tx_hold = Some(None);
        }
        // Initiator sends the RTR as its first FPDU (RFC 6581 §5).
        self.tx_rtr_uncounted = self.rtr_kind.is_some() && self.tx_follow.is_empty();
        match self.rtr_kind {
            Some(RtrKind::Write) => {
                let d = DdpHeader::tagged(1, 0, true, RdmapCtrl::new(Opcode::Write));
                let b = self.control_fpdu(&d, &[], &[]);
                self.tx_follow.push_back(b);
            }
            Some(RtrKind::Read) => {
                // Zero-length Read: its Read Response completes nothing.
                let rtr = ReadWr { seq: u64::MAX, wr_id: u64::MAX, local_stag: 1, local_to: 0, len: 0, done: 0, rtr: true };
                self.send_read_request(rtr, 1, 0);
            }
            Some(RtrKind::Send) => {
                let b = self.control_message(qn::SEND, Opcode::Send, &[], &[]);
                self.tx_follow.push_back(b);
            }
            None => {}
        }
        self.events.push_back(Event::Established(neg));
    }

    /// Handle a complete segment header; set up placement.
    fn on_segment(&mut self, seg: RxSegment, mem: &mut impl Memory) -> Result<(), Fault> {
        let d = &seg.ddp;
        if d.dv != crate::ddp::DDP_VERSION {
            return Err(Fault::echo(if d.is_tagged() {
                TermCode::DDP_T_INVALID_VERSION
            } else {
                TermCode::DDP_U_INVALID_VERSION
            }));
        }
        if d.rdmap.rv != crate::rdmap::RDMAP_VERSION {
            return Err(Fault::echo(TermCode::RDMAP_INVALID_VERSION));
        }
        let op = match d.rdmap.op() {
            Some(op)
                if !op.is_extension()
                    || self.neg.as_ref().map(|n| n.extensions).unwrap_or(false) =>
            {
                op
            }
            _ => return Err(Fault::echo(TermCode::RDMAP_UNEXPECTED_OPCODE)),
        };
        if op.is_tagged() != d.is_tagged() {
            return Err(Fault::echo(TermCode::RDMAP_UNEXPECTED_OPCODE));
        }
        if self.state == State::WaitRtr {
            return self.on_rtr(op, seg);
        }
        self.counters.rx_fpdus += 1;
        self.counters.rx_msgs += u64::from(d.last);
        if !op.is_control() {
            self.counters.rx_bytes += u64::from(seg.payload_len);
        }
        let len = seg.payload_len;
        let place;
        match d.model {
            BufferModel::Tagged { stag, to } => match op {
                Opcode::Write => {
                    if let Some((es, eto)) = self.write_cont {
                        if es != stag {
                            return Err(Fault::echo(TermCode::DDP_T_INVALID_STAG));
                        }
                        if eto != to {
                            return Err(Fault::echo(TermCode::DDP_T_BASE_BOUNDS));
                        }
                    }
                    if len > 0 {
                        mem.check_tagged(stag, to, len, Access::RemoteWrite)
                            .map_err(|e| Fault::echo(e.ddp_code()))?;
                    }
                    if self.write_cont.is_none() {
                        self.rx_write_len = 0;
                    }
                    self.rx_write_len = self.rx_write_len.wrapping_add(len);
                    self.write_cont = if d.last {
                        None
                    } else {
                        Some((stag, to.wrapping_add(len as u64)))
                    };
                    place = Placement::Tagged { stag, to };
                }
                Opcode::ReadResponse => {
                    let r = match self.orq.front() {
                        Some(r) => *r,
                        None => return Err(Fault::echo(TermCode::DDP_LOCAL_CATASTROPHIC)),
                    };
                    if r.local_stag != stag {
                        return Err(Fault::echo(TermCode::DDP_T_INVALID_STAG));
                    }
                    if r.local_to.wrapping_add(r.done as u64) != to
                        || r.done as u64 + len as u64 > r.len as u64
                    {
                        return Err(Fault::echo(TermCode::DDP_T_BASE_BOUNDS));
                    }
                    if d.last && r.done + len != r.len {
                        return Err(Fault::echo(TermCode::DDP_T_BASE_BOUNDS));
                    }
                    if len > 0 && !r.rtr {
                        mem.check_tagged(stag, to, len, Access::LocalWrite)
                            .map_err(|e| Fault::echo(e.ddp_code()))?;
                    }
                    place = if r.rtr {
                        Placement::Discard
                    } else {
                        Placement::Tagged { stag, to }
                    };
                }
                _ => unreachable!(),
            },
            BufferModel::Untagged {
                rsvd_ulp,
                qn: q,
                msn,
                mo,
            } => {
                let want_q = op.queue().unwrap_or(u32::MAX);
                if q != want_q {
                    return Err(Fault::echo(TermCode::DDP_U_INVALID_QN));
                }
                let qi = q as usize;
                if op != Opcode::Terminate && msn != self.rx_msn[qi] {
                    return Err(Fault::echo(TermCode::DDP_U_INVALID_MSN));
                }
                if op.is_control() {
                    if mo != 0 || !d.last {
                        return Err(Fault::echo(TermCode::DDP_U_INVALID_MO));
                    }
                    return self.on_control(op, seg, rsvd_ulp, mem);
                }
                // Send variants.
                let rwr = match self.recv_cur {
                    Some(r) => r,
                    None => {
                        if mo != 0 {
                            return Err(Fault::echo(TermCode::DDP_U_INVALID_MO));
                        }
                        match self.recvq.pop_front() {
                            Some(r) => {
                                self.recv_cur = Some(r);
                                r
                            }
                            None => return Err(Fault::echo(TermCode::DDP_U_NO_BUFFER)),
                        }
                    }
                };
                if mo != rwr.done {
                    return Err(Fault::echo(TermCode::DDP_U_INVALID_MO));
                }
                if rwr.done as u64 + len as u64 > rwr.len as u64 {
                    return Err(Fault::echo(TermCode::DDP_U_NO_BUFFER));
                }
                place = Placement::Recv {
                    wr_id: rwr.wr_id,
                    offset: rwr.done,
                };
            }
        }
        self.rx_cur = Some(RxCur {
            seg,
            place,
            done: 0,
        });
        Ok(())
    }

    /// Responder in P2P mode: the first FPDU must be the agreed RTR.
    fn on_rtr(&mut self, op: Opcode, seg: RxSegment) -> Result<(), Fault> {
        let ok = match (self.rtr_kind, op) {
            (Some(RtrKind::Write), Opcode::Write) => seg.payload_len == 0,
            (Some(RtrKind::Send), Opcode::Send) => seg.payload_len == 0,
            (Some(RtrKind::Read), Opcode::ReadRequest) => {
                ReadRequest::parse(self.deframer.control())
                    .map(|r| r.size == 0)
                    .unwrap_or(false)
            }
            _ => false,
        };
        if !ok {
            return Err(Fault::bare(TermCode::MPA_NO_MATCHING_RTR));
        }
        match op {
            Opcode::Send => self.rx_msn[qn::SEND as usize] += 1,
            Opcode::ReadRequest => {
                let rr = ReadRequest::parse(self.deframer.control()).unwrap();
                self.rx_msn[qn::READ_REQUEST as usize] += 1;
                let d = DdpHeader::tagged(
                    rr.sink_stag,
                    rr.sink_to,
                    true,
                    RdmapCtrl::new(Opcode::ReadResponse),
                );
                let b = self.control_fpdu(&d, &[], &[]);
                self.rsp.push_back(TxItem::Control {
                    bytes: b,
                    on_done: None,
                    resp: false,
                });
            }
            _ => {}
        }
        self.rx_cur = Some(RxCur {
            seg,
            place: Placement::Discard,
            done: 0,
        });
        self.state = State::Established;
        self.deadline = None;
        let neg = self.neg.clone().unwrap();
        self.events.push_back(Event::Established(neg));
        Ok(())
    }

    /// Control messages: the whole body is in the deframer (`Deframer::control`).
    fn on_control(
        &mut self,
        op: Opcode,
        seg: RxSegment,
        _rsvd_ulp: u32,
        mem: &mut impl Memory,
    ) -> Result<(), Fault> {
        let body = self.deframer.control();
        match op {
            Opcode::ReadRequest => {
                let rr = ReadRequest::parse(body)
                    .map_err(|_| Fault::echo(TermCode::DDP_LOCAL_CATASTROPHIC))?;
                let ird = self.neg.as_ref().map(|n| n.ird).unwrap_or(0) as u32;
                if self.irq_busy >= ird {
                    return Err(Fault::echo(TermCode::RDMAP_CATASTROPHIC_STREAM));
                }
                if rr.size > 0 {
                    mem.check_tagged(rr.src_stag, rr.src_to, rr.size, Access::RemoteRead)
                        .map_err(|e| Fault::echo(e.rdmap_code()))?;
                }
                self.rx_msn[qn::READ_REQUEST as usize] += 1;
                self.irq_busy += 1;
                self.rsp.push_back(TxItem::Msg(OutMsg {
                    seg: self.segmenter(
                        Opcode::ReadResponse,
                        Target::Tagged {
                            stag: rr.sink_stag,
                            to: rr.sink_to,
                        },
                        rr.size,
                        self.mulpdu,
                    ),
                    source: Source::Tagged {
                        stag: rr.src_stag,
                        to: rr.src_to,
                    },
                    on_done: None,
                    then: None,
                    pre: None,
                    is_read_resp: true,
                }));
            }
            Opcode::Terminate => {
                let t = Terminate::parse(body).map(|x| x.0).unwrap_or_else(|_| {
                    // Unparseable: keep what we can of the control word.
                    let mut t = Terminate::new(TermCode::RDMAP_UNSPECIFIED);
                    if body.len() >= 2 {
                        t.code = TermCode::new(body[0] >> 4, body[0] & 0x0f, body[1]);
                    }
                    t
                });
                self.rx_msn[qn::TERMINATE as usize] += 1;
                self.counters.rx_terminates += 1;
                self.state = State::Error;
                self.tx_hold = None;
                let status = t.code.remote_wc_status();
                self.flush_all(Some(status));
                self.events.push_back(Event::Terminated {
                    sent: false,
                    term: t,
                });
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                if body.len() != IMMEDIATE_LEN {
                    return Err(Fault::echo(TermCode::DDP_U_INVALID_MO));
                }
                let word = u64::from_be_bytes(body[..8].try_into().unwrap());
                if word >> 32 == u64::from(SEND_IMM_TAG) && op == Opcode::ImmediateData {
                    // The first half of a Send with Immediate (see
                    // `post_send_imm`): the Send that follows carries it.
                    self.rx_msn[qn::SEND as usize] += 1;
                    self.rx_send_imm = Some(word as u32);
                    return Ok(());
                }
                let r = match self.recvq.pop_front() {
                    Some(r) => r,
                    None => return Err(Fault::echo(TermCode::DDP_U_NO_BUFFER)),
                };
                self.rx_msn[qn::SEND as usize] += 1;
                // byte_len of a Write with Immediate is the length the Write placed
                // (ibv_poll_cq(3); the Immediate Data follows its Write on the stream).
                let mut c = Completion::new(
                    r.wr_id,
                    WcOpcode::RecvRdmaWithImm,
                    WcStatus::Success,
                    std::mem::take(&mut self.rx_write_len),
                );
                c.imm = Some(u64::from_be_bytes(body[..8].try_into().unwrap()));
                c.solicited = op == Opcode::ImmediateDataSe;
                self.events.push_back(Event::Completion(c));
            }
            Opcode::AtomicRequest => {
                let a = AtomicRequest::parse(body)
                    .map_err(|_| Fault::echo(TermCode::DDP_LOCAL_CATASTROPHIC))?;
                // RFC 7306 §5.2: Atomic Requests share the responder's IRD with Read Requests.
                let ird = self.neg.as_ref().map(|n| n.ird).unwrap_or(0) as u32;
                if self.irq_busy >= ird {
                    return Err(Fault::echo(TermCode::RDMAP_CATASTROPHIC_STREAM));
                }
                // RFC 7306 §5.2.1 rule 4: an AOpCode we do not support (0x1 and 0x3–0xF are
                // reserved, §10.1) is an error; RFC 7306 names no code, RFC 5040's
                // Unexpected OpCode is the nearest.
                let aop = a
                    .operation()
                    .ok_or(Fault::echo(TermCode::RDMAP_UNEXPECTED_OPCODE))?;
                mem.check_tagged(a.stag, a.to, 8, Access::RemoteAtomic)
                    .map_err(|e| Fault::echo(e.rdmap_code()))?;
                self.rx_msn[qn::ATOMIC_REQUEST as usize] += 1;
                let orig = mem
                    .atomic(a.stag, a.to, aop)
                    .map_err(|e| Fault::echo(e.rdmap_code()))?;
                let resp = AtomicResponse {
                    req_id: a.req_id,
                    orig_value: orig,
                };
                let mut b = [0u8; crate::rdmap::ATOMIC_RESP_LEN];
                resp.encode(&mut b);
                let bytes =
                    self.control_message(qn::ATOMIC_RESPONSE, Opcode::AtomicResponse, &b, &[]);
                self.irq_busy += 1;
                self.rsp.push_back(TxItem::Control {
                    bytes,
                    on_done: None,
                    resp: true,
                });
            }
            Opcode::AtomicResponse => {
                let a = AtomicResponse::parse(body)
                    .map_err(|_| Fault::echo(TermCode::DDP_LOCAL_CATASTROPHIC))?;
                match self.atomics.front() {
                    Some(w) if w.req_id == a.req_id => {
                        let w = self.atomics.pop_front().unwrap();
                        self.rx_msn[qn::ATOMIC_RESPONSE as usize] += 1;
                        let mut c = Completion::new(w.wr_id, w.opcode, WcStatus::Success, 8);
                        c.atomic_result = Some(a.orig_value);
                        self.pending_atomic_store = Some((w.result, a.orig_value));
                        self.sq_complete(w.seq, c);
                    }
                    _ => return Err(Fault::echo(TermCode::RDMAP_UNEXPECTED_OPCODE)),
                }
            }
            _ => unreachable!(),
        }
        self.rx_cur = Some(RxCur {
            seg,
            place: Placement::Discard,
            done: 0,
        });
        Ok(())
    }

    fn on_segment_end(&mut self, cur: RxCur, mem: &mut impl Memory) -> Result<(), Fault> {
        let d = cur.seg.ddp;
        let op = match d.rdmap.op() {
            Some(op) => op,
            None => return Ok(()),
        };
        match op {
            Opcode::ReadResponse => {
                if let Some(r) = self.orq.front_mut() {
                    r.done += cur.seg.payload_len;
                    if d.last {
                        let r = self.orq.pop_front().unwrap();
                        if !r.rtr {
                            self.sq_complete(
                                r.seq,
                                Completion::new(
                                    r.wr_id,
                                    WcOpcode::RdmaRead,
                                    WcStatus::Success,
                                    r.len,
                                ),
                            );
                        }
                    }
                }
            }
            op if op.is_send() && !matches!(cur.place, Placement::Discard) => {
                if let Some(r) = &mut self.recv_cur {
                    r.done += cur.seg.payload_len;
                }
                if d.last {
                    let r = self.recv_cur.take().unwrap();
                    self.rx_msn[qn::SEND as usize] += 1;
                    let mut c = Completion::new(r.wr_id, WcOpcode::Recv, WcStatus::Success, r.done);
                    c.solicited = matches!(op, Opcode::SendSe | Opcode::SendSeInv);
                    c.imm = self.rx_send_imm.take().map(u64::from);
                    if let BufferModel::Untagged { rsvd_ulp, .. } = d.model {
                        if matches!(op, Opcode::SendInv | Opcode::SendSeInv) {
                            if mem.invalidate(rsvd_ulp).is_err() {
                                // Data was delivered; report and terminate.
                                self.events.push_back(Event::Completion(c));
                                return Err(Fault::echo(TermCode::RDMAP_CANNOT_INVALIDATE));
                            }
                            c.invalidated = Some(rsvd_ulp);
                        }
                    }
                    self.events.push_back(Event::Completion(c));
                }
            }
            _ => {}
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Errors
    // ------------------------------------------------------------------

    /// Build and queue a Terminate (RFC 5040 §4.8, §6), go to ERROR, flush.
    fn terminate(&mut self, f: Fault, seg: Option<&RxSegment>, local_status: WcStatus) {
        if matches!(self.state, State::Error | State::Closed | State::Rejected) {
            return;
        }
        let mut t = Terminate::new(f.code);
        if let (true, Some(s)) = (f.echo, seg) {
            t.m = true;
            t.d = true;
            t.seg_len = s.ulpdu_len;
            let n = s.ddp.encode(&mut t.ddp_hdr);
            t.ddp_hdr_len = n as u8;
            if s.ddp.rdmap.op() == Some(Opcode::ReadRequest) {
                if let Ok(rr) = ReadRequest::parse(self.deframer.control()) {
                    t.r = true;
                    t.rdmap_hdr = Some(rr);
                }
            }
        }
        let mut body = [0u8; 64];
        let n = t.encode(&mut body);
        let bytes = self.control_message(qn::TERMINATE, Opcode::Terminate, &[], &body[..n]);
        self.counters.tx_terminates += 1;
        self.state = State::Error;
        self.tx_hold = None;
        self.rx_cur = None;
        self.cur_tx = None;
        self.tx_follow.clear();
        self.rsp.clear();
        self.rsp.push_back(TxItem::Control {
            bytes,
            on_done: None,
            resp: false,
        });
        self.terminate_sent = true;
        // The work request in progress gets `local_status`.
        if let Some(r) = self.recv_cur.take() {
            self.events.push_back(Event::Completion(Completion::new(
                r.wr_id,
                WcOpcode::Recv,
                local_status,
                r.done,
            )));
        } else if local_status == WcStatus::LocProtErr {
            if let Some(r) = self.orq.pop_front() {
                self.sq_complete(
                    r.seq,
                    Completion::new(r.wr_id, WcOpcode::RdmaRead, local_status, 0),
                );
            }
        }
        self.flush_all(None);
        self.events.push_back(Event::Terminated {
            sent: true,
            term: t,
        });
    }

    /// The memory a transmit unit's [`Source`] names is gone (its region was
    /// deregistered after the request was checked), and the unit's header has
    /// not been sent: instead of the rest of the message, a Terminate goes out
    /// (RDMAP Remote Protection Error, Invalid STag, RFC 5040 §7.2), the
    /// connection goes to ERROR and outstanding work requests are flushed.
    ///
    /// The message the unit belongs to completes with a local protection error (IBTA
    /// `IBV_WC_LOC_PROT_ERR`, as for memory that never checked out) — never a success for
    /// bytes that did not leave, though handing out a message's last segment completes it
    /// ([`Connection::next_tx`]); every other work request is flushed.
    pub fn abort_source(&mut self) {
        if let Some((seq, wr_id)) = self.tx_completed_last.take() {
            self.fail_completed(seq, wr_id, WcStatus::LocProtErr);
        } else if let Some((seq, mut c)) = self.cur_tx.as_mut().and_then(|m| m.on_done.take()) {
            // A segment before the message's last.
            c.status = WcStatus::LocProtErr;
            c.byte_len = 0;
            self.sq_complete(seq, c);
        }
        self.terminate(
            Fault::bare(TermCode::RDMAP_INVALID_STAG),
            None,
            WcStatus::WrFlushErr,
        );
    }

    /// Gives the completion of send-queue entry `seq` (work request `wr_id`) status `st`,
    /// whether it still waits in its slot behind earlier work requests or was queued as an
    /// event already (the newest completion event of that request, then).
    fn fail_completed(&mut self, seq: u64, wr_id: u64, st: WcStatus) {
        if seq >= self.sq_head {
            if let Some(Some(c)) = self.sq_slots.get_mut((seq - self.sq_head) as usize) {
                c.status = st;
            }
            return;
        }
        let queued = self.events.iter_mut().rev().find_map(|e| match e {
            Event::Completion(c) if c.wr_id == wr_id && !c.is_recv() => Some(c),
            _ => None,
        });
        if let Some(c) = queued {
            c.status = st;
        }
    }

    fn fail(&mut self, why: Failure) {
        self.flush_all(None);
        self.state = State::Error;
        self.tx_hold = None;
        self.deadline = None;
        self.mpa_out.clear();
        self.events.push_back(Event::Failed(why));
    }

    /// Flush all outstanding work requests. With `first_status`, the oldest
    /// outstanding Read/Atomic (the operation the peer is most likely
    /// answering) gets that status.
    fn flush_all(&mut self, first_status: Option<WcStatus>) {
        self.rx_stalled = None;
        self.stall_deadline = None;
        // Completions held behind an unfinished Read/Atomic come after the error in posting
        // order: once a WR completes in error, every later one is flushed (IBTA 10.7.3.1;
        // the data of these did leave, but the application learns nothing of it).
        for c in self.sq_slots.iter_mut().flatten() {
            if c.status == WcStatus::Success {
                c.status = WcStatus::WrFlushErr;
                c.byte_len = 0;
                c.atomic_result = None;
            }
        }
        let mut first = first_status;
        // The oldest outstanding Read/Atomic by posting order.
        let ro = self.orq.iter().filter(|r| !r.rtr).map(|r| r.seq).min();
        let ao = self.atomics.iter().map(|a| a.seq).min();
        let first_seq = match (ro, ao) {
            (Some(r), Some(a)) => Some(r.min(a)),
            (r, a) => r.or(a),
        };
        let st_for = |seq: u64, first: &mut Option<WcStatus>| {
            if Some(seq) == first_seq {
                first.take().unwrap_or(WcStatus::WrFlushErr)
            } else {
                WcStatus::WrFlushErr
            }
        };
        while let Some(r) = self.orq.pop_front() {
            if r.rtr {
                continue;
            }
            let st = st_for(r.seq, &mut first);
            self.sq_complete(r.seq, Completion::new(r.wr_id, WcOpcode::RdmaRead, st, 0));
        }
        while let Some(a) = self.atomics.pop_front() {
            let st = st_for(a.seq, &mut first);
            self.sq_complete(a.seq, Completion::new(a.wr_id, a.opcode, st, 0));
        }
        if let Some(m) = self.cur_tx.take() {
            if let Some((seq, mut c)) = m.on_done {
                // No Read/Atomic took the peer's status: the message being sent when the
                // Terminate arrived is the one it answers (a Write to a bad STag, a Send
                // without a receive), so it carries the status, not a flush.
                c.status = first.take().unwrap_or(WcStatus::WrFlushErr);
                c.byte_len = 0;
                self.sq_complete(seq, c);
            }
        }
        while let Some(p) = self.sq.pop_front() {
            if let SqWr::Fence = p.wr {
                continue;
            }
            let c = Completion::new(p.wr.wr_id(), p.wr.wc_opcode(), WcStatus::WrFlushErr, 0);
            self.sq_complete(p.seq, c);
        }
        if let Some(r) = self.recv_cur.take() {
            self.events.push_back(Event::Completion(Completion::new(
                r.wr_id,
                WcOpcode::Recv,
                WcStatus::WrFlushErr,
                0,
            )));
        }
        while let Some(r) = self.recvq.pop_front() {
            self.events.push_back(Event::Completion(Completion::new(
                r.wr_id,
                WcOpcode::Recv,
                WcStatus::WrFlushErr,
                0,
            )));
        }
    }
}

/// The memory of a segment that needs none (a stalled Send resuming, see
/// `Connection::resume_stalled`): every check fails, so a mistake could only ever refuse.
struct NoMemory;

impl Memory for NoMemory {
    fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), crate::error::TaggedError> {
        Err(crate::error::TaggedError::InvalidStag)
    }
}
