//! Administration: tenants, API keys, upstream credentials and the audit
//! log, as operations shared by the CLI (`switchboard tenants|keys|
//! credentials|vault|audit`) and the admin HTTP API
//! (`[admin] listen`, documented in `docs/admin-api.yaml`).
//!
//! Everything here writes to the database; routers pick changes up from it
//! (notification or poll), never from this module directly. The admin API
//! must never answer without the admin token, and never shows a key except
//! once, in the answer that creates it; a credential's values, never (its
//! owner gave them).
//!
//! Credentials go through the vault: the running router's own in the admin
//! API (its replica applies a change at once), the CLI's otherwise.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;

use crate::body::Body;
use crate::config::Config;
use crate::connections::{self, Activity, Connections, Tracked};
use switchboard_core::policy::Policy;
use switchboard_core::time::{format_time, now_ms, parse_time};

use switchboard_db::usage::{Dimension, UsageQuery, UsageRow};
use switchboard_db::{AuditQuery, AuditRecord, CredentialRow, Database, DbError, KeyRow, TenantRow};
use switchboard_tenancy::generate_key;
use switchboard_vault::{NewCredential, Rotation, Vault, VaultError};

/// The operations, over one database and the config file's tenants.
#[derive(Clone)]
pub struct Admin {
    pub db: Database,
    static_tenants: Vec<(String, Policy)>,
    upstreams: Vec<String>,
    /// The running router's edge devices (the HTTP API only).
    edge: Option<Arc<switchboard_devices::Devices>>,
    /// Upstream credentials.
    pub(crate) vault: Vault,
    /// The running router's tenant directory (its config file tenants, as
    /// reloaded) and configuration reloads (the HTTP API only).
    directory: Option<Arc<switchboard_tenancy::Directory>>,
    pub(crate) reloads: Option<Arc<crate::reload::Reloads>>,
    /// The running router (the HTTP API only): its upstreams, as the file
    /// and the registry change them, and how they fare.
    pub(crate) running: Option<std::sync::Weak<crate::app::App>>,
    /// The configuration file registered upstreams are checked with.
    pub(crate) config_path: Option<std::path::PathBuf>,
}

/// What went wrong with an operation.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] DbError),
    #[error(transparent)]
    Vault(#[from] VaultError),
}

impl AdminError {
    fn status(&self) -> StatusCode {
        match self {
            AdminError::Invalid(_) => StatusCode::BAD_REQUEST,
            AdminError::Store(DbError::NotFound(_)) => StatusCode::NOT_FOUND,
            AdminError::Store(DbError::Exists(_)) => StatusCode::CONFLICT,
            AdminError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Vault(VaultError::Db(DbError::NotFound(_))) => StatusCode::NOT_FOUND,
            AdminError::Vault(VaultError::Invalid(_)) => StatusCode::BAD_REQUEST,
            AdminError::Vault(VaultError::Db(_)) => StatusCode::SERVICE_UNAVAILABLE,
            // The router's configuration (no key, no database, the wrong key)
            // or the tenant's count, not the request, stands in the way.
            AdminError::Vault(_) => StatusCode::CONFLICT,
        }
    }
}

/// A tenant as listed: where it is declared.
#[derive(Debug, Clone, Serialize)]
pub struct TenantInfo {
    pub name: String,
    #[serde(flatten)]
    pub policy: Policy,
    /// `database` or `config`.
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at_ms: Option<i64>,
}

/// A key just created: the only time the key itself is shown.
#[derive(Debug, Clone, Serialize)]
pub struct NewKey {
    pub key: String,
    #[serde(flatten)]
    pub row: KeyRow,
}

impl Admin {
    /// For the upstreams and `[[tenants]]` of `config`.
    pub fn new(db: Database, config: &Config) -> Admin {
        let vault = Vault::new(
            Some(db.clone()),
            config.vault.keyring(),
            config.vault.max_per_tenant,
            &prometheus::Registry::new(),
        );
        Admin {
            db,
            static_tenants: config.tenants.clone(),
            upstreams: config.upstreams.iter().map(|u| u.name.clone()).collect(),
            edge: None,
            vault,
            directory: None,
            reloads: None,
            running: None,
            config_path: None,
        }
    }

