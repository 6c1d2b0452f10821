//! The Switchboard router: the client-facing MCP endpoints, the request
//! pipeline, the admin API, and serving. The layers below are crates of
//! their own (upstreams, catalog, sessions, database, tenancy, audit,
//! limits, edge devices); this crate composes them.
//!
//! Layout (each module's own docs say more):
//! - [`serve`] (`server.rs`): accepts connections, routes paths, drains on shutdown;
//!   `workers.rs`: the threads connections are dealt to.
//! - `app.rs`: the shared state, what happens to messages upstreams send on
//!   their own (the sessions' `Relay`), shutdown.
//! - `exchange.rs`: one request's context through its phases, finished once.
//! - `h1.rs`, `headers.rs`: the router's own HTTP/1.1 path for the hot POST;
//!   a request's headers as the phases read them (hyper's map or that path's head).
//! - `auth.rs`: the authenticate phase (API keys, OAuth access tokens, client
//!   certificates) and scopes.
//! - [`tls`], [`subject`]: TLS on the listeners, client certificates' subjects.
//! - `tools/`: where tools come from: the catalog and edge devices.
//! - `downstream/`: the client-facing endpoints, the phases in order
//!   (`mod.rs`), transport checks, resolution, forwarding by era, lists,
//!   legacy HTTP+SSE, responses.
//! - [`edge`]: the router as edge devices' host (keys, text tasks).
//! - [`config`]: the TOML file, validated into [`Config`].
//! - [`admin`]: the administration HTTP API, and the operations the CLI shares with it.
//! - `metrics.rs`, [`error`], `body.rs`.
//!
//! Invariants are listed in ARCHITECTURE.md.
#![forbid(unsafe_code)]
// The request pipeline's futures nest deeply: proving them `Send` takes more
// than the default depth.
#![recursion_limit = "256"]

pub mod admin;
mod app;
mod auth;
mod body;
pub mod config;
mod connections;
pub mod console;
pub mod console_admin;
mod deadline;
mod delegation;
mod discovery;
mod downstream;
pub mod edge;
pub mod error;
mod exchange;
pub mod feed;
mod h1;
mod headers;
mod keychain;
mod metrics;
mod own_token;
pub mod pins;
pub mod pins_admin;
pub mod registry;
pub mod registry_admin;
mod relayed_spans;
pub mod reload;
mod server;
pub mod subject;
pub mod tls;
mod token_exchange;
mod tools;
mod upstream_set;
mod user_catalogs;
mod workers;

pub use config::Config;
pub use error::Error;
pub use server::{serve, serve_with, Listeners};
