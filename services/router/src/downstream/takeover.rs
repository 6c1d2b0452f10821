//! A call whose replica died before the answer, continued at this one.
//!
//! With shared streams, the replica relaying a request's upstream stream
//! records where it comes from (`forward::Origin`: the upstream, its
//! session, the request's id) and, with each event it copies to Redis, the
//! upstream's last event id. If that replica dies (its heartbeat goes, and
//! nothing is appended for a while), the replica where the client resumed
//! the stream takes it over (`SharedStreams::on_abandoned`) and continues
//! here: the upstream's stream is resumed after that event id
//! (`Channel::resume_stream`, `Last-Event-ID` towards the upstream) on the
//! session's upstream session, and relayed into the same stream up to the
//! answer. Where the upstream cannot resume (it gave no event ids, or
//! refuses), the stream ends with a JSON-RPC error for the request saying
//! why, so the client is answered either way.
//!
//! The call's audit record is not written here: it was the dead replica's,
//! and went with its memory.

use std::sync::Arc;
use switchboard_session::Relay as _;

use serde_json::value::RawValue;
use switchboard_protocol::jsonrpc::{self, code};
use switchboard_protocol::Method;
use switchboard_session::events::Log;
use switchboard_session::shared_streams::Takeover;
use switchboard_upstream::{Item, UpstreamError};

use super::forward::{step, Step};
use super::origin::Origin;
use crate::app::App;

/// Makes this replica continue the request streams its readers take over
/// (with shared streams; else nothing to do).
pub fn install(app: &Arc<App>) {
    let Some(shared) = app.sessions.shared_streams() else { return };
    let weak = Arc::downgrade(app);
    shared.on_abandoned(Box::new(move |session, stream, takeover| {
        if let Some(app) = weak.upgrade() {
            tokio::spawn(continue_call(app, Arc::from(session), stream, takeover));
        }
    }));
}

/// Continues the request stream `stream` of session `session_id`, taken
/// over from a replica that died: appends to it (from `takeover.next`) up
/// to the answer, or an error saying why there will be none; then closes it.
async fn continue_call(app: Arc<App>, session_id: Arc<str>, stream: u64, takeover: Takeover) {
    let Some(shared) = app.sessions.shared_streams().cloned() else { return };
    let log = Log::continuing(stream, takeover.next);
    log.spill(&shared, &session_id);
    let Ok(origin) = serde_json::from_str::<Origin>(&takeover.origin) else {
        tracing::warn!(session = %session_id, stream, "a request stream taken over says nothing usable of where it came from");
        log.close();
        return;
    };
    let outcome = relay(&app, &session_id, &origin, takeover.resume_point.as_deref(), &log).await;
    let name = &origin.upstream;
    match outcome {
        Ok(()) => {
            app.metrics.sessions.taken_over("resumed");
            tracing::info!(session = %session_id, stream, upstream = %name, "a call whose router replica stopped was resumed from its upstream here");
        }
        Err(why) => {
            app.metrics.sessions.taken_over("failed");
            tracing::info!(session = %session_id, stream, upstream = %name, %why, "a call whose router replica stopped could not be resumed; its client is told");
            let message =
                format!("the router replica relaying this call stopped before the answer, and {why}; call again");
            let client_id = client_id(&origin.id);
            log.push(&jsonrpc::error_response(Some(&client_id), code::INTERNAL_ERROR, &message, None));
        }
    }
    log.close();
}

/// The client's id of the request the upstream knows by `id`.
fn client_id(id: &RawValue) -> Box<RawValue> {
    match jsonrpc::client_id(id.get()) {
        std::borrow::Cow::Borrowed(_) => id.to_owned(),
        std::borrow::Cow::Owned(text) => RawValue::from_string(text).unwrap_or_else(|_| id.to_owned()),
    }
}

/// Resumes the upstream's stream and relays it into `log` up to the answer;
/// why it cannot, else.
async fn relay(
    app: &Arc<App>,
    session_id: &str,
    origin: &Origin,
    resume_point: Option<&str>,
    log: &Log,
) -> Result<(), String> {
    let name = &origin.upstream;
    let u = app.upstreams.find(name).ok_or_else(|| format!("this replica has no upstream {name:?}"))?;
    let Some(at) = &origin.at else {
        return Err(format!("upstream {name:?} cannot continue it at another replica"));
    };
    let resume_point =
        resume_point.ok_or_else(|| format!("upstream {name:?} gave no event ids to resume its stream from"))?;
    let session = match app.sessions.find(session_id).await {
        Ok(Some(session)) => session,
        _ => return Err("the session is gone".into()),
    };
    let channel =
        session.existing_channel(u).await.ok_or_else(|| format!("upstream {name:?} has no session for it"))?;
    if channel.upstream_session().as_ref() != Some(at) {
        return Err(format!("the session with upstream {name:?} it was on is gone"));
    }
    let upstream = &app.upstreams[u];
    let deadline = tokio::time::Instant::now() + upstream.config.timeout;
    let mut stream = tokio::time::timeout_at(deadline, channel.resume_stream(resume_point))
        .await
        .map_err(|_| format!("upstream {name:?} did not resume its stream within {:?}", upstream.config.timeout))?
        .map_err(|e| format!("upstream {name:?} could not resume its stream: {e}"))?;
    let method = Method::from_name(&origin.method);
    let id: &RawValue = &origin.id;
    let client = client_id(id);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next_item())
            .await
            .map_err(|_| format!("upstream {name:?} did not answer within {:?}", upstream.config.timeout))?;
        match next {
            Some(Ok(Item::Message(message))) => match step(app, &session, u, method, (id, &client), message, None) {
                Step::Done(answer, _) => {
                    log.push(&answer);
                    return Ok(());
                }
                Step::Relay(out, original, _) => {
                    if !log.offer(&out, stream.resume_point()) {
                        app.not_delivered(&session, u, &original, "client_backlog");
                    }
                }
                Step::Skip => {}
            },
            // The upstream ended its stream early again: it resumes itself.
            Some(Ok(Item::Paused { .. })) => {}
            Some(Err(e)) => return Err(format!("upstream {name:?} failed: {e}")),
            None => return Err(format!("upstream {name:?}: {}", UpstreamError::Closed)),
        }
    }
}
