//! Accepting connections and routing paths: `/mcp` to the MCP endpoint,
//! `/metrics`, `/healthz` and `/readyz` for operators.
//!
//! [`serve`] is the whole server: tests bind `127.0.0.1:0` and run it
//! in-process; `main.rs` runs it on the configured address.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::app::App;
use crate::auth::{ClientCert, LastCaller};
use crate::body::Body;
use crate::config::Config;
use crate::connections::{self, Activity, Connections, Tracked};
use crate::downstream::{self, respond};

/// Serves the router on `listener` until `shutdown` completes, then drains
/// (still answering on `listener`): new sessions are refused, GET streams
/// end, requests in flight get up to `server.shutdown_grace` to finish; then
/// the listener closes, and upstream sessions and child processes are closed.
pub async fn serve(listener: TcpListener, config: Config, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    serve_with(listener, Listeners::default(), config, shutdown).await
}

/// The listeners besides the MCP endpoint's, bound by the caller (tests bind
/// `127.0.0.1:0`). An edge listener not given here is bound from
/// `edge.listen`, if set.
#[derive(Default)]
pub struct Listeners {
    /// Edge devices (`[edge]`).
    pub edge: Option<TcpListener>,
    /// The admin API, its operations and its token (`[admin]`).
    pub admin: Option<(TcpListener, crate::admin::Admin, String)>,
    /// The configuration file, reloaded on SIGHUP and when it changes.
    pub reload: Option<crate::reload::Source>,
    /// Threads of their own that serve the MCP listener's connections
    /// beside the caller's runtime, each a current-thread runtime
    /// (`server.worker_threads` less one, as `main.rs` runs the router on
    /// a current-thread runtime). 0: the caller's runtime serves them all.
    pub threads: usize,
}

