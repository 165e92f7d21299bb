//! FPDU segmentation (transmit) and deframing (receive).
//!
//! Transmit: a message of any size becomes a sequence of DDP segments, one
//! per FPDU, each at most MULPDU bytes of ULPDU (RFC 5041 §5.1, RFC 5044
//! §4.1). [`Segmenter`] yields [`SegmentPlan`]s: the encoded MPA length +
//! DDP/RDMAP header, which slice of the message goes next, and (once the
//! caller has the payload at hand) the trailer (pad + CRC). The codec never
//! copies payload.
//!
//! Receive: [`Deframer`] consumes the TCP byte stream in a pull style. It
//! says what it wants next ([`Want`]): a few header bytes (buffered
//! internally, they are small), `n` payload bytes (the caller puts them
//! wherever the placement logic says and hands the placed bytes back for
//! CRC accounting), or the trailer. RDMAP control messages (Read Request,
//! Terminate, Atomic, Immediate Data) are small and are delivered whole as
//! part of the header event.

use crate::crc::Crc32c;
use crate::ddp::{DdpHeader, TAGGED_HDR_LEN, UNTAGGED_HDR_LEN};
use crate::error::WireError;
use crate::mpa::{pad_len, CRC_LEN, LEN_FIELD};
use crate::rdmap::{Opcode, RdmapCtrl};

/// Largest control ULPDU tail (after the DDP header) the deframer buffers:
/// enough for any Terminate (6 + 18 + 28), Atomic Request (52), Immediate
/// Data (8). Bigger control messages are a framing error.
pub const CONTROL_CAP: usize = 128;
/// Header buffer: MPA length + DDP header + control bytes.
pub const MAX_HDR: usize = LEN_FIELD + UNTAGGED_HDR_LEN + CONTROL_CAP;

/// A small inline byte buffer for headers and trailers.
#[derive(Clone, Copy)]
pub struct InlineBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> InlineBuf<N> {
    pub fn new() -> Self {
        InlineBuf {
            buf: [0; N],
            len: 0,
        }
    }
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        assert!(len <= N);
        InlineBuf { buf: [0; N], len }
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn push(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }
    /// Empties the buffer (its bytes stay: only the length says what is in it).
    fn clear(&mut self) {
        self.len = 0;
    }
}

impl InlineBuf<DATA_HDR> {
    /// Copies this data header into `frame` so that it ends at `end`, and returns where it
    /// begins. A data header is 16 or 20 bytes (MPA length and a tagged or an untagged DDP
    /// header, RFC 5041 §4.2–4.3): copied as 16 bytes and then maybe 4 — copies of sizes
    /// known when compiled, not one `memcpy` call of a length read at run time.
    #[inline]
    pub fn put_before(&self, frame: &mut [u8], end: usize) -> usize {
        const SHORT: usize = LEN_FIELD + TAGGED_HDR_LEN;
        debug_assert!(self.len >= SHORT, "a data header, tagged or untagged");
        let start = end - self.len;
        frame[start..start + SHORT].copy_from_slice(&self.buf[..SHORT]);
        if self.len > SHORT {
            frame[start + SHORT..end].copy_from_slice(&self.buf[SHORT..DATA_HDR]);
        }
        start
    }
}

impl InlineBuf<TRAILER_MAX> {
    /// Copies this trailer into `frame` at `at` and returns where it ends. All [`TRAILER_MAX`]
    /// bytes a trailer may take are written (a copy of a size known when compiled), so `frame`
    /// needs that room; what lies past the returned end is left over, not part of the FPDU.
    #[inline]
    pub fn put_at(&self, frame: &mut [u8], at: usize) -> usize {
        frame[at..at + TRAILER_MAX].copy_from_slice(&self.buf);
        at + self.len
    }
}

impl<const N: usize> Default for InlineBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> core::fmt::Debug for InlineBuf<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:02x?}", self.as_slice())
    }
}

pub type HeaderBuf = InlineBuf<MAX_HDR>;

/// The longest header of a data segment: MPA length + untagged DDP header (a data segment
/// carries no control bytes, RFC 5040 §4.2).
pub const DATA_HDR: usize = LEN_FIELD + UNTAGGED_HDR_LEN;
/// A data segment's header ([`SegmentPlan::header`]): a fifth of a [`HeaderBuf`], so that the
/// plans and transmit units that carry one move in registers, not through `memcpy` — every
/// message's FPDUs pass through several moves on their way to the socket.
pub type DataHeader = InlineBuf<DATA_HDR>;
/// The longest FPDU trailer: pad (up to 3 bytes) and the CRC field (RFC 5044 §4).
pub const TRAILER_MAX: usize = 3 + CRC_LEN;
/// Pad (≤ 3) + CRC (4).
pub type Trailer = InlineBuf<TRAILER_MAX>;
/// A whole RDMA Read Request FPDU (RFC 5040 §4.4 in RFC 5044 §4's framing: MPA length,
/// untagged DDP header, the request's fixed body, pad, CRC field), as
/// `Connection::read_lone` frames it: small enough to move in registers, and sent as it is.
pub type ReadRequestFpdu = InlineBuf<{ LEN_FIELD + UNTAGGED_HDR_LEN + crate::rdmap::READ_REQ_LEN + TRAILER_MAX }>;

