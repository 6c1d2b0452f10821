//! The session store of one replica: sessions in this process's memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use switchboard_upstream::UpstreamSession;

use super::{Claim, Generation, Loaded, Repair, SessionStore, StoreError, Stored, Touch};

/// Sessions in this process only.
pub struct MemoryStore {
    idle: Duration,
    /// When it began: its generation never changes.
    began: Instant,
    state: Mutex<MemoryState>,
    /// How far this store's clock runs ahead of the real one
    /// ([`SessionStore::skip_ahead`]).
    ahead_ms: AtomicU64,
}

#[derive(Default)]
struct MemoryState {
    /// Boxed: a table of many sessions has empty slots, each as large as
    /// what it holds (a pointer, not a whole record).
    live: HashMap<Box<str>, Box<Entry>>,
    /// Ended sessions, until their tombstone expires.
    gone: HashMap<String, Instant>,
}

/// A live session: its record, and when it expires.
struct Entry {
    stored: Stored,
    expires: Instant,
}

impl Entry {
    fn new(stored: &Stored, expires: Instant) -> Box<Entry> {
        Box::new(Entry { stored: stored.clone(), expires })
    }
}

impl MemoryStore {
    pub fn new(idle: Duration) -> MemoryStore {
        MemoryStore { idle, began: Instant::now(), state: Mutex::default(), ahead_ms: AtomicU64::new(0) }
    }

    fn now(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.ahead_ms.load(Ordering::Relaxed))
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    fn shared(&self) -> bool {
        false
    }

    fn skip_ahead(&self, by: Duration) {
        self.ahead_ms.fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }

    async fn create(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let mut state = self.state.lock().expect("lock");
        state.gone.remove(id);
        state.live.insert(id.into(), Entry::new(stored, self.now() + self.idle));
        Ok(())
    }

    async fn repair(&self, id: &str, stored: &Stored) -> Result<Repair, StoreError> {
        let now = self.now();
        let mut state = self.state.lock().expect("lock");
        if state.gone.get(id).is_some_and(|until| *until > now) {
            return Ok(Repair::Ended);
        }
        match state.live.get(id) {
            Some(entry) if entry.expires >= now => Ok(Repair::Live),
            Some(_) => Ok(Repair::Ended),
            None => {
                state.live.insert(id.into(), Entry::new(stored, now + self.idle));
                Ok(Repair::Written)
            }
        }
    }

    async fn load(&self, id: &str) -> Result<Loaded, StoreError> {
        let now = self.now();
        let mut state = self.state.lock().expect("lock");
        let gone = state.gone.get(id).is_some_and(|until| *until > now);
        match state.live.get_mut(id) {
            Some(entry) if entry.expires >= now => {
                entry.expires = now + self.idle;
                Ok(Loaded::Live(entry.stored.clone()))
            }
            Some(_) => Ok(Loaded::Ended),
            None if gone => Ok(Loaded::Ended),
            None => Ok(Loaded::Unknown),
        }
    }

    async fn touch(&self, id: &str) -> Result<Touch, StoreError> {
        let now = self.now();
        let mut state = self.state.lock().expect("lock");
        let gone = state.gone.get(id).is_some_and(|until| *until > now);
        match state.live.get_mut(id) {
            Some(entry) if entry.expires >= now => {
                entry.expires = now + self.idle;
                Ok(Touch::Alive)
            }
            Some(_) => Ok(Touch::Ended),
            None if gone => Ok(Touch::Ended),
            None => Ok(Touch::Unknown),
        }
    }

    async fn upstream(&self, id: &str, upstream: &str) -> Result<Option<UpstreamSession>, StoreError> {
        let state = self.state.lock().expect("lock");
        Ok(state.live.get(id).and_then(|entry| entry.stored.upstreams.get(upstream).cloned()))
    }

    async fn claim_upstream(
        &self,
        id: &str,
        upstream: &str,
        stale: Option<&UpstreamSession>,
        fresh: &UpstreamSession,
    ) -> Result<Claim, StoreError> {
        let mut state = self.state.lock().expect("lock");
        let Some(Entry { stored, .. }) = state.live.get_mut(id).map(|e| &mut **e) else { return Ok(Claim::Gone) };
        match stored.upstreams.get(upstream) {
            Some(current) if Some(current) != stale && current != fresh => Ok(Claim::Lost(current.clone())),
            _ => {
                stored.upstreams.insert(upstream.to_owned(), fresh.clone());
                Ok(Claim::Won)
            }
        }
    }

    async fn generation(&self) -> Result<Generation, StoreError> {
        Ok(Generation { token: "memory".into(), age: self.began.elapsed() })
    }

    async fn remove(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let now = self.now();
        let mut state = self.state.lock().expect("lock");
        let removed = state.live.remove(id).map(|entry| entry.stored);
        if removed.is_some() {
            state.gone.insert(id.to_owned(), now + self.idle);
        }
        Ok(removed)
    }

    async fn take_expired(&self, max: usize) -> Result<Vec<(String, Stored)>, StoreError> {
        let now = self.now();
        let mut state = self.state.lock().expect("lock");
        state.gone.retain(|_, until| *until > now);
        let ids: Vec<Box<str>> =
            state.live.iter().filter(|(_, entry)| entry.expires < now).map(|(id, _)| id.clone()).take(max).collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(entry) = state.live.remove(&id) {
                let id = String::from(id);
                state.gone.insert(id.clone(), now + self.idle);
                out.push((id, entry.stored));
            }
        }
        Ok(out)
    }
}
