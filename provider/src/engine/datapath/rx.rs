//! Receive: bytes from the stream into the protocol core, payload placed straight into
//! registered memory (RFC 5041 §4 tagged, §5 untagged placement) or through a small staging
//! buffer for short pieces. With MPA CRC the payload is placed straight into registered memory
//! too, then checksummed there (RFC 5044 §6); a mismatch terminates the stream before the
//! message completes (RFC 5044 §8).

use std::io;

use uiw_wire::conn::RxWant;
use uiw_wire::placement::Placement;

use crate::engine::transport::would_block;

use super::{is_sink_tag, place_at, DataPath, Env, Fatal, Link, Mem, DIRECT_MIN, DIRECT_TAIL, RX_BUDGET};

impl DataPath {
    /// Receives and transmits what the socket allows now. Returns whether there is more to do
    /// (the receive budget ran out) and whether the QP must fail.
    ///
    /// The peer's FIN ends the connection as soon as it is read (RFC 5040 §6, RDMAP stream
    /// management: the LLP stream's close ends the RDMAP Stream). Everything that arrived
    /// before it has been placed and completed by then, and what the application posted
    /// before it still goes to the socket (its completions stand once the bytes leave); then
    /// [`Fatal::Closed`], and the QP flushes the rest (the CQ hands the flushes out in a poll
    /// of their own, see `cq::Cq`).
    pub fn pump(&mut self, env: &Env) -> (bool, Option<Fatal>) {
        self.pump_with(env, false)
    }

    /// [`DataPath::pump`]; `input_quiet`: the stream was just seen to have nothing to read
    /// (one `poll` of several QPs' sockets, see `CqObj::drive`): what is staged is taken in,
    /// and no `recv` is made only to hear `EAGAIN`.
    pub fn pump_with(&mut self, env: &Env, input_quiet: bool) -> (bool, Option<Fatal>) {
        let (more, f) = self.pump_rx(env, input_quiet);
        if f.is_some() {
            return (false, f);
        }
        // A poll of an idle stream (nothing queued or held, nothing for the core to hand out
        // or report) has nothing to transmit: a spinning application's every empty poll asked.
        let idle = self.link.as_ref().is_some_and(|l| l.tx.is_empty() && l.held.is_empty() && !l.conn.has_events() && !l.conn.tx_pending());
        let f = if idle { None } else { self.pump_tx(env) };
        match self.link.as_mut() {
            // A write that fails now (the peer's reset answering bytes sent after its close)
            // does not make the orderly close a lost stream.
            Some(l) if l.peer_eof && matches!(f, None | Some(Fatal::Lost)) => {
                l.conn.handle_eof();
                (false, Some(Fatal::Closed))
            }
            _ => (more, f),
        }
    }

    /// Gives the connection a receive from the SRQ when it has none (one at a time: a QP never
    /// hoards the shared queue).
    fn top_up_srq(&mut self, env: &Env) {
        let Some(srq) = env.srq else { return };
        let Some(l) = self.link.as_ref() else { return };
        if l.conn.recv_posted() > 0 {
            return;
        }
        if let Some(w) = srq.take() {
            let _ = self.post_recv(env, w, true);
        }
    }

