//! Non-blocking use of a [`Transport`], for an event loop that serves many streams (the
//! provider's progress thread): `connect_start`, `RawListener::try_accept`,
//! `RawStream::try_read`/`try_write`, each with an `eventfd` that behaves like a kernel
//! socket's readiness under edge-triggered epoll — after a call that came back short (a read
//! that got less than asked, a write that would block), it fires once more can be read or
//! written or the connection changed state; the listener's is readable (level) while
//! connections wait to be accepted.
//!
//! Every stack turn (the progress thread's, or one a caller makes here) ends with
//! [`notify`], under the host lock, so no news is lost between a short call and the wait.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use uiw_utcp::State;

use crate::eventfd::EventFd;
use crate::neigh;
use crate::stream::{Dyn, RawStream, Shared, Transport};

/// What a non-blocking stream's descriptor waits for.
pub(crate) struct Watch {
    ev: Arc<EventFd>,
    want_read: bool,
    want_write: bool,
    state: Option<State>,
}

/// Signals every watched stream whose wait is over, and the listener while connections wait.
pub(crate) fn notify(host: &mut Dyn, s: &Shared) {
    notify_quiet(host, s, &|_| false, &mut Vec::new())
}

/// [`notify`], except that the streams `quiet` names are not signalled: their readiness
/// descriptors go to `served` instead, for a caller that serves them itself right away (see
/// [`crate::stream::Transport::turn_serving`]).
pub(crate) fn notify_quiet(host: &mut Dyn, s: &Shared, quiet: &dyn Fn(RawFd) -> bool, served: &mut Vec<RawFd>) {
    let mut watches = s.watches.lock().unwrap_or_else(|p| p.into_inner());
    let mut fed = s.readable.lock().unwrap_or_else(|p| p.into_inner());
    for (h, w) in watches.iter_mut() {
        let (state, readable, writable) = match host.stack.tcb(*h) {
            Some(t) => {
                let closed = t.state() == State::Closed;
                (Some(t.state()), closed || t.recv_available() > 0 || t.at_eof(), closed || t.send_capacity() > 0)
            }
            None => (None, true, true),
        };
        let fire = state != w.state || (w.want_read && readable) || (w.want_write && writable);
        if fire {
            if (w.want_read && readable) || state != w.state {
                let fd = w.ev.fd();
                if !fed.contains(&fd) {
                    if fed.len() >= crate::stream::READABLE_KEPT {
                        fed.remove(0);
                    }
                    fed.push(fd);
                }
            }
            w.want_read &= !readable;
            w.want_write &= !writable;
            w.state = state;
            if quiet(w.ev.fd()) {
                served.push(w.ev.fd());
            } else {
                w.ev.signal();
            }
        }
    }
    drop(fed);
    drop(watches);
    if host.stack.acceptable() {
        for (port, ev) in s.listen_ev.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if host.stack.acceptable_on(*port) {
                ev.signal();
            }
        }
    }
}

/// Whether `fd` is a watched stream's readiness descriptor.
pub(crate) fn owns(s: &Shared, fd: RawFd) -> bool {
    s.watches.lock().unwrap_or_else(|p| p.into_inner()).values().any(|w| w.ev.fd() == fd)
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "connection reset")
}

fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

fn watch(s: &Shared, stream: &RawStream, state: Option<State>) {
    let Some(ev) = stream.ev.clone() else { return };
    s.watches.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.h, Watch { ev, want_read: true, want_write: true, state });
}

/// Accepts connections to one port without blocking; stops listening when dropped.
pub struct RawListener {
    shared: Arc<Shared>,
    ev: Arc<EventFd>,
    port: u16,
}

