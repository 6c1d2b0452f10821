//! This replica's sessions, by id: a map sharded to keep lock hold times
//! short. A cache of the session store for stored sessions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use switchboard_core::hash::fnv1a64;

use crate::Session;

const SHARDS: usize = 16;

/// The sessions this replica holds.
pub(crate) struct Registry {
    shards: Vec<RwLock<HashMap<Arc<str>, Arc<Session>>>>,
    count: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Registry { shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(), count: AtomicU64::new(0) }
    }
}

impl Registry {
    fn shard(&self, id: &str) -> &RwLock<HashMap<Arc<str>, Arc<Session>>> {
        &self.shards[fnv1a64(id.as_bytes()) as usize % SHARDS]
    }

    /// Adds a session.
    pub fn insert(&self, session: Arc<Session>) {
        if self.shard(&session.id).write().expect("lock").insert(session.id.clone(), session).is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds a session unless one with its id is there; returns the one kept.
    pub fn insert_if_absent(&self, session: Arc<Session>) -> Arc<Session> {
        let mut shard = self.shard(&session.id).write().expect("lock");
        if let Some(existing) = shard.get(&session.id) {
            return existing.clone();
        }
        shard.insert(session.id.clone(), session.clone());
        self.count.fetch_add(1, Ordering::Relaxed);
        session
    }

    /// The session with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.shard(id).read().expect("lock").get(id).cloned()
    }

    /// Removes and returns a session.
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let removed = self.shard(id).write().expect("lock").remove(id);
        if removed.is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed) as usize
    }

    /// Every live session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.shards.iter().flat_map(|s| s.read().expect("lock").values().cloned().collect::<Vec<_>>()).collect()
    }

    /// Removes and returns the sessions `which` picks that are idle for
    /// longer than `idle` and not busy.
    pub fn take_expired(&self, idle: Duration, which: impl Fn(&Session) -> bool) -> Vec<Arc<Session>> {
        let mut expired = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.write().expect("lock");
            shard.retain(|_, s| {
                if which(s) && s.idle() > idle && !s.busy() {
                    expired.push(s.clone());
                    false
                } else {
                    true
                }
            });
        }
        self.count.fetch_sub(expired.len() as u64, Ordering::Relaxed);
        expired
    }
}
