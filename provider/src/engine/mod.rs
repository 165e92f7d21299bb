//! The engine: device state, verbs objects and the data path, in safe Rust.
//! The FFI layer (`crate::ffi`) is its only caller; it never sees a C pointer.
//!
//! Imports go one way, from the top of this list to the bottom: `context` (the verbs objects
//! of one device context) → `qp` → `net` (listener, progress thread) → `datapath` (a QP's work
//! requests and stream: `rx`, `tx`) and `cm` → `transport` (the `Stream`/`Connector` seam and
//! its implementations, addressing) → `cq`, `srq`,
//! `mr`, `wr`, `events`, `lease`, `spin`, `clock`, `flag`, `affinity`, `user_memory`, `error` and the pure tables (`access`, `limits`,
//! `qp_state`, `device`). The progress thread and the CQs know QPs only through the traits
//! [`net::Endpoint`] and [`cq::PolledQp`], rdma_cm through [`cm::CmQp`].
#![forbid(unsafe_code)]

pub mod access;
pub mod affinity;
pub mod clock;
pub mod cm;
pub mod context;
pub mod cq;
pub mod datapath;
pub mod debug;
pub mod device;
pub mod error;
pub mod events;
pub mod flag;
pub mod lease;
pub mod limits;
pub mod log;
pub mod mr;
pub mod net;
pub mod pace;
pub mod qp;
pub mod qp_state;
pub mod random;
pub mod spin;
pub mod srq;
pub mod stats;
pub mod transport;
pub mod user_memory;
pub mod wr;
