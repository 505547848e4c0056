//! Storage over SQLite (embedded default) and PostgreSQL with one code path: the sqlx `Any`
//! driver, `$n` placeholders (understood by both), TEXT and BIGINT columns only, and the
//! shared migrations in `migrations/`, run at startup.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::time::Duration;

use futures_util::TryStreamExt;
use ldpsyn::mechanism::{MechanismKind, SufficientStatistics};
use ldpsyn::wire::Payload;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::error::ErrorKind;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, Connection, Executor, Row};
use uuid::Uuid;

use ldpsyn_engine::measure::local_model::LocalModel;
use ldpsyn_engine::protocols::cross_party::SketchUpload;
use ldpsyn_engine::{CollectionState, Engine, EngineError, PartyUploads, TableKey, Tables};

/// The detail of a 503 for a database that is unreachable or out of space: nothing the
/// request wrote is acknowledged, and the same request sent again later is safe (a report
/// that was stored after all is answered `duplicate`).
pub const DATABASE_UNAVAILABLE: &str = "the database is unreachable or out of space; nothing of \
     this request is acknowledged: send it again later (a report already stored is answered \
     duplicate)";

/// Errors of the storage layer. The HTTP layer turns them into a 503 `unavailable` problem
/// when the database is unreachable or out of space ([`StorageError::is_unavailable`]), else
/// into a 500 `internal` one (`From<StorageError> for ApiError` in [`super::error`]); their
/// details are logged, never sent.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database failed (connection, query, constraint, transaction).
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed at startup.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Stored JSON (a payload, a state, a config) could not be read or written.
    #[error("stored JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Stored data does not fit the collection's engine (a mechanism cannot be built, a
    /// table does not merge).
    #[error("engine on stored data: {0}")]
    Engine(#[from] EngineError),
    /// A stored value is not what the schema allows (a mechanism name, a factor, an id).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// A collection's row disappeared while it was being read (deleted meanwhile, possibly
    /// by another process).
    #[error("collection {0} is not stored")]
    MissingCollection(Uuid),
    /// The database URL names neither `sqlite:` nor `postgres:`.
    #[error("unsupported database URL scheme `{0}` (sqlite:// or postgres://)")]
    UnsupportedUrl(String),
}

impl StorageError {
    /// Whether the database could not do the work now though nothing is wrong with the
    /// request or the stored data: it is unreachable (the connection refused, reset or
    /// closed, the pool timed out, the server shutting down or starting) or out of space
    /// (SQLite `SQLITE_FULL` and I/O errors, PostgreSQL class 53). Such a request is
    /// answered 503 `unavailable`: a retry once the database is back can succeed.
    pub fn is_unavailable(&self) -> bool {
        let StorageError::Database(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
            sqlx::Error::Database(d) => {
                if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                    // The primary result code is the low byte of the extended one.
                    let code = d.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
                    matches!(code & 0xff, 10 | 13) // SQLITE_IOERR, SQLITE_FULL
                } else if let Some(e) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                    // 08: connection exception; 53: insufficient resources (disk full);
                    // 57P01-57P03: the server shutting down, crashed, or starting.
                    let code = e.code();
                    code.starts_with("08")
                        || code.starts_with("53")
                        || matches!(code, "57P01" | "57P02" | "57P03")
                } else {
                    false
                }
            }
            _ => false,
        }
    }
}

/// The shared migrations (`migrations/` at the workspace root).
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// SQLite's insert of a collection's tokens into the replay set: `$1` the collection id,
/// `$2` the tokens as [`tokens_json`] writes them. A macro so that [`Writer::append_group`]
/// can put it in its script at compile time.
macro_rules! sqlite_insert_tokens {
    () => {
        "INSERT INTO report_tokens (collection_id, token_nonce, report_id) \
         SELECT $1, substr(value, 38), substr(value, 1, 36) FROM json_each($2)"
    };
}

/// SQLite's move of every staged token (`report_tokens_staged`, see [`Writer`]) into the
/// replay set, in key order, then the staged rows' delete: two statements, run inside a write
/// transaction. A staged token is never also in `report_tokens` (the commit that staged it
/// checked), so the insert fails only on a broken invariant, and then nothing moves. A macro
/// so that [`Writer`] can put it in its script at compile time.
macro_rules! sqlite_merge_staged {
    () => {
        "INSERT INTO report_tokens (collection_id, token_nonce, report_id) \
         SELECT s.collection_id, substr(j.value, 38), substr(j.value, 1, 36) \
         FROM report_tokens_staged AS s, json_each(s.tokens) AS j ORDER BY 1, 2; \
         DELETE FROM report_tokens_staged"
    };
}

/// Staged tokens after which [`Writer`] moves them all into the replay set. A move touches
/// each leaf its tokens fall in once, so its pages per token fall as it grows, but the group
/// commit that moves them waits for it. Swept over 256–65,536 under `bench-ingest`'s single
/// reports on SQLite (`benchmarks/results/profile-ingest.md`): from 1,024 on, reports per
/// second and CPU per report stay level and the 99th percentile latency grows (8 ms at 1,024,
/// 13–14 ms from 16,384); below, the CPU per report rises.
const MERGE_STAGED_AT: usize = 1024;

/// Rows of `report_tokens` in one 4 KiB leaf page: a row is the collection id and the report
/// id (36 characters each), the nonce (32 hex digits) and SQLite's cell and record headers,
/// about 112 bytes. A group commit whose tokens answer more fetches than its size over this
/// (each fetch's nonces are neighbours in the key, [`crate::tokens::TaskClaims::fresh_nonces`])
/// would write more leaves for their spread than for their number, and is staged instead.
const REPLAY_ROWS_PER_PAGE: usize = 32;

/// Which database is behind the pool. Private: callers ask [`Datastore`] what they need
/// ([`Datastore::is_shared`]), never which backend it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// SQLite: one process only.
    Sqlite,
    /// PostgreSQL: several processes may share it.
    Postgres,
}

/// The database: SQLite (one process) or PostgreSQL (several processes may share it). The
/// difference stays inside this module: every method has one signature for both, and the
/// connection pool never leaves it. Work that must be atomic goes through
/// [`Datastore::run_tx`] (or [`Writer::run_tx`]), whose [`Transaction`] has one typed method
/// per thing stored.
#[derive(Debug, Clone)]
pub struct Datastore {
    pool: AnyPool,
    backend: Backend,
}

/// The future a transaction's body returns ([`Datastore::run_tx`]): boxed, so that it may
/// borrow the transaction it is given.
pub type TxFuture<'a, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'a>>;

/// A transaction on either backend, owned by [`Datastore::run_tx`] or [`Writer::run_tx`]:
/// it commits when the body returns `Ok` and rolls back when it returns `Err`. Its methods
/// read and write collections, reports and their replay tokens, table and round counts,
/// party records and models; the connection stays inside.
#[derive(Debug)]
pub struct Transaction<'c> {
    inner: sqlx::Transaction<'c, Any>,
    backend: Backend,
}

impl Transaction<'_> {
    /// Commits when `r` is `Ok`, else rolls back. Returns `r` (or the commit's error) and
    /// whether the connection is still sound (its commit or rollback went through).
    async fn finish<T, E: From<StorageError>>(self, r: Result<T, E>) -> (Result<T, E>, bool) {
        match r {
            Ok(v) => match self.inner.commit().await {
                Ok(()) => (Ok(v), true),
                Err(e) => (Err(StorageError::from(e).into()), false),
            },
            Err(e) => {
                let healthy = self.inner.rollback().await.is_ok();
                (Err(e), healthy)
            }
        }
    }
}

/// A connection kept across transactions (the committer's): with SQLite, a pooled
/// connection whose database another connection has written since its last use must reload
/// its whole page cache, which made every group commit re-read the report indexes. Dropped
/// after a failed begin, commit or rollback, and acquired again.
///
/// On SQLite it also stages tokens. A group commit of single reports answers as many fetches
/// as it has reports, and each fetch's nonces sit in their own leaf of the replay set, so
/// inserting them wrote one 4 KiB WAL frame per report. Such a group's tokens go into one row
/// of `report_tokens_staged` instead (checked against `report_tokens` first), and the writer
/// keeps them in memory to refuse a replay of one of them; every 1,024 staged tokens
/// (`MERGE_STAGED_AT`) it moves them into `report_tokens` in one commit. A new writer, or one
/// whose commit ended unknown, moves them before it stages more. Every other reader of the
/// replay set moves them first in its own transaction ([`Transaction::insert_reports`] and the
/// rest), so `report_tokens` holds every token wherever a transaction reads it
/// (`Datastore::count_reports`, for tests, adds the staged rows' counts instead).
#[derive(Debug)]
pub struct Writer {
    store: Datastore,
    conn: Option<PoolConnection<Any>>,
    /// The kept connection failed; dropped at the next [`Writer::run_tx`].
    broken: bool,
    /// SQLite: the staged tokens' nonces by collection, at least those of
    /// `report_tokens_staged` (another transaction may have moved them meanwhile); `None`
    /// when not known.
    staged: Option<HashMap<Uuid, HashSet<String>>>,
}

impl Writer {
    /// A writer on `store` (it acquires its connection at the first [`Writer::run_tx`]).
    pub fn new(store: Datastore) -> Self {
        Self {
            store,
            conn: None,
            broken: false,
            staged: None,
        }
    }

    /// SQLite: moves every staged token into the replay set in a transaction of its own and
    /// empties [`Writer::staged`]. Errors: the database's (nothing moved; the connection is
    /// dropped and the next group tries again).
    async fn merge_staged(&mut self) -> Result<(), StorageError> {
        const MERGE: &str = concat!("BEGIN IMMEDIATE; ", sqlite_merge_staged!(), "; COMMIT");
        let conn = self.connection().await?;
        let conn = self.conn.insert(conn);
        if let Err(e) = conn.execute(MERGE).await {
            let _ = conn.execute("ROLLBACK").await;
            self.broken = true;
            return Err(e.into());
        }
        self.staged = Some(HashMap::new());
        Ok(())
    }