/// [`serve`], with the edge listener and the admin API: all of them stop
/// together.
pub async fn serve_with(
    listener: TcpListener,
    extra: Listeners,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let edge_tls = match &config.edge.tls {
        Some((cert, key)) => Some(switchboard_devices::tls_acceptor(cert, key)?),
        None => None,
    };
    let edge_listener = match (extra.edge, config.edge.listen) {
        (Some(l), _) => Some(l),
        (None, Some(addr)) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("binding the edge listener to {addr}: {e}")))?,
        ),
        (None, None) => None,
    };
    let certificates = match &config.server.tls {
        Some((cert, key)) => Some(crate::tls::Certificates::load(cert, key)?),
        None => None,
    };
    let clients = match &config.mtls {
        Some(mtls) => Some(
            crate::tls::client_verifier(&mtls.ca, mtls.required)
                .map_err(|e| std::io::Error::new(e.kind(), format!("mtls.ca: {e}")))?,
        ),
        None => None,
    };
    let tls = certificates.as_ref().map(|c| c.acceptor(clients)).transpose()?;
    let workers = crate::workers::Workers::start(extra.threads)
        .map_err(|e| std::io::Error::new(e.kind(), format!("starting the connection threads: {e}")))?;
    let app = App::new(config)?;
    crate::downstream::takeover::install(&app);
    app.prepare().await?;
    app.start();
    if let Ok(addr) = listener.local_addr() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(
            %addr,
            upstreams = app.upstreams.len(),
            threads = workers.len(),
            "switchboard listening on {scheme}://{addr}/mcp"
        );
    }
    let (stop_others, others_stopped) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = others_stopped.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let mut others = Vec::new();
    if let Some(certificates) = certificates {
        others.push(tokio::spawn(certificates.watch(stopped())));
    }
    if let Some(edge) = edge_listener {
        let host = Arc::new(crate::edge::EdgeHost(app.clone()));
        others.push(tokio::spawn(switchboard_devices::serve(app.edge.clone(), host, edge, edge_tls, stopped())));
    }
    let reloads = match extra.reload {
        Some(source) => match crate::reload::Reloads::new(source, app.metrics.registry()) {
            Ok(reloads) => {
                let reloads = Arc::new(reloads);
                // The registry's upstreams join the file's before clients come.
                reloads.refresh_registry(&app).await;
                reloads.start(Arc::downgrade(&app), stopped());
                Some(reloads)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the configuration file will not be reloaded while running");
                None
            }
        },
        None => None,
    };
    if let Some((admin_listener, admin, token)) = extra.admin {
        let admin = admin.with_edge(app.edge.clone()).with_vault(app.vault.clone()).with_running(&app, reloads.clone());
        let server = &app.config.server;
        let conns = Connections::new(
            connections::Limits {
                header_timeout: server.header_timeout,
                idle_timeout: server.idle_timeout,
                max: crate::admin::MAX_CONNECTIONS,
                per_address: crate::admin::MAX_CONNECTIONS_PER_ADDRESS,
            },
            app.metrics.registry(),
            connections::Listener::Admin,
        );
        let admin_certificates = match &app.config.admin.tls {
            Some((cert, key)) => Some(crate::tls::Certificates::load(cert, key)?),
            None => None,
        };
        let admin_tls = admin_certificates.as_ref().map(|c| c.acceptor(None)).transpose()?;
        if let Some(certificates) = admin_certificates {
            others.push(tokio::spawn(certificates.watch(stopped())));
        }
        let stop = stopped();
        others.push(tokio::spawn(async move {
            if let Err(e) = crate::admin::serve_bounded(admin_listener, conns, admin_tls, admin, token, stop).await {
                tracing::error!(error = %e, "the admin API stopped");
            }
        }));
    }
    let server = &app.config.server;
    connections::raise_open_files_limit(server.max_connections);
    let conns = Connections::new(
        connections::Limits {
            header_timeout: server.header_timeout,
            idle_timeout: server.idle_timeout,
            max: server.max_connections,
            per_address: server.max_connections_per_address,
        },
        app.metrics.registry(),
        connections::Listener::Mcp,
    );
    let graceful = GracefulShutdown::new();
    // The connections the router's own HTTP/1.1 path serves: told when
    // draining begins; the drain waits for every one to end.
    let (drain, drain_watch) = tokio::sync::watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .keep_alive(true)
        // Timed by `connections.rs` instead: from accept to the first
        // request, and between requests (hyper's own would cut idle
        // keep-alive connections at it).
        .header_read_timeout(None)
        .timer(hyper_util::rt::TokioTimer::new());
    builder.http2().timer(hyper_util::rt::TokioTimer::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (stream, address) = connections::accept(&listener, &conns) => {
                let Ok(admitted) = conns.admit(address) else {
                    connections::refuse(stream);
                    continue;
                };
                let served = Served {
                    app: app.clone(),
                    conns: conns.clone(),
                    builder: builder.clone(),
                    watcher: Some(graceful.watcher()),
                    drain: Some(drain_watch.clone()),
                };
                let tls = tls.clone();
                workers.deal(stream, move |stream| served.connection(stream, tls, admitted));
            }
            () = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down: draining requests in flight");
    app.begin_shutdown();
    let _ = drain.send(true);
    drop(drain_watch);
    let grace = app.config.server.shutdown_grace;
    let deadline = tokio::time::Instant::now() + grace;
    let drain = async {
        let both = async { tokio::join!(graceful.shutdown(), drain.closed()) };
        tokio::time::timeout(grace, both).await.is_ok()
            && app.sessions.wait_for_requests(deadline.saturating_duration_since(tokio::time::Instant::now())).await
    };
    tokio::pin!(drain);
    // While draining, the listener stays open so that clients still sent
    // here get an answer rather than a refused connection: new sessions and
    // GET streams 503 (Retry-After), `/readyz` 503, requests of existing
    // sessions served. One request per connection (no keep-alive).
    let mut draining = auto::Builder::new(TokioExecutor::new());
    draining.http1().keep_alive(false).header_read_timeout(None).timer(hyper_util::rt::TokioTimer::new());
    draining.http2().timer(hyper_util::rt::TokioTimer::new());
    let drained = loop {
        tokio::select! {
            drained = &mut drain => break drained,
            (stream, address) = connections::accept(&listener, &conns) => {
                let Ok(admitted) = conns.admit(address) else {
                    connections::refuse(stream);
                    continue;
                };
                let served =
                    Served { app: app.clone(), conns: conns.clone(), builder: draining.clone(), watcher: None, drain: None };
                let tls = tls.clone();
                workers.deal(stream, move |stream| served.connection(stream, tls, admitted));
            }
        }
    };
    drop(listener);
    if !drained {
        tracing::warn!(?grace, "requests still in flight after the shutdown grace period; closing anyway");
    }
    let _ = stop_others.send(true);
    for task in others {
        let _ = task.await;
    }
    app.close().await;
    workers.stop().await;
    tracing::info!("shut down");
    Ok(())
}

