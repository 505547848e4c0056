-- report_tokens_staged: tokens of group commits whose reports answer many fetches at once (a
-- load of single reports), one row per commit and collection, the tokens as report_tokens'
-- insert binds them (["report-id nonce", ...]) and their number. Such a commit would put each
-- token into a different leaf of report_tokens and write each of those pages to the WAL;
-- staged, it appends one row, and every 1,024 staged tokens one commit moves them all
-- into report_tokens in key order and deletes these rows. The committer keeps the staged
-- tokens in memory to refuse a replay of one of them; a new committer moves them first. SQLite
-- only: several PostgreSQL processes must see each other's tokens in report_tokens' key, so
-- there this table stays empty.
CREATE TABLE report_tokens_staged (
    collection_id TEXT NOT NULL,
    reports BIGINT NOT NULL,
    tokens TEXT NOT NULL
);