    /// With the running router's directory, upstreams and configuration
    /// reloads: the config file's tenants and upstreams as last reloaded,
    /// and `GET /v1/config`.
    pub(crate) fn with_running(
        mut self,
        app: &Arc<crate::app::App>,
        reloads: Option<Arc<crate::reload::Reloads>>,
    ) -> Admin {
        self.directory = Some(app.directory.clone());
        self.running = Some(Arc::downgrade(app));
        if let Some(reloads) = &reloads {
            self.config_path = Some(reloads.path().to_owned());
        }
        self.reloads = reloads;
        self
    }

    /// Registered upstreams are checked against this configuration file
    /// (its `[egress]`, names, prefixes) before they are stored.
    pub fn with_config_path(mut self, path: std::path::PathBuf) -> Admin {
        self.config_path = Some(path);
        self
    }

    /// The upstreams' names: the running router's, else the config file's.
    fn upstream_names(&self) -> Vec<String> {
        match self.running.as_ref().and_then(std::sync::Weak::upgrade) {
            Some(app) => app.upstreams.iter().map(|u| u.name.to_string()).collect(),
            None => self.upstreams.clone(),
        }
    }

    /// The config file's tenants: as the running router last reloaded them.
    fn static_tenants(&self) -> Vec<(String, Policy)> {
        match &self.directory {
            Some(directory) => directory.static_tenants(),
            None => self.static_tenants.clone(),
        }
    }

    /// The configuration version running (`None`: not reloadable here).
    pub fn config_version(&self) -> Option<crate::reload::Version> {
        self.reloads.as_ref().map(|r| r.version())
    }

    /// With the running router's vault, so that a change applies on its
    /// replica at once (others follow by notification or poll).
    pub fn with_vault(mut self, vault: Vault) -> Admin {
        self.vault = vault;
        self
    }

    /// With the running router's edge registry, for `GET /v1/edge/devices`.
    pub fn with_edge(mut self, edge: Arc<switchboard_devices::Devices>) -> Admin {
        self.edge = Some(edge);
        self
    }

    /// The connected edge devices (of one tenant, or all) and their services.
    pub fn edge_devices(&self, tenant: Option<&str>) -> Vec<serde_json::Value> {
        self.edge.as_ref().map(|e| e.describe(tenant)).unwrap_or_default()
    }

    pub async fn create_tenant(&self, name: &str, policy: Policy) -> Result<TenantRow, AdminError> {
        if !switchboard_core::ids::valid_name(name) {
            return Err(AdminError::Invalid(format!(
                "tenant name {name:?}: use 1 to 48 of letters, digits, '_' and '-'"
            )));
        }
        self.check_policy(&policy)?;
        let row = TenantRow { name: name.to_owned(), policy, created_at_ms: now_ms() };
        self.db.create_tenant(&row).await?;
        Ok(row)
    }

    pub async fn update_tenant(&self, name: &str, policy: Policy) -> Result<(), AdminError> {
        self.check_policy(&policy)?;
        Ok(self.db.update_tenant(name, &policy).await?)
    }

