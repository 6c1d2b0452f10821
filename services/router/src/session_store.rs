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
//! costs no live session.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use switchboard_core::redis::{RedisError, RedisLink};
use switchboard_upstream::UpstreamSession;

/// Extra life of a session's Redis hash past its expiry, so that the sweep
/// (not Redis) ends it and can still read its upstream sessions.
const HASH_GRACE_MS: u64 = 600_000;

/// What a session is, whichever replica serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub tenant: String,
    /// The negotiated protocol version.
    pub version: String,
    /// The client's capabilities, as JSON.
    pub capabilities: String,
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

    /// Stores a new session.
    async fn create(&self, id: &str, stored: &Stored) -> Result<(), StoreError>;

    /// Writes back a session the store lost, unless it ended meanwhile or
    /// is live again (another replica wrote it back first).
    async fn repair(&self, id: &str, stored: &Stored) -> Result<Repair, StoreError>;

    /// The session, if live (its expiry slides).
    async fn load(&self, id: &str) -> Result<Option<Stored>, StoreError>;

    /// Slides the expiry of a live session.
    async fn touch(&self, id: &str) -> Result<Touch, StoreError>;

    /// Records the session's upstream session with `upstream` (replacing
    /// any). Nothing happens if the session ended.
    async fn set_upstream(&self, id: &str, upstream: &str, entry: &UpstreamSession) -> Result<(), StoreError>;

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

/// Sessions in this process only.
pub struct MemoryStore {
    idle: Duration,
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    live: HashMap<String, (Stored, Instant)>,
    /// Ended sessions, until their tombstone expires.
    gone: HashMap<String, Instant>,
}

impl MemoryStore {
    pub fn new(idle: Duration) -> MemoryStore {
        MemoryStore { idle, state: Mutex::default() }
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    fn shared(&self) -> bool {
        false
    }

    async fn create(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let mut state = self.state.lock().expect("lock");
        state.gone.remove(id);
        state.live.insert(id.to_owned(), (stored.clone(), Instant::now() + self.idle));
        Ok(())
    }

    async fn repair(&self, id: &str, stored: &Stored) -> Result<Repair, StoreError> {
        let now = Instant::now();
        let mut state = self.state.lock().expect("lock");
        if state.gone.get(id).is_some_and(|until| *until > now) {
            return Ok(Repair::Ended);
        }
        match state.live.get(id) {
            Some((_, expires)) if *expires >= now => Ok(Repair::Live),
            Some(_) => Ok(Repair::Ended),
            None => {
                state.live.insert(id.to_owned(), (stored.clone(), now + self.idle));
                Ok(Repair::Written)
            }
        }
    }

    async fn load(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let now = Instant::now();
        let mut state = self.state.lock().expect("lock");
        match state.live.get_mut(id) {
            Some((stored, expires)) if *expires >= now => {
                *expires = now + self.idle;
                Ok(Some(stored.clone()))
            }
            _ => Ok(None),
        }
    }

    async fn touch(&self, id: &str) -> Result<Touch, StoreError> {
        let now = Instant::now();
        let mut state = self.state.lock().expect("lock");
        let gone = state.gone.get(id).is_some_and(|until| *until > now);
        match state.live.get_mut(id) {
            Some((_, expires)) if *expires >= now => {
                *expires = now + self.idle;
                Ok(Touch::Alive)
            }
            Some(_) => Ok(Touch::Ended),
            None if gone => Ok(Touch::Ended),
            None => Ok(Touch::Unknown),
        }
    }

    async fn set_upstream(&self, id: &str, upstream: &str, entry: &UpstreamSession) -> Result<(), StoreError> {
        if let Some((stored, _)) = self.state.lock().expect("lock").live.get_mut(id) {
            stored.upstreams.insert(upstream.to_owned(), entry.clone());
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let now = Instant::now();
        let mut state = self.state.lock().expect("lock");
        let removed = state.live.remove(id).map(|(stored, _)| stored);
        if removed.is_some() {
            state.gone.insert(id.to_owned(), now + self.idle);
        }
        Ok(removed)
    }

    async fn take_expired(&self, max: usize) -> Result<Vec<(String, Stored)>, StoreError> {
        let now = Instant::now();
        let mut state = self.state.lock().expect("lock");
        state.gone.retain(|_, until| *until > now);
        let ids: Vec<String> =
            state.live.iter().filter(|(_, (_, expires))| *expires < now).map(|(id, _)| id.clone()).take(max).collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some((stored, _)) = state.live.remove(&id) {
                state.gone.insert(id.clone(), now + self.idle);
                out.push((id, stored));
            }
        }
        Ok(out)
    }
}

/// `now` in milliseconds by Redis's clock, and the idle time (ARGV[2]).
const NOW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idle = tonumber(ARGV[2])
";

/// KEYS: hash, zset, tombstone. ARGV: id, idle ms, grace ms, repair (0/1),
/// then field/value pairs. Returns 1 when written. Repair refuses a session
/// with a tombstone or an expired entry (0), or one that is live (2).
const CREATE: &str = r"
if ARGV[4] == '1' then
  if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
  local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if score then
    if tonumber(score) >= now then return 2 end
    return 0
  end
end
for i = 5, #ARGV, 2 do
  if ARGV[4] == '1' then redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  else redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
redis.call('PEXPIRE', KEYS[1], idle + tonumber(ARGV[3]))
redis.call('ZADD', KEYS[2], now + idle, ARGV[1])
redis.call('DEL', KEYS[3])
return 1
";

/// KEYS: hash, zset, tombstone. ARGV: id, idle ms, grace ms, load (0/1).
/// Returns {1, fields} when live (sliding its expiry), {0} when ended, {2}
/// when unknown.
const TOUCH: &str = r"
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if score and tonumber(score) >= now and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('ZADD', KEYS[2], now + idle, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], idle + tonumber(ARGV[3]))
  if ARGV[4] == '1' then return {1, redis.call('HGETALL', KEYS[1])} end
  return {1}
