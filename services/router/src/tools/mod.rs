//! Where the tools a client may list and call come from.
//!
//! A [`ToolSource`] lists a tenant's tools into a page of `tools/list` and
//! resolves the name of a `tools/call` from what it knows now (no await on
//! the hot path); when no source knows a name, each may refresh once
//! before the name is unknown. The router has two: the edge
//! devices ([`DeviceTools`]), asked first, and the upstream catalog
//! ([`CatalogTools`]). A resolved [`Tool`] is either an upstream's, which
//! the request pipeline forwards on the caller's session by the upstream's
//! era, or one its source calls itself ([`LocalTool`]). Downstream code
//! sees only this module: it never names where a local tool lives.

mod catalog;
mod devices;
pub mod meta;

use std::collections::VecDeque;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::value::RawValue;
use switchboard_catalog::cursor::Cursor;
use switchboard_core::policy::Tenant;
use switchboard_core::UpstreamId;
use switchboard_protocol::jsonrpc;

pub use self::catalog::{list_catalog, offers, sees, CatalogTools};
pub use self::devices::DeviceTools;

/// Progressive discovery's meta-tools, listed (first) for the tenants that
/// use it; their calls are answered before tools are resolved
/// (`crate::discovery`, [`meta`]).
pub struct MetaTools(pub String);

#[async_trait]
impl ToolSource for MetaTools {
    fn list(&self, tenant: &Tenant, page: &mut Page) -> Result<(), Error> {
        if tenant.discovery == switchboard_core::policy::Discovery::Progressive && page.cursor.is_none() {
            for tool in meta::tools_json(&self.0) {
                page.push(&tool);
            }
        }
        Ok(())
    }

    fn resolve(&self, _tenant: &Tenant, _name: &str, _params: &RawValue) -> Lookup {
        Lookup::Missing
    }
}
use crate::error::Error;

/// A tool a source resolved.
pub enum Tool {
    /// A configured upstream's: its own name, as a JSON string, to splice
    /// into the request in place of the exposed one.
    Upstream { upstream: UpstreamId, original: Arc<[u8]> },
    /// One its source calls itself.
    Local(Box<dyn LocalTool>),
}

/// A tool answered by its source (an edge device's service).
#[async_trait]
pub trait LocalTool: Send {
    /// Who serves it, as audit records name it (`edge:<device>`).
    fn served_by(&self) -> Arc<str>;

    /// Calls it: the tool result (the `result` object, as JSON), or why
    /// not. `traceparent`: the router's span for the call, when traced.
    async fn call(self: Box<Self>, traceparent: Option<String>) -> Result<Vec<u8>, Error>;
}

/// A source of tools.
#[async_trait]
pub trait ToolSource: Send + Sync {
    /// Adds the tools `tenant` sees to `page`, from where the page's cursor
    /// says, while it has room.
    fn list(&self, tenant: &Tenant, page: &mut Page) -> Result<(), Error>;

    /// The tool `name` of a `tools/call` whose params are `params`, from
    /// what this source knows now: found, refused (it is this source's, but
    /// not for `tenant`: no other source is asked), or not this source's.
    fn resolve(&self, tenant: &Tenant, name: &str, params: &RawValue) -> Lookup;

    /// Brings what the source knows up to date, when no source knew a name.
    async fn refresh(&self, _tenant: &Tenant) {}

    /// Why `name` is still unknown after a refresh, if the source can say
    /// better than "unknown tool" (its upstream is left out, failing).
    fn why_missing(&self, _tenant: &Tenant, _name: &str) -> Option<Error> {
        None
    }
}

/// What a source found for a name.
pub enum Lookup {
    Found(Tool),
    Refused(Error),
    Missing,
}

/// The tool `name` of a `tools/call`, from the first source that has it.
pub async fn resolve(
    sources: &[Arc<dyn ToolSource>],
    tenant: &Tenant,
    name: &str,
    params: &RawValue,
) -> Result<Tool, Error> {
    for refreshed in [false, true] {
        if refreshed {
            for source in sources {
                source.refresh(tenant).await;
            }
        }
        for source in sources {
            match source.resolve(tenant, name, params) {
                Lookup::Found(tool) => return Ok(tool),
                Lookup::Refused(e) => return Err(e),
                Lookup::Missing => {}
            }
        }
    }
    Err(sources.iter().find_map(|s| s.why_missing(tenant, name)).unwrap_or_else(|| Error::UnknownTool(name.to_owned())))
}

/// One page of a list being built: JSON items, comma-separated, in pieces
/// (a prebuilt list is sent without copying it).
pub struct Page {
    /// Where the page starts, from the client's cursor.
    pub cursor: Option<Cursor>,
    /// At most this many items; 0 for no limit.
    size: usize,
    shown: usize,
    parts: VecDeque<Bytes>,
    current: BytesMut,
    /// The cursor of the next page, once the page is full with more to come.
    next: Option<String>,
}

impl Page {
    /// An empty page of at most `size` items (0: all), starting at `cursor`.
    pub fn new(cursor: Option<&str>, size: usize) -> Result<Page, Error> {
        let cursor = cursor.map(Cursor::decode).transpose().map_err(Error::InvalidCursor)?;
        Ok(Page { cursor, size, shown: 0, parts: VecDeque::new(), current: BytesMut::new(), next: None })
    }

    /// Whether another item fits.
    pub fn has_room(&self) -> bool {
        self.next.is_none() && (self.size == 0 || self.shown < self.size)
    }

    /// Whether the list goes on past this page (sources after the one that
    /// filled it add nothing).
    pub fn is_cut(&self) -> bool {
        self.next.is_some()
    }

    /// Whether the page is the whole list so far: no cursor, no limit.
    pub fn is_whole(&self) -> bool {
        self.cursor.is_none() && self.size == 0
    }

    /// Adds one item (copied).
    pub fn push(&mut self, item: &[u8]) {
        if self.shown > 0 || !self.parts.is_empty() {
            self.current.put_u8(b',');
        }
        self.current.put_slice(item);
        self.shown += 1;
    }

    /// Adds `count` items already joined by commas, without copying them.
    pub fn push_run(&mut self, run: Bytes, count: usize) {
        if run.is_empty() {
            return;
        }
        if self.shown > 0 || !self.parts.is_empty() {
            self.current.put_u8(b',');
        }
        if !self.current.is_empty() {
            self.parts.push_back(self.current.split().freeze());
        }
        self.parts.push_back(run);
        self.shown += count;
    }

    /// Ends the page here: the next one starts at `cursor`.
    pub fn cut(&mut self, cursor: String) {
        self.next = Some(cursor);
    }

    /// The page as `head`, the items' array, `nextCursor` if any, `tail`
    /// and the closing braces: pieces of one JSON-RPC response.
    pub fn into_parts(mut self, head: Bytes, tail: &[u8]) -> VecDeque<Bytes> {
        let mut parts = VecDeque::with_capacity(self.parts.len() + 3);
        let mut open = BytesMut::with_capacity(head.len() + 1);
        open.put_slice(&head);
        open.put_u8(b'[');
        parts.push_back(open.freeze());
        parts.append(&mut self.parts);
        self.current.put_u8(b']');
        if let Some(next) = &self.next {
            self.current.put_slice(b",\"nextCursor\":");
            self.current.put_slice(&jsonrpc::json_string(next));
        }
        self.current.put_slice(tail);
        self.current.put_slice(b"}}");
        parts.push_back(self.current.freeze());
        parts
    }
}
