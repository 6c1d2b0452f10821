//! The downstream side of upstreams that act for each user: the pages of
//! an authorization (`/oauth/start`, `/oauth/callback`, the client ID
//! metadata document), an upstream's refusal turned into the link the
//! user opens, and each user's own lists of those upstreams (whether their
//! tokens come from an authorization or a token exchange).

use std::sync::Arc;

use http::{HeaderValue, Response, StatusCode};
use switchboard_core::policy::Principal;
use switchboard_protocol::methods::ListKind;
use switchboard_session::Session;
use switchboard_upstream::UpstreamError;

use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use crate::tools::Page;

/// `GET /oauth/start`, `/oauth/callback` or `/oauth/client-metadata.json`.
pub async fn page(app: &Arc<App>, path: &str, query: &str) -> Response<Body> {
    let delegation = &app.delegation;
    let (status, text) = match path {
        "/oauth/start" => match delegation.start(query).await {
            Ok(location) => {
                let mut response = respond::text(StatusCode::FOUND, "to the authorization server\n");
                if let Ok(location) = HeaderValue::from_str(&location) {
                    response.headers_mut().insert(http::header::LOCATION, location);
                }
                return no_store(response);
            }
            Err(page) => page,
        },
        "/oauth/callback" => delegation.callback(query).await,
        _ => {
            let body = serde_json::to_vec(&delegation.client_metadata()).expect("serializable");
            return respond::json(body.into());
        }
    };
    no_store(respond::owned_text(status, format!("{text}\n")))
}