    /// Runs `f` in a transaction on the kept connection (acquired first if there is none),
    /// as [`Datastore::run_tx`] does on a pool connection: committed when `f` returns `Ok`,
    /// rolled back when it returns `Err`. Not retried (see [`Datastore::run_tx`]). Errors:
    /// `f`'s, the database's.
    pub async fn run_tx<'s, T, E, F>(&'s mut self, f: F) -> Result<T, E>
    where
        F: for<'a> FnOnce(&'a mut Transaction<'s>) -> TxFuture<'a, T, E>,
        E: From<StorageError>,
    {
        let conn = self.connection().await?;
        // Borrowed by the transaction for the whole call: a failure is recorded in `broken`
        // (another field) and the connection closed at the next call.
        let conn = self.conn.insert(conn);
        let inner = match conn.begin().await {
            Ok(t) => t,
            Err(e) => {
                self.broken = true;
                return Err(StorageError::from(e).into());
            }
        };
        let mut tx = Transaction {
            inner,
            backend: self.store.backend,
        };
        let r = f(&mut tx).await;
        let (r, healthy) = tx.finish(r).await;
        self.broken = !healthy;
        r
    }

    /// The kept connection, or a new one from the pool when there is none or it failed (a
    /// failed one is closed, not returned: it may be inside a transaction).
    async fn connection(&mut self) -> Result<PoolConnection<Any>, StorageError> {
        let broken = std::mem::take(&mut self.broken);
        match self.conn.take() {
            Some(c) if !broken => Ok(c),
            old => {
                if let Some(mut c) = old {
                    c.close_on_drop();
                }
                Ok(self.store.pool.acquire().await?)
            }
        }
    }

    /// Stores a whole group commit's share of collection `id` in a transaction of its own,
    /// in as few round trips to the database as it can: the tokens of `reports` (no nonce
    /// twice) in the replay set, their group row, `delta` (their statistics) as a count
    /// delta, and `rounds` (accepted reports per task round) added to the round counts.
    /// With `target` (a collection that stops at its target), only if the collection's
    /// accepted reports in the database, plus these, stay within it. Returns, once
    /// committed, the new round counts of `rounds` and the collection's new total.
    ///
    /// `None` when nothing of it was written (the transaction rolled back) and the caller
    /// stores the group statement by statement ([`Transaction::insert_reports`] and the
    /// rest), which tells each report's outcome: a token was already stored, the group would
    /// pass `target`, or (PostgreSQL) the collection is finalized or deleted in the database.
    ///
    /// SQLite: one script, `BEGIN IMMEDIATE` to `COMMIT`, in one call to the connection's
    /// thread; each statement alone cost a wake-up of that thread and of the committer.
    /// PostgreSQL: one round trip, a call of a function that takes the locks (the shared
    /// ingest lock of [`Transaction::ingest_gate`]'s barrier, then with `target` the
    /// collection's), checks the collection's phase and count and writes the four parts, in
    /// a transaction of its own (`POSTGRES_APPEND_FUNCTION`).
    /// Errors: the database's; [`StorageError::Corrupt`] for a stored count out of range.
    pub async fn append_group(
        &mut self,
        id: Uuid,
        reports: &[&NewReport],
        delta: &Tables,
        rounds: &BTreeMap<u32, u64>,
        target: Option<u64>,
    ) -> Result<Option<Appended>, StorageError> {
        let n = reports.len() as u64;
        let parts = GroupParts {
            id: id.to_string(),
            tokens: tokens_json(reports.iter().copied()),
            group: group_text(reports.iter().copied())?,
            delta: delta_text(delta)?,
            rounds: serde_json::to_string(&rounds.iter().collect::<Vec<_>>())?,
            // The largest stored total the group fits on; -1: it fits on none.
            room: match target {
                None => i64::MAX,
                Some(t) => t
                    .checked_sub(n)
                    .map_or(-1, |r| i64::try_from(r).unwrap_or(i64::MAX)),
            },
        };
        match self.store.backend {
            Backend::Sqlite => self.append_group_sqlite(id, reports, &parts).await,
            Backend::Postgres => {
                self.append_group_postgres(id, &parts, target.is_some())
                    .await
            }
        }
    }

    /// [`Writer::append_group`] on PostgreSQL: one round trip, a call of
    /// [`POSTGRES_APPEND_FUNCTION`] in a transaction of its own (no `BEGIN`: the statement
    /// is one, committed before its answer comes back).
    async fn append_group_postgres(
        &mut self,
        id: Uuid,
        parts: &GroupParts,
        lock_collection: bool,
    ) -> Result<Option<Appended>, StorageError> {
        let conn = self.connection().await?;
        let conn = self.conn.insert(conn);
        let call = parts
            .bind(POSTGRES_APPEND)
            .bind(ingest_key(id))
            .bind(collection_key(id))
            .bind(lock_collection);
        match call.fetch_all(&mut **conn).await {
            // A group has at least one report, so a written one returns rows.
            Ok(rows) if rows.is_empty() => Ok(None),
            // Committed; a count out of range is answered as a failure, and the devices'
            // retries are then told `duplicate`.
            Ok(rows) => appended(&rows).map(Some),
            // The statement failed, so its transaction rolled back: nothing written.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            Err(e) => {
                // Whether it committed is unknown when the connection failed: nothing of it
                // is acknowledged, and the connection is replaced.
                self.broken = true;
                Err(e.into())
            }
        }
    }

    /// [`Writer::append_group`] on SQLite, `reports` (all of collection `id`) as `parts`
    /// binds them: their tokens into the replay set, or staged when they answer many fetches
    /// ([`Writer`], [`spread_over_fetches`]).
    async fn append_group_sqlite(
        &mut self,
        id: Uuid,
        reports: &[&NewReport],
        parts: &GroupParts,
    ) -> Result<Option<Appended>, StorageError> {
        // After the tokens' statement: constant text, so each script is prepared once per
        // connection; `$1` is bound in every statement. The last one reads the total.
        macro_rules! rest {
            () => {
                "INSERT INTO report_groups (collection_id, reports) VALUES ($1, $3); \
                 INSERT INTO count_deltas (collection_id, delta) VALUES ($1, $4); \
                 INSERT INTO round_counts (collection_id, round, accepted) \
                 SELECT $1, json_extract(value, '$[0]'), json_extract(value, '$[1]') \
                 FROM json_each($5) WHERE true \
                 ON CONFLICT (collection_id, round) \
                 DO UPDATE SET accepted = round_counts.accepted + excluded.accepted \
                 RETURNING round, accepted; \
                 SELECT -1, COALESCE(SUM(accepted), 0) FROM round_counts WHERE collection_id = $1; \
                 COMMIT"
            };
        }
        // A row of NULLs that fails the tokens' insert (NOT NULL) when the stored total is past
        // `$6`; the statements after it do not run then.
        macro_rules! past_room {
            () => {
                " UNION ALL SELECT NULL, NULL, NULL WHERE (SELECT COALESCE(SUM(accepted), 0) \
                 FROM round_counts WHERE collection_id = $1) > $6"
            };
        }
        // The token insert also fails, undoing itself, on a replayed token (unique key).
        const APPEND: &str = concat!(
            "BEGIN IMMEDIATE; ",
            sqlite_insert_tokens!(),
            past_room!(),
            "; ",
            rest!()
        );
        // The staged row also fails when one of its tokens is in the replay set.
        const STAGE: &str = concat!(
            "BEGIN IMMEDIATE; \
             INSERT INTO report_tokens_staged (collection_id, reports, tokens) \
             SELECT $1, json_array_length($2), $2",
            past_room!(),
            " OR EXISTS (SELECT 1 FROM json_each($2) AS j WHERE EXISTS (SELECT 1 \
             FROM report_tokens WHERE collection_id = $1 \
             AND token_nonce = substr(j.value, 38))); ",
            rest!()
        );
        let held = |s: &HashMap<Uuid, HashSet<String>>| s.values().map(HashSet::len).sum::<usize>();
        if self
            .staged
            .as_ref()
            .is_none_or(|s| held(s) >= MERGE_STAGED_AT)
        {
            self.merge_staged().await?;
        }
        let staged = self.staged.get_or_insert_default();
        if let Some(nonces) = staged.get(&id)
            && reports.iter().any(|r| nonces.contains(&r.nonce))
        {
            // A replay of a staged token: the statement-by-statement path moves the staged
            // tokens and tells each report's outcome.
            return Ok(None);
        }
        let stage = spread_over_fetches(reports);
        let conn = self.connection().await?;
        let conn = self.conn.insert(conn);
        let rows = parts
            .bind(if stage { STAGE } else { APPEND })
            .fetch_all(&mut **conn)
            .await;
        match rows {
            // `COMMIT` ran.
            Ok(rows) => {
                if stage && let Some(staged) = &mut self.staged {
                    let nonces = staged.entry(id).or_default();
                    nonces.extend(reports.iter().map(|r| r.nonce.clone()));
                }
                appended(&rows).map(Some)
            }
            Err(e) => {
                // The script stopped inside its transaction (or at `COMMIT`, which may have
                // ended it): roll back whatever is open.
                let rolled_back = sqlx::query("ROLLBACK").execute(&mut **conn).await.is_ok();
                let declined = matches!(&e, sqlx::Error::Database(d)
                    if matches!(d.kind(), ErrorKind::UniqueViolation | ErrorKind::NotNullViolation));
                if declined && rolled_back {
                    Ok(None)
                } else {
                    // It may have committed: which tokens are staged is not known.
                    self.broken = true;
                    self.staged = None;
                    Err(e.into())
                }
            }
        }
    }
}

/// Whether the tokens of `reports` answer more fetches than `reports.len()` over
/// [`REPLAY_ROWS_PER_PAGE`], so that inserting them into the replay set would write a leaf
/// page per fetch rather than per page's worth of tokens. A fetch is told by its nonces'
/// first 48 bits (the issue millisecond, [`crate::tokens::TaskClaims::fresh_nonces`]): all
/// of one fetch's share them, and fetches of one millisecond are neighbours in the key anyway.
fn spread_over_fetches(reports: &[&NewReport]) -> bool {
    let mut fetches: Vec<&str> = reports
        .iter()
        .map(|r| r.nonce.get(..12).unwrap_or(&r.nonce))
        .collect();
    fetches.sort_unstable();
    fetches.dedup();
    fetches.len() * REPLAY_ROWS_PER_PAGE > reports.len()
}

