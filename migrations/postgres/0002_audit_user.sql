-- The user an OAuth access token named (its `sub`, or the configured claim),
-- beside the API key prefix; NULL for requests made with API keys.
ALTER TABLE audit_log ADD COLUMN user_id TEXT;
