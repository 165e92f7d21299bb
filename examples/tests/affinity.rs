//! The progress thread does not share the core of a pinned thread that starts it (SPDK's
//! reactor): `examples/c/affinity.c` pins the thread that creates the process's first QP to
//! one CPU, and reports the CPUs the progress thread may run on. `UIW_PROGRESS_CPUS` names
//! them instead.
//!
//! Needs `cargo build --workspace` first, root, and a process allowed on two CPUs or more.

use std::process::Output;

use uiw_examples::{build_c_example, device_lock, device_test_artifacts, out_dir, show, skip, Published};

/// The pinned CPU and the progress thread's CPUs, as affinity.c printed them; `None` when
/// the process has a single CPU.
fn report(out: &Output) -> Option<(usize, Vec<usize>)> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "affinity failed\n{}", show(out));
    if stdout.lines().any(|l| l == "ONE_CPU") {
        return None;
    }
    let field = |k: &str| stdout.lines().find_map(|l| l.strip_prefix(k)).unwrap_or_else(|| panic!("no {k}line\n{}", show(out))).to_owned();
    let pinned: usize = field("PINNED ").parse().unwrap();
    Some((pinned, cpu_list(&field("PROGRESS "))))
}

fn cpu_list(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for item in s.trim().split(',') {
        match item.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => v.push(item.parse().unwrap()),
        }
    }
    v
}

#[test]
fn the_progress_thread_leaves_its_pinned_creators_cpu() {
    let test = "the_progress_thread_leaves_its_pinned_creators_cpu";
    let Some(artifacts) = device_test_artifacts(test) else { return };
    let out = out_dir(env!("CARGO_TARGET_TMPDIR"));
    let exe = build_c_example("affinity", &out);
    let _l = device_lock();
    let dev = Published::up(&artifacts, &out).unwrap_or_else(|e| panic!("{test}: {e}"));

    let o = dev.run(&[exe.as_os_str()], &[("UIW_PROGRESS_CPUS", "")]);
    let Some((pinned, progress)) = report(&o) else {
        skip(test, "the process may use one CPU only");
        return;
    };
    assert!(!progress.is_empty() && !progress.contains(&pinned), "pinned to {pinned}, progress thread on {progress:?}\n{}", show(&o));

    // Named: even the creator's CPU, if that is what is asked for.
    let o = dev.run(&[exe.as_os_str()], &[("UIW_PROGRESS_CPUS", &pinned.to_string())]);
    let (_, progress) = report(&o).unwrap();
    assert_eq!(progress, vec![pinned], "UIW_PROGRESS_CPUS={pinned}\n{}", show(&o));
}