/// SQLite only, after the shared migrations: the replay set (`report_tokens`) and the round
/// counts as `WITHOUT ROWID` tables, rebuilt once in a transaction of their own where a
/// migration made them rowid tables (PostgreSQL has no such clause, so the shared migrations
/// cannot say it). A rowid table keeps its primary key as a second B-tree beside the rows: a
/// report cost two B-tree inserts and a group commit two more pages in the WAL. Measured with
/// `loadgen --mode batch` on SQLite: 12% more reports per second, 15% less of SQLite's CPU per
/// report (`benchmarks/results/profile-ingest.md`).
///
/// The new table is the stored definition (`sqlite_master`) with `WITHOUT ROWID` appended, so
/// whatever columns later migrations give these tables are copied as they are; their indexes
/// and triggers are created again after the copy. Errors: the database's (a table without a
/// primary key, say), `Corrupt` for a stored definition with no column list; the table stays as
/// it was.
async fn sqlite_without_rowid(pool: &AnyPool) -> Result<(), StorageError> {
    let mut conn = pool.acquire().await?;
    for table in ["report_tokens", "round_counts"] {
        let sql: String =
            sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = $1")
                .bind(table)
                .fetch_one(&mut *conn)
                .await?;
        if sql.to_ascii_uppercase().contains("WITHOUT ROWID") {
            continue;
        }
        // From the column list on: what follows `CREATE TABLE name`, however it was quoted.
        let body = sql.find('(').map(|i| &sql[i..]).ok_or_else(|| {
            StorageError::Corrupt(format!("SQLite table {table} is stored as `{sql}`"))
        })?;
        // DROP TABLE drops them; automatic indexes (the key's) have no text.
        let dependents: Vec<String> = sqlx::query_scalar(
            "SELECT sql FROM sqlite_master WHERE tbl_name = $1 AND type IN ('index', 'trigger') \
             AND sql IS NOT NULL",
        )
        .bind(table)
        .fetch_all(&mut *conn)
        .await?;
        let mut rebuild = format!(
            "BEGIN IMMEDIATE; CREATE TABLE {table}_rebuilt {body} WITHOUT ROWID; \
             INSERT INTO {table}_rebuilt SELECT * FROM {table}; \
             DROP TABLE {table}; ALTER TABLE {table}_rebuilt RENAME TO {table}; "
        );
        for d in dependents {
            rebuild.push_str(&d);
            rebuild.push_str("; ");
        }
        rebuild.push_str("COMMIT");
        if let Err(e) = conn.execute(rebuild.as_str()).await {
            let _ = conn.execute("ROLLBACK").await;
            return Err(e.into());
        }
        tracing::info!(table, "SQLite table rebuilt as WITHOUT ROWID");
    }
    Ok(())
}

/// [`Writer::append_group`]'s call on PostgreSQL: [`POSTGRES_APPEND_FUNCTION`] with the
/// group's parts (`$1`…`$6`, [`GroupParts`]), the ingest lock's key, the collection lock's
/// key and whether to take it.
const POSTGRES_APPEND: &str = "SELECT o_round, o_accepted FROM pg_temp.ldpsyn_append_group($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// The function behind [`Writer::append_group`] on PostgreSQL, created on every connection
/// (in its temporary schema, so processes of different versions never share one; no
/// migration). A call in a transaction of its own is the group's whole commit in one round
/// trip (each round trip is a wake-up of the backend and of the committer).
///
/// It takes the shared ingest lock of [`Transaction::ingest_gate`]'s barrier, then, for a
/// collection with a target, the collection's lock, as the statement-by-statement path takes
/// them. Each statement after them reads a snapshot taken after the locks (a volatile
/// function under `READ COMMITTED`), so it sees what a finalize or another process committed
/// before them; one statement with the locks inside would read a snapshot from before its
/// wait. If the collection is stored, not finalized, and its total is within `p_room`, it
/// writes the tokens, the group row, the count delta and the round counts, and returns the
/// new round counts and, as round -1, the total; else no row and nothing written. A replayed
/// token fails the call (unique violation), which rolls the transaction back.
const POSTGRES_APPEND_FUNCTION: &str = r#"
CREATE FUNCTION pg_temp.ldpsyn_append_group(
    p_id TEXT, p_tokens TEXT, p_group TEXT, p_delta TEXT, p_rounds TEXT, p_room BIGINT,
    p_ingest_key BIGINT, p_collection_key BIGINT, p_lock_collection BOOLEAN)
RETURNS TABLE (o_round BIGINT, o_accepted BIGINT)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_total BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_ingest_key);
    IF p_lock_collection THEN
        PERFORM pg_advisory_xact_lock(p_collection_key);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM collections
                   WHERE id = p_id AND (state::json ->> 'phase') IS DISTINCT FROM 'finalized') THEN
        RETURN;
    END IF;
    SELECT CAST(COALESCE(SUM(accepted), 0) AS BIGINT) INTO v_total
        FROM round_counts WHERE collection_id = p_id;
    IF v_total > p_room THEN
        RETURN;
    END IF;
    INSERT INTO report_tokens (collection_id, token_nonce, report_id)
        SELECT p_id, substr(e, 38), substr(e, 1, 36)
        FROM json_array_elements_text(p_tokens::json) AS e;
    INSERT INTO report_groups (collection_id, reports) VALUES (p_id, p_group);
    INSERT INTO count_deltas (collection_id, delta) VALUES (p_id, p_delta);
    RETURN QUERY
        INSERT INTO round_counts AS c (collection_id, round, accepted)
        SELECT p_id, (e ->> 0)::bigint, (e ->> 1)::bigint
        FROM json_array_elements(p_rounds::json) AS e
        ON CONFLICT (collection_id, round) DO UPDATE SET accepted = c.accepted + excluded.accepted
        RETURNING CAST(c.round AS BIGINT), CAST(c.accepted AS BIGINT);
    RETURN QUERY SELECT CAST(-1 AS BIGINT), v_total + (SELECT CAST(SUM((e ->> 1)::bigint) AS BIGINT)
        FROM json_array_elements(p_rounds::json) AS e);
END
$fn$"#;

/// What [`Writer::append_group`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The new accepted count of each task round of the group.
    pub rounds: BTreeMap<u32, u64>,
    /// The collection's accepted reports, all rounds, with the group's.
    pub total: u64,
}

/// A group's parts as [`Writer::append_group`] binds them.
struct GroupParts {
    /// `$1`: the collection id.
    id: String,
    /// `$2`: the tokens ([`tokens_json`]).
    tokens: String,
    /// `$3`: the group row ([`group_text`]).
    group: String,
    /// `$4`: the count delta ([`delta_text`]).
    delta: String,
    /// `$5`: `[[round, accepted],…]`.
    rounds: String,
    /// `$6`: the largest total of the collection's stored reports that the group may be
    /// added to (`target_users` less the group's size), `i64::MAX` without a target.
    room: i64,
}

impl GroupParts {
    /// `sql` with the parts bound as `$1`…`$6`.
    fn bind<'q>(
        &'q self,
        sql: &'q str,
    ) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
        sqlx::query(sql)
            .bind(&self.id)
            .bind(&self.tokens)
            .bind(&self.group)
            .bind(&self.delta)
            .bind(&self.rounds)
            .bind(self.room)
    }
}

/// [`Appended`] from `(round, accepted)` rows: the round-count upsert's, then the total as
/// round -1. Errors: a value out of range, no total.
fn appended(rows: &[sqlx::any::AnyRow]) -> Result<Appended, StorageError> {
    let mut rounds = BTreeMap::new();
    let mut total = None;
    for row in rows {
        let (round, count): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        let bad = || StorageError::Corrupt(format!("round count {round}: {count}"));
        let count = u64::try_from(count).map_err(|_| bad())?;
        if round == -1 {
            total = Some(count);
        } else {
            rounds.insert(u32::try_from(round).map_err(|_| bad())?, count);
        }
    }
    let total = total.ok_or_else(|| StorageError::Corrupt("no total after a group".into()))?;
    Ok(Appended { rounds, total })
}

/// What the ingest barrier found for a collection ([`Transaction::ingest_gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestGate {
    /// Stored and open: its reports may be inserted.
    Open,
    /// Finalized: its reports are refused `collection-finalized`.
    Finalized,
    /// No longer stored (deleted): its reports are refused `unknown-collection`.
    Gone,
}

/// What [`Datastore::store_party_model`] or [`Datastore::store_party_sketch`] did with a
/// party's one-time upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartyUploadStore {
    /// Stored: the party had none.
    Stored,
    /// The same upload was stored before (an identical resend).
    Identical,
    /// Another upload of the party is stored; nothing changed.
    Different,
    /// Another party's stored sketch report was made under another sketch key: the two
    /// could never be merged; nothing changed.
    OtherKey,
    /// The collection is finalized (PostgreSQL: by any process); nothing changed.
    Finalized,
    /// The collection is no longer stored.
    Gone,
}

/// A table of parties' one-time uploads (JSON in `column`, one row per collection and party).
#[derive(Debug, Clone, Copy)]
struct PartyUploadKind {
    table: &'static str,
    column: &'static str,
}

/// Local models (`fo+locmrf`, `sampled+locmrf`, `sketch+locmrf`).
const PARTY_MODELS: PartyUploadKind = PartyUploadKind {
    table: "party_models",
    column: "model",
};

/// Sketch reports (`sketch+locmrf`).
const PARTY_SKETCHES: PartyUploadKind = PartyUploadKind {
    table: "party_sketches",
    column: "report",
};

/// The tables that hold rows of a collection, keyed by `collection_id` (`collections` itself,
/// keyed by `id`, is deleted last). A table added by a migration that stores per-collection
/// rows belongs here, or [`Transaction::delete_collection`] leaves them behind (test
/// `delete_leaves_nothing` in `aggregator/tests/collection_lifecycle.rs`).
const COLLECTION_TABLES: &[&str] = &[
    "report_tokens",
    "report_tokens_staged",
    "report_groups",
    "vertical_records",
    "party_models",
    "party_sketches",
    "table_counts",
    "table_counts_ready",
    "count_deltas",
    "round_counts",
];

/// A stored collection row.
#[derive(Debug, Clone)]
pub struct CollectionRow {
    /// Id.
    pub id: Uuid,
    /// Public config, JSON.
    pub config: String,
    /// Engine state, JSON.
    pub state: String,
    /// Version of the state.
    pub state_version: i64,
}

/// A collection as stored, read in one consistent view ([`Datastore::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its state.
    pub state: CollectionState,
    /// The state's version.
    pub version: i64,
    /// Its sufficient statistics (every process's reports).
    pub tables: Tables,
    /// Accepted reports per round.
    pub round_counts: BTreeMap<u32, u64>,
}

