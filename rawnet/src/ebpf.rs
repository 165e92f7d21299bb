//! The XDP program that steers uiw's TCP into the AF_XDP socket; the `bpf(2)` calls that
//! create its XSK map, load it and attach it are `uiw_kabi::raw::bpf`'s (re-exported here).
//!
//! Why raw instructions: the program is 37 instructions, and assembling it here means a
//! host running uiw needs no clang, no libbpf and no aya (aya 0.15+ needs a newer rustc
//! than the workspace's floor; libxdp's default program would also steal ARP/ND). Each
//! instruction is commented; the verifier checks the rest at load time.
//!
//! The program (`xdp_md` context in r1):
//! IPv4 without options, protocol TCP, not a fragment, destination our address, destination
//! port in uiw's range or in the `ports` hash map (the ports rdma_cm listens on, which the
//! application picks: see [`crate::FrameIo::steer`]) →
//! `bpf_redirect_map(xsks, rx_queue_index, XDP_PASS)`; anything else
//! (ARP, ND, ICMP, ssh, other TCP) → `XDP_PASS` to the kernel. A frame with IP options is
//! passed too (uiw never sends them; the kernel then drops it under `RstGuard`).
//!
//! Multi-buffer: on a socket bound with `XDP_USE_SG` the program is loaded with
//! `BPF_F_XDP_HAS_FRAGS`, and then sees only a frame's first buffer between `data` and
//! `data_end` (a 9000-byte frame on veth: a page's worth). It reads bytes 12..38 only (the
//! Ethernet, IPv4 and TCP-port fields), after instruction 5 checked `data + 38 <= data_end`
//! — the verifier refuses any load it cannot prove inside that bound — so a first buffer
//! shorter than the headers is passed to the kernel, never read beyond.

use std::net::Ipv4Addr;

// The constants in `program` assume little-endian packet loads.
const _: () = assert!(cfg!(target_endian = "little"), "the XDP program assumes a little-endian host");

pub use uiw_kabi::raw::bpf::{attach_xdp, load_xdp, map_delete, map_set, port_set, xsk_map, Insn, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE};

const fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: dst | (src << 4), off, imm }
}

// Opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const AND64_K: u8 = 0x57;
const BE: u8 = 0xdc; // BPF_ALU | BPF_END | BPF_TO_BE
const JGT_X: u8 = 0x2d;
const JEQ_K: u8 = 0x15;
const JA: u8 = 0x05;
const STX_W: u8 = 0x63; // BPF_STX | BPF_MEM | BPF_W
const JNE_K: u8 = 0x55;
const JLT_K: u8 = 0xa5;
const JGT_K: u8 = 0x25;
const JNE32_K: u8 = 0x56; // BPF_JMP32 | BPF_JNE | BPF_K
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const PSEUDO_MAP_FD: u8 = 1;
const FN_REDIRECT_MAP: i32 = 51;
const FN_MAP_LOOKUP_ELEM: i32 = 1;
pub const XDP_PASS: i32 = 2;

