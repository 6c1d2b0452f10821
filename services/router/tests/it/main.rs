//! The router's integration tests, in one binary (one link instead of one
//! per file): each module starts real routers in-process on port 0 in
//! front of mock or real upstreams, and drives them as clients do.
//!
//! - `routing`: aggregation, forwarding, relaying, sessions, failures.
//! - `catalog`: list changes and the cache, cursors, colliding and long names.
//! - `bad_input`: malformed requests get clear statuses and errors.
//! - `hostile`: careless or hostile clients and upstreams: repeated
//!   members, odd ids, answers under another request's id.
//! - `tenancy`: tenants, their catalogs and limits, the CLI.
//! - `keys`: the key lifecycle, revocation, keys never in plain text.
//! - `oauth`: the router as an OAuth resource server, with a real
//!   authorization server and the Python SDK's OAuth client.
//! - `audit`: one record per call, records kept through an outage.
//! - `degraded`: the database, the audit queue or the spool failing.
//! - `stateless`: MCP 2026-07-28 clients and upstreams, and the bridges.
//! - `scale_out`: replicas sharing Redis: sessions, streams, cancellations.
//! - `edge`: edge devices over framed TCP and TLS.
//! - `peers`: the official SDKs and servers through the router.
//! - `balanced`: two router processes behind a round-robin nginx, with the
//!   Python SDK: everything as at one replica, a replica killed, Redis
//!   restarted.
//! - `eras`: the official SDKs in every era through the router, directly
//!   and over `switchboard connect`, to upstreams of either era.
//! - `shutdown`: the drain, and stdio children stopped and restarted.
//! - `reload`, `registry`: upstreams and tenants changed while running, from
//!   the config file and through the admin API.

mod audit;
mod bad_input;
mod balanced;
mod catalog;
mod console;
mod credentials;
mod degraded;
mod deployments;
mod discovery;
mod edge;
mod eras;
mod hostile;
mod http1;
mod keys;
mod oauth;
mod peers;
mod pins;
mod prometheus;
mod registry;
mod reload;
mod routing;
mod scale_out;
mod shutdown;
mod stateless;
mod telemetry;
mod tenancy;
mod tls;
mod upstream_tls;
mod usage;
