//! Per-device and per-QP counters, readable from outside the process (`uiw stat`).
//!
//! Each process keeps one statistics file per device it opens, `<state>/stats/<ibdev>.<pid>`
//! (the layout is `uiw_kabi::stats`), mapped shared: the data path adds to counters with
//! relaxed atomics and nobody else in the process is involved, so a reader needs no
//! cooperation from the application's threads. A QP owns a slot while it lives; its
//! counters also add up in the device block, which outlives the QP. When no file can be
//! made (no state directory, a read-only one) the counters live in anonymous memory.
//!
//! The data path calls in at a few named points only:
//! - [`QpStats::sync`] after a stream was served (the wire core's [`Counters`]: bytes,
//!   messages, FPDUs, Terminates — the difference since the last sync);
//! - [`QpStats::flushed`] when work requests complete as flushed;
//! - [`QpStats::conn_error`] / [`QpStats::established`] for streams.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use uiw_kabi::stats::{self as layout, Counter, StatsMap};
use uiw_wire::conn::Counters;

/// The statistics files of this process, by device name (for the process's lifetime; a
/// `Vec`, whose pointers all point at the start of their allocations, so that leak checkers
/// see them as reachable).
static REGISTRY: Mutex<Vec<(String, Arc<StatsMap>)>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, Vec<(String, Arc<StatsMap>)>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Files of exited processes kept per statistics directory (the newest; older ones are
/// removed by the next process that starts).
const KEEP_EXITED: usize = 32;

/// The statistics directory of the device published at `ibdev_path`
/// (`<state>/sysfs/class/infiniband/<ibdev>` → `<state>/stats`).
pub fn stats_dir(ibdev_path: &Path) -> Option<PathBuf> {
    ibdev_path.ancestors().nth(4).map(|s| s.join("stats"))
}

/// Opens (once per process) the statistics file of device `ibdev` published at
/// `ibdev_path`. Never fails: without a file, the counters are kept in memory.
fn open_device(ibdev: &str, ibdev_path: &Path) {
    let mut r = registry();
    if r.iter().any(|(n, _)| n == ibdev) {
        return;
    }
    let pid = std::process::id();
    let start = layout::process_start_time(pid).unwrap_or(0);
    let file = stats_dir(ibdev_path).and_then(|dir| {
        if !dir.is_dir() {
            // `uiw up` makes it (mode 1777); a tree published before that gets it here.
            std::fs::create_dir(&dir).ok()?;
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
        }
        prune(&dir);
        let path = dir.join(format!("{ibdev}.{pid}"));
        match StatsMap::create(&path, pid, start, ibdev) {
            Ok(m) => Some(m),
            Err(e) => {
                crate::uiw_log!(Info, "{ibdev}: statistics stay in this process (`uiw stat` cannot see them): {}: {e}", path.display());
                None
            }
        }
    });
    let map = match file {
        Some(m) => m,
        None => match StatsMap::anonymous(pid, start, ibdev) {
            Ok(m) => m,
            Err(_) => return,
        },
    };
    r.push((ibdev.to_string(), Arc::new(map)));
}

/// Removes the oldest files of exited processes beyond [`KEEP_EXITED`] (those this user may
/// remove: the directory is sticky).
fn prune(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut exited = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.rsplit_once('.')).and_then(|(_, p)| p.parse::<u32>().ok()) else {
            continue;
        };
        if layout::process_start_time(pid).is_some() {
            continue; // live (or a reused pid: left for `uiw stat` to judge)
        }
        if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
            exited.push((t, e.path()));
        }
    }
    if exited.len() > KEEP_EXITED {
        exited.sort();
        for (_, p) in &exited[..exited.len() - KEEP_EXITED] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The counters the wire core keeps, in the order of [`wire_order`].
const WIRE_COUNTERS: [Counter; 8] = [
    Counter::TxBytes,
    Counter::RxBytes,
    Counter::TxMsgs,
    Counter::RxMsgs,
    Counter::TxFpdus,
    Counter::RxFpdus,
    Counter::TxTerminates,
    Counter::RxTerminates,
];

/// The wire core's counters as the values of [`WIRE_COUNTERS`].
fn wire_order(c: &Counters) -> [u64; 8] {
    [c.tx_bytes, c.rx_bytes, c.tx_msgs, c.rx_msgs, c.tx_fpdus, c.rx_fpdus, c.tx_terminates, c.rx_terminates]
}

/// One QP's counters: a slot in its device's file (if one was free) and the device block.
pub struct QpStats {
    map: Option<Arc<StatsMap>>,
    slot: Option<usize>,
}

impl std::fmt::Debug for QpStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QpStats(slot {:?})", self.slot)
    }
}

