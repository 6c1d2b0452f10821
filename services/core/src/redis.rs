//! The router's one connection to Redis, shared by the cluster rate limiter
//! and the session store.
//!
//! Every call is bounded by `redis.timeout` (twice that for the first call
//! to fail with its connection dropped: a PING on a new connection tells
//! whether Redis is gone or only that connection). After a failure the link
//! refuses at once for a second ([`RedisError::Backoff`]) instead of making
//! each request wait for a Redis that is down; callers then fall back to
//! what they can do locally. The connection itself (redis-rs's `ConnectionManager`)
//! reconnects by itself.
//!
//! The links to one Redis share a [`RedisHealth`]: when calls stop getting
//! through it logs one warning, when they get through again one info line,
//! whichever link noticed (and `switchboard_redis_up` follows). A link
//! whose connection Redis dropped (it restarted) learns so on its next
//! call, which fails; when a new connection answers at once, that is
//! neither reported as a second outage nor backed off from.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
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

impl RedisError {
    /// Whether Redis could not be reached (rather than answering something
    /// unexpected, or the link holding back after a failure).
    pub fn is_unreachable(&self) -> bool {
        match self {
            RedisError::Timeout(_) => true,
            RedisError::Redis(e) => {
                e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
            }
            RedisError::Backoff | RedisError::Answer(_) => false,
        }
    }
}

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// Whether Redis answers, as every link to it sees it.
pub struct RedisHealth {
    state: AtomicU8,
    up: Option<crate::metrics::IntGauge>,
}

impl RedisHealth {
    /// Health reported in `switchboard_redis_up` (registered in `registry`).
    pub fn new(registry: &crate::metrics::Registry) -> Arc<RedisHealth> {
        let up = crate::metrics::gauge(
            registry,
            "switchboard_redis_up",
            "1 while Redis answers (sessions, streams, shared limits), 0 while it cannot be reached.",
        );
        Arc::new(RedisHealth { state: AtomicU8::new(UNKNOWN), up: Some(up) })
    }

    /// Health with no metric (a link of its own, in tools and tests).
    pub fn unreported() -> Arc<RedisHealth> {
        Arc::new(RedisHealth { state: AtomicU8::new(UNKNOWN), up: None })
    }

    /// Whether Redis answered the last call (any link's).
    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) == UP
    }

    fn answered(&self) {
        if let Some(up) = &self.up {
            up.set(1);
        }
        if self.state.swap(UP, Ordering::Relaxed) == DOWN {
            tracing::info!("Redis answers again: sessions, streams and rate limits are shared across replicas again");
        }
    }

    fn unreachable(&self, error: &RedisError) {
        if let Some(up) = &self.up {
            up.set(0);
        }
        if self.state.swap(DOWN, Ordering::Relaxed) != DOWN {
            tracing::warn!(%error, "Redis cannot be reached: each replica serves the sessions it holds, rate limits are local, shared stream events wait, until it answers again");
        }
    }
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
    health: Arc<RedisHealth>,
    /// The last call failed: the connection may be a dead one.
    failed: std::sync::atomic::AtomicBool,
}