    fn check_policy(&self, policy: &Policy) -> Result<(), AdminError> {
        let upstreams = self.upstream_names();
        let names: Vec<&str> = upstreams.iter().map(String::as_str).collect();
        let problems = policy.problems(&names);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(AdminError::Invalid(problems.iter().map(|(k, m)| format!("{k}: {m}")).collect::<Vec<_>>().join("; ")))
        }
    }

    /// Every tenant: the database's, then those only in the config file.
    pub async fn tenants(&self) -> Result<Vec<TenantInfo>, AdminError> {
        let mut out: Vec<TenantInfo> = self
            .db
            .tenants()
            .await?
            .into_iter()
            .map(|t| TenantInfo {
                name: t.name,
                policy: t.policy,
                source: "database",
                created_at_ms: Some(t.created_at_ms),
            })
            .collect();
        for (name, policy) in &self.static_tenants() {
            if !out.iter().any(|t| &t.name == name) {
                out.push(TenantInfo {
                    name: name.clone(),
                    policy: policy.clone(),
                    source: "config",
                    created_at_ms: None,
                });
            }
        }
        Ok(out)
    }

    pub async fn tenant(&self, name: &str) -> Result<TenantInfo, AdminError> {
        self.tenants()
            .await?
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| AdminError::Store(DbError::NotFound(format!("tenant {name:?}"))))
    }

    /// Deletes a tenant of the database, its keys and its credentials.
    pub async fn delete_tenant(&self, name: &str) -> Result<(), AdminError> {
        match self.db.delete_tenant(name).await {
            Err(DbError::NotFound(_)) if self.static_tenants().iter().any(|(n, _)| n == name) => {
                Err(AdminError::Invalid(format!("tenant {name:?} is declared in the config file; remove it there")))
            }
            other => {
                other?;
                // Its credentials went in the same transaction.
                if let Err(e) = self.vault.refresh().await {
                    tracing::warn!(error = %e, "vault: tenant deleted but not reloaded; the next refresh will");
                }
                Ok(())
            }
        }
    }

    /// Stores the credential of `user` of `tenant` (`None`: the tenant's
    /// own) for `upstream`, replacing any; what is shown of it (never a value).
    pub async fn set_credential(
        &self,
        tenant: &str,
        user: Option<&str>,
        upstream: &str,
        headers: Vec<(String, String)>,
    ) -> Result<CredentialRow, AdminError> {
        self.tenant(tenant).await?;
        let upstreams = self.upstream_names();
        if !upstreams.iter().any(|u| u == upstream) {
            return Err(AdminError::Invalid(format!(
                "no upstream {upstream:?} is configured (upstreams: {})",
                upstreams.join(", ")
            )));
        }
        let new = NewCredential {
            tenant: tenant.to_owned(),
            user: user.map(str::to_owned),
            upstream: upstream.to_owned(),
            headers,
        };
        Ok(self.vault.put(new, now_ms()).await?)
    }

    /// The credentials of `tenant` (all with `None`): whose, for which
    /// upstream, the header names, the key id; never a value.
    pub async fn credentials(&self, tenant: Option<&str>) -> Result<Vec<CredentialRow>, AdminError> {
        Ok(self.vault.list(tenant).await?)
    }

    pub async fn delete_credential(&self, tenant: &str, user: Option<&str>, upstream: &str) -> Result<(), AdminError> {
        Ok(self.vault.delete(tenant, user, upstream).await?)
    }

    /// Reseals every credential with the current vault key.
    pub async fn rotate_vault(&self) -> Result<Rotation, AdminError> {
        let mut done = self.vault.rotate().await?;
        let (resealed, current) = self.reseal_upstreams().await?;
        done.resealed += resealed;
        done.current += current;
        Ok(done)
    }

    /// Creates a key for `tenant`, valid until `expires_at_ms` if given.
    pub async fn create_key(&self, tenant: &str, expires_at_ms: Option<i64>) -> Result<NewKey, AdminError> {
        self.tenant(tenant).await?;
        if expires_at_ms.is_some_and(|at| at <= now_ms()) {
            return Err(AdminError::Invalid("the expiry is in the past".into()));
        }
        let (key, prefix, hash) = generate_key();
        let row = KeyRow {
            prefix,
            hash,
            tenant: tenant.to_owned(),
            created_at_ms: now_ms(),
            expires_at_ms,
            revoked_at_ms: None,
        };
        self.db.create_key(&row).await?;
        Ok(NewKey { key, row })
    }

    pub async fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRow>, AdminError> {
        Ok(self.db.keys(tenant, true).await?)
    }

    pub async fn revoke_key(&self, prefix: &str) -> Result<(), AdminError> {
        Ok(self.db.revoke_key(prefix, now_ms()).await?)
    }

    pub async fn audit(&self, query: &AuditQuery) -> Result<Vec<(i64, AuditRecord)>, AdminError> {
        Ok(self.db.query_audit(query).await?)
    }

    /// Usage over a time range, from the audit log.
    pub async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, AdminError> {
        if query.to_ms <= query.from_ms {
            return Err(AdminError::Invalid("to: must be after from".into()));
        }
        Ok(self.db.usage(query).await?)
    }
}

// ---- The HTTP API ----------------------------------------------------------

/// Connections the admin listener keeps open at once, and from one client
/// address: an operator's tools need few, and anyone who can reach the
/// port can open them, token or not.
pub const MAX_CONNECTIONS: usize = 256;
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 64;

