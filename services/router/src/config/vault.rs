//! `[vault]`: the key that seals upstream credentials in the database, and
//! the previous keys kept while a rotation reseals what they sealed.

use serde::Deserialize;
use switchboard_vault::{Key, Keyring};

/// `[vault]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVault {
    /// The key (base64, 32 bytes), best given as `SWITCHBOARD__VAULT__KEY`.
    pub key: Option<String>,
    pub key_file: Option<String>,
    /// Older keys, comma-separated (so one environment variable holds them).
    pub previous_keys: Option<String>,
    #[serde(default)]
    pub previous_key_files: Vec<String>,
    pub max_per_tenant: Option<u32>,
}

impl std::fmt::Debug for RawVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawVault").field("key_file", &self.key_file).finish_non_exhaustive()
    }
}

/// The vault's settings: its keys as text (parsed once here, again when
/// the vault is built), never shown by `Debug`.
#[derive(Clone)]
pub struct VaultConfig {
    key: Option<String>,
    previous: Vec<String>,
    /// Most credentials per tenant, its users' included.
    pub max_per_tenant: u32,
}

impl std::fmt::Debug for VaultConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultConfig")
            .field("key", &self.key.as_ref().map(|_| "<set>"))
            .field("previous", &self.previous.len())
            .field("max_per_tenant", &self.max_per_tenant)
            .finish()
    }
}

impl Default for VaultConfig {
    fn default() -> Self {
        VaultConfig { key: None, previous: Vec::new(), max_per_tenant: 10_000 }
    }
}

impl VaultConfig {
    /// The keys (`None`: no key configured).
    pub fn keyring(&self) -> Option<Keyring> {
        let current = Key::parse(self.key.as_deref()?).ok()?;
        let previous = self.previous.iter().filter_map(|k| Key::parse(k).ok()).collect();
        Some(Keyring::new(current, previous))
    }

    /// Whether a key is configured.
    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }
}

/// A key from a file: its text, trimmed.
fn read_key(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map(|t| t.trim().to_owned()).map_err(|e| format!("cannot read {path:?}: {e}"))
}

/// `[vault]` validated: every key read and parsed.
pub fn validate(raw: RawVault, bad: &mut impl FnMut(String, String)) -> VaultConfig {
    fn checked(key: &str, text: String, bad: &mut impl FnMut(String, String)) -> Option<String> {
        match Key::parse(&text) {
            Ok(_) => Some(text),
            Err(e) => {
                bad(key.to_owned(), e.to_string());
                None
            }
        }
    }
    let key = match (raw.key.filter(|k| !k.is_empty()), raw.key_file.filter(|f| !f.is_empty())) {
        (Some(_), Some(_)) => {
            bad("vault.key_file".into(), "give vault.key or vault.key_file, not both".into());
            None
        }
        (Some(key), None) => checked("vault.key", key, bad),
        (None, Some(file)) => match read_key(&file) {
            Ok(text) => checked("vault.key_file", text, bad),
            Err(e) => {
                bad("vault.key_file".into(), e);
                None
            }
        },
        (None, None) => None,
    };
    let mut previous = Vec::new();
    for text in raw.previous_keys.iter().flat_map(|k| k.split(',')).map(str::trim).filter(|k| !k.is_empty()) {
        previous.extend(checked("vault.previous_keys", text.to_owned(), bad));
    }
    for file in &raw.previous_key_files {
        match read_key(file) {
            Ok(text) => previous.extend(checked("vault.previous_key_files", text, bad)),
            Err(e) => bad("vault.previous_key_files".into(), e),
        }
    }
    if key.is_none() && !previous.is_empty() {
        bad("vault.previous_keys".into(), "previous keys need a current one (vault.key or vault.key_file)".into());
    }
    let max_per_tenant = raw.max_per_tenant.unwrap_or(10_000);
    if max_per_tenant == 0 {
        bad("vault.max_per_tenant".into(), "must be at least 1".into());
    }
    VaultConfig { key, previous, max_per_tenant }
}
