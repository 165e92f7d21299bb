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
#![forbid(unsafe_code)]

use std::fmt;

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
