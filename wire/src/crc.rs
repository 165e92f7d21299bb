//! MPA CRC32c (RFC 5044 §4.4 / §6, Castagnoli polynomial).
//!
//! The CRC covers the whole FPDU: ULPDU length field, ULPDU, and pad. It is
//! stored in the last 4 bytes of the FPDU. RFC 5044 §6 transmits the CRC
//! register "high order bit first" after the RFC 3385 bit reflection, which
//! in practice means the little-endian byte order of the usual CRC32c value
//! (least significant byte first on the wire): this is what siw emits and
//! what Wireshark verifies (checked against the `-crc` captures).

/// Incremental CRC32c.
#[derive(Clone, Copy, Debug, Default)]
pub struct Crc32c(u32);

impl Crc32c {
    pub fn new() -> Self {
        Crc32c(0)
    }
    pub fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }
    pub fn value(&self) -> u32 {
        self.0
    }
    /// The 4 CRC bytes as they appear on the wire.
    pub fn to_wire(&self) -> [u8; 4] {
        self.0.to_le_bytes()
    }
}

/// CRC32c of `data` in one call.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Read a CRC from its 4 wire bytes.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn check_value() {
        // RFC 3720 B.4 test vector: 32 bytes of zero.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a9136aa);
        let mut c = Crc32c::new();
        c.update(&[0u8; 10]);
        c.update(&[0u8; 22]);
        assert_eq!(c.value(), 0x8a9136aa);
        assert_eq!(c.to_wire(), [0xaa, 0x36, 0x91, 0x8a]);
    }
}
