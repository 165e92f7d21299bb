//! Connections to one destination start in the order the application asked for them.
//!
//! A program that opens several connections to one server and pairs them by index relies on
//! the server seeing its CONNECT_REQUESTs in the order of its `rdma_connect` calls. perftest
//! `-R -q N` does: the client connects its QPs 0..N in turn, the server numbers the QPs it
//! accepts in the order their requests come, and each side then sends the other its QP *i*'s
//! buffer addresses for its own QP *i*. Connected out of order, the server's QP *i* writes
//! `ib_send_bw`'s receive credits into the slot of a client QP it is not connected to, and
//! two QPs that wait for each other's credits stop for good.
//!
//! The kernel's rdma_cm keeps that order: its connects go out from one work queue. uiw's
//! `rdma_connect` returns at once and connects from a thread of its own (a TCP handshake and
//! the MPA Request, or the provider's stream open), so two calls raced, and the later one's
//! MPA Request could reach the server first. A [`Ticket`] taken in `rdma_connect` makes each
//! connect to a destination wait, before its TCP handshake, until the earlier ones to the same
//! destination have started theirs and sent their MPA Request (or failed). Connects to other
//! destinations do not wait for each other.
#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The longest a connect waits for the earlier ones to its destination: they end by
/// themselves (a refused or unanswered TCP connect fails), so this only bounds a wait that
/// would otherwise follow an earlier connect's full timeout.
pub const TURN_MAX: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Lanes {
    /// Per destination, the tickets not yet done (the smallest one's turn).
    waiting: HashMap<SocketAddr, BTreeSet<u64>>,
    next: u64,
}

fn lanes() -> &'static (Mutex<Lanes>, Condvar) {
    static LANES: OnceLock<(Mutex<Lanes>, Condvar)> = OnceLock::new();
    LANES.get_or_init(Default::default)
}

fn lock() -> MutexGuard<'static, Lanes> {
    lanes().0.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connect's place among those to its destination; its turn ends when it is dropped.
#[derive(Debug)]
pub struct Ticket {
    dst: SocketAddr,
    n: u64,
}

impl Ticket {
    /// Takes the next place for `dst` (in the application's `rdma_connect`).
    pub fn take(dst: SocketAddr) -> Ticket {
        let mut l = lock();
        let n = l.next;
        l.next += 1;
        l.waiting.entry(dst).or_default().insert(n);
        Ticket { dst, n }
    }

    /// Waits until every earlier ticket to the same destination is done, at most `limit`.
    /// Returns whether it was this ticket's turn (`false`: the wait timed out).
    pub fn wait_turn(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut l = lock();
        loop {
            if l.waiting.get(&self.dst).and_then(|s| s.first()) == Some(&self.n) {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            l = lanes().1.wait_timeout(l, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut l = lock();
        if let Some(s) = l.waiting.get_mut(&self.dst) {
            s.remove(&self.n);
            if s.is_empty() {
                l.waiting.remove(&self.dst);
            }
        }
        drop(l);
        lanes().1.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::mpsc;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], port))
    }

    /// Later tickets to one destination wait for the earlier ones, whichever thread runs first.
    #[test]
    fn connects_to_one_destination_start_in_order() {
        let dst = addr(40001);
        let tickets: Vec<Ticket> = (0..4).map(|_| Ticket::take(dst)).collect();
        let (tx, rx) = mpsc::channel();
        let threads: Vec<_> = tickets
            .into_iter()
            .enumerate()
            .rev() // started last first
            .map(|(i, t)| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    assert!(t.wait_turn(Duration::from_secs(20)), "ticket {i} never had its turn");
                    tx.send(i).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                    drop(t);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(tx);
        assert_eq!(rx.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn other_destinations_do_not_wait() {
        let first = Ticket::take(addr(40002));
        let other = Ticket::take(addr(40003));
        assert!(other.wait_turn(Duration::ZERO), "a connect to another destination waited");
        let second = Ticket::take(addr(40002));
        assert!(!second.wait_turn(Duration::from_millis(20)), "a connect started before the earlier one to its destination");
        drop(first);
        assert!(second.wait_turn(Duration::ZERO));
    }

    /// A ticket dropped out of turn (its connect timed out waiting, or was never started)
    /// does not hold up the ones after it.
    #[test]
    fn a_ticket_done_out_of_turn_leaves_no_gap() {
        let dst = addr(40004);
        let a = Ticket::take(dst);
        let b = Ticket::take(dst);
        let c = Ticket::take(dst);
        drop(b);
        drop(a);
        assert!(c.wait_turn(Duration::ZERO));
        drop(c);
        assert!(!lock().waiting.contains_key(&dst), "a finished destination is forgotten");
    }
}
