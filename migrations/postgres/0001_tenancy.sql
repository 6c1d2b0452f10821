-- Tenants, API keys, the audit log, and the version number replicas watch
-- to reload tenants and keys. Timestamps are Unix milliseconds (BIGINT) so
-- that PostgreSQL and SQLite share one schema.

CREATE TABLE tenants (
    name          TEXT PRIMARY KEY,
    -- The tenant's policy as JSON: upstreams, tool allow/deny, limits,
    -- audit_arguments (docs/config.md, [[tenants]]).
    policy        TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE api_keys (
    -- The key's first characters, shown to identify it ("sb_AbC123xy").
    prefix        TEXT PRIMARY KEY,
    -- SHA-256 of the whole key, hex. The key itself is never stored.
    hash          TEXT NOT NULL UNIQUE,
    -- A tenant of the database or of the config file (so no foreign key).
    tenant        TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);

CREATE INDEX api_keys_tenant ON api_keys (tenant);

CREATE TABLE audit_log (
    -- Insertion order, for `audit tail`.
    seq            BIGSERIAL PRIMARY KEY,
    -- Chosen by the router when the request is made: a replayed record is
    -- never written twice.
    id             TEXT NOT NULL UNIQUE,
    at_ms          BIGINT NOT NULL,
    tenant         TEXT,
    key_prefix     TEXT,
    session        TEXT,
    method         TEXT NOT NULL,
    target         TEXT,
    upstream       TEXT,
    outcome        TEXT NOT NULL,
    error_code     BIGINT,
    latency_us     BIGINT NOT NULL,
    request_bytes  BIGINT NOT NULL,
    response_bytes BIGINT NOT NULL,
    trace_id       TEXT,
    arguments      TEXT
);

CREATE INDEX audit_log_tenant_at ON audit_log (tenant, at_ms);
CREATE INDEX audit_log_at ON audit_log (at_ms);

CREATE TABLE config_version (
    id      INTEGER PRIMARY KEY,
    version BIGINT NOT NULL
);

INSERT INTO config_version (id, version) VALUES (1, 0);