/// Frames a Read Request (`ddp`: its untagged DDP header, `body`: its fixed body) with every
/// field at its fixed place; the CRC field covers length, ULPDU and pad (RFC 5044 §4.1), or
/// is zero with CRC off. A header and a trailer built by pushes of slices with lengths
/// learnt as they went (calls to `memcpy`), and the copy of both into a frame, were a tenth
/// of an `ib_read_lat` requester's turnaround.
#[inline]
pub fn read_request_fpdu(crc_on: bool, ddp: &DdpHeader, body: &[u8; crate::rdmap::READ_REQ_LEN]) -> ReadRequestFpdu {
    const ULPDU: usize = UNTAGGED_HDR_LEN + crate::rdmap::READ_REQ_LEN;
    const DDP_AT: usize = LEN_FIELD;
    const BODY_AT: usize = DDP_AT + UNTAGGED_HDR_LEN;
    const PAD_AT: usize = BODY_AT + crate::rdmap::READ_REQ_LEN;
    const CRC_AT: usize = PAD_AT + pad_len(ULPDU);
    let mut f = ReadRequestFpdu::zeroed(CRC_AT + CRC_LEN);
    f.buf[..DDP_AT].copy_from_slice(&(ULPDU as u16).to_be_bytes());
    let n = ddp.encode(&mut f.buf[DDP_AT..BODY_AT]);
    debug_assert_eq!(n, UNTAGGED_HDR_LEN, "a Read Request's DDP header is untagged");
    f.buf[BODY_AT..PAD_AT].copy_from_slice(body);
    if crc_on {
        let mut c = Crc32c::new();
        c.update(&f.buf[..CRC_AT]);
        f.buf[CRC_AT..CRC_AT + CRC_LEN].copy_from_slice(&c.to_wire());
    }
    f
}

/// Encode MPA length + DDP header + fixed RDMAP body (`body`) for a segment
/// whose payload (after `body`) is `payload_len` bytes.
pub fn encode_header(ddp: &DdpHeader, body: &[u8], payload_len: usize) -> HeaderBuf {
    encode_header_in(ddp, body, payload_len)
}

/// [`encode_header`] into a buffer of `N` bytes; `body` is cut to what fits (a
/// [`DataHeader`] takes none: data segments have no body).
fn encode_header_in<const N: usize>(ddp: &DdpHeader, body: &[u8], payload_len: usize) -> InlineBuf<N> {
    const { assert!(N >= LEN_FIELD + UNTAGGED_HDR_LEN, "room for any DDP header") };
    let mut h = InlineBuf::<N>::new();
    let ulpdu = ddp.len() + body.len() + payload_len;
    debug_assert!(ulpdu <= u16::MAX as usize);
    // The length and the DDP header are encoded where they go: pushed as slices of lengths
    // known only here, they were a `memcpy` call for every FPDU's header.
    h.buf[..LEN_FIELD].copy_from_slice(&(ulpdu as u16).to_be_bytes());
    h.len = LEN_FIELD + ddp.encode(&mut h.buf[LEN_FIELD..LEN_FIELD + UNTAGGED_HDR_LEN]);
    if !body.is_empty() {
        let b = body.len().min(CONTROL_CAP).min(N - h.len());
        h.push(&body[..b]);
    }
    h
}

/// Compute the trailer of an FPDU: `pad` zero bytes, then the CRC over
/// `header` (which starts with the MPA length), every payload part, and the
/// pad; CRC bytes are zero when `crc_on` is false.
pub fn trailer(crc_on: bool, header: &[u8], payload: &[&[u8]]) -> Trailer {
    trailer_with_pad(crc_on, header, payload, &[0u8; 3])
}

/// The trailer of an FPDU without CRC (pad bytes and a zero CRC field):
/// only the payload length matters.
pub fn trailer_for_len(header: &[u8], payload_len: usize) -> Trailer {
    // Pad and CRC field are zeros: a fresh buffer holds them already (two pushes of slices
    // of zeros cost a tenth of a small message's post).
    Trailer::zeroed(pad_len(header.len() - LEN_FIELD + payload_len) + CRC_LEN)
}

/// The trailer of an FPDU whose payload the caller checksums where it lies
/// (registered memory, never copied): `crc` has seen the header (starting
/// with the MPA length) and then every one of the `payload_len` payload
/// bytes, in order; the pad is added here and the CRC closed over it
/// (RFC 5044 §6: the CRC covers length field, ULPDU and pad).
pub fn trailer_from_crc(mut crc: Crc32c, header: &[u8], payload_len: usize) -> Trailer {
    let pad = pad_len(header.len() - LEN_FIELD + payload_len);
    let padb = [0u8; 3];
    crc.update(&padb[..pad]);
    let mut t = Trailer::new();
    t.push(&padb[..pad]);
    t.push(&crc.to_wire());
    t
}

/// Like [`trailer`] but with given pad byte values (only the first
/// `pad_len` bytes of `pad_bytes` are used). RFC 5044 leaves pad contents
/// to the sender and siw does not zero them; this lets a received FPDU be
/// re-encoded byte for byte.
pub fn trailer_with_pad(
    crc_on: bool,
    header: &[u8],
    payload: &[&[u8]],
    pad_bytes: &[u8],
) -> Trailer {
    let plen: usize = payload.iter().map(|p| p.len()).sum();
    let ulpdu = header.len() - LEN_FIELD + plen;
    let pad = pad_len(ulpdu);
    let mut padb = [0u8; 3];
    let k = pad.min(pad_bytes.len());
    padb[..k].copy_from_slice(&pad_bytes[..k]);
    let mut t = Trailer::new();
    t.push(&padb[..pad]);
    if crc_on {
        let mut c = Crc32c::new();
        c.update(header);
        for p in payload {
            c.update(p);
        }
        c.update(&padb[..pad]);
        t.push(&c.to_wire());
    } else {
        t.push(&[0u8; 4]);
    }
    t
}

/// Convenience: append a whole FPDU (copies `payload`); used for control
/// messages and in tests.
pub fn encode_fpdu(ddp: &DdpHeader, body: &[u8], payload: &[u8], crc_on: bool, out: &mut Vec<u8>) {
    encode_fpdu_with_pad(ddp, body, payload, &[], crc_on, out)
}

/// [`encode_fpdu`] with explicit pad byte values (see [`trailer_with_pad`]).
pub fn encode_fpdu_with_pad(
    ddp: &DdpHeader,
    body: &[u8],
    payload: &[u8],
    pad: &[u8],
    crc_on: bool,
    out: &mut Vec<u8>,
) {
    let h = encode_header(ddp, body, payload.len());
    out.extend_from_slice(h.as_slice());
    out.extend_from_slice(payload);
    out.extend_from_slice(trailer_with_pad(crc_on, h.as_slice(), &[payload], pad).as_slice());
}

