//! Transmit: transmit units of the protocol core gathered into `sendmsg` calls, payload sent
//! straight from registered memory (zero copy), send completions held until their last byte
//! has been handed to TCP.

use std::io;

use smallvec::SmallVec;
use uiw_wire::conn::{LoneMsg, SendFlags, Tx, TxSegment};
use uiw_wire::segment::DATA_HDR;
use uiw_wire::placement::Source;

use super::super::mr::{MrHint, Span};
use super::super::user_memory::{IoPart, Pinned};
use super::{run_ref_at, DataPath, Env, Fatal, Link, SendEntry, WrTable, TRAILER_MAX, TX_BYTES, TX_COPY_MAX, TX_PIECES};
use crate::engine::transport::would_block;
use crate::engine::wr::{opcode, send_flags, Payload, SendWqe};

/// One piece of the transmit backlog.
#[derive(Debug)]
pub(super) enum Piece {
    /// Engine-owned bytes: FPDU headers and trailers, small payloads, control messages.
    Own(Vec<u8>),
    /// Application memory, pinned only for the `sendmsg` that sends it.
    User(Span),
}

impl Piece {
    pub(super) fn len(&self) -> usize {
        match self {
            Piece::Own(v) => v.len(),
            Piece::User(s) => s.len() as usize,
        }
    }

    /// The engine-owned bytes of this piece from `skip` on (`None` for application memory).
    pub(super) fn bytes(&self, skip: usize) -> Option<&[u8]> {
        match self {
            Piece::Own(v) => Some(&v[skip..]),
            Piece::User(_) => None,
        }
    }
}

/// A payload's pieces: most are one or two runs of memory, kept off the heap.
type Pieces = SmallVec<[Piece; 4]>;

/// The memory a transmit unit names is gone (deregistered since the request was checked).
#[derive(Debug)]
struct SourceGone;

/// Pieces one `sendmsg` takes at most.
const IOV_MAX: usize = 64;

