//! Where the tools a client may list and call come from.
//!
//! A [`ToolSource`] lists a tenant's tools into a page of `tools/list` and
//! resolves the name of a `tools/call` from what it knows now (no await on
//! the hot path); when no source knows a name, each may refresh once
//! before the name is unknown. The router has two: the edge
//! devices (`edge.rs`), asked first, and the upstream catalog
//! ([`CatalogTools`]). A resolved [`Tool`] is either an upstream's, which
//! the request pipeline forwards on the caller's session by the upstream's
//! era, or one its source calls itself ([`LocalTool`]). Downstream code
//! sees only this module: it never names where a local tool lives.

use std::collections::VecDeque;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::value::RawValue;
use switchboard_catalog::cursor::Cursor;
use switchboard_catalog::{Catalog, Item, Listing, Snapshot};
use switchboard_core::policy::Tenant;
use switchboard_core::UpstreamId;
use switchboard_protocol::jsonrpc;
use switchboard_protocol::methods::ListKind;
use switchboard_upstream::{UpstreamError, Upstreams};

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

    /// Calls it: the tool result (the `result` object, as JSON), or why not.
    async fn call(self: Box<Self>) -> Result<Vec<u8>, Error>;
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
    async fn refresh(&self) {}

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
                source.refresh().await;
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

/// The upstream catalog's tools.
pub struct CatalogTools {
    pub catalog: Arc<Catalog>,
    pub upstreams: Upstreams,
}

impl CatalogTools {
    /// A tool or prompt by its exposed name, refreshing the catalog once if
    /// it is missing. Only what `tenant` sees resolves; anything else is
    /// unknown, exactly as if it did not exist.
    pub async fn find(&self, tenant: &Tenant, kind: ListKind, name: &str) -> Result<(UpstreamId, Arc<[u8]>), Error> {
        let unknown = || match kind {
            ListKind::Prompts => Error::UnknownPrompt(name.to_owned()),
            _ => Error::UnknownTool(name.to_owned()),
        };
        let found = |snapshot: &Snapshot| {
            snapshot.list(kind).get(name).map(|item| {
                if sees(tenant, kind, item) {
                    Ok((item.upstream, item.original.clone()))
                } else {
                    Err(unknown())
                }
            })
        };
        if let Some(found) = found(&self.catalog.current()) {
            return found;
        }
        if let Some(found) = found(&*self.catalog.ensure(&[kind]).await) {
            return found;
        }
        Err(self.left_out(tenant, kind, name).unwrap_or_else(unknown))
    }

    /// For a name that is not in the catalog: "upstream down" if it would
    /// belong to an upstream the tenant sees that is left out for now.
    fn left_out(&self, tenant: &Tenant, kind: ListKind, name: &str) -> Option<Error> {
        let u = self.catalog.missing_upstream(kind, name).filter(|&u| tenant.sees_upstream(u))?;
        let why = format!("left out of the catalog after failing; retried every {:?}", self.catalog.retry_after());
        Some(Error::upstream(&self.upstreams[u].name, UpstreamError::Down(why)))
    }
}

#[async_trait]
impl ToolSource for CatalogTools {
    fn list(&self, tenant: &Tenant, page: &mut Page) -> Result<(), Error> {
        let snapshot = self.catalog.current();
        list_catalog(&self.upstreams, snapshot.list(ListKind::Tools), tenant, ListKind::Tools, page)
    }

    fn resolve(&self, tenant: &Tenant, name: &str, _params: &RawValue) -> Lookup {
        match self.catalog.current().list(ListKind::Tools).get(name) {
            Some(item) if sees(tenant, ListKind::Tools, item) => {
                Lookup::Found(Tool::Upstream { upstream: item.upstream, original: item.original.clone() })
            }
            Some(_) => Lookup::Refused(Error::UnknownTool(name.to_owned())),
            None => Lookup::Missing,
        }
    }

    async fn refresh(&self) {
        self.catalog.ensure(&[ListKind::Tools]).await;
    }

    fn why_missing(&self, tenant: &Tenant, name: &str) -> Option<Error> {
        self.left_out(tenant, ListKind::Tools, name)
    }
}

/// Whether `tenant` sees an item of a list.
pub fn sees(tenant: &Tenant, kind: ListKind, item: &Item) -> bool {
    match kind {
        ListKind::Tools => tenant.sees_tool(item.upstream, &item.name),
        _ => tenant.sees_upstream(item.upstream),
    }
}

/// Adds the items of `listing` (a list of the catalog's) that `tenant`
/// sees to `page`. Cursors name an upstream and a position in its items, so
/// a filtered page resumes where it ended and a change in another
/// upstream's list moves nothing.
pub fn list_catalog(
    upstreams: &Upstreams,
    listing: &Listing,
    tenant: &Tenant,
    kind: ListKind,
    page: &mut Page,
) -> Result<(), Error> {
    if page.is_whole() && tenant.unrestricted() {
        // The whole list, prebuilt: sent without copying it.
        let all = &listing.all;
        page.push_run(all.slice(1..all.len() - 1), listing.items.len());
        return Ok(());
    }
    let changed = || Error::InvalidCursor("the list changed; start again without a cursor".into());
    let start = match page.cursor.take() {
        None => 0,
        Some(cursor) => {
            let u = upstreams.find(&cursor.upstream).ok_or_else(changed)?;
            let &(_, first, count) = listing.spans.iter().find(|(up, _, _)| *up == u).ok_or_else(changed)?;
            first + cursor.offset.min(count)
        }
    };
    let mut end = start;
    while end < listing.items.len() && page.has_room() {
        let item = &listing.items[end];
        end += 1;
        if sees(tenant, kind, item) {
            page.push(&item.json);
        }
    }
    // Only promise a next page if something the tenant sees is on it.
    if listing.items[end..].iter().any(|i| sees(tenant, kind, i)) {
        let next = &listing.items[end];
        let &(_, first, _) =
            listing.spans.iter().find(|(up, _, _)| *up == next.upstream).expect("every item has a span");
        let cursor = Cursor { upstream: upstreams[next.upstream].name.to_string(), offset: end - first };
        page.cut(cursor.encode());
    }
    Ok(())
}