fn no_store(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `err` as its caller should see it: an upstream that acts for each user
/// refusing the caller's authorization becomes the link that gets it
/// (`None`: as it is).
pub fn translate(app: &App, who: Option<&Principal>, session: Option<&Session>, err: &Error) -> Option<Error> {
    if let (Some(who), Error::Upstream { upstream, source: UpstreamError::Unauthorized { status: 401, .. } }) =
        (who, err)
    {
        if app.exchange.covers(upstream) {
            app.exchange.refused(who, upstream);
        }
    }
    let delegation = &app.delegation;
    let (upstream, status, challenge) = match err {
        Error::Upstream { upstream, source: UpstreamError::Unauthorized { status, challenge } } => {
            (upstream, *status, Some(challenge.as_str()))
        }
        // No token yet, and the upstream needs one: nothing was sent.
        Error::CredentialRequired { upstream, .. } => (upstream, 0, None),
        _ => return None,
    };
    if !delegation.covers(upstream) {
        return None;
    }
    let who = who?;
    if status == 401 {
        delegation.refused(who, upstream);
    }
    let url = delegation.link(who, upstream, challenge)?;
    Some(Error::AuthorizationRequired { upstream: upstream.clone(), url, elicitation: takes_url_elicitation(session) })
}

/// The catalog that knows upstream `u`'s era for `who`: theirs for an
/// upstream acting for each user (only their token reaches it), else the
/// router's.
pub fn era_catalog(app: &App, who: &Principal, u: switchboard_core::UpstreamId) -> Arc<switchboard_catalog::Catalog> {
    match app.upstreams[u].config.per_user {
        true => app.user_catalogs.catalog(who, &app.upstreams, &app.config.catalog),
        false => app.catalog.clone(),
    }
}

/// Whether upstream `u` asks its users for their consent (and so offers
/// an `authorize` tool until it is given).
fn asks_consent(app: &App, u: switchboard_core::UpstreamId) -> bool {
    app.delegation.covers(&app.upstreams[u].name)
}

/// Whether the client declared URL-mode elicitation.
fn takes_url_elicitation(session: Option<&Session>) -> bool {
    session.is_some_and(|s| {
        serde_json::from_str::<serde_json::Value>(s.capabilities.get())
            .is_ok_and(|c| c.pointer("/elicitation/url").is_some())
    })
}

/// The name of the tool that asks `who` to authorize upstream `u`,
/// offered while the upstream lists nothing for them.
fn authorize_name(app: &App, u: switchboard_core::UpstreamId) -> String {
    let upstream = &app.upstreams[u];
    switchboard_catalog::naming::expose_name(&upstream.config.prefix, &app.config.catalog.separator, "authorize")
}

/// The upstreams acting for each user that `who`'s tenant sees.
fn own_upstreams<'a>(app: &'a App, who: &'a Principal) -> impl Iterator<Item = switchboard_core::UpstreamId> + 'a {
    app.upstreams.iter().filter(move |u| u.config.per_user && who.tenant.sees_upstream(u.id)).map(|u| u.id)
}

/// Adds to `page` the items of `kind` that the upstreams acting for each
/// user list for `who` (fetched with their tokens, and kept as a catalog
/// of theirs), and, for tools, the `authorize` tool of each such upstream
/// asking for consent that lists nothing for them yet. On the last page only.
pub async fn list_own(app: &App, who: &Principal, kind: ListKind, page: &mut Page) {
    let catalogs = &app.user_catalogs;
    if page.is_cut() || own_upstreams(app, who).next().is_none() {
        return;
    }
    let catalog = catalogs.catalog(who, &app.upstreams, &app.config.catalog);
    let mine: Vec<_> = own_upstreams(app, who).collect();
    let snapshot = catalog.ensure_for(&[kind], |u| mine.contains(&u)).await;
    for item in &snapshot.list(kind).items {
        if mine.contains(&item.upstream) && crate::tools::sees(&who.tenant, kind, item) {
            page.push(&item.json);
        }
    }
    if kind != ListKind::Tools {
        return;
    }
    for u in mine {
        if catalog.listed(u, ListKind::Tools) || !asks_consent(app, u) {
            continue;
        }
        let name = &app.upstreams[u].name;
        let tool = serde_json::json!({
            "name": authorize_name(app, u),
            "title": format!("Connect {name}"),
            "description": format!("Authorize Switchboard to reach {name} for you: returns a link to open; once done, {name}'s tools appear in this list."),
            "inputSchema": {"type": "object", "properties": {}},
        });
        page.push(&serde_json::to_vec(&tool).expect("serializable"));
    }
}

/// The tool `name` of an upstream acting for each user, as `who`'s own
/// catalog has it; `Ok(None)` if it is none of theirs. Its `authorize`
/// tool answers with the link (as a missing credential, which the
/// exchange turns into the link).
pub async fn resolve_own(
    app: &App,
    who: &Principal,
    name: &str,
) -> Result<Option<(switchboard_core::UpstreamId, Arc<[u8]>)>, Error> {
    let catalogs = &app.user_catalogs;
    if own_upstreams(app, who).next().is_none() {
        return Ok(None);
    }
    let catalog = catalogs.catalog(who, &app.upstreams, &app.config.catalog);
    let mine: Vec<_> = own_upstreams(app, who).collect();
    let found = |snapshot: &switchboard_catalog::Snapshot| {
        snapshot
            .list(ListKind::Tools)
            .get(name)
            .filter(|item| mine.contains(&item.upstream) && crate::tools::sees(&who.tenant, ListKind::Tools, item))
            .map(|item| (item.upstream, item.original.clone()))
    };
    if let Some(hit) = found(&catalog.current()) {
        return Ok(Some(hit));
    }
    if let Some(hit) = found(&*catalog.ensure_for(&[ListKind::Tools], |u| mine.contains(&u)).await) {
        return Ok(Some(hit));
    }
    for &u in &mine {
        if !catalog.listed(u, ListKind::Tools) && asks_consent(app, u) && authorize_name(app, u) == name {
            let upstream = app.upstreams[u].name.clone();
            // As the upstream refused its list, if it did (its challenge
            // says what to ask for); else no token yet.
            return Err(match catalog.refusal(u) {
                Some((status, challenge)) => {
                    Error::Upstream { upstream, source: UpstreamError::Unauthorized { status, challenge } }
                }
                None => {
                    let message = format!("upstream {upstream:?} needs your authorization");
                    Error::CredentialRequired { upstream, message }
                }
            });
        }
        // A tool of an upstream taking exchanged tokens that lists nothing
        // for this caller: why (no token to exchange, or the exchange failed).
        let upstream = &app.upstreams[u];
        let exchanging = app.exchange.covers(&upstream.name);
        let prefix = format!("{}{}", upstream.config.prefix, app.config.catalog.separator);
        if exchanging
            && !catalog.listed(u, ListKind::Tools)
            && !upstream.config.prefix.is_empty()
            && name.starts_with(&prefix)
        {
            if let Err(missing) = app.keychain.current(&who.tenant.name, who.user.as_deref(), &upstream.name, true) {
                return Err(Error::CredentialRequired { upstream: upstream.name.clone(), message: missing.0 });
            }
        }
    }
    Ok(None)
}