/// Serves the admin API on `listener` until `shutdown`, with the default
/// bounds and timeouts and metrics of its own (tests, embedding).
pub async fn serve(
    listener: TcpListener,
    admin: Admin,
    token: String,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = connections::Limits {
        header_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(120),
        max: MAX_CONNECTIONS,
        per_address: MAX_CONNECTIONS_PER_ADDRESS,
    };
    let conns = Connections::new(limits, &switchboard_core::metrics::Registry::new(), connections::Listener::Admin);
    serve_bounded(listener, conns, None, admin, token, shutdown).await
}

/// Serves the admin API on `listener` until `shutdown`, its connections
/// bounded and timed as the MCP listener's are (`conns`).
pub async fn serve_bounded(
    listener: TcpListener,
    conns: Arc<Connections>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    admin: Admin,
    token: String,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let state = Arc::new((admin, token));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().header_read_timeout(None).timer(hyper_util::rt::TokioTimer::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (stream, address) = connections::accept(&listener, &conns) => {
                let Ok(admitted) = conns.admit(address) else {
                    connections::refuse(stream);
                    continue;
                };
                let (state, builder, conns, tls) = (state.clone(), builder.clone(), conns.clone(), tls.clone());
                tokio::spawn(async move {
                    let activity = Activity::new();
                    match tls {
                        None => serve_one(&builder, TokioIo::new(stream), state, activity, admitted, conns).await,
                        Some(acceptor) => {
                            if let Some(stream) = connections::tls_handshake(&acceptor, stream, &conns).await {
                                serve_one(&builder, TokioIo::new(stream), state, activity, admitted, conns).await;
                            }
                        }
                    }
                });
            }
            () = &mut shutdown => return Ok(()),
        }
    }
}

/// Serves one admin connection until it ends or is closed for idleness.
async fn serve_one<I>(
    builder: &hyper_util::server::conn::auto::Builder<TokioExecutor>,
    io: I,
    state: Arc<(Admin, String)>,
    activity: Arc<Activity>,
    admitted: connections::Admitted,
    conns: Arc<Connections>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req| {
            let state = state.clone();
            let in_flight = activity.begin();
            async move {
                let response = crate::downstream::respond::labelled(handle(&state.0, &state.1, req).await);
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, in_flight)))
            }
        })
    };
    let conn = builder.serve_connection(io, service).into_owned();
    connections::supervise(conn, admitted, activity, conns).await;
}

fn reply(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::full(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, crate::downstream::respond::JSON);
    response
}

fn problem(status: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    reply(status, json!({ "error": message.to_string() }))
}

/// Equal-time comparison: the admin token must not leak through timing.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    // Hashed first, so that neither the comparison nor its time depends on the lengths.
    let (ha, hb) = (switchboard_tenancy::hash_bytes(a), switchboard_tenancy::hash_bytes(b));
    ha.ct_eq(&hb).into()
}

/// A tenant or its policy in a request body (the fields of `[[tenants]]`;
/// `name` only when creating).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    upstreams: Vec<String>,
    #[serde(default)]
    tools: BTreeMap<String, switchboard_core::policy::ToolFilter>,
    #[serde(default)]
    limits: switchboard_core::policy::Limits,
    #[serde(default)]
    audit_arguments: bool,
    #[serde(default)]
    accept: Vec<String>,
    #[serde(default)]
    discovery: switchboard_core::policy::Discovery,
    #[serde(default)]
    task_handler: Option<String>,
    #[serde(default)]
    pinning: Option<switchboard_core::policy::Pinning>,
}