/// A report to insert (already validated).
#[derive(Debug, Clone)]
pub struct NewReport {
    /// Collection.
    pub collection: Uuid,
    /// Report id (from the device).
    pub report_id: Uuid,
    /// Token nonce, hex.
    pub nonce: String,
    /// The round (SamPrivSyn: batch) of the report's task; counts toward that round's quota.
    pub task_round: u32,
    /// The table the report counts in.
    pub key: TableKey,
    /// The payload.
    pub payload: Payload,
}

/// The wire name of a mechanism.
pub fn mechanism_name(m: MechanismKind) -> &'static str {
    match m {
        MechanismKind::Grr => "grr",
        MechanismKind::Oue => "oue",
        MechanismKind::GrrPair => "grr_pair",
    }
}

fn parse_mechanism(s: &str) -> Result<MechanismKind, StorageError> {
    match s {
        "grr" => Ok(MechanismKind::Grr),
        "oue" => Ok(MechanismKind::Oue),
        "grr_pair" => Ok(MechanismKind::GrrPair),
        _ => Err(StorageError::Corrupt(format!("stored mechanism `{s}`"))),
    }
}

fn factor_text(f: &[usize]) -> String {
    let v: Vec<String> = f.iter().map(|a| a.to_string()).collect();
    v.join(",")
}

/// The stored form of a table key's bin maps: `''` when none is binned, else JSON.
fn bins_text(bins: &[Vec<u32>]) -> Result<String, StorageError> {
    if bins.is_empty() {
        Ok(String::new())
    } else {
        Ok(serde_json::to_string(bins)?)
    }
}

fn parse_bins(s: &str) -> Result<Vec<Vec<u32>>, StorageError> {
    if s.is_empty() {
        Ok(Vec::new())
    } else {
        serde_json::from_str(s).map_err(|_| StorageError::Corrupt(format!("stored bins `{s}`")))
    }
}

fn parse_factor(s: &str) -> Result<Vec<usize>, StorageError> {
    s.split(',')
        .map(|a| {
            a.parse()
                .map_err(|_| StorageError::Corrupt(format!("stored factor `{s}`")))
        })
        .collect()
}

/// The tokens of `reports` as the JSON text the replay-set insert binds: `["report-id nonce",
/// …]`, one flat string each, which the database cuts at fixed places (`substr(e, 1, 36)` the
/// id, `substr(e, 38)` the nonce) instead of parsing a nested array per report or searching
/// for the space (`instr` was 1.3% of a batch load's samples). Ids are hyphenated UUIDs, 36
/// characters; nonces are hex: nothing needs escaping.
fn tokens_json<'a>(reports: impl ExactSizeIterator<Item = &'a NewReport>) -> String {
    let mut s = String::with_capacity(2 + reports.len() * 73);
    s.push('[');
    let mut id = Uuid::encode_buffer();
    for (i, r) in reports.enumerate() {
        s.push_str(if i == 0 { "\"" } else { ",\"" });
        s.push_str(r.report_id.hyphenated().encode_lower(&mut id));
        s.push(' ');
        s.push_str(&r.nonce);
        s.push('"');
    }
    s.push(']');
    s
}

/// Appends report `r` to a `report_groups` row: `[round,"factor","mechanism",bins,payload]`,
/// the same text the migration builds from an old row (bins `[]` when none is binned).
fn push_group_entry(s: &mut String, r: &NewReport) -> Result<(), StorageError> {
    use std::fmt::Write as _;
    let _ = write!(s, "[{},\"", r.key.round);
    for (i, a) in r.key.factor.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{a}");
    }
    s.push_str("\",\"");
    s.push_str(mechanism_name(r.key.mechanism));
    s.push_str("\",");
    if r.key.bins.is_empty() {
        s.push_str("[]");
    } else {
        s.push_str(&serde_json::to_string(&r.key.bins)?);
    }
    s.push(',');
    s.push_str(&serde_json::to_string(&r.payload)?);
    s.push(']');
    Ok(())
}

/// `delta`'s nonzero cells as one `count_deltas` row: `[[round,"factor","mechanism",bins,n,
/// [cell,count,…]],…]`, bins `[]` when none is binned (as in [`push_group_entry`]).
fn delta_text(delta: &Tables) -> Result<String, StorageError> {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(2 + delta.len() * 48);
    s.push('[');
    for (t, (key, stats)) in delta.iter().enumerate() {
        if t > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "[{},\"{}\",\"{}\",",
            key.round,
            factor_text(&key.factor),
            mechanism_name(key.mechanism)
        );
        if key.bins.is_empty() {
            s.push_str("[]");
        } else {
            s.push_str(&serde_json::to_string(&key.bins)?);
        }
        let _ = write!(s, ",{},[", stats.n);
        let mut first = true;
        for (c, &v) in stats.counts.iter().enumerate() {
            if v > 0 {
                let _ = write!(s, "{}{c},{v}", if first { "" } else { "," });
                first = false;
            }
        }
        s.push_str("]]");
    }
    s.push(']');
    Ok(s)
}

/// `tables`' statistics of `key`, added empty (shaped by `engine`'s mechanism) if missing.
/// Errors: a key the engine has no mechanism for.
fn table_of<'t>(
    tables: &'t mut Tables,
    engine: &Engine,
    key: TableKey,
) -> Result<&'t mut SufficientStatistics, StorageError> {
    Ok(match tables.entry(key) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => {
            let m = engine.mechanism(e.key())?;
            e.insert(SufficientStatistics::new(&m))
        }
    })
}

/// Adds one `count_deltas` row ([`delta_text`]) to `tables`. Errors:
/// [`StorageError::Corrupt`] for text that does not parse or a cell outside its table.
fn add_delta_text(tables: &mut Tables, engine: &Engine, text: &str) -> Result<(), StorageError> {
    /// One table of a delta: round, factor, mechanism, bins, n, (cell, count) pairs.
    type Entry<'a> = (u32, &'a str, &'a str, Vec<Vec<u32>>, u64, Vec<u64>);
    let entries: Vec<Entry<'_>> = serde_json::from_str(text)
        .map_err(|e| StorageError::Corrupt(format!("stored count delta: {e}")))?;
    for (round, factor, mechanism, bins, n, cells) in entries {
        let key = TableKey {
            round,
            factor: parse_factor(factor)?,
            mechanism: parse_mechanism(mechanism)?,
            bins,
        };
        let stats = table_of(tables, engine, key)?;
        stats.n += n;
        let bad = || StorageError::Corrupt("stored count delta out of shape".into());
        if cells.len() % 2 != 0 {
            return Err(bad());
        }
        for pair in cells.chunks_exact(2) {
            let cell = usize::try_from(pair[0]).map_err(|_| bad())?;
            *stats.counts.get_mut(cell).ok_or_else(bad)? += pair[1];
        }
    }
    Ok(())
}

/// The `report_groups` text of `reports`: `[entry,…]` ([`push_group_entry`]).
fn group_text<'a>(reports: impl Iterator<Item = &'a NewReport>) -> Result<String, StorageError> {
    let mut group = String::with_capacity(256);
    group.push('[');
    for r in reports {
        if group.len() > 1 {
            group.push(',');
        }
        push_group_entry(&mut group, r)?;
    }
    group.push(']');
    Ok(group)
}

/// Rows per multi-row INSERT are powers of two up to this, so only a few distinct statements
/// are prepared (and cached) whatever the batch size.
const MAX_ROWS_PER_INSERT: usize = 512;

