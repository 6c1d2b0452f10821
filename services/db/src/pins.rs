//! Tool-definition pinning's table: per tenant, each tool's approved
//! definition and a changed one waiting for an operator. The router
//! decides what is approved and when; this layer stores it, and bumps the
//! version replicas watch on every change.

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::{Backend, Database, DbError};

/// The channel PostgreSQL replicas listen on for pin changes.
pub const PINS_CHANNEL: &str = "switchboard_pins";

/// What a replica keeps of a pin: digests only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinDigests {
    pub tenant: String,
    pub tool: String,
    pub approved: Option<String>,
    pub pending: Option<String>,
    /// Every definition rejected (digests, the newest last).
    pub rejected: Vec<String>,
}

/// A pin whole, for operators.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PinRow {
    pub tenant: String,
    pub tool: String,
    pub upstream: String,
    pub approved_digest: Option<String>,
    pub approved_definition: Option<String>,
    pub approved_at_ms: Option<i64>,
    pub approved_by: Option<String>,
    pub pending_digest: Option<String>,
    pub pending_definition: Option<String>,
    pub pending_since_ms: Option<i64>,
    pub rejected_at_ms: Option<i64>,
    /// Every definition rejected (digests, the newest last, at most
    /// [`MAX_REJECTED`]).
    pub rejected_digests: Vec<String>,
}

/// How many rejected definitions a pin remembers (the oldest forgotten).
pub const MAX_REJECTED: usize = 16;

/// A tool seen for the first time by a tenant: approved at once, or
/// waiting for an operator.
#[derive(Debug, Clone)]
pub struct NewPin {
    pub tenant: String,
    pub tool: String,
    pub upstream: String,
    pub digest: String,
    pub definition: String,
    pub approved: bool,
}

/// How long a waiting definition stands before another replaces it.
pub const SETTLE_MS: i64 = 5_000;

const COLUMNS: &str = "tenant, tool, upstream, approved_digest, approved_definition, approved_at_ms, approved_by, \
                       pending_digest, pending_definition, pending_since_ms, rejected_at_ms, rejected_digests";