/// What serves one accepted connection.
struct Served {
    app: Arc<App>,
    conns: Arc<Connections>,
    builder: auto::Builder<TokioExecutor>,
    /// Graceful shutdown's, except while draining.
    watcher: Option<hyper_util::server::graceful::Watcher>,
    /// The drain's, for the router's own HTTP/1.1 path, except while draining.
    drain: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Served {
    /// Serves `stream` (after the TLS handshake, within the header
    /// timeout, with `tls`) until it ends or is closed for idleness.
    async fn connection(
        self,
        stream: tokio::net::TcpStream,
        tls: Option<tokio_rustls::TlsAcceptor>,
        admitted: connections::Admitted,
    ) {
        // The client's address, for spans (only when traces are on).
        let peer = self.app.telemetry.tracing().then(|| stream.peer_addr().ok()).flatten();
        match tls {
            None => self.fast_then_hyper(stream, admitted, (None, peer)).await,
            Some(acceptor) => {
                if let Some(stream) = connections::tls_handshake(&acceptor, stream, &self.conns).await {
                    let cert = client_cert(&stream);
                    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        self.serve(TokioIo::new(stream), Activity::new(), admitted, (cert, peer)).await;
                    } else {
                        self.fast_then_hyper(stream, admitted, (cert, peer)).await;
                    }
                }
            }
        }
    }

    /// Serves an HTTP/1.1 connection on the router's own path for as long
    /// as its requests are that path's, then hands it to hyper.
    async fn fast_then_hyper<S>(
        mut self,
        stream: S,
        admitted: connections::Admitted,
        (cert, peer): (Option<ClientCert>, Option<std::net::SocketAddr>),
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let mut extensions = http::Extensions::new();
        if let Some(cert) = &cert {
            extensions.insert(cert.clone());
        }
        if self.app.auth.remembers_callers() {
            extensions.insert(LastCaller::default());
        }
        if let Some(peer) = peer {
            extensions.insert(crate::exchange::Peer(peer));
        }
        let cx =
            crate::h1::Ctx { app: &self.app, conns: &self.conns, extensions: &extensions, drain: self.drain.take() };
        match crate::h1::serve(stream, cx).await {
            crate::h1::Ended::Closed => {}
            crate::h1::Ended::HandOff { io, requests, half_closed } => {
                let activity = Activity::new();
                if requests > 0 {
                    // Idle from now on, not waiting for a first request.
                    drop(activity.begin());
                }
                let mut served = self;
                if half_closed {
                    // Its end was read already: the requests it sent
                    // before it are answered, not taken for hung up.
                    served.builder.http1().half_close(true);
                }
                served.serve(TokioIo::new(io), activity, admitted, (cert, peer)).await;
            }
        }
    }

    async fn serve<I>(
        self,
        io: I,
        activity: Arc<Activity>,
        admitted: connections::Admitted,
        (cert, peer): (Option<ClientCert>, Option<std::net::SocketAddr>),
    ) where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let Served { app, conns, builder, watcher, .. } = self;
        let conn = builder.serve_connection(io, service(&app, &activity, cert, peer)).into_owned();
        match watcher {
            Some(watcher) => connections::supervise(watcher.watch(conn), admitted, activity, conns).await,
            None => connections::supervise(conn, admitted, activity, conns).await,
        }
    }
}

