-- Statistics of group commits not yet folded into table_counts: one row per commit and
-- collection, the group's nonzero cells as one JSON text
-- [[round, "factor", "mechanism", bins, n, [cell, count, ...]], ...] (bins: [] when no
-- attribute is binned). A commit appends here instead of upserting every cell its reports
-- touched, which sent each small group commit to many table_counts pages; every so many
-- commits one of them deletes a collection's rows and adds their sum to table_counts in the
-- same transaction. A collection's statistics are its table_counts plus its count_deltas,
-- read in one statement.
CREATE TABLE count_deltas (
    collection_id TEXT NOT NULL,
    delta TEXT NOT NULL
);

CREATE INDEX count_deltas_collection ON count_deltas (collection_id);
