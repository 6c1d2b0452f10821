//! The session store every replica shares: sessions in Redis, each
//! operation one Lua script (see the module docs of `store`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchboard_core::redis::{RedisError, RedisLink};
use switchboard_upstream::UpstreamSession;

use super::{Claim, Generation, Loaded, Repair, SessionStore, StoreError, Stored, Touch};

/// Extra life of a session's Redis hash past its expiry, so that the sweep
/// (not Redis) ends it and can still read its upstream sessions.
const HASH_GRACE_MS: u64 = 600_000;

/// `now` in milliseconds by Redis's clock, and the idle time: ARGV[2] is
/// `IDLE:AHEAD`, the idle time and how far this store's clock runs ahead of
/// Redis's (0 but in tests, see [`SessionStore::skip_ahead`]), in ms.
const NOW: &str = r"
local t = redis.call('TIME')
local idle_ms, ahead_ms = string.match(ARGV[2], '^(%d+):(%d+)$')
local idle = tonumber(idle_ms)
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ahead_ms)
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

/// KEYS: hash. ARGV: field, stale value ("" for none), fresh value.
/// Returns {1} when `fresh` is recorded (or already was), {2, current}
/// when another value is, {0} when the session is not there.
const CLAIM: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and current ~= ARGV[2] and current ~= ARGV[3] then return {2, {current}} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return {1}
";

/// KEYS: generation key. ARGV[1]: a new token, taken if there is none.
/// Returns {token, age ms}: the token is `random:began_ms`.
const GENERATION: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = redis.call('GET', KEYS[1])
if not token then
  token = ARGV[1] .. ':' .. now
  redis.call('SET', KEYS[1], token)
end
local began = tonumber(string.match(token, ':(%d+)$')) or now
return {token, now - began}
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
    /// [`SessionStore::skip_ahead`]'s total, in ms.
    ahead_ms: AtomicU64,
    zset: String,
    create: redis::Script,
    touch: redis::Script,
    claim: redis::Script,
    generation: redis::Script,
    remove: redis::Script,
    take_expired: redis::Script,
}

impl RedisStore {
    pub fn new(link: Arc<RedisLink>, idle: Duration) -> RedisStore {
        let script = |body: &str| redis::Script::new(&format!("{NOW}{body}"));
        RedisStore {
            zset: format!("{}sessions", link.prefix),
            idle_ms: idle.as_millis().max(1) as u64,
            ahead_ms: AtomicU64::new(0),
            create: script(CREATE),
            touch: script(TOUCH),
            claim: redis::Script::new(CLAIM),
            generation: redis::Script::new(GENERATION),
            remove: script(REMOVE),
            take_expired: script(TAKE_EXPIRED),
            link,
        }
    }

    /// ARGV[2] of the scripts that read the clock (see [`NOW`]).
    fn idle_and_ahead(&self) -> String {
        format!("{}:{}", self.idle_ms, self.ahead_ms.load(Ordering::Relaxed))
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
        invocation.arg(id).arg(self.idle_and_ahead()).arg(HASH_GRACE_MS).arg(flag);
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
        invocation.arg(id).arg(self.idle_and_ahead()).arg(HASH_GRACE_MS).arg(if repair { "1" } else { "0" });
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

    fn skip_ahead(&self, by: Duration) {
        self.ahead_ms.fetch_add(by.as_millis() as u64, Ordering::Relaxed);
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

    async fn load(&self, id: &str) -> Result<Loaded, StoreError> {
        let (state, flat) = self.run_on_session(&self.touch, id, "1").await?;
        Ok(match state {
            1 => from_fields(&flat)?.map_or(Loaded::Unknown, Loaded::Live),
            0 => Loaded::Ended,
            _ => Loaded::Unknown,
        })
    }

    async fn touch(&self, id: &str) -> Result<Touch, StoreError> {
        let (state, _) = self.run_on_session(&self.touch, id, "0").await?;
        Ok(match state {
            1 => Touch::Alive,
            0 => Touch::Ended,
            _ => Touch::Unknown,
        })
    }

    async fn upstream(&self, id: &str, upstream: &str) -> Result<Option<UpstreamSession>, StoreError> {
        let (hash, field) = (self.hash(id), format!("u:{upstream}"));
        let value: Option<String> = self
            .link
            .call(|mut c| async move { Ok(redis::cmd("HGET").arg(hash).arg(field).query_async(&mut c).await?) })
            .await?;
        value.map(|v| serde_json::from_str(&v).map_err(|e| StoreError::Corrupt(e.to_string()))).transpose()
    }

    async fn claim_upstream(
        &self,
        id: &str,
        upstream: &str,
        stale: Option<&UpstreamSession>,
        fresh: &UpstreamSession,
    ) -> Result<Claim, StoreError> {
        let mut invocation = self.claim.prepare_invoke();
        invocation.key(self.hash(id));
        invocation.arg(format!("u:{upstream}"));
        invocation.arg(stale.map(|s| serde_json::to_string(s).expect("serializable")).unwrap_or_default());
        invocation.arg(serde_json::to_string(fresh).expect("serializable"));
        let (status, current) = self
            .link
            .call(|mut c| async move {
                let value: redis::Value = invocation.invoke_async(&mut c).await?;
                status_and_fields(value)
            })
            .await?;
        Ok(match (status, current.first()) {
            (1, _) => Claim::Won,
            (2, Some(current)) => {
                Claim::Lost(serde_json::from_str(current).map_err(|e| StoreError::Corrupt(e.to_string()))?)
            }
            _ => Claim::Gone,
        })
    }

    async fn generation(&self) -> Result<Generation, StoreError> {
        let mut invocation = self.generation.prepare_invoke();
        invocation.key(format!("{}generation", self.link.prefix));
        invocation.arg(&switchboard_core::ids::random_id()[..16]);
        let (token, age_ms): (String, i64) =
            self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?;
        Ok(Generation { token, age: Duration::from_millis(age_ms.max(0) as u64) })
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
        invocation.arg(&self.link.prefix).arg(self.idle_and_ahead()).arg(max);
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
