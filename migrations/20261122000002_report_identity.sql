-- A report is identified by its task token (`token_nonce`): a token answers one report, and a
-- retry resends the same token with the same report id. The unique key on the device-chosen
-- random `report_id` is dropped: random keys sent every group commit to a different B-tree
-- page (SQLite wrote ~4 WAL pages per report at 1 M reports), while nonces are issued in time
-- order (tokens.rs) and insert near the end of their index. Same columns, rebuilt without it.
CREATE TABLE reports_by_token (
    collection_id TEXT NOT NULL,
    token_nonce TEXT NOT NULL,
    report_id TEXT NOT NULL,
    round BIGINT NOT NULL,
    factor TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    payload TEXT NOT NULL
);

INSERT INTO reports_by_token (collection_id, token_nonce, report_id, round, factor, mechanism, payload)
SELECT collection_id, token_nonce, report_id, round, factor, mechanism, payload FROM reports;

DROP TABLE reports;

ALTER TABLE reports_by_token RENAME TO reports;

CREATE UNIQUE INDEX reports_token_nonce ON reports (collection_id, token_nonce);
