//! This replica's sessions, by id: a map sharded to keep lock hold times
//! short. A cache of the session store for stored sessions. It also counts
//! sessions by tenant and by key, for the caps on them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::Session;

const SHARDS: usize = 16;

/// A session in use when a cap was reached is looked at again no sooner.
const IN_USE_RECHECK_MS: u64 = 1000;

/// The caps a new session must fit under (`None`: no cap).
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    /// Sessions this replica holds, all tenants together.
    pub router: usize,
    /// Sessions of the new session's tenant.
    pub tenant: Option<u32>,
    /// Sessions of the new session's key.
    pub key: Option<u32>,
}

/// The cap a session did not fit under, with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Router(usize),
    Tenant(u32),
    Key(u32),
}

/// Sessions by tenant and by key (a key's counted only when it has one). A
/// tenant's shared session (`for_tenant`) counts for neither.
#[derive(Default)]
struct Owners {
    tenants: HashMap<Arc<str>, u32>,
    keys: HashMap<Arc<str>, u32>,
}

impl Owners {
    fn add(&mut self, s: &Session) {
        if s.for_tenant {
            return;
        }
        *self.tenants.entry(s.tenant.clone()).or_default() += 1;
        if !s.key.is_empty() {
            *self.keys.entry(s.key.clone()).or_default() += 1;
        }
    }

    fn remove(&mut self, s: &Session) {
        if s.for_tenant {
            return;
        }
        fn down(map: &mut HashMap<Arc<str>, u32>, name: &Arc<str>) {
            if let Some(n) = map.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    map.remove(name);
                }
            }
        }
        down(&mut self.tenants, &s.tenant);
        if !s.key.is_empty() {
            down(&mut self.keys, &s.key);
        }
    }

    fn of_tenant(&self, tenant: &str) -> u32 {
        self.tenants.get(tenant).copied().unwrap_or(0)
    }

    fn of_key(&self, key: &str) -> u32 {
        self.keys.get(key).copied().unwrap_or(0)
    }
}

/// One shard's sessions by id. Hashed with foldhash (seeded at random),
/// not SipHash: looked up on every request; the ids in it are the router's
/// own random ones, whatever ids clients send.
type Shard = HashMap<Arc<str>, Arc<Session>, foldhash::fast::RandomState>;

/// The sessions this replica holds.
pub(crate) struct Registry {
    shards: Vec<RwLock<Shard>>,
    count: AtomicU64,
    /// Held around every change of the shards (taken before a shard's
    /// lock, never while holding one), so that counts and maps agree.
    owners: Mutex<Owners>,
    /// No session can expire before this (ms since the sessions' epoch):
    /// the earliest expiry the last scan saw, as later use only delays
    /// expiries and new sessions expire after every older one.
    next_expiry_ms: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            count: AtomicU64::new(0),
            owners: Mutex::default(),
            next_expiry_ms: AtomicU64::new(0),
        }
    }
}

impl Registry {
    /// The shard of `id`: foldhash's, not FNV-1a's (byte by byte, about
    /// 100 instructions for an id, on every request), seeded the same in
    /// every process (a shard is this process's own affair).
    fn shard(&self, id: &str) -> &RwLock<Shard> {
        use std::hash::BuildHasher;
        &self.shards[foldhash::fast::FixedState::default().hash_one(id.as_bytes()) as usize % SHARDS]
    }

    /// Adds a session.
    #[cfg(test)]
    pub fn insert(&self, session: Arc<Session>) {
        let mut owners = self.owners.lock().expect("lock");
        let previous = self.shard(&session.id).write().expect("lock").insert(session.id.clone(), session.clone());
        match previous {
            Some(previous) => owners.remove(&previous),
            None => {
                self.count.fetch_add(1, Ordering::Relaxed);
            }
        }
        owners.add(&session);
    }