end
if score or redis.call('EXISTS', KEYS[3]) == 1 then return {0} end
return {2}
";

/// KEYS: hash. ARGV: field, value.
const SET_FIELD: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
";

/// KEYS: hash, zset, tombstone. ARGV: id, idle ms (then grace and a flag,
/// unused). Returns {live, fields}.
const REMOVE: &str = r"
local live = redis.call('ZREM', KEYS[2], ARGV[1])
local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
if live == 1 then redis.call('SET', KEYS[3], '1', 'PX', idle) end
return {live, fields}
";

/// KEYS: zset. ARGV: key prefix, idle ms, max. Returns {{id, fields}, …}.
const TAKE_EXPIRED: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - 1, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local hash = ARGV[1] .. 'session:' .. id
  local fields = redis.call('HGETALL', hash)
  redis.call('DEL', hash)
  redis.call('SET', ARGV[1] .. 'session-gone:' .. id, '1', 'PX', idle)
  table.insert(out, {id, fields})
end
return out
";

/// Sessions in Redis, shared by every replica.
pub struct RedisStore {
    link: Arc<RedisLink>,
    idle_ms: u64,
    zset: String,
    create: redis::Script,
    touch: redis::Script,
    set_field: redis::Script,
    remove: redis::Script,
    take_expired: redis::Script,
}

impl RedisStore {
    pub fn new(link: Arc<RedisLink>, idle: Duration) -> RedisStore {
        let script = |body: &str| redis::Script::new(&format!("{NOW}{body}"));
        RedisStore {
            zset: format!("{}sessions", link.prefix),
            idle_ms: idle.as_millis().max(1) as u64,
            create: script(CREATE),
            touch: script(TOUCH),
            set_field: redis::Script::new(SET_FIELD),
            remove: script(REMOVE),
            take_expired: script(TAKE_EXPIRED),
            link,
        }
    }

    fn hash(&self, id: &str) -> String {
        format!("{}session:{id}", self.link.prefix)
    }

    fn tombstone(&self, id: &str) -> String {
        format!("{}session-gone:{id}", self.link.prefix)
    }

    /// Runs a script on one session's keys (hash, expiry set, tombstone)
    /// with ARGV id, idle ms, grace ms, `flag`; returns `{status, fields}`.
    async fn run_on_session(
        &self,
        script: &redis::Script,
        id: &str,
        flag: &str,
    ) -> Result<(i64, Vec<String>), StoreError> {
        let mut invocation = script.prepare_invoke();
        invocation.key(self.hash(id)).key(&self.zset).key(self.tombstone(id));
        invocation.arg(id).arg(self.idle_ms).arg(HASH_GRACE_MS).arg(flag);
        Ok(self
            .link
            .call(|mut c| async move {
                let value: redis::Value = invocation.invoke_async(&mut c).await?;
                status_and_fields(value)
            })
            .await?)
    }

    async fn write(&self, id: &str, stored: &Stored, repair: bool) -> Result<i64, StoreError> {
        let mut invocation = self.create.prepare_invoke();
        invocation.key(self.hash(id)).key(&self.zset).key(self.tombstone(id));
        invocation.arg(id).arg(self.idle_ms).arg(HASH_GRACE_MS).arg(if repair { "1" } else { "0" });
        for (field, value) in fields(stored) {
            invocation.arg(field).arg(value);
        }
        Ok(self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?)
    }
}

/// A stored session as hash fields.
fn fields(stored: &Stored) -> Vec<(String, String)> {
    let mut out = vec![("m".to_owned(), serde_json::to_string(&stored.record).expect("serializable"))];
    for (name, entry) in &stored.upstreams {
        out.push((format!("u:{name}"), serde_json::to_string(entry).expect("serializable")));
    }
    out
}

