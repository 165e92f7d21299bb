//! Which CPUs the progress thread runs on.
//!
//! A thread starts with the CPU mask of the thread that created it. The progress thread is
//! created by the application thread that makes the process's first QP, and a polling
//! runtime (SPDK's reactor, a DPDK lcore) pins that thread to one core of its own: inherited
//! as is, the mask would put the progress thread on the very core the reactor spins on, each
//! taking the other's time slices. So the progress thread, as it is created, moves to the
//! CPUs the process may use that the creating thread's mask leaves out, and keeps the
//! inherited mask when there are none (the whole process confined to the creator's CPUs,
//! as `taskset` does: never escape a confinement the user chose).
//!
//! "The CPUs the process may use" is the union of the masks of all its threads. The main
//! thread's mask alone would not do: DPDK pins the main thread to the main lcore, and its
//! control threads keep the CPUs the lcores leave free, which are exactly the right ones.
//!
//! `UIW_PROGRESS_CPUS=<list>` (`0,2-3`, the kernel's cpulist format) names the CPUs instead.
//! The mask chosen is logged at debug level (`UIW_DEBUG=1`).
//!
//! Later, the progress thread keeps off the CPU the application polls on ([`Dodge`]): an
//! application that spins — on its CQ, or on memory, as `ib_write_lat` does, where only the
//! progress thread places what arrives — gives up its CPU to the progress thread at every
//! arrival when the scheduler wakes the progress thread there. On a machine whose CPUs are
//! all busy (two processes spinning on two CPUs) that costs a preemption per message: an
//! `ib_write_lat -s 8` half round trip of 23 µs with each process and its progress thread
//! pinned to one CPU, 12.6 µs with each progress thread on the other process's CPU, and
//! anything from 13 to 24 µs when the scheduler decides; dodging, 12.3–13.1 µs. Not with
//! `UIW_PROGRESS_CPUS`: the user's choice stands.
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why a CPU list does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuListError(String);

impl fmt::Display for CpuListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a CPU list (such as 0,2-3)", self.0)
    }
}

/// Parses a cpulist (`0,2-3`, as in `/proc/self/status` `Cpus_allowed_list`): ascending,
/// without duplicates; empty items are refused, so is an empty list.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, CpuListError> {
    const MAX_CPU: usize = 1 << 16;
    let bad = || CpuListError(s.to_owned());
    let mut cpus = Vec::new();
    for item in s.trim().split(',') {
        let item = item.trim();
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => (a.trim().parse::<usize>().map_err(|_| bad())?, b.trim().parse::<usize>().map_err(|_| bad())?),
            None => {
                let c = item.parse::<usize>().map_err(|_| bad())?;
                (c, c)
            }
        };
        if lo > hi || hi >= MAX_CPU {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `cpus` (ascending) in the cpulist format: `0,2-3`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&cpus[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        }
        i = j + 1;
    }
    out
}

/// The progress thread's CPUs, given the creating thread's (`spawner`) and the process's:
/// the process's CPUs without the creator's, or `None` (keep the inherited mask) when that
/// leaves nothing.
pub fn choose(spawner: &[usize], process: &[usize]) -> Option<Vec<usize>> {
    let rest: Vec<usize> = process.iter().copied().filter(|c| !spawner.contains(c)).collect();
    (!rest.is_empty()).then_some(rest)
}

