//! The router's integration tests, in one binary (one link instead of one
//! per file): each module starts real routers in-process on port 0 in
//! front of mock or real upstreams, and drives them as clients do.
//!
//! - `routing`: aggregation, forwarding, relaying, sessions, failures.
//! - `bad_input`: malformed requests get clear statuses and errors.
//! - `tenancy`: keys, tenants, limits, audit, the admin API and CLI.
//! - `degraded`: the database, the audit queue or the spool failing.
//! - `stateless`: MCP 2026-07-28 clients and upstreams, and the bridges.
//! - `scale_out`: replicas sharing Redis: sessions, streams, cancellations.
//! - `edge`: edge devices over framed TCP and TLS.
//! - `peers`: the official SDKs and servers through the router.
//! - `shutdown`: the drain, and stdio children stopped and restarted.

mod bad_input;
mod degraded;
mod edge;
mod peers;
mod routing;
mod scale_out;
mod shutdown;
mod stateless;
mod tenancy;