impl DataPath {
    /// Moves transmit units from the protocol core to the socket until it would block.
    ///
    /// The core's events (send completions, a Terminate it framed) are taken once the batch
    /// queued with them went to the socket, not before: a send completion waits for its
    /// bytes anyway (`Link::held`, released once the batch has left), and building it ahead
    /// of the `sendmsg` only delayed the message.
    pub fn pump_tx(&mut self, env: &Env) -> Option<Fatal> {
        let alone_framed = self.frames_directly();
        loop {
            // Fill the backlog; `exhausted`: until the core had nothing more.
            let mut exhausted = false;
            loop {
                let l = self.link.as_mut()?;
                if l.tx.len() >= TX_PIECES || l.backlog() >= TX_BYTES {
                    break;
                }
                let Some(tx) = l.conn.next_tx() else {
                    exhausted = true;
                    break;
                };
                match tx {
                    Tx::Bytes(b) => l.push_bytes(&b),
                    Tx::Segment(s) => {
                        let n = s.payload_len as usize;
                        // All there is to send (nothing queued before it, nothing after it in
                        // the core): framed on the stack, handed to the stream in one call.
                        if n <= TX_COPY_MAX && alone_framed && l.tx.is_empty() && !l.conn.tx_pending() {
                            let f = if n <= LONE_SMALL {
                                self.send_alone::<{ DATA_HDR + LONE_SMALL + TRAILER_MAX }>(env, &s)
                            } else {
                                self.send_alone::<LONE_FRAME_MAX>(env, &s)
                            };
                            if f.is_some() {
                                return f;
                            }
                            continue;
                        }
                        // The payload is resolved before the header is queued: if its memory
                        // is gone, a Terminate goes out instead of the segment. A small one is
                        // copied, framed in place at the end of the backlog (cheaper than an
                        // iovec entry and a pin); a larger one is sent from registered memory,
                        // with CRC too: the checksum reads it in place.
                        if n <= TX_COPY_MAX {
                            let framed = l.push_framed(s.header.as_slice(), n, |payload| {
                                gather(&self.sq, &self.remote_hint, env, s.source, payload)?;
                                Ok(s.trailer(&[payload]))
                            });
                            if let Err(SourceGone) = framed {
                                l.conn.abort_source();
                            }
                            continue;
                        }
                        let mut pieces = Pieces::new();
                        let payload = source_pieces(&self.sq, &self.remote_hint, env, s.source, n, &mut pieces).map(|()| pieces);
                        let framed = payload.and_then(|pieces| {
                            let trailer = if l.conn.crc() {
                                let mut crc = s.crc_start();
                                checksum(env, &pieces, &mut crc)?;
                                s.trailer_after(crc)
                            } else {
                                s.trailer_no_crc()
                            };
                            Ok((pieces, trailer))
                        });
                        match framed {
                            Ok((pieces, trailer)) => {
                                l.push_bytes(s.header.as_slice());
                                for p in pieces {
                                    match p {
                                        Piece::Own(b) => {
                                            l.push_bytes(&b);
                                            l.recycle(b);
                                        }
                                        Piece::User(s) => l.push_user(s),
                                    }
                                }
                                l.push_bytes(trailer.as_slice());
                            }
                            Err(SourceGone) => l.conn.abort_source(),
                        }
                    }
                }
            }
            let l = self.link.as_mut()?;
            if l.tx.is_empty() {
                let f = self.drain_events(env);
                if let Some(l) = self.link.as_mut() {
                    release_held(l, env, self.sq.is_empty());
                }
                return f;
            }
            // Pin the application memory this sendmsg sends from, for its duration. A region
            // deregistered after its piece was queued (the application freed memory of a WR in
            // flight) cannot be sent from: the FPDU it is part of may be half out, so the
            // stream ends (the peer sees it lost, our WRs are flushed).
            let mut pins: SmallVec<[Option<Pinned>; 8]> = SmallVec::new();
            let mut gone = false;
            for (i, p) in l.tx.iter().take(IOV_MAX).enumerate() {
                let skip = if i == 0 { l.tx_skip } else { 0 };
                pins.push(match p {
                    Piece::User(s) => match s.pin_from(skip as u64) {
                        Some(pin) => Some(pin),
                        None => {
                            gone = true;
                            break;
                        }
                    },
                    _ => None,
                });
            }
            if gone {
                drop(pins);
                l.conn.handle_eof();
                return self.drain_events(env).or(Some(Fatal::Lost));
            }
            let parts: SmallVec<[IoPart<'_>; 8]> = l
                .tx
                .iter()
                .zip(&pins)
                .enumerate()
                .map(|(i, (p, pin))| match pin {
                    Some(pin) => IoPart::User(pin),
                    None => IoPart::Bytes(p.bytes(if i == 0 { l.tx_skip } else { 0 }).unwrap_or_default()),
                })
                .collect();
            // Every byte queued is offered from here on (what the stream does not take now
            // waits for its room).
            l.unrung = 0;
            let sent = l.stream.send(env.user_mem, &parts);
            drop(parts);
            drop(pins);
            match sent {
                Ok(mut n) => {
                    l.tx_sent += n as u64;
                    l.tx_blocked = false;
                    l.follow_mss();
                    while n > 0 {
                        let left = l.tx.front().map(|p| p.len() - l.tx_skip).unwrap_or(0);
                        if n >= left {
                            n -= left;
                            if let Some(Piece::Own(v)) = l.tx.pop_front() {
                                l.recycle(v);
                            }
                            l.tx_skip = 0;
                        } else {
                            l.tx_skip += n;
                            n = 0;
                        }
                    }
                    // Everything the core had went out, and what it reported meanwhile feeds
                    // it nothing new (only its Established event does, and the stream was
                    // established already): another round would only learn that again.
                    let settled = exhausted && l.tx.is_empty() && l.established;
                    // What the core reported while this batch was framed: its send
                    // completions wait for the batch to have left (`held`, in order).
                    if let Some(f) = self.drain_events(env) {
                        return Some(f);
                    }
                    release_held(self.link.as_mut()?, env, self.sq.is_empty());
                    if settled {
                        return None;
                    }
                    if let Some(h) = env.holder {
                        h.still_sending();
                    }
                }
                Err(e) if would_block(&e) => {
                    l.tx_blocked = true;
                    return self.drain_events(env);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::engine::debug::why(format_args!("stream write failed: {e}"));
                    l.conn.handle_eof();
                    return self.drain_events(env).or(Some(Fatal::Lost));
                }
            }
        }
    }
}

/// The largest FPDU [`DataPath::post_direct`] frames beside its payload: a data header, a
/// payload copied beside it, the trailer (a lone Read Request's, `post_lone_read`, is
/// shorter).
const LONE_FRAME_MAX: usize = DATA_HDR + TX_COPY_MAX + TRAILER_MAX;
/// The payloads [`DataPath::post_direct`] frames in a smaller frame (latency tests' 8 bytes, an
/// MPI's or NVMe-oF's small messages, up to a 64-byte capsule).
const LONE_SMALL: usize = 64;
const _: () = assert!(LONE_FRAME_MAX >= uiw_wire::mpa::fpdu_len(uiw_wire::ddp::UNTAGGED_HDR_LEN + uiw_wire::rdmap::READ_REQ_LEN));

impl DataPath {
    /// Frames a Send or RDMA Write that fits one FPDU as it is posted, when no WR is
    /// outstanding before it (the send queue is empty, the protocol core has nothing waiting to
    /// go out: `Connection::send_lone`): its FPDU goes straight to the transmit backlog — a
    /// payload of up to [`TX_COPY_MAX`] bytes copied beside its header, a larger one sent from
    /// registered memory — and its completion is reported as [`DataPath::pump_tx`] would have
    /// reported it (`report_send`: held until its bytes have left). What the general path
    /// goes through for such a WR — a send-queue entry, the core's posted-WR queue, its
    /// transmit unit and its completion event — was most of a post's cost for the small
    /// messages of RDMA's latency tests and of an MPI, and for an NVMe-oF target's 4 KiB Read
    /// data and response capsules (a chain of a Write and a Send per I/O, all of which take
    /// this path one after the other).
    ///
    /// With `ring` (a WR rung on its own), a small FPDU on an idle stream is handed to the
    /// stream at once, in one call, framed on the stack; otherwise it waits in the backlog for
    /// the chain's doorbell ([`DataPath::doorbell`]) or for the stream to take more.
    ///
    /// `len` is the payload's length (`Payload::len`, checked below 4 GiB). `None`: nothing
    /// was done, the WR takes the general path (an opcode or flag this path does not frame,
    /// more than one FPDU, MPA CRC on a payload sent from registered memory, memory that does
    /// not check out — the general path fails it).
    pub(super) fn post_direct(&mut self, env: &Env, id: u64, wqe: &SendWqe, len: u32, ring: bool) -> Option<Option<Fatal>> {
        if !self.frames_directly() {
            return None;
        }
        let n = len as usize;
        if !self.sq.is_empty() || wqe.flags & send_flags::FENCE != 0 {
            return None;
        }
        let solicited = wqe.flags & send_flags::SOLICITED != 0;
        let msg = match wqe.opcode {
            opcode::SEND => LoneMsg::Send(SendFlags { solicited, invalidate: None }),
            opcode::SEND_WITH_INV => LoneMsg::Send(SendFlags { solicited, invalidate: Some(wqe.imm_or_inv) }),
            opcode::RDMA_WRITE => LoneMsg::Write { stag: wqe.rkey, to: wqe.remote_addr },
            _ => return None,
        };
        self.link.as_ref().filter(|l| l.established)?;
        // The frame is zeroed before it is filled: a frame for the largest payload cost a
        // tenth of an 8-byte message's post in `memset`.
        if n <= LONE_SMALL {
            self.frame_direct::<{ DATA_HDR + LONE_SMALL + TRAILER_MAX }>(env, id, wqe, n, msg, ring)
        } else if n <= TX_COPY_MAX {
            self.frame_direct::<LONE_FRAME_MAX>(env, id, wqe, n, msg, ring)
        } else {
            self.queue_direct(env, id, wqe, len, msg, ring)
        }
    }

