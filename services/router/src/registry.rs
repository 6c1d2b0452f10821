//! The upstream registry: MCP servers added, changed and removed through
//! the admin API and the CLI while the routers run. An entry has the keys
//! of a config file's `[[upstreams]]` entry (HTTP transports only: see
//! [`ALLOWED`]) and is stored in the database, its header values sealed
//! with the vault key. Every replica reads the registry when it changes
//! (notified on PostgreSQL, looked at every 2 s on both) and applies it
//! with the config file (`reload.rs`): an entry wins over the file's
//! upstream of the same name, as the database's tenants do.
//!
//! An entry is checked before it is stored, as the router would read it
//! (`registry_admin.rs`): with the configuration file's `[egress]`, names
//! and prefixes, and the other entries.

use serde_json::{Map, Value};
use switchboard_db::UpstreamRow;
use switchboard_vault::Vault;

/// The keys an entry may have. Anything that would have the router's host
/// run a command or read a local file (stdio upstreams, TLS files, OAuth
/// client secrets) belongs in the config file, which only the host's
/// operator writes.
pub const ALLOWED: &[&str] = &[
    "name",
    "transport",
    "prefix",
    "timeout",
    "list_timeout",
    "url",
    "urls",
    "health_interval",
    "headers",
    "http2",
    "connect_timeout",
    "pool_max_idle",
    "credentials",
];

/// Registered upstreams, at most (each is an upstream every replica serves).
pub const MAX_ENTRIES: usize = 1000;

/// The registry's rows as `[[upstreams]]` entries, their headers opened;
/// an entry that cannot be opened (sealed with a key this replica does
/// not have, or altered) is left out, logged.
pub fn entries(rows: &[UpstreamRow], vault: &Vault) -> Vec<Value> {
    let mut entries = Vec::with_capacity(rows.len());
    for row in rows {
        let Ok(Value::Object(mut spec)) = serde_json::from_str::<Value>(&row.spec) else {
            tracing::error!(upstream = %row.name, "registered upstream is not a JSON object; left out");
            continue;
        };
        if !row.sealed.is_empty() {
            let Some(headers) = vault.open_upstream_headers(&row.name, &row.key_id, &row.sealed) else {
                tracing::error!(upstream = %row.name, key_id = %row.key_id,
                    "registered upstream's headers cannot be opened (unknown vault key, or altered); left out");
                continue;
            };
            let headers: Map<String, Value> = headers.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
            spec.insert("headers".into(), Value::Object(headers));
        }
        spec.insert("name".into(), Value::String(row.name.clone()));
        entries.push(Value::Object(spec));
    }
    entries
}

/// The registry as this replica last applied it: entries by name.
#[derive(Default)]
pub struct Applied {
    pub version: Option<i64>,
    pub entries: Vec<Value>,
}

impl Applied {
    /// The names of the registered upstreams.
    pub fn names(&self) -> Vec<String> {
        self.entries.iter().filter_map(|e| e.get("name")?.as_str().map(str::to_owned)).collect()
    }
}

/// Reads the registry if it changed since `applied` (its version moved):
/// `Some(entries)` to apply, `None` if unchanged. An error: the database
/// cannot be reached (the running set is kept).
pub async fn read_if_changed(
    db: &switchboard_db::Database,
    vault: &Vault,
    applied: Option<i64>,
) -> Result<Option<(i64, Vec<Value>)>, switchboard_db::DbError> {
    let version = db.upstreams_version().await?;
    if Some(version) == applied {
        return Ok(None);
    }
    let (version, rows) = db.load_upstreams().await?;
    Ok(Some((version, entries(&rows, vault))))
}
