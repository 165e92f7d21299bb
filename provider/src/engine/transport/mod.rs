//! The transport's pieces that every layer above uses: the engine clock, the protocol
//! settings of a connection, QP-number addressing, a stream accepted but not yet matched to a
//! QP ([`Pending`]), and the seam ([`stream`]) between the engine and what carries its byte
//! streams — the kernel's TCP ([`kernel`]) today.
//!
//! **Addressing without rdma_cm.** A QP number is `slot << 12 | index`: the process listens on
//! `UIW_PORT_BASE + slot` (default base 20000; the first free port of 4096), so a peer that
//! knows our IPv4 address (the GID) and QP number — all perftest and `ibv_rc_pingpong` exchange
//! — knows where to connect. Of the two QPs moved to RTR towards each other, the one with the
//! lower (IPv4 address, QPN) opens the TCP stream and sends the MPA Request; its private data
//! names both QPs ([`QpHello`]), so the listener hands the stream to the right QP, parking it
//! until that QP reaches RTR if it has not yet.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::OnceLock;
use std::time::Duration;

use uiw_wire::conn::{Config, ConnectRequest, Connection, Event, Role, RxWant};
use uiw_wire::placement::{Access, Memory};
use uiw_wire::TaggedError;

pub mod kernel;
#[cfg(any(test, feature = "fuzzing"))]
pub mod memory;
pub mod raw;
pub mod stream;

pub use stream::{would_block, Connector, Listener, Stream};

/// Default first port of the QP-number port range (`UIW_PORT_BASE`).
pub const DEFAULT_PORT_BASE: u16 = 20000;
/// Ports (slots) a process may take: 12 bits of the 24-bit QPN.
pub const SLOTS: u32 = 4096;
/// QPs per process: the other 12 bits (index 0 is never used).
pub const INDEXES: u32 = 4096;

pub use super::clock::{now_ms, now_us};

/// The MPA private data of an RTR-initiated connection: which QP connects to which, and the
/// proof that the opener is the peer the application named (issue 10: a stranger who guessed
/// both QP numbers must not get the QP). The secret is what both applications exchanged out of
/// band and passed to `ibv_modify_qp`: the opener's `sq_psn` is the acceptor's `rq_psn`, and
/// the opener's `rq_psn` is the acceptor's `sq_psn` (24 bits each; together with the random QPN
/// index, the source address check and TCP's own sequence numbers, an off-path attacker has to
/// guess ~36 bits before its first byte is placed).
///
/// Wire form (24 bytes, big-endian): `"uiwQ"`, `to_qpn`, `from_qpn`, flags (bit 0: `sq_psn`
/// valid — the opener had reached RTS), the opener's `rq_psn`, its `sq_psn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpHello {
    /// The QP the stream is for (the responder's).
    pub to_qpn: u32,
    /// The QP that opened it.
    pub from_qpn: u32,
    /// The opener's `rq_psn` (= the acceptor's `sq_psn`).
    pub rq_psn: u32,
    /// The opener's `sq_psn` (= the acceptor's `rq_psn`), if it had one when it connected.
    pub sq_psn: Option<u32>,
}

/// What an acceptor makes of a [`QpHello`] with what it knows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The opener proved it knows the PSNs: take the stream.
    Accept,
    /// Wrong QP numbers, address or PSNs: refuse it.
    Refuse,
    /// Nothing to check against yet (our `sq_psn` comes with RTS): keep it waiting.
    Undecided,
}

/// What the acceptor knows: its QPN, the peer the application named (address, QPN), its
/// `rq_psn` (from RTR) and its `sq_psn` once in RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub qpn: u32,
    pub peer: Ipv4Addr,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub sq_psn: Option<u32>,
}

