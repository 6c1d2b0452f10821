//! Usage, computed from the audit log: per tenant, key, user, upstream and
//! tool (any of them), the calls, those that failed, the bytes each way and
//! the time taken, over a time range. One aggregate query on the database
//! (nothing is counted on a request's path), on the audit log's
//! `(tenant, at_ms)` and `at_ms` indexes.

use serde::Serialize;
use sqlx::Row;

use crate::{Database, DbError, Param, Sql};

/// What usage is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dimension {
    Tenant,
    Key,
    User,
    Upstream,
    Tool,
}

impl Dimension {
    pub const ALL: [Dimension; 5] =
        [Dimension::Tenant, Dimension::Key, Dimension::User, Dimension::Upstream, Dimension::Tool];

    /// The audit log's column.
    fn column(self) -> &'static str {
        match self {
            Dimension::Tenant => "tenant",
            Dimension::Key => "key_prefix",
            Dimension::User => "user_id",
            Dimension::Upstream => "upstream",
            Dimension::Tool => "target",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Dimension::Tenant => "tenant",
            Dimension::Key => "key",
            Dimension::User => "user",
            Dimension::Upstream => "upstream",
            Dimension::Tool => "tool",
        }
    }

    /// The dimension named `name`.
    pub fn parse(name: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.label() == name)
    }
}

/// Which records, grouped how.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    /// From (inclusive) and to (exclusive), ms since the epoch.
    pub from_ms: i64,
    pub to_ms: i64,
    /// One tenant's only.
    pub tenant: Option<String>,
    /// One method's only (`tools/call` by default); `None`: every method.
    pub method: Option<String>,
    pub group_by: Vec<Dimension>,
}

/// One group's usage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageRow {
    /// The group's value of each dimension grouped by, in order (`None`:
    /// records without one, such as a call refused before its upstream
    /// was known).
    pub group: Vec<Option<String>>,
    pub calls: i64,
    /// Calls whose outcome was not `ok`.
    pub errors: i64,
    pub request_bytes: i64,
    pub response_bytes: i64,
    /// The time taken, all calls together, and the longest one (µs).
    pub total_latency_us: i64,
    pub max_latency_us: i64,
}

impl Database {
    /// Usage over a time range, grouped as `query` says, groups in order.
    pub async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, DbError> {
        let columns: Vec<&str> = query.group_by.iter().map(|d| d.column()).collect();
        let select = if columns.is_empty() { String::new() } else { format!("{}, ", columns.join(", ")) };
        let mut q = Sql::new(
            self.backend,
            &format!(
                "SELECT {select}COUNT(*), {errors}, {request}, {response}, {latency}, \
                 CAST(COALESCE(MAX(latency_us), 0) AS BIGINT) FROM audit_log WHERE 1 = 1",
                // PostgreSQL sums BIGINTs as NUMERIC: cast back, on both.
                errors = "CAST(COALESCE(SUM(CASE WHEN outcome = 'ok' THEN 0 ELSE 1 END), 0) AS BIGINT)",
                request = "CAST(COALESCE(SUM(request_bytes), 0) AS BIGINT)",
                response = "CAST(COALESCE(SUM(response_bytes), 0) AS BIGINT)",
                latency = "CAST(COALESCE(SUM(latency_us), 0) AS BIGINT)"
            ),
        );
        q.and("at_ms >=", Param::Int(Some(query.from_ms)));
        q.and("at_ms <", Param::Int(Some(query.to_ms)));
        if let Some(t) = &query.tenant {
            q.and("tenant =", Param::Text(Some(t.clone())));
        }
        if let Some(m) = &query.method {
            q.and("method =", Param::Text(Some(m.clone())));
        }
        if !columns.is_empty() {
            let list = columns.join(", ");
            q.text.push_str(&format!(" GROUP BY {list} ORDER BY {list}"));
        }
        let rows = q.query().fetch_all(&self.pool).await?;
        let n = columns.len();
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let calls: i64 = r.try_get(n)?;
            if calls == 0 {
                // No record at all (an aggregate without groups still answers one row).
                continue;
            }
            let sum = |i: usize| r.try_get::<i64, _>(i);
            out.push(UsageRow {
                group: (0..n).map(|i| r.try_get::<Option<String>, _>(i)).collect::<Result<_, _>>()?,
                calls,
                errors: sum(n + 1)?,
                request_bytes: sum(n + 2)?,
                response_bytes: sum(n + 3)?,
                total_latency_us: sum(n + 4)?,
                max_latency_us: sum(n + 5)?,
            });
        }
        Ok(out)
    }
}

/// `rows` as CSV: a header (the dimensions, then the figures), one line
/// per group; fields quoted where they must be.
pub fn to_csv(group_by: &[Dimension], rows: &[UsageRow]) -> String {
    fn field(text: &str) -> String {
        // A leading = + - @ would be a formula to a spreadsheet.
        let text = if text.starts_with(['=', '+', '-', '@']) { format!("'{text}") } else { text.to_owned() };
        if text.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", text.replace('"', "\"\""))
        } else {
            text
        }
    }
    let mut out = String::new();
    let mut header: Vec<&str> = group_by.iter().map(|d| d.label()).collect();
    header.extend(["calls", "errors", "request_bytes", "response_bytes", "total_latency_us", "max_latency_us"]);
    out.push_str(&header.join(","));
    out.push('\n');
    for r in rows {
        let mut fields: Vec<String> = r.group.iter().map(|g| field(g.as_deref().unwrap_or(""))).collect();
        fields.extend(
            [r.calls, r.errors, r.request_bytes, r.response_bytes, r.total_latency_us, r.max_latency_us]
                .map(|n| n.to_string()),
        );
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_it_must_and_never_starts_a_formula() {
        let rows = [UsageRow {
            group: vec![Some("acme".into()), Some("=cmd|x".into()), Some("a,b \"c\"".into()), None],
            calls: 3,
            errors: 1,
            request_bytes: 10,
            response_bytes: 20,
            total_latency_us: 300,
            max_latency_us: 200,
        }];
        let dims = [Dimension::Tenant, Dimension::Tool, Dimension::Upstream, Dimension::User];
        assert_eq!(
            to_csv(&dims, &rows),
            "tenant,tool,upstream,user,calls,errors,request_bytes,response_bytes,total_latency_us,max_latency_us\n\
             acme,'=cmd|x,\"a,b \"\"c\"\"\",,3,1,10,20,300,200\n"
        );
        assert_eq!(Dimension::parse("key"), Some(Dimension::Key));
        assert_eq!(Dimension::parse("nope"), None);
    }
}
