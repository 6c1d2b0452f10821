-- The upstream registry: MCP servers added, changed and removed through the
-- admin API and the CLI while the routers run (docs/operations.md, "The
-- upstream registry"). Each replica applies them within database.refresh
-- (at once on PostgreSQL); an entry wins over the config file's upstream of
-- the same name.

CREATE TABLE upstreams (
    name          TEXT PRIMARY KEY,
    -- The entry as JSON, with the keys of a [[upstreams]] entry of the
    -- config file (docs/config.md), its header values left out.
    spec          TEXT NOT NULL,
    -- Its headers (names and values) sealed with AES-256-GCM under the
    -- vault key named by key_id, bound to the upstream's name; '' when it
    -- has none.
    key_id        TEXT NOT NULL,
    sealed        TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);

-- Bumped by every change to the registry: replicas reload it when it moves.
CREATE TABLE upstreams_version (
    id      INTEGER PRIMARY KEY,
    version BIGINT NOT NULL
);

INSERT INTO upstreams_version (id, version) VALUES (1, 0);