impl Datastore {
    /// Runs `f` in a transaction on a connection of the pool, janus-style: committed when
    /// `f` returns `Ok`, rolled back when it returns `Err` (or when the future is dropped).
    /// `f` returns a boxed future so that it may borrow the transaction:
    /// `store.run_tx(|tx| Box::pin(async move { tx.round_counts(id).await }))`.
    ///
    /// Not retried: no transaction here can fail to serialize. SQLite waits for its one
    /// writer (`busy_timeout`, 30 s); PostgreSQL runs at READ COMMITTED, where conflicting
    /// writers wait on row and advisory locks instead of failing (the one REPEATABLE READ
    /// transaction, [`Datastore::snapshot`], only reads). Errors: `f`'s, the database's.
    pub async fn run_tx<'s, T, E, F>(&'s self, f: F) -> Result<T, E>
    where
        F: for<'a> FnOnce(&'a mut Transaction<'s>) -> TxFuture<'a, T, E>,
        E: From<StorageError>,
    {
        let inner = self.pool.begin().await.map_err(StorageError::from)?;
        let mut tx = Transaction {
            inner,
            backend: self.backend,
        };
        let r = f(&mut tx).await;
        tx.finish(r).await.0
    }

    /// Connects to `url` (`sqlite://path` — the file is created if missing — or
    /// `postgres://…`) and runs the migrations.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StorageError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(StorageError::UnsupportedUrl(
                url.split(':').next().unwrap_or("").to_owned(),
            ));
        };
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_owned(),
        };
        let options = AnyConnectOptions::from_str(&url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(match backend {
                // At least 2: the committer keeps one for itself (ingest.rs `Writer`).
                Backend::Sqlite => max_connections.clamp(2, 4),
                Backend::Postgres => max_connections.max(2),
            })
            // While the database is down, a waiting acquire retries its connect with a
            // backoff that doubles up to a fifth of this timeout: 10 s keeps the wait after
            // the database is back under 2 s (6 s at 30 s), and answers a request 503
            // `unavailable` after 10 s of outage rather than holding it.
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // WAL: readers never block the committer. synchronous = FULL: a
                        // commit is on disk before the request is answered (durable ack).
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = FULL").await?;
                        conn.execute("PRAGMA busy_timeout = 30000").await?;
                        // A 2 MiB page cache (SQLite's default, set so that a build's
                        // other default does not apply): every commit ends with a walk over
                        // the cached pages (`pcache1TruncateUnsafe`), 3% of a single-report
                        // load's samples at 16 MiB, and a group commit touches few pages
                        // (nonces insert in time order; counts are appended as deltas).
                        conn.execute("PRAGMA cache_size = -2048").await?;
                        // Statement journals in memory: a statement that may fail halfway
                        // (the replay set's insert, an upsert) keeps the pages it changes,
                        // to undo itself, in a temporary file by default, which cost every
                        // group commit an open and `pwrite`s (9% of a single-report load's
                        // CPU). They undo one statement and need no durability.
                        conn.execute("PRAGMA temp_store = MEMORY").await?;
                    } else {
                        // A commit is on disk before the request is answered, whatever the
                        // server's or role's default (`off` would lose acknowledged reports
                        // in a crash).
                        conn.execute("SET synchronous_commit = on").await?;
                        conn.execute(POSTGRES_APPEND_FUNCTION).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        if backend == Backend::Sqlite {
            sqlite_without_rowid(&pool).await?;
        }
        Ok(Self { pool, backend })
    }

    /// The task-token key stored in the database; if there is none yet, `generated` (a new
    /// random 32-byte key) is stored and returned (race-free across processes:
    /// insert-if-absent, then re-read). Errors: the database's, or a stored key that is not
    /// hex.
    pub async fn token_key(&self, generated: &[u8]) -> Result<Vec<u8>, StorageError> {
        let hex = hex(generated);
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ('token_key', $1) ON CONFLICT DO NOTHING",
        )
        .bind(hex)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM settings WHERE name = 'token_key'")
            .fetch_one(&self.pool)
            .await?;
        let stored: String = row.try_get(0)?;
        unhex(&stored).ok_or_else(|| StorageError::Corrupt("stored token key is not hex".into()))
    }

    /// Inserts a new collection (its table counts complete: it has no reports).
    pub async fn insert_collection(
        &self,
        row: &CollectionRow,
        now: i64,
    ) -> Result<(), StorageError> {
        self.run_tx(|tx| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO collections (id, config, state, state_version, created_at) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(row.id.to_string())
                .bind(row.config.clone())
                .bind(row.state.clone())
                .bind(row.state_version)
                .bind(now)
                .execute(&mut *tx.inner)
                .await?;
                tx.mark_counts_ready(row.id).await
            })
        })
        .await
    }

    /// Every collection whose id parses, oldest first (a row whose id does not is logged and
    /// skipped).
    pub async fn collections(&self) -> Result<Vec<CollectionRow>, StorageError> {
        let rows = sqlx::query(
            "SELECT id, config, state, state_version FROM collections ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        // A row whose id does not parse cannot be asked for; it must not hide the others.
        Ok(rows
            .iter()
            .filter_map(|r| {
                collection_row(r)
                    .inspect_err(|e| tracing::error!(error = %e, "skipping a collection row"))
                    .ok()
            })
            .collect())
    }

    /// One collection's row, if stored.
    pub async fn collection(&self, id: Uuid) -> Result<Option<CollectionRow>, StorageError> {
        let row =
            sqlx::query("SELECT id, config, state, state_version FROM collections WHERE id = $1")
                .bind(id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        row.as_ref().map(collection_row).transpose()
    }

    /// Finalized collections whose raw reports are still stored: id, config JSON and
    /// finalize time (Unix seconds), for the retention sweep.
    pub async fn finalized_with_reports(&self) -> Result<Vec<(Uuid, String, i64)>, StorageError> {
        let rows = sqlx::query(
            "SELECT id, config, finalized_at FROM collections \
             WHERE finalized_at IS NOT NULL AND reports_deleted_at IS NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.try_get(0)?;
            let Ok(id) = id.parse() else {
                continue;
            };
            out.push((id, r.try_get(1)?, r.try_get(2)?));
        }
        Ok(out)
    }

    /// Deletes collection `id`'s raw reports and vertical records, keeping its tables, round
    /// counts, state and config, if it was finalized at or before `cutoff` (Unix seconds),
    /// its reports are not deleted yet and its table counts are complete (they, not the
    /// reports, rebuild the model at startup); marks it with `now`. One transaction; a
    /// second process doing the same finds it marked. Returns the rows deleted, or `None`
    /// when it did nothing. Errors: the database's.
    pub async fn delete_raw_reports(
        &self,
        id: Uuid,
        cutoff: i64,
        now: i64,
    ) -> Result<Option<u64>, StorageError> {
        self.run_tx(|tx| {
            Box::pin(async move {
                let marked = sqlx::query(
                    "UPDATE collections SET reports_deleted_at = $1 WHERE id = $2 \
                     AND finalized_at IS NOT NULL AND finalized_at <= $3 \
                     AND reports_deleted_at IS NULL \
                     AND EXISTS (SELECT 1 FROM table_counts_ready WHERE collection_id = $2)",
                )
                .bind(now)
                .bind(id.to_string())
                .bind(cutoff)
                .execute(&mut *tx.inner)
                .await?;
                if marked.rows_affected() == 0 {
                    return Ok(None);
                }
                // Staged tokens ([`Writer`]) are counted and deleted where they are moved to.
                tx.merge_staged().await?;
                let mut deleted = 0;
                for table in ["report_tokens", "report_groups", "vertical_records"] {
                    // The table names are the constants above, never input.
                    let done =
                        sqlx::query(&format!("DELETE FROM {table} WHERE collection_id = $1"))
                            .bind(id.to_string())
                            .execute(&mut *tx.inner)
                            .await?;
                    // A report is one row of report_tokens (its group row holds many).
                    if table != "report_groups" {
                        deleted += done.rows_affected();
                    }
                }
                Ok(Some(deleted))
            })
        })
        .await
    }

    /// For a collection stored before table counts existed: rebuilds them from its reports
    /// in one transaction behind the ingest barrier (no report commits meanwhile), marks them
    /// complete, and returns the tables. A no-op read when they already are.
    pub async fn rebuild_table_counts(
        &self,
        engine: &Engine,
        id: Uuid,
    ) -> Result<Tables, StorageError> {
        // Complete counts (the usual case) are read without stopping anyone's ingest.
        let ready = self
            .run_tx(|tx| {
                Box::pin(async move {
                    if tx.counts_ready(id).await? {
                        tx.load_table_counts(engine, id).await.map(Some)
                    } else {
                        Ok(None)
                    }
                })
            })
            .await?;
        if let Some(tables) = ready {
            return Ok(tables);
        }
        self.run_tx(|tx| {
            Box::pin(async move {
                tx.lock_ingest_exclusive(id).await?;
                if tx.counts_ready(id).await? {
                    // Another process rebuilt them meanwhile.
                    return tx.load_table_counts(engine, id).await;
                }
                let tables = tx.scan_reports(engine, id).await?;
                for table in ["table_counts", "count_deltas"] {
                    // Constant names, never input.
                    sqlx::query(&format!("DELETE FROM {table} WHERE collection_id = $1"))
                        .bind(id.to_string())
                        .execute(&mut *tx.inner)
                        .await?;
                }
                tx.add_table_counts(id, &tables).await?;
                tx.mark_counts_ready(id).await?;
                Ok(tables)
            })
        })
        .await
    }

    /// As [`Transaction::party_uploads`], in a transaction of its own.
    pub async fn party_uploads(&self, id: Uuid) -> Result<PartyUploads, StorageError> {
        self.run_tx(|tx| Box::pin(tx.party_uploads(id))).await
    }

    /// Stores party `party`'s local model of collection `id` in one transaction behind the
    /// ingest barrier ([`Transaction::ingest_gate`], then the collection's lock), unless one
    /// is stored: then it is compared. Errors: the database's.
    pub async fn store_party_model(
        &self,
        id: Uuid,
        party: &str,
        model: &LocalModel,
        now: i64,
    ) -> Result<PartyUploadStore, StorageError> {
        self.store_party_upload(id, party, PARTY_MODELS, model, now, |_| true)
            .await
    }

    /// As [`Datastore::store_party_model`] for party `party`'s sketch report;
    /// [`PartyUploadStore::OtherKey`] when another party's stored report has another key
    /// fingerprint. Errors: the database's.
    pub async fn store_party_sketch(
        &self,
        id: Uuid,
        party: &str,
        sketch: &SketchUpload,
        now: i64,
    ) -> Result<PartyUploadStore, StorageError> {
        self.store_party_upload(
            id,
            party,
            PARTY_SKETCHES,
            sketch,
            now,
            |other: &SketchUpload| {
                other.report.key_fingerprint() == sketch.report.key_fingerprint()
            },
        )
        .await
    }

    /// Stores `value` as party `party`'s one upload of kind `kind` in collection `id`, in one
    /// transaction behind the ingest barrier ([`Transaction::ingest_gate`], then the
    /// collection's lock), unless one is stored: then it is compared. `fits(other)` must
    /// hold for every other party's stored upload of the kind. Errors: the database's.
    async fn store_party_upload<T>(
        &self,
        id: Uuid,
        party: &str,
        kind: PartyUploadKind,
        value: &T,
        now: i64,
        fits: impl Fn(&T) -> bool + Send + Sync,
    ) -> Result<PartyUploadStore, StorageError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + Sync,
    {
        let fits = &fits;
        self.run_tx(|tx| {
            Box::pin(async move {
                match tx.ingest_gate(id).await? {
                    IngestGate::Gone => return Ok(PartyUploadStore::Gone),
                    IngestGate::Finalized => return Ok(PartyUploadStore::Finalized),
                    IngestGate::Open => {}
                }
                tx.lock_collection(id).await?;
                let stored = sqlx::query(&format!(
                    "SELECT party, {} FROM {} WHERE collection_id = $1",
                    kind.column, kind.table
                ))
                .bind(id.to_string())
                .fetch_all(&mut *tx.inner)
                .await?;
                for row in &stored {
                    let (who, json): (String, String) = (row.try_get(0)?, row.try_get(1)?);
                    let old: T = serde_json::from_str(&json)?;
                    if who == party {
                        return Ok(if old == *value {
                            PartyUploadStore::Identical
                        } else {
                            PartyUploadStore::Different
                        });
                    }
                    if !fits(&old) {
                        return Ok(PartyUploadStore::OtherKey);
                    }
                }
                sqlx::query(&format!(
                    "INSERT INTO {} (collection_id, party, {}, received_at) \
                     VALUES ($1, $2, $3, $4)",
                    kind.table, kind.column
                ))
                .bind(id.to_string())
                .bind(party.to_owned())
                .bind(serde_json::to_string(value)?)
                .bind(now)
                .execute(&mut *tx.inner)
                .await?;
                Ok(PartyUploadStore::Stored)
            })
        })
        .await
    }

    /// Number of stored reports of a collection, staged ones included. Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub async fn count_reports(&self, collection: Uuid) -> Result<u64, StorageError> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM report_tokens WHERE collection_id = $1) \
             + (SELECT CAST(COALESCE(SUM(reports), 0) AS BIGINT) FROM report_tokens_staged \
             WHERE collection_id = $1)",
        )
        .bind(collection.to_string())
        .fetch_one(&self.pool)
        .await?;
        let n: i64 = row.try_get(0)?;
        Ok(n as u64)
    }

    /// The first column of the first row of one raw SQL query, as text, on a connection of
    /// the pool. Tests only (feature `test-util`): e.g. a session setting.
    #[cfg(feature = "test-util")]
    pub async fn fetch_text(&self, sql: &str) -> Result<String, StorageError> {
        Ok(sqlx::query(sql).fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// As [`Transaction::round_counts`], in a transaction of its own.
    pub async fn round_counts(&self, id: Uuid) -> Result<Vec<(u32, u64)>, StorageError> {
        self.run_tx(|tx| Box::pin(tx.round_counts(id))).await
    }

    /// Accepted reports per round of every collection, in one query (the periodic refresh
    /// of a shared database). Errors: the database's, a stored id that is not a UUID.
    pub async fn all_round_counts(&self) -> Result<HashMap<Uuid, Vec<(u32, u64)>>, StorageError> {
        let rows = sqlx::query("SELECT collection_id, round, accepted FROM round_counts")
            .fetch_all(&self.pool)
            .await?;
        let mut out: HashMap<Uuid, Vec<(u32, u64)>> = HashMap::new();
        for r in &rows {
            let id: String = r.try_get(0)?;
            let id = Uuid::parse_str(&id)
                .map_err(|_| StorageError::Corrupt(format!("stored collection id `{id}`")))?;
            let round: i64 = r.try_get(1)?;
            let n: i64 = r.try_get(2)?;
            out.entry(id).or_default().push((round as u32, n as u64));
        }
        Ok(out)
    }

    /// Closes the pool (waits for its connections to be returned).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Whether several processes may share this database (PostgreSQL); `false` for SQLite
    /// (one process). What follows from it is decided outside storage, once at startup
    /// (`ingest::Authority`).
    pub fn is_shared(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// Collection `id` as stored, read in one repeatable-read transaction (one consistent
    /// view of every process's commits): its state and version, its tables and its round
    /// counts. Errors: the database's, [`StorageError::MissingCollection`], stored data that
    /// cannot be read.
    pub async fn snapshot(&self, engine: &Engine, id: Uuid) -> Result<Snapshot, StorageError> {
        self.run_tx(|tx| {
            Box::pin(async move {
                if tx.backend == Backend::Postgres {
                    // SQLite's transactions are serializable already.
                    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        .execute(&mut *tx.inner)
                        .await?;
                }
                let (state, version) = tx
                    .state(id)
                    .await?
                    .ok_or(StorageError::MissingCollection(id))?;
                Ok(Snapshot {
                    state,
                    version,
                    tables: tx.tables(engine, id).await?,
                    round_counts: tx.round_counts(id).await?.into_iter().collect(),
                })
            })
        })
        .await
    }

    /// As [`Transaction::tables`], in a transaction of its own.
    pub async fn tables(&self, engine: &Engine, id: Uuid) -> Result<Tables, StorageError> {
        self.run_tx(|tx| Box::pin(tx.tables(engine, id))).await
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StorageError> {
        let mut conn = self.pool.acquire().await?;
        conn.ping().await?;
        Ok(())
    }
}

impl Transaction<'_> {
    /// Collection `id`'s stored state and its version, parsed; `None` when it is not stored.
    pub async fn state(
        &mut self,
        id: Uuid,
    ) -> Result<Option<(CollectionState, i64)>, StorageError> {
        match self.state_json(id).await? {
            Some((json, version)) => Ok(Some((serde_json::from_str(&json)?, version))),
            None => Ok(None),
        }
    }

    /// One collection's state (JSON) and version.
    async fn state_json(&mut self, id: Uuid) -> Result<Option<(String, i64)>, StorageError> {
        let row = sqlx::query("SELECT state, state_version FROM collections WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(&mut *self.inner)
            .await?;
        Ok(match row {
            Some(r) => Some((r.try_get(0)?, r.try_get(1)?)),
            None => None,
        })
    }

    /// Stores a new state (version + 1) and returns its version.
    pub async fn update_state(
        &mut self,
        id: Uuid,
        state: &CollectionState,
    ) -> Result<i64, StorageError> {
        let state = serde_json::to_string(state)?;
        let row = sqlx::query(
            "UPDATE collections SET state = $1, state_version = state_version + 1 WHERE id = $2 \
             RETURNING state_version",
        )
        .bind(state)
        .bind(id.to_string())
        .fetch_one(&mut *self.inner)
        .await?;
        Ok(row.try_get(0)?)
    }

    /// Stores a new state (version + 1) only if the stored state is still version `base`;
    /// returns the new version, or `None` when the state changed since (or the collection is
    /// gone). A round close computed off the committer stores its result with this.
    pub async fn update_state_if(
        &mut self,
        id: Uuid,
        state: &CollectionState,
        base: i64,
    ) -> Result<Option<i64>, StorageError> {
        let state = serde_json::to_string(state)?;
        let row = sqlx::query(
            "UPDATE collections SET state = $1, state_version = state_version + 1 \
             WHERE id = $2 AND state_version = $3 RETURNING state_version",
        )
        .bind(state)
        .bind(id.to_string())
        .bind(base)
        .fetch_optional(&mut *self.inner)
        .await?;
        Ok(match row {
            Some(r) => Some(r.try_get(0)?),
            None => None,
        })
    }

    /// Accepted reports per round of a collection.
    pub async fn round_counts(&mut self, id: Uuid) -> Result<Vec<(u32, u64)>, StorageError> {
        let rows = sqlx::query("SELECT round, accepted FROM round_counts WHERE collection_id = $1")
            .bind(id.to_string())
            .fetch_all(&mut *self.inner)
            .await?;
        rows.iter()
            .map(|r| {
                let round: i64 = r.try_get(0)?;
                let n: i64 = r.try_get(1)?;
                Ok((round as u32, n as u64))
            })
            .collect()
    }

    /// Records when collection `id` was finalized (`now`, Unix seconds), in the finalize's
    /// transaction; the retention sweep counts from it.
    pub async fn set_finalized_at(&mut self, id: Uuid, now: i64) -> Result<(), StorageError> {
        sqlx::query("UPDATE collections SET finalized_at = $1 WHERE id = $2")
            .bind(now)
            .bind(id.to_string())
            .execute(&mut *self.inner)
            .await?;
        Ok(())
    }

    /// Accepted reports of a collection, all rounds (the sum of its round counts).
    pub async fn accepted_total(&mut self, id: Uuid) -> Result<u64, StorageError> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(accepted), 0) AS BIGINT) FROM round_counts WHERE collection_id = $1",
        )
        .bind(id.to_string())
        .fetch_one(&mut *self.inner)
        .await?;
        let n: i64 = row.try_get(0)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Adds `n` accepted reports to a round's count; returns the new count.
    pub async fn bump_round_count(
        &mut self,
        id: Uuid,
        round: u32,
        n: u64,
    ) -> Result<u64, StorageError> {
        let row = sqlx::query(
            "INSERT INTO round_counts (collection_id, round, accepted) VALUES ($1, $2, $3) \
             ON CONFLICT (collection_id, round) DO UPDATE SET accepted = round_counts.accepted + excluded.accepted \
             RETURNING accepted",
        )
        .bind(id.to_string())
        .bind(round as i64)
        .bind(n as i64)
        .fetch_one(&mut *self.inner)
        .await?;
        let total: i64 = row.try_get(0)?;
        Ok(total as u64)
    }

    /// Rebuilds a collection's sufficient statistics from its stored reports (its
    /// `report_groups` rows), validating each again with its mechanism: a full scan, where
    /// [`Transaction::tables`] reads the table counts.
    pub async fn scan_reports(
        &mut self,
        engine: &Engine,
        id: Uuid,
    ) -> Result<Tables, StorageError> {
        /// One report of a group row: round, factor, mechanism, bins, payload.
        type Entry<'a> = (u32, &'a str, &'a str, Vec<Vec<u32>>, Payload);
        let mut tables = Tables::new();
        let mut mechanisms = std::collections::BTreeMap::new();
        let mut rows = sqlx::query("SELECT reports FROM report_groups WHERE collection_id = $1")
            .bind(id.to_string())
            .fetch(&mut *self.inner);
        while let Some(row) = rows.try_next().await? {
            let text: String = row.try_get(0)?;
            let entries: Vec<Entry<'_>> = serde_json::from_str(&text)?;
            for (round, factor, mechanism, bins, payload) in entries {
                let key = TableKey {
                    round,
                    factor: parse_factor(factor)?,
                    mechanism: parse_mechanism(mechanism)?,
                    bins,
                };
                if !mechanisms.contains_key(&key) {
                    mechanisms.insert(key.clone(), engine.mechanism(&key)?);
                }
                let m = &mechanisms[&key];
                let stats = tables
                    .entry(key)
                    .or_insert_with(|| SufficientStatistics::new(m));
                m.accumulate(&payload, stats).map_err(|e| {
                    StorageError::Corrupt(format!("stored report does not validate: {e}"))
                })?;
            }
        }
        Ok(tables)
    }

    /// Appends `rows` value tuples of `cols` parameters each to a multi-row INSERT: anonymous
    /// `?` on SQLite (sqlx-sqlite looks every numbered parameter up by name, a linear scan,
    /// which made a 512-row insert quadratic), `$1…` on PostgreSQL.
    fn push_value_rows(&self, sql: &mut String, rows: usize, cols: usize) {
        for i in 0..rows {
            sql.push_str(if i == 0 { "(" } else { ",(" });
            for c in 0..cols {
                if c > 0 {
                    sql.push(',');
                }
                match self.backend {
                    Backend::Sqlite => sql.push('?'),
                    Backend::Postgres => sql.push_str(&format!("${}", i * cols + c + 1)),
                }
            }
            sql.push(')');
        }
    }

    /// Adds `delta` (one group's statistics of collection `id`) to its stored table counts,
    /// in the caller's transaction: an additive upsert per nonzero cell and per table's n.
    pub async fn add_table_counts(&mut self, id: Uuid, delta: &Tables) -> Result<(), StorageError> {
        let mut rows: Vec<(i64, String, &'static str, String, i64, i64)> = Vec::new();
        for (key, stats) in delta {
            let (factor, mech, bins) = (
                factor_text(&key.factor),
                mechanism_name(key.mechanism),
                bins_text(&key.bins)?,
            );
            rows.push((
                key.round as i64,
                factor.clone(),
                mech,
                bins.clone(),
                -1,
                stats.n as i64,
            ));
            for (c, &v) in stats.counts.iter().enumerate() {
                if v > 0 {
                    rows.push((
                        key.round as i64,
                        factor.clone(),
                        mech,
                        bins.clone(),
                        c as i64,
                        v as i64,
                    ));
                }
            }
        }
        for chunk in rows.chunks(MAX_ROWS_PER_INSERT) {
            let mut sql = String::from(
                "INSERT INTO table_counts (collection_id, round, factor, mechanism, bins, cell, total) VALUES ",
            );
            self.push_value_rows(&mut sql, chunk.len(), 7);
            sql.push_str(
                " ON CONFLICT (collection_id, round, factor, mechanism, bins, cell) \
                 DO UPDATE SET total = table_counts.total + excluded.total",
            );
            let mut q = sqlx::query(&sql);
            for (round, factor, mech, bins, cell, total) in chunk {
                q = q
                    .bind(id.to_string())
                    .bind(*round)
                    .bind(factor.clone())
                    .bind(*mech)
                    .bind(bins.clone())
                    .bind(*cell)
                    .bind(*total);
            }
            q.execute(&mut *self.inner).await?;
        }
        Ok(())
    }

    /// Records `delta` (one group commit's statistics of collection `id`) as one
    /// `count_deltas` row, in the caller's transaction; [`Transaction::fold_count_deltas`]
    /// later adds it to the table counts. Errors: the database's.
    pub async fn add_count_delta(&mut self, id: Uuid, delta: &Tables) -> Result<(), StorageError> {
        sqlx::query("INSERT INTO count_deltas (collection_id, delta) VALUES ($1, $2)")
            .bind(id.to_string())
            .bind(delta_text(delta)?)
            .execute(&mut *self.inner)
            .await?;
        Ok(())
    }

    /// Deletes collection `id`'s `count_deltas` rows (every process's) and adds their sum and
    /// `delta` to its table counts, in the caller's transaction. A row another process is
    /// folding at the same time is locked by its delete and skipped here once that commits,
    /// so each row is added once. Errors: the database's, a row that does not parse.
    pub async fn fold_count_deltas(
        &mut self,
        engine: &Engine,
        id: Uuid,
        delta: &Tables,
    ) -> Result<(), StorageError> {
        let mut rows =
            sqlx::query("DELETE FROM count_deltas WHERE collection_id = $1 RETURNING delta")
                .bind(id.to_string())
                .fetch(&mut *self.inner);
        let mut sum = delta.clone();
        while let Some(row) = rows.try_next().await? {
            add_delta_text(&mut sum, engine, &row.try_get::<String, _>(0)?)?;
        }
        drop(rows);
        self.add_table_counts(id, &sum).await
    }

    /// A collection's sufficient statistics: its table counts plus the group commits' deltas
    /// not folded into them yet, when they are complete (O(tables × cells) rows), else
    /// rebuilt from its reports ([`Transaction::scan_reports`]).
    pub async fn tables(&mut self, engine: &Engine, id: Uuid) -> Result<Tables, StorageError> {
        if self.counts_ready(id).await? {
            self.load_table_counts(engine, id).await
        } else {
            self.scan_reports(engine, id).await
        }
    }

    async fn counts_ready(&mut self, id: Uuid) -> Result<bool, StorageError> {
        Ok(
            sqlx::query("SELECT 1 FROM table_counts_ready WHERE collection_id = $1")
                .bind(id.to_string())
                .fetch_optional(&mut *self.inner)
                .await?
                .is_some(),
        )
    }

    /// Marks collection `id`'s table counts complete (a new collection, or after
    /// [`Datastore::rebuild_table_counts`]).
    async fn mark_counts_ready(&mut self, id: Uuid) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO table_counts_ready (collection_id) VALUES ($1) ON CONFLICT DO NOTHING",
        )
        .bind(id.to_string())
        .execute(&mut *self.inner)
        .await?;
        Ok(())
    }

    async fn load_table_counts(
        &mut self,
        engine: &Engine,
        id: Uuid,
    ) -> Result<Tables, StorageError> {
        let mut tables = Tables::new();
        // One statement, so one snapshot on PostgreSQL too: a fold committed between two reads
        // would count its rows twice or not at all.
        let mut rows = sqlx::query(
            "SELECT round, factor, mechanism, bins, cell, total, '' FROM table_counts \
             WHERE collection_id = $1 \
             UNION ALL SELECT 0, '', '', '', 0, 0, delta FROM count_deltas WHERE collection_id = $1",
        )
        .bind(id.to_string())
        .fetch(&mut *self.inner);
        while let Some(row) = rows.try_next().await? {
            let delta: String = row.try_get(6)?;
            if !delta.is_empty() {
                add_delta_text(&mut tables, engine, &delta)?;
                continue;
            }
            let round: i64 = row.try_get(0)?;
            let key = TableKey {
                round: round as u32,
                factor: parse_factor(&row.try_get::<String, _>(1)?)?,
                mechanism: parse_mechanism(&row.try_get::<String, _>(2)?)?,
                bins: parse_bins(&row.try_get::<String, _>(3)?)?,
            };
            let (cell, total): (i64, i64) = (row.try_get(4)?, row.try_get(5)?);
            let stats = table_of(&mut tables, engine, key)?;
            let bad =
                || StorageError::Corrupt(format!("stored table count out of shape: cell {cell}"));
            // Added, not set: a delta read before this row may have counted in it already.
            let total = u64::try_from(total).map_err(|_| bad())?;
            if cell < 0 {
                stats.n += total;
            } else {
                *stats.counts.get_mut(cell as usize).ok_or_else(bad)? += total;
            }
        }
        Ok(tables)
    }

    /// SQLite: moves every staged token ([`Writer`]) into `report_tokens`, so that this
    /// transaction reads and writes the whole replay set there. PostgreSQL stages none.
    /// Errors: the database's.
    async fn merge_staged(&mut self) -> Result<(), StorageError> {
        if self.backend == Backend::Sqlite {
            (&mut *self.inner).execute(sqlite_merge_staged!()).await?;
        }
        Ok(())
    }

    /// Inserts `reports` (no two with the same collection and token nonce), skipping those
    /// whose token already answered a stored report. Returns, per report, whether it was
    /// inserted.
    ///
    /// Per collection of `reports`: one statement adds their tokens to the replay set
    /// (`report_tokens`, whose key is the backstop against a second answer to a token, across
    /// processes too), and one row of `report_groups` holds the inserted ones. Both statements
    /// bind the whole collection's share as one JSON text, so their SQL is constant (prepared
    /// once per connection) whatever the group's size. Errors: the database's.
    pub async fn insert_reports(
        &mut self,
        reports: &[&NewReport],
    ) -> Result<Vec<bool>, StorageError> {
        let mut inserted = vec![false; reports.len()];
        // Per collection, in order of first appearance: positions in `reports`.
        let mut slot: HashMap<Uuid, usize> = HashMap::new();
        let mut by_collection: Vec<(Uuid, Vec<usize>)> = Vec::new();
        for (k, r) in reports.iter().enumerate() {
            let s = *slot.entry(r.collection).or_insert_with(|| {
                by_collection.push((r.collection, Vec::new()));
                by_collection.len() - 1
            });
            by_collection[s].1.push(k);
        }
        for (id, ks) in by_collection {
            let share: Vec<&NewReport> = ks.iter().map(|&k| reports[k]).collect();
            let fresh = self.insert_tokens(id, &share).await?;
            let stored = share
                .iter()
                .zip(&fresh)
                .filter(|(_, f)| **f)
                .map(|(r, _)| *r);
            let group = group_text(stored)?;
            if group.len() > 2 {
                sqlx::query("INSERT INTO report_groups (collection_id, reports) VALUES ($1, $2)")
                    .bind(id.to_string())
                    .bind(group)
                    .execute(&mut *self.inner)
                    .await?;
            }
            for (&k, f) in ks.iter().zip(fresh) {
                inserted[k] = f;
            }
        }
        Ok(inserted)
    }

    /// Adds the tokens of `reports` (all of collection `id`, no nonce twice) to the replay set;
    /// returns, per report, whether its token was new (and is now stored).
    ///
    /// SQLite (one process, one writer): the staged tokens moved into `report_tokens` first,
    /// then a plain INSERT; a replayed token fails the statement with a unique violation,
    /// which undoes that statement only (the transaction goes on), and then the stored tokens
    /// among them are read and the others inserted. Replays are rare, so the usual group pays
    /// one statement and reads nothing back. PostgreSQL
    /// (several processes may insert the same token at once): one statement that inserts with
    /// `ON CONFLICT DO NOTHING` and returns only the tokens it did not insert. Errors: the
    /// database's.
    async fn insert_tokens(
        &mut self,
        id: Uuid,
        reports: &[&NewReport],
    ) -> Result<Vec<bool>, StorageError> {
        let tokens = tokens_json(reports.iter().copied());
        self.merge_staged().await?;
        match self.backend {
            Backend::Sqlite => {
                const INSERT: &str = sqlite_insert_tokens!();
                let first = sqlx::query(INSERT)
                    .bind(id.to_string())
                    .bind(tokens)
                    .execute(&mut *self.inner)
                    .await;
                match first {
                    Ok(_) => return Ok(vec![true; reports.len()]),
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
                    Err(e) => return Err(e.into()),
                }
                let nonces: Vec<&str> = reports.iter().map(|r| r.nonce.as_str()).collect();
                let rows = sqlx::query(
                    "SELECT token_nonce FROM report_tokens WHERE collection_id = $1 \
                     AND token_nonce IN (SELECT value FROM json_each($2))",
                )
                .bind(id.to_string())
                .bind(serde_json::to_string(&nonces)?)
                .fetch_all(&mut *self.inner)
                .await?;
                let stored: std::collections::HashSet<String> = rows
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<Result<_, _>>()?;
                let fresh: Vec<bool> = reports.iter().map(|r| !stored.contains(&r.nonce)).collect();
                let rest: Vec<&NewReport> = reports
                    .iter()
                    .zip(&fresh)
                    .filter(|(_, f)| **f)
                    .map(|(r, _)| *r)
                    .collect();
                if !rest.is_empty() {
                    // This process is SQLite's one writer: nothing stored them meanwhile.
                    sqlx::query(INSERT)
                        .bind(id.to_string())
                        .bind(tokens_json(rest.into_iter()))
                        .execute(&mut *self.inner)
                        .await?;
                }
                Ok(fresh)
            }
            Backend::Postgres => {
                let rows = sqlx::query(
                    "WITH input AS (SELECT substr(e, 38) AS nonce, \
                     substr(e, 1, 36) AS report_id \
                     FROM json_array_elements_text($2::json) AS e), \
                     ins AS (INSERT INTO report_tokens (collection_id, token_nonce, report_id) \
                     SELECT $1, nonce, report_id FROM input ON CONFLICT DO NOTHING \
                     RETURNING token_nonce) \
                     SELECT nonce FROM input EXCEPT SELECT token_nonce FROM ins",
                )
                .bind(id.to_string())
                .bind(tokens)
                .fetch_all(&mut *self.inner)
                .await?;
                if rows.is_empty() {
                    return Ok(vec![true; reports.len()]);
                }
                let refused: std::collections::HashSet<String> = rows
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<Result<_, _>>()?;
                Ok(reports
                    .iter()
                    .map(|r| !refused.contains(&r.nonce))
                    .collect())
            }
        }
    }

    /// The report id of the stored report that answered a token, if any (on SQLite after
    /// moving the staged tokens into `report_tokens`, see [`Writer`]).
    pub async fn report_of_token(
        &mut self,
        collection: Uuid,
        nonce: &str,
    ) -> Result<Option<Uuid>, StorageError> {
        self.merge_staged().await?;
        let row = sqlx::query(
            "SELECT report_id FROM report_tokens WHERE collection_id = $1 AND token_nonce = $2",
        )
        .bind(collection.to_string())
        .bind(nonce.to_owned())
        .fetch_optional(&mut *self.inner)
        .await?;
        match row {
            None => Ok(None),
            Some(r) => {
                let id: String = r.try_get(0)?;
                id.parse()
                    .map(Some)
                    .map_err(|_| StorageError::Corrupt(format!("stored report id `{id}`")))
            }
        }
    }

    /// The stored party rows of collection `id` for `record_ids`: `(party, record id,
    /// codes)` (vertical collections), in the caller's transaction.
    pub async fn vertical_rows(
        &mut self,
        id: Uuid,
        record_ids: &[&str],
    ) -> Result<Vec<(String, String, Vec<u32>)>, StorageError> {
        let mut out = Vec::new();
        for chunk in record_ids.chunks(MAX_ROWS_PER_INSERT) {
            let mut sql = String::from(
                "SELECT party, record_id, codes FROM vertical_records \
                 WHERE collection_id = $1 AND record_id IN (",
            );
            for i in 0..chunk.len() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("${}", i + 2));
            }
            sql.push(')');
            let mut q = sqlx::query(&sql).bind(id.to_string());
            for r in chunk {
                q = q.bind(r.to_string());
            }
            for row in q.fetch_all(&mut *self.inner).await? {
                let codes: String = row.try_get(2)?;
                out.push((
                    row.try_get(0)?,
                    row.try_get(1)?,
                    serde_json::from_str(&codes)?,
                ));
            }
        }
        Ok(out)
    }

    /// Stores party `party`'s `records` (record id, codes) of collection `id` in the
    /// caller's transaction; the caller has checked that none is stored yet.
    pub async fn insert_vertical_records(
        &mut self,
        id: Uuid,
        party: &str,
        records: &[(&str, &[u32])],
        now: i64,
    ) -> Result<(), StorageError> {
        for chunk in records.chunks(MAX_ROWS_PER_INSERT) {
            let mut sql = String::from(
                "INSERT INTO vertical_records (collection_id, record_id, party, codes, received_at) VALUES ",
            );
            self.push_value_rows(&mut sql, chunk.len(), 5);
            let mut q = sqlx::query(&sql);
            for (record, codes) in chunk {
                q = q
                    .bind(id.to_string())
                    .bind(record.to_string())
                    .bind(party.to_owned())
                    .bind(serde_json::to_string(codes)?)
                    .bind(now);
            }
            q.execute(&mut *self.inner).await?;
        }
        Ok(())
    }

    /// What the parties of vertical collection `id` uploaded besides their records: their
    /// local models and sketch reports, each in party-name order, in the caller's
    /// transaction. Errors: the database's; a stored upload that cannot be read
    /// ([`StorageError::Json`]).
    pub async fn party_uploads(&mut self, id: Uuid) -> Result<PartyUploads, StorageError> {
        Ok(PartyUploads {
            models: self.party_upload_rows(id, PARTY_MODELS).await?,
            sketches: self.party_upload_rows(id, PARTY_SKETCHES).await?,
        })
    }

    async fn party_upload_rows<T: serde::de::DeserializeOwned>(
        &mut self,
        id: Uuid,
        kind: PartyUploadKind,
    ) -> Result<Vec<T>, StorageError> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM {} WHERE collection_id = $1 ORDER BY party",
            kind.column, kind.table
        ))
        .bind(id.to_string())
        .fetch_all(&mut *self.inner)
        .await?;
        rows.iter()
            .map(|row| {
                let json: String = row.try_get(0)?;
                Ok(serde_json::from_str(&json)?)
            })
            .collect()
    }

    /// Takes the transaction-scoped PostgreSQL advisory lock of a collection (round closing);
    /// a no-op on SQLite, which has one writer anyway.
    pub async fn lock_collection(&mut self, id: Uuid) -> Result<(), StorageError> {
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(collection_key(id))
                .execute(&mut *self.inner)
                .await?;
        }
        Ok(())
    }

    /// The ingest side of the barrier of finalize and delete (PostgreSQL; always
    /// [`IngestGate::Open`] on SQLite, whose one process serializes ingest, finalize and
    /// delete in its committer): a shared transaction-level advisory lock on the
    /// collection's ingest key, then whether the database says the collection is finalized,
    /// or no longer stores it. [`Transaction::lock_ingest_exclusive`] (taken by finalize and delete
    /// before anything else) waits for every transaction holding it, and a transaction
    /// arriving after their commit reads the finalized state or finds no row: no report
    /// commits after finalize read its tables, or after delete removed them.
    pub async fn ingest_gate(&mut self, id: Uuid) -> Result<IngestGate, StorageError> {
        if self.backend != Backend::Postgres {
            return Ok(IngestGate::Open);
        }
        self.lock_ingest_shared(id).await?;
        let Some((json, _)) = self.state_json(id).await? else {
            return Ok(IngestGate::Gone);
        };
        // Only the phase: this runs in every group commit, and a state can hold thousands of
        // edges.
        #[derive(serde::Deserialize)]
        struct PhaseOnly {
            phase: ldpsyn_engine::Phase,
        }
        let state: PhaseOnly = serde_json::from_str(&json)?;
        Ok(if state.phase == ldpsyn_engine::Phase::Finalized {
            IngestGate::Finalized
        } else {
            IngestGate::Open
        })
    }

    /// The ingest side's shared advisory lock on collection `id`'s ingest key (PostgreSQL),
    /// held to the end of the transaction: [`Transaction::ingest_gate`]'s barrier.
    async fn lock_ingest_shared(&mut self, id: Uuid) -> Result<(), StorageError> {
        sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
            .bind(ingest_key(id))
            .execute(&mut *self.inner)
            .await?;
        Ok(())
    }

    /// Deletes every row of collection `id` (its reports, vertical records, table counts,
    /// round counts and finally its row with config and state) in the caller's transaction,
    /// which has taken [`Transaction::lock_ingest_exclusive`] and [`Transaction::lock_collection`]. Returns the
    /// number of reports and vertical records deleted, or `None` when no collection `id` was
    /// stored (nothing is deleted then). Errors: the database's.
    pub async fn delete_collection(&mut self, id: Uuid) -> Result<Option<u64>, StorageError> {
        if self.state_json(id).await?.is_none() {
            return Ok(None);
        }
        // Staged tokens are counted where they are moved to.
        self.merge_staged().await?;
        let mut reports = 0;
        for table in COLLECTION_TABLES {
            // The table names are the constants above, never input.
            let done = sqlx::query(&format!("DELETE FROM {table} WHERE collection_id = $1"))
                .bind(id.to_string())
                .execute(&mut *self.inner)
                .await?;
            // A report is one row of report_tokens (its group row holds many).
            if matches!(*table, "report_tokens" | "vertical_records") {
                reports += done.rows_affected();
            }
        }
        sqlx::query("DELETE FROM collections WHERE id = $1")
            .bind(id.to_string())
            .execute(&mut *self.inner)
            .await?;
        Ok(Some(reports))
    }

    /// Finalize's and delete's side of the barrier of [`Transaction::ingest_gate`]: the exclusive lock
    /// on the ingest key (PostgreSQL), taken before the collection lock so that no transaction
    /// waits for both in opposite orders.
    pub async fn lock_ingest_exclusive(&mut self, id: Uuid) -> Result<(), StorageError> {
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(ingest_key(id))
                .execute(&mut *self.inner)
                .await?;
        }
        Ok(())
    }

    /// Runs one raw SQL statement in this transaction; returns the rows it changed. Tests
    /// only (feature `test-util`): e.g. to put a database in the shape an earlier release
    /// left.
    #[cfg(feature = "test-util")]
    pub async fn execute_sql(&mut self, sql: &str) -> Result<u64, StorageError> {
        Ok(sqlx::query(sql)
            .execute(&mut *self.inner)
            .await?
            .rows_affected())
    }
}

fn collection_row(r: &sqlx::any::AnyRow) -> Result<CollectionRow, StorageError> {
    let id: String = r.try_get(0)?;
    Ok(CollectionRow {
        id: id
            .parse()
            .map_err(|_| StorageError::Corrupt(format!("stored collection id `{id}`")))?,
        config: r.try_get(1)?,
        state: r.try_get(2)?,
        state_version: r.try_get(3)?,
    })
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Decodes lowercase or uppercase hex.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The advisory-lock key of a collection ([`Transaction::lock_collection`]): the id's first
/// 8 bytes.
fn collection_key(id: Uuid) -> i64 {
    i64::from_be_bytes(id.as_bytes()[..8].try_into().unwrap_or([0; 8]))
}

/// The advisory-lock key of a collection's ingest barrier: the id's last 8 bytes, apart from
/// the collection lock's key (its first 8) by a fixed tag.
fn ingest_key(id: Uuid) -> i64 {
    i64::from_be_bytes(id.as_bytes()[8..].try_into().unwrap_or([0; 8])) ^ 0x1D6E_57B4_4E1E_0001
}