/// The program, for an XSK map `map_fd` and a hash map `ports_fd` of further ports (u32 key
/// → any value, see [`port_set`]).
pub fn program(map_fd: i32, ports_fd: i32, ip: Ipv4Addr, ports: (u16, u16)) -> Vec<Insn> {
    // Loads from the packet are little-endian on the hosts uiw runs on (x86-64, arm64 LE):
    // compare with byte-swapped constants, or swap the loaded port.
    let ip_le = u32::from_le_bytes(ip.octets()) as i32;
    const PASS: i16 = 0; // patched below: jump offsets to the `pass` label
    let mut p = vec![
        i(MOV64_X, 6, 1, 0, 0),            // 0: r6 = ctx
        i(LDX_W, 2, 1, 0, 0),              // 1: r2 = ctx->data
        i(LDX_W, 3, 1, 4, 0),              // 2: r3 = ctx->data_end
        i(MOV64_X, 4, 2, 0, 0),            // 3: r4 = data
        i(ADD64_K, 4, 0, 0, 38),           // 4: r4 += 14 + 20 + 4 (through the TCP ports)
        i(JGT_X, 4, 3, PASS, 0),           // 5: if r4 > data_end goto pass
        i(LDX_H, 5, 2, 12, 0),             // 6: r5 = ethertype
        i(JNE_K, 5, 0, PASS, 0x0008),      // 7: != htons(0x0800) → pass
        i(LDX_B, 5, 2, 14, 0),             // 8: r5 = version/IHL
        i(JNE_K, 5, 0, PASS, 0x45),        // 9: IPv4 without options?
        i(LDX_B, 5, 2, 23, 0),             // 10: r5 = protocol
        i(JNE_K, 5, 0, PASS, 6),           // 11: TCP?
        i(LDX_H, 5, 2, 20, 0),             // 12: r5 = flags/fragment offset
        i(AND64_K, 5, 0, 0, 0xff3f),       // 13: MF | offset (little-endian view of 0x3fff)
        i(JNE_K, 5, 0, PASS, 0),           // 14: a fragment → pass
        i(LDX_W, 5, 2, 30, 0),             // 15: r5 = destination address
        i(JNE32_K, 5, 0, PASS, ip_le),     // 16: ours?
        i(LDX_H, 5, 2, 36, 0),             // 17: r5 = TCP destination port
        i(BE, 5, 0, 0, 16),                // 18: to host order
        i(JLT_K, 5, 0, EXTRA, i32::from(ports.0)), // 19: below the range → extra
        i(JGT_K, 5, 0, EXTRA, i32::from(ports.1)), // 20: above the range → extra
        i(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd), // 21-22: redirect: r1 = &xsks
        i(0, 0, 0, 0, 0),
        i(LDX_W, 2, 6, 16, 0),             // 23: r2 = ctx->rx_queue_index
        i(MOV64_K, 3, 0, 0, XDP_PASS),     // 24: r3 = XDP_PASS (when no socket on the queue)
        i(CALL, 0, 0, 0, FN_REDIRECT_MAP), // 25: r0 = bpf_redirect_map(r1, r2, r3)
        i(EXIT, 0, 0, 0, 0),               // 26
        i(MOV64_K, 0, 0, 0, XDP_PASS),     // 27: pass: r0 = XDP_PASS
        i(EXIT, 0, 0, 0, 0),               // 28
        i(STX_W, 10, 5, -4, 0),            // 29: extra: *(u32 *)(fp - 4) = port
        i(MOV64_X, 2, 10, 0, 0),           // 30: r2 = fp
        i(ADD64_K, 2, 0, 0, -4),           // 31: r2 = &port
        i(LD_IMM64, 1, PSEUDO_MAP_FD, 0, ports_fd), // 32-33: r1 = &ports
        i(0, 0, 0, 0, 0),
        i(CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM), // 34: r0 = bpf_map_lookup_elem(r1, r2)
        i(JEQ_K, 0, 0, PASS, 0),           // 35: not a steered port → pass
        i(JA, 0, 0, REDIRECT, 0),          // 36: goto redirect
    ];
    let (pass, extra, redirect) = (27i16, 29i16, 21i16);
    for (k, ins) in p.iter_mut().enumerate() {
        let to = match ins.code {
            JLT_K | JGT_K => extra,
            JGT_X | JNE_K | JNE32_K | JEQ_K => pass,
            JA => redirect,
            _ => continue,
        };
        ins.off = to - k as i16 - 1;
    }
    p
}

const EXTRA: i16 = 0; // patched in `program`
const REDIRECT: i16 = 0; // patched in `program`

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_pass() {
        let p = program(7, 8, Ipv4Addr::new(198, 51, 100, 1), (20000, 24095));
        assert_eq!(p.len(), 37);
        for (k, ins) in p.iter().enumerate() {
            let to = k as i16 + 1 + ins.off;
            match ins.code {
                JGT_X | JNE_K | JNE32_K | JEQ_K => assert_eq!(to, 27, "instruction {k}"),
                JLT_K | JGT_K => assert_eq!(to, 29, "instruction {k}: out of the range → the port set"),
                JA => assert_eq!(to, 21, "instruction {k}: a steered port → redirect"),
                _ => {}
            }
        }
        assert_eq!(p[27].imm, XDP_PASS);
        assert_eq!(p[21].imm, 7);
        assert_eq!(p[32].imm, 8);
        assert_eq!(p[16].imm, i32::from_le_bytes([198, 51, 100, 1]));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }
}
