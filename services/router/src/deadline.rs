//! A request's upstream deadline kept by the timer its connection already
//! has, rather than by a timer of its own.
//!
//! A `tokio::time::Sleep` made for every forwarded call costs a
//! registration in the runtime's timer wheel (a lock, an insertion) when
//! first polled and a removal (the lock again) when dropped, nearly always
//! unfired. The router's HTTP/1.1 path ([`crate::h1`]) has one timer per
//! connection for its own bounds, moved only when it fires early or must
//! fire sooner; while it serves a request it keeps that request's upstream
//! deadlines too ([`watch`]). A deadline sixty seconds away is then kept
//! with no timer work at all on most calls: the timer is already set
//! sooner, and is moved only when it fires.
//!
//! [`until`] asks the connection to keep its deadline when it is polled
//! inside such a connection's request, by that connection's task: its
//! waker is the one the connection polls with, so the timer's firing polls
//! it again. Anywhere else (hyper's connections, a spawned task, a future
//! polled with a waker of its own, as a `FuturesUnordered` gives its
//! members) it keeps its deadline with a `Sleep` of its own, as before.
//!
//! What passes between them is a thread-local set only for the length of
//! the connection's poll of its request: nothing outlives that poll.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::time::Instant;

thread_local! {
    static WATCH: Cell<Option<Watch>> = const { Cell::new(None) };
}

/// A connection's poll of its request, in progress on this thread.
#[derive(Clone, Copy)]
struct Watch {
    /// The connection's waker, by its addresses (data, vtable).
    waker: (usize, usize),
    /// The earliest deadline asked for during this poll.
    earliest: Option<Instant>,
    /// When the connection's timer last fired (read then): deadlines at or
    /// before it have passed.
    fired: Option<Instant>,
}

fn addresses(waker: &Waker) -> (usize, usize) {
    (waker.data() as usize, std::ptr::from_ref(waker.vtable()) as usize)
}

fn sooner(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What became of a deadline handed to the connection.
enum Kept {
    /// The connection keeps it: its timer will poll the asker again.
    Watched,
    /// It has passed (the connection's timer fired at or after it).
    Passed,
    /// No connection polls this asker: it keeps the deadline itself.
    NotHere,
}

fn keep(waker: &Waker, deadline: Instant) -> Kept {
    WATCH.with(|watch| {
        let Some(mut w) = watch.get() else { return Kept::NotHere };
        if w.waker != addresses(waker) {
            return Kept::NotHere;
        }
        if w.fired.is_some_and(|fired| fired >= deadline) {
            return Kept::Passed;
        }
        w.earliest = sooner(w.earliest, Some(deadline));
        watch.set(Some(w));
        Kept::Watched
    })
}

/// Polls `work` as a connection's request (with `cx`, the connection's
/// task's context), `fired` the time its timer last fired if it just did;
/// its output if done, else the earliest deadline asked for by the
/// [`until`]s in it that the connection keeps.
fn poll_watched<F: Future>(
    work: Pin<&mut F>,
    cx: &mut Context<'_>,
    fired: Option<Instant>,
) -> Result<F::Output, Option<Instant>> {
    let previous =
        WATCH.with(|watch| watch.replace(Some(Watch { waker: addresses(cx.waker()), earliest: None, fired })));
    // Restored even if `work` panics, so that a caught panic leaves no
    // stale watch behind for the next poll on this thread.
    struct Restore(Option<Watch>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0;
            WATCH.with(|watch| watch.set(previous));
        }
    }
    let restore = Restore(previous);
    let polled = work.poll(cx);
    let asked = WATCH.with(|watch| watch.get()).and_then(|w| w.earliest);
    drop(restore);
    match polled {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => Err(asked),
    }
}

/// A connection's one timer: a `Sleep`, and whether this task's waker is
/// registered with it, so that it is polled only when that may tell
/// something new. Polling a registered timer that has not fired registers
/// the same waker again (about 120 instructions); a connection keeps one
/// set for a minute for many calls in a row.
pub(crate) struct Timer {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// The waker (by its addresses) registered when the timer was last
    /// polled, if it has not been reset or fired since: firing wakes it.
    armed: Option<(usize, usize)>,
}

impl Timer {
    pub(crate) fn new(deadline: Instant) -> Timer {
        Timer { sleep: Box::pin(tokio::time::sleep_until(deadline)), armed: None }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }

    pub(crate) fn reset(&mut self, deadline: Instant) {
        self.armed = None;
        self.sleep.as_mut().reset(deadline);
    }
}