    /// [`DataPath::post_direct`]'s message with its payload copied beside its header, framed
    /// in `N` bytes (enough for its `n` bytes).
    fn frame_direct<const N: usize>(&mut self, env: &Env, id: u64, wqe: &SendWqe, n: usize, msg: LoneMsg, ring: bool) -> Option<Option<Fatal>> {
        let l = self.link.as_mut()?;
        // The payload is read before the core hears of the message: memory that does not
        // check out (an SGE outside its region, of another PD, a region deregistered) leaves
        // the WR to the general path, which fails it. It goes straight to its place in the
        // frame, after the longest data header; the header then ends where it begins.
        let mut frame = [0u8; N];
        let body = DATA_HDR..DATA_HDR + n;
        match &wqe.payload {
            Payload::Inline(b) => frame[body.clone()].copy_from_slice(&b[..n]),
            Payload::Sges(sges) => {
                let mut at = DATA_HDR;
                for s in sges.iter().filter(|s| s.length > 0) {
                    let k = s.length as usize;
                    self.local_hint.read_at(env.mrs, env.pd, s.lkey, s.addr, &mut frame[at..at + k], env.user_mem)?;
                    at += k;
                }
            }
        }
        let (seg, done) = l.conn.send_lone(id, msg, n as u32)?;
        self.sq.pass();
        let trailer = seg.trailer(&[&frame[body.clone()]]);
        let start = seg.header.put_before(&mut frame, DATA_HDR);
        let end = trailer.put_at(&mut frame, body.end);
        let fatal = if ring && l.tx.is_empty() && !l.tx_blocked {
            self.send_framed(env, &frame[start..end])
        } else {
            self.queue_unrung(env, ring, |l| l.push_bytes(&frame[start..end]))
        };
        self.report_send(env, wqe, done.status, done.byte_len, ring);
        Some(fatal)
    }

