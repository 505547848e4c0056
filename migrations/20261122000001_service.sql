-- ldpsyn aggregator service schema. Shared by SQLite and PostgreSQL: only TEXT and BIGINT
-- columns, JSON kept as TEXT. Append-only: never edit a migration that has shipped.

-- Process-wide settings, e.g. the generated task-token key (`token_key`).
CREATE TABLE settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- One row per collection: the public config and the engine's state (both JSON).
-- `state_version` increases with every transition so other processes notice it.
CREATE TABLE collections (
    id TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    state TEXT NOT NULL,
    state_version BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

-- Accepted reports. No IP address or other identifier of the sender is stored: the report id
-- is random and chosen on the device, the token nonce is random and chosen by the server.
CREATE TABLE reports (
    collection_id TEXT NOT NULL,
    report_id TEXT NOT NULL,
    token_nonce TEXT NOT NULL,
    round BIGINT NOT NULL,
    factor TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (collection_id, report_id)
);

-- A token answers one report.
CREATE UNIQUE INDEX reports_token_nonce ON reports (collection_id, token_nonce);

-- Accepted reports per task round (the quota that closes a round counts these).
CREATE TABLE round_counts (
    collection_id TEXT NOT NULL,
    round BIGINT NOT NULL,
    accepted BIGINT NOT NULL,
    PRIMARY KEY (collection_id, round)
);
