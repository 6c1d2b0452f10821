//! Vault keys: AES-256-GCM, each named by an id derived from it, so that a
//! record names the key that sealed it without revealing anything of it.
//!
//! A sealed value is base64(nonce ‖ ciphertext ‖ tag), with a fresh random
//! 96-bit nonce per seal and the record's identity (tenant, user, upstream,
//! kind) as associated data: a sealed value copied onto another record does
//! not open.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use crate::VaultError;

/// One AES-256-GCM key and its id.
pub struct Key {
    id: String,
    key: LessSafeKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Key {
    /// A key from its text: 32 bytes in standard base64 (what
    /// [`Key::generate`] prints).
    pub fn parse(text: &str) -> Result<Key, VaultError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| VaultError::BadKey("is not base64 (make one with `switchboard vault new-key`)".into()))?;
        if bytes.len() != 32 {
            return Err(VaultError::BadKey(format!(
                "is {} bytes; a vault key is 32 bytes (make one with `switchboard vault new-key`)",
                bytes.len()
            )));
        }
        let digest = Sha256::new().chain_update(b"switchboard vault key id\0").chain_update(&bytes).finalize();
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes).expect("32 bytes"));
        Ok(Key { id: hex::encode(&digest[..8]), key })
    }

    /// A new random key, as text.
    pub fn generate() -> String {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes).expect("the OS provides randomness");
        STANDARD.encode(bytes)
    }

    /// Its id: 16 hex digits of a hash of it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Seals `plain`, bound to `aad`.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).expect("the OS provides randomness");
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[NONCE_LEN..])
            .expect("a value within AES-GCM's limits");
        out.extend_from_slice(tag.as_ref());
        STANDARD.encode(out)
    }

    /// Opens a sealed value; `None` if it was not sealed by this key for `aad`.
    pub fn open(&self, aad: &[u8], sealed: &str) -> Option<Vec<u8>> {
        let mut raw = STANDARD.decode(sealed).ok()?;
        if raw.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return None;
        }
        let nonce = Nonce::try_assume_unique_for_key(&raw[..NONCE_LEN]).ok()?;
        let plain = self.key.open_in_place(nonce, Aad::from(aad), &mut raw[NONCE_LEN..]).ok()?;
        Some(plain.to_vec())
    }
}

/// The key that seals, and older ones that still open what they sealed
/// until a rotation reseals it.
#[derive(Debug)]
pub struct Keyring {
    current: Key,
    previous: Vec<Key>,
}

impl Keyring {
    pub fn new(current: Key, previous: Vec<Key>) -> Keyring {
        let mut previous = previous;
        previous.retain(|k| k.id != current.id);
        Keyring { current, previous }
    }

    /// The key new values are sealed with.
    pub fn current(&self) -> &Key {
        &self.current
    }

    /// The key of id `id`, current or previous.
    pub fn get(&self, id: &str) -> Option<&Key> {
        std::iter::once(&self.current).chain(&self.previous).find(|k| k.id == id)
    }

    /// The ids of every key, the current one first.
    pub fn ids(&self) -> Vec<&str> {
        std::iter::once(&self.current).chain(&self.previous).map(|k| k.id.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_opens_with_its_key_and_its_record_only() {
        let key = Key::parse(&Key::generate()).unwrap();
        let sealed = key.seal(b"acme\0alice\0github\0headers", b"Bearer secret");
        assert!(!sealed.contains("secret"));
        assert_eq!(key.open(b"acme\0alice\0github\0headers", &sealed).unwrap(), b"Bearer secret");
        // Another record's identity, another key, a flipped bit: nothing.
        assert!(key.open(b"acme\0bob\0github\0headers", &sealed).is_none());
        let other = Key::parse(&Key::generate()).unwrap();
        assert!(other.open(b"acme\0alice\0github\0headers", &sealed).is_none());
        let mut raw = STANDARD.decode(&sealed).unwrap();
        raw[NONCE_LEN + 1] ^= 1;
        assert!(key.open(b"acme\0alice\0github\0headers", &STANDARD.encode(raw)).is_none());
        assert!(key.open(b"x", "bm9wZQ==").is_none());
        // Each seal has its own nonce.
        assert_ne!(key.seal(b"a", b"v"), key.seal(b"a", b"v"));
    }

    #[test]
    fn a_key_id_names_the_key_and_reveals_nothing_of_it() {
        let text = Key::generate();
        let (a, b) = (Key::parse(&text).unwrap(), Key::parse(&format!(" {text}\n")).unwrap());
        assert_eq!(a.id(), b.id());
        assert_eq!(a.id().len(), 16);
        assert_ne!(a.id(), Key::parse(&Key::generate()).unwrap().id());
        assert!(!format!("{a:?}").contains(&text[..8]));
        assert!(Key::parse("not base64!").unwrap_err().to_string().contains("not base64"));
        assert!(Key::parse("c2hvcnQ=").unwrap_err().to_string().contains("32 bytes"));
    }

    #[test]
    fn a_keyring_finds_current_and_previous_keys() {
        let (old, new) = (Key::generate(), Key::generate());
        let ring = Keyring::new(Key::parse(&new).unwrap(), vec![Key::parse(&old).unwrap(), Key::parse(&new).unwrap()]);
        let (old_id, new_id) = (Key::parse(&old).unwrap().id, Key::parse(&new).unwrap().id);
        assert_eq!(ring.ids(), vec![new_id.as_str(), old_id.as_str()]);
        assert_eq!(ring.current().id(), new_id);
        assert!(ring.get(&old_id).is_some() && ring.get("0000000000000000").is_none());
    }
}
