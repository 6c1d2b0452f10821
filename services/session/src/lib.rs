//! Downstream sessions: what the router remembers between a client's
//! requests, and where it keeps it so that any replica can continue it.
//!
//! - [`Sessions`] (`manager.rs`): this replica's sessions as a cache of the
//!   session store: create, find (adopting a stored session another replica
//!   made), check against the store, repair what the store lost, end, sweep
//!   expired ones, drain on shutdown.
//! - [`Session`] (`session/`): one client's session: its upstream channels
//!   (opened on first use with the client's capabilities, or resumed from
//!   the store), its requests in flight, its event streams.
//! - `relayed.rs`: the ids of server-to-client requests relayed to a client,
//!   which route the client's answer from any replica.
//! - [`events`]: resumable SSE streams (`Last-Event-ID`).
//! - [`shared_streams`]: the same streams in Redis, for every replica.
//! - [`store`]: the [`SessionStore`](store::SessionStore) trait, in memory or
//!   in Redis.
//! - `subscriptions.rs`: a session client's resource subscriptions to
//!   upstreams of the stateless era, as `subscriptions/listen` streams.
//!
//! This layer knows upstreams (it opens channels to them) but not what
//! requests mean: a message an upstream sends a session on its own goes to
//! the [`Relay`] the layer above provides, which says what the client gets.
//! A session never sees another session's messages.
#![forbid(unsafe_code)]

pub mod events;
mod manager;
mod metrics;
pub mod registry;
pub mod relayed;
mod session;
pub mod shared_streams;
pub mod store;
mod subscriptions;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::value::RawValue;
use switchboard_core::UpstreamId;
use switchboard_protocol::ProtocolVersion;
use switchboard_upstream::{UpstreamError, Upstreams};

pub use manager::{Options, Sessions, Setup};
pub use metrics::Metrics;
pub use registry::{Full, Quota};
pub use session::{tenant_session_id, Session, TENANT_PREFIX};

/// What the layer above does with a message an upstream sends a session
/// outside any request's answer (a notification, a server-to-client request
/// on its GET stream).
pub trait Relay: Send + Sync {
    /// What `session`'s client gets of `message` from upstream `upstream`;
    /// `None`: nothing.
    fn relay(&self, session: &Session, upstream: UpstreamId, message: &Bytes) -> Option<Bytes>;

    /// `message` from `upstream` could not be given to `session`'s client
    /// (`reason`: why, a metric label): a request is refused back to the
    /// upstream with an error, anything else counted as dropped.
    fn not_delivered(&self, session: &Session, upstream: UpstreamId, message: &Bytes, reason: &'static str);
}

/// Who a new session is for: the tenant (and the key that opened it), the
/// negotiated version and what the client declared.
pub struct Client {
    pub tenant: Arc<str>,
    /// The hash of the API key that opened the session (empty without
    /// keys): the per-key session cap counts by it.
    pub key: Arc<str>,
    /// The user it acts for (an OAuth token's or a client certificate's),
    /// whose upstream credentials its channels carry; `None`: the tenant's.
    pub user: Option<Arc<str>>,
    pub version: ProtocolVersion,
    pub capabilities: Arc<RawValue>,
}

/// Why a session could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No such session (never was, ended, expired, or another tenant's).
    #[error("unknown or expired session: initialize a new one")]
    Unknown,
    /// The session is not on this replica and the shared store cannot be
    /// reached to load it (the session may well be alive).
    #[error("the session store is unreachable, so this replica cannot load the session; retry shortly")]
    StoreDown,
    /// `Last-Event-ID` names a stream the session does not have (any more).
    #[error("unknown or expired event stream in Last-Event-ID")]
    UnknownStream,
    /// Opening the session's channel to an upstream failed.
    #[error("upstream {upstream:?} is unavailable: {source}")]
    Upstream {
        upstream: Arc<str>,
        #[source]
        source: UpstreamError,
    },
    /// Opening the session's channel to an upstream took too long.
    #[error("upstream {upstream:?} did not answer within {after:?}")]
    UpstreamTimeout { upstream: Arc<str>, after: Duration },
}

