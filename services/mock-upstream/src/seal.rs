//! Sealing of `requestState` (HMAC-SHA-256 over the state's JSON) and the
//! Base64 codecs the 2026-07-28 path needs, written here so that the mock
//! keeps its small dependency list.
//!
//! A sealed state is `BASE64URL(json) "." BASE64URL(mac)`; any mock with the
//! same key (every mock by default) opens it, so a state survives a restart
//! and works at any replica.

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
];

/// SHA-256 (FIPS 180-4) of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut message = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&bits.to_be_bytes());
    for block in message.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// HMAC-SHA-256 (RFC 2104) of `data` under `key`.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&sha256(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    inner.extend_from_slice(data);
    let mut outer: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    outer.extend_from_slice(&sha256(&inner));
    sha256(&outer)
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn encode(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        let symbols = chunk.len() + 1;
        for i in 0..4 {
            if i < symbols {
                out.push(alphabet[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

fn decode(text: &str, alphabet: &[u8; 64], padded: bool) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let body = if padded {
        if !bytes.len().is_multiple_of(4) {
            return None;
        }
        let pads = bytes.iter().rev().take_while(|&&b| b == b'=').count();
        if pads > 2 {
            return None;
        }
        &bytes[..bytes.len() - pads]
    } else {
        bytes
    };
    if body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for &b in body {
        let v = alphabet.iter().position(|&a| a == b)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    // The bits left over must be zero (a canonical encoding).
    if acc & ((1 << bits) - 1) != 0 {
        return None;
    }
    Some(out)
}

/// Standard Base64 with padding, strictly checked (length, alphabet, padding).
pub fn decode_standard(text: &str) -> Option<Vec<u8>> {
    decode(text, STANDARD, true)
}

/// Standard Base64 with padding.
#[cfg(test)]
pub fn encode_standard(data: &[u8]) -> String {
    encode(data, STANDARD, true)
}

/// Seals `payload` under `key`.
pub fn seal(key: &[u8], payload: &[u8]) -> String {
    let mac = hmac_sha256(key, payload);
    format!("{}.{}", encode(payload, URL_SAFE, false), encode(&mac, URL_SAFE, false))
}

/// Opens a state sealed with [`seal`]; `None` if it was altered or forged.
pub fn open(key: &[u8], sealed: &str) -> Option<Vec<u8>> {
    let (payload, mac) = sealed.split_once('.')?;
    let payload = decode(payload, URL_SAFE, false)?;
    let mac = decode(mac, URL_SAFE, false)?;
    let expected = hmac_sha256(key, &payload);
    // Compare without an early exit.
    let same = mac.len() == expected.len() && mac.iter().zip(expected.iter()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
    same.then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_matches_the_standard_vectors() {
        assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha256(long)), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn base64_round_trips_and_rejects_bad_input() {
        for data in [&b""[..], b"H", b"He", b"Hel", b"Hello", b"Hello, world"] {
            assert_eq!(decode_standard(&encode_standard(data)).as_deref(), Some(data));
        }
        assert_eq!(encode_standard(b"Hello"), "SGVsbG8=");
        assert_eq!(decode_standard("SGVsbG8"), None, "missing padding");
        assert_eq!(decode_standard("SGVs!!!bG8="), None, "characters outside the alphabet");
        assert_eq!(decode_standard("SGVsbG9="), None, "non-zero trailing bits");
    }

    #[test]
    fn a_sealed_state_opens_only_unaltered() {
        let sealed = seal(b"k", br#"{"a":1}"#);
        assert_eq!(open(b"k", &sealed).as_deref(), Some(&br#"{"a":1}"#[..]));
        assert_eq!(open(b"other", &sealed), None);
        assert_eq!(open(b"k", &format!("{sealed}-TAMPERED")), None);
        assert_eq!(open(b"k", &format!("x{sealed}")), None);
    }
}
