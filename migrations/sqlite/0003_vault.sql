-- The credential vault: what the router sends an upstream for one tenant,
-- or one user of a tenant, in place of the upstream's own headers. Values
-- are sealed with AES-256-GCM under the vault key named by key_id, bound to
-- (tenant, user_id, upstream, kind); nothing readable is stored but the
-- names of the headers (docs/operations.md, "The credential vault").

CREATE TABLE credentials (
    tenant        TEXT NOT NULL,
    -- The user (an OAuth token's or a client certificate's); '' for the
    -- tenant's own credential.
    user_id       TEXT NOT NULL,
    upstream      TEXT NOT NULL,
    -- What the sealed value holds: 'headers'.
    kind          TEXT NOT NULL,
    -- The id of the vault key that sealed it (a hash of the key, not the key).
    key_id        TEXT NOT NULL,
    -- base64(nonce || ciphertext || tag).
    sealed        TEXT NOT NULL,
    -- The header names, comma-separated, for listing: never a value.
    names         TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, user_id, upstream)
);

-- Bumped by every change to credentials: replicas reload the vault when it moves.
CREATE TABLE vault_version (
    id      INTEGER PRIMARY KEY,
    version BIGINT NOT NULL
);

INSERT INTO vault_version (id, version) VALUES (1, 0);
