//! The set of upstreams changed while the router runs (the config file
//! reloaded): upstreams added, removed, or changed (removed and added again
//! under the same name), with sessions and requests in flight left alone.
//!
//! An added upstream gets a new slot ([`UpstreamId`]); every table kept per
//! upstream is ready for it before it enters the set, then tenants are
//! resolved again, URIs routed, and every session told its lists changed.
//! A removed one leaves the set at once (no new request reaches it) and is
//! closed a grace period later (`server.shutdown_grace`): requests in
//! flight to it finish meanwhile; then sessions' channels to it end, its
//! catalog channel closes, its processes stop.
//!
//! Upstreams acting for each user (`[upstreams.oauth]` with the
//! authorization code or token exchange grant) change the same way; the
//! flows that get users' tokens take the new file's upstreams first, and
//! users' own catalogs are made afresh.

use std::collections::HashMap;
use std::sync::Arc;

use switchboard_core::UpstreamId;
use switchboard_upstream::config::UpstreamConfig;
use switchboard_upstream::{self as upstream, Upstream};

use crate::app::App;
use crate::config::{DelegatedConfig, ExchangedConfig};

/// What a change of the upstream set did, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl Applied {
    /// Whether it changed anything.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// The new file's upstreams acting for each user, by how they get users'
/// tokens.
#[derive(Clone, Copy)]
pub struct ActingForUsers<'a> {
    /// `grant = "authorization_code"`.
    pub delegated: &'a [DelegatedConfig],
    /// `grant = "token_exchange"`.
    pub exchanged: &'a [ExchangedConfig],
}

/// How an upstream's entry in the file differs between two versions.
pub enum Entry<'a> {
    /// In the new version only.
    Added(&'a UpstreamConfig),
    /// In both, different.
    Changed(&'a UpstreamConfig),
    /// In the old version only.
    Removed(&'a str),
}

impl App {
    /// Applies `entries` (each upstream whose entry in the file changed)
    /// to the set of upstreams, with `acting` the new file's upstreams
    /// acting for each user; `tag` names the change the same at every
    /// replica (clients hear of it once).
    pub fn change_upstreams(
        self: &Arc<Self>,
        entries: &[Entry<'_>],
        acting: ActingForUsers<'_>,
        tag: &str,
    ) -> Result<Applied, String> {
        let mut applied = Applied::default();
        let running: HashMap<Arc<str>, Arc<Upstream>> =
            self.upstreams.iter().map(|u| (u.name.clone(), u.clone())).collect();
        let mut adding: Vec<&UpstreamConfig> = Vec::new();
        let mut retiring: Vec<Arc<Upstream>> = Vec::new();
        for entry in entries {
            let name = match entry {
                Entry::Added(c) | Entry::Changed(c) => c.name.as_str(),
                Entry::Removed(name) => name,
            };
            match entry {
                Entry::Added(c) if !running.contains_key(name) => {
                    adding.push(c);
                    applied.added.push(name.to_owned());
                }
                Entry::Changed(c) | Entry::Added(c) => {
                    adding.push(c);
                    retiring.extend(running.get(name).cloned());
                    applied.changed.push(name.to_owned());
                }
                Entry::Removed(_) => {
                    if let Some(old) = running.get(name) {
                        retiring.push(old.clone());
                        applied.removed.push(name.to_owned());
                    }
                }
            }
        }
        if adding.is_empty() && retiring.is_empty() {
            return Ok(applied);
        }
        let acted = |u: &UpstreamConfig| u.per_user;
        let for_users = adding.iter().any(|c| acted(c)) || retiring.iter().any(|u| acted(&u.config));
        // Every table is ready for the new ones before any request finds them.
        let mut added: Vec<UpstreamId> = Vec::new();
        for config in adding {
            let name: Arc<str> = Arc::from(config.name.as_str());
            let made = self.upstreams.add(|id| Upstream {
                id,
                name: name.clone(),
                config: config.clone(),
                transport: upstream::build(config, &self.metrics.upstreams),
            });
            let Some(made) = made else {
                // Nothing entered the set: the ones made so far are retired unused.
                for u in added {
                    self.retire_now(u);
                }
                return Err(format!(
                    "{} upstreams were added since the router started: restart it to add more",
                    upstream::MAX_SLOTS
                ));
            };
            self.metrics.name_upstream(made.id, &made.name);
            self.set_address(&made);
            added.push(made.id);
        }
        if for_users {
            // Before any of the new ones enters: a request finds its flow.
            let touched: Vec<&str> = applied.changed.iter().map(String::as_str).collect();
            self.delegation.set(acting.delegated);
            self.exchange.set(acting.exchanged, &touched);
        }
        for old in &retiring {
            self.upstreams.retire(old.id);
        }
        for &u in &added {
            self.upstreams.enter(u);
        }
        let names: Vec<Arc<str>> =
            (0..self.upstreams.slots()).map(|i| self.upstreams[UpstreamId::new(i)].name.clone()).collect();
        self.directory.set_upstreams(names);
        self.catalog.upstreams_changed();
        // Users' catalogs are made afresh on their next use, from the new set.
        self.user_catalogs.clear();
        for kind in switchboard_protocol::methods::ListKind::ALL {
            self.announce_change(kind, tag);
        }
        // The added ones' lists fetched now, as at start: their health shows,
        // and the first client to list does not wait for them.
        let app = self.clone();
        tokio::spawn(async move {
            app.catalog.ensure(&switchboard_protocol::methods::ListKind::ALL).await;
        });
        tracing::info!(added = ?applied.added, removed = ?applied.removed, changed = ?applied.changed,
            "upstreams changed; sessions told their lists changed");
        let grace = self.config.server.shutdown_grace;
        for old in retiring {
            let app = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                if let Some(app) = app.upgrade() {
                    app.close_retired(&old).await;
                }
            });
        }
        Ok(applied)
    }

    /// An upstream made for a change that did not happen: never in the set.
    fn retire_now(self: &Arc<Self>, u: UpstreamId) {
        let app = self.clone();
        tokio::spawn(async move {
            app.upstreams[u].transport.shutdown().await;
        });
    }

    /// Closes a retired upstream, its grace over: sessions' channels to it,
    /// the catalog's, its transport (processes, pooled connections).
    async fn close_retired(&self, old: &Upstream) {
        self.sessions.drop_upstream(old.id).await;
        self.catalog.close_upstream(old.id).await;
        old.transport.shutdown().await;
        if self.upstreams.find(&old.name).is_none() {
            self.metrics.upstreams.retired(&old.name);
        }
        tracing::info!(upstream = %old.name, "retired upstream closed");
    }
}