impl Database {
    /// The number bumped by every change to the pins.
    pub async fn pins_version(&self) -> Result<i64, DbError> {
        let row = sqlx::query("SELECT version FROM tool_pins_version WHERE id = 1").fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Every pin's digests, with the version read first (a change racing
    /// with the load bumps it again, and the next check reloads).
    pub async fn load_pin_digests(&self) -> Result<(i64, Vec<PinDigests>), DbError> {
        let version = self.pins_version().await?;
        let rows = sqlx::query("SELECT tenant, tool, approved_digest, pending_digest, rejected_digests FROM tool_pins")
            .fetch_all(&self.pool)
            .await?;
        let pins = rows
            .iter()
            .map(|r| {
                Ok(PinDigests {
                    tenant: r.try_get("tenant")?,
                    tool: r.try_get("tool")?,
                    approved: r.try_get("approved_digest")?,
                    pending: r.try_get("pending_digest")?,
                    rejected: digests(&r.try_get::<String, _>("rejected_digests")?),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok((version, pins))
    }

    /// The pins of `tenant` (all tenants': `None`), only those with a
    /// definition waiting (not rejected) when `waiting`, by tenant and
    /// tool: at most `limit` of them, after the first `offset`.
    pub async fn pins(
        &self,
        tenant: Option<&str>,
        waiting: bool,
        limit: u32,
        offset: u64,
    ) -> Result<Vec<PinRow>, DbError> {
        // Placeholders numbered in the order they appear (SQLite binds by
        // first appearance).
        let mut sql = format!("SELECT {COLUMNS} FROM tool_pins WHERE 1 = 1");
        let mut query_tenant = None;
        if let Some(t) = tenant {
            sql.push_str(" AND tenant = $1");
            query_tenant = Some(t.to_owned());
        }
        if waiting {
            sql.push_str(" AND pending_digest IS NOT NULL AND rejected_at_ms IS NULL");
        }
        let n = usize::from(query_tenant.is_some());
        sql.push_str(&format!(" ORDER BY tenant, tool LIMIT ${} OFFSET ${}", n + 1, n + 2));
        let mut query = sqlx::query(&sql);
        if let Some(t) = query_tenant {
            query = query.bind(t);
        }
        let query = query.bind(i64::from(limit)).bind(offset.min(i64::MAX as u64) as i64);
        let rows = query.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(pin_row).collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    /// The pin of `tool` of `tenant`, if there is one.
    pub async fn pin(&self, tenant: &str, tool: &str) -> Result<Option<PinRow>, DbError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM tool_pins WHERE tenant = $1 AND tool = $2"))
            .bind(tenant)
            .bind(tool)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(pin_row).transpose()?)
    }

    /// Records tools seen for the first time; a pin another replica made
    /// meanwhile stands. Returns how many were new.
    pub async fn first_pins(&self, pins: &[NewPin], now_ms: i64) -> Result<u64, DbError> {
        if pins.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        let mut added = 0;
        for pin in pins {
            let (approved, pending) = if pin.approved { (Some(pin), None) } else { (None, Some(pin)) };
            added += sqlx::query(&format!(
                "INSERT INTO tool_pins ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, '') \
                 ON CONFLICT (tenant, tool) DO NOTHING"
            ))
            .bind(&pin.tenant)
            .bind(&pin.tool)
            .bind(&pin.upstream)
            .bind(approved.map(|p| p.digest.clone()))
            .bind(approved.map(|p| p.definition.clone()))
            .bind(approved.map(|_| now_ms))
            .bind(approved.map(|_| "first_sight".to_owned()))
            .bind(pending.map(|p| p.digest.clone()))
            .bind(pending.map(|p| p.definition.clone()))
            .bind(pending.map(|_| now_ms))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        if added > 0 {
            self.bump_pins(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(added)
    }

    /// Records that `tool` of `tenant` now has the definition `digest`,
    /// neither approved nor already waiting: it waits, in place of another
    /// waiting since [`SETTLE_MS`] at least (replicas that briefly see two
    /// definitions do not take turns replacing each other's). Returns
    /// whether this call recorded it (another replica may have first).
    pub async fn pin_changed(
        &self,
        tenant: &str,
        tool: &str,
        upstream: &str,
        digest: &str,
        definition: &str,
        now_ms: i64,
    ) -> Result<bool, DbError> {
        let query = sqlx::query(
            "UPDATE tool_pins SET upstream = $1, pending_digest = $2, pending_definition = $3, \
             pending_since_ms = $4, rejected_at_ms = NULL \
             WHERE tenant = $5 AND tool = $6 \
             AND (pending_digest IS NULL OR (pending_digest <> $2 AND pending_since_ms <= $7)) \
             AND (approved_digest IS NULL OR approved_digest <> $2)",
        )
        .bind(upstream)
        .bind(digest)
        .bind(definition)
        .bind(now_ms)
        .bind(tenant)
        .bind(tool)
        .bind(now_ms - SETTLE_MS);
        Ok(self.update_pins(query).await? > 0)
    }

    /// Approves the definition of `tool` of `tenant` that waits with
    /// `digest` (the one the operator saw: another that arrived since is
    /// not approved by mistake). Returns the pin as it now is.
    pub async fn approve_pin(
        &self,
        tenant: &str,
        tool: &str,
        digest: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<PinRow, DbError> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query(
            "UPDATE tool_pins SET approved_digest = pending_digest, approved_definition = pending_definition, \
             approved_at_ms = $1, approved_by = $2, pending_digest = NULL, pending_definition = NULL, \
             pending_since_ms = NULL, rejected_at_ms = NULL \
             WHERE tenant = $3 AND tool = $4 AND pending_digest = $5",
        )
        .bind(now_ms)
        .bind(by)
        .bind(tenant)
        .bind(tool)
        .bind(digest)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Err(not_waiting(tenant, tool, digest));
        }
        self.bump_pins(&mut tx).await?;
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM tool_pins WHERE tenant = $1 AND tool = $2"))
            .bind(tenant)
            .bind(tool)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(pin_row(&row)?)
    }

    /// Rejects the definition of `tool` of `tenant` that waits with
    /// `digest`: it is no longer shown as waiting for a decision, and is
    /// withheld whenever its upstream serves it, now or later (the pin
    /// remembers the last [`MAX_REJECTED`] definitions rejected).
    pub async fn reject_pin(&self, tenant: &str, tool: &str, digest: &str, now_ms: i64) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT rejected_digests FROM tool_pins WHERE tenant = $1 AND tool = $2 AND pending_digest = $3",
        )
        .bind(tenant)
        .bind(tool)
        .bind(digest)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| not_waiting(tenant, tool, digest))?;
        let mut rejected = digests(&row.try_get::<String, _>(0)?);
        rejected.retain(|d| d != digest);
        rejected.push(digest.to_owned());
        let keep = rejected.len().saturating_sub(MAX_REJECTED);
        let n = sqlx::query(
            "UPDATE tool_pins SET rejected_at_ms = $1, rejected_digests = $2 \
             WHERE tenant = $3 AND tool = $4 AND pending_digest = $5",
        )
        .bind(now_ms)
        .bind(rejected[keep..].join(" "))
        .bind(tenant)
        .bind(tool)
        .bind(digest)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Err(not_waiting(tenant, tool, digest));
        }
        self.bump_pins(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// How many pins `tenant` has.
    pub async fn pin_count(&self, tenant: &str) -> Result<u64, DbError> {
        let row =
            sqlx::query("SELECT COUNT(*) FROM tool_pins WHERE tenant = $1").bind(tenant).fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>(0)?.max(0) as u64)
    }

    /// Runs `query` (an update of pins); bumps the version if it changed
    /// any. Returns how many it changed.
    async fn update_pins<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    ) -> Result<u64, DbError> {
        let mut tx = self.pool.begin().await?;
        let n = query.execute(&mut *tx).await?.rows_affected();
        if n > 0 {
            self.bump_pins(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(n)
    }

    pub(crate) async fn bump_pins(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), DbError> {
        sqlx::query("UPDATE tool_pins_version SET version = version + 1 WHERE id = 1").execute(&mut **tx).await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, '')").bind(PINS_CHANNEL).execute(&mut **tx).await?;
        }
        Ok(())
    }
}

fn not_waiting(tenant: &str, tool: &str, digest: &str) -> DbError {
    DbError::NotFound(format!("a definition of tool {tool:?} of tenant {tenant:?} waiting with digest {digest:?}"))
}

fn pin_row(r: &AnyRow) -> Result<PinRow, sqlx::Error> {
    Ok(PinRow {
        tenant: r.try_get("tenant")?,
        tool: r.try_get("tool")?,
        upstream: r.try_get("upstream")?,
        approved_digest: r.try_get("approved_digest")?,
        approved_definition: r.try_get("approved_definition")?,
        approved_at_ms: r.try_get("approved_at_ms")?,
        approved_by: r.try_get("approved_by")?,
        pending_digest: r.try_get("pending_digest")?,
        pending_definition: r.try_get("pending_definition")?,
        pending_since_ms: r.try_get("pending_since_ms")?,
        rejected_at_ms: r.try_get("rejected_at_ms")?,
        rejected_digests: digests(&r.try_get::<String, _>("rejected_digests")?),
    })
}

/// The digests of a `rejected_digests` column.
fn digests(column: &str) -> Vec<String> {
    column.split_ascii_whitespace().map(str::to_owned).collect()
}
