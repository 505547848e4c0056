-- Sufficient statistics per table (collection, round, factor, mechanism, bins), kept in the
-- same transaction as the reports they count. Additive: any process adds its group's counts
-- with an upsert, so round closes and startup read O(tables × cells) rows instead of every
-- report. `cell` -1 holds the table's number of reports n; cell c ≥ 0 its count of c.
CREATE TABLE table_counts (
    collection_id TEXT NOT NULL,
    round BIGINT NOT NULL,
    factor TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    bins TEXT NOT NULL,
    cell BIGINT NOT NULL,
    total BIGINT NOT NULL,
    PRIMARY KEY (collection_id, round, factor, mechanism, bins, cell)
);

-- Collections whose table_counts are complete: every collection created from now on, and
-- each older one once a process has rebuilt its counts from its reports.
CREATE TABLE table_counts_ready (
    collection_id TEXT PRIMARY KEY
);
