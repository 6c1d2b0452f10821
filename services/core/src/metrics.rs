//! Every layer registers its own metrics in the one registry the router
//! renders at `/metrics`. Names are a public interface (docs/operations.md
//! lists them): renaming one breaks dashboards.

pub use prometheus::Registry;

/// Registers `metric` in `registry` and returns it. Panics on a name
/// registered twice: that is a bug, found by the first test that builds
/// the router.
pub fn register<M>(registry: &Registry, metric: M) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(metric.clone())).expect("metric names are unique");
    metric
}