    fn pump_rx(&mut self, env: &Env, input_quiet: bool) -> (bool, Option<Fatal>) {
        let mut budget = RX_BUDGET;
        if let Some(l) = self.link.as_mut() {
            l.drained = input_quiet && !l.peer_hup;
        }
        loop {
            if budget == 0 {
                return (true, self.drain_events(env));
            }
            // Staged bytes go through the core in one call for as many FPDUs as they hold,
            // headers, payloads and trailers: a pass of this loop for each of them cost more
            // than the core's work on a small FPDU.
            if let Some(k) = self.take_staged(env) {
                budget = budget.saturating_sub(k);
                if let Some(f) = self.drain_events(env) {
                    return (false, Some(f));
                }
                continue;
            }
            let want = match self.link.as_ref() {
                Some(l) if !l.peer_eof => l.conn.rx_want(),
                _ => return (false, None),
            };
            // A Send waiting for a receive (RxWant::Wait) takes one from the SRQ, and goes on
            // at once if it got one. Only then: taken ahead, whenever the stream had bytes to
            // read, a receive stayed with a QP that had already had its Send, while another
            // QP's Send found the SRQ empty and ended in a "no buffer" Terminate (issue 13:
            // fi_shared_ctx -e msg, one Send per endpoint and as many shared receives).
            if matches!(want, RxWant::Wait) && env.srq.is_some() {
                let stalled = |l: &Option<Link>| l.as_ref().is_some_and(|l| l.conn.rx_stalled());
                let before = stalled(&self.link);
                self.top_up_srq(env);
                if before && !stalled(&self.link) {
                    continue;
                }
            }
            let DataPath { sq, rq, link, remote_hint, recv_hint, .. } = self;
            let l = link.as_mut().unwrap();
            let mut mem = Mem { mrs: env.mrs, hint: remote_hint, pd: env.pd, qp_access: env.qp_access, user_mem: env.user_mem, sq };
            let step = match want {
                RxWant::Wait => return (false, self.drain_events(env)),
                RxWant::Bytes(_) | RxWant::Place { place: Placement::Discard, .. } | RxWant::Discard => {
                    if l.st_lo < l.st_hi {
                        let k = match want {
                            RxWant::Discard => l.st_hi - l.st_lo,
                            _ => l.conn.rx_bytes(&l.stage[l.st_lo..l.st_hi], &mut mem),
                        };
                        l.st_lo += k;
                        Ok(k)
                    } else {
                        refill(l)
                    }
                }
                RxWant::Place { len, place } => {
                    let dst = place_at(place, env.mrs, mem.hint, recv_hint, mem.sq, rq);
                    let staged = l.st_hi - l.st_lo;
                    match dst {
                        Some(span) => {
                            let want = (len as u64).min(span.len()) as usize;
                            if staged > 0 {
                                let k = want.min(staged);
                                let chunk = &l.stage[l.st_lo..l.st_lo + k];
                                // A region deregistered meanwhile cannot be pinned: the
                                // bytes are never written elsewhere, and the message fails
                                // (`Connection::fail_placement`: a receive's Send or a Read
                                // whose local memory went as for memory that never checked
                                // out, siw's `siw_proc_send`, `siw_proc_rresp`; a peer's Write
                                // with a Terminate for its STag) — never a successful
                                // completion with bytes missing.
                                if span.with_pinned(0, k as u64, |p| env.user_mem.write(p, chunk)).is_none() {
                                    l.conn.fail_placement();
                                    return (false, self.drain_events(env));
                                }
                                l.conn.rx_placed(chunk, &mut mem);
                                l.st_lo += k;
                                Ok(k)
                            } else if l.drained {
                                Err(io::ErrorKind::WouldBlock.into())
                            } else {
                                // What follows the payload (trailer, next header) lands in
                                // a short tail: a longer one would pull the next FPDU's payload
                                // through the staging copy.
                                let user_mem = env.user_mem;
                                let direct = (want >= DIRECT_MIN).then(|| {
                                    span.with_pinned(0, want as u64, |p| match l.stream.recv_placed(user_mem, p, &mut l.stage[..DIRECT_TAIL]) {
                                        Ok(0) => Ok(0),
                                        Ok(n) => {
                                            l.drained = n < want + DIRECT_TAIL && !l.peer_hup;
                                            let placed = n.min(want);
                                            // With CRC, the placed bytes are checksummed where
                                            // they landed (still pinned); the segment completes
                                            // only once its trailer's CRC matched (RFC 5044 §6,
                                            // §8).
                                            l.conn.rx_placed_in_place(placed, |k, crc| user_mem.crc32c(p, k, crc), &mut mem);
                                            l.st_lo = 0;
                                            l.st_hi = n - placed;
                                            Ok(n)
                                        }
                                        Err(e) => Err(e),
                                    })
                                });
                                match direct.flatten() {
                                    Some(r) => r,
                                    None => refill(l),
                                }
                            }
                        }
                        // Memory that no longer resolves (a region deregistered meanwhile),
                        // or bytes past a receive's SGEs: the message fails where its bytes
                        // would be placed (siw's `siw_proc_send`), its bytes are written
                        // nowhere. (A receive's SGE that does not check out fails the same
                        // way, as its bytes are placed: `Dst::with_pinned`.)
                        None => {
                            l.conn.fail_placement();
                            return (false, self.drain_events(env));
                        }
                    }
                }
            };
            match step {
                Ok(0) if l.st_lo >= l.st_hi => {
                    // EOF: the peer closed its side. What arrived before the FIN has been
                    // delivered; `pump` ends the connection after its transmit pass.
                    l.peer_eof = true;
                    return (false, self.drain_events(env));
                }
                // Staged bytes the core did not take: wait for the next event instead of
                // spinning.
                Ok(0) => return (false, self.drain_events(env)),
                Ok(n) => budget = budget.saturating_sub(n),
                Err(e) if would_block(&e) => return (false, self.drain_events(env)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::engine::debug::why(format_args!("stream read failed: {e}"));
                    l.conn.handle_eof();
                    let f = self.drain_events(env);
                    return (false, f.or(Some(Fatal::Lost)));
                }
            }
            if let Some(f) = self.drain_events(env) {
                return (false, Some(f));
            }
        }
    }

