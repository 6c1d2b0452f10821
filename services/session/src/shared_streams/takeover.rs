//! Request streams whose replica died before the answer, taken over by
//! another (see the module docs of `shared_streams`): which replica
//! continues one is a compare-and-set on its owner in Redis.

use std::sync::Arc;

use switchboard_core::redis::RedisError;

use super::{Op, SharedStreams, ORPHAN_MS, TAKEOVER_GAP};

/// A request stream this replica took over from a replica that died before
/// the answer (see [`SharedStreams::on_abandoned`]).
#[derive(Debug, Clone)]
pub struct Takeover {
    /// Where its events came from, as the replica that died recorded it
    /// ([`Log::set_origin`](crate::events::Log::set_origin)).
    pub origin: String,
    /// Where the upstream could resume its stream, if it said.
    pub resume_point: Option<String>,
    /// The number of the next event.
    pub next: u64,
}

/// What a replica does with a request stream it took over: the session id,
/// the stream, where it came from. It appends to the stream (as its owner
/// now) until the answer, and closes it.
pub type AbandonedHandler = Box<dyn Fn(&str, u64, Takeover) + Send + Sync>;

/// What a take-over attempt found.
pub(super) enum TakeOver {
    /// This replica continues the stream.
    Taken(Takeover),
    /// A live replica serves it (perhaps one that took it over first).
    Served,
    /// Nobody can continue it.
    Impossible,
}

impl SharedStreams {
    /// Sets what to do with a request stream this replica takes over: a
    /// reader here found it abandoned by the replica serving it (that
    /// replica died before the answer) and took it over.
    pub fn on_abandoned(&self, handler: AbandonedHandler) {
        let _ = self.on_abandoned.set(handler);
    }

    /// Tries to take over an abandoned request stream.
    pub(super) async fn take_over(&self, session: &str, stream: u64) -> Result<TakeOver, RedisError> {
        let mut invocation = self.take_over.prepare_invoke();
        invocation.key(self.meta_key(session, stream));
        invocation.arg(&self.replica).arg(self.heartbeat_prefix()).arg(ORPHAN_MS);
        let value: redis::Value =
            self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?;
        let redis::Value::Array(parts) = value else { return Ok(TakeOver::Impossible) };
        let mut parts = parts.into_iter();
        let text = |v: Option<redis::Value>| -> Option<String> { v.and_then(|v| redis::from_redis_value(&v).ok()) };
        Ok(match parts.next() {
            Some(redis::Value::Int(1)) => {
                let (Some(origin), resume, Some(last)) = (text(parts.next()), text(parts.next()), text(parts.next()))
                else {
                    return Ok(TakeOver::Impossible);
                };
                let next = last.parse::<i64>().map_or(0, |n| (n + 1).max(0) as u64) + TAKEOVER_GAP;
                TakeOver::Taken(Takeover { origin, resume_point: resume.filter(|r| !r.is_empty()), next })
            }
            Some(redis::Value::Int(2)) => TakeOver::Served,
            _ => TakeOver::Impossible,
        })
    }

    /// Queues where a request stream's events come from (see [`Takeover`]).
    pub fn set_origin(&self, session: &Arc<str>, stream: u64, origin: String) {
        let _ = self.enqueue(Op::Origin { session: session.clone(), stream, origin });
    }
}
