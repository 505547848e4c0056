-- Reports as one compact row per group commit and collection, beside a lean replay set
-- (issue 34 item 2). A report was a row of eight values plus an entry in the unique index on
-- (collection_id, token_nonce), and every group's INSERT read its rows back (RETURNING) to find
-- the replays; that was half of a batched report's CPU.
--
-- report_tokens: the replay set, one row per report. Its key refuses a second answer to a
-- token, across processes too; `report_id` tells a retry (same id: duplicate) from a second
-- answer (another id: token reused).
CREATE TABLE report_tokens (
    collection_id TEXT NOT NULL,
    token_nonce TEXT NOT NULL,
    report_id TEXT NOT NULL,
    PRIMARY KEY (collection_id, token_nonce)
);

-- report_groups: the reports one group commit accepted for one collection, a JSON array with
-- one [round, factor, mechanism, bins, payload] per report (bins: [] when no attribute is
-- binned). Read only to rebuild table counts (Db::load_tables); deleted with the collection,
-- or by the retention sweep with report_tokens.
CREATE TABLE report_groups (
    collection_id TEXT NOT NULL,
    reports TEXT NOT NULL
);

CREATE INDEX report_groups_collection ON report_groups (collection_id);

INSERT INTO report_tokens (collection_id, token_nonce, report_id)
SELECT collection_id, token_nonce, report_id FROM reports;

-- A stored report becomes a group of one (its factor and mechanism hold no quote; bins and
-- payload are JSON already).
INSERT INTO report_groups (collection_id, reports)
SELECT collection_id,
       '[[' || round || ',"' || factor || '","' || mechanism || '",' ||
       CASE WHEN bins = '' THEN '[]' ELSE bins END || ',' || payload || ']]'
FROM reports;

DROP TABLE reports;
