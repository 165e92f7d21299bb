//! librdmacm.so.1 for uiw (see README.md): rdma-core 44's librdmacm ABI, with iWARP
//! connection setup over the application's own TCP connections and MPA in the provider.
//!
//! `unsafe` lives in the FFI modules only (abi, sys, verbs, cid, uiwcm, fwd, exports,
//! rsock), each block with a `// SAFETY:` line; the logic (channel, cm) forbids it.
#![deny(unsafe_op_in_unsafe_fn)]
// Unit tests build without the versioned trampolines, which are what use the exports.
#![cfg_attr(test, allow(dead_code, unused_imports))]

mod abi;
mod channel;
mod cid;
mod cm;
mod exports;
mod fwd;
mod order;
mod rsock;
mod sys;
mod uiwcm;
mod verbs;

/// Every exported function, for the versioned trampolines of symver.rs.
mod api {
    pub use crate::exports::*;
    pub use crate::rsock::*;
}

#[cfg(not(test))]
include!(concat!(env!("OUT_DIR"), "/symver.rs"));
