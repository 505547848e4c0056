-- Vertical collections with encoding `fo+locmrf` (VertiMRF §4.1, LocMRF): each party's local
-- central-DP model of its own attributes (JSON: noisy marginals with their noise, the party's
-- attribute graph, its privacy accounting). One per (collection, party), never replaced: a
-- second, different model would spend the party's budget twice. Kept with the tables when
-- the retention sweep deletes raw records (the model fit needs it; it is an aggregate).
CREATE TABLE party_models (
    collection_id TEXT NOT NULL,
    party TEXT NOT NULL,
    model TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (collection_id, party)
);