impl QpHello {
    const MAGIC: [u8; 4] = *b"uiwQ";
    pub const LEN: usize = 24;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Self::MAGIC.to_vec();
        v.extend_from_slice(&self.to_qpn.to_be_bytes());
        v.extend_from_slice(&self.from_qpn.to_be_bytes());
        v.extend_from_slice(&u32::from(self.sq_psn.is_some()).to_be_bytes());
        v.extend_from_slice(&self.rq_psn.to_be_bytes());
        v.extend_from_slice(&self.sq_psn.unwrap_or(0).to_be_bytes());
        v
    }

    pub fn parse(b: &[u8]) -> Option<QpHello> {
        if b.len() < Self::LEN || b[..4] != Self::MAGIC {
            return None;
        }
        let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(QpHello { to_qpn: w(4), from_qpn: w(8), rq_psn: w(16), sq_psn: (w(12) & 1 != 0).then(|| w(20)) })
    }

    /// Whether a stream from `src` carrying this hello is the peer `e` describes.
    pub fn verify(&self, src: Option<Ipv4Addr>, e: &Expected) -> Verdict {
        if self.to_qpn != e.qpn || self.from_qpn != e.dest_qpn || src != Some(e.peer) {
            return Verdict::Refuse;
        }
        let psn = |x: u32| x & 0x00ff_ffff;
        if let Some(sq) = self.sq_psn {
            return if psn(sq) == psn(e.rq_psn) { Verdict::Accept } else { Verdict::Refuse };
        }
        match e.sq_psn {
            Some(sq) if psn(sq) == psn(self.rq_psn) => Verdict::Accept,
            Some(_) => Verdict::Refuse,
            None => Verdict::Undecided,
        }
    }
}

/// Whether this side opens the stream: the lower (address, QPN) does.
pub fn is_initiator(local: Ipv4Addr, qpn: u32, remote: Ipv4Addr, dest_qpn: u32) -> bool {
    (u32::from(local), qpn) < (u32::from(remote), dest_qpn)
}

/// Where the QP `qpn` of the process at `ip` listens.
pub fn qp_address(ip: Ipv4Addr, qpn: u32, base: u16) -> Option<SocketAddrV4> {
    let port = u32::from(base) + (qpn >> 12);
    (port <= 0xffff && qpn >> 12 < SLOTS).then(|| SocketAddrV4::new(ip, port as u16))
}

/// A duration in seconds from the environment (`UIW_PEER_TIMEOUT=10`, `=2.5`), or `default_ms`.
fn env_secs_ms(name: &str, default_ms: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse::<f64>().ok()).filter(|s| *s > 0.0 && *s < 1e6).map(|s| (s * 1000.0) as u64).unwrap_or(default_ms)
}

/// How long a silent peer may go unnoticed (`UIW_PEER_TIMEOUT`, seconds, default 10): an RNIC's
/// retry timeout, not TCP's 15 minutes. Unacknowledged data fails the stream after this long
/// (`TCP_USER_TIMEOUT`), an idle one is probed by keep-alives.
pub fn peer_timeout_ms() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_secs_ms("UIW_PEER_TIMEOUT", 10_000))
}

/// Time allowed for MPA negotiation (`UIW_MPA_TIMEOUT`, seconds, default 10): a stream that
/// does not complete its Request/Reply by then is dropped.
pub fn mpa_timeout_ms() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_secs_ms("UIW_MPA_TIMEOUT", 10_000))
}

/// Whether uiw asks for MPA CRC32c (RFC 5044 §7.1, the C bit of its Request or Reply): with
/// `UIW_CRC=1`. CRC is negotiated either way: a peer that asks gets it (if either side sets C,
/// both use CRC), and one that does not still connects. Off by default, as measured for
/// issue 10: computed over registered memory in place it no longer halves 1 MiB RDMA Write
/// bandwidth, but it still cost more than the 10% the issue allows for a default
/// (`perftest/results/crc`).
pub fn crc_requested() -> bool {
    std::env::var("UIW_CRC").is_ok_and(|v| v.trim() == "1")
}

/// Time an active side waits for the MPA Reply (`UIW_MPA_REPLY_TIMEOUT`, seconds, default
/// 60, never less than [`mpa_timeout_ms`]). The Reply comes only once the passive
/// application accepts, after whatever it does between CONNECT_REQUEST and `rdma_accept`
/// (fabtests' servers clear a `max_msg_sz`-sized buffer there, seconds on a busy host): an
/// application's latency, which the stack's 10 s must not cut short. The peer's liveness
/// meanwhile is TCP's (keep-alive, [`peer_timeout_ms`]).
pub fn reply_timeout_ms() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_secs_ms("UIW_MPA_REPLY_TIMEOUT", 60_000).max(mpa_timeout_ms()))
}

