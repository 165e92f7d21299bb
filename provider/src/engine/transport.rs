//! The kernel-TCP transport's pieces that every layer above uses: the engine clock, how a
//! stream socket is set up, the protocol settings of a connection, QP-number addressing, and a
//! stream accepted but not yet matched to a QP ([`Pending`]).
//!
//! **Addressing without rdma_cm.** A QP number is `slot << 12 | index`: the process listens on
//! `UIW_PORT_BASE + slot` (default base 20000; the first free port of 4096), so a peer that
//! knows our IPv4 address (the GID) and QP number — all perftest and `ibv_rc_pingpong` exchange
//! — knows where to connect. Of the two QPs moved to RTR towards each other, the one with the
//! lower (IPv4 address, QPN) opens the TCP stream and sends the MPA Request; its private data
//! names both QPs ([`QpHello`]), so the listener hands the stream to the right QP, parking it
//! until that QP reaches RTR if it has not yet.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use uiw_wire::conn::{Config, ConnectRequest, Connection, Event, Role, RxWant};
use uiw_wire::placement::{Access, Memory};
use uiw_wire::TaggedError;

/// Default first port of the QP-number port range (`UIW_PORT_BASE`).
pub const DEFAULT_PORT_BASE: u16 = 20000;
/// Ports (slots) a process may take: 12 bits of the 24-bit QPN.
pub const SLOTS: u32 = 4096;
/// QPs per process: the other 12 bits (index 0 is never used).
pub const INDEXES: u32 = 4096;

/// Milliseconds on the engine's clock (the protocol core's `now_ms`).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The MPA private data of an RTR-initiated connection: which QP connects to which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpHello {
    /// The QP the stream is for (the responder's).
    pub to_qpn: u32,
    /// The QP that opened it.
    pub from_qpn: u32,
}

impl QpHello {
    const MAGIC: [u8; 4] = *b"uiwQ";
    pub const LEN: usize = 12;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Self::MAGIC.to_vec();
        v.extend_from_slice(&self.to_qpn.to_be_bytes());
        v.extend_from_slice(&self.from_qpn.to_be_bytes());
        v
    }

    pub fn parse(b: &[u8]) -> Option<QpHello> {
        if b.len() < Self::LEN || b[..4] != Self::MAGIC {
            return None;
        }
        Some(QpHello { to_qpn: u32::from_be_bytes(b[4..8].try_into().ok()?), from_qpn: u32::from_be_bytes(b[8..12].try_into().ok()?) })
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

/// The protocol settings of a uiw connection (MPA v2, RFC 7306 offered, CRC if `UIW_CRC=1`).
pub fn config(role: Role, ird: u16, ord: u16, private_data: Vec<u8>, mss: usize) -> Config {
    let mut c = Config::new(role);
    c.extensions = true;
    c.crc = std::env::var("UIW_CRC").is_ok_and(|v| v == "1");
    c.ird = ird;
    c.ord = ord;
    c.private_data = private_data;
    c.mss = mss.max(536);
    c.manual_accept = role == Role::Responder;
    c.mpa_timeout_ms = 60_000;
    c
}

/// Sets up a stream socket as the data path wants it: non-blocking, no Nagle.
pub fn prepare(s: &TcpStream) -> io::Result<usize> {
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    Ok(uiw_kabi::sys::tcp_maxseg(s).unwrap_or(1460) as usize)
}

/// A stream accepted by the listener whose MPA Request has not been matched to a QP yet.
pub struct Pending {
    pub conn: Connection,
    pub sock: TcpStream,
    stage: Vec<u8>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

impl Pending {
    pub fn new(conn: Connection, sock: TcpStream) -> Pending {
        Pending { conn, sock, stage: Vec::new() }
    }

    /// Rejects the stream's Request (MPA Reply with R=1 and `private_data`, best effort) and
    /// closes it (closing also takes it out of the progress thread's epoll set).
    pub fn reject(mut self, private_data: &[u8]) {
        let _ = self.conn.reject(private_data);
        let mut out = Vec::new();
        while let Some(uiw_wire::conn::Tx::Bytes(b)) = self.conn.next_tx() {
            out.extend_from_slice(&b);
        }
        let _ = self.sock.set_nonblocking(false);
        let _ = self.sock.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = self.sock.write_all(&out);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
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
            match self.sock.read(&mut self.stage[..n]) {
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
        let h = QpHello { to_qpn: 0x001002, from_qpn: 0x003001 };
        let b = h.encode();
        assert_eq!(b, [b'u', b'i', b'w', b'Q', 0x00, 0x00, 0x10, 0x02, 0x00, 0x00, 0x30, 0x01]);
        assert_eq!(QpHello::parse(&b), Some(h));
        assert_eq!(QpHello::parse(b"uiwX\0\0\0\0\0\0\0\0"), None);
        assert_eq!(QpHello::parse(b"uiwQ"), None);
    }

    #[test]
    fn lower_address_and_qpn_initiates() {
        let lo = Ipv4Addr::LOCALHOST;
        assert!(is_initiator(lo, 0x1001, lo, 0x2001));
        assert!(!is_initiator(lo, 0x2001, lo, 0x1001));
        assert!(is_initiator(Ipv4Addr::new(10, 0, 0, 1), 0x9001, Ipv4Addr::new(10, 0, 0, 2), 0x1001));
    }

    #[test]
    fn qpn_names_the_port() {
        assert_eq!(qp_address(Ipv4Addr::LOCALHOST, 0x003005, 20000), Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 20003)));
        assert_eq!(qp_address(Ipv4Addr::LOCALHOST, 0xfff001, 65000), None);
    }
}