impl Transport {
    /// Starts a connection to `remote` and returns at once (after the peer's MAC is known:
    /// from the kernel's table, or resolved within `arp_timeout`). The local port is one of
    /// the steered range's upper half. The stream takes writes at once (sent once the
    /// handshake completes); its readiness fires when it is established or failed.
    pub fn connect_start(&self, remote: SocketAddrV4, arp_timeout: Duration) -> io::Result<RawStream> {
        let s = &self.shared;
        let ip = *remote.ip();
        if s.lock().stack.neighbour(ip).is_none() {
            let mac = neigh::resolve(ip, arp_timeout)?;
            s.lock().stack.set_neighbour(ip, mac);
        }
        let (lo, hi) = s.ports;
        let lo = lo + (hi - lo) / 2;
        let span = u32::from(hi - lo) + 1;
        let port = lo + (s.next_port.fetch_add(1, Ordering::Relaxed) % span) as u16;
        let ev = Arc::new(EventFd::new()?);
        let mut host = s.lock();
        let h = host.stack.connect(port, remote);
        let stream = RawStream::nonblocking(s.clone(), h, ev);
        watch(s, &stream, Some(State::SynSent));
        s.poll(&mut host, 64)?;
        notify(&mut host, s);
        Ok(stream)
    }

    /// Listens on `port` for [`RawListener::try_accept`]: each port has its own listener
    /// (the provider's QP port, rdma_cm's); `EADDRINUSE` if `port` has one already. A port
    /// outside the steered range is steered here too (the driver's filter and the RST guard),
    /// so that rdma_cm can listen on the port the application names (rping's 7174, perftest's
    /// 18515). It stays steered until the transport closes: connections accepted on it
    /// outlive the listener, and their segments must never reach the kernel (which would
    /// reset them).
    pub fn listen_nonblocking(&self, port: u16) -> io::Result<RawListener> {
        let ev = Arc::new(EventFd::new()?);
        let s = &self.shared;
        // A port steered for an earlier listener is still steered: listening again is quick
        // (perftest -R listens twice on its port, and its client connects at once).
        let steer = (port < s.ports.0 || port > s.ports.1) && !s.steered.lock().unwrap_or_else(|p| p.into_inner()).contains(&port);
        // The guard first, outside the host lock (it runs nft). Only where the kernel gets
        // the frames too: a guard rule is what a killed process leaves behind, and it would
        // keep the kernel's own TCP off the port (perftest's out-of-band exchange uses the
        // same 18515 as its rdma_cm).
        if steer && s.kernel_sees_frames {
            s.guard.add(port)?;
        }
        let mut host = s.lock();
        if s.listen_ev.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&port) {
            return Err(io::Error::from_raw_os_error(libc::EADDRINUSE));
        }
        if steer {
            host.io.steer(port, true)?;
            s.steered.lock().unwrap_or_else(|p| p.into_inner()).insert(port);
        }
        s.listen_ev.lock().unwrap_or_else(|p| p.into_inner()).insert(port, ev.clone());
        host.stack.listen(port);
        Ok(RawListener { shared: s.clone(), ev, port })
    }
}

impl Drop for RawListener {
    /// Stops listening; connections made to the port and never accepted are reset, as
    /// closing a kernel listener resets its backlog.
    fn drop(&mut self) {
        let mut host = self.shared.lock();
        host.stack.unlisten(self.port);
        self.shared.listen_ev.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.port);
        while let Some(h) = host.stack.accept_on(self.port) {
            if let Some(t) = host.stack.tcb(h) {
                t.abort();
            }
            self.shared.orphans.lock().unwrap_or_else(|p| p.into_inner()).push(h);
        }
    }
}

impl RawListener {
    /// The next established connection, or `WouldBlock`.
    pub fn try_accept(&self) -> io::Result<RawStream> {
        let s = &self.shared;
        let mut host = s.lock();
        match host.stack.accept_on(self.port) {
            Some(h) => {
                let ev = Arc::new(EventFd::new()?);
                let stream = RawStream::nonblocking(s.clone(), h, ev);
                let state = host.stack.tcb(h).map(|t| t.state());
                watch(s, &stream, state);
                // Bytes may already be waiting: the first read looks.
                if let Some(ev) = &stream.ev {
                    ev.signal();
                }
                Ok(stream)
            }
            None => {
                // Drained under the host lock: the next connection signals again.
                self.ev.drain();
                if host.stack.acceptable_on(self.port) {
                    self.ev.signal();
                }
                Err(would_block())
            }
        }
    }

