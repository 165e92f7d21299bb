//! The kernel's TCP behind the [`Stream`] seam: a `TcpStream` in non-blocking mode. Payload
//! goes out with one `sendmsg` straight from registered memory and comes in with one `readv`
//! straight into it (`UserMemory::send`/`recv` on the socket), exactly the system calls the
//! data path made before the seam existed.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use super::peer_timeout_ms;
use super::stream::{Connector, Listener, Stream};
use crate::engine::user_memory::{IoPart, Pinned, UserMemory};

/// A kernel TCP connection, set up as the data path wants it.
pub struct KernelStream {
    sock: TcpStream,
    mss: usize,
}

impl KernelStream {
    /// Non-blocking, no Nagle, dead-peer detection ([`peer_timeout_ms`]); reads the MSS.
    pub fn prepare(sock: TcpStream) -> io::Result<KernelStream> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        uiw_kabi::sys::set_peer_timeout(&sock, peer_timeout_ms().min(u64::from(u32::MAX)) as u32)?;
        let mss = uiw_kabi::sys::tcp_maxseg(&sock).unwrap_or(1460) as usize;
        Ok(KernelStream { sock, mss })
    }
}

impl Stream for KernelStream {
    fn send(&mut self, mem: &dyn UserMemory, parts: &[IoPart<'_>]) -> io::Result<usize> {
        mem.send(self.sock.as_raw_fd(), parts)
    }

    fn recv_placed(&mut self, mem: &dyn UserMemory, dst: &Pinned, tail: &mut [u8]) -> io::Result<usize> {
        mem.recv(self.sock.as_raw_fd(), dst, tail)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.sock).read(buf)
    }

    /// `SO_RCVLOWAT` (Linux signals `EPOLLIN` at once if lowering it uncovers waiting bytes).
    fn wake_after(&mut self, bytes: usize) -> bool {
        uiw_kabi::sys::set_rcvlowat(&self.sock, bytes).is_ok()
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&self.sock).write(buf)
    }

    fn shutdown_write(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }

    fn close_with(&mut self, bytes: &[u8], timeout: Duration) {
        let _ = self.sock.set_nonblocking(false);
        let _ = self.sock.set_write_timeout(Some(timeout));
        let _ = self.sock.write_all(bytes);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// The connection's MSS now (`TCP_MAXSEG`: Linux bounds it by half the largest window the
    /// peer has offered, so it grows as the window opens); the one read at setup if the
    /// socket cannot say.
    fn mss(&self) -> usize {
        uiw_kabi::sys::tcp_maxseg(&self.sock).map_or(self.mss, |m| m as usize)
    }

    fn peer(&self) -> Option<SocketAddr> {
        self.sock.peer_addr().ok()
    }

    fn local(&self) -> Option<SocketAddr> {
        self.sock.local_addr().ok()
    }

    fn readiness(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn readiness_is_input(&self) -> bool {
        true
    }
}

impl Listener for TcpListener {
    fn accept(&self) -> io::Result<Box<dyn Stream>> {
        let (sock, _) = TcpListener::accept(self)?;
        Ok(Box::new(KernelStream::prepare(sock)?))
    }

    fn readiness(&self) -> RawFd {
        self.as_raw_fd()
    }
}

/// The kernel's TCP.
pub struct KernelTcp;

impl Connector for KernelTcp {
    fn connect(&self, to: SocketAddrV4) -> io::Result<Box<dyn Stream>> {
        Ok(Box::new(KernelStream::prepare(uiw_kabi::sys::tcp_connect_start(to)?)?))
    }

    fn listen(&self, at: SocketAddrV4) -> io::Result<Box<dyn Listener>> {
        let l = TcpListener::bind(at)?;
        l.set_nonblocking(true)?;
        Ok(Box::new(l))
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}
