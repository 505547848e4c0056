-- Vertical collections with encoding `sketch+locmrf` (VertiMRF §4.3, LocEnc with n̂): each
-- party's one sketch report (JSON: its sketch parameters, its key's fingerprint, its
-- attributes' bin counts, the DP Flajolet–Martin sketches of every value's id set, base64,
-- and its noisy record count). One per (collection, party), never replaced: a second,
-- different report would spend the party's budget twice. An aggregate like `party_models`,
-- kept with it when the retention sweep deletes raw records.
CREATE TABLE party_sketches (
    collection_id TEXT NOT NULL,
    party TEXT NOT NULL,
    report TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (collection_id, party)
);
