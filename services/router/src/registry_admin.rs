//! The upstream registry's admin operations (the admin API's and the
//! CLI's): entries checked and stored, listed without a header value, and
//! the running router's upstreams with their health.

use serde::Serialize;
use serde_json::{Map, Value};
use switchboard_db::UpstreamRow;

use crate::admin::{Admin, AdminError};
use crate::config::Config;
use crate::registry::{entries, ALLOWED, MAX_ENTRIES};

/// A registered upstream, as the admin API shows it: never a header value.
#[derive(Debug, Clone, Serialize)]
pub struct Registered {
    pub name: String,
    /// The entry, without its headers.
    pub spec: Value,
    /// The names of its headers (their values are sealed).
    pub headers: Vec<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

fn registered(row: &UpstreamRow, header_names: Vec<String>) -> Registered {
    Registered {
        name: row.name.clone(),
        spec: serde_json::from_str(&row.spec).unwrap_or(Value::Null),
        headers: header_names,
        created_at_ms: row.created_at_ms,
        updated_at_ms: row.updated_at_ms,
    }
}

/// Header names and values.
type Headers = Vec<(String, String)>;

/// Checks an entry's form (not yet its values): an object, of allowed
/// keys, HTTP, its name the one it is stored under; its headers taken out.
fn split(name: &str, spec: Value) -> Result<(Map<String, Value>, Headers), AdminError> {
    let Value::Object(mut spec) = spec else {
        return Err(AdminError::Invalid("body: an object with the keys of an [[upstreams]] entry".into()));
    };
    match spec.get("name") {
        None => {
            spec.insert("name".into(), Value::String(name.to_owned()));
        }
        Some(Value::String(n)) if n == name => {}
        Some(_) => return Err(AdminError::Invalid("body: name differs from the upstream's (no renaming)".into())),
    }
    if let Some(key) = spec.keys().find(|k| !ALLOWED.contains(&k.as_str())) {
        return Err(AdminError::Invalid(format!(
            "{key}: not taken by the registry (it takes {}); stdio upstreams, TLS files and OAuth clients are declared in the config file",
            ALLOWED.join(", ")
        )));
    }
    match spec.get("transport").and_then(Value::as_str) {
        Some("http" | "sse") => {}
        _ => {
            return Err(AdminError::Invalid(
                "transport: \"http\" or \"sse\" (stdio upstreams are declared in the config file)".into(),
            ))
        }
    }
    let headers = match spec.remove("headers") {
        None => Vec::new(),
        Some(Value::Object(h)) => h
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(v) => Ok((k, v)),
                _ => Err(AdminError::Invalid(format!("headers.{k}: a string"))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(AdminError::Invalid("headers: an object of header names to values".into())),
    };
    Ok((spec, headers))
}

impl Admin {
    /// The registered upstreams.
    pub async fn registered_upstreams(&self) -> Result<Vec<Registered>, AdminError> {
        let (_, rows) = self.db.load_upstreams().await?;
        Ok(rows
            .iter()
            .map(|row| {
                let names = self
                    .vault
                    .open_upstream_headers(&row.name, &row.key_id, &row.sealed)
                    .map(|h| h.into_iter().map(|(k, _)| k).collect())
                    .unwrap_or_default();
                registered(row, names)
            })
            .collect())
    }

    /// Registers upstream `name` (or replaces its entry) once it checks
    /// out as the routers would read it. Returns it, and whether it
    /// replaced an entry.
    pub async fn put_upstream(&self, name: &str, spec: Value, now_ms: i64) -> Result<(Registered, bool), AdminError> {
        let (spec, headers) = split(name, spec)?;
        let (_, rows) = self.db.load_upstreams().await?;
        if rows.len() >= MAX_ENTRIES && !rows.iter().any(|r| r.name == name) {
            return Err(AdminError::Invalid(format!(
                "the registry holds {MAX_ENTRIES} upstreams, its most; remove one first"
            )));
        }
        // Checked with the others, as every router reads them: the file's
        // upstreams, the registry's, this one in place of its old entry.
        let mut with_this = entries(&rows, &self.vault);
        with_this.retain(|e| e.get("name").and_then(Value::as_str) != Some(name));
        let mut checked = spec.clone();
        if !headers.is_empty() {
            let h: Map<String, Value> = headers.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
            checked.insert("headers".into(), Value::Object(h));
        }
        with_this.push(Value::Object(checked));
        let path = self.config_path.as_deref().filter(|p| p.exists());
        Config::load_with_registry(path, &with_this).map_err(|e| AdminError::Invalid(e.to_string()))?;
        let (key_id, sealed) = if headers.is_empty() {
            (String::new(), String::new())
        } else {
            self.vault.seal_upstream_headers(name, &headers).map_err(|e| AdminError::Invalid(e.to_string()))?
        };
        let row = UpstreamRow {
            name: name.to_owned(),
            spec: Value::Object(spec).to_string(),
            key_id,
            sealed,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        };
        let replaced = self.db.put_upstream(&row).await?;
        tracing::info!(upstream = %name, replaced, "upstream registered");
        Ok((registered(&row, headers.into_iter().map(|(k, _)| k).collect()), replaced))
    }

    /// Reseals registered upstreams' headers with the current vault key
    /// (as the vault's rotation does credentials): `(resealed, already)`.
    pub(crate) async fn reseal_upstreams(&self) -> Result<(u64, u64), AdminError> {
        let (_, rows) = self.db.load_upstreams().await?;
        let current = self.vault.key_ids().into_iter().next().unwrap_or_default();
        let (mut resealed, mut already) = (0, 0);
        for mut row in rows.into_iter().filter(|r| !r.sealed.is_empty()) {
            if row.key_id == current {
                already += 1;
                continue;
            }
            let headers = self.vault.open_upstream_headers(&row.name, &row.key_id, &row.sealed).ok_or_else(|| {
                AdminError::Invalid(format!(
                    "registered upstream {:?}: sealed with vault key {} which is not configured; set its headers again",
                    row.name, row.key_id
                ))
            })?;
            (row.key_id, row.sealed) = self
                .vault
                .seal_upstream_headers(&row.name, &headers)
                .map_err(|e| AdminError::Invalid(e.to_string()))?;
            self.db.put_upstream(&row).await?;
            resealed += 1;
        }
        Ok((resealed, already))
    }

    /// Removes upstream `name` from the registry (a config file upstream of
    /// that name, if any, serves again).
    pub async fn remove_upstream(&self, name: &str) -> Result<(), AdminError> {
        self.db.delete_upstream(name).await?;
        tracing::info!(upstream = %name, "upstream removed from the registry");
        Ok(())
    }

    /// The running router's upstreams (the file's and the registry's) and
    /// how each fares; `None` outside a running router.
    pub fn upstream_status(&self) -> Option<Vec<Value>> {
        let app = self.running.as_ref()?.upgrade()?;
        let registered: std::collections::HashSet<String> =
            self.reloads.as_ref().map(|r| r.registered_names()).unwrap_or_default().into_iter().collect();
        let mut list = Vec::new();
        for upstream in app.upstreams.iter() {
            let status = app.catalog.status(upstream.id);
            let (transport, address) = match &upstream.config.transport {
                switchboard_upstream::config::TransportConfig::Http(h) => ("http", Some(h.url.to_string())),
                switchboard_upstream::config::TransportConfig::Sse(h) => ("sse", Some(h.url.to_string())),
                switchboard_upstream::config::TransportConfig::Stdio(_) => ("stdio", None),
            };
            let mut entry = serde_json::json!({
                "name": &*upstream.name,
                "source": if registered.contains(&*upstream.name) { "registry" } else { "file" },
                "transport": transport,
                "prefix": upstream.config.prefix,
            });
            if let Some(url) = address {
                entry["url"] = Value::String(shown_url(&url));
            }
            if let (Value::Object(e), Value::Object(s)) = (&mut entry, serde_json::json!(status)) {
                e.extend(s);
            }
            list.push(entry);
        }
        Some(list)
    }
}

/// A URL as the API shows it: without user information or query (either
/// may carry a secret).
fn shown_url(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or("");
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_secret() {
        assert_eq!(shown_url("https://u:p@mcp.example.com:8443/mcp?token=x#f"), "https://mcp.example.com:8443/mcp");
        assert_eq!(shown_url("http://127.0.0.1:9/mcp"), "http://127.0.0.1:9/mcp");
        assert_eq!(shown_url("http://a@b"), "http://b");
    }

    #[test]
    fn entries_are_checked_for_form_before_their_values() {
        let (spec, headers) =
            split("gh", serde_json::json!({"transport": "http", "url": "http://x/mcp", "headers": {"A": "b"}}))
                .unwrap();
        assert_eq!(spec["name"], "gh");
        assert!(!spec.contains_key("headers"));
        assert_eq!(headers, [("A".to_owned(), "b".to_owned())]);
        for (bad, says) in [
            (serde_json::json!({"transport": "stdio", "command": "sh"}), "command"),
            (serde_json::json!({"transport": "stdio"}), "config file"),
            (serde_json::json!({"transport": "http", "ca": "/etc/shadow"}), "ca"),
            (serde_json::json!({"transport": "http", "oauth": {}}), "oauth"),
            (serde_json::json!({"transport": "http", "name": "other"}), "renaming"),
            (serde_json::json!({"transport": "http", "headers": {"A": 1}}), "headers.A"),
            (serde_json::json!("http"), "object"),
        ] {
            let err = split("gh", bad.clone()).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
