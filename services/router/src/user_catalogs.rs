//! Each user's own catalog of the upstreams that act for each user
//! (`per_user`: their tokens come from an authorization or a token
//! exchange): the router's catalog leaves those out, since only a user's
//! own credential lists them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use switchboard_catalog::{Catalog, CatalogConfig};
use switchboard_core::credential::Keychain;
use switchboard_core::policy::Principal;
use switchboard_core::UpstreamId;
use switchboard_upstream::Upstreams;

use crate::keychain::RouterKeychain;

/// Users' catalogs kept on a replica.
pub const MAX_USER_CATALOGS: usize = 1024;

/// A caller: tenant, and user if any.
type Whose = (Arc<str>, Option<Arc<str>>);

pub struct UserCatalogs {
    keychain: Arc<RouterKeychain>,
    catalogs: Mutex<HashMap<Whose, Arc<Catalog>>>,
}

impl UserCatalogs {
    pub fn new(keychain: Arc<RouterKeychain>) -> UserCatalogs {
        UserCatalogs { keychain, catalogs: Mutex::default() }
    }

    /// The catalog of the upstreams acting for each user as `who` sees
    /// them (its requests carry their credentials), made on first use.
    pub fn catalog(&self, who: &Principal, upstreams: &Upstreams, config: &CatalogConfig) -> Arc<Catalog> {
        let key = (who.tenant.name.clone(), who.user.clone());
        let mut catalogs = self.catalogs.lock().expect("lock");
        if let Some(catalog) = catalogs.get(&key) {
            return catalog.clone();
        }
        if catalogs.len() >= MAX_USER_CATALOGS {
            // Dropped, not closed: their channels end with their last user.
            tracing::info!(limit = MAX_USER_CATALOGS, "users' catalogs at their limit: dropped (made again when used)");
            catalogs.clear();
        }
        let keychain = self.keychain.clone();
        let (tenant, user) = (who.tenant.name.clone(), who.user.clone());
        let names = upstreams.clone();
        // Without a credential the lists are asked for all the same (with
        // the upstream's other headers): its refusal's challenge says what
        // to ask the user for.
        let acting: switchboard_catalog::Acting =
            Box::new(move |u: UpstreamId| keychain.credentials(&tenant, user.as_deref(), &names[u].name, false));
        let metrics = Arc::new(switchboard_catalog::metrics::Metrics::new(&prometheus::Registry::new()));
        let catalog = Catalog::new(
            upstreams.clone(),
            config.clone(),
            metrics,
            Box::new(|_| Arc::new(switchboard_upstream::Discard)),
            Box::new(|_| {}),
        )
        .covering(|u| u.config.per_user)
        .acting_for(acting);
        let catalog = Arc::new(catalog);
        catalogs.insert(key, catalog.clone());
        catalog
    }

    /// Drops every user's catalog (the set of upstreams changed): each is
    /// made afresh on its next use. Requests holding one finish with it.
    pub fn clear(&self) {
        self.catalogs.lock().expect("lock").clear();
    }

    /// Drops a user's catalog (their credentials changed): the next list
    /// makes it afresh.
    pub fn forget(&self, tenant: &str, user: Option<&str>) {
        let key = (Arc::from(tenant), user.map(Arc::from));
        self.catalogs.lock().expect("lock").remove(&key);
    }
}
