//! Where sessions live between requests, so that any replica can continue
//! any session.
//!
//! A [`Stored`] session is what a replica needs to take one over: the
//! tenant, the negotiated version, the client's capabilities, and for each
//! upstream it has used, the upstream replica and the upstream's own session
//! id. Two stores implement [`SessionStore`]:
//!
//! - [`MemoryStore`] (the default): one replica, nothing shared;
//! - [`RedisStore`]: shared by every replica. One hash per session
//!   (`{prefix}session:{id}`: field `m` the record, `u:{upstream}` one per
//!   upstream session), a sorted set of expiry times (`{prefix}sessions`),
//!   and a tombstone (`{prefix}session-gone:{id}`) for a while after a
//!   session ends. Every operation is one Lua script, one round trip, timed
//!   by Redis's clock.
//!
//! Expiry slides: every [`touch`](SessionStore::touch) and
//! [`load`](SessionStore::load) pushes it `idle` into the future. Replicas
//! touch a session at most once per `sessions.cache` while they use it, and
//! sweep expired sessions with [`take_expired`](SessionStore::take_expired),
//! which hands each to exactly one replica (to end its upstream sessions).
//!
//! A session that is missing with no tombstone was lost by the store (a
//! Redis restart empties it): [`Touch::Unknown`]. A replica that still has
//! the session writes it back ([`SessionStore::repair`]), so a Redis restart
//! costs no live session. The store's [`generation`](SessionStore::generation)
//! (a token kept in the store) changes when the store loses everything, so
//! that replicas notice a restart even for sessions nobody is using.
//!
//! One upstream session per (session, upstream), whichever replica opens
//! it: recording one is a compare-and-set
//! ([`claim_upstream`](SessionStore::claim_upstream)); a replica that loses
//! the race uses the winner's and closes its own.

mod memory;
mod redis;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchboard_core::redis::{RedisError, RedisLink};
use switchboard_upstream::UpstreamSession;

pub use memory::MemoryStore;
pub use redis::RedisStore;

/// What a session is, whichever replica serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub tenant: String,
    /// The hash of the key that opened it (empty without keys; absent in
    /// records written before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// The user it acts for, whose upstream credentials its channels
    /// carry (absent: the tenant's, and in records written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The negotiated protocol version.
    pub version: String,
    /// The client's capabilities, as JSON.
    pub capabilities: String,
    /// When it was opened (ms since the epoch; 0 in records written before).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub opened_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A session as stored: the record and its upstream sessions by upstream name.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub record: Record,
    pub upstreams: BTreeMap<String, UpstreamSession>,
}

/// What [`SessionStore::touch`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// Live; its expiry now slides from now.
    Alive,
    /// Ended (deleted or expired).
    Ended,
    /// Not there and not known to have ended: the store lost it.
    Unknown,
}

/// What [`SessionStore::load`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Loaded {
    /// Live; its expiry now slides from now.
    Live(Stored),
    /// Ended (deleted or expired).
    Ended,
    /// Not there and not known to have ended: never was, or the store lost it.
    Unknown,
}

impl Loaded {
    /// The session, if live.
    pub fn live(self) -> Option<Stored> {
        match self {
            Loaded::Live(stored) => Some(stored),
            _ => None,
        }
    }
}

/// What [`SessionStore::claim_upstream`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Recorded: the session's upstream session is the one claimed.
    Won,
    /// Another replica recorded this one first: use it.
    Lost(UpstreamSession),
    /// The session is not in the store (it ended, or the store lost it).
    Gone,
}

/// The store's generation: a token that changes when the store loses
/// everything (Redis restarted empty), and how long ago it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub token: String,
    pub age: Duration,
}

/// What [`SessionStore::repair`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// The session was missing; it is written back.
    Written,
    /// It is live already (another replica wrote it back first).
    Live,
    /// It ended; it stays ended.
    Ended,
}

/// Why the store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session store: {0}")]
    Redis(#[from] RedisError),
    #[error("session store: unreadable entry: {0}")]
    Corrupt(String),
}