    /// [`DataPath::post_direct`]'s message with a payload larger than [`TX_COPY_MAX`]: its
    /// header, its payload as runs of registered memory (pinned only by the `sendmsg` that
    /// sends them, as the general path's), its trailer, queued in the backlog. Not with MPA
    /// CRC (whose checksum reads the payload where it is, which the general path does).
    fn queue_direct(&mut self, env: &Env, id: u64, wqe: &SendWqe, len: u32, msg: LoneMsg, ring: bool) -> Option<Option<Fatal>> {
        let Payload::Sges(sges) = &wqe.payload else { return None };
        let l = self.link.as_ref()?;
        if l.conn.crc() {
            return None;
        }
        let runs = super::resolve(env.mrs, &self.local_hint, env.pd, sges, 0).ok()?;
        let l = self.link.as_mut()?;
        let (seg, done) = l.conn.send_lone(id, msg, len)?;
        self.sq.pass();
        let fatal = self.queue_unrung(env, ring, |l| {
            l.push_bytes(seg.header.as_slice());
            for run in runs {
                l.push_user(run);
            }
            l.push_bytes(seg.trailer_no_crc().as_slice());
        });
        self.report_send(env, wqe, done.status, done.byte_len, ring);
        Some(fatal)
    }

    /// Queues a direct FPDU (`queue` appends it to the backlog) as bytes no `sendmsg` was
    /// offered yet (`Link::unrung`); then, with `ring`, the doorbell — the backlog goes to the
    /// stream unless it was backed up already (then the stream's room sends it, as for any WR
    /// rung behind a full socket: [`DataPath::doorbell`]).
    fn queue_unrung(&mut self, env: &Env, ring: bool, queue: impl FnOnce(&mut Link)) -> Option<Fatal> {
        let l = self.link.as_mut()?;
        let backed_up = l.backed_up();
        let queued = l.tx_queued;
        queue(l);
        l.unrung += l.tx_queued - queued;
        #[cfg(test)]
        {
            l.direct_sent += 1;
        }
        if ring && !backed_up {
            self.pump_tx(env)
        } else {
            None
        }
    }

