//! Flags one thread raises and another clears when it acts on them.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

/// Clears a flag another thread raises and says whether it was raised. The pumps and the
/// progress thread look at such flags (`kick`, `timer`, `polled`, `hup`, a CQ's `deferred`,
/// the lease news, ...) on every turn and nearly always find them lowered: a read first spares
/// each look a locked exchange. A flag raised just after the read is seen by the next look, as
/// one raised just after an exchange would be; a raiser's protocol that orders its raise before
/// something the looker reads first (a fence, a wake-up byte) still holds, the read being
/// sequentially consistent.
pub fn take(f: &AtomicBool) -> bool {
    f.load(Ordering::SeqCst) && f.swap(false, Ordering::SeqCst)
}