/// Where sessions live. Every method is one round trip at most.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Whether other replicas see this store (Redis) or only this one.
    fn shared(&self) -> bool;

    /// Moves this store's clock ahead by `by`: what would expire in that
    /// time has expired now (tombstones of ended sessions keep real time).
    /// Tests of expiry use it instead of waiting; the router never calls it.
    fn skip_ahead(&self, by: Duration);

    /// Stores a new session.
    async fn create(&self, id: &str, stored: &Stored) -> Result<(), StoreError>;

    /// Writes back a session the store lost, unless it ended meanwhile or
    /// is live again (another replica wrote it back first).
    async fn repair(&self, id: &str, stored: &Stored) -> Result<Repair, StoreError>;

    /// The session, if live (its expiry slides); else whether it ended or
    /// is unknown.
    async fn load(&self, id: &str) -> Result<Loaded, StoreError>;

    /// Slides the expiry of a live session.
    async fn touch(&self, id: &str) -> Result<Touch, StoreError>;

    /// The session's upstream session with `upstream`, as recorded (its
    /// expiry does not slide).
    async fn upstream(&self, id: &str, upstream: &str) -> Result<Option<UpstreamSession>, StoreError>;

    /// Records `fresh` as the session's upstream session with `upstream`,
    /// if the record is still `stale` (`None`: none recorded): the one
    /// compare-and-set by which replicas agree on one upstream session.
    /// Claiming what is recorded already wins too.
    async fn claim_upstream(
        &self,
        id: &str,
        upstream: &str,
        stale: Option<&UpstreamSession>,
        fresh: &UpstreamSession,
    ) -> Result<Claim, StoreError>;

    /// The store's current [`Generation`], begun by whoever asks first
    /// after the store lost it (or was new).
    async fn generation(&self) -> Result<Generation, StoreError>;

    /// Ends a session; returns what it held, if it was live.
    async fn remove(&self, id: &str) -> Result<Option<Stored>, StoreError>;

    /// Ends up to `max` expired sessions and returns them: each to exactly
    /// one caller, whichever replica asks.
    async fn take_expired(&self, max: usize) -> Result<Vec<(String, Stored)>, StoreError>;
}

/// Builds the configured store.
pub fn build(redis: Option<Arc<RedisLink>>, idle: Duration) -> Arc<dyn SessionStore> {
    match redis {
        Some(link) => Arc::new(RedisStore::new(link, idle)),
        None => Arc::new(MemoryStore::new(idle)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(tenant: &str) -> Stored {
        Stored {
            record: Record {
                tenant: tenant.into(),
                key: String::new(),
                user: None,
                version: "2025-11-25".into(),
                capabilities: "{}".into(),
                opened_ms: 0,
            },
            upstreams: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn memory_store_slides_expires_and_remembers_ended_sessions() {
        let idle = Duration::from_secs(60);
        let store = MemoryStore::new(idle);
        store.create("a", &sample("t")).await.unwrap();
        let entry = UpstreamSession { replica: "http://u".into(), session: "s1".into(), version: "v".into() };
        assert_eq!(store.claim_upstream("a", "up", None, &entry).await.unwrap(), Claim::Won);
        assert_eq!(store.load("a").await.unwrap().live().unwrap().upstreams["up"], entry);
        store.skip_ahead(idle * 6 / 10);
        assert_eq!(store.touch("a").await.unwrap(), Touch::Alive);
        store.skip_ahead(idle * 6 / 10);
        // Touched 0.6 idle ago: still live.
        assert!(store.take_expired(10).await.unwrap().is_empty());
        assert_eq!(store.touch("missing").await.unwrap(), Touch::Unknown);
        store.skip_ahead(idle * 6 / 10);
        let expired = store.take_expired(10).await.unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].1.upstreams["up"].session, "s1");
        assert_eq!(store.touch("a").await.unwrap(), Touch::Ended);
        assert_eq!(
            store.repair("a", &sample("t")).await.unwrap(),
            Repair::Ended,
            "an ended session is not brought back"
        );
        assert!(store.take_expired(10).await.unwrap().is_empty(), "taken once");
        // The tombstone lasts `idle`, then the id is unknown.
        store.skip_ahead(idle + Duration::from_millis(1));
        assert_eq!(store.touch("a").await.unwrap(), Touch::Unknown);
    }
}