    /// Readable while connections wait to be accepted.
    pub fn fd(&self) -> RawFd {
        self.ev.fd()
    }
}

impl RawStream {
    fn want(&self, read: bool) {
        if let Some(w) = self.shared.watches.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&self.h) {
            if read {
                w.want_read = true;
            } else {
                w.want_write = true;
            }
        }
    }

    /// Reads what has arrived (after one turn of the stack), or `WouldBlock`; 0 at the end
    /// of the stream.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut at = 0;
        self.try_read_with(buf.len(), &mut |s| {
            buf[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        })
    }

    /// As [`RawStream::try_read`] for up to `max` bytes, lent to `f` where they lie in the
    /// stack's receive buffer (in order, in at most two slices) rather than copied into a
    /// buffer first: a reader that places them elsewhere copies each byte once.
    pub fn try_read_with(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let s = self.shared.clone();
        let mut host = s.lock();
        s.poll(&mut host, 64)?;
        let t = host.stack.tcb(self.h).ok_or_else(gone)?;
        let n = t.recv_with(max, f);
        let (eof, closed) = (t.at_eof(), t.state() == State::Closed);
        if n > 0 {
            // A window update may be due.
            s.poll(&mut host, 64)?;
        }
        let r = if n == 0 && max > 0 {
            if eof {
                Ok(0)
            } else if closed {
                Err(gone())
            } else {
                self.want(true);
                Err(would_block())
            }
        } else {
            if n < max {
                if eof || closed {
                    // The caller reads again only on news: this is news already.
                    if let Some(ev) = &self.ev {
                        ev.signal();
                    }
                } else {
                    self.want(true);
                }
            }
            Ok(n)
        };
        notify(&mut host, &s);
        r
    }

    /// Bytes [`RawStream::try_write`] would take now.
    pub fn send_capacity(&self) -> usize {
        self.shared.lock().stack.tcb(self.h).map_or(0, |t| t.send_capacity())
    }

    /// Queues what the send buffer takes now and sends what the window allows, or
    /// `WouldBlock`.
    pub fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let s = self.shared.clone();
        let mut host = s.lock();
        let t = host.stack.tcb(self.h).ok_or_else(gone)?;
        let r = match t.send(buf) {
            Ok(n) => {
                if n < buf.len() {
                    self.want(false);
                }
                if n == 0 && !buf.is_empty() {
                    Err(would_block())
                } else {
                    Ok(n)
                }
            }
            Err(_) if t.state() == State::Closed => Err(gone()),
            Err(_) => Err(io::Error::new(io::ErrorKind::BrokenPipe, "connection closed for sending")),
        };
        s.poll(&mut host, 64)?;
        notify(&mut host, &s);
        r
    }

    /// Who is at the other end.
    pub fn peer(&self) -> Option<SocketAddrV4> {
        self.shared.lock().stack.remote(self.h)
    }

    /// This end: the stack's address and the connection's port.
    pub fn local(&self) -> Option<SocketAddrV4> {
        let host = self.shared.lock();
        host.stack.local_port(self.h).map(|p| SocketAddrV4::new(host.stack.ip(), p))
    }

    /// The readiness descriptor (`None` for a blocking stream).
    pub fn fd(&self) -> Option<RawFd> {
        self.ev.as_ref().map(|e| e.fd())
    }

    /// Ends the connection at once (RST), as closing a kernel socket with unread data does.
    pub fn abort(&self) {
        if let Some(t) = self.shared.lock().stack.tcb(self.h) {
            t.abort();
        }
    }
}