impl From<PolicyBody> for Policy {
    fn from(p: PolicyBody) -> Policy {
        Policy {
            upstreams: p.upstreams,
            tools: p.tools,
            limits: p.limits,
            audit_arguments: p.audit_arguments,
            accept: p.accept,
            discovery: p.discovery,
            task_handler: p.task_handler,
            pinning: p.pinning,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// `"30d"`, `"12h"`, … from now.
    expires_in: Option<String>,
    expires_at_ms: Option<i64>,
}

async fn handle(admin: &Admin, token: &str, req: Request<Incoming>) -> Response<Body> {
    // The console's pages carry no secret: they load without the token,
    // which the operator then types in.
    if req.method() == Method::GET {
        if let Some(page) = crate::console::file(req.uri().path()) {
            return page;
        }
    }
    let presented = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !same_secret(presented.as_bytes(), token.as_bytes()) {
        let mut response =
            problem(StatusCode::UNAUTHORIZED, "the admin API needs \"Authorization: Bearer <admin token>\"");
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static(r#"Bearer realm="switchboard-admin""#),
        );
        return response;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let body = match http_body_util::Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("could not read the body: {e}")),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let result = match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "tenants"]) => admin.tenants().await.map(|t| (StatusCode::OK, json!({ "tenants": t }))),
        (&Method::GET, ["v1", "config"]) => match admin.config_version() {
            Some(version) => Ok((StatusCode::OK, json!(version))),
            None => Err(AdminError::Store(DbError::NotFound(
                "the configuration version (this router was not started from a file)".into(),
            ))),
        },
        (&Method::POST, ["v1", "tenants"]) => match serde_json::from_slice::<PolicyBody>(&body) {
            Ok(mut p) => match p.name.take() {
                Some(name) => admin.create_tenant(&name, p.into()).await.map(|t| {
                    let info = TenantInfo {
                        name: t.name,
                        policy: t.policy,
                        source: "database",
                        created_at_ms: Some(t.created_at_ms),
                    };
                    (StatusCode::CREATED, json!(info))
                }),
                None => Err(AdminError::Invalid("body: name is required".into())),
            },
            Err(e) => Err(AdminError::Invalid(format!("body: {e}"))),
        },
        (&Method::GET, ["v1", "tenants", name]) => admin.tenant(name).await.map(|t| (StatusCode::OK, json!(t))),
        (&Method::PUT, ["v1", "tenants", name]) => match serde_json::from_slice::<PolicyBody>(&body) {
            Ok(p) if p.name.as_deref().is_some_and(|n| n != *name) => {
                Err(AdminError::Invalid("body: a tenant cannot be renamed".into()))
            }
            Ok(p) => admin.update_tenant(name, p.into()).await.map(|()| (StatusCode::NO_CONTENT, json!(null))),
            Err(e) => Err(AdminError::Invalid(format!("body: {e}"))),
        },
        (&Method::DELETE, ["v1", "tenants", name]) => {
            admin.delete_tenant(name).await.map(|()| (StatusCode::NO_CONTENT, json!(null)))
        }
        (&Method::GET, ["v1", "tenants", name, "keys"]) => {
            admin.keys(Some(name)).await.map(|k| (StatusCode::OK, json!({ "keys": k })))
        }
        (&Method::POST, ["v1", "tenants", name, "keys"]) => {
            let parsed =
                if body.is_empty() { Ok(CreateKey::default()) } else { serde_json::from_slice::<CreateKey>(&body) };
            match parsed {
                Ok(c) => match expiry(c.expires_in.as_deref(), c.expires_at_ms) {
                    Ok(at) => admin.create_key(name, at).await.map(|k| (StatusCode::CREATED, json!(k))),
                    Err(e) => Err(e),
                },
                Err(e) => Err(AdminError::Invalid(format!("body: {e}"))),
            }
        }
        (&Method::GET, ["v1", "keys"]) => admin.keys(None).await.map(|k| (StatusCode::OK, json!({ "keys": k }))),
        (&Method::DELETE, ["v1", "keys", prefix]) => {
            admin.revoke_key(prefix).await.map(|()| (StatusCode::NO_CONTENT, json!(null)))
        }
        (&Method::GET, ["v1", "credentials"]) => match query_param(&query, "tenant") {
            Ok(tenant) => {
                admin.credentials(tenant.as_deref()).await.map(|c| (StatusCode::OK, json!({ "credentials": c })))
            }
            Err(e) => Err(e),
        },
        (&Method::GET, ["v1", "tenants", name, "credentials"]) => {
            admin.credentials(Some(name)).await.map(|c| (StatusCode::OK, json!({ "credentials": c })))
        }
        (&Method::PUT, ["v1", "tenants", name, "credentials", upstream]) => {
            match (query_param(&query, "user"), serde_json::from_slice::<CredentialBody>(&body)) {
                (Ok(user), Ok(c)) => {
                    let headers = c.headers.into_iter().collect();
                    admin
                        .set_credential(name, user.as_deref(), upstream, headers)
                        .await
                        .map(|row| (StatusCode::OK, json!(row)))
                }
                (Err(e), _) => Err(e),
                (_, Err(e)) => {
                    Err(AdminError::Invalid(format!("body: {e} (expected {{\"headers\": {{\"Name\": \"value\"}}}})")))
                }
            }
        }
        (&Method::DELETE, ["v1", "tenants", name, "credentials", upstream]) => match query_param(&query, "user") {
            Ok(user) => admin
                .delete_credential(name, user.as_deref(), upstream)
                .await
                .map(|()| (StatusCode::NO_CONTENT, json!(null))),
            Err(e) => Err(e),
        },
        (&Method::GET, ["v1", "upstreams"]) => admin.registered_upstreams().await.map(|registry| {
            let running = admin.upstream_status();
            (StatusCode::OK, json!({ "upstreams": running, "registry": registry }))
        }),
        (&Method::GET, ["v1", "upstreams", name]) => admin.registered_upstreams().await.and_then(|registry| {
            let running = admin.upstream_status().unwrap_or_default().into_iter().find(|u| u["name"] == *name);
            let registered = registry.into_iter().find(|r| r.name == *name);
            if running.is_none() && registered.is_none() {
                return Err(AdminError::Store(DbError::NotFound(format!("upstream {name:?}"))));
            }
            Ok((StatusCode::OK, json!({ "name": name, "running": running, "registered": registered })))
        }),
        (&Method::PUT, ["v1", "upstreams", name]) => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(spec) => admin
                .put_upstream(name, spec, switchboard_core::time::now_ms())
                .await
                .map(|(r, replaced)| (if replaced { StatusCode::OK } else { StatusCode::CREATED }, json!(r))),
            Err(e) => Err(AdminError::Invalid(format!("body: {e}"))),
        },
        (&Method::DELETE, ["v1", "upstreams", name]) => {
            admin.remove_upstream(name).await.map(|()| (StatusCode::NO_CONTENT, json!(null)))
        }
        (&Method::GET, ["v1", "usage"]) => match usage_query(&query) {
            Ok((q, csv)) => match admin.usage(&q).await {
                Ok(rows) if csv => {
                    let text = switchboard_db::usage::to_csv(&q.group_by, &rows);
                    let mut response = Response::new(Body::full(Bytes::from(text)));
                    response
                        .headers_mut()
                        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/csv; charset=utf-8"));
                    return response;
                }
                Ok(rows) => Ok((
                    StatusCode::OK,
                    json!({
                        "from": format_time(q.from_ms),
                        "to": format_time(q.to_ms),
                        "method": q.method,
                        "group_by": q.group_by,
                        "usage": rows,
                    }),
                )),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        (&Method::GET, ["v1", "calls", "stream"]) => match query_param(&query, "tenant") {
            Ok(tenant) => return admin.call_feed(tenant),
            Err(e) => Err(e),
        },
        (&Method::GET, ["v1", "catalog"]) => match catalog_query(&query) {
            Ok((tenant, q)) => match admin.catalog(&tenant, q.as_deref()) {
                Ok(Some(found)) => Ok((StatusCode::OK, found)),
                Ok(None) => Err(AdminError::Store(DbError::NotFound(
                    "the catalog (served by a running router's admin listener)".into(),
                ))),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        (&Method::GET, ["v1", "pins"]) => match pins_query(&query) {
            Ok(q) => admin.pins(q.tenant.as_deref(), q.waiting, q.limit, q.offset).await.map(|pins| {
                // A full page may have more after it.
                let next = (pins.len() == q.limit as usize).then(|| q.offset + pins.len() as u64);
                (StatusCode::OK, json!({ "pins": pins, "next_offset": next }))
            }),
            Err(e) => Err(e),
        },
        (&Method::POST, ["v1", "pins", decision @ ("approve" | "reject")]) => {
            match serde_json::from_slice::<PinDecision>(&body) {
                Ok(d) if *decision == "approve" => admin
                    .approve_pin(&d.tenant, &d.tool, &d.digest, d.by.as_deref().unwrap_or("api"))
                    .await
                    .map(|p| (StatusCode::OK, json!(p))),
                Ok(d) => admin
                    .reject_pin(&d.tenant, &d.tool, &d.digest, d.by.as_deref().unwrap_or("api"))
                    .await
                    .map(|()| (StatusCode::NO_CONTENT, json!(null))),
                Err(e) => Err(AdminError::Invalid(format!(
                    "body: {e} (expected {{\"tenant\": …, \"tool\": …, \"digest\": the waiting definition's}})"
                ))),
            }
        }
        (&Method::POST, ["v1", "vault", "rotate"]) => admin.rotate_vault().await.map(|r| (StatusCode::OK, json!(r))),
        (&Method::GET, ["v1", "edge", "devices"]) => {
            let tenant = query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| *k == "tenant")
                .map(|(_, v)| v.to_owned());
            Ok((StatusCode::OK, json!({ "devices": admin.edge_devices(tenant.as_deref()) })))
        }
        (&Method::GET, ["v1", "audit"]) => match audit_query(&query) {
            Ok(q) => admin.audit(&q).await.map(|records| {
                let records: Vec<serde_json::Value> = records
                    .into_iter()
                    .map(|(seq, r)| {
                        let mut v = json!(r);
                        v["seq"] = json!(seq);
                        v["at"] = json!(format_time(r.at_ms));
                        v
                    })
                    .collect();
                (StatusCode::OK, json!({ "records": records }))
            }),
            Err(e) => Err(e),
        },
        (_, ["v1", ..]) => {
            return problem(StatusCode::NOT_FOUND, format!("no route {method} {path}; see docs/admin-api.yaml"))
        }
        _ => return problem(StatusCode::NOT_FOUND, "the admin API is under /v1/"),
    };
    match result {
        Ok((StatusCode::NO_CONTENT, _)) => {
            let mut response = Response::new(Body::Empty);
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        Ok((status, value)) => reply(status, value),
        Err(e) => {
            if e.status() == StatusCode::SERVICE_UNAVAILABLE {
                tracing::warn!(error = %e, "admin API: database error");
            }
            problem(e.status(), e)
        }
    }
}

/// An expiry from `expires_in` (a duration from now) or `expires_at_ms`.
pub fn expiry(expires_in: Option<&str>, expires_at_ms: Option<i64>) -> Result<Option<i64>, AdminError> {
    match (expires_in, expires_at_ms) {
        (Some(_), Some(_)) => Err(AdminError::Invalid("give expires_in or expires_at_ms, not both".into())),
        (Some(text), None) => {
            let d = crate::config::parse_duration(text).map_err(|e| AdminError::Invalid(format!("expires_in: {e}")))?;
            Ok(Some(now_ms() + d.as_millis() as i64))
        }
        (None, at) => Ok(at),
    }
}

/// `POST /v1/pins/approve` and `/reject`: which waiting definition.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PinDecision {
    tenant: String,
    tool: String,
    digest: String,
    /// The operator's interface (`api` unless the console says so).
    #[serde(default)]
    by: Option<String>,
}

/// `GET /v1/catalog`'s query: `tenant` (required) and `q`.
fn catalog_query(query: &str) -> Result<(String, Option<String>), AdminError> {
    let (mut tenant, mut q) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "tenant" => tenant = Some(percent_decode(v)),
            "q" => q = Some(percent_decode(v)),
            _ => return Err(AdminError::Invalid(format!("unknown query parameter {k:?} (tenant, q)"))),
        }
    }
    Ok((tenant.ok_or_else(|| AdminError::Invalid("tenant: required".into()))?, q))
}