/// One complete FPDU parsed from memory.
#[derive(Clone, Copy, Debug)]
pub struct FpduView<'a> {
    pub ulpdu_len: u16,
    pub ddp: DdpHeader,
    /// Fixed RDMAP body (Read Request / Atomic headers), possibly empty.
    pub body: &'a [u8],
    /// Everything after the body: data, or the Terminate/Immediate body.
    pub payload: &'a [u8],
    pub pad: &'a [u8],
    /// CRC field as read from the wire.
    pub crc: u32,
    /// CRC32c computed over the FPDU.
    pub crc_computed: u32,
}

impl FpduView<'_> {
    pub fn crc_ok(&self) -> bool {
        self.crc == self.crc_computed
    }
}

/// Parse one complete FPDU at the start of `buf`.
pub fn parse_fpdu(buf: &[u8]) -> Result<(FpduView<'_>, usize), WireError> {
    if buf.len() < LEN_FIELD {
        return Err(WireError::Truncated { need: LEN_FIELD });
    }
    let ulpdu_len = u16::from_be_bytes([buf[0], buf[1]]);
    let ul = ulpdu_len as usize;
    let total = LEN_FIELD + ul + pad_len(ul) + CRC_LEN;
    if buf.len() < total {
        return Err(WireError::Truncated { need: total });
    }
    let ulpdu = &buf[LEN_FIELD..LEN_FIELD + ul];
    if ulpdu.is_empty() || ulpdu.len() < DdpHeader::len_for_ctrl(ulpdu[0]) {
        return Err(WireError::UlpduTooShort(ulpdu_len));
    }
    let (ddp, dl) = DdpHeader::parse(ulpdu)?;
    let bl = ddp.rdmap.op().map(|o| o.body_len()).unwrap_or(0);
    if ulpdu.len() < dl + bl {
        return Err(WireError::UlpduTooShort(ulpdu_len));
    }
    let pad_start = LEN_FIELD + ul;
    let crc_start = pad_start + pad_len(ul);
    let crc = crate::crc::from_wire([
        buf[crc_start],
        buf[crc_start + 1],
        buf[crc_start + 2],
        buf[crc_start + 3],
    ]);
    let crc_computed = crate::crc::crc32c(&buf[..crc_start]);
    Ok((
        FpduView {
            ulpdu_len,
            ddp,
            body: &ulpdu[dl..dl + bl],
            payload: &ulpdu[dl + bl..],
            pad: &buf[pad_start..crc_start],
            crc,
            crc_computed,
        },
        total,
    ))
}

/// What the DDP segments of one message are addressed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Tagged: sink STag and the TO of the first byte.
    Tagged { stag: u32, to: u64 },
    /// Untagged: queue, MSN, and the RDMAP word of RsvdULP (Invalidate STag).
    Untagged { qn: u32, msn: u32, rsvd_ulp: u32 },
}

/// Splits one RDMAP message into DDP segments (RFC 5041 §5.1).
#[derive(Clone, Debug)]
pub struct Segmenter {
    op: Opcode,
    target: Target,
    total: u32,
    offset: u32,
    max_payload: u32,
    done: bool,
}

/// One DDP segment to transmit: write `header`, then `payload_len` bytes of
/// the message starting at `msg_offset`, then [`SegmentPlan::trailer`].
#[derive(Clone, Copy, Debug)]
pub struct SegmentPlan {
    pub header: DataHeader,
    pub msg_offset: u32,
    pub payload_len: u32,
    pub last: bool,
}

impl SegmentPlan {
    /// ULPDU length of this segment.
    pub fn ulpdu_len(&self) -> usize {
        self.header.len() - LEN_FIELD + self.payload_len as usize
    }
    /// Whole FPDU length on the wire.
    pub fn fpdu_len(&self) -> usize {
        crate::mpa::fpdu_len(self.ulpdu_len())
    }
    /// Trailer once the payload is known (pass the payload in one or more
    /// slices totalling `payload_len` bytes).
    pub fn trailer(&self, crc_on: bool, payload: &[&[u8]]) -> Trailer {
        trailer(crc_on, self.header.as_slice(), payload)
    }
}

impl Segmenter {
    /// `mulpdu` is [`crate::mpa::mulpdu`] of the connection's MSS. Data
    /// carrying opcodes only (Write, Read Response, Send*).
    pub fn new(op: Opcode, target: Target, len: u32, mulpdu: usize) -> Segmenter {
        let hl = match target {
            Target::Tagged { .. } => TAGGED_HDR_LEN,
            Target::Untagged { .. } => UNTAGGED_HDR_LEN,
        };
        let max_payload = mulpdu.saturating_sub(hl).max(1).min(u32::MAX as usize) as u32;
        Segmenter {
            op,
            target,
            total: len,
            offset: 0,
            max_payload,
            done: false,
        }
    }

    /// Like [`Segmenter::new`], but a message that needs k segments is split into k of nearly
    /// the same size (rounded up to 4 bytes: no pad) instead of k-1 full ones and a tail that
    /// may be a few bytes long (a 64 KiB message over loopback's MSS: 65460 + 76 bytes), which
    /// costs the receiver a segment, and often a system call, for those few bytes. The count
    /// of segments is the same; RFC 5044 leaves FPDU sizes within MULPDU to the sender.
    pub fn even(op: Opcode, target: Target, len: u32, mulpdu: usize) -> Segmenter {
        let mut s = Segmenter::new(op, target, len, mulpdu);
        if len > s.max_payload {
            let k = len.div_ceil(s.max_payload);
            s.max_payload = len.div_ceil(k).next_multiple_of(4).min(s.max_payload);
        }
        s
    }

    pub fn remaining(&self) -> u32 {
        self.total - self.offset
    }

    pub fn is_done(&self) -> bool {
        self.done
    }
}