impl Future for Timer {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let waker = addresses(cx.waker());
        if self.armed == Some(waker) && !self.sleep.is_elapsed() {
            return Poll::Pending;
        }
        let polled = self.sleep.as_mut().poll(cx);
        self.armed = polled.is_pending().then_some(waker);
        polled
    }
}

/// A connection's request as it polls it: [`Watcher::poll`] polls the
/// request and keeps the deadlines it asks for with `timer`.
pub(crate) struct Watcher {
    /// The earliest deadline the request asked for since the timer last
    /// fired for one.
    earliest: Option<Instant>,
}

impl Watcher {
    pub(crate) fn new() -> Watcher {
        Watcher { earliest: None }
    }

    /// Polls `work`, then arms `timer` for the earliest deadline it asked
    /// for (moved only when it is set later than that); when the timer
    /// fires at or after that deadline, polls `work` again, told so.
    /// `Pending` when `work` is, with `cx` woken by the timer.
    pub(crate) fn poll<F: Future>(
        &mut self,
        mut work: Pin<&mut F>,
        timer: &mut Timer,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        let mut fired = None;
        // At most twice around: a request told its deadline passed ends
        // the wait that asked for it; one that asks for a deadline passed
        // already waits until the next poll (woken below).
        for _ in 0..2 {
            match poll_watched(work.as_mut(), cx, fired) {
                Ok(output) => return Poll::Ready(output),
                // Kept until it fires, even if a later poll does not ask
                // for it again (a wait that ended since, or one a
                // combinator did not poll this time): a timer that fires
                // for nothing costs a poll, one missed costs a hang.
                Err(asked) if fired.is_some() => self.earliest = asked,
                Err(asked) => self.earliest = sooner(self.earliest, asked),
            }
            let Some(deadline) = self.earliest else { return Poll::Pending };
            if timer.deadline() > deadline {
                timer.reset(deadline);
            }
            loop {
                match Pin::new(&mut *timer).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        let now = Instant::now();
                        if now >= deadline {
                            fired = Some(now);
                            break;
                        }
                        // Early: set for something sooner, or before this request.
                        timer.reset(deadline);
                    }
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// `request` until `deadline`: `Err` if the deadline came first. As
/// `tokio::time::timeout_at`, but with the request's future pinned where
/// its caller made it (that future is a few kilobytes, and every move,
/// into a `Timeout` and then into the awaiting future, copied all of it),
/// and with the deadline kept by the connection's timer where there is
/// one (see the module's docs).
pub(crate) async fn until<F: Future>(deadline: Instant, mut request: Pin<&mut F>) -> Result<F::Output, ()> {
    let mut own = std::pin::pin!(None::<tokio::time::Sleep>);
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(out) = request.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if own.is_none() {
            match keep(cx.waker(), deadline) {
                Kept::Watched => return Poll::Pending,
                Kept::Passed => return Poll::Ready(Err(())),
                // From here on it keeps its own, wherever it is polled.
                Kept::NotHere => own.set(Some(tokio::time::sleep_until(deadline))),
            }
        }
        own.as_mut().as_pin_mut().expect("set above").poll(cx).map(Err)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A connection's poll loop, as h1's: the request polled by the watcher
    /// with the connection's timer, set for later than the request needs.
    async fn watched<F: Future>(work: F, timer: &mut Timer) -> F::Output {
        let mut work = std::pin::pin!(work);
        let mut watcher = Watcher::new();
        std::future::poll_fn(|cx| watcher.poll(work.as_mut(), timer, cx)).await
    }

    fn far_timer() -> Timer {
        Timer::new(Instant::now() + Duration::from_secs(3600))
    }

    /// A request that never answers, its deadline `after` from now, on a
    /// connection with `timer`: what it ended with, and after how long.
    async fn unanswered(timer: &mut Timer, after: Duration) -> (Result<(), ()>, Duration) {
        let start = Instant::now();
        let never = async {
            let never = std::pin::pin!(std::future::pending::<()>());
            until(start + after, never).await
        };
        let out = watched(never, timer).await;
        (out, Instant::now() - start)
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_deadline_passes_on_the_connection_timer() {
        let mut timer = far_timer();
        let start = Instant::now();
        assert_eq!(unanswered(&mut timer, Duration::from_secs(60)).await, (Err(()), Duration::from_secs(60)));
        // The connection's timer was moved sooner for it.
        assert_eq!(timer.deadline(), start + Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_answers_in_time_is_not_timed_out_and_the_timer_is_left_alone() {
        let mut timer = Timer::new(Instant::now() + Duration::from_secs(10));
        let set = timer.deadline();
        let start = Instant::now();
        let out = watched(
            async {
                let answer = std::pin::pin!(async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    7
                });
                until(start + Duration::from_secs(60), answer).await
            },
            &mut timer,
        )
        .await;
        assert_eq!(out, Ok(7));
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        // Set sooner than the request's deadline already: not moved.
        assert_eq!(timer.deadline(), set);
    }

    #[tokio::test(start_paused = true)]
    async fn an_early_firing_timer_is_moved_to_the_deadline() {
        // The connection's timer fires after 10 s (its own bound): the
        // request's deadline at 60 s still holds, no sooner.
        let mut timer = Timer::new(Instant::now() + Duration::from_secs(10));
        assert_eq!(unanswered(&mut timer, Duration::from_secs(60)).await, (Err(()), Duration::from_secs(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn several_deadlines_in_one_request_each_pass_at_their_time() {
        let mut timer = far_timer();
        let start = Instant::now();
        let (a, b) = watched(
            async {
                let first = async {
                    let never = std::pin::pin!(std::future::pending::<()>());
                    let out = until(start + Duration::from_secs(20), never).await;
                    (out, Instant::now() - start)
                };
                let second = async {
                    let never = std::pin::pin!(std::future::pending::<()>());
                    let out = until(start + Duration::from_secs(45), never).await;
                    (out, Instant::now() - start)
                };
                tokio::join!(first, second)
            },
            &mut timer,
        )
        .await;
        assert_eq!(a, (Err(()), Duration::from_secs(20)));
        assert_eq!(b, (Err(()), Duration::from_secs(45)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_polled_with_another_waker_keeps_its_own_timer() {
        use std::sync::Arc;
        use std::task::Wake;
        // A member of a `FuturesUnordered` is polled with a waker of its
        // own: the connection's timer firing would not poll it again, so
        // it must not hand its deadline to the connection.
        struct Relay(Waker);
        impl Wake for Relay {
            fn wake(self: Arc<Self>) {
                self.0.wake_by_ref();
            }
        }
        let mut timer = far_timer();
        let start = Instant::now();
        let out = watched(
            async {
                let mut inner = std::pin::pin!(async {
                    let never = std::pin::pin!(std::future::pending::<()>());
                    until(start + Duration::from_secs(30), never).await
                });
                std::future::poll_fn(|cx| {
                    let relay = Waker::from(Arc::new(Relay(cx.waker().clone())));
                    inner.as_mut().poll(&mut Context::from_waker(&relay))
                })
                .await
            },
            &mut timer,
        )
        .await;
        assert_eq!(out, Err(()));
        assert_eq!(Instant::now() - start, Duration::from_secs(30));
        // The connection's timer was not asked for anything.
        assert_eq!(timer.deadline(), start + Duration::from_secs(3600));
    }

    /// Polls `timer` once.
    async fn poll_once(timer: &mut Timer) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *timer).poll(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_timer_fires_after_every_reset_even_one_after_an_unseen_firing() {
        let start = Instant::now();
        let mut timer = Timer::new(start + Duration::from_secs(1));
        // Polled once: its waker registered, so it is not polled again
        // until it fires.
        assert!(poll_once(&mut timer).await.is_pending());
        assert!(poll_once(&mut timer).await.is_pending());
        // It fires with no one looking (the registered waker taken), then is
        // set for later before it is polled: polled then, it must register
        // again, or nothing would wake its task.
        tokio::time::advance(Duration::from_secs(2)).await;
        timer.reset(start + Duration::from_secs(5));
        let fired = tokio::time::timeout(Duration::from_secs(60), &mut timer).await;
        assert!(fired.is_ok(), "the timer never fired after its reset");
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        // Moved sooner while armed: the sooner time holds.
        timer.reset(start + Duration::from_secs(60));
        assert!(poll_once(&mut timer).await.is_pending());
        timer.reset(start + Duration::from_secs(7));
        (&mut timer).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn outside_a_connection_a_deadline_keeps_its_own_timer() {
        let start = Instant::now();
        let never = std::pin::pin!(std::future::pending::<()>());
        assert_eq!(until(start + Duration::from_secs(5), never).await, Err(()));
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        // And nothing is left behind on the thread.
        assert!(WATCH.with(|w| w.get()).is_none());
    }
}