/// The union of the CPU masks of the process's threads (see the module doc), ascending; at
/// least the calling thread's.
fn process_cpus(own: &[usize]) -> Vec<usize> {
    let mut tids = vec![std::process::id() as i32];
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        tids.extend(dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()));
    }
    let mut cpus = own.to_vec();
    for tid in tids {
        // A thread that ended meanwhile (ESRCH) adds nothing.
        if let Ok(m) = uiw_kabi::sys::thread_affinity(tid) {
            cpus.extend(m);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// Moves the progress thread `t`, just spawned, off its creator's CPUs (see the module doc),
/// or onto `UIW_PROGRESS_CPUS`. Called by the creator, which is the thread whose mask `t`
/// inherited: the mask is in place when this returns.
pub fn place_progress_thread<T>(t: &std::thread::JoinHandle<T>) {
    place(t, std::env::var("UIW_PROGRESS_CPUS").ok().filter(|v| !v.trim().is_empty()));
}

/// [`place_progress_thread`], `wanted` being `UIW_PROGRESS_CPUS`.
fn place<T>(t: &std::thread::JoinHandle<T>, wanted: Option<String>) {
    let Ok(own) = uiw_kabi::sys::thread_affinity(0) else { return };
    if let Some(v) = wanted {
        match parse_cpu_list(&v).map_err(|e| e.to_string()).and_then(|cpus| uiw_kabi::sys::set_affinity_of(t, &cpus).map(|()| cpus).map_err(|e| e.to_string())) {
            Ok(cpus) => {
                crate::uiw_log!(Debug, "progress thread on CPUs {} (UIW_PROGRESS_CPUS={v})", format_cpu_list(&cpus));
                return;
            }
            Err(e) => crate::uiw_log!(Warn, "UIW_PROGRESS_CPUS={v}: {e}; placing the progress thread as if unset"),
        }
    }
    let process = process_cpus(&own);
    let placed = match choose(&own, &process) {
        Some(cpus) => match uiw_kabi::sys::set_affinity_of(t, &cpus) {
            Ok(()) => cpus,
            Err(e) => {
                crate::uiw_log!(Warn, "progress thread: cannot move to CPUs {}: {e}", format_cpu_list(&cpus));
                own.clone()
            }
        },
        None => own.clone(),
    };
    crate::uiw_log!(
        Debug,
        "progress thread on CPUs {} (created by a thread on {}; the process's threads use {})",
        format_cpu_list(&placed),
        format_cpu_list(&own),
        format_cpu_list(&process)
    );
}

/// The CPU an application thread of this process last polled a CQ on; `usize::MAX`: none yet.
static APP_CPU: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Notes the CPU the calling application thread polls on (see [`Dodge`]); a read of the
/// thread's rseq area and a store.
pub fn note_app_cpu() {
    if let Some(c) = uiw_kabi::sys::current_cpu() {
        if APP_CPU.load(Ordering::Relaxed) != c {
            APP_CPU.store(c, Ordering::Relaxed);
        }
    }
}

fn app_cpu() -> Option<usize> {
    Some(APP_CPU.load(Ordering::Relaxed)).filter(|&c| c != usize::MAX)
}

/// Turns in a row the progress thread must find itself serving traffic on the application's
/// CPU before it moves: one turn there is chance, a streak is the scheduler's habit.
const DODGE_STREAK: u32 = 4;
/// The least time between two moves (engine µs): an application whose threads poll on
/// several CPUs must not have the progress thread chase them.
const DODGE_HOLD_US: u64 = 100_000;

/// Keeps the progress thread off the CPU the application polls on (see the module doc),
/// within the CPUs it was placed on. Sans-IO: [`Dodge::observe`] decides,
/// [`Dodge::turn`] reads the CPUs and applies the decision.
#[derive(Debug)]
pub struct Dodge {
    /// The CPUs the progress thread was placed on (read at the first decision).
    allowed: Option<Vec<usize>>,
    /// The CPU left out now, if any.
    avoided: Option<usize>,
    streak: u32,
    moved_at: Option<u64>,
}

impl Dodge {
    /// `None` with `UIW_PROGRESS_CPUS` set: the CPUs the user named are not second-guessed.
    pub fn from_env() -> Option<Dodge> {
        std::env::var("UIW_PROGRESS_CPUS").ok().filter(|v| !v.trim().is_empty()).is_none().then(Dodge::new)
    }

    pub fn new() -> Dodge {
        Dodge { allowed: None, avoided: None, streak: 0, moved_at: None }
    }

    /// One turn of the progress thread that served streams: it ran on CPU `own`, the
    /// application last polled on `app`; `allowed` gives the CPUs it was placed on (asked once).
    /// Returns the CPUs to move to, when it should move.
    pub fn observe(&mut self, own: usize, app: Option<usize>, now_us: u64, allowed: impl FnOnce() -> Option<Vec<usize>>) -> Option<Vec<usize>> {
        let Some(app) = app.filter(|&a| a == own) else {
            self.streak = 0;
            return None;
        };
        self.streak += 1;
        if self.streak < DODGE_STREAK || self.moved_at.is_some_and(|t| now_us.saturating_sub(t) < DODGE_HOLD_US) {
            return None;
        }
        self.streak = 0;
        if self.allowed.is_none() {
            self.allowed = Some(allowed()?);
        }
        let allowed = self.allowed.as_deref()?;
        let rest: Vec<usize> = allowed.iter().copied().filter(|&c| c != app).collect();
        if rest.is_empty() || self.avoided == Some(app) {
            return None;
        }
        self.avoided = Some(app);
        self.moved_at = Some(now_us);
        Some(rest)
    }

    /// [`Dodge::observe`] for the calling (progress) thread, now: moves it if it should.
    pub fn turn(&mut self, now_us: u64) {
        let Some(own) = uiw_kabi::sys::current_cpu() else { return };
        let Some(cpus) = self.observe(own, app_cpu(), now_us, || uiw_kabi::sys::thread_affinity(0).ok()) else { return };
        match uiw_kabi::sys::set_thread_affinity(&cpus) {
            Ok(()) => crate::uiw_log!(Debug, "progress thread moves to CPUs {}, off the CPU the application polls on ({own})", format_cpu_list(&cpus)),
            Err(e) => crate::uiw_log!(Debug, "progress thread: cannot move to CPUs {}: {e}", format_cpu_list(&cpus)),
        }
    }
}

impl Default for Dodge {
    fn default() -> Dodge {
        Dodge::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_format_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cpu_list(" 5 ").unwrap(), vec![5]);
        assert_eq!(parse_cpu_list("3,1-2,2").unwrap(), vec![1, 2, 3]);
        for bad in ["", "a", "1,", "3-1", "-1", "1-", "99999999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_cpu_list(&[0, 2, 3]), "0,2-3");
        assert_eq!(format_cpu_list(&[0, 1, 2, 3]), "0-3");
        assert_eq!(format_cpu_list(&[7]), "7");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn the_creators_cpus_are_left_when_others_remain() {
        // A reactor pinned to CPU 0 of four.
        assert_eq!(choose(&[0], &[0, 1, 2, 3]), Some(vec![1, 2, 3]));
        // A creator on two of them.
        assert_eq!(choose(&[1, 2], &[0, 1, 2, 3]), Some(vec![0, 3]));
        // An unpinned creator: nothing to leave.
        assert_eq!(choose(&[0, 1], &[0, 1]), None);
        // The whole process confined to one CPU (taskset): stay there.
        assert_eq!(choose(&[1], &[1]), None);
    }

    /// The progress thread moves off the application's CPU after a streak of turns there,
    /// within the CPUs it was placed on, and not again before the hold time.
    #[test]
    fn the_progress_thread_dodges_the_cpu_the_application_polls_on() {
        let placed = || Some(vec![0, 1, 2]);
        let mut d = Dodge::new();
        // No application poll yet, or turns elsewhere: nothing moves.
        for t in 0..10 {
            assert_eq!(d.observe(1, None, t, placed), None);
            assert_eq!(d.observe(1, Some(0), t, placed), None);
        }
        // A streak on the application's CPU, broken once: it starts again.
        for t in 0..DODGE_STREAK as u64 - 1 {
            assert_eq!(d.observe(1, Some(1), t, placed), None);
        }
        assert_eq!(d.observe(2, Some(1), 10, placed), None);
        for t in 0..DODGE_STREAK as u64 - 1 {
            assert_eq!(d.observe(1, Some(1), 20 + t, placed), None);
        }
        assert_eq!(d.observe(1, Some(1), 30, placed), Some(vec![0, 2]));
        // The application moves to CPU 2 and the scheduler follows it there: not within the
        // hold time; the streak that outlasted it moves the thread at once, off CPU 2 (CPU 1
        // is allowed again).
        for t in 0..2 * DODGE_STREAK as u64 {
            assert_eq!(d.observe(2, Some(2), 40 + t, placed), None);
        }
        let later = 30 + DODGE_HOLD_US;
        assert_eq!(d.observe(2, Some(2), later - 1, placed), None);
        assert_eq!(d.observe(2, Some(2), later, placed), Some(vec![0, 1]));
        // Still found on the CPU it left out (someone else set its mask): it does not fight.
        for t in 0..4 * DODGE_STREAK as u64 {
            assert_eq!(d.observe(2, Some(2), 2 * later + t, placed), None);
        }
    }

    /// A progress thread placed on one CPU stays there, and so does one whose CPUs cannot be
    /// read.
    #[test]
    fn a_progress_thread_with_one_cpu_never_moves() {
        for placed in [Some(vec![3]), None] {
            let mut d = Dodge::new();
            for t in 0..10 * DODGE_STREAK as u64 {
                assert_eq!(d.observe(3, Some(3), t * DODGE_HOLD_US, || placed.clone()), None);
            }
        }
    }

    /// The real thing in this process: a thread pinned to one CPU creates a thread and places
    /// it (as `Net::acquire` does), which then runs elsewhere.
    #[test]
    fn a_thread_created_by_a_pinned_thread_moves_off_its_cpu() {
        let all = uiw_kabi::sys::thread_affinity(0).unwrap();
        if all.len() < 2 {
            eprintln!("one CPU: nothing to move to");
            return;
        }
        let pin = all[0];
        let got = std::thread::spawn(move || {
            uiw_kabi::sys::set_thread_affinity(&[pin]).unwrap();
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                wait.recv().unwrap();
                uiw_kabi::sys::thread_affinity(0).unwrap()
            });
            place(&t, None);
            go.send(()).unwrap();
            t.join().unwrap()
        })
        .join()
        .unwrap();
        assert!(!got.is_empty() && !got.contains(&pin), "pinned to {pin}, placed on {got:?}");
    }
}