impl Iterator for Segmenter {
    type Item = SegmentPlan;
    fn next(&mut self) -> Option<SegmentPlan> {
        if self.done {
            return None;
        }
        let n = self.remaining().min(self.max_payload);
        let last = self.offset + n == self.total;
        let rd = RdmapCtrl::new(self.op);
        let ddp = match self.target {
            Target::Tagged { stag, to } => {
                DdpHeader::tagged(stag, to.wrapping_add(self.offset as u64), last, rd)
            }
            Target::Untagged { qn, msn, rsvd_ulp } => {
                DdpHeader::untagged(qn, msn, self.offset, rsvd_ulp, last, rd)
            }
        };
        let plan = SegmentPlan {
            header: encode_header_in(&ddp, &[], n as usize),
            msg_offset: self.offset,
            payload_len: n,
            last,
        };
        self.offset += n;
        self.done = last;
        Some(plan)
    }
}

/// What the deframer needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Up to this many header bytes (pass them to [`Deframer::feed`]).
    Header(usize),
    /// Up to this many payload bytes of the current segment.
    Payload(u32),
    /// Up to this many trailer bytes (pad + CRC).
    Trailer(usize),
}

/// Header of a received DDP segment.
#[derive(Clone, Copy, Debug)]
pub struct RxSegment {
    pub ulpdu_len: u16,
    pub ddp: DdpHeader,
    /// How many RDMAP control bytes follow the DDP header (Read Request body, Atomic
    /// headers, Terminate body, Immediate Data); 0 for data segments. The bytes stay in the
    /// deframer ([`Deframer::control`]): a segment is moved from call to call on its way
    /// through the connection, and 128 bytes of buffer in it made each move a `memcpy`.
    pub control_len: u8,
    /// Payload bytes that follow (0 for control messages).
    pub payload_len: u32,
}

/// Deframer events.
#[derive(Clone, Copy, Debug)]
pub enum RxEvent {
    /// A segment header is complete; payload (if any) follows.
    Segment(RxSegment),
    /// `n` payload bytes were consumed from the input given to `feed`.
    Payload(usize),
    /// Segment trailer done. `crc_ok` is always true when CRC is off.
    End { crc_ok: bool },
}

/// Deframing errors; all are fatal for the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// ULPDU shorter than the headers its DDP/RDMAP control bytes announce.
    UlpduTooShort(u16),
    /// Control message longer than [`CONTROL_CAP`].
    ControlTooLong(u16),
    /// ULPDU longer than the receiver accepts ([`Deframer::with_max_ulpdu`]).
    UlpduTooLong(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// Collecting header bytes; `need` is the total header length known so far.
    Header {
        need: usize,
    },
    Payload {
        rem: u32,
    },
    Trailer {
        need: usize,
    },
}

/// Pull-style FPDU deframer (no markers, see [`crate::mpa`]).
#[derive(Clone, Debug)]
pub struct Deframer {
    crc_on: bool,
    st: St,
    hdr: HeaderBuf,
    /// The control bytes of the last segment whose header completed (see [`Deframer::control`]).
    control: InlineBuf<CONTROL_CAP>,
    crc: Crc32c,
    trailer: Trailer,
    ulpdu_len: u16,
    max_ulpdu: usize,
}

/// Bytes needed to know the header length: MPA length + DDP ctrl + RDMAP ctrl.
const PROBE: usize = LEN_FIELD + 2;

impl Deframer {
    pub fn new(crc_on: bool) -> Deframer {
        Deframer {
            crc_on,
            st: St::Header { need: PROBE },
            hdr: HeaderBuf::new(),
            control: InlineBuf::new(),
            crc: Crc32c::new(),
            trailer: Trailer::new(),
            ulpdu_len: 0,
            max_ulpdu: crate::mpa::MAX_ULPDU,
        }
    }

    /// Refuse ULPDUs longer than `max` (default [`crate::mpa::MAX_ULPDU`]): the
    /// length field is checked before any of the segment is consumed.
    pub fn with_max_ulpdu(mut self, max: usize) -> Deframer {
        self.max_ulpdu = max;
        self
    }

    pub fn crc_on(&self) -> bool {
        self.crc_on
    }

    /// The RDMAP control bytes of the last segment whose header was complete
    /// ([`RxSegment::control_len`] of them): what a control message carries. They stay until
    /// the next segment's header is complete, that is, while its segment is handled.
    pub fn control(&self) -> &[u8] {
        self.control.as_slice()
    }

    /// True between FPDUs (no partial FPDU buffered).
    pub fn at_boundary(&self) -> bool {
        self.st == St::Header { need: PROBE } && self.hdr.is_empty()
    }

    pub fn want(&self) -> Want {
        match self.st {
            St::Header { need } => Want::Header(need - self.hdr.len()),
            St::Payload { rem } => Want::Payload(rem),
            St::Trailer { need } => Want::Trailer(need - self.trailer.len()),
        }
    }

    /// Zero-copy receive: `n` payload bytes of the current segment were
    /// placed where they belong without passing through the deframer. With
    /// CRC on, `crc(k, c)` must update `c` with the first `k` of them, read
    /// where they were placed (RFC 5044 §6: the CRC covers the payload as
    /// received; the trailer check in [`Deframer::feed`] then covers them).
    /// `k` is `n` capped at the payload left. Outside a payload, nothing is
    /// consumed. Returns bytes consumed and the `Payload` event.
    pub fn feed_placed(&mut self, n: usize, crc: impl FnOnce(usize, &mut Crc32c)) -> (usize, Option<RxEvent>) {
        let St::Payload { rem } = self.st else {
            return (0, None);
        };
        let k = (rem as usize).min(n);
        if k == 0 {
            return (0, None);
        }
        if self.crc_on {
            crc(k, &mut self.crc);
        }
        self.advance_payload(rem, k);
        (k, Some(RxEvent::Payload(k)))
    }