    /// Sends a lone RDMA Read Request at once (`Connection::read_lone`): a Read rung on its
    /// own on an idle established stream, with room under the ORD. WR `id` is on the send
    /// queue already, and stays there until its response has been placed.
    ///
    /// `None`: nothing was done, the WR takes the general path. `Some`: its request was sent
    /// (or queued, as [`DataPath::post_direct`]'s FPDU), with what the transmit reported.
    pub(super) fn post_lone_read(&mut self, env: &Env, id: u64) -> Option<Option<Fatal>> {
        if !self.frames_directly() {
            return None;
        }
        let l = self.link.as_mut().filter(|l| l.established && l.tx.is_empty() && !l.tx_blocked)?;
        let e = self.sq.get_mut(id).filter(|e| !e.fed && e.wqe.opcode == opcode::RDMA_READ && e.wqe.flags & send_flags::FENCE == 0)?;
        let w = &e.wqe;
        let fpdu = l.conn.read_lone(id, e.sink?, 0, w.rkey, w.remote_addr, w.payload.len() as u32)?;
        e.fed = true;
        Some(self.send_framed(env, fpdu.as_slice()))
    }

    /// Whether an FPDU may be framed outside the backlog ([`DataPath::post_direct`],
    /// [`DataPath::post_lone_read`], [`DataPath::send_alone`]): always, but in the tests'
    /// reference for the general path (`general_only`).
    fn frames_directly(&self) -> bool {
        #[cfg(test)]
        if self.general_only {
            return false;
        }
        true
    }

    /// Sends segment `s` of the core's (a payload of at most [`TX_COPY_MAX`] bytes), framed in
    /// `N` bytes on the stack, in one call ([`DataPath::send_framed`]): what [`DataPath::pump_tx`]
    /// does with an FPDU that is all there is to send — most often the Read Response to a
    /// lone Read Request, which the backlog, its pins and its iovec list cost a passive
    /// responder more than the rest of its turnaround. Memory gone meanwhile: the core's
    /// `abort_source`, as in `pump_tx`.
    fn send_alone<const N: usize>(&mut self, env: &Env, s: &TxSegment) -> Option<Fatal> {
        let DataPath { sq, link, remote_hint, .. } = self;
        let l = link.as_mut()?;
        let (hl, n) = (s.header.len(), s.payload_len as usize);
        let body = hl..hl + n;
        let mut frame = [0u8; N];
        s.header.put_before(&mut frame, hl);
        if let Err(SourceGone) = gather(sq, remote_hint, env, s.source, &mut frame[body.clone()]) {
            l.conn.abort_source();
            return None;
        }
        let trailer = s.trailer(&[&frame[body.clone()]]);
        let end = trailer.put_at(&mut frame, body.end);
        self.send_framed(env, &frame[..end])
    }