    /// Gives the core the staged bytes ([`Connection::rx_staged`]), placing payload from the
    /// staging buffer as the general path does: a peer's Write's into the region its STag names
    /// (`MrHint::write_at`), a receive's or a Read's through [`place_at`]. `None`: nothing was
    /// staged or the core took none of it (the general path then finds out why: a placement
    /// that fails, a Send waiting for a receive, an event).
    ///
    /// [`Connection::rx_staged`]: uiw_wire::conn::Connection::rx_staged
    fn take_staged(&mut self, env: &Env) -> Option<usize> {
        let DataPath { sq, rq, link, remote_hint, recv_hint, .. } = self;
        let l = link.as_mut().filter(|l| l.st_lo < l.st_hi && !l.peer_eof)?;
        let (sq, rq, remote_hint, recv_hint) = (&*sq, &*rq, &*remote_hint, &*recv_hint);
        let mut mem = Mem { mrs: env.mrs, hint: remote_hint, pd: env.pd, qp_access: env.qp_access, user_mem: env.user_mem, sq };
        let place = |at: Placement, bytes: &[u8]| match at {
            Placement::Tagged { stag, to } if !is_sink_tag(stag) => {
                remote_hint.write_at(env.mrs, stag, to, bytes, env.user_mem).map_or(0, |()| bytes.len())
            }
            _ => place_at(at, env.mrs, remote_hint, recv_hint, sq, rq).map_or(0, |dst| {
                let k = (bytes.len() as u64).min(dst.len());
                dst.with_pinned(0, k, |p| env.user_mem.write(p, &bytes[..k as usize])).map_or(0, |()| k as usize)
            }),
        };
        let k = l.conn.rx_staged(&l.stage[l.st_lo..l.st_hi], &mut mem, place);
        l.st_lo += k;
        (k > 0).then_some(k)
    }
}

/// Reads what the socket has into the staging buffer.
fn refill(l: &mut Link) -> io::Result<usize> {
    if l.drained {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    l.st_lo = 0;
    l.st_hi = 0;
    let n = l.stream.recv(&mut l.stage)?;
    l.st_hi = n;
    l.drained = n < l.stage.len() && !l.peer_hup;
    Ok(n)
}
