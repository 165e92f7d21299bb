//! Per-device and per-QP counters, readable from outside the process (`uiw stat`).
//!
//! Each process keeps one statistics file per device it opens, `<state>/stats/<ibdev>.<pid>`
//! (the layout is `uiw_kabi::stats`), mapped shared: the data path adds to counters with
//! relaxed atomics and nobody else in the process is involved, so a reader needs no
//! cooperation from the application's threads. A QP owns a slot while it lives and counts
//! there alone; its destroy folds the slot into the device block, which outlives the QP
//! and also takes what QPs without a slot count. When no file can be made (no state
//! directory, a read-only one) the counters live in anonymous memory.
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

    /// Adds `n` to counter `c`: in the QP's slot, or the device block for a QP without one
    /// (with a locked add: the callers are not serialized by the QP).
    fn add(&self, c: Counter, n: u64) {
        if n == 0 {
            return;
        }
        let Some(m) = &self.map else { return };
        match self.slot {
            Some(s) => m.slot(s, c).fetch_add(n, Ordering::Relaxed),
            None => m.device(c).fetch_add(n, Ordering::Relaxed),
        };
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

    /// The differences go into the QP's slot, whose one writer the caller is (it holds the
    /// QP): each word is read and written back, no locked instruction; `uiw stat` adds the
    /// slots of live QPs to the device block (see `uiw_kabi::stats`). A QP without a slot
    /// adds to the device block, which every QP of the process may add to, with locked adds.
    /// A message's publish lies between the `recv` that brings it and the `send` of the
    /// answer; it made three locked adds to the device block on each side, full barriers.
    fn publish(&self, seen: &mut Counters, now: &Counters) {
        let was = wire_order(seen);
        *seen = *now;
        let Some(m) = &self.map else { return };
        let (words, locked) = match self.slot {
            Some(s) => (m.slot_counters(s), false),
            None => (m.device_counters(), true),
        };
        for (i, now) in wire_order(now).into_iter().enumerate() {
            let n = now.wrapping_sub(was[i]);
            if n == 0 {
                continue;
            }
            let w = &words[WIRE_COUNTERS[i] as usize];
            if locked {
                w.fetch_add(n, Ordering::Relaxed);
            } else {
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

/// Folds are made one at a time in the process (a reader tells a fold in progress by the
/// fold sequence being odd: two folds at once would hide that).
static FOLDING: Mutex<()> = Mutex::new(());

impl Drop for QpStats {
    /// The slot's counters are folded into the device block, which keeps the process's
    /// totals once the slot is reused, and the slot stays readable (marked destroyed and
    /// folded) until a new QP needs it. Between the two steps of the fold sequence, a reader
    /// waits (`uiw_kabi::stats::read`): it would count the QP twice, or not at all.
    fn drop(&mut self) {
        if let (Some(m), Some(s)) = (&self.map, self.slot) {
            let _one = FOLDING.lock().unwrap_or_else(|e| e.into_inner());
            m.fold_seq().fetch_add(1, Ordering::SeqCst);
            let device = m.device_counters();
            for (d, c) in device.iter().zip(m.slot_counters(s)) {
                d.fetch_add(c.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            let w = m.slot_word(s).load(Ordering::Relaxed);
            m.slot_word(s).store((w & !layout::SLOT_LIVE) | layout::SLOT_DESTROYED | layout::SLOT_FOLDED, Ordering::Release);
            m.fold_seq().fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter of the wire core lands in its own word of the QP's slot, a second
    /// publish adds only what moved since the first, and the device block stays untouched
    /// until the QP goes: then the slot is folded into it (and marked so), and the file's
    /// totals are the same before and after. A QP without a slot counts in the device block.
    #[test]
    fn a_publish_adds_each_wire_counter_to_its_own_word() {
        let map = Arc::new(StatsMap::anonymous(std::process::id(), 0, "uiw_test").unwrap());
        map.slot_word(3).store(layout::SLOT_LIVE | 0x11, Ordering::Relaxed);
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
        stats.flushed(5);
        let expect = [
            (Counter::TxBytes, 1),
            (Counter::RxBytes, 1002),
            (Counter::TxMsgs, 4),
            (Counter::RxMsgs, 8),
            (Counter::TxFpdus, 16),
            (Counter::RxFpdus, 33),
            (Counter::TxTerminates, 64),
            (Counter::RxTerminates, 128),
            (Counter::FlushedWrs, 5),
            (Counter::ConnErrors, 0),
        ];
        let file = |m: &StatsMap| {
            let mut b = vec![0u8; layout::FILE_LEN];
            for (i, w) in b.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&m.word(i).load(Ordering::Relaxed).to_ne_bytes());
            }
            layout::parse(&b).unwrap()
        };
        let before = file(&map);
        for (c, v) in expect {
            assert_eq!(map.slot(3, c).load(Ordering::Relaxed), v, "slot {c:?}");
            assert_eq!(map.slot(2, c).load(Ordering::Relaxed), 0, "another slot {c:?}");
            assert_eq!(map.device(c).load(Ordering::Relaxed), 0, "device {c:?}, while the QP lives");
            assert_eq!(before.device[c as usize], v, "the file's total {c:?}");
        }
        drop(stats);
        let after = file(&map);
        assert_eq!(map.slot_word(3).load(Ordering::Relaxed), layout::SLOT_DESTROYED | layout::SLOT_FOLDED | 0x11);
        assert_eq!(map.fold_seq().load(Ordering::Relaxed), 2, "one fold, over");
        for (c, v) in expect {
            assert_eq!(map.device(c).load(Ordering::Relaxed), v, "device {c:?}, folded");
            assert_eq!(after.device[c as usize], v, "the file's total {c:?}, folded");
        }
        assert_eq!(after.qps, [(0x11, true, before.qps[0].2)], "the destroyed QP stays readable");
        let slotless = QpStats { map: Some(map.clone()), slot: None };
        slotless.sync(&mut Counters::default(), &Counters { tx_bytes: 10, ..Counters::default() });
        assert_eq!(map.device(Counter::TxBytes).load(Ordering::Relaxed), 11, "a QP without a slot counts in the device block");
    }
}