/// Hash fields (flat: field, value, …) as a stored session; `None` if empty.
fn from_fields(flat: &[String]) -> Result<Option<Stored>, StoreError> {
    let mut record = None;
    let mut upstreams = BTreeMap::new();
    for pair in flat.chunks(2) {
        let [field, value] = pair else { return Err(StoreError::Corrupt("odd field list".into())) };
        if field == "m" {
            record = Some(serde_json::from_str(value).map_err(|e| StoreError::Corrupt(e.to_string()))?);
        } else if let Some(name) = field.strip_prefix("u:") {
            let entry = serde_json::from_str(value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            upstreams.insert(name.to_owned(), entry);
        }
    }
    Ok(record.map(|record| Stored { record, upstreams }))
}

#[async_trait]
impl SessionStore for RedisStore {
    fn shared(&self) -> bool {
        true
    }

    async fn create(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        self.write(id, stored, false).await.map(|_| ())
    }

    async fn repair(&self, id: &str, stored: &Stored) -> Result<Repair, StoreError> {
        Ok(match self.write(id, stored, true).await? {
            1 => Repair::Written,
            2 => Repair::Live,
            _ => Repair::Ended,
        })
    }

    async fn load(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let (state, flat) = self.run_on_session(&self.touch, id, "1").await?;
        if state != 1 {
            return Ok(None);
        }
        from_fields(&flat)
    }

    async fn touch(&self, id: &str) -> Result<Touch, StoreError> {
        let (state, _) = self.run_on_session(&self.touch, id, "0").await?;
        Ok(match state {
            1 => Touch::Alive,
            0 => Touch::Ended,
            _ => Touch::Unknown,
        })
    }

    async fn set_upstream(&self, id: &str, upstream: &str, entry: &UpstreamSession) -> Result<(), StoreError> {
        let mut invocation = self.set_field.prepare_invoke();
        invocation.key(self.hash(id));
        invocation.arg(format!("u:{upstream}")).arg(serde_json::to_string(entry).expect("serializable"));
        let _: i64 = self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?;
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let (live, flat) = self.run_on_session(&self.remove, id, "0").await?;
        if live != 1 {
            return Ok(None);
        }
        from_fields(&flat)
    }

    async fn take_expired(&self, max: usize) -> Result<Vec<(String, Stored)>, StoreError> {
        let mut invocation = self.take_expired.prepare_invoke();
        invocation.key(&self.zset);
        invocation.arg(&self.link.prefix).arg(self.idle_ms).arg(max);
        let taken: Vec<(String, Vec<String>)> =
            self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?;
        let mut out = Vec::with_capacity(taken.len());
        for (id, flat) in taken {
            match from_fields(&flat) {
                Ok(Some(stored)) => out.push((id, stored)),
                // Its hash was gone already: nothing upstream to end.
                Ok(None) => {}
                Err(e) => tracing::warn!(session = %id, error = %e, "an expired session could not be read"),
            }
        }
        Ok(out)
    }
}

/// `{status}` or `{status, {field, value, …}}` from a script.
fn status_and_fields(value: redis::Value) -> Result<(i64, Vec<String>), RedisError> {
    let redis::Value::Array(items) = value else {
        return Err(RedisError::Answer(format!("{value:?} from the session store")));
    };
    let mut items = items.into_iter();
    let status: i64 = match items.next() {
        Some(v) => redis::from_redis_value(&v)?,
        None => return Err(RedisError::Answer("an empty answer from the session store".into())),
    };
    let fields: Vec<String> = match items.next() {
        Some(v) => redis::from_redis_value(&v)?,
        None => Vec::new(),
    };
    Ok((status, fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(tenant: &str) -> Stored {
        Stored {
            record: Record { tenant: tenant.into(), version: "2025-11-25".into(), capabilities: "{}".into() },
            upstreams: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn memory_store_slides_expires_and_remembers_ended_sessions() {
        let store = MemoryStore::new(Duration::from_millis(200));
        store.create("a", &sample("t")).await.unwrap();
        let entry = UpstreamSession { replica: "http://u".into(), session: "s1".into(), version: "v".into() };
        store.set_upstream("a", "up", &entry).await.unwrap();
        assert_eq!(store.load("a").await.unwrap().unwrap().upstreams["up"], entry);
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(store.touch("a").await.unwrap(), Touch::Alive);
        tokio::time::sleep(Duration::from_millis(120)).await;
        // Touched 120 ms ago, idle 200 ms: still live.
        assert!(store.take_expired(10).await.unwrap().is_empty());
        assert_eq!(store.touch("missing").await.unwrap(), Touch::Unknown);
        tokio::time::sleep(Duration::from_millis(250)).await;
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
    }
}
