-- Tool-definition pinning (docs/operations.md, "Tool-definition pinning"):
-- per tenant, each tool's approved definition, and a changed one waiting
-- for an operator. Digests are the SHA-256 (hex) of a definition's
-- canonical JSON; definitions are kept to show what changed.

CREATE TABLE tool_pins (
    tenant              TEXT NOT NULL,
    -- The tool's name as the tenant's clients see it.
    tool                TEXT NOT NULL,
    upstream            TEXT NOT NULL,
    -- NULL until a definition of it is approved.
    approved_digest     TEXT,
    approved_definition TEXT,
    approved_at_ms      BIGINT,
    -- 'first_sight', or the operator's interface ('api', 'cli', 'console').
    approved_by         TEXT,
    -- A definition seen since, not approved (NULL: none).
    pending_digest      TEXT,
    pending_definition  TEXT,
    pending_since_ms    BIGINT,
    -- When an operator rejected the pending definition (it stays withheld).
    rejected_at_ms      BIGINT,
    -- Every definition rejected for this tool (digests, space-separated,
    -- the newest last, at most 16): withheld whenever the upstream serves
    -- one of them again, never waiting for a decision again.
    rejected_digests    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, tool)
);

-- Bumped by every change to the pins: replicas reload them when it moves.
CREATE TABLE tool_pins_version (
    id      INTEGER PRIMARY KEY,
    version BIGINT NOT NULL
);

INSERT INTO tool_pins_version (id, version) VALUES (1, 0);
