//! Limits shared by every replica: the GCRA state of each subject lives in
//! Redis, and one Lua script checks and takes all of a request's limits
//! atomically in one round trip, using Redis's clock so replicas' clocks do
//! not matter. Callers fall back to local limits on any error; this module
//! must never make a request wait longer than `timeout` for Redis.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tokio::sync::OnceCell;

use super::{gcra, Check, Decision};

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

/// The Redis connection shared by the limiter (and later the session store).
pub struct Shared {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    prefix: String,
    timeout: Duration,
    script: redis::Script,
    /// While now (ms since `epoch`) is before this, do not try Redis.
    retry_at_ms: AtomicU64,
    epoch: Instant,
}

/// Why Redis could not decide.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("not retried yet after a failure")]
    Backoff,
    #[error("unexpected answer from the rate-limit script")]
    Answer,
}

impl Shared {
    /// `url` is `redis://host:port[/db]`; nothing connects until first use.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Arc<Shared>, redis::RedisError> {
        Ok(Arc::new(Shared {
            client: redis::Client::open(url)?,
            connection: OnceCell::new(),
            prefix: prefix.to_owned(),
            timeout,
            script: redis::Script::new(SCRIPT),
            retry_at_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }))
    }

    async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout.max(Duration::from_millis(200)))
            .set_response_timeout(self.timeout)
            .set_number_of_retries(1);
        let manager = self
            .connection
            .get_or_try_init(|| async {
                tokio::time::timeout(
                    self.timeout.max(Duration::from_millis(200)),
                    self.client.get_connection_manager_with_config(config),
                )
                .await
                .map_err(|_| RedisError::Timeout(self.timeout))?
                .map_err(RedisError::from)
            })
            .await?;
        Ok(manager.clone())
    }

    /// Runs the script for `checks`.
    pub async fn check(&self, checks: &[Check]) -> Result<Decision, RedisError> {
        let now = self.epoch.elapsed().as_millis() as u64;
        if now < self.retry_at_ms.load(Ordering::Relaxed) {
            return Err(RedisError::Backoff);
        }
        let result = self.run(checks).await;
        if result.is_err() {
            self.retry_at_ms.store(now + 1000, Ordering::Relaxed);
        }
        result
    }

    async fn run(&self, checks: &[Check]) -> Result<Decision, RedisError> {
        let mut connection = self.connection().await?;
        let mut invocation = self.script.prepare_invoke();
        for check in checks {
            invocation.key(format!("{}rl:{}", self.prefix, check.subject));
        }
        for check in checks {
            let (interval, capacity) = gcra(check.rate);
            invocation.arg(interval).arg(capacity);
        }
        let answer: Vec<i64> = tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection))
            .await
            .map_err(|_| RedisError::Timeout(self.timeout))??;
        match answer.as_slice() {
            [0, _] => Ok(Decision::Allow),
            [i, wait] if *i >= 1 && (*i as usize) <= checks.len() => Ok(Decision::Deny {
                limit: checks[*i as usize - 1].limit,
                retry_after: Duration::from_micros((*wait).max(0) as u64),
            }),
            _ => Err(RedisError::Answer),
        }
    }
}
