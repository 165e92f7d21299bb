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

    /// Adds `n` to counter `c`, in the device block and in the QP's slot. `serialized`: the
    /// caller is the slot counter's one writer ([`QpStats::sync`], under the QP's lock), so
    /// the slot's word is read and written back rather than added to with a locked
    /// instruction — a message's sync makes three adds on each side. The device block, which
    /// every QP of the process adds to, always takes a locked add.
    fn add(&self, c: Counter, n: u64, serialized: bool) {
        if n == 0 {
            return;
        }
        let Some(m) = &self.map else { return };
        m.device(c).fetch_add(n, Ordering::Relaxed);
        if let Some(s) = self.slot {
            let w = m.slot(s, c);
            if serialized {
                w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            } else {
                w.fetch_add(n, Ordering::Relaxed);
            }
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

    fn publish(&self, seen: &mut Counters, now: &Counters) {
        let was = *seen;
        *seen = *now;
        self.add(Counter::TxBytes, now.tx_bytes.wrapping_sub(was.tx_bytes), true);
        self.add(Counter::RxBytes, now.rx_bytes.wrapping_sub(was.rx_bytes), true);
        self.add(Counter::TxMsgs, now.tx_msgs.wrapping_sub(was.tx_msgs), true);
        self.add(Counter::RxMsgs, now.rx_msgs.wrapping_sub(was.rx_msgs), true);
        self.add(Counter::TxFpdus, now.tx_fpdus.wrapping_sub(was.tx_fpdus), true);
        self.add(Counter::RxFpdus, now.rx_fpdus.wrapping_sub(was.rx_fpdus), true);
        self.add(Counter::TxTerminates, now.tx_terminates.wrapping_sub(was.tx_terminates), true);
        self.add(Counter::RxTerminates, now.rx_terminates.wrapping_sub(was.rx_terminates), true);
    }

    /// A thread waiting on a completion channel served the QP's stream (see
    /// `events::EventQueue::serve_ready`).
    pub fn reader_served(&self) {
        self.add(Counter::ReaderServes, 1, false);
    }

    /// `n` work requests completed as flushed.
    pub fn flushed(&self, n: usize) {
        self.add(Counter::FlushedWrs, n as u64, false);
    }

    /// A stream failed (unreachable, reset, peer gone, MPA rejected).
    pub fn conn_error(&self) {
        self.add(Counter::ConnErrors, 1, false);
    }

    /// A stream completed MPA negotiation.
    pub fn established(&self) {
        self.add(Counter::ConnEstablished, 1, false);
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