    /// Whether the segment's CRC matches its `trailer` (pad bytes, then the CRC field), or
    /// CRC is off (RFC 5044 §4.4: the field is then not checked).
    fn trailer_ok(&mut self, trailer: &[u8]) -> bool {
        if !self.crc_on {
            return true;
        }
        let pad = trailer.len() - CRC_LEN;
        self.crc.update(&trailer[..pad]);
        let w = [trailer[pad], trailer[pad + 1], trailer[pad + 2], trailer[pad + 3]];
        crate::crc::from_wire(w) == self.crc.value()
    }

    fn advance_payload(&mut self, rem: u32, n: usize) {
        let rem = rem - n as u32;
        self.st = if rem == 0 {
            St::Trailer {
                need: pad_len(self.ulpdu_len as usize) + CRC_LEN,
            }
        } else {
            St::Payload { rem }
        };
    }

    /// The length of the header that `probe` (at least [`PROBE`] bytes: the MPA length and
    /// the DDP and RDMAP control bytes) begins: MPA length field, DDP header and the control
    /// bytes its RDMAP opcode carries. Checks the ULPDU length against what the opcode needs
    /// and what this side accepts before anything of the segment is consumed; records it.
    fn header_len(&mut self, probe: &[u8]) -> Result<usize, FrameError> {
        let ul = u16::from_be_bytes([probe[0], probe[1]]);
        if ul as usize > self.max_ulpdu {
            return Err(FrameError::UlpduTooLong(ul));
        }
        let dl = DdpHeader::len_for_ctrl(probe[2]);
        let op = RdmapCtrl::from_byte(probe[3]).op();
        let ctl = match op {
            Some(o) if o.is_control() => (ul as usize).saturating_sub(dl),
            Some(o) => o.body_len(),
            None => 0,
        };
        let min_body = op.map(|o| o.body_len()).unwrap_or(0);
        if (ul as usize) < dl + min_body {
            return Err(FrameError::UlpduTooShort(ul));
        }
        if ctl > CONTROL_CAP {
            return Err(FrameError::ControlTooLong(ul));
        }
        self.ulpdu_len = ul;
        Ok(LEN_FIELD + dl + ctl)
    }

    /// A segment's whole header `h` ([`Deframer::header_len`] bytes) is in: its CRC starts,
    /// its control bytes are kept, and its payload or trailer comes next.
    fn header_done(&mut self, h: &[u8]) -> Result<RxEvent, FrameError> {
        self.crc = Crc32c::new();
        if self.crc_on {
            self.crc.update(h);
        }
        let (ddp, dl) = match DdpHeader::parse(&h[LEN_FIELD..]) {
            Ok(x) => x,
            Err(_) => return Err(FrameError::UlpduTooShort(self.ulpdu_len)),
        };
        self.control.clear();
        self.control.push(&h[LEN_FIELD + dl..]);
        let consumed_ulpdu = h.len() - LEN_FIELD;
        let payload_len = (self.ulpdu_len as usize - consumed_ulpdu) as u32;
        let seg = RxSegment {
            ulpdu_len: self.ulpdu_len,
            ddp,
            control_len: self.control.len() as u8,
            payload_len,
        };
        self.hdr.clear();
        self.trailer.clear();
        self.st = if payload_len > 0 {
            St::Payload { rem: payload_len }
        } else {
            St::Trailer {
                need: pad_len(self.ulpdu_len as usize) + CRC_LEN,
            }
        };
        Ok(RxEvent::Segment(seg))
    }

