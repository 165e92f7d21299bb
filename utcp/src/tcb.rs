//! One TCP connection: the RFC 9293 state machine, sans IO.
//!
//! Input: received segments (`on_segment`), application bytes (`send`), the clock
//! (`on_timeout`). Output: segments to transmit (`poll_transmit`), received bytes (`recv`),
//! events (`poll_event`), the next deadline (`poll_timeout`).
//!
//! What it does, with the RFC it follows:
//! - active and passive open with MSS, window scale (RFC 7323 §2) and SACK-permitted
//!   (RFC 2018) options; no timestamps; simultaneous open is not supported (uiw never needs it);
//! - sequence/ACK processing and segment acceptability (RFC 9293 §3.10.7.4), RST validation
//!   and challenge ACKs (RFC 5961 §3, §4);
//! - reassembly of out-of-order data and SACK blocks for it (RFC 2018 §4), and D-SACK for
//!   data received twice (RFC 2883), from which a Linux sender learns that it retransmitted
//!   needlessly (veth reorders segments sent from two CPUs): it widens its reordering window
//!   and undoes the congestion response;
//! - retransmission timeout (RFC 6298, Karn's rule), slow start and congestion avoidance
//!   (RFC 5681), fast retransmit after three duplicate ACKs with NewReno recovery
//!   (RFC 6582), and retransmission that skips what the peer SACKed (a simple RFC 6675);
//! - a tail loss probe (RFC 8985 §7, without RACK): a flight whose tail or whose last ACK
//!   was lost is probed after about two RTTs instead of waiting for the RTO;
//! - flow control with zero-window probes (RFC 9293 §3.8.6.1);
//! - FIN in both directions, TIME-WAIT (short, configurable), RST on abort;
//! - no Nagle; delayed ACK only if configured (`Config::ack_delay`, RFC 9293 §3.8.6.3,
//!   RFC 5681 §4.2): by default an ACK goes out on the next `poll_transmit` after data
//!   arrives (one per batch of received segments); with a delay, in-order data is
//!   acknowledged by the next segment that leaves (the reply of a request/response
//!   exchange carries it), by a pure ACK once two full-sized segments' worth is
//!   unacknowledged, or when the delay is up — out-of-order data, a FIN and a window
//!   update are acknowledged at once;
//! - no keep-alive (RFC 9293 §3.8.4 makes it optional; the RDMA layer detects dead peers).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::packet::{flags, TcpHeader};
use crate::reasm::Reassembly;
use crate::rtt::Rtt;
use crate::seq;

/// RFC 8985 §7.2 WCDelAckT: the worst-case delayed-ACK timer of the peer, added to the PTO
/// when one segment is in flight (a lone segment may be acknowledged that late).
const WC_DEL_ACK: Duration = Duration::from_millis(200);

/// RFC 8985 §7.2: the PTO before any RTT sample.
const PTO_INITIAL: Duration = Duration::from_secs(1);

/// Added to 2·SRTT when more than one segment is in flight: room for the peer's ACK to be
/// late by a scheduling delay rather than lost. Linux adds two jiffies (`TCP_TIMEOUT_MIN`,
/// 2 ms at HZ=1000); on a veth an SRTT is tens of microseconds, and a PTO of twice that
/// would probe every time the peer's thread is preempted.
const PTO_SLACK: Duration = Duration::from_millis(2);

/// Per-connection tunables.
#[derive(Debug, Clone)]
pub struct Config {
    /// The MSS this side announces (path MTU − 40).
    pub mss: u16,
    /// Receive buffer: the most unread plus out-of-order bytes held, and the window offered.
    pub recv_buf: usize,
    /// Send buffer: the most unacknowledged plus unsent bytes `send` takes.
    pub send_buf: usize,
    /// RTO before the first RTT sample (RFC 6298 §2.1: 1 s).
    pub rto_initial: Duration,
    /// Lower clamp of the RTO. RFC 6298 §2.4 says 1 s; Linux uses 200 ms, and so does this
    /// default; a data-centre deployment may lower it.
    pub rto_min: Duration,
    /// Upper clamp (RFC 6298 §2.5: at least 60 s).
    pub rto_max: Duration,
    /// Consecutive timeouts of the same data before the connection is given up.
    pub max_retries: u32,
    /// How long TIME-WAIT lasts (2·MSL in RFC 9293; short here, since uiw picks fresh ports).
    pub time_wait: Duration,
    /// Offer and use SACK.
    pub sack: bool,
    /// How long in-order data may wait for its ACK to ride on a segment of ours (RFC 9293
    /// §3.8.6.3: delayed ACK, under 0.5 s, and at least every second full-sized segment).
    /// Zero (the default): acknowledge every batch at once.
    pub ack_delay: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mss: 1460,
            recv_buf: 1 << 20,
            send_buf: 1 << 20,
            rto_initial: Duration::from_secs(1),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(60),
            max_retries: 15,
            time_wait: Duration::from_secs(1),
            sack: true,
            ack_delay: Duration::ZERO,
        }
    }
}

/// RFC 9293 §3.3.2 states (LISTEN lives in the stack, not in a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
    Closed,
}

/// What happened, for the owner of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The three-way handshake completed.
    Connected,
    /// In-order bytes are ready for `recv`.
    Readable,
    /// The peer sent FIN: no more bytes will arrive after what `recv` still returns.
    PeerClosed,
    /// The peer reset the connection (or refused it).
    Reset,
    /// Retransmissions were exhausted; the connection was reset.
    TimedOut,
    /// The connection reached CLOSED (after any of the above, or a clean close).
    Closed,
}

/// Why `send` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The connection is not open for sending (closing, closed or reset).
    NotOpen,
}

/// One TCP connection.
#[derive(Debug)]
pub struct Tcb {
    cfg: Config,
    state: State,
    local_port: u16,
    remote_port: u16,

