//! Every layer registers its own metrics in the one registry the router
//! renders at `/metrics`. Names are a public interface (docs/operations.md
//! lists them): renaming one breaks dashboards.
//!
//! The constructors here register as they build, and panic on a name
//! registered twice or an invalid name: both are bugs, found by the first
//! test that builds the router.

pub use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use prometheus::{HistogramOpts, Opts};

/// Registers `metric` in `registry` and returns it.
pub fn register<M>(registry: &Registry, metric: M) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(metric.clone())).expect("metric names are unique");
    metric
}

/// A counter.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("a valid metric"))
}

/// A counter with labels.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric"))
}

/// A gauge.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("a valid metric"))
}

/// A gauge with labels.
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric"))
}

/// A histogram with the given bucket bounds (seconds).
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    register(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("a valid metric"),
    )
}

/// A histogram with labels and the given bucket bounds (seconds).
pub fn histogram_vec(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels).expect("a valid metric"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_are_rendered() {
        let registry = Registry::new();
        counter_vec(&registry, "t_total", "A test.", &["x"]).with_label_values(&["y"]).inc();
        let families = registry.gather();
        assert_eq!(families.len(), 1);
        assert_eq!(families[0].name(), "t_total");
    }

    #[test]
    #[should_panic(expected = "metric names are unique")]
    fn a_name_registered_twice_is_a_bug() {
        let registry = Registry::new();
        counter(&registry, "twice_total", "A test.");
        counter(&registry, "twice_total", "A test.");
    }
}
