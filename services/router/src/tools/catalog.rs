//! The upstream catalog as a tool source, and the catalog's list pages.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::value::RawValue;
use switchboard_catalog::cursor::Cursor;
use switchboard_catalog::{Catalog, Item, Listing, Snapshot};
use switchboard_core::policy::Tenant;
use switchboard_core::UpstreamId;
use switchboard_protocol::methods::ListKind;
use switchboard_upstream::{UpstreamError, Upstreams};

use super::{Lookup, Page, Tool, ToolSource};
use crate::error::Error;
use crate::pins::{Pins, Verdict};

/// The upstream catalog's tools.
pub struct CatalogTools {
    pub catalog: Arc<Catalog>,
    pub upstreams: Upstreams,
    pub pins: Arc<Pins>,
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
            snapshot.list(kind).get(name).map(|item| match offers(&self.pins, tenant, kind, item) {
                Some(Verdict::Withhold) => Err(Error::ToolWithheld(name.to_owned())),
                Some(_) => Ok((item.upstream, item.original.clone())),
                None => Err(unknown()),
            })
        };
        if let Some(found) = found(&self.catalog.current()) {
            return found;
        }
        if let Some(found) = found(&*self.catalog.ensure_for(&[kind], |u| tenant.sees_upstream(u)).await) {
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
        if tenant.discovery == switchboard_core::policy::Discovery::Progressive {
            // Searched, described and called through the meta-tools.
            return Ok(());
        }
        let snapshot = self.catalog.current();
        list_catalog(&self.upstreams, &self.pins, snapshot.list(ListKind::Tools), tenant, ListKind::Tools, page)
    }

    fn resolve(&self, tenant: &Tenant, name: &str, _params: &RawValue) -> Lookup {
        let snapshot = self.catalog.current();
        let Some(item) = snapshot.list(ListKind::Tools).get(name) else { return Lookup::Missing };
        match offers(&self.pins, tenant, ListKind::Tools, item) {
            Some(Verdict::Withhold) => Lookup::Refused(Error::ToolWithheld(name.to_owned())),
            Some(_) => Lookup::Found(Tool::Upstream { upstream: item.upstream, original: item.original.clone() }),
            None => Lookup::Refused(Error::UnknownTool(name.to_owned())),
        }
    }

    async fn refresh(&self, tenant: &Tenant) {
        self.catalog.ensure_for(&[ListKind::Tools], |u| tenant.sees_upstream(u)).await;
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

/// What `tenant` gets of an item of a list: `None` if it does not see it;
/// for a tool, what its pinning says.
pub fn offers(pins: &Pins, tenant: &Tenant, kind: ListKind, item: &Item) -> Option<Verdict> {
    match (sees(tenant, kind, item), kind) {
        (false, _) => None,
        (true, ListKind::Tools) => Some(pins.verdict(tenant, item)),
        (true, _) => Some(Verdict::Admit),
    }
}

/// Adds the items of `listing` (a list of the catalog's) that `tenant`
/// is offered to `page` (a tool whose definition changed marked, or left
/// out, as its pinning says). Cursors name an upstream and a position in its items, so
/// a filtered page resumes where it ended and a change in another
/// upstream's list moves nothing.
pub fn list_catalog(
    upstreams: &Upstreams,
    pins: &Pins,
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
        match offers(pins, tenant, kind, item) {
            Some(Verdict::Admit) => page.push(&item.json),
            Some(Verdict::Warn) => page.push(&crate::pins::marked(&item.json)),
            Some(Verdict::Withhold) | None => {}
        }
    }
    // Only promise a next page if something the tenant sees is on it.
    if listing.items[end..].iter().any(|i| offers(pins, tenant, kind, i).is_some_and(|v| v != Verdict::Withhold)) {
        let next = &listing.items[end];
        let &(_, first, _) =
            listing.spans.iter().find(|(up, _, _)| *up == next.upstream).expect("every item has a span");
        let cursor = Cursor { upstream: upstreams[next.upstream].name.to_string(), offset: end - first };
        page.cut(cursor.encode());
    }
    Ok(())
}