    /// Adds a new session if it fits under `quota`; else says which cap it
    /// does not fit under.
    pub fn insert_within(&self, session: Arc<Session>, quota: Quota) -> Result<(), Full> {
        let mut owners = self.owners.lock().expect("lock");
        if self.len() >= quota.router {
            return Err(Full::Router(quota.router));
        }
        if let Some(max) = quota.tenant.filter(|&max| owners.of_tenant(&session.tenant) >= max) {
            return Err(Full::Tenant(max));
        }
        if let Some(max) = quota.key.filter(|&max| !session.key.is_empty() && owners.of_key(&session.key) >= max) {
            return Err(Full::Key(max));
        }
        owners.add(&session);
        self.count.fetch_add(1, Ordering::Relaxed);
        // A fresh random id: nothing to replace.
        self.shard(&session.id).write().expect("lock").insert(session.id.clone(), session);
        Ok(())
    }

    /// Adds a session unless one with its id is there; returns the one kept.
    pub fn insert_if_absent(&self, session: Arc<Session>) -> Arc<Session> {
        let mut owners = self.owners.lock().expect("lock");
        let mut shard = self.shard(&session.id).write().expect("lock");
        if let Some(existing) = shard.get(&session.id) {
            return existing.clone();
        }
        shard.insert(session.id.clone(), session.clone());
        self.count.fetch_add(1, Ordering::Relaxed);
        owners.add(&session);
        session
    }

    /// The session with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.shard(id).read().expect("lock").get(id).cloned()
    }

    /// Removes and returns a session.
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let mut owners = self.owners.lock().expect("lock");
        let removed = self.shard(id).write().expect("lock").remove(id);
        if let Some(session) = &removed {
            self.count.fetch_sub(1, Ordering::Relaxed);
            owners.remove(session);
        }
        removed
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed) as usize
    }

    /// How many sessions `tenant` has here (its shared session aside).
    #[cfg(test)]
    pub fn of_tenant(&self, tenant: &str) -> u32 {
        self.owners.lock().expect("lock").of_tenant(tenant)
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
            let mut owners = self.owners.lock().expect("lock");
            let before = expired.len();
            shard.write().expect("lock").retain(|_, s| {
                if which(s) && s.idle() > idle && !s.busy() {
                    expired.push(s.clone());
                    false
                } else {
                    true
                }
            });
            self.forget(&mut owners, &expired[before..]);
        }
        expired
    }

    /// Removes and returns every session that expired (idle for longer than
    /// `idle`, not busy), unless none can have expired since the last time
    /// (then at once, without looking). Notes the earliest expiry of those
    /// kept.
    pub fn reclaim(&self, idle: Duration, now_ms: u64) -> Vec<Arc<Session>> {
        if now_ms < self.next_expiry_ms.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let idle_ms = idle.as_millis() as u64;
        let mut expired = Vec::new();
        let mut earliest = u64::MAX;
        for shard in &self.shards {
            let mut owners = self.owners.lock().expect("lock");
            let before = expired.len();
            shard.write().expect("lock").retain(|_, s| {
                let expiry = s.last_used_ms().saturating_add(idle_ms);
                // In use (a request in flight, a GET stream, subscriptions
                // kept here): kept, and looked at again a second from now
                // at the soonest, so a long stream does not make every
                // refusal scan.
                let in_use = s.busy() || s.holds_subscriptions();
                if expiry < now_ms && !in_use {
                    expired.push(s.clone());
                    false
                } else {
                    let next = if in_use { expiry.max(now_ms + IN_USE_RECHECK_MS) } else { expiry };
                    earliest = earliest.min(next);
                    true
                }
            });
            self.forget(&mut owners, &expired[before..]);
        }
        self.next_expiry_ms.store(if earliest == u64::MAX { now_ms + idle_ms } else { earliest }, Ordering::Relaxed);
        expired
    }

    fn forget(&self, owners: &mut Owners, removed: &[Arc<Session>]) {
        self.count.fetch_sub(removed.len() as u64, Ordering::Relaxed);
        for session in removed {
            owners.remove(session);
        }
    }
}