    /// Hands one framed FPDU to an idle stream in one call. A stream that takes only part of it
    /// gets the rest through the backlog: a full socket, an interrupted call or a broken stream
    /// (an error: nothing sent) is then dealt with by the general transmit, [`DataPath::pump_tx`].
    fn send_framed(&mut self, env: &Env, frame: &[u8]) -> Option<Fatal> {
        let l = self.link.as_mut()?;
        debug_assert!(l.tx.is_empty(), "a frame goes ahead of nothing queued");
        #[cfg(test)]
        {
            l.direct_sent += 1;
        }
        let sent = l.stream.send(env.user_mem, &[IoPart::Bytes(frame)]).unwrap_or_default();
        l.tx_queued += sent as u64;
        l.tx_sent += sent as u64;
        if sent < frame.len() {
            l.push_bytes(&frame[sent..]);
            return self.pump_tx(env);
        }
        l.tx_blocked = false;
        l.follow_mss();
        // As after any batch that left: completions held behind earlier bytes, or for an
        // answer that this new WR makes moot, go now.
        release_held(l, env, self.sq.is_empty());
        None
    }
}

/// Reports the held completions whose bytes left — the first not before the peer's answer, if
/// it waits for one (see `answer`). `alone`: no WR is outstanding on the send queue.
pub(super) fn release_held(l: &mut Link, env: &Env, alone: bool) {
    while let Some(&(mark, c)) = l.held.front() {
        if mark > l.tx_sent || (l.answer.waiting() && !l.answer.release(|| env.poller_clock_now(), l.conn.counters().rx_msgs, alone)) {
            break;
        }
        l.held.pop_front();
        env.send_cq.push(c);
    }
}

/// The pieces of `len` payload bytes at `src`.
fn source_pieces(sq: &WrTable<SendEntry>, remote_hint: &MrHint, env: &Env, src: Source, len: usize, out: &mut Pieces) -> Result<(), SourceGone> {
    match src {
        Source::Wr { wr_id, offset } => {
            let Some(e) = sq.get(wr_id) else {
                // The protocol core only names WRs it was given and has not completed.
                out.push(Piece::Own(vec![0; len]));
                return Ok(());
            };
            match &e.wqe.payload {
                Payload::Inline(b) => {
                    let o = offset as usize;
                    out.push(Piece::Own(b[o.min(b.len())..(o + len).min(b.len())].to_vec()));
                }
                Payload::Sges(_) => {
                    let mut off = u64::from(offset);
                    let mut left = len as u64;
                    while left > 0 {
                        let (run, within) = run_ref_at(&e.runs, off).ok_or(SourceGone)?;
                        let k = (run.len() - within).min(left);
                        out.push(Piece::User(run.sub(within, k).ok_or(SourceGone)?));
                        off += k;
                        left -= k;
                    }
                }
            }
        }
        // A Read Response: the Read Request was checked on arrival (RFC 5040 §5.3); the
        // region must still be there now.
        Source::Tagged { stag, to } => {
            let span = remote_hint.lookup(env.mrs, stag).and_then(|mr| mr.span_from(to)).and_then(|s| s.sub(0, len as u64));
            out.push(Piece::User(span.ok_or(SourceGone)?));
        }
        Source::None => {}
    }
    Ok(())
}

/// MPA CRC32c (RFC 5044 §6) of a payload's pieces, application memory read where it is (no
/// staging copy), each piece pinned only while it is read. The same range is pinned again for
/// the `sendmsg` that sends it; a region deregistered in between ends the stream there, as
/// without CRC. Bytes the application changes between the two (a buffer of a posted Send or
/// Write, which it must not touch; or memory a peer's Read is being served from) go out with a
/// CRC that no longer matches them: the peer fails the stream with an MPA CRC error (RFC 5044
/// §8) rather than accept them. The kernel's siw has the same window (it checksums pages, then
/// hands them to TCP).
fn checksum(env: &Env, pieces: &[Piece], crc: &mut uiw_wire::crc::Crc32c) -> Result<(), SourceGone> {
    for p in pieces {
        match p {
            Piece::Own(v) => crc.update(v),
            Piece::User(s) => env.user_mem.crc32c(&s.pin().ok_or(SourceGone)?, s.len() as usize, crc),
        }
    }
    Ok(())
}

/// A small payload copied into `buf` (sent beside its header, see `TX_COPY_MAX`), which
/// comes zeroed: the same bytes as [`source_pieces`] names, each run of registered memory
/// pinned only while it is read.
fn gather(sq: &WrTable<SendEntry>, remote_hint: &MrHint, env: &Env, src: Source, buf: &mut [u8]) -> Result<(), SourceGone> {
    match src {
        Source::Wr { wr_id, offset } => {
            // The protocol core only names WRs it was given and has not completed.
            let Some(e) = sq.get(wr_id) else { return Ok(()) };
            match &e.wqe.payload {
                Payload::Inline(b) => {
                    let o = (offset as usize).min(b.len());
                    let k = (b.len() - o).min(buf.len());
                    buf[..k].copy_from_slice(&b[o..o + k]);
                }
                Payload::Sges(_) => {
                    let mut off = u64::from(offset);
                    let mut at = 0usize;
                    while at < buf.len() {
                        let (run, within) = run_ref_at(&e.runs, off).ok_or(SourceGone)?;
                        let k = (run.len() - within).min((buf.len() - at) as u64);
                        let pinned = run.pin_sub(within, k).ok_or(SourceGone)?;
                        env.user_mem.read(&pinned, &mut buf[at..at + k as usize]);
                        at += k as usize;
                        off += k;
                    }
                }
            }
        }
        // A Read Response: the Read Request was checked on arrival (RFC 5040 §5.3); the
        // region must still be there now.
        Source::Tagged { stag, to } => remote_hint.read_remote(env.mrs, stag, to, buf, env.user_mem).ok_or(SourceGone)?,
        Source::None => {}
    }
    Ok(())
}
