//! Throughput of the MPA CRC32c (RFC 5044 §6) as uiw computes it, over buffers of FPDU
//! sizes: `cargo run --release -p uiw-wire --example crc32c_speed`. It prints GB/s per
//! size; a measurement, not a test (the machine may be shared).

use std::time::Instant;

use uiw_wire::crc::Crc32c;

fn main() {
    let hw = cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("sse4.2");
    println!("CRC32c, SSE4.2 crc32 instruction available: {hw}");
    for &len in &[64usize, 512, 1460, 9000, 65_536, 1 << 20] {
        let buf: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31)).collect();
        let total = 2usize << 30;
        let rounds = (total / len).max(1);
        let mut acc = 0u32;
        let t = Instant::now();
        for _ in 0..rounds {
            let mut c = Crc32c::new();
            c.update(&buf);
            acc ^= c.value();
        }
        let s = t.elapsed().as_secs_f64();
        println!("{len:>8} B: {:6.2} GB/s (checksum {acc:08x})", (rounds * len) as f64 / s / 1e9);
    }
}
