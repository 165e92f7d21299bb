//! Receive: bytes from the stream into the protocol core, payload placed straight into
//! registered memory (RFC 5041 §4 tagged, §5 untagged placement) or through a small staging
//! buffer for short pieces.

use std::io;

use uiw_wire::conn::RxWant;
use uiw_wire::placement::Placement;

use super::{place_at, DataPath, Env, Fatal, Link, Mem, DIRECT_MIN, DIRECT_TAIL, RX_BUDGET};

impl DataPath {
    /// Receives and transmits what the socket allows now. Returns whether there is more to do
    /// (the receive budget ran out) and whether the QP must fail.
    pub fn pump(&mut self, env: &Env) -> (bool, Option<Fatal>) {
        let (more, f) = self.pump_rx(env);
        if f.is_some() {
            return (false, f);
        }
        (more, self.pump_tx(env))
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

    fn pump_rx(&mut self, env: &Env) -> (bool, Option<Fatal>) {
        let mut budget = RX_BUDGET;
        if let Some(l) = self.link.as_mut() {
            l.drained = false;
        }
        loop {
            if budget == 0 {
                return (true, self.drain_events(env));
            }
            let want = match self.link.as_ref() {
                Some(l) if l.peer_closed.is_none() => l.conn.rx_want(),
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
            let DataPath { sq, rq, sinks, link, .. } = self;
            let l = link.as_mut().unwrap();
            let mut mem = Mem { mrs: env.mrs, pd: env.pd, qp_access: env.qp_access, user_mem: env.user_mem, sinks, sq };
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
                    let dst = place_at(place, env.mrs, mem.sinks, mem.sq, rq);
                    let staged = l.st_hi - l.st_lo;
                    match dst {
                        Some(span) => {
                            let want = (len as u64).min(span.len()) as usize;
                            if staged > 0 {
                                let k = want.min(staged);
                                let chunk = &l.stage[l.st_lo..l.st_lo + k];
                                // A region deregistered meanwhile cannot be pinned: the
                                // bytes are dropped, never written elsewhere.
                                if let Some(p) = span.sub(0, k as u64).and_then(|s| s.pin()) {
                                    env.user_mem.write(&p, chunk);
                                }
                                l.conn.rx_placed(chunk, &mut mem);
                                l.st_lo += k;
                                Ok(k)
                            } else if l.drained {
                                Err(io::ErrorKind::WouldBlock.into())
                            } else if let Some(p) =
                                span.sub(0, want as u64).filter(|_| want >= DIRECT_MIN && !l.conn.crc()).and_then(|s| s.pin())
                            {
                                // What follows the payload (trailer, next header) lands in
                                // a short tail: a longer one would pull the next FPDU's payload
                                // through the staging copy.
                                match l.stream.recv_placed(env.user_mem, &p, &mut l.stage[..DIRECT_TAIL]) {
                                    Ok(0) => Ok(0),
                                    Ok(n) => {
                                        l.drained = n < want + DIRECT_TAIL && !l.peer_hup;
                                        let placed = n.min(want);
                                        l.conn.rx_placed_len(placed, &mut mem);
                                        l.st_lo = 0;
                                        l.st_hi = n - placed;
                                        Ok(n)
                                    }
                                    Err(e) => Err(e),
                                }
                            } else {
                                refill(l)
                            }
                        }
                        // A receive whose memory did not check out: the Send fails here,
                        // where its bytes would be placed (siw's `siw_proc_send`).
                        None if matches!(place, Placement::Recv { .. }) => {
                            l.conn.fail_placement();
                            return (false, self.drain_events(env));
                        }
                        // Checked placement that no longer resolves (region deregistered
                        // meanwhile): the bytes are dropped, never written elsewhere.
                        None => {
                            if staged > 0 {
                                let k = (len as usize).min(staged);
                                let chunk = &l.stage[l.st_lo..l.st_lo + k];
                                l.conn.rx_placed(chunk, &mut mem);
                                l.st_lo += k;
                                Ok(k)
                            } else {
                                refill(l)
                            }
                        }
                    }
                }
            };
            match step {
                Ok(0) if l.st_lo >= l.st_hi => {
                    // EOF: the peer closed its side. What arrived before the FIN has been
                    // delivered; the QP fails `PEER_CLOSE_GRACE_MS` later (a deadline of the
                    // progress thread's, see `Qp::next_timeout`), so that an application
                    // finishing its last completions does not find flushes of its remaining
                    // receives in the same batch (ibv_rc_pingpong treats any as a failure;
                    // siw, too, handles a peer close from a work queue).
                    l.peer_closed.get_or_insert(crate::engine::transport::now_ms());
                    return (false, self.drain_events(env));
                }
                // Staged bytes the core did not take: wait for the next event instead of
                // spinning.
                Ok(0) => return (false, self.drain_events(env)),
                Ok(n) => budget = budget.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (false, self.drain_events(env)),
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
