//! Connection management for the librdmacm drop-in (`provider/include/uiw_cm.h`): what the
//! kernel's iw_cm does for a kernel iWARP provider. The drop-in owns addressing, listening and
//! connecting; it hands each TCP stream to the engine, which runs MPA on it (RFC 5044 §7,
//! RFC 6581), attaches it to a QP, moves the QP to RTS and reports events back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::context::Qp;
use super::net::Pending;

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

/// One event for the drop-in (`struct uiw_cm_event`).
#[derive(Debug, Clone, Copy)]
pub struct CmEvent<'a> {
    pub kind: CmEventKind,
    /// 0, or an errno (CONNECT_ERROR, DISCONNECTED).
    pub status: i32,
    pub private_data: &'a [u8],
    pub ird: u16,
    pub ord: u16,
}

pub type CmCallback = Box<dyn Fn(&CmEvent<'_>) + Send + Sync>;

/// One rdma_cm connection as the engine sees it.
pub struct CmConn {
    cb: Mutex<Option<CmCallback>>,
    /// Passive side, between the MPA Request and accept/reject.
    pub pending: Mutex<Option<Pending>>,
    /// The QP carrying the stream, once attached.
    pub qp: Mutex<Weak<Qp>>,
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
            qp: Mutex::new(Weak::new()),
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
        self.emit(&CmEvent { kind: CmEventKind::ConnectRequest, status: 0, private_data, ird, ord });
    }

    /// MPA done: the QP is in RTS.
    pub fn established(&self, private_data: &[u8], ird: u16, ord: u16) {
        if !self.established.swap(true, Ordering::AcqRel) {
            self.emit(&CmEvent { kind: CmEventKind::Established, status: 0, private_data, ird, ord });
        }
    }

    /// The peer rejected our Request.
    pub fn rejected(&self, private_data: &[u8]) {
        if !self.finished.swap(true, Ordering::AcqRel) {
            self.emit(&CmEvent { kind: CmEventKind::Rejected, status: libc::ECONNREFUSED, private_data, ird: 0, ord: 0 });
        }
    }

    /// The stream ended: DISCONNECTED if it had been established, CONNECT_ERROR otherwise.
    pub fn ended(&self, status: i32) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let kind = if self.established.load(Ordering::Acquire) { CmEventKind::Disconnected } else { CmEventKind::ConnectError };
        self.emit(&CmEvent { kind, status, private_data: &[], ird: 0, ord: 0 });
    }

    /// No callback after this returns.
    pub fn release(&self) {
        *self.cb.lock() = None;
        self.pending.lock().take();
    }
}
