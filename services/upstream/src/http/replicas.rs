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

impl Replicas {
    /// The replica for `key` (a session id, or "" for the router's own
    /// channels) by rendezvous hashing over the replicas that are up (all of
    /// them if none is), leaving out `avoid`: a key keeps its replica while
    /// that replica is up, and only the keys of a replica that goes down move.
    pub(super) fn pick(&self, key: &str, avoid: Option<usize>) -> usize {
        let score = |i: usize| {
            let mut bytes = Vec::with_capacity(key.len() + self.members[i].replica.len() + 1);
            bytes.extend_from_slice(key.as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(self.members[i].replica.as_bytes());
            switchboard_core::hash::fnv1a64(&bytes)
        };
        let candidates: Vec<usize> = (0..self.members.len()).filter(|&i| Some(i) != avoid).collect();
        let live: Vec<usize> = candidates.iter().copied().filter(|&i| self.is_up(i)).collect();
        let pool = if live.is_empty() { &candidates } else { &live };
        pool.iter().copied().max_by_key(|&i| score(i)).unwrap_or(0)
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
