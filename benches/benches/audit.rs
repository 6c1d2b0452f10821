//! Audit throughput: records per second into PostgreSQL and SQLite, written
//! as the audit writer writes them (batches of 500 records, ids skipped when
//! present: `AuditWriter`, in one transaction, binary `COPY`s of 64 rows on
//! PostgreSQL, or one `COPY` a batch as a writer behind writes them
//! (`postgres/at_once`), prepared inserts of 16 rows on SQLite); and on
//! SQLite through the pool as well (sqlx, as the admin API writes its few
//! records), for comparison. PostgreSQL is the machine's
//! (`SWITCHBOARD_BENCH_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/postgres`),
//! in a database created for the run and dropped after; without it, only
//! SQLite is measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sqlx::Connection;
use switchboard_db::{AuditRecord, Database, Pace};

const BATCH: usize = 500;

fn batch(next: &AtomicU64) -> Vec<AuditRecord> {
    (0..BATCH)
        .map(|_| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            AuditRecord {
                id: format!("bench{n:016x}"),
                at_ms: 1_800_000_000_000 + n as i64,
                tenant: Some("bench".into()),
                key_prefix: Some("sb_AbCdEfGh".into()),
                session: Some("3f6c0a1b2c3d4e5f60718293a4b5c6d7".into()),
                method: "tools/call".into(),
                target: Some("everything__echo".into()),
                upstream: Some("everything".into()),
                outcome: "ok".into(),
                error_code: None,
                latency_us: 412,
                request_bytes: 118,
                response_bytes: 96,
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                arguments: None,
                user: None,
            }
        })
        .collect()
}

/// Through the audit writer's way at `pace` (`pool`: through the pool
/// instead).
fn measure(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, db: &Database, pool: bool, pace: Pace) {
    // Ids never repeat across the measurements on one database: a batch of
    // ids already present is a COPY that fails and a second way that skips
    // them, not a write.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let next = &NEXT;
    let mut writer = (!pool).then(|| db.audit_writer(Duration::from_secs(3)).expect("the audit writer's way"));
    let mut group = c.benchmark_group("audit");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    group.bench_function(format!("{name}/insert_batch_{BATCH}"), |b| {
        b.iter_batched(
            || batch(next),
            |records| match &mut writer {
                Some(writer) => rt.block_on(writer.insert(&records, pace)).expect("insert"),
                None => rt.block_on(db.insert_audit(&records)).expect("insert"),
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn audit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // The pool is created lazily but needs the runtime's context.
    let _context = rt.enter();

    let dir = std::env::temp_dir().join(format!("sb-bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sqlite = Database::connect(&format!("sqlite:{}", dir.join("audit.db").display()), Duration::from_secs(3))
        .expect("sqlite");
    rt.block_on(sqlite.migrate()).expect("migrate sqlite");
    measure(c, &rt, "sqlite", &sqlite, false, Pace::Paced);
    measure(c, &rt, "sqlite/pool", &sqlite, true, Pace::Paced);
    let _ = std::fs::remove_dir_all(&dir);

    let admin = std::env::var("SWITCHBOARD_BENCH_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("sb_bench_{}", std::process::id());
    let created = rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&admin).await?;
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await?;
        Ok::<_, sqlx::Error>(())
    });
    if let Err(e) = created {
        eprintln!("audit bench: PostgreSQL at {admin} unavailable ({e}); measured SQLite only");
        return;
    }
    let url = format!("{}/{name}", admin.rsplit_once('/').map_or(admin.as_str(), |(base, _)| base));
    let pg = Database::connect(&url, Duration::from_secs(3)).expect("postgres");
    rt.block_on(pg.migrate()).expect("migrate postgres");
    measure(c, &rt, "postgres", &pg, false, Pace::Paced);
    measure(c, &rt, "postgres/at_once", &pg, false, Pace::AtOnce);
    drop(pg);
    rt.block_on(async {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut conn).await;
        }
    });
}

criterion_group!(benches, audit);
criterion_main!(benches);