    // Send sequence space.
    iss: u32,
    snd_una: u32,
    snd_nxt: u32,
    /// Highest sequence number sent + 1 (snd_nxt falls back below it after an RTO).
    snd_max: u32,
    snd_wnd: u32,
    snd_wl1: u32,
    snd_wl2: u32,
    /// Peer's window shift (0 without window scaling).
    snd_shift: u8,
    /// Largest segment payload toward the peer.
    snd_mss: usize,
    /// Unacknowledged and unsent bytes; `tx[0]` has sequence number `tx_seq`.
    tx: VecDeque<u8>,
    tx_seq: u32,
    /// The application closed: send FIN after `tx`.
    fin_queued: bool,
    /// Sequence number of our FIN once sent.
    fin_seq: Option<u32>,

    // Receive sequence space.
    irs: u32,
    rcv_nxt: u32,
    /// Our window shift (0 if the peer did not offer scaling).
    rcv_shift: u8,
    rcv_shift_offer: u8,
    rx: VecDeque<u8>,
    /// Stream offset of `rcv_nxt` (bytes delivered in order so far).
    rx_off: u64,
    ooo: Reassembly,
    /// Sequence number of the peer's FIN, seen but maybe not yet in order.
    peer_fin: Option<u32>,
    peer_fin_done: bool,
    /// Window last advertised, for window-update decisions.
    adv_wnd: usize,

    // Loss recovery.
    rtt: Rtt,
    timing: Option<(u32, Instant)>,
    rto_at: Option<Instant>,
    retries: u32,
    cwnd: usize,
    ssthresh: usize,
    dupacks: u32,
    /// NewReno: `recover` while in fast recovery.
    recover: Option<u32>,
    /// A retransmission to send next (fast retransmit, partial ACK, SACK hole).
    rexmit: Option<u32>,
    /// End of the last fast retransmission (where the next SACK hole search starts).
    last_rexmit: Option<u32>,
    /// SACK scoreboard: ranges above `snd_una` the peer holds, sorted, disjoint.
    sacked: Vec<(u32, u32)>,
    /// Window scaling negotiated (both SYNs carried the option).
    ws_ok: bool,
    sack_ok: bool,
    /// Window probe due (zero window, persist timer fired).
    probe: bool,
    /// Tail loss probe (RFC 8985 §7): when the probe timeout (PTO) fires.
    tlp_at: Option<Instant>,
    /// The PTO fired: `poll_transmit` sends the probe next.
    tlp_due: bool,
    /// The outstanding probe's sequence range (RFC 8985 TLP.end_seq, and where it starts):
    /// no further probe until it is cumulatively acknowledged or the RTO fires.
    tlp_seg: Option<(u32, u32)>,

    ack_now: bool,
    /// Data received twice, to report once as the first SACK block of the next segment
    /// (D-SACK, RFC 2883 §4).
    dsack: Option<(u32, u32)>,
    /// In-order data waits for its ACK until then (delayed ACK, `Config::ack_delay`).
    ack_due: Option<Instant>,
    /// In-order bytes received since our last segment (which acknowledged everything before).
    unacked: usize,
    rst_pending: Option<TcpHeader>,
    tw_until: Option<Instant>,
    events: VecDeque<Event>,
    /// `Readable` already queued and not yet followed by a `recv`.
    readable_signalled: bool,
}

/// Our window-scale shift for a receive buffer (RFC 7323 §2.3).
fn shift_for(buf: usize) -> u8 {
    let mut s = 0u8;
    while s < 14 && (buf >> s) > 0xffff {
        s += 1;
    }
    s
}

impl Tcb {
    fn new(cfg: Config, local_port: u16, remote_port: u16, iss: u32, state: State) -> Self {
        let rtt = Rtt::new(cfg.rto_initial, cfg.rto_min, cfg.rto_max);
        let rcv_shift_offer = shift_for(cfg.recv_buf);
        let snd_mss = 536;
        Tcb {
            state,
            local_port,
            remote_port,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd: 0,
            snd_wl1: 0,
            snd_wl2: 0,
            snd_shift: 0,
            snd_mss,
            tx: VecDeque::new(),
            tx_seq: iss.wrapping_add(1),
            fin_queued: false,
            fin_seq: None,
            irs: 0,
            rcv_nxt: 0,
            rcv_shift: 0,
            rcv_shift_offer,
            rx: VecDeque::new(),
            rx_off: 0,
            ooo: Reassembly::default(),
            peer_fin: None,
            peer_fin_done: false,
            adv_wnd: 0,
            rtt,
            timing: None,
            rto_at: None,
            retries: 0,
            cwnd: 0,
            ssthresh: usize::MAX,
            dupacks: 0,
            recover: None,
            rexmit: None,
            last_rexmit: None,
            sacked: Vec::new(),
            ws_ok: false,
            sack_ok: false,
            probe: false,
            tlp_at: None,
            tlp_due: false,
            tlp_seg: None,
            ack_now: false,
            dsack: None,
            ack_due: None,
            unacked: 0,
            rst_pending: None,
            tw_until: None,
            events: VecDeque::new(),
            readable_signalled: false,
            cfg,
        }
    }

    /// Active open: the connection starts in SYN-SENT; `poll_transmit` sends the SYN.
    pub fn connect(cfg: Config, local_port: u16, remote_port: u16, iss: u32) -> Self {
        Tcb::new(cfg, local_port, remote_port, iss, State::SynSent)
    }

    /// Passive open from a received SYN (the stack's LISTEN found a listener for it); the
    /// connection starts in SYN-RECEIVED and `poll_transmit` sends the SYN-ACK.
    pub fn accept(cfg: Config, syn: &TcpHeader, iss: u32) -> Self {
        let mut t = Tcb::new(cfg, syn.dst_port, syn.src_port, iss, State::SynReceived);
        t.take_syn(syn);
        t.snd_wnd = u32::from(syn.window); // never scaled in a SYN (RFC 7323 §2.2)
        t.snd_wl1 = syn.seq;
        t.snd_wl2 = iss;
        t
    }

