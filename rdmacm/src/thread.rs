//! The library's threads start inside the call that creates them.

use std::sync::Arc;

/// Spawns a thread and returns once it has started (its thread-local storage set up, its
/// malloc arena created), as the provider does for its progress thread: a thread's first
/// allocation runs `mmap` + `munmap`, and an application may rewrite those functions in
/// place right after our call returns (libfabric's memory monitor, "memhooks", patches
/// their first bytes with a jump in `fi_domain`; fabtests' MSG servers call `fi_listen`
/// just before it). A thread inside the patched bytes dies with SIGSEGV (issue 13).
pub fn spawn_started<F>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // A mutex and a condvar, not a channel: a blocking channel receive leaves a
    // thread-local behind in the application's thread (valgrind: "possibly lost").
    let started = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let s = started.clone();
    let h = std::thread::Builder::new().name(name.into()).spawn(move || {
        // By now std has set up the thread (its TLS, hence its arena); a first allocation of
        // the thread's own makes sure of the arena even if that ever changes.
        drop(std::hint::black_box(Box::new(0u64)));
        *s.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        s.1.notify_one();
        drop(s);
        f()
    })?;
    let (m, cv) = &*started;
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    while !*g {
        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    Ok(h)
}
