//! Shared receive queues: a bounded FIFO of receive WRs with the limit event of
//! `ibv_modify_srq(IBV_SRQ_LIMIT)` (IBTA Vol 1 §10.2.9.2: armed once, fires
//! `IBV_EVENT_SRQ_LIMIT_REACHED` when the number of WRs drops below the limit).

use std::collections::VecDeque;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::events::{event_type, AsyncSink};
use super::wr::{PostError, RecvWqe};

#[derive(Debug)]
pub struct Srq {
    pub max_wr: u32,
    pub max_sge: u32,
    /// 0 = disarmed.
    pub limit: u32,
    queue: VecDeque<RecvWqe>,
}

impl Srq {
    pub fn new(max_wr: u32, max_sge: u32) -> Srq {
        Srq { max_wr, max_sge, limit: 0, queue: VecDeque::new() }
    }

    pub fn post(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        if wqe.sges.len() > self.max_sge as usize {
            return Err(PostError::TooManySges);
        }
        if self.queue.len() >= self.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        self.queue.push_back(wqe);
        Ok(())
    }

    /// Takes the next receive WR; `true` in the second field when this crossed the armed limit
    /// (the limit is disarmed then, and the caller raises the async event).
    pub fn take(&mut self) -> Option<(RecvWqe, bool)> {
        let w = self.queue.pop_front()?;
        let fired = self.limit != 0 && (self.queue.len() as u32) < self.limit;
        if fired {
            self.limit = 0;
        }
        Some((w, fired))
    }

    /// A WR a QP took and did not use (the QP failed first): back to the front of the queue.
    pub fn give_back(&mut self, wqe: RecvWqe) {
        self.queue.push_front(wqe);
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// `ibv_modify_srq`: `max_wr` (resize, never below what is queued) and/or `srq_limit`.
    pub fn modify(&mut self, max_wr: Option<u32>, limit: Option<u32>, hw_max: u32) -> Result<(), super::error::Error> {
        if let Some(m) = max_wr {
            if m == 0 || m > hw_max || (m as usize) < self.queue.len() {
                return Err(super::error::Error::Invalid);
            }
        }
        if let Some(l) = limit {
            if l > max_wr.unwrap_or(self.max_wr) {
                return Err(super::error::Error::Invalid);
            }
        }
        if let Some(m) = max_wr {
            self.max_wr = m;
        }
        if let Some(l) = limit {
            self.limit = l;
        }
        Ok(())
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SrqObj {
    pub handle: AtomicU64,
    pub pd: u32,
    pub inner: Mutex<Srq>,
    pub(crate) async_sink: Arc<AsyncSink>,
    pub async_events_reported: AtomicU32,
    pub(crate) users: AtomicU32,
    /// The QPs that take their receives from here, for [`SrqObj::posted`].
    pub(crate) qps: Mutex<Vec<std::sync::Weak<super::qp::Qp>>>,
}

impl SrqObj {
    /// After `ibv_post_srq_recv`: a QP of this SRQ whose incoming Send waits for a receive
    /// (wire `rnr_wait_ms`) takes one and reads on now. Without this it waited for its own
    /// next event — none, if its application sleeps on a completion channel — and at the
    /// end of the wait sent a "no buffer" Terminate although a receive was posted (issue 13:
    /// fabtests' `fi_shared_ctx -e msg`, whose server posts its receives only once every
    /// endpoint is connected, while the client sends as soon as its own are).
    pub fn posted(&self) {
        let qps: smallvec::SmallVec<[Arc<super::qp::Qp>; 8]> = {
            let mut q = self.qps.lock();
            q.retain(|w| w.strong_count() > 0);
            q.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for qp in qps {
            if self.inner.lock().is_empty() {
                break;
            }
            qp.srq_posted();
        }
    }

    /// Async events the application read for this SRQ.
    pub fn async_events_to_ack(&self) -> u32 {
        self.async_sink.settle(self.handle.load(Ordering::Acquire), &self.async_events_reported)
    }
    /// Returns a WR a failing QP took but did not use.
    pub fn give_back(&self, w: RecvWqe) {
        self.inner.lock().give_back(w);
    }

    /// Takes a receive WR for an incoming Send, raising the limit event if it fires.
    pub fn take(&self) -> Option<RecvWqe> {
        let (w, fired) = self.inner.lock().take()?;
        if fired {
            self.async_sink.raise(self.handle.load(Ordering::Acquire), event_type::SRQ_LIMIT_REACHED, &self.async_events_reported);
        }
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u64) -> RecvWqe {
        RecvWqe { wr_id: id, sges: Default::default() }
    }

    #[test]
    fn bounded_fifo() {
        let mut s = Srq::new(2, 1);
        s.post(w(1)).unwrap();
        s.post(w(2)).unwrap();
        assert_eq!(s.post(w(3)), Err(PostError::QueueFull));
        assert_eq!(s.take().unwrap().0.wr_id, 1);
    }

    #[test]
    fn limit_fires_once_when_crossed() {
        let mut s = Srq::new(8, 1);
        for i in 0..4 {
            s.post(w(i)).unwrap();
        }
        s.modify(None, Some(3), 16).unwrap();
        assert!(!s.take().unwrap().1); // 3 left: not below 3
        assert!(s.take().unwrap().1); // 2 left: fires
        assert_eq!(s.limit, 0);
        assert!(!s.take().unwrap().1);
    }

    #[test]
    fn modify_validates() {
        let mut s = Srq::new(4, 1);
        s.post(w(1)).unwrap();
        s.post(w(2)).unwrap();
        assert!(matches!(s.modify(Some(1), None, 16), Err(crate::engine::error::Error::Invalid)));
        assert!(matches!(s.modify(Some(32), None, 16), Err(crate::engine::error::Error::Invalid)));
        assert!(matches!(s.modify(None, Some(5), 16), Err(crate::engine::error::Error::Invalid)));
        assert!(s.modify(Some(8), Some(5), 16).is_ok());
    }
}
