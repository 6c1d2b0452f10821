//! Switchboard: a multi-tenant router for the Model Context Protocol.
//!
//! One Streamable HTTP endpoint fronts many upstream MCP servers: their tools,
//! prompts and resources are merged into one namespaced catalog, and requests
//! are forwarded to the upstream that serves them, reading only the JSON-RPC
//! envelope on the way.
//!
//! Layout (each module's own docs say more):
//! - [`serve`] (`server.rs`): accepts connections, routes paths, drains on shutdown.
//! - `downstream/`: the client-facing `/mcp` endpoint, request phases in order
//!   (`mod.rs`), forwarding and SSE relay (`forward.rs`), answers from the
//!   catalog (`lists.rs`), responses (`respond.rs`).
//! - `app.rs`: shared state, and what happens to messages upstreams send on their own.
//! - `session.rs`: downstream sessions and their registry; `events.rs`: their resumable SSE streams.
//! - `catalog/`: the merged, namespaced, cached catalog (`naming.rs`, `cursor.rs`).
//! - `upstream/`: the [`upstream::Transport`] and [`upstream::Channel`] traits,
//!   one file per transport (`http.rs`, `stdio.rs`).
//! - [`bridge`]: `switchboard connect`, stdio to Streamable HTTP for clients that only launch commands.
//! - [`config`]: the TOML file, validated into [`Config`].
//! - [`tenancy`]: tenants, API keys and the in-memory directory of them;
//!   [`store`]: the database (PostgreSQL or SQLite) behind it and the audit log.
//! - `ratelimit/`: per-key, per-tenant and per-tool limits, local or in Redis.
//! - `audit/`: the background audit writer and its disk spool.
//! - [`edge`]: devices that connect out over framed TCP and become tools of their tenant.
//! - [`admin`]: the administration HTTP API, and the operations the CLI shares with it.
//! - `metrics.rs`, `error.rs`, `body.rs`.
//!
//! Invariants are listed in ARCHITECTURE.md.
#![forbid(unsafe_code)]

pub mod admin;
mod app;
mod auth;
mod body;

pub mod config;
mod downstream;
pub mod edge;
pub mod error;
mod exchange;
mod metrics;
mod server;
mod tools;

pub use config::Config;
pub use error::Error;
pub use server::{serve, serve_with, Listeners};
