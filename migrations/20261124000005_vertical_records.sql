-- Vertical collections (VertiMRF): each party's randomized codes per pseudonymous record id
-- (a JSON array, one GRR output per party attribute in party order). One row per (record id,
-- party): a party's resend must carry the same codes. The tables they add (1-ways, pairs
-- within the party, and pairs with the other parties' rows of the same id) go to
-- table_counts in the same transaction.
CREATE TABLE vertical_records (
    collection_id TEXT NOT NULL,
    record_id TEXT NOT NULL,
    party TEXT NOT NULL,
    codes TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (collection_id, record_id, party)
);
