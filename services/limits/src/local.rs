//! The in-process limiter: GCRA state per limited subject in one map, so a
//! request's limits are checked and taken atomically. Must never block on
//! anything but its own short critical section.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{gcra, Check, Decision, Subject};
use hashbrown::HashMap;

/// Every this many checks, subjects whose arrival time is in the past are
/// forgotten (that changes nothing: a missing subject starts at "now").
const SWEEP_EVERY: u64 = 10_000;

pub struct Local {
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Subject → theoretical arrival time, µs since `epoch` (in a `Cell`:
    /// a check finds each subject once, and sets it through what it found).
    tat: HashMap<Subject, Cell<u64>, foldhash::fast::RandomState>,
    checks: u64,
}

impl Default for Local {
    fn default() -> Self {
        Local { epoch: Instant::now(), state: Mutex::default() }
    }
}

impl Local {
    /// Checks a request that arrived `at` (its own time: no clock read here).
    pub fn check(&self, checks: &[Check<'_>], at: Instant) -> Decision {
        let now = at.saturating_duration_since(self.epoch).as_micros() as u64;
        self.check_at(checks, now)
    }

    fn check_at(&self, checks: &[Check<'_>], now: u64) -> Decision {
        let mut state = self.state.lock().expect("lock");
        let mut next = [0u64; 3];
        let mut found: [Option<&Cell<u64>>; 3] = [None; 3];
        let mut worst: Option<(&'static str, u64)> = None;
        for (i, check) in checks.iter().enumerate().take(3) {
            let (interval, capacity) = gcra(check.rate);
            found[i] = state.tat.get(&check.subject);
            let tat = found[i].map_or(0, Cell::get).max(now);
            let new = tat + interval;
            if new - now > capacity {
                let wait = new - now - capacity;
                if worst.is_none_or(|(_, w)| wait > w) {
                    worst = Some((check.limit, wait));
                }
            }
            next[i] = new;
        }
        if let Some((limit, wait)) = worst {
            return Decision::Deny { limit, retry_after: Duration::from_micros(wait) };
        }
        let mut new_subjects = [false; 3];
        for (i, tat) in found.iter().enumerate().take(checks.len()) {
            match tat {
                Some(tat) => tat.set(next[i]),
                None => new_subjects[i] = true,
            }
        }
        for (i, check) in checks.iter().enumerate().take(3) {
            if new_subjects[i] {
                state.tat.insert(check.subject.to_owned(), Cell::new(next[i]));
            }
        }
        state.checks += 1;
        if state.checks.is_multiple_of(SWEEP_EVERY) {
            state.tat.retain(|_, tat| tat.get() > now);
        }
        Decision::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SubjectRef;
    use switchboard_core::policy::Rate;

    fn check(limit: &'static str, subject: &'static str, per_second: f64, burst: u32) -> Check<'static> {
        Check { limit, subject: SubjectRef::Tenant(subject), rate: Rate { per_second, burst } }
    }

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let local = Local::default();
        let c = [check("key", "k", 10.0, 3)];
        for _ in 0..3 {
            assert_eq!(local.check_at(&c, 1_000_000), Decision::Allow);
        }
        match local.check_at(&c, 1_000_000) {
            Decision::Deny { limit: "key", retry_after } => assert_eq!(retry_after, Duration::from_millis(100)),
            other => panic!("{other:?}"),
        }
        // One interval later, one more passes.
        assert_eq!(local.check_at(&c, 1_100_000), Decision::Allow);
        assert!(matches!(local.check_at(&c, 1_100_000), Decision::Deny { .. }));
        // After a quiet second the whole burst is back.
        for _ in 0..3 {
            assert_eq!(local.check_at(&c, 2_500_000), Decision::Allow);
        }
    }

    #[test]
    fn subjects_are_found_by_their_borrowed_form_and_kept_apart() {
        let local = Local::default();
        let rate = Rate { per_second: 1.0, burst: 1 };
        let at = |subject| Check { limit: "tool", subject, rate };
        let tool = at(SubjectRef::Tool { tenant: "t", tool: "x" });
        assert_eq!(local.check_at(&[tool], 0), Decision::Allow);
        // Kept owned, found again by the request's borrowed names.
        assert!(matches!(local.check_at(&[tool], 0), Decision::Deny { limit: "tool", .. }));
        // The same text under another kind, tenant or split is another subject.
        for other in [
            SubjectRef::Tool { tenant: "u", tool: "x" },
            SubjectRef::Tool { tenant: "t:", tool: "x" },
            SubjectRef::Tool { tenant: "t", tool: ":x" },
            SubjectRef::Tenant("t"),
            SubjectRef::Key("t"),
        ] {
            assert_eq!(local.check_at(&[at(other)], 0), Decision::Allow, "{other:?}");
        }
    }

    #[test]
    fn a_refusal_takes_nothing_from_the_other_limits() {
        let local = Local::default();
        let tenant = check("tenant", "t", 1.0, 1);
        let tool = check("tool", "t:x", 1.0, 1);
        assert_eq!(local.check_at(std::slice::from_ref(&tool), 0), Decision::Allow);
        // The tool limit refuses; the tenant limit must not be spent.
        assert!(matches!(local.check_at(&[tenant, tool], 0), Decision::Deny { limit: "tool", .. }));
        assert_eq!(local.check_at(&[tenant], 0), Decision::Allow);
    }
}
