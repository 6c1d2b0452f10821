//! What every layer of Switchboard shares, and nothing that belongs to one
//! of them: no I/O of its own but the Redis link, no knowledge of MCP (that
//! is `switchboard-protocol`'s) or of upstreams, sessions or requests.
//!
//! - [`ids`]: random ids, and [`UpstreamId`], the index of a configured upstream.
//! - [`slots`]: an append-only table read without a lock (tables kept per
//!   upstream, which come and go while the router runs).
//! - [`hash`]: the stable 64-bit hash used for sharding and name shortening.
//! - [`time`]: Unix milliseconds, and their RFC 3339 form.
//! - [`policy`]: what a tenant may use ([`Policy`]), resolved against the
//!   configured upstreams ([`Tenant`]), and who is calling ([`Principal`]).
//! - [`outcome`]: how a request ended, as metrics and audit records say it.
//! - [`redis`]: the bounded, self-healing link to Redis.
//! - [`body`]: reading an HTTP body with a size limit.
//! - [`metrics`]: registering a layer's metrics in the one registry.
//! - [`egress`]: where the router may connect (the SSRF guard).
//! - [`credential`]: credentials towards upstreams (headers for a tenant or
//!   a user), and the traits through which channels find theirs.
//! - [`thread`]: which of the router's connection threads this is (what
//!   keeps sockets for reuse keeps them per thread).
//! - [`tls`]: PEM files, and the TLS client configuration towards upstreams
//!   and authorization servers (verification always on).
#![forbid(unsafe_code)]

pub mod body;
pub mod credential;
pub mod egress;
pub mod hash;
pub mod ids;
pub mod metrics;
pub mod outcome;
pub mod policy;
pub mod redis;
pub mod slots;
pub mod thread;
pub mod time;
pub mod tls;

pub use ids::UpstreamId;
pub use outcome::Outcome;
pub use policy::{AuthFailure, Policy, Principal, Tenant};
