//! Limits shared by every replica: the GCRA state of each subject lives in
//! Redis, and one Lua script checks and takes all of a request's limits
//! atomically in one round trip, using Redis's clock so replicas' clocks do
//! not matter. Callers fall back to local limits on any error; this module
//! must never make a request wait longer than `timeout` for Redis.

use std::sync::Arc;
use std::time::Duration;

use super::{gcra, Check, Decision};
pub use switchboard_core::redis::RedisError;
use switchboard_core::redis::RedisLink;

/// KEYS: one per limit. ARGV: per key, the interval and the capacity (µs).
/// Returns `{0, 0}` when every limit passes (and takes them), or
/// `{i, wait_us}` for the limit `i` (1-based) that refuses.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local news = {}
for i = 1, #KEYS do
  local interval = tonumber(ARGV[2 * i - 1])
  local capacity = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  local new = tat + interval
  if new - now > capacity then
    return {i, new - now - capacity}
  end
  news[i] = new
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%d', news[i]), 'PX', math.floor((news[i] - now) / 1000) + 1000)
end
return {0, 0}
";

/// The limiter's side of the shared Redis link: the script.
pub struct Shared {
    link: Arc<RedisLink>,
    script: redis::Script,
}

impl Shared {
    pub fn new(link: Arc<RedisLink>) -> Arc<Shared> {
        Arc::new(Shared { link, script: redis::Script::new(SCRIPT) })
    }

    /// Runs the script for `checks` (one round trip).
    pub async fn check(&self, checks: &[Check<'_>]) -> Result<Decision, RedisError> {
        let mut invocation = self.script.prepare_invoke();
        for check in checks {
            invocation.key(format!("{}rl:{}", self.link.prefix, check.subject));
        }
        for check in checks {
            let (interval, capacity) = gcra(check.rate);
            invocation.arg(interval).arg(capacity);
        }
        let answer: Vec<i64> =
            self.link.call(|mut connection| async move { Ok(invocation.invoke_async(&mut connection).await?) }).await?;
        match answer.as_slice() {
            [0, _] => Ok(Decision::Allow),
            [i, wait] if *i >= 1 && (*i as usize) <= checks.len() => Ok(Decision::Deny {
                limit: checks[*i as usize - 1].limit,
                retry_after: Duration::from_micros((*wait).max(0) as u64),
            }),
            other => Err(RedisError::Answer(format!("{other:?} from the rate-limit script"))),
        }
    }
}