    /// Record the peer's SYN and its options.
    fn take_syn(&mut self, syn: &TcpHeader) {
        self.irs = syn.seq;
        self.rcv_nxt = syn.seq.wrapping_add(1);
        let ours = usize::from(self.cfg.mss);
        self.snd_mss = usize::from(syn.mss.unwrap_or(536)).min(ours).max(64);
        if let Some(ws) = syn.wscale {
            self.snd_shift = ws;
            self.rcv_shift = self.rcv_shift_offer;
            self.ws_ok = true;
        }
        self.sack_ok = self.cfg.sack && syn.sack_permitted;
        // RFC 5681 §3.1 (RFC 6928's IW10 is common; 10 segments here too).
        self.cwnd = 10 * self.snd_mss;
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn local_port(&self) -> u16 {
        self.local_port
    }

    pub fn remote_port(&self) -> u16 {
        self.remote_port
    }

    /// Payload bytes per segment toward the peer.
    pub fn mss(&self) -> usize {
        self.snd_mss
    }

    /// The current RTO (RFC 6298).
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// Smoothed RTT once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// Congestion window in bytes.
    pub fn cwnd(&self) -> usize {
        self.cwnd
    }

    /// Whether SACK was negotiated.
    pub fn sack_enabled(&self) -> bool {
        self.sack_ok
    }

    /// Bytes `send` would take now.
    pub fn send_capacity(&self) -> usize {
        match self.state {
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
                if !self.fin_queued =>
            {
                self.cfg.send_buf.saturating_sub(self.tx.len())
            }
            _ => 0,
        }
    }

    /// Bytes sent but not acknowledged, plus not yet sent.
    pub fn send_queued(&self) -> usize {
        self.tx.len()
    }

    /// Queue bytes to send; returns how many were taken (bounded by the send buffer).
    pub fn send(&mut self, data: &[u8]) -> Result<usize, SendError> {
        match self.state {
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
                if !self.fin_queued => {}
            _ => return Err(SendError::NotOpen),
        }
        let n = data.len().min(self.cfg.send_buf.saturating_sub(self.tx.len()));
        self.tx.extend(&data[..n]);
        Ok(n)
    }

    /// In-order bytes ready.
    pub fn recv_available(&self) -> usize {
        self.rx.len()
    }

    /// Take received in-order bytes.
    pub fn recv(&mut self, buf: &mut [u8]) -> usize {
        let mut at = 0;
        self.recv_with(buf.len(), &mut |s| {
            buf[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        })
    }

    /// Take up to `max` received in-order bytes where they lie: `f` sees them in order, in at
    /// most two slices (the receive ring's two halves), so a reader that places them — uiw's
    /// provider, into registered memory — copies each byte once. Returns how many were taken.
    pub fn recv_with(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        let n = max.min(self.rx.len());
        let (front, back) = self.rx.as_slices();
        let k = n.min(front.len());
        if k > 0 {
            f(&front[..k]);
        }
        if n > k {
            f(&back[..n - k]);
        }
        self.rx.drain(..n);
        self.readable_signalled = false;
        if n > 0 && self.state != State::Closed {
            // Window update (RFC 9293 §3.8.6.2.2): tell the peer once the window opened by
            // at least an MSS or half the buffer since it was last advertised.
            let w = self.rcv_window();
            if w >= self.adv_wnd + self.cfg.recv_buf / 2
                || (self.adv_wnd < self.snd_mss.max(1) * 2 && w >= self.adv_wnd + self.snd_mss)
            {
                self.ack_now = true;
            }
        }
        n
    }

    /// The peer's FIN was received in order and every byte before it read.
    pub fn at_eof(&self) -> bool {
        self.peer_fin_done && self.rx.is_empty()
    }

    /// Close the sending direction: FIN follows the queued bytes (RFC 9293 §3.10.4).
    pub fn close(&mut self) {
        match self.state {
            State::SynSent => self.set_closed(),
            State::SynReceived | State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Abort: send RST and drop everything (RFC 9293 §3.10.5).
    pub fn abort(&mut self) {
        if !matches!(self.state, State::SynSent | State::Closed | State::TimeWait) {
            self.rst_pending = Some(self.rst_header(self.snd_nxt));
        }
        self.set_closed();
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next instant `on_timeout` must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.rto_at, self.tlp_at, self.tw_until, self.ack_due].into_iter().flatten().min()
    }

    /// Drive timers.
    pub fn on_timeout(&mut self, now: Instant) {
        if matches!(self.tw_until, Some(t) if now >= t) {
            self.tw_until = None;
            self.set_closed();
            return;
        }
        let rto_due = matches!(self.rto_at, Some(t) if now >= t);
        if matches!(self.tlp_at, Some(t) if now >= t) {
            self.tlp_at = None;
            if !rto_due {
                self.tlp_fire(now);
                return;
            }
        }
        let Some(at) = self.rto_at else { return };
        if now < at {
            return;
        }
        self.rto_at = None;
        // An RTO ends the flight's probing: the next flight may be probed again.
        self.tlp_at = None;
        self.tlp_due = false;
        self.tlp_seg = None;
        let in_flight = self.snd_max != self.snd_una;
        if !in_flight && self.snd_wnd == 0 && self.unsent() > 0 {
            // Persist timer: probe the zero window, backing off like the RTO.
            self.probe = true;
            self.rtt.backoff();
            return;
        }
        if !in_flight {
            return;
        }
        self.retries += 1;
        if self.retries > self.cfg.max_retries {
            self.rst_pending = Some(self.rst_header(self.snd_nxt));
            self.events.push_back(Event::TimedOut);
            self.set_closed();
            return;
        }
        // RFC 6298 §5.4–5.6 and RFC 5681 §3.1 (eq. 4): go back to snd_una.
        let flight = seq::dist(self.snd_una, self.snd_max);
        self.ssthresh = (flight / 2).max(2 * self.snd_mss);
        self.cwnd = self.snd_mss;
        self.snd_nxt = self.snd_una;
        self.rtt.backoff();
        // Re-armed here, not only when something is sent: a retransmission the window
        // forbids is a zero-window probe, and must be timed as one.
        self.rto_at = Some(now + self.rtt.rto());
        self.probe = self.snd_wnd == 0;
        self.timing = None;
        self.recover = None;
        self.rexmit = None;
        self.dupacks = 0;
        if self.retries >= 2 {
            // The peer may have reneged on what it SACKed (RFC 2018 §8).
            self.sacked.clear();
        }
    }

    /// Arm the probe timeout (RFC 8985 §7.2), or disarm it if no probe is due: called after
    /// new data (not itself a probe) is sent and when an ACK acknowledges new data.
    ///
    /// A probe is scheduled only with data outstanding, outside recovery (fast recovery,
    /// or the go-back-N after an RTO), with an open window (a zero window is the persist
    /// timer's), and when no probe of this flight is outstanding. PTO = 2·SRTT, plus
    /// WCDelAckT when one segment is in flight, else [`PTO_SLACK`]; 1 s before any RTT
    /// sample. RFC 8985 clamps
    /// the PTO to the RTO's expiry and sends the probe then; here a PTO that would not
    /// fire before the RTO is simply not armed and the RTO does the work.
    fn arm_tlp(&mut self, now: Instant) {
        self.tlp_at = None;
        let open = matches!(self.state, State::Established | State::CloseWait | State::FinWait1 | State::Closing | State::LastAck);
        if !open
            || self.snd_una == self.snd_max
            || self.snd_nxt != self.snd_max
            || self.recover.is_some()
            || self.tlp_seg.is_some()
            || self.tlp_due
            || self.snd_wnd == 0
        {
            return;
        }
        let pto = match self.rtt.srtt() {
            Some(s) if seq::dist(self.snd_una, self.snd_max) <= self.snd_mss => 2 * s + WC_DEL_ACK,
            Some(s) => 2 * s + PTO_SLACK,
            None => PTO_INITIAL,
        };
        let at = now + pto;
        if self.rto_at.map_or(true, |r| at < r) {
            self.tlp_at = Some(at);
        }
    }

    /// The PTO fired (RFC 8985 §7.3): one probe goes out — `poll_transmit` picks new data or
    /// the last segment — and the RTO is re-armed from now.
    fn tlp_fire(&mut self, now: Instant) {
        if self.snd_una == self.snd_max || self.snd_nxt != self.snd_max || self.recover.is_some() || self.tlp_seg.is_some() {
            return;
        }
        self.rto_at = Some(now + self.rtt.rto());
        if self.next_hole(self.snd_una).is_some() {
            // Data sent after snd_una is SACKed, and two RTTs went by without a further
            // ACK: the hole at snd_una is lost by the rule a probe's SACK applies (see
            // `tlp_check`; RACK, RFC 8985 §6, would have said so after one RTT). Probing
            // the tail would only repeat what the peer told us: recover now, and let the
            // retransmission of snd_una be this flight's probe.
            self.tlp_seg = Some((self.snd_una, self.snd_max));
            self.enter_recovery();
            return;
        }
        self.tlp_due = true;
    }

    /// The probe (RFC 8985 §7.3): a new segment if the send queue and the peer's window
    /// allow (congestion window or not), else the last segment sent again — the highest
    /// MSS-sized piece ending at snd_max, with the FIN if it carried one.
    fn tlp_segment(&mut self, now: Instant, payload: &mut Vec<u8>) -> Option<TcpHeader> {
        if self.snd_una == self.snd_max || self.snd_nxt != self.snd_max || self.recover.is_some() {
            return None;
        }
        let wnd_edge = self.snd_una.wrapping_add(self.snd_wnd);
        let wnd_room = if seq::lt(self.snd_max, wnd_edge) { seq::dist(self.snd_max, wnd_edge) } else { 0 };
        if self.fin_seq.is_none() && self.unsent() > 0 && wnd_room > 0 {
            let at = self.snd_max;
            let (len, fin) = self.segment_at(at, wnd_room);
            if len > 0 {
                self.tlp_seg = Some((at, at)); // no PTO for the probe itself
                let h = self.data_segment(at, len, fin, payload, now);
                self.tlp_seg = Some((at, self.snd_max));
                return Some(h);
            }
        }
        let data_end = self.fin_seq.unwrap_or(self.snd_max);
        let room = self.snd_mss - self.sack_option_len();
        let outstanding = seq::dist(self.snd_una, data_end);
        let at = if outstanding > room { data_end.wrapping_sub(room as u32) } else { self.snd_una };
        let (len, fin) = if at == data_end { (0, true) } else { self.segment_at(at, seq::dist(at, data_end)) };
        let fin = fin && self.fin_seq == Some(at.wrapping_add(len as u32));
        if len == 0 && !fin {
            return None;
        }
        // A retransmission: `data_segment` stops any RTT timing (Karn).
        let h = self.data_segment(at, len, fin, payload, now);
        self.tlp_seg = Some((at, self.snd_max));
        Some(h)
    }

    /// Loss detection by the probe's answer, a simplified RFC 8985 §7.4 with the RACK rule
    /// behind it (§6): an ACK that SACKs bytes of the outstanding probe while a hole
    /// remains at snd_una says a segment sent later was delivered, so the earlier ones still
    /// missing are lost — fast recovery starts at once, not after three duplicate ACKs that
    /// a short tail never produces. An ACK up to snd_max needs nothing more (whether the
    /// probe repaired a loss is not told apart without D-SACK, so cwnd is kept).
    fn tlp_check(&mut self) {
        let Some((l, r)) = self.tlp_seg else { return };
        if self.recover.is_some() || self.snd_una == self.snd_max {
            return;
        }
        if self.sacked.iter().any(|&(a, b)| seq::lt(a, r) && seq::gt(b, l)) && self.next_hole(self.snd_una).is_some() {
            self.enter_recovery();
        }
    }

    fn set_closed(&mut self) {
        if self.state != State::Closed {
            self.state = State::Closed;
            self.events.push_back(Event::Closed);
        }
        self.rto_at = None;
        self.tlp_at = None;
        self.tlp_due = false;
        self.tw_until = None;
        self.ack_due = None;
    }

    fn unsent(&self) -> usize {
        let sent = seq::dist(self.tx_seq, self.snd_max).min(self.tx.len());
        self.tx.len() - sent
    }

    /// Out-of-order bytes lie inside the window and are not subtracted: the right edge
    /// never moves left (RFC 9293 §3.8.6.2.1).
    fn rcv_window(&self) -> usize {
        self.cfg.recv_buf.saturating_sub(self.rx.len())
    }

    fn rst_header(&self, seq_no: u32) -> TcpHeader {
        TcpHeader {
            src_port: self.local_port,
            dst_port: self.remote_port,
            seq: seq_no,
            ack: self.rcv_nxt,
            flags: flags::RST | flags::ACK,
            ..TcpHeader::default()
        }
    }

    /// Process one received segment addressed to this connection.
    pub fn on_segment(&mut self, h: &TcpHeader, payload: &[u8], now: Instant) {
        match self.state {
            State::Closed => {}
            State::SynSent => self.on_segment_syn_sent(h, now),
            _ => self.on_segment_sync(h, payload, now),
        }
    }

    fn on_segment_syn_sent(&mut self, h: &TcpHeader, now: Instant) {
        // RFC 9293 §3.10.7.3.
        if h.has(flags::ACK) && (seq::le(h.ack, self.iss) || seq::gt(h.ack, self.snd_max)) {
            if !h.has(flags::RST) {
                self.rst_pending = Some(TcpHeader {
                    src_port: self.local_port,
                    dst_port: self.remote_port,
                    seq: h.ack,
                    flags: flags::RST,
                    ..TcpHeader::default()
                });
            }
            return;
        }
        if h.has(flags::RST) {
            if h.has(flags::ACK) {
                self.events.push_back(Event::Reset);
                self.set_closed();
            }
            return;
        }
        if !h.has(flags::SYN) || !h.has(flags::ACK) {
            return; // simultaneous open is not supported
        }
        self.take_syn(h);
        self.ack_advance(h.ack, now);
        self.snd_wnd = u32::from(h.window);
        self.snd_wl1 = h.seq;
        self.snd_wl2 = h.ack;
        self.state = State::Established;
        self.events.push_back(Event::Connected);
        self.ack_now = true;
    }

    fn on_segment_sync(&mut self, h: &TcpHeader, payload: &[u8], now: Instant) {
        let seg_len = payload.len() as u32
            + u32::from(h.has(flags::SYN))
            + u32::from(h.has(flags::FIN));
        let wnd = self.rcv_window() as u32;
        // Acceptability (RFC 9293 §3.10.7.4, first check).
        let in_wnd = |s: u32| seq::le(self.rcv_nxt, s) && seq::lt(s, self.rcv_nxt.wrapping_add(wnd));
        let acceptable = match (seg_len, wnd) {
            (0, 0) => h.seq == self.rcv_nxt,
            (0, _) => in_wnd(h.seq),
            (_, 0) => false,
            (l, _) => in_wnd(h.seq) || in_wnd(h.seq.wrapping_add(l - 1)),
        };
        if self.state == State::SynReceived && h.has(flags::SYN) && h.seq == self.irs {
            // Our SYN-ACK was lost: send it again.
            self.snd_nxt = self.iss;
            return;
        }
        if !acceptable {
            // A zero-window probe or an old duplicate: still learn from its ACK.
            if h.has(flags::ACK) && !h.has(flags::RST) && !h.has(flags::SYN) {
                self.on_ack(h, payload.len(), now);
            }
            if !h.has(flags::RST) {
                self.ack_now = true;
                // Data received before: a retransmission the sender need not have made
                // (D-SACK, RFC 2883 §4.1.1).
                let end = h.seq.wrapping_add(payload.len() as u32);
                if !payload.is_empty() && !h.has(flags::SYN) && seq::le(end, self.rcv_nxt) && self.sack_ok {
                    self.dsack = Some((h.seq, end));
                }
            }
            return;
        }
        if h.has(flags::RST) {
            // RFC 5961 §3.2: only an exact match resets; otherwise a challenge ACK.
            if h.seq == self.rcv_nxt {
                if self.state != State::SynReceived {
                    self.events.push_back(Event::Reset);
                }
                self.set_closed();
            } else {
                self.ack_now = true;
            }
            return;
        }
        if h.has(flags::SYN) {
            self.ack_now = true; // RFC 5961 §4.2 challenge ACK
            return;
        }
        if !h.has(flags::ACK) {
            return;
        }
        if self.state == State::SynReceived {
            if seq::gt(h.ack, self.snd_una) && seq::le(h.ack, self.snd_max) {
                self.state = if self.fin_queued { State::FinWait1 } else { State::Established };
                self.events.push_back(Event::Connected);
            } else {
                self.rst_pending = Some(TcpHeader {
                    src_port: self.local_port,
                    dst_port: self.remote_port,
                    seq: h.ack,
                    flags: flags::RST,
                    ..TcpHeader::default()
                });
                return;
            }
        }
        if !self.on_ack(h, payload.len(), now) {
            return;
        }
        if self.state == State::Closed {
            return;
        }
        // Segment text (RFC 9293 §3.10.7.4, seventh check).
        if !payload.is_empty()
            && matches!(self.state, State::Established | State::FinWait1 | State::FinWait2)
        {
            self.take_data(h.seq, payload, now);
        }
        if h.has(flags::FIN) {
            self.peer_fin = Some(h.seq.wrapping_add(payload.len() as u32));
            self.ack_now = true;
        }
        self.maybe_fin_in_order(now);
    }

    /// ACK field processing. Returns false if the segment must be dropped.
    fn on_ack(&mut self, h: &TcpHeader, payload_len: usize, now: Instant) -> bool {
        if seq::gt(h.ack, self.snd_max) {
            self.ack_now = true; // acks something not yet sent
            return false;
        }
        // RFC 6675 §2: with SACK, an ACK that SACKs bytes not SACKed before is a duplicate
        // whatever its window says. Linux grows the window it offers on every out-of-order
        // segment it queues, so its duplicate ACKs never pass RFC 5681's "same window" test:
        // without this each segment lost toward a kernel peer waited for the RTO.
        let sacks_new = self.sack_ok && h.sack_len > 0 && {
            let before = self.sacked_bytes();
            self.take_sack(h.sack_blocks());
            self.sacked_bytes() > before
        };
        let old_wnd = self.snd_wnd;
        if seq::gt(h.ack, self.snd_una) {
            self.ack_advance(h.ack, now);
        } else if h.ack == self.snd_una
            && payload_len == 0
            && !h.has(flags::FIN)
            && (sacks_new || u32::from(h.window) << self.snd_shift == old_wnd)
            && self.snd_max != self.snd_una
        {
            self.on_dupack();
        }
        self.tlp_check();
        // Window update (RFC 9293 §3.10.7.4, SND.WL1/WL2 rule).
        if seq::lt(self.snd_wl1, h.seq)
            || (self.snd_wl1 == h.seq && seq::le(self.snd_wl2, h.ack))
        {
            self.snd_wnd = u32::from(h.window) << self.snd_shift;
            self.snd_wl1 = h.seq;
            self.snd_wl2 = h.ack;
            if self.snd_wnd > 0 {
                self.probe = false;
                if self.snd_max == self.snd_una && self.unsent() == 0 {
                    self.rto_at = None;
                }
            } else {
                // The peer answers our probes: keep probing for as long as it does
                // (RFC 9293 §3.8.6.1), without counting them toward giving up.
                self.retries = 0;
                if self.unsent() > 0 && self.rto_at.is_none() {
                    self.rto_at = Some(now + self.rtt.rto()); // persist timer
                }
            }
        }
        // FIN acknowledged?
        if let Some(f) = self.fin_seq {
            if seq::gt(self.snd_una, f) {
                match self.state {
                    State::FinWait1 => self.state = State::FinWait2,
                    State::Closing => self.enter_time_wait(now),
                    State::LastAck => {
                        self.set_closed();
                        return false;
                    }
                    _ => {}
                }
            }
        }
        true
    }

    fn ack_advance(&mut self, ack: u32, now: Instant) {
        let acked = seq::dist(self.snd_una, ack);
        // Karn: the timed segment was not retransmitted if timing is still set.
        if let Some((end, t)) = self.timing {
            if seq::ge(ack, end) {
                self.rtt.sample(now.saturating_duration_since(t));
                self.timing = None;
            }
        }
        self.snd_una = ack;
        if seq::lt(self.snd_nxt, ack) {
            self.snd_nxt = ack;
        }
        // Drop acknowledged bytes from the send buffer.
        if seq::gt(ack, self.tx_seq) {
            let n = seq::dist(self.tx_seq, ack).min(self.tx.len());
            self.tx.drain(..n);
            self.tx_seq = self.tx_seq.wrapping_add(n as u32);
        }
        self.sacked.retain_mut(|r| {
            if seq::le(r.1, ack) {
                return false;
            }
            if seq::lt(r.0, ack) {
                r.0 = ack;
            }
            true
        });
        self.retries = 0;
        self.rto_at = if self.snd_una == self.snd_max { None } else { Some(now + self.rtt.rto()) };
        if self.tlp_seg.is_some_and(|(_, end)| seq::ge(ack, end)) {
            self.tlp_seg = None;
        }
        // Congestion control (RFC 5681 §3.1, RFC 6582 §3.2).
        match self.recover {
            Some(r) if seq::lt(ack, r) => {
                // Partial ACK: retransmit the next hole, deflate.
                self.rexmit = Some(self.next_hole(ack).unwrap_or(ack));
                self.cwnd = self.cwnd.saturating_sub(acked).max(self.snd_mss) + self.snd_mss;
            }
            Some(_) => {
                self.recover = None;
                self.cwnd = self.ssthresh.max(2 * self.snd_mss);
                self.dupacks = 0;
            }
            None => {
                self.dupacks = 0;
                if self.cwnd < self.ssthresh {
                    self.cwnd += acked.min(self.snd_mss);
                } else {
                    self.cwnd += (self.snd_mss * self.snd_mss / self.cwnd.max(1)).max(1);
                }
            }
        }
        // RFC 8985 §7.2: an ACK of new data restarts the PTO.
        self.arm_tlp(now);
    }

    fn on_dupack(&mut self) {
        self.dupacks += 1;
        match self.recover {
            // RFC 6675 §4 IsLost(snd_una): also when more than 2 MSS above the hole are
            // SACKed. Linux compresses its duplicate ACKs (one SACK update for up to 44
            // segments), so three of them may never come before the flight ends.
            None if self.dupacks >= 3 || self.sacked_bytes() > 2 * self.snd_mss => self.enter_recovery(),
            None => {}
            Some(_) => {
                self.cwnd += self.snd_mss;
                if self.rexmit.is_none() {
                    // With SACK, a further dupack may reveal another hole to fill.
                    if let Some(hole) = self.last_rexmit.and_then(|s| self.next_hole(s)) {
                        self.rexmit = Some(hole);
                    }
                }
            }
        }
    }

    /// Fast retransmit (RFC 5681 §3.2), entering NewReno recovery (RFC 6582).
    fn enter_recovery(&mut self) {
        let flight = seq::dist(self.snd_una, self.snd_max);
        self.ssthresh = (flight / 2).max(2 * self.snd_mss);
        self.cwnd = self.ssthresh + 3 * self.snd_mss;
        self.recover = Some(self.snd_max);
        self.rexmit = Some(self.snd_una);
        self.timing = None;
        self.tlp_at = None;
        self.tlp_due = false;
    }

    /// The start of the first un-SACKed range at or after `from` below the highest SACKed
    /// byte (the holes RFC 6675 retransmits).
    fn next_hole(&self, from: u32) -> Option<u32> {
        let mut at = from;
        for &(l, r) in &self.sacked {
            if seq::lt(at, l) {
                return Some(at);
            }
            if seq::lt(at, r) {
                at = r;
            }
        }
        None
    }

    /// How many bytes above snd_una the peer has SACKed.
    fn sacked_bytes(&self) -> usize {
        self.sacked.iter().map(|&(l, r)| seq::dist(l, r)).sum()
    }

    fn take_sack(&mut self, blocks: &[(u32, u32)]) {
        for &(l, r) in blocks {
            // RFC 2018 §3: ignore blocks outside (snd_una, snd_max].
            if !seq::lt(l, r) || seq::lt(l, self.snd_una) || seq::gt(r, self.snd_max) {
                continue;
            }
            let base = self.snd_una;
            let mut v: Vec<(u32, u32)> = self.sacked.drain(..).collect();
            v.push((l, r));
            v.sort_by_key(|&(a, _)| seq::dist(base, a));
            for (a, b) in v {
                match self.sacked.last_mut() {
                    Some(last) if seq::le(a, last.1) => {
                        if seq::gt(b, last.1) {
                            last.1 = b;
                        }
                    }
                    _ => self.sacked.push((a, b)),
                }
            }
        }
    }

    fn take_data(&mut self, seg_seq: u32, payload: &[u8], now: Instant) {
        let wnd = self.rcv_window();
        // Trim to [rcv_nxt, rcv_nxt + wnd).
        let (mut start, mut data) = (seg_seq, payload);
        if seq::lt(start, self.rcv_nxt) {
            let cut = seq::dist(start, self.rcv_nxt).min(data.len());
            if cut > 0 {
                // Received before: a retransmission the sender need not have made.
                self.dsack = Some((start, start.wrapping_add(cut as u32)));
            }
            data = &data[cut..];
            start = self.rcv_nxt;
        }
        let room = wnd.saturating_sub(seq::dist(self.rcv_nxt, start));
        data = &data[..data.len().min(room)];
        if data.is_empty() {
            self.ack_now = true;
            return;
        }
        let at = self.rx_off + seq::dist(self.rcv_nxt, start) as u64;
        if at == self.rx_off {
            self.rx.extend(data);
            let mut next = self.rx_off + data.len() as u64;
            if !self.ooo.is_empty() {
                next = self.ooo.pop_contiguous(next, &mut self.rx);
            }
            self.rcv_nxt = self.seq_at(next);
            self.rx_off = next;
            // One Readable per unread batch, and never a second one queued: an owner that
            // reads without draining events must not grow the queue.
            if !self.readable_signalled && !self.events.contains(&Event::Readable) {
                self.readable_signalled = true;
                self.events.push_back(Event::Readable);
            }
            // In order: an ACK for the batch, or (delayed ACK) on our next segment, at the
            // latest after two full-sized segments or the delay (RFC 5681 §4.2); a hole
            // just filled is acknowledged at once (RFC 5681 §4.2, "SHOULD ... immediately").
            self.unacked += data.len();
            let filled_hole = self.ooo.is_empty() && data.len() < seq::dist(start, self.rcv_nxt);
            if self.cfg.ack_delay.is_zero() || !self.ooo.is_empty() || filled_hole || self.unacked >= 2 * usize::from(self.cfg.mss) {
                self.ack_now = true;
            } else if self.ack_due.is_none() {
                self.ack_due = Some(now + self.cfg.ack_delay);
            }
        } else {
            if let Some((l, r)) = self.ooo.insert(at, data) {
                self.dsack = Some((self.seq_at(l), self.seq_at(r)));
            }
            // Out of order: at once, with SACK (RFC 5681 §4.2, the duplicate ACK).
            self.ack_now = true;
        }
    }

    fn maybe_fin_in_order(&mut self, now: Instant) {
        let Some(f) = self.peer_fin else { return };
        if self.peer_fin_done || f != self.rcv_nxt {
            return;
        }
        self.peer_fin_done = true;
        self.rcv_nxt = self.rcv_nxt.wrapping_add(1);
        self.ack_now = true;
        self.events.push_back(Event::PeerClosed);
        match self.state {
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 => self.state = State::Closing,
            State::FinWait2 => self.enter_time_wait(now),
            State::TimeWait => self.tw_until = Some(now + self.cfg.time_wait),
            _ => {}
        }
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.rto_at = None;
        self.tlp_at = None;
        self.tw_until = Some(now + self.cfg.time_wait);
    }

    fn base_header(&mut self, seq_no: u32) -> TcpHeader {
        let wnd = self.rcv_window();
        self.adv_wnd = wnd;
        let mut h = TcpHeader {
            src_port: self.local_port,
            dst_port: self.remote_port,
            seq: seq_no,
            ack: self.rcv_nxt,
            flags: flags::ACK,
            window: (wnd >> self.rcv_shift).min(0xffff) as u16,
            ..TcpHeader::default()
        };
        if self.sack_ok {
            // A D-SACK goes first, once (RFC 2883 §4); the ranges held fill the rest.
            if let Some(d) = self.dsack.take() {
                h.sack[0] = d;
                h.sack_len = 1;
            }
            for (l, r) in self.ooo.ranges(h.sack.len() - h.sack_len as usize) {
                h.sack[h.sack_len as usize] = (self.seq_at(l), self.seq_at(r));
                h.sack_len += 1;
            }
        }
        h
    }

    /// The sequence number of receive-stream offset `off` (at or above `rx_off`, which is
    /// `rcv_nxt`'s).
    fn seq_at(&self, off: u64) -> u32 {
        self.rcv_nxt.wrapping_add((off - self.rx_off) as u32)
    }

    /// Bytes the SACK option takes in our next segment (as `base_header` builds it).
    fn sack_option_len(&self) -> usize {
        let max = TcpHeader::default().sack.len();
        let n = if self.sack_ok { (usize::from(self.dsack.is_some()) + self.ooo.range_count()).min(max) } else { 0 };
        if n == 0 {
            0
        } else {
            4 + 8 * n
        }
    }

    /// Data (and FIN) that may go in a segment starting at `at`: (bytes, fin).
    fn segment_at(&self, at: u32, limit: usize) -> (usize, bool) {
        let off = seq::dist(self.tx_seq, at);
        let avail = self.tx.len().saturating_sub(off);
        // The MSS bounds data plus options (RFC 9293 §3.7.1): SACK blocks take room.
        let mut len = avail.min(self.snd_mss - self.sack_option_len()).min(limit);
        // Do not run into data the peer already holds (SACK).
        for &(l, r) in &self.sacked {
            if seq::le(l, at) && seq::lt(at, r) {
                return (0, false);
            }
            if seq::lt(at, l) {
                len = len.min(seq::dist(at, l));
                break;
            }
        }
        let fin = self.fin_queued && off + len == self.tx.len();
        (len, fin)
    }

    /// The next segment to send, if any: its header, with its payload copied into `payload`
    /// (cleared first).
    pub fn poll_transmit(&mut self, now: Instant, payload: &mut Vec<u8>) -> Option<TcpHeader> {
        payload.clear();
        if let Some(h) = self.rst_pending.take() {
            return Some(h);
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived if self.snd_nxt == self.iss => {
                return Some(self.syn_segment(now));
            }
            State::SynSent => return None,
            _ => {}
        }
        if self.state == State::SynReceived {
            return self.take_ack_only(now);
        }
        // 1. A retransmission asked for by fast retransmit / recovery.
        if let Some(at) = self.rexmit.take() {
            let at = if seq::lt(at, self.snd_una) { self.snd_una } else { at };
            if seq::lt(at, self.snd_max) {
                let limit = seq::dist(at, self.snd_max);
                let (len, fin) = self.segment_at(at, limit);
                if len > 0 || (fin && self.fin_seq == Some(at.wrapping_add(len as u32))) {
                    self.last_rexmit = Some(at.wrapping_add(len as u32).wrapping_add(u32::from(fin)));
                    return Some(self.data_segment(at, len, fin, payload, now));
                }
            }
        }
        // 2. The tail loss probe, once the PTO fired.
        if self.tlp_due {
            self.tlp_due = false;
            if let Some(h) = self.tlp_segment(now, payload) {
                return Some(h);
            }
        }
        // 3. New data, or go-back-N retransmission after an RTO (snd_nxt < snd_max).
        loop {
            let flight = seq::dist(self.snd_una, self.snd_nxt);
            let sacked: usize = self.sacked.iter().map(|&(l, r)| seq::dist(l, r)).sum();
            let pipe = flight.saturating_sub(sacked);
            let wnd_edge = self.snd_una.wrapping_add(self.snd_wnd);
            let wnd_room = if seq::lt(self.snd_nxt, wnd_edge) { seq::dist(self.snd_nxt, wnd_edge) } else { 0 };
            let cwnd_room = self.cwnd.saturating_sub(pipe);
            let mut limit = wnd_room.min(cwnd_room);
            let retransmitting = seq::lt(self.snd_nxt, self.snd_max);
            if retransmitting {
                limit = limit.min(seq::dist(self.snd_nxt, self.snd_max));
            }
            let probe = self.probe && wnd_room == 0 && self.unsent() > 0 && flight == 0;
            if probe {
                limit = 1;
            }
            if limit == 0 && !(self.fin_queued && self.fin_seq.is_none() && self.unsent() == 0) {
                break;
            }
            if self.fin_seq == Some(self.snd_nxt) {
                // Retransmitting our FIN alone.
                let at = self.snd_nxt;
                return Some(self.data_segment(at, 0, true, payload, now));
            }
            let at = self.snd_nxt;
            let (len, fin) = self.segment_at(at, limit);
            let fin = fin && (self.fin_seq.is_none() || self.fin_seq == Some(at.wrapping_add(len as u32)));
            if len == 0 && !fin {
                if retransmitting {
                    // Inside a SACKed range: skip it.
                    if let Some(&(_, r)) = self.sacked.iter().find(|&&(l, r)| seq::le(l, at) && seq::lt(at, r)) {
                        self.snd_nxt = if seq::lt(r, self.snd_max) { r } else { self.snd_max };
                        continue;
                    }
                }
                break;
            }
            if probe {
                self.probe = false;
            }
            return Some(self.data_segment(at, len, fin, payload, now));
        }
        self.take_ack_only(now)
    }

    fn take_ack_only(&mut self, now: Instant) -> Option<TcpHeader> {
        let due = self.ack_due.is_some_and(|t| t <= now);
        if !(self.ack_now || due) {
            return None;
        }
        self.acked();
        let s = self.snd_nxt;
        Some(self.base_header(s))
    }

    /// A segment that acknowledges everything received is leaving.
    fn acked(&mut self) {
        self.ack_now = false;
        self.ack_due = None;
        self.unacked = 0;
    }

    fn syn_segment(&mut self, now: Instant) -> TcpHeader {
        let mut h = if self.state == State::SynReceived {
            self.base_header(self.iss)
        } else {
            TcpHeader {
                src_port: self.local_port,
                dst_port: self.remote_port,
                seq: self.iss,
                ..TcpHeader::default()
            }
        };
        h.flags |= flags::SYN;
        // The window in a SYN is never scaled (RFC 7323 §2.2).
        h.window = self.rcv_window().min(0xffff) as u16;
        h.mss = Some(self.cfg.mss);
        h.sack_len = 0;
        let offer_ws = self.state == State::SynSent || self.ws_ok;
        if offer_ws {
            h.wscale = Some(self.rcv_shift_offer);
        }
        h.sack_permitted = self.cfg.sack && (self.state == State::SynSent || self.sack_ok);
        let first = self.snd_max == self.iss;
        self.snd_nxt = self.iss.wrapping_add(1);
        self.snd_max = self.snd_nxt;
        if first {
            self.timing = Some((self.snd_nxt, now));
        } else {
            self.timing = None;
        }
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rtt.rto());
        }
        self.acked();
        h
    }

    fn data_segment(&mut self, at: u32, len: usize, fin: bool, payload: &mut Vec<u8>, now: Instant) -> TcpHeader {
        let off = seq::dist(self.tx_seq, at);
        payload.extend(self.tx.range(off..off + len));
        let mut h = self.base_header(at);
        if len > 0 {
            h.flags |= flags::PSH;
        }
        if fin {
            h.flags |= flags::FIN;
            self.fin_seq = Some(at.wrapping_add(len as u32));
        }
        let end = at.wrapping_add(len as u32 + u32::from(fin));
        let retransmission = seq::lt(at, self.snd_max);
        if retransmission {
            self.timing = None; // Karn
        } else if self.timing.is_none() {
            self.timing = Some((end, now));
        }
        if seq::gt(end, self.snd_nxt) && seq::le(at, self.snd_nxt) {
            self.snd_nxt = end;
        }
        if seq::gt(end, self.snd_max) {
            self.snd_max = end;
        }
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rtt.rto());
        }
        if !retransmission {
            // RFC 8985 §7.2: new data (not a probe) restarts the PTO.
            self.arm_tlp(now);
        }
        self.acked();
        h
    }
}
