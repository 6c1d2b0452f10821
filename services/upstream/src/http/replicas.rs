//! The replicas of one upstream (`urls`): which one a session goes to
//! (rendezvous hashing over the live ones), and health checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Shared;
use crate::Metrics;

/// The replicas of one upstream, and which of them are up.
pub(super) struct Replicas {
    pub(super) name: Arc<str>,
    pub(super) members: Vec<Arc<Shared>>,
    pub(super) up: Vec<AtomicBool>,
    /// Failed periodic probes in a row, per replica.
    pub(super) failures: Vec<std::sync::atomic::AtomicU32>,
    pub(super) metrics: Arc<Metrics>,
}

/// The rendezvous choice of [`Replicas::pick`] among `n` replicas named
/// by `replica`: the highest FNV-1a of `key`, a zero byte and the replica's
/// name, among those `up` (among all if none is), leaving out `avoid`; of
/// equal scores the last. Allocates nothing: a stateless client's every
/// request picks (three allocations a request before).
fn rendezvous<'a>(
    key: &str,
    n: usize,
    replica: impl Fn(usize) -> &'a str,
    up: impl Fn(usize) -> bool,
    avoid: Option<usize>,
) -> usize {
    // One replica (as most upstreams have): it, whatever the key.
    if n == 1 {
        return 0;
    }
    let (mut best_up, mut best) = (None::<(u64, usize)>, None::<(u64, usize)>);
    for i in (0..n).filter(|&i| Some(i) != avoid) {
        let score = switchboard_core::hash::fnv1a64_of(&[key.as_bytes(), &[0], replica(i).as_bytes()]);
        if best.is_none_or(|(b, _)| score >= b) {
            best = Some((score, i));
        }
        if up(i) && best_up.is_none_or(|(b, _)| score >= b) {
            best_up = Some((score, i));
        }
    }
    best_up.or(best).map_or(0, |(_, i)| i)
}

impl Replicas {
    /// The replica for `key` (a session id, or "" for the router's own
    /// channels) by rendezvous hashing over the replicas that are up (all of
    /// them if none is), leaving out `avoid`: a key keeps its replica while
    /// that replica is up, and only the keys of a replica that goes down move.
    pub(super) fn pick(&self, key: &str, avoid: Option<usize>) -> usize {
        rendezvous(key, self.members.len(), |i| &self.members[i].replica, |i| self.is_up(i), avoid)
    }

    pub(super) fn is_up(&self, i: usize) -> bool {
        self.up[i].load(Ordering::Relaxed)
    }

    pub(super) fn several(&self) -> bool {
        self.members.len() > 1
    }

    /// Records replica `i`'s health, logging changes.
    pub(super) fn mark(&self, i: usize, up: bool) {
        if self.up[i].swap(up, Ordering::Relaxed) != up {
            let replica = &self.members[i].replica;
            if up {
                tracing::info!(upstream = %self.name, %replica, "upstream replica is up again");
            } else {
                tracing::warn!(upstream = %self.name, %replica, "upstream replica is down; its sessions move to another");
            }
        }
        self.metrics.set_replica_up(&self.name, &self.members[i].replica, up);
    }

    /// Whether replica `i` accepts a TCP connection now.
    pub(super) async fn accepts(&self, i: usize) -> bool {
        // (Within the connect timeout, to an address the egress guard allows.)
        self.members[i].connect.tcp().await.is_ok()
    }

    /// After a request to replica `i` could not connect: whether it accepts
    /// connections now; if not, it is marked down at once.
    pub(super) async fn probe(&self, i: usize) -> bool {
        let up = self.accepts(i).await;
        if !up {
            self.mark(i, false);
        }
        up
    }

    /// A periodic check of replica `i`: up at the first success, down after
    /// two failures in a row (one lost probe does not move its sessions).
    pub(super) async fn check(&self, i: usize) {
        if self.accepts(i).await {
            self.failures[i].store(0, Ordering::Relaxed);
            self.mark(i, true);
        } else if self.failures[i].fetch_add(1, Ordering::Relaxed) + 1 >= 2 {
            self.mark(i, false);
        }
    }
}

/// Checks every replica every `every`, until the replicas are dropped.
pub(super) async fn health_loop(replicas: Weak<Replicas>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(replicas) = replicas.upgrade() else { return };
        let checks = (0..replicas.members.len()).map(|i| replicas.check(i));
        futures_util::future::join_all(checks).await;
    }
}

#[cfg(test)]
mod tests {
    use super::rendezvous;

    /// The choice as it was first written (joined bytes, collected pools):
    /// a key's replica must not move when the router is upgraded.
    fn as_first_written(key: &str, names: &[&str], up: &[bool], avoid: Option<usize>) -> usize {
        let score = |i: usize| switchboard_core::hash::fnv1a64(format!("{key}\0{}", names[i]).as_bytes());
        let candidates: Vec<usize> = (0..names.len()).filter(|&i| Some(i) != avoid).collect();
        let live: Vec<usize> = candidates.iter().copied().filter(|&i| up[i]).collect();
        let pool = if live.is_empty() { &candidates } else { &live };
        pool.iter().copied().max_by_key(|&i| score(i)).unwrap_or(0)
    }

    #[test]
    fn the_choice_is_the_one_first_written_for_every_key_state_and_avoided_replica() {
        let names = ["http://10.0.0.1:8080/mcp", "http://10.0.0.2:8080/mcp", "http://10.0.0.3:8080/mcp", "x"];
        let mut seen = [0usize; 4];
        for n in 1..=names.len() {
            for states in 0..(1u32 << n) {
                let up: Vec<bool> = (0..n).map(|i| states & (1 << i) != 0).collect();
                for avoid in std::iter::once(None).chain((0..=n).map(Some)) {
                    for k in 0..64 {
                        let key = format!("tenant-{k}");
                        let got = rendezvous(&key, n, |i| names[i], |i| up[i], avoid);
                        assert_eq!(got, as_first_written(&key, &names[..n], &up, avoid), "{key} {up:?} {avoid:?}");
                        seen[got] += 1;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&s| s > 0), "every replica is chosen for some key: {seen:?}");
        // Equal names score alike: the last of them, as max_by_key gives.
        assert_eq!(rendezvous("k", 3, |_| "same", |_| true, None), 2);
    }
}
