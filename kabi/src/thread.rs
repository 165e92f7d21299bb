//! Threads the provider and the librdmacm drop-in start inside an application's call.
#![forbid(unsafe_code)]

use std::sync::Arc;

/// Spawns a thread and returns once it has started: its thread-local storage is set up and
/// its malloc arena exists, so the thread no longer runs libc's memory-mapping calls on its
/// own schedule while the caller goes on.
///
/// Why (issue 13): a new thread's first touch of the library's thread-locals (Rust's
/// thread start-up does it) makes glibc allocate its TLS block, and that first `malloc` of
/// the thread creates an arena: `mmap` + `munmap`. Returned to at once, the application
/// may meanwhile rewrite those very functions: libfabric's memory monitor ("memhooks",
/// `fi_domain`) patches the first 13 bytes of `mmap`, `munmap`, `madvise`, `brk`… in place
/// with a jump. A thread inside `munmap` while its bytes change resumes in the middle of
/// the patch and dies with SIGSEGV (fabtests' servers: `__munmap+0x9` ← `malloc` ←
/// `__tls_get_addr` ← `std::thread::current::set_current` in `uiw-progress`). Waiting here
/// keeps the thread's start-up inside the verbs call that started it.
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
