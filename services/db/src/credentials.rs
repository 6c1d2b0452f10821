//! The vault's table: sealed upstream credentials, per (tenant, user,
//! upstream). This layer stores what it is given; sealing and opening are
//! the vault's (`switchboard-vault`), which alone holds the key.

use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::{Backend, Database, DbError};

/// The channel PostgreSQL replicas listen on for vault changes.
pub const VAULT_CHANNEL: &str = "switchboard_vault";

/// One stored credential: sealed, with what may be shown of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CredentialRow {
    pub tenant: String,
    /// The user; `""` for the tenant's own credential.
    #[serde(rename = "user")]
    pub user_id: String,
    pub upstream: String,
    /// What the sealed value holds (`headers`).
    pub kind: String,
    /// The id of the vault key that sealed it.
    pub key_id: String,
    /// base64(nonce ‖ ciphertext ‖ tag): never shown.
    #[serde(skip_serializing)]
    pub sealed: String,
    /// The header names, comma-separated (never a value).
    pub names: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

const COLUMNS: &str = "tenant, user_id, upstream, kind, key_id, sealed, names, created_at_ms, updated_at_ms";

impl Database {
    /// The number bumped by every change to credentials.
    pub async fn vault_version(&self) -> Result<i64, DbError> {
        let row = sqlx::query("SELECT version FROM vault_version WHERE id = 1").fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Every credential, with the version read first (a change racing with
    /// the load bumps it again, and the next check reloads).
    pub async fn load_credentials(&self) -> Result<(i64, Vec<CredentialRow>), DbError> {
        let version = self.vault_version().await?;
        let rows = self.credentials(None).await?;
        Ok((version, rows))
    }

    /// The credentials of `tenant` (every tenant's with `None`), in order.
    pub async fn credentials(&self, tenant: Option<&str>) -> Result<Vec<CredentialRow>, DbError> {
        let rows = match tenant {
            Some(tenant) => {
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM credentials WHERE tenant = $1 ORDER BY tenant, user_id, upstream"
                ))
                .bind(tenant)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(&format!("SELECT {COLUMNS} FROM credentials ORDER BY tenant, user_id, upstream"))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(|r| credential_row(r).map_err(DbError::from)).collect()
    }

    /// How many credentials `tenant` has.
    pub async fn count_credentials(&self, tenant: &str) -> Result<i64, DbError> {
        let row = sqlx::query("SELECT COUNT(*) FROM credentials WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Stores a credential, replacing the one of the same (tenant, user,
    /// upstream) and keeping its creation time: one statement, so two
    /// writers of a new one do not lose either's write silently (the last wins).
    pub async fn put_credential(&self, row: &CredentialRow) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO credentials ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (tenant, user_id, upstream) DO UPDATE SET kind = excluded.kind, key_id = excluded.key_id, \
             sealed = excluded.sealed, names = excluded.names, updated_at_ms = excluded.updated_at_ms"
        ))
        .bind(&row.tenant)
        .bind(&row.user_id)
        .bind(&row.upstream)
        .bind(&row.kind)
        .bind(&row.key_id)
        .bind(&row.sealed)
        .bind(&row.names)
        .bind(row.created_at_ms)
        .bind(row.updated_at_ms)
        .execute(&mut *tx)
        .await?;
        self.bump_vault(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes the credential of (tenant, user, upstream); `NotFound` if
    /// there is none.
    pub async fn delete_credential(&self, tenant: &str, user: &str, upstream: &str) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("DELETE FROM credentials WHERE tenant = $1 AND user_id = $2 AND upstream = $3")
            .bind(tenant)
            .bind(user)
            .bind(upstream)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 0 {
            let whose =
                if user.is_empty() { format!("tenant {tenant:?}") } else { format!("user {user:?} of {tenant:?}") };
            return Err(DbError::NotFound(format!("a credential of {whose} for upstream {upstream:?}")));
        }
        self.bump_vault(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replaces the sealed value and key id of credentials (a key rotation),
    /// each only if it is still sealed as `was` says (a credential changed
    /// meanwhile keeps its new value); how many were replaced.
    pub async fn reseal_credentials(&self, resealed: &[(CredentialRow, String)]) -> Result<u64, DbError> {
        let mut tx = self.pool.begin().await?;
        let mut n = 0;
        for (row, was) in resealed {
            n += sqlx::query(
                "UPDATE credentials SET key_id = $1, sealed = $2 \
                 WHERE tenant = $3 AND user_id = $4 AND upstream = $5 AND sealed = $6",
            )
            .bind(&row.key_id)
            .bind(&row.sealed)
            .bind(&row.tenant)
            .bind(&row.user_id)
            .bind(&row.upstream)
            .bind(was)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        self.bump_vault(&mut tx).await?;
        tx.commit().await?;
        Ok(n)
    }

    pub(crate) async fn bump_vault(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), DbError> {
        sqlx::query("UPDATE vault_version SET version = version + 1 WHERE id = 1").execute(&mut **tx).await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, '')").bind(VAULT_CHANNEL).execute(&mut **tx).await?;
        }
        Ok(())
    }
}

fn credential_row(r: &AnyRow) -> Result<CredentialRow, sqlx::Error> {
    Ok(CredentialRow {
        tenant: r.try_get(0)?,
        user_id: r.try_get(1)?,
        upstream: r.try_get(2)?,
        kind: r.try_get(3)?,
        key_id: r.try_get(4)?,
        sealed: r.try_get(5)?,
        names: r.try_get(6)?,
        created_at_ms: r.try_get(7)?,
        updated_at_ms: r.try_get(8)?,
    })
}
