//! Who is calling: the authenticate phase's extension point.
//!
//! An [`Authenticator`] turns a request's credentials into a [`Principal`]
//! (its tenant, and the key that names the caller in records and limits),
//! or says why not. API keys are the first kind; another (OAuth bearer
//! tokens) is another implementation, chosen when the router starts.

use std::sync::Arc;

use http::HeaderMap;
use switchboard_core::policy::{AuthFailure, Principal};
use switchboard_tenancy::Directory;

/// Authenticates requests.
pub trait Authenticator: Send + Sync {
    /// The caller of a request, from its headers. A refusal is counted
    /// (`switchboard_auth_failures_total`).
    fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthFailure>;
}

/// API keys (`Authorization: Bearer sb_…` or `X-API-Key`), checked against
/// the tenant directory's in-memory snapshot (no database on the request
/// path). With `auth.mode = "none"`, every request is the open tenant's.
pub struct ApiKeys(pub Arc<Directory>);

impl Authenticator for ApiKeys {
    fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthFailure> {
        self.0.authenticate(headers, switchboard_core::time::now_ms())
    }
}
