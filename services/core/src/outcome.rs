//! How a request ended: the `outcome` label of `switchboard_requests_total`
//! and of audit records.

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A result.
    Ok,
    /// A JSON-RPC error from the upstream, or an unknown tool, prompt or resource.
    Error,
    /// The request was refused before reaching an upstream (bad input, a limit).
    Rejected,
    /// The upstream could not be reached or broke.
    UpstreamFailed,
    /// The upstream did not answer in time.
    Timeout,
    /// The client went away before its answer (the request is cancelled upstream).
    Abandoned,
}

impl Outcome {
    /// Every outcome, in the order of their `as usize`.
    pub const ALL: [Outcome; 6] =
        [Outcome::Ok, Outcome::Error, Outcome::Rejected, Outcome::UpstreamFailed, Outcome::Timeout, Outcome::Abandoned];

    /// The label metrics and audit records carry.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Rejected => "rejected",
            Outcome::UpstreamFailed => "upstream_failed",
            Outcome::Timeout => "timeout",
            Outcome::Abandoned => "abandoned",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_discriminant_order() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{}", o.label());
        }
    }
}
