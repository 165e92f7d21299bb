//! # libuiw-rdmav34.so — the uiw provider for rdma-core's libibverbs
//!
//! libibverbs (private ABI 34, rdma-core v36–v56) `dlopen`s this library for devices named
//! `uiw_*`. Its ELF constructor checks that the running libibverbs matches uiw's mirror of the
//! private ABI and registers the provider; from then on libibverbs calls the ops in [`ffi`],
//! which turn C pointers into the safe objects of [`engine`].
//!
//! - [`ffi`]: the C ABI surface (the only `unsafe` code of the provider).
//! - [`engine`]: device, contexts, PDs, MRs, CQs, QPs, SRQs; `#![forbid(unsafe_code)]`.

pub mod engine;
mod ffi;
