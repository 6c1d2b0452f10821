//! `[mtls]`: client certificates on the MCP listener, for machine clients.
//! A certificate signed by the configured CA names its tenant by its
//! subject.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Deserialize;

use crate::subject::Subject;

/// `[mtls]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMtls {
    pub ca: Option<String>,
    pub required: Option<bool>,
    #[serde(default)]
    pub subjects: BTreeMap<String, String>,
}

/// Client certificates on the MCP listener.
#[derive(Debug, Clone)]
pub struct MtlsConfig {
    /// The CA bundle (PEM) client certificates must chain to. Read at start
    /// (and by `check-config`).
    pub ca: PathBuf,
    /// Refuse the TLS handshake of a client without a certificate (else
    /// such a client authenticates with a key or token, as without mTLS).
    pub required: bool,
    /// Certificate subject → tenant name.
    pub subjects: HashMap<Subject, String>,
}

/// `[mtls]` validated; `server_tls`: whether the MCP listener has TLS.
pub fn validate(raw: RawMtls, server_tls: bool, bad: &mut impl FnMut(String, String)) -> Option<MtlsConfig> {
    let ca = match raw.ca.filter(|ca| !ca.is_empty()) {
        Some(ca) => PathBuf::from(ca),
        None => {
            if raw.required.is_some() || !raw.subjects.is_empty() {
                bad("mtls.ca".into(), "is required for client certificates (the CA that signs them)".into());
            }
            return None;
        }
    };
    if !server_tls {
        bad(
            "mtls.ca".into(),
            "client certificates need TLS on the MCP listener: set server.tls_cert and tls_key".into(),
        );
    }
    let required = raw.required.unwrap_or(false);
    if let Err(e) = crate::tls::client_verifier(&ca, required) {
        bad("mtls.ca".into(), e.to_string());
    }
    let mut subjects = HashMap::new();
    for (written, tenant) in raw.subjects {
        let key = format!("mtls.subjects.{written:?}");
        if tenant.is_empty() {
            bad(key, "must name a tenant".into());
            continue;
        }
        match Subject::parse(&written) {
            Ok(subject) => {
                if let Some(before) = subjects.insert(subject, tenant) {
                    bad(key, format!("names the same subject as another entry (for tenant {before:?})"));
                }
            }
            Err(e) => bad(key, e),
        }
    }
    Some(MtlsConfig { ca, required, subjects })
}
