//! Connection management for the librdmacm drop-in (`provider/include/uiw_cm.h`): what the
//! kernel's iw_cm does for a kernel iWARP provider. The drop-in owns addressing, listening and
//! connecting; it hands each TCP stream to the engine, which runs MPA on it (RFC 5044 §7,
//! RFC 6581), attaches it to a QP, moves the QP to RTS and reports events back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::transport::Pending;

/// `enum uiw_cm_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum CmEventKind {
    ConnectRequest = 1,
    Established = 2,
    Rejected = 3,
    ConnectError = 4,
    Disconnected = 5,
}

/// How a connection ended, or why it could not be made (an errno at the C surface).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmStatus {
    /// No error (0).
    Ok,
    /// The peer rejected the connection (`ECONNREFUSED`).
    Refused,
    /// The stream was lost or reset, or the peer sent a Terminate (`ECONNRESET`).
    Reset,
    /// A local error ended it (`EIO`).
    LocalError,
}

/// The QP an rdma_cm connection carries, as the drop-in's `rdma_disconnect` reaches it.
pub trait CmQp: Send + Sync {
    /// `rdma_disconnect`: the QP goes to ERROR and DISCONNECTED is reported.
    fn cm_disconnect(&self);
}

/// One event for the drop-in (`struct uiw_cm_event`).
#[derive(Debug, Clone, Copy)]
pub struct CmEvent<'a> {
    pub kind: CmEventKind,
    /// `Ok`, or why (CONNECT_ERROR, DISCONNECTED, REJECTED).
    pub status: CmStatus,
    pub private_data: &'a [u8],
    pub ird: u16,
    pub ord: u16,
}

pub type CmCallback = Box<dyn Fn(&CmEvent<'_>) + Send + Sync>;

/// What a [`CmListen`] does with a connection its listener accepted: given the stream's local
/// and remote addresses, the rdma_cm connection that will report its MPA Request
/// (CONNECT_REQUEST), or `None` to refuse it (the stream is closed).
pub type IncomingCallback = Box<dyn Fn(SocketAddr, SocketAddr) -> Option<Arc<CmConn>> + Send + Sync>;

/// An rdma_cm listener on a device whose streams go over a userspace transport
/// (`uiw_cm_listen_v2`): the engine listens through the device's [`Connector`] — the seam the
/// QPs' own streams use — and hands each accepted stream to the drop-in, as the drop-in's
/// kernel listener does with `uiw_cm_passive_v1` on a `--transport tcp` device.
///
/// [`Connector`]: super::transport::Connector
pub struct CmListen {
    incoming: Mutex<Option<IncomingCallback>>,
}

impl CmListen {
    pub fn new(incoming: IncomingCallback) -> Arc<CmListen> {
        Arc::new(CmListen { incoming: Mutex::new(Some(incoming)) })
    }

    /// A stream was accepted: the drop-in's connection for it, or `None` (refused, or the
    /// listener is closed).
    pub fn incoming(&self, local: SocketAddr, remote: SocketAddr) -> Option<Arc<CmConn>> {
        self.incoming.lock().as_ref().and_then(|f| f(local, remote))
    }

    /// No callback after this returns.
    pub fn release(&self) {
        *self.incoming.lock() = None;
    }
}

/// One rdma_cm connection as the engine sees it.
pub struct CmConn {
    cb: Mutex<Option<CmCallback>>,
    /// Passive side, between the MPA Request and accept/reject.
    pub pending: Mutex<Option<Pending>>,
    /// The QP carrying the stream, once attached.
    pub qp: Mutex<Option<Weak<dyn CmQp>>>,
    established: AtomicBool,
    /// The last event (REJECTED, CONNECT_ERROR, DISCONNECTED) has been reported.
    finished: AtomicBool,
}

impl std::fmt::Debug for CmConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConn").field("established", &self.established).field("finished", &self.finished).finish()
    }
}

impl CmConn {
    pub fn new(cb: CmCallback) -> Arc<CmConn> {
        Arc::new(CmConn {
            cb: Mutex::new(Some(cb)),
            pending: Mutex::new(None),
            qp: Mutex::new(None),
            established: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        })
    }

    fn emit(&self, ev: &CmEvent<'_>) {
        if let Some(cb) = self.cb.lock().as_ref() {
            cb(ev);
        }
    }

    /// MPA Request received (passive side).
    pub fn connect_request(&self, private_data: &[u8], ird: u16, ord: u16) {
        self.emit(&CmEvent { kind: CmEventKind::ConnectRequest, status: CmStatus::Ok, private_data, ird, ord });
    }

    /// MPA done: the QP is in RTS.
    pub fn established(&self, private_data: &[u8], ird: u16, ord: u16) {
        if !self.established.swap(true, Ordering::AcqRel) {
            self.emit(&CmEvent { kind: CmEventKind::Established, status: CmStatus::Ok, private_data, ird, ord });
        }
    }

    /// The peer rejected our Request.
    pub fn rejected(&self, private_data: &[u8]) {
        if !self.finished.swap(true, Ordering::AcqRel) {
            self.emit(&CmEvent { kind: CmEventKind::Rejected, status: CmStatus::Refused, private_data, ird: 0, ord: 0 });
        }
    }

    /// The stream ended: DISCONNECTED if it had been established, CONNECT_ERROR otherwise.
    pub fn ended(&self, status: CmStatus) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let kind = if self.established.load(Ordering::Acquire) { CmEventKind::Disconnected } else { CmEventKind::ConnectError };
        self.emit(&CmEvent { kind, status, private_data: &[], ird: 0, ord: 0 });
    }

    /// The QP carrying the stream, if it is still there.
    pub fn qp(&self) -> Option<std::sync::Arc<dyn CmQp>> {
        self.qp.lock().as_ref().and_then(Weak::upgrade)
    }

    /// No callback after this returns.
    pub fn release(&self) {
        *self.cb.lock() = None;
        self.pending.lock().take();
    }
}
