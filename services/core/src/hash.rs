//! A stable, fast, non-cryptographic hash.

/// FNV-1a, 64 bits. Its values are part of the router's behaviour (exposed
/// names shortened with it must not change between versions), so it is
/// written out here rather than taken from a hasher whose output may change.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_of(&[bytes])
}

/// [`fnv1a64`] of the parts one after another, without joining them.
pub fn fnv1a64_of(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a64_of(&[b"foo", b"", b"bar"]), 0x8594_4171_f739_67e8);
    }
}
