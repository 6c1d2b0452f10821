//! What a JSON-RPC message is: below both the parser ([`crate::jsonrpc`],
//! which names it) and the one-pass scan ([`crate::scan`], which the parser
//! calls first), so that neither needs the other to say it.

/// What a message is, decided from which members it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// `method` and `id`: expects a response.
    Request,
    /// `method` without `id`.
    Notification,
    /// `id` and `result`.
    Response,
    /// `id` and `error`.
    Error,
}
