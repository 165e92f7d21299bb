//! Explanations of what went wrong, through the provider's log (`engine::log`: `UIW_DEBUG=1`,
//! or rdma-core's `VERBS_LOG_LEVEL`/`VERBS_LOG_FILE`): one line each, saying what was wrong
//! and, where a limit was crossed, the limit.

use std::fmt;

/// A refused verb, in the engine's words (`VERBS_LOG_LEVEL` 3, information): `uiw:
/// ibv_create_cq refused: cqe = 0 is outside 1..=65536 (max_cqe)`. The errno it returns is
/// the FFI edge's business (`ffi::errno`).
pub fn refused(verb: &str, why: fmt::Arguments<'_>) {
    crate::uiw_log!(Info, "{verb} refused: {why}");
}

/// Any other explanation: why a stream or QP failed (level 4, debug).
pub fn why(what: fmt::Arguments<'_>) {
    crate::uiw_log!(Debug, "{what}");
}