impl SessionError {
    /// An upstream's failure, named.
    pub fn upstream(upstream: &Arc<str>, source: UpstreamError) -> SessionError {
        match source {
            UpstreamError::Timeout(after) => SessionError::UpstreamTimeout { upstream: upstream.clone(), after },
            source => SessionError::Upstream { upstream: upstream.clone(), source },
        }
    }
}

/// What every session of this replica shares.
pub(crate) struct Context {
    upstreams: Upstreams,
    store: Arc<dyn store::SessionStore>,
    /// With a shared store: the streams every replica reads.
    shared: Option<Arc<shared_streams::SharedStreams>>,
    metrics: Arc<Metrics>,
    relay: Weak<dyn Relay>,
    /// Where sessions' channels find their callers' upstream credentials.
    keychain: Option<Arc<dyn switchboard_core::credential::Keychain>>,
    /// Sessions measure idleness from here.
    epoch: Instant,
}

#[cfg(test)]
pub(crate) mod testing {
    //! A context with upstreams that cannot be reached, for unit tests.

    use std::sync::{Arc, Weak};
    use std::time::Instant;

    use async_trait::async_trait;
    use switchboard_core::UpstreamId;
    use switchboard_upstream::{Channel, Hello, Inbox, Transport, Upstream, UpstreamError, Upstreams};

    use crate::store::MemoryStore;
    use crate::{Context, Metrics, Relay};

    struct Unreachable;

    #[async_trait]
    impl Transport for Unreachable {
        async fn open(&self, _: &Hello, _: Arc<dyn Inbox>) -> Result<Arc<dyn Channel>, UpstreamError> {
            Err(UpstreamError::Connect("a test upstream".into()))
        }

        async fn shutdown(&self) {}
    }

    struct NoRelay;

    impl Relay for NoRelay {
        fn relay(&self, _: &crate::Session, _: UpstreamId, _: &bytes::Bytes) -> Option<bytes::Bytes> {
            None
        }

        fn not_delivered(&self, _: &crate::Session, _: UpstreamId, _: &bytes::Bytes, _: &'static str) {}
    }

    /// `upstreams` unreachable upstreams, a memory store, sessions idle from `epoch`.
    pub(crate) fn context(upstreams: usize, epoch: Instant) -> Arc<Context> {
        let registry = switchboard_core::metrics::Registry::new();
        let metrics = Arc::new(switchboard_upstream::Metrics::new(&registry, &[]));
        let list = (0..upstreams)
            .map(|i| {
                Arc::new(Upstream {
                    id: UpstreamId::new(i),
                    name: Arc::from(format!("u{i}")),
                    config: test_config(i),
                    transport: Arc::new(Unreachable),
                })
            })
            .collect();
        let relay: Weak<dyn Relay> = Weak::<NoRelay>::new();
        Arc::new(Context {
            upstreams: Upstreams::new(list, metrics),
            store: Arc::new(MemoryStore::new(std::time::Duration::from_secs(60))),
            shared: None,
            metrics: Arc::new(Metrics::new(&registry)),
            relay,
            keychain: None,
            epoch,
        })
    }

    fn test_config(i: usize) -> switchboard_upstream::config::UpstreamConfig {
        use switchboard_upstream::config::{StdioConfig, TransportConfig, UpstreamConfig};
        UpstreamConfig {
            name: format!("u{i}"),
            prefix: format!("u{i}"),
            transport: TransportConfig::Stdio(StdioConfig {
                command: "false".into(),
                args: Vec::new(),
                env: Default::default(),
                inherit_env: false,
                cwd: None,
                restart_max_backoff: std::time::Duration::from_secs(1),
                shutdown_grace: std::time::Duration::from_secs(1),
                per_session: None,
            }),
            timeout: std::time::Duration::from_secs(1),
            list_timeout: std::time::Duration::from_secs(1),
            credential_required: false,
            per_user: false,
        }
    }
}
