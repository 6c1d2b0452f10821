//! Whose credentials a request to an upstream carries: the vault's (a
//! user's, else its tenant's), or for an upstream taking exchanged tokens
//! the user's exchanged token first.

use std::sync::Arc;

use switchboard_core::credential::{Credential, Credentials, Keychain, Missing};
use switchboard_vault::Vault;

use crate::token_exchange::TokenExchange;

pub struct RouterKeychain {
    pub vault: Vault,
    pub exchange: Arc<TokenExchange>,
}

impl RouterKeychain {
    fn exchanging(&self, upstream: &str) -> Option<&Arc<TokenExchange>> {
        Some(&self.exchange).filter(|x| x.covers(upstream))
    }

    /// What a request of `user` of `tenant` to `upstream` carries now (as
    /// [`Keychain::credentials`]' `current`), without building anything
    /// when there is nothing to look up.
    pub fn current(
        &self,
        tenant: &str,
        user: Option<&str>,
        upstream: &str,
        required: bool,
    ) -> Result<Option<Arc<Credential>>, Missing> {
        match self.exchanging(upstream) {
            Some(_) => self.credentials(tenant, user, upstream, required).current(),
            None => self.vault.current(tenant, user, upstream, required),
        }
    }
}

impl Keychain for RouterKeychain {
    fn credentials(&self, tenant: &str, user: Option<&str>, upstream: &str, required: bool) -> Arc<dyn Credentials> {
        match self.exchanging(upstream) {
            Some(x) => x.credentials(tenant, user, upstream, self.vault.credentials(tenant, user, upstream, false)),
            None => self.vault.credentials(tenant, user, upstream, required),
        }
    }
}