impl RedisLink {
    /// `url` is `redis://host:port[/db]`; nothing connects until first use.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Arc<RedisLink>, redis::RedisError> {
        Self::with_health(url, prefix, timeout, RedisHealth::unreported())
    }

    /// A link that reports to `health`, shared with the other links to
    /// the same Redis.
    pub fn with_health(
        url: &str,
        prefix: &str,
        timeout: Duration,
        health: Arc<RedisHealth>,
    ) -> Result<Arc<RedisLink>, redis::RedisError> {
        Ok(Arc::new(RedisLink {
            client: redis::Client::open(url)?,
            connection: OnceCell::new(),
            prefix: prefix.to_owned(),
            timeout,
            retry_at_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            health,
            failed: std::sync::atomic::AtomicBool::new(false),
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
        let result = tokio::time::timeout(limit, self.client.get_async_pubsub())
            .await
            .map_err(|_| RedisError::Timeout(limit))
            .and_then(|r| r.map_err(RedisError::from));
        self.report(&result);
        result
    }

    fn report<T>(&self, result: &Result<T, RedisError>) {
        match result {
            Ok(_) => self.health.answered(),
            Err(e) if e.is_unreachable() => self.health.unreachable(e),
            Err(_) => {}
        }
    }

    /// Runs `work` on the connection within the timeout, unless Redis failed
    /// less than a second ago. A failure starts that second, but for one on
    /// a connection Redis dropped while a new one answers at once
    /// ([`stale`](Self::stale)). Callers log.
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
            if self.failed.load(Ordering::Relaxed) {
                self.revive(connection.clone()).await?;
            }
            tokio::time::timeout(self.timeout, work(connection)).await.map_err(|_| RedisError::Timeout(self.timeout))?
        }
        .await;
        if self.stale(&result).await {
            // Only this call failed, on a connection Redis had dropped (it
            // restarted): Redis answers on the new one. No outage to
            // report, and no back-off: the next call, at once, goes out on
            // the live connection (a back-off here failed the calls of
            // requests already half-way through, such as a session found
            // unknown whose store generation could then not be read).
            self.health.answered();
            return result;
        }
        self.failed.store(result.is_err(), Ordering::Relaxed);
        if result.is_err() {
            self.retry_at_ms.store(now + BACKOFF.as_millis() as u64, Ordering::Relaxed);
        }
        self.report(&result);
        result
    }

    /// Whether `result` failed only because this link's connection, good
    /// at its last call, was one Redis had dropped since (it restarted,
    /// perhaps while another link reported it gone and back): a new
    /// connection answers a PING at once. Not a new outage to report: one
    /// warning per outage, however many links.
    async fn stale<T>(&self, result: &Result<T, RedisError>) -> bool {
        let Err(RedisError::Redis(e)) = result else { return false };
        if self.failed.load(Ordering::Relaxed) || !(e.is_connection_dropped() || e.is_io_error()) {
            return false;
        }
        let revived = async { self.revive(self.connection().await?).await };
        matches!(tokio::time::timeout(self.timeout, revived).await, Ok(Ok(())))
    }

    /// After a failure the connection may be one Redis dropped (it
    /// restarted): a PING finds out, and the connection manager then
    /// reconnects, so a second PING (at once) is on a live connection. The
    /// call that follows is not the one to fail on the dead connection.
    async fn revive(&self, connection: ConnectionManager) -> Result<(), RedisError> {
        let ping = |mut c: ConnectionManager| async move {
            let answer = tokio::time::timeout(self.timeout, redis::cmd("PING").query_async::<String>(&mut c)).await;
            answer.map_err(|_| RedisError::Timeout(self.timeout))?.map_err(RedisError::from)
        };
        match ping(connection.clone()).await {
            Ok(_) => Ok(()),
            Err(RedisError::Redis(e)) if e.is_connection_dropped() || e.is_io_error() => {
                ping(connection).await.map(|_| ())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A redis-server of the test's own on `port`, nothing saved.
    struct Server(std::process::Child);

    impl Server {
        fn start(port: u16) -> Server {
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server (apt-get install redis-server)");
            let server = Server(child);
            for _ in 0..100 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return server;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("redis-server did not listen on {port}");
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    async fn ping(link: &RedisLink) -> Result<String, RedisError> {
        link.call(|mut c| async move { Ok(redis::cmd("PING").query_async::<String>(&mut c).await?) }).await
    }

    /// Two links to one Redis, as the router has (sessions and limits, and
    /// the shared streams). Redis goes, one link says so and, once it is
    /// back, says that; the other link's connection is the one Redis
    /// dropped, and its next call must not take that for a second outage.
    #[tokio::test]
    async fn a_link_left_with_a_dropped_connection_does_not_report_redis_gone_again() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("redis://127.0.0.1:{port}");
        let mut server = Server::start(port);
        let health = RedisHealth::unreported();
        let first = RedisLink::with_health(&url, "t:", Duration::from_millis(500), health.clone()).unwrap();
        let second = RedisLink::with_health(&url, "t:", Duration::from_millis(500), health.clone()).unwrap();
        assert_eq!(ping(&first).await.unwrap(), "PONG");
        assert_eq!(ping(&second).await.unwrap(), "PONG");
        assert!(health.is_up());

        drop(server);
        assert!(ping(&first).await.is_err());
        assert!(!health.is_up(), "the first link saw Redis go");
        server = Server::start(port);
        // After its back-off, the first link finds it back.
        tokio::time::sleep(BACKOFF + Duration::from_millis(100)).await;
        assert_eq!(ping(&first).await.unwrap(), "PONG");
        assert!(health.is_up());

        // The second link's connection is the dropped one: its call may
        // fail, but Redis answers, and is still taken as answering; the
        // link's next call, at once (no back-off), is answered.
        let _ = ping(&second).await;
        assert!(health.is_up(), "a connection dropped by a restart is not an outage");
        assert_eq!(ping(&second).await.unwrap(), "PONG");
        assert!(health.is_up());
        drop(server);
    }
}