/// The most pins one listing returns (`GET /v1/pins?limit=`).
pub const MAX_PINS_PAGE: u32 = 1_000;

/// `GET /v1/pins`' query.
struct PinsQuery {
    tenant: Option<String>,
    /// Only the definitions waiting for a decision.
    waiting: bool,
    limit: u32,
    offset: u64,
}

/// `GET /v1/pins`' query: `tenant`, `waiting=true`, `limit` (at most
/// 1,000, the default) and `offset`.
fn pins_query(query: &str) -> Result<PinsQuery, AdminError> {
    let max = MAX_PINS_PAGE;
    let mut q = PinsQuery { tenant: None, waiting: false, limit: max, offset: 0 };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "tenant" => q.tenant = Some(percent_decode(v)),
            "waiting" => q.waiting = matches!(v, "true" | "1" | ""),
            "limit" => {
                q.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| AdminError::Invalid(format!("limit: a number from 1 to {max}")))?
            }
            "offset" => q.offset = v.parse().map_err(|_| AdminError::Invalid("offset: a number".into()))?,
            _ => {
                return Err(AdminError::Invalid(format!(
                    "unknown query parameter {k:?} (tenant, waiting, limit, offset)"
                )))
            }
        }
    }
    Ok(q)
}

/// A credential as `PUT`: header name → value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialBody {
    headers: BTreeMap<String, String>,
}

