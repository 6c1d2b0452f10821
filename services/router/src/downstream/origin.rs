//! Where a request stream's events come from, recorded with its copy in
//! Redis so that a replica taking the stream over (`takeover.rs`) can go
//! on with it, or at least answer the request.

use serde_json::value::RawValue;
use switchboard_core::UpstreamId;
use switchboard_protocol::Method;
use switchboard_session::events::Log;

use crate::app::App;

/// Where a request stream's events come from, recorded with its copy in
/// Redis so that another replica can continue it if this one dies
/// (`takeover.rs`): the upstream, its session (`None`: one no other replica
/// can continue, such as a stdio process's), the request's id as the
/// upstream knows it, the method. Without a session the replica taking
/// the stream over still answers the request, with an error.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Origin {
    pub upstream: String,
    #[serde(default)]
    pub at: Option<switchboard_upstream::UpstreamSession>,
    pub id: Box<RawValue>,
    pub method: String,
}

/// Records where a request stream comes from with its shared copy, if it
/// has one (see [`Origin`]).
pub(crate) fn record_origin(
    app: &App,
    log: &Log,
    u: UpstreamId,
    at: Option<switchboard_upstream::UpstreamSession>,
    id: &RawValue,
    method: Method,
) {
    if !log.is_spilled() {
        return;
    }
    let origin = Origin {
        upstream: app.upstreams[u].name.to_string(),
        at,
        id: id.to_owned(),
        method: method.as_str().to_owned(),
    };
    log.set_origin(serde_json::to_string(&origin).expect("serializable"));
}
