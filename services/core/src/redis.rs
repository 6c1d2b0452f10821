//! The router's one connection to Redis, shared by the cluster rate limiter
//! and the session store.
//!
//! Every call is bounded by `redis.timeout`. After a failure the link refuses
//! at once for a second ([`RedisError::Backoff`]) instead of making each
//! request wait for a Redis that is down; callers then fall back to what they
//! can do locally. The connection itself (redis-rs's `ConnectionManager`)
//! reconnects by itself.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tokio::sync::OnceCell;

/// How long Redis is left alone after a failure.
const BACKOFF: Duration = Duration::from_secs(1);

/// Why a Redis call did not answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("not retried yet after a failure")]
    Backoff,
    #[error("unexpected answer: {0}")]
    Answer(String),
}

/// A lazily connected, self-healing connection to one Redis server.
pub struct RedisLink {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    /// Prefix of every key written.
    pub prefix: String,
    timeout: Duration,
    /// While now (ms since `epoch`) is before this, do not try Redis.
    retry_at_ms: AtomicU64,
    epoch: Instant,
}

impl RedisLink {
    /// `url` is `redis://host:port[/db]`; nothing connects until first use.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Arc<RedisLink>, redis::RedisError> {
        Ok(Arc::new(RedisLink {
            client: redis::Client::open(url)?,
            connection: OnceCell::new(),
            prefix: prefix.to_owned(),
            timeout,
            retry_at_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }))
    }

    async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        let connect_limit = self.timeout.max(Duration::from_millis(200));
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(connect_limit)
            .set_response_timeout(self.timeout)
            .set_number_of_retries(1);
        let manager = self
            .connection
            .get_or_try_init(|| async {
                tokio::time::timeout(connect_limit, self.client.get_connection_manager_with_config(config))
                    .await
                    .map_err(|_| RedisError::Timeout(self.timeout))?
                    .map_err(RedisError::from)
            })
            .await?;
        Ok(manager.clone())
    }

    /// A new connection for subscriptions (one per replica: see
    /// `shared_streams.rs`), bounded by the connection timeout.
    pub async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        let limit = self.timeout.max(Duration::from_millis(200));
        tokio::time::timeout(limit, self.client.get_async_pubsub())
            .await
            .map_err(|_| RedisError::Timeout(limit))?
            .map_err(RedisError::from)
    }

    /// Runs `work` on the connection within the timeout, unless Redis failed
    /// less than a second ago. A failure starts that second. Callers log.
    pub async fn call<T, F, Fut>(&self, work: F) -> Result<T, RedisError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let now = self.epoch.elapsed().as_millis() as u64;
        if now < self.retry_at_ms.load(Ordering::Relaxed) {
            return Err(RedisError::Backoff);
        }
        let result = async {
            let connection = self.connection().await?;
            tokio::time::timeout(self.timeout, work(connection)).await.map_err(|_| RedisError::Timeout(self.timeout))?
        }
        .await;
        if result.is_err() {
            self.retry_at_ms.store(now + BACKOFF.as_millis() as u64, Ordering::Relaxed);
        }
        result
    }
}
