//! One QP's data path (MPA, DDP, RDMAP, placement into registered memory) fed a hostile
//! peer's stream: the harness, its input format and its invariants are
//! `uiw_rdmav34::engine::datapath::fuzz` (built with the provider's `fuzzing` feature).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uiw_rdmav34::engine::datapath::fuzz::run(data);
});