impl QpStats {
    /// Takes a free slot of `ibdev`'s file (opened with the process's first QP on it) for QP
    /// `qpn` (a destroyed QP's slot when all are used; none when all are live).
    pub fn new(ibdev: &str, ibdev_path: &Path, qpn: u32) -> QpStats {
        open_device(ibdev, ibdev_path);
        let map = registry().iter().find(|(n, _)| n == ibdev).map(|(_, m)| m.clone());
        let slot = map.as_ref().and_then(|m| {
            let word = layout::SLOT_LIVE | (u64::from(qpn) & layout::SLOT_QPN_MASK);
            let take = |s: usize, cur: u64| {
                if m.slot_word(s).compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                    return false;
                }
                for (c, _, _) in layout::COUNTERS {
                    m.slot(s, c).store(0, Ordering::Relaxed);
                }
                m.slot_word(s).store(word, Ordering::Release);
                true
            };
            (0..layout::QP_SLOTS)
                .find(|&s| m.slot_word(s).load(Ordering::Relaxed) == 0 && take(s, 0))
                .or_else(|| {
                    (0..layout::QP_SLOTS).find(|&s| {
                        let w = m.slot_word(s).load(Ordering::Relaxed);
                        w & layout::SLOT_DESTROYED != 0 && take(s, w)
                    })
                })
        });
        QpStats { map, slot }
    }

    /// Adds `n` to counter `c`, in the device block and in the QP's slot (with locked adds:
    /// the callers are not serialized by the QP).
    fn add(&self, c: Counter, n: u64) {
        if n == 0 {
            return;
        }
        let Some(m) = &self.map else { return };
        m.device(c).fetch_add(n, Ordering::Relaxed);
        if let Some(s) = self.slot {
            m.slot(s, c).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Publishes what a stream's wire core counted (`now`) since the last call (`seen`, kept
    /// with the stream: a new stream starts from zero). Callers serialize the calls for one
    /// QP (they hold it). Every pump syncs, and most pumps of a spinning poller move nothing:
    /// that case is a comparison at the caller, not a call.
    #[inline]
    pub fn sync(&self, seen: &mut Counters, now: &Counters) {
        if now != seen {
            self.publish(seen, now);
        }
    }

    /// The differences go straight into the device block's and the slot's counter arrays
    /// (one bounds check each): a message's publish, on the path from the `recv` that
    /// brings it to the `send` of the answer, went through [`QpStats::add`] once per counter,
    /// each call finding the map, the slot and the word again.
    fn publish(&self, seen: &mut Counters, now: &Counters) {
        let was = wire_order(seen);
        *seen = *now;
        let Some(m) = &self.map else { return };
        let device = m.device_counters();
        let slot = self.slot.map(|s| m.slot_counters(s));
        for (i, now) in wire_order(now).into_iter().enumerate() {
            let n = now.wrapping_sub(was[i]);
            if n == 0 {
                continue;
            }
            device[WIRE_COUNTERS[i] as usize].fetch_add(n, Ordering::Relaxed);
            if let Some(slot) = slot {
                // The caller is the slot counter's one writer (it holds the QP): the word is
                // read and written back, not added to with a locked instruction. The device
                // block, which every QP of the process adds to, takes a locked add.
                let w = &slot[WIRE_COUNTERS[i] as usize];
                w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            }
        }
    }

    /// A thread waiting on a completion channel served the QP's stream (see
    /// `events::EventQueue::serve_ready`).
    pub fn reader_served(&self) {
        self.add(Counter::ReaderServes, 1);
    }

    /// `n` work requests completed as flushed.
    pub fn flushed(&self, n: usize) {
        self.add(Counter::FlushedWrs, n as u64);
    }

    /// A stream failed (unreachable, reset, peer gone, MPA rejected).
    pub fn conn_error(&self) {
        self.add(Counter::ConnErrors, 1);
    }

    /// A stream completed MPA negotiation.
    pub fn established(&self) {
        self.add(Counter::ConnEstablished, 1);
    }
}

impl Drop for QpStats {
    /// The slot stays readable (marked destroyed) until a new QP needs it.
    fn drop(&mut self) {
        if let (Some(m), Some(s)) = (&self.map, self.slot) {
            let w = m.slot_word(s).load(Ordering::Relaxed);
            m.slot_word(s).store((w & !layout::SLOT_LIVE) | layout::SLOT_DESTROYED, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter of the wire core lands in its own word of the device block and of the
    /// QP's slot, and a second publish adds only what moved since the first.
    #[test]
    fn a_publish_adds_each_wire_counter_to_its_own_word() {
        let map = Arc::new(StatsMap::anonymous(std::process::id(), 0, "uiw_test").unwrap());
        let stats = QpStats { map: Some(map.clone()), slot: Some(3) };
        let mut now = Counters {
            tx_bytes: 1,
            rx_bytes: 2,
            tx_msgs: 4,
            rx_msgs: 8,
            tx_fpdus: 16,
            rx_fpdus: 32,
            tx_terminates: 64,
            rx_terminates: 128,
        };
        let mut seen = Counters::default();
        stats.sync(&mut seen, &now);
        now.rx_bytes += 1000;
        now.rx_fpdus += 1;
        stats.sync(&mut seen, &now);
        stats.sync(&mut seen, &now);
        let expect = [
            (Counter::TxBytes, 1),
            (Counter::RxBytes, 1002),
            (Counter::TxMsgs, 4),
            (Counter::RxMsgs, 8),
            (Counter::TxFpdus, 16),
            (Counter::RxFpdus, 33),
            (Counter::TxTerminates, 64),
            (Counter::RxTerminates, 128),
            (Counter::FlushedWrs, 0),
        ];
        for (c, v) in expect {
            assert_eq!(map.device(c).load(Ordering::Relaxed), v, "device {c:?}");
            assert_eq!(map.slot(3, c).load(Ordering::Relaxed), v, "slot {c:?}");
            assert_eq!(map.slot(2, c).load(Ordering::Relaxed), 0, "another slot {c:?}");
        }
    }
}
