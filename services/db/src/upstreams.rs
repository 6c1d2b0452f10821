//! The upstream registry's table: upstreams added while the routers run.
//! This layer stores what it is given; the router validates entries, and
//! the vault's key seals their headers.

use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::{Backend, Database, DbError};

/// The channel PostgreSQL replicas listen on for registry changes.
pub const UPSTREAMS_CHANNEL: &str = "switchboard_upstreams";

/// One registered upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamRow {
    pub name: String,
    /// The entry (JSON), header values left out.
    pub spec: String,
    /// The id of the vault key that sealed its headers (`""`: none).
    pub key_id: String,
    /// Its headers, sealed (`""`: none): never shown.
    #[serde(skip_serializing)]
    pub sealed: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

const COLUMNS: &str = "name, spec, key_id, sealed, created_at_ms, updated_at_ms";

impl Database {
    /// The number bumped by every change to the registry.
    pub async fn upstreams_version(&self) -> Result<i64, DbError> {
        let row = sqlx::query("SELECT version FROM upstreams_version WHERE id = 1").fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Every registered upstream, with the version read first (a change
    /// racing with the load bumps it again, and the next check reloads).
    pub async fn load_upstreams(&self) -> Result<(i64, Vec<UpstreamRow>), DbError> {
        let version = self.upstreams_version().await?;
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM upstreams ORDER BY name")).fetch_all(&self.pool).await?;
        let rows = rows.iter().map(upstream_row).collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok((version, rows))
    }

    /// Stores `row` (in place of the entry of its name, if there is one;
    /// its creation time kept). Returns whether it replaced one.
    pub async fn put_upstream(&self, row: &UpstreamRow) -> Result<bool, DbError> {
        let mut tx = self.pool.begin().await?;
        let replaced =
            sqlx::query("UPDATE upstreams SET spec = $1, key_id = $2, sealed = $3, updated_at_ms = $4 WHERE name = $5")
                .bind(&row.spec)
                .bind(&row.key_id)
                .bind(&row.sealed)
                .bind(row.updated_at_ms)
                .bind(&row.name)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                > 0;
        if !replaced {
            sqlx::query(&format!("INSERT INTO upstreams ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"))
                .bind(&row.name)
                .bind(&row.spec)
                .bind(&row.key_id)
                .bind(&row.sealed)
                .bind(row.created_at_ms)
                .bind(row.updated_at_ms)
                .execute(&mut *tx)
                .await?;
        }
        self.bump_upstreams(&mut tx).await?;
        tx.commit().await?;
        Ok(replaced)
    }

    /// Removes the entry of `name`.
    pub async fn delete_upstream(&self, name: &str) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        let n =
            sqlx::query("DELETE FROM upstreams WHERE name = $1").bind(name).execute(&mut *tx).await?.rows_affected();
        if n == 0 {
            return Err(DbError::NotFound(format!("registered upstream {name:?}")));
        }
        self.bump_upstreams(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn bump_upstreams(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), DbError> {
        sqlx::query("UPDATE upstreams_version SET version = version + 1 WHERE id = 1").execute(&mut **tx).await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, '')").bind(UPSTREAMS_CHANNEL).execute(&mut **tx).await?;
        }
        Ok(())
    }
}

fn upstream_row(r: &AnyRow) -> Result<UpstreamRow, sqlx::Error> {
    Ok(UpstreamRow {
        name: r.try_get("name")?,
        spec: r.try_get("spec")?,
        key_id: r.try_get("key_id")?,
        sealed: r.try_get("sealed")?,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
    })
}