/// The one query parameter a route takes (`name`), percent-decoded;
/// any other is an error.
fn query_param(query: &str, name: &str) -> Result<Option<String>, AdminError> {
    let mut found = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != name {
            return Err(AdminError::Invalid(format!("unknown query parameter {k:?}")));
        }
        found = Some(percent_decode(v));
    }
    Ok(found)
}

/// `GET /v1/usage`'s query: `from` and `to` (times or durations ago;
/// default the last 30 days), `tenant`, `method` (`tools/call` by default,
/// `*` for all), `group_by` (of tenant, key, user, upstream, tool; default
/// tenant,upstream,tool), `format` (json or csv). Returns the query and
/// whether CSV was asked for.
pub fn usage_query(query: &str) -> Result<(UsageQuery, bool), AdminError> {
    let now = now_ms();
    let mut q = UsageQuery {
        from_ms: now - 30 * 86_400_000,
        to_ms: now + 1,
        tenant: None,
        method: Some("tools/call".into()),
        group_by: vec![Dimension::Tenant, Dimension::Upstream, Dimension::Tool],
    };
    let mut csv = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "from" => q.from_ms = parse_since(&v).map_err(|e| AdminError::Invalid(format!("from: {e}")))?,
            "to" => q.to_ms = parse_since(&v).map_err(|e| AdminError::Invalid(format!("to: {e}")))?,
            "tenant" => q.tenant = Some(v),
            "method" => q.method = (v != "*").then_some(v),
            "group_by" => {
                q.group_by = v
                    .split(',')
                    .filter(|d| !d.trim().is_empty())
                    .map(|d| {
                        Dimension::parse(d.trim()).ok_or_else(|| {
                            AdminError::Invalid(format!(
                                "group_by: {d:?} is not one of tenant, key, user, upstream, tool"
                            ))
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "format" => {
                csv = match v.as_str() {
                    "csv" => true,
                    "json" => false,
                    other => return Err(AdminError::Invalid(format!("format: {other:?} is not json or csv"))),
                }
            }
            other => return Err(AdminError::Invalid(format!("unknown query parameter {other:?}"))),
        }
    }
    Ok((q, csv))
}

fn audit_query(query: &str) -> Result<AuditQuery, AdminError> {
    let mut q = AuditQuery { limit: 100, ..AuditQuery::default() };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "tenant" => q.tenant = Some(v),
            "since" => q.since_ms = Some(parse_since(&v).map_err(AdminError::Invalid)?),
            "after_seq" => {
                q.after_seq = Some(v.parse().map_err(|_| AdminError::Invalid("after_seq: not a number".into()))?)
            }
            "limit" => {
                q.limit =
                    v.parse::<i64>().map_err(|_| AdminError::Invalid("limit: not a number".into()))?.clamp(1, 10_000)
            }
            other => return Err(AdminError::Invalid(format!("unknown query parameter {other:?}"))),
        }
    }
    Ok(q)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---- Times -----------------------------------------------------------------

/// `since` as Unix milliseconds: a duration ago (`"15m"`, `"2h"`, `"7d"`), an
/// RFC 3339 UTC time (`"2026-11-22T08:00:00Z"`), a date (`"2026-11-22"`), or
/// Unix milliseconds.
pub fn parse_since(text: &str) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<i64>() {
        if ms > 100_000_000_000 {
            return Ok(ms);
        }
    }
    if let Ok(d) = crate::config::parse_duration(t) {
        return Ok(now_ms() - d.as_millis() as i64);
    }
    parse_time(t).ok_or_else(|| {
        format!("{text:?} is not a time: use a duration ago (\"15m\", \"7d\"), \"2026-11-22T08:00:00Z\" or a date")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings() {
        let q = audit_query("tenant=acme%2Dcorp&limit=5&since=2026-01-01").unwrap();
        assert_eq!(q.tenant.as_deref(), Some("acme-corp"));
        assert_eq!(q.limit, 5);
        assert!(audit_query("colour=blue").is_err());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abcdefghijklmnop", b"abcdefghijklmnop"));
        assert!(!same_secret(b"abcdefghijklmnop", b"abcdefghijklmnoq"));
        assert!(!same_secret(b"", b"abcdefghijklmnop"));
    }
}