    /// Consume bytes of the stream. Header and trailer bytes are copied
    /// into the deframer; payload bytes are only accounted (CRC) and
    /// reported as `RxEvent::Payload(n)` — the caller places `data[..n]`.
    /// For the zero-copy path, receive payload straight into its final
    /// place and pass the placed bytes here. Returns bytes consumed and at
    /// most one event; call again with the rest.
    pub fn feed(&mut self, data: &[u8]) -> Result<(usize, Option<RxEvent>), FrameError> {
        match self.st {
            St::Header { mut need } => {
                // The whole header at the start of `data` (a segment's header nearly always
                // comes in one read) is parsed where it lies, without gathering it first.
                if need == PROBE && self.hdr.is_empty() && data.len() >= PROBE {
                    let full = self.header_len(data)?;
                    if data.len() >= full {
                        return Ok((full, Some(self.header_done(&data[..full])?)));
                    }
                }
                let mut take = 0;
                // The probe (length and control bytes) tells how long the header is; the rest
                // of it usually came with the probe, and is taken in the same call.
                loop {
                    let more = (need - self.hdr.len()).min(data.len() - take);
                    self.hdr.push(&data[take..take + more]);
                    take += more;
                    if self.hdr.len() < need {
                        return Ok((take, None));
                    }
                    if need != PROBE {
                        break;
                    }
                    let h = self.hdr.as_slice();
                    let full = self.header_len(&[h[0], h[1], h[2], h[3]])?;
                    if full <= need {
                        break;
                    }
                    need = full;
                    self.st = St::Header { need };
                }
                let mut h = [0u8; MAX_HDR];
                let n = self.hdr.len();
                h[..n].copy_from_slice(self.hdr.as_slice());
                Ok((take, Some(self.header_done(&h[..n])?)))
            }
            St::Payload { rem } => {
                let n = (rem as usize).min(data.len());
                if self.crc_on {
                    self.crc.update(&data[..n]);
                }
                self.advance_payload(rem, n);
                Ok((n, Some(RxEvent::Payload(n))))
            }
            St::Trailer { need } => {
                // The whole trailer at the start of `data` is checked where it lies, as the
                // header is; a trailer cut by a read is gathered first.
                let (take, crc_ok) = if self.trailer.is_empty() && data.len() >= need {
                    (need, self.trailer_ok(&data[..need]))
                } else {
                    let take = (need - self.trailer.len()).min(data.len());
                    self.trailer.push(&data[..take]);
                    if self.trailer.len() < need {
                        return Ok((take, None));
                    }
                    let t = self.trailer;
                    self.trailer.clear();
                    (take, self.trailer_ok(t.as_slice()))
                };
                self.st = St::Header { need: PROBE };
                Ok((take, Some(RxEvent::End { crc_ok })))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddp::BufferModel;
    use crate::mpa::mulpdu;

    #[test]
    fn trailer_for_len_matches_trailer_without_crc() {
        let header = [0u8; 2 + TAGGED_HDR_LEN];
        for len in [0usize, 1, 2, 3, 4, 5, 1436, 65000] {
            let payload = vec![0xa5u8; len];
            assert_eq!(
                trailer_for_len(&header, len).as_slice(),
                trailer(false, &header, &[&payload]).as_slice(),
                "payload {len}"
            );
        }
    }

    #[test]
    fn headers_and_trailers_are_put_into_a_frame_whole() {
        let rd = RdmapCtrl::new(Opcode::Send);
        let headers: [DataHeader; 2] = [
            encode_header_in(&DdpHeader::tagged(0x1234_5678, 0x0102_0304_0506_0708, true, RdmapCtrl::new(Opcode::Write)), &[], 9),
            encode_header_in(&DdpHeader::untagged(0, 7, 0xa1b2_c3d4, 0x55, false, rd), &[], 9),
        ];
        for h in headers {
            // Over bytes that are not zero, ending where a payload would begin.
            let mut frame = [0xeeu8; 64];
            let start = h.put_before(&mut frame, 30);
            assert_eq!(start, 30 - h.len());
            assert_eq!(&frame[start..30], h.as_slice());
            assert!(frame[..start].iter().chain(&frame[30..]).all(|&b| b == 0xee), "nothing else written");
        }
        for len in [0usize, 1, 2, 3, 30] {
            let t = trailer(true, headers[1].as_slice(), &[&vec![0x5a; len]]);
            let mut frame = [0xeeu8; 64];
            let end = t.put_at(&mut frame, 40);
            assert_eq!(&frame[40..end], t.as_slice(), "payload {len}");
            assert!(frame[..40].iter().all(|&b| b == 0xee));
        }
    }

    /// What every FPDU passes through several moves of (a plan, a transmit unit, a receive
    /// event) stays small enough to move in registers: a [`HeaderBuf`] or a control buffer
    /// in them made each move a `memcpy` of 160–180 bytes, a few dozen per message.
    #[test]
    fn per_segment_values_stay_small() {
        assert!(std::mem::size_of::<SegmentPlan>() <= 64, "{}", std::mem::size_of::<SegmentPlan>());
        assert!(std::mem::size_of::<crate::conn::Tx>() <= 64, "{}", std::mem::size_of::<crate::conn::Tx>());
        assert!(std::mem::size_of::<RxEvent>() <= 64, "{}", std::mem::size_of::<RxEvent>());
    }

    /// A control message's body stays readable from the deframer while its segment is
    /// handled, and a data segment that follows reports none.
    #[test]
    fn control_bytes_stay_in_the_deframer() {
        let rr = crate::rdmap::ReadRequest { sink_stag: 1, sink_to: 2, size: 3, src_stag: 4, src_to: 5 };
        let mut body = [0u8; crate::rdmap::READ_REQ_LEN];
        rr.encode(&mut body);
        let d = DdpHeader::untagged(crate::ddp::qn::READ_REQUEST, 0, 0, 0, true, RdmapCtrl::new(Opcode::ReadRequest));
        let mut wire = Vec::new();
        encode_fpdu(&d, &body, &[], false, &mut wire);
        let w = DdpHeader::tagged(9, 0, true, RdmapCtrl::new(Opcode::Write));
        encode_fpdu(&w, &[], &[7u8; 4], false, &mut wire);
        let mut f = Deframer::new(false);
        let (n, ev) = f.feed(&wire).unwrap();
        let Some(RxEvent::Segment(seg)) = ev else { panic!("{ev:?}") };
        assert_eq!(seg.control_len as usize, body.len());
        assert_eq!(f.control(), &body[..]);
        // The trailer: the body is still there.
        let (k, ev) = f.feed(&wire[n..]).unwrap();
        assert!(matches!(ev, Some(RxEvent::End { crc_ok: true })), "{ev:?}");
        assert_eq!(f.control(), &body[..]);
        let (_, ev) = f.feed(&wire[n + k..]).unwrap();
        let Some(RxEvent::Segment(seg)) = ev else { panic!("{ev:?}") };
        assert_eq!((seg.control_len, seg.payload_len), (0, 4));
        assert!(f.control().is_empty());
    }

    // siw-write-p2p frame 8: zero-length Write RTR FPDU.
    const RTR: [u8; 20] = [
        0x00, 0x0e, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn rtr_round_trip() {
        let (f, n) = parse_fpdu(&RTR).unwrap();
        assert_eq!(n, 20);
        assert_eq!(f.ulpdu_len, 14);
        assert!(f.payload.is_empty());
        let mut out = Vec::new();
        encode_fpdu(&f.ddp, f.body, f.payload, false, &mut out);
        assert_eq!(out, RTR);
        for i in 0..RTR.len() {
            assert!(parse_fpdu(&RTR[..i]).is_err());
        }
    }

    #[test]
    fn even_segments_have_no_tiny_tail() {
        let m = mulpdu(1460);
        let t = Target::Tagged { stag: 1, to: 0 };
        let sizes = |len| Segmenter::even(Opcode::Write, t, len, m).map(|p| p.payload_len).collect::<Vec<u32>>();
        assert_eq!(sizes(4000), [1336, 1336, 1328]);
        assert_eq!(sizes(1437), [720, 717]);
        assert_eq!(sizes(1436), [1436]);
        assert_eq!(sizes(0), [0]);
        // Loopback's MSS: 64 KiB in two halves, not 65460 + 76.
        let big = |len| Segmenter::even(Opcode::Write, t, len, mulpdu(65483)).map(|p| p.payload_len).collect::<Vec<u32>>();
        assert_eq!(big(65536), [32768, 32768]);
        for len in [1u32, 1435, 1436, 1437, 2872, 2873, 65536, 1 << 20] {
            let p = sizes(len);
            assert_eq!(p.iter().sum::<u32>(), len);
            assert_eq!(p.len() as u32, len.div_ceil(1436), "{len}: as many segments as full ones");
            assert!(p.iter().all(|&n| n <= 1436));
            let (lo, hi) = (*p.iter().min().unwrap(), *p.iter().max().unwrap());
            assert!(hi - lo <= 4 * p.len() as u32, "{len}: {p:?}");
        }
    }

    #[test]
    fn segmenter_sizes() {
        let m = mulpdu(1460);
        let segs: Vec<_> = Segmenter::new(
            Opcode::Write,
            Target::Tagged {
                stag: 0x100,
                to: 0x1000,
            },
            4000,
            m,
        )
        .collect();
        assert_eq!(segs.len(), 3);
        assert_eq!(segs[0].payload_len, 1436);
        assert_eq!(segs[0].fpdu_len(), 1456);
        assert!(!segs[0].last && segs[2].last);
        assert_eq!(segs[2].payload_len, 4000 - 2 * 1436);
        let (f, _) = {
            let mut b = segs[1].header.as_slice().to_vec();
            b.extend(vec![0u8; segs[1].payload_len as usize]);
            b.extend_from_slice(
                segs[1]
                    .trailer(true, &[&vec![0u8; segs[1].payload_len as usize]])
                    .as_slice(),
            );
            let v = b.clone();
            let (f, n) = parse_fpdu(&v).map(|(f, n)| (f.ddp, n)).unwrap();
            (f, n)
        };
        assert_eq!(
            f.model,
            BufferModel::Tagged {
                stag: 0x100,
                to: 0x1000 + 1436
            }
        );
        // zero-length message: one segment
        let z: Vec<_> = Segmenter::new(
            Opcode::Send,
            Target::Untagged {
                qn: 0,
                msn: 1,
                rsvd_ulp: 0,
            },
            0,
            m,
        )
        .collect();
        assert_eq!(z.len(), 1);
        assert!(z[0].last);
        let u: Vec<_> = Segmenter::new(
            Opcode::Send,
            Target::Untagged {
                qn: 0,
                msn: 1,
                rsvd_ulp: 0,
            },
            3000,
            m,
        )
        .collect();
        assert_eq!(u[0].payload_len, 1432);
        assert_eq!(
            u[1].header.as_slice()[LEN_FIELD + 14..LEN_FIELD + 18],
            1432u32.to_be_bytes()
        );
    }

    #[test]
    fn deframer_byte_by_byte() {
        let mut stream = Vec::new();
        let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        for plan in Segmenter::new(
            Opcode::Send,
            Target::Untagged {
                qn: 0,
                msn: 1,
                rsvd_ulp: 0,
            },
            1000,
            300,
        ) {
            let p = &payload[plan.msg_offset as usize..][..plan.payload_len as usize];
            stream.extend_from_slice(plan.header.as_slice());
            stream.extend_from_slice(p);
            stream.extend_from_slice(plan.trailer(true, &[p]).as_slice());
        }
        for chunk in [1usize, 3, 7, 1000] {
            let mut d = Deframer::new(true);
            let mut got = Vec::new();
            let mut segs = 0;
            let mut ends = 0;
            for c in stream.chunks(chunk) {
                let mut c = c;
                while !c.is_empty() {
                    let (n, ev) = d.feed(c).unwrap();
                    match ev {
                        Some(RxEvent::Payload(k)) => got.extend_from_slice(&c[..k]),
                        Some(RxEvent::Segment(_)) => segs += 1,
                        Some(RxEvent::End { crc_ok }) => {
                            assert!(crc_ok);
                            ends += 1
                        }
                        None => {}
                    }
                    c = &c[n..];
                }
            }
            assert_eq!(got, payload);
            assert_eq!(segs, ends);
            assert_eq!(segs, 4);
            assert!(d.at_boundary());
        }
        // corrupt one payload byte: CRC must fail
        let mut bad = stream.clone();
        bad[30] ^= 1;
        let mut d = Deframer::new(true);
        let mut c = &bad[..];
        let mut saw_bad = false;
        while !c.is_empty() {
            let (n, ev) = d.feed(c).unwrap();
            if let Some(RxEvent::End { crc_ok: false }) = ev {
                saw_bad = true;
            }
            c = &c[n..];
        }
        assert!(saw_bad);
    }

    /// A header that arrived whole is taken in one call, probe and rest: an FPDU is three
    /// calls (header, payload, trailer), never a fourth for the header's second part.
    #[test]
    fn deframer_takes_a_whole_header_in_one_call() {
        let (stream, _) = send_stream();
        let mut d = Deframer::new(true);
        let mut c = &stream[..];
        let mut calls = 0;
        let mut headers = Vec::new();
        while !c.is_empty() {
            let (n, ev) = d.feed(c).unwrap();
            calls += 1;
            if let Some(RxEvent::Segment(seg)) = ev {
                headers.push(n);
                assert_eq!(LEN_FIELD + seg.ddp.len() + seg.control_len as usize, n);
            }
            c = &c[n..];
        }
        assert_eq!(headers.len(), 4);
        assert_eq!(calls, 3 * 4);
        assert!(d.at_boundary());
    }

    /// The FPDUs of a 1000-byte Send in 300-byte segments, payload bytes `i as u8`, with CRC.
    fn send_stream() -> (Vec<u8>, Vec<u8>) {
        let mut stream = Vec::new();
        let payload: Vec<u8> = (0..1000u32).map(|i| (i as u8).wrapping_mul(7)).collect();
        let target = Target::Untagged { qn: 0, msn: 1, rsvd_ulp: 0 };
        for plan in Segmenter::new(Opcode::Send, target, 1000, 300) {
            let p = &payload[plan.msg_offset as usize..][..plan.payload_len as usize];
            // The transmit side's in-place path: CRC over the header, then the payload as
            // the caller reads it, then pad (RFC 5044 §6); the same as the copying path.
            let mut crc = Crc32c::new();
            crc.update(plan.header.as_slice());
            for part in p.chunks(97) {
                crc.update(part);
            }
            let t = trailer_from_crc(crc, plan.header.as_slice(), p.len());
            assert_eq!(t.as_slice(), plan.trailer(true, &[p]).as_slice());
            stream.extend_from_slice(plan.header.as_slice());
            stream.extend_from_slice(p);
            stream.extend_from_slice(t.as_slice());
        }
        (stream, payload)
    }

    /// Feeds `stream` with payload taken by `feed_placed` in pieces of at most `piece`
    /// bytes (as if received in place and checksummed there); returns the payload "placed"
    /// and the CRC verdicts.
    fn feed_in_place(stream: &[u8], piece: usize) -> (Vec<u8>, Vec<bool>) {
        let mut d = Deframer::new(true);
        let (mut placed, mut verdicts) = (Vec::new(), Vec::new());
        let mut c = stream;
        while !c.is_empty() {
            let (n, ev) = match d.want() {
                Want::Payload(_) => {
                    let avail = c.len().min(piece);
                    let here = &c[..avail];
                    let (n, ev) = d.feed_placed(avail, |k, crc| crc.update(&here[..k]));
                    placed.extend_from_slice(&c[..n]);
                    (n, ev)
                }
                _ => d.feed(&c[..c.len().min(piece)]).unwrap(),
            };
            if let Some(RxEvent::End { crc_ok }) = ev {
                verdicts.push(crc_ok);
            }
            c = &c[n..];
        }
        assert!(d.at_boundary());
        (placed, verdicts)
    }

    #[test]
    fn deframer_payload_placed_in_place_is_checksummed() {
        let (stream, payload) = send_stream();
        for piece in [1usize, 5, 64, 299, 1000] {
            let (placed, verdicts) = feed_in_place(&stream, piece);
            assert_eq!(placed, payload, "pieces of {piece}");
            assert_eq!(verdicts, [true; 4], "pieces of {piece}");
            // One payload byte of the second FPDU corrupted: only its CRC fails.
            let mut bad = stream.clone();
            let second = (stream.len() / 4) + 40;
            bad[second] ^= 0x80;
            let (_, verdicts) = feed_in_place(&bad, piece);
            assert_eq!(verdicts, [true, false, true, true], "pieces of {piece}");
        }
        // Outside a payload nothing is taken (and the CRC is not asked for).
        let mut d = Deframer::new(true);
        assert_eq!(d.feed_placed(10, |_, _| panic!("no payload")).0, 0);
    }

    /// The bad headers of [`deframer_errors`] fail the same way when they come a byte at a
    /// time (gathered before they are looked at) as when they come whole (looked at where
    /// they lie); a good header is consumed to the same byte either way.
    #[test]
    fn deframer_errors_do_not_depend_on_how_the_header_arrives() {
        let mut terminate = vec![0x03, 0xfa, 0x41, 0x47];
        terminate.extend([0u8; 16]);
        let bad: [(&[u8], FrameError); 3] = [
            (&[0, 4, 0xc1, 0x40], FrameError::UlpduTooShort(4)),
            (&terminate, FrameError::ControlTooLong(1018)),
            (&[0, 20, 0x41, 0x41], FrameError::UlpduTooShort(20)),
        ];
        for (h, e) in bad {
            let mut d = Deframer::new(false);
            assert_eq!(d.feed(h).unwrap_err(), e, "whole {h:02x?}");
            let mut d = Deframer::new(false);
            let err = h.iter().find_map(|b| d.feed(std::slice::from_ref(b)).err());
            assert_eq!(err, Some(e), "a byte at a time {h:02x?}");
        }
        let mut d = Deframer::new(false).with_max_ulpdu(100);
        assert_eq!(d.feed(&[0, 101, 0xc1, 0x40]).unwrap_err(), FrameError::UlpduTooLong(101));
        let mut d = Deframer::new(false).with_max_ulpdu(100);
        assert!(matches!(d.feed(&[0, 101]).unwrap(), (2, None)));
        assert_eq!(d.feed(&[0xc1, 0x40]).unwrap_err(), FrameError::UlpduTooLong(101));
        // A Write header followed by its payload: whole, the header's 16 bytes are taken;
        // split after the probe, the rest of them.
        let w = DdpHeader::tagged(9, 0, true, RdmapCtrl::new(Opcode::Write));
        let mut wire = Vec::new();
        encode_fpdu(&w, &[], &[7u8; 8], false, &mut wire);
        let mut whole = Deframer::new(false);
        let (n, ev) = whole.feed(&wire).unwrap();
        assert_eq!(n, LEN_FIELD + TAGGED_HDR_LEN);
        let Some(RxEvent::Segment(a)) = ev else { panic!("{ev:?}") };
        let mut split = Deframer::new(false);
        assert!(matches!(split.feed(&wire[..PROBE]).unwrap(), (PROBE, None)));
        let (k, ev) = split.feed(&wire[PROBE..]).unwrap();
        assert_eq!(PROBE + k, n);
        let Some(RxEvent::Segment(b)) = ev else { panic!("{ev:?}") };
        assert_eq!((a.ulpdu_len, a.payload_len, a.control_len), (b.ulpdu_len, b.payload_len, b.control_len));
        assert_eq!(whole.want(), split.want());
    }

    #[test]
    fn deframer_errors() {
        let mut d = Deframer::new(false);
        // ULPDU length 4 with a tagged header
        assert_eq!(
            d.feed(&[0, 4, 0xc1, 0x40]).unwrap_err(),
            FrameError::UlpduTooShort(4)
        );
        let mut d = Deframer::new(false);
        // Terminate with 1000-byte body
        let mut h = vec![0x03, 0xfa, 0x41, 0x47];
        h.extend([0u8; 16]);
        assert_eq!(d.feed(&h).unwrap_err(), FrameError::ControlTooLong(1018));
        // Read request ULPDU too short for its 28-byte body
        let mut d = Deframer::new(false);
        assert_eq!(
            d.feed(&[0, 20, 0x41, 0x41]).unwrap_err(),
            FrameError::UlpduTooShort(20)
        );
    }
}
