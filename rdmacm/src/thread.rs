//! The library's threads start inside the call that creates them.

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
    let (started, wait) = std::sync::mpsc::sync_channel::<()>(1);
    let h = std::thread::Builder::new().name(name.into()).spawn(move || {
        drop(std::hint::black_box(Box::new(0u64)));
        let _ = started.send(());
        f()
    })?;
    let _ = wait.recv();
    Ok(h)
}