/// The protocol settings of a uiw connection (MPA v2, RFC 7306 offered, CRC asked for with
/// `UIW_CRC=1`, see [`crc_requested`]).
pub fn config(role: Role, ird: u16, ord: u16, private_data: Vec<u8>, mss: usize) -> Config {
    let mut c = Config::new(role);
    c.extensions = true;
    c.crc = crc_requested();
    c.ird = ird;
    c.ord = ord;
    c.private_data = private_data;
    c.mss = mss.max(536);
    c.manual_accept = role == Role::Responder;
    c.mpa_timeout_ms = mpa_timeout_ms();
    c.reply_timeout_ms = reply_timeout_ms();
    c.rnr_wait_ms = RNR_WAIT_MS;
    c.even_segments = true;
    // RFC 6581 §5 peer-to-peer mode: a responder answers an initiator that asks for an RTR
    // (siw built with peer_to_peer), picking the zero-length Write as siw does; an initiator
    // asks for one (Write or Read RTR, as siw) only with UIW_MPA_P2P=1.
    c.p2p = role == Role::Responder || std::env::var("UIW_MPA_P2P").is_ok_and(|v| v == "1");
    // MPA revision 1 (RFC 5044, no IRD/ORD words) for an initiator with UIW_MPA_REVISION=1;
    // a responder answers revision 1 Requests with revision 1 anyway.
    if role == Role::Initiator && std::env::var("UIW_MPA_REVISION").is_ok_and(|v| v == "1") {
        c.revision = 1;
    }
    // Towards a peer that is not uiw (siw), the first FPDU waits a little after the Reply:
    // siw reads nothing that arrives before it has hooked the stream to its QP.
    c.first_fpdu_hold_ms = std::env::var("UIW_FIRST_FPDU_HOLD_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(FIRST_FPDU_HOLD_MS);
    c
}

/// How long a Send that finds no receive posted waits for the application to post one
/// before the "no buffer" Terminate (`Config::rnr_wait_ms`): iWARP has no RNR NAK, and a
/// sender that runs ahead of a receiver reposting its buffers (qperf's rc_bw, any
/// credit-less Send stream) would otherwise lose the connection to a scheduling hiccup.
pub const RNR_WAIT_MS: u64 = 5_000;

/// Default of `UIW_FIRST_FPDU_HOLD_MS` (see `uiw_wire::conn::Config::first_fpdu_hold_ms`): long
/// enough for siw under an emulated CPU, a one-time cost per connection to a non-uiw peer.
pub const FIRST_FPDU_HOLD_MS: u64 = 50;

/// A kernel socket handed to `uiw_cm_passive_v1`/`uiw_cm_active_v1` for a device whose
/// streams go over a userspace TCP on raw frames: the kernel's socket cannot carry them (its
/// peer's segments are steered away from the kernel). The drop-in must listen and connect
/// through the engine instead (`uiw_cm_listen_v2`/`uiw_cm_connect_v2`, which it does when
/// `uiw_cm_transport_v2` says so): only a drop-in older than the provider gets here. Says so
/// on stderr (a configuration problem, shown whatever the log level) before the call fails
/// with EOPNOTSUPP.
pub fn cm_refused(device: &super::device::DeviceInfo) {
    eprintln!(
        "uiw: {}: a kernel TCP socket was handed to uiw_cm_*_v1 for a device published with --transport {} (EOPNOTSUPP): \
         this librdmacm.so.1 predates uiw_cm.h v2 (listen/connect through the device's transport); \
         run the librdmacm of this uiw build (uiw run) or publish the device with --transport tcp",
        device.name,
        device.transport.name()
    );
}

/// A stream to close in order (see `Net::linger`): `bytes` (the rest of the transmit backlog,
/// then the Terminate or the MPA Reply that rejects, if any) go out first, then FIN.
pub struct Closing {
    pub stream: Box<dyn Stream>,
    pub bytes: Vec<u8>,
}

/// A stream accepted by the listener whose MPA Request has not been matched to a QP yet.
pub struct Pending {
    pub conn: Connection,
    pub stream: Box<dyn Stream>,
    stage: Vec<u8>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

impl Pending {
    pub fn new(conn: Connection, stream: Box<dyn Stream>) -> Pending {
        Pending { conn, stream, stage: Vec::new() }
    }

    /// Rejects the stream's Request (MPA Reply with R=1 and `private_data`, best effort) and
    /// closes it (closing also takes it out of the progress thread's epoll set).
    pub fn reject(mut self, private_data: &[u8]) {
        let _ = self.conn.reject(private_data);
        let mut out = Vec::new();
        while let Some(uiw_wire::conn::Tx::Bytes(b)) = self.conn.next_tx() {
            out.extend_from_slice(&b);
        }
        self.stream.close_with(&out, Duration::from_millis(200));
    }

    /// [`Pending::reject`] for the progress thread, which must never block: the MPA Reply
    /// (R=1) to send before FIN, for `Net::linger`.
    pub fn rejected(mut self, private_data: &[u8]) -> Closing {
        let _ = self.conn.reject(private_data);
        let mut bytes = Vec::new();
        while let Some(uiw_wire::conn::Tx::Bytes(b)) = self.conn.next_tx() {
            bytes.extend_from_slice(&b);
        }
        Closing { stream: self.stream, bytes }
    }

    /// Reads the MPA Request; `Some(Ok(request))` once it has arrived, `Some(Err(()))` if the
    /// stream failed.
    pub fn read_request(&mut self) -> Option<Result<ConnectRequest, ()>> {
        loop {
            while let Some(ev) = self.conn.poll_event() {
                match ev {
                    Event::ConnectRequest(r) => return Some(Ok(r)),
                    Event::Failed(_) | Event::Rejected { .. } | Event::Terminated { .. } | Event::Closed => return Some(Err(())),
                    _ => {}
                }
            }
            let n = match self.conn.rx_want() {
                RxWant::Bytes(n) => n,
                RxWant::Wait => return None,
                _ => return Some(Err(())),
            };
            self.stage.resize(n, 0);
            match self.stream.recv(&mut self.stage[..n]) {
                Ok(0) => return Some(Err(())),
                Ok(k) => {
                    let chunk = self.stage[..k].to_vec();
                    self.conn.rx_bytes(&chunk, &mut NoMemory);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Some(Err(())),
            }
        }
    }
}

/// No memory is reachable before a stream belongs to a QP.
struct NoMemory;

impl Memory for NoMemory {
    fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
        Err(TaggedError::InvalidStag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_rejects_foreign_data() {
        let h = QpHello { to_qpn: 0x001002, from_qpn: 0x003001, rq_psn: 0xabcdef, sq_psn: Some(0x123456) };
        let b = h.encode();
        assert_eq!(
            b,
            [b'u', b'i', b'w', b'Q', 0, 0, 0x10, 0x02, 0, 0, 0x30, 0x01, 0, 0, 0, 1, 0, 0xab, 0xcd, 0xef, 0, 0x12, 0x34, 0x56]
        );
        assert_eq!(QpHello::parse(&b), Some(h));
        let h2 = QpHello { sq_psn: None, ..h };
        assert_eq!(QpHello::parse(&h2.encode()), Some(h2));
        assert_eq!(QpHello::parse(b"uiwX\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"), None);
        // The unauthenticated 12-byte form of earlier versions is not accepted.
        assert_eq!(QpHello::parse(&b[..12]), None);
    }

    #[test]
    fn only_the_named_peer_with_the_psns_gets_the_qp() {
        let peer = Ipv4Addr::new(198, 51, 100, 2);
        let mut e = Expected { qpn: 0x1005, peer, dest_qpn: 0x2007, rq_psn: 0x111111, sq_psn: None };
        let good = QpHello { to_qpn: 0x1005, from_qpn: 0x2007, rq_psn: 0x222222, sq_psn: Some(0x111111) };
        assert_eq!(good.verify(Some(peer), &e), Verdict::Accept);
        // Another host with everything right, or the right host with a wrong field.
        assert_eq!(good.verify(Some(Ipv4Addr::new(198, 51, 100, 9)), &e), Verdict::Refuse);
        assert_eq!(good.verify(None, &e), Verdict::Refuse);
        assert_eq!(QpHello { sq_psn: Some(0x111112), ..good }.verify(Some(peer), &e), Verdict::Refuse);
        assert_eq!(QpHello { from_qpn: 0x2008, ..good }.verify(Some(peer), &e), Verdict::Refuse);
        assert_eq!(QpHello { to_qpn: 0x1006, ..good }.verify(Some(peer), &e), Verdict::Refuse);
        // An opener still in RTR proves itself with its rq_psn once we know our sq_psn.
        let early = QpHello { sq_psn: None, ..good };
        assert_eq!(early.verify(Some(peer), &e), Verdict::Undecided);
        e.sq_psn = Some(0x222222);
        assert_eq!(early.verify(Some(peer), &e), Verdict::Accept);
        e.sq_psn = Some(0x222223);
        assert_eq!(early.verify(Some(peer), &e), Verdict::Refuse);
    }

    #[test]
    fn lower_address_and_qpn_initiates() {
        let lo = Ipv4Addr::LOCALHOST;
        assert!(is_initiator(lo, 0x1001, lo, 0x2001));
        assert!(!is_initiator(lo, 0x2001, lo, 0x1001));
        assert!(is_initiator(Ipv4Addr::new(10, 0, 0, 1), 0x9001, Ipv4Addr::new(10, 0, 0, 2), 0x1001));
    }

    /// Memory with no region (nothing tagged is valid).
    struct NoMem;
    impl Memory for NoMem {
        fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
            Err(TaggedError::InvalidStag)
        }
    }

    /// siw built with `peer_to_peer` asks for an RTR (IRD|0x8000, ORD|0xC000) and sends a
    /// Terminate ("no matching RTR") to a Reply without one: every siw → uiw connection
    /// failed. Bytes from `ci/siw-interop.sh` (p2p-g2h-rping): the Request, then siw's RTR
    /// (a zero-length Write to STag 1). uiw's responder must pick the Write RTR, as siw's
    /// own responder does, and go to RTS on the RTR.
    #[test]
    fn responder_answers_siw_p2p_request_with_write_rtr() {
        let hex = |s: &str| -> Vec<u8> { (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect() };
        // The capture is of uiw with CRC off (`UIW_CRC=0`); `crc_reply_flag` has the default.
        let mut cfg = config(Role::Responder, 0, 0, Vec::new(), 1460);
        cfg.crc = false;
        let mut c = Connection::new(cfg, 0);
        let req = hex("4d504120494420526571204672616d65100200048001c001");
        let mut m = NoMem;
        let mut off = 0;
        while off < req.len() {
            off += c.rx_bytes(&req[off..], &mut m);
        }
        let Some(Event::ConnectRequest(r)) = c.poll_event() else { panic!("no request") };
        assert!(r.ird_ord.is_some_and(|io| io.p2p && io.write_rtr && io.read_rtr));
        c.accept(1, 1, &[], 0).unwrap();
        let Some(uiw_wire::conn::Tx::Bytes(rep)) = c.next_tx() else { panic!("no reply") };
        // flags 0x10, rev 2, IRD 1 | P2P, ORD 1 | Write RTR
        assert_eq!(rep, hex("4d504120494420526570204672616d65100200048001 8001".replace(' ', "").as_str()));
        assert_eq!(c.state(), uiw_wire::conn::State::WaitRtr);
        // siw's RTR: a zero-length tagged Write to STag 1, TO 0, L=1, CRC field zero
        let rtr = hex(concat!("000e", "c140", "00000001", "0000000000000000", "00000000"));
        let mut off = 0;
        while off < rtr.len() {
            let n = c.rx_bytes(&rtr[off..], &mut m);
            assert!(n > 0, "RTR not taken");
            off += n;
        }
        assert_eq!(c.state(), uiw_wire::conn::State::Established);
    }

    /// A responder asking for CRC (`UIW_CRC=1`) answers siw's CRC-less Request (the one
    /// above) with the C bit set in its Reply, which siw then honours (RFC 5044 §7.1: if
    /// either side sets it, both use CRC); without, it answers without.
    #[test]
    fn responder_reply_carries_crc_flag_as_configured() {
        let hex = |s: &str| -> Vec<u8> { (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect() };
        let req = hex("4d504120494420526571204672616d65100200048001c001");
        for crc in [true, false] {
            let mut cfg = config(Role::Responder, 0, 0, Vec::new(), 1460);
            cfg.crc = crc;
            let mut c = Connection::new(cfg, 0);
            let mut off = 0;
            while off < req.len() {
                off += c.rx_bytes(&req[off..], &mut NoMem);
            }
            let Some(Event::ConnectRequest(_)) = c.poll_event() else { panic!("no request") };
            c.accept(1, 1, &[], 0).unwrap();
            let Some(uiw_wire::conn::Tx::Bytes(rep)) = c.next_tx() else { panic!("no reply") };
            assert_eq!(rep[16] & uiw_wire::mpa::FLAG_CRC != 0, crc, "Reply flags {:#04x}", rep[16]);
            assert_eq!(c.crc(), crc);
        }
    }

    #[test]
    fn max_qp_is_what_the_qp_number_space_holds() {
        assert_eq!(crate::engine::limits::MAX_QP, INDEXES - 1);
    }

    #[test]
    fn qpn_names_the_port() {
        assert_eq!(qp_address(Ipv4Addr::LOCALHOST, 0x003005, 20000), Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 20003)));
        assert_eq!(qp_address(Ipv4Addr::LOCALHOST, 0xfff001, 65000), None);
    }
}