/// The verified client certificate of a TLS connection (mTLS), by its
/// subject; none if the client sent none (or its subject cannot be read).
fn client_cert(stream: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> Option<ClientCert> {
    let der = stream.get_ref().1.peer_certificates()?.first()?;
    match crate::subject::Subject::of_certificate(der) {
        Some(subject) => Some(ClientCert::new(subject)),
        None => {
            tracing::warn!(
                "a client certificate's subject could not be read; the connection has no certificate caller"
            );
            None
        }
    }
}

/// The HTTP service of one connection: [`route`], each request kept in
/// flight (for the idle timeout) until its answer's body is done, and
/// carrying the connection's client certificate, its [`LastCaller`] (when
/// requests carry credentials) and, for spans, the client's address.
fn service(
    app: &Arc<App>,
    activity: &Arc<Activity>,
    cert: Option<ClientCert>,
    peer: Option<std::net::SocketAddr>,
) -> impl hyper::service::Service<Request<Incoming>, Response = Response<Tracked<Body>>, Error = Infallible, Future: Send>
       + Clone {
    let app = app.clone();
    let activity = activity.clone();
    let last_caller = app.auth.remembers_callers().then(LastCaller::default);
    hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(cert) = &cert {
            req.extensions_mut().insert(cert.clone());
        }
        if let Some(last_caller) = &last_caller {
            req.extensions_mut().insert(last_caller.clone());
        }
        if let Some(peer) = peer {
            req.extensions_mut().insert(crate::exchange::Peer(peer));
        }
        let app = app.clone();
        let in_flight = activity.begin();
        async move {
            let response = respond::labelled(route(&app, req).await);
            Ok::<_, Infallible>(response.map(|body| Tracked::new(body, in_flight)))
        }
    })
}

async fn route(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    // RFC 9112: a 1.1 request without a Host (or with several) is refused
    // (HTTP/2 carries the authority in `:authority`; 1.0 has no Host).
    if req.version() == http::Version::HTTP_11 && req.headers().get_all(http::header::HOST).iter().count() != 1 {
        return downstream::transport::reject_unread(app, crate::error::Error::MissingHost);
    }
    let path = req.uri().path();
    // Legacy HTTP+SSE, under any path prefix (kept in the endpoint it announces).
    if let Some(prefix) = path.strip_suffix("/sse") {
        if req.method() == http::Method::GET {
            let prefix = prefix.to_owned();
            return downstream::legacy::open(app, req.headers(), req.extensions(), &prefix).await;
        }
    }
    if (path.ends_with("/messages") || path.ends_with("/message")) && req.method() == http::Method::POST {
        return downstream::legacy::message(app, req).await;
    }
    match path {
        "/mcp" => downstream::handle(app, req).await,
        "/metrics" => {
            let mut response = Response::new(Body::full(app.metrics.render()));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => respond::text(StatusCode::OK, "ok\n"),
        "/oauth/start" | "/oauth/callback" | "/oauth/client-metadata.json"
            if app.delegation.any() && req.method() == http::Method::GET =>
        {
            crate::downstream::authorize::page(app, path, req.uri().query().unwrap_or("")).await
        }
        "/readyz" => {
            if app.shutting_down() {
                respond::text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            } else if app.catalog.current().generation == 0 && !app.upstreams.is_empty() {
                respond::text(StatusCode::SERVICE_UNAVAILABLE, "warming up\n")
            } else {
                respond::text(StatusCode::OK, "ready\n")
            }
        }
        _ => match app.auth.resource_metadata(path) {
            // RFC 9728: the protected resource metadata, for OAuth clients.
            Some(metadata) if req.method() == http::Method::GET => {
                let mut response = respond::json(metadata);
                response.headers_mut().insert(http::header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
                response
            }
            _ => respond::text(StatusCode::NOT_FOUND, "not found: the MCP endpoint is /mcp\n"),
        },
    }
}
