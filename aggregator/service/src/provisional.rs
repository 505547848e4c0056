//! Provisional estimates while a collection collects: the model refitted from the tables
//! accumulated so far by the stages finalize runs ([`Engine::finalize_vertical`]:
//! the same measurements, model graph, fit and standard errors, so error bars shrink as
//! reports arrive), answered by `GET …/marginals?provisional=true` and
//! `GET …/model?provisional=true` before finalize.
//!
//! - **Off the ingest path.** A refit reads a snapshot (SQLite: the state and tables this
//!   process holds in memory, the truth there; PostgreSQL: state, tables and round counts in
//!   one repeatable-read transaction of a pool connection, every process's reports) and fits
//!   on the blocking pool. It never goes through the committer, writes nothing, and leaves the
//!   collection's state, tables and rounds as they were: finalize builds the same model with
//!   or without provisional refits before it.
//! - **Cached and bounded.** One refit at a time per collection: a request that finds one
//!   running waits for it and answers its model. The cached model is answered while it is
//!   younger than `--provisional-refresh-ms` (from when its fit finished), or whatever its
//!   age while it saw every report accepted so far under the same state (a refit would give
//!   the same model); otherwise the request refits. Nothing refits unless asked.
//! - **Privacy.** Post-processing of the same LDP reports: no privacy cost.
//!
//! [`Engine::finalize_vertical`]: ldpsyn_engine::Engine::finalize_vertical

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use ldpsyn::wire::ProblemType;
use ldpsyn_engine::{Model, PartyUploads, Phase};

use super::ingest::{CollectionHandle, build_model};
use super::ingest::{IngestError, Store};
use super::storage::Snapshot;

/// A model refitted from the reports accepted so far, with what it saw.
#[derive(Debug)]
pub struct ProvisionalModel {
    /// The model (the type finalize builds).
    pub model: Arc<Model>,
    /// Reports it was fitted from (a vertical collection: party records), as
    /// `reports_accepted` counts them.
    pub reports: u64,
    /// The stored version of the collection state it was fitted under.
    pub state_version: i64,
    /// When its fit finished, Unix seconds.
    pub fitted_at: i64,
    /// When its fit finished, for the refresh interval.
    finished: Instant,
}

/// One collection's provisional model and the lock its one refit holds.
#[derive(Debug, Default)]
pub struct ProvisionalCache {
    /// The last model; locked for the whole of a refit.
    slot: Arc<tokio::sync::Mutex<Option<Arc<ProvisionalModel>>>>,
    /// Refits started ([`ProvisionalCache::refits`]).
    refits: AtomicU64,
}

impl ProvisionalCache {
    /// How many refits this collection has started (answers from the cache add none).
    pub fn refits(&self) -> u64 {
        self.refits.load(Relaxed)
    }
}

/// Whether `m` may answer for collection `h` now: younger than `refresh`, or fitted from
/// every report accepted so far under the state this process holds.
fn is_fresh(m: &ProvisionalModel, h: &CollectionHandle, refresh: Duration) -> bool {
    m.finished.elapsed() < refresh
        || (m.reports == h.accepted() && m.state_version == h.state_version())
}

/// The provisional model of the collection `h`: the cached one while fresh, else a refit
/// (waiting for a refit already running). `refresh`: `--provisional-refresh-ms`. Errors:
/// `model-not-ready` when the collection is finalized (the final model answers instead);
/// `conflict` before the first report (but for `sketch+locmrf`, which takes none), and for a
/// vertical collection until every party has uploaded the local model and sketch report its
/// encoding asks for; the database's; the engine's.
pub async fn provisional_model(
    store: &Store,
    h: &Arc<CollectionHandle>,
    refresh: Duration,
) -> Result<Arc<ProvisionalModel>, IngestError> {
    let mut slot = h.provisional().slot.clone().lock_owned().await;
    if let Some(m) = slot.as_ref()
        && is_fresh(m, h, refresh)
    {
        return Ok(m.clone());
    }
    // The refit runs in a task of its own that holds the lock until its model is cached: a
    // request that goes away does not let a second refit start beside the first.
    let (store, h) = (store.clone(), h.clone());
    tokio::spawn(async move {
        let m = refit(&store, &h).await?;
        *slot = Some(m.clone());
        Ok(m)
    })
    .await
    .map_err(|e| IngestError::Internal(format!("the provisional refit stopped: {e}")))?
}

/// One refit of `h` from a snapshot of what it collected (module docs). Errors: as
/// [`provisional_model`].
async fn refit(
    store: &Store,
    h: &Arc<CollectionHandle>,
) -> Result<Arc<ProvisionalModel>, IngestError> {
    let (state, version) = h.state_and_version();
    let Snapshot {
        state,
        version,
        tables,
        round_counts: counts,
    } = store.snapshot(h, &state, version).await?;
    if state.phase == Phase::Finalized {
        return Err(IngestError::refused(
            ProblemType::ModelNotReady,
            "the collection is finalized and its model is being fitted; ask again shortly \
             (the final model answers then, with or without `provisional=true`)",
        ));
    }
    // Counted as `reports_accepted` counts: one report per table for devices, party records
    // (the round counts) for a vertical collection.
    let reports = if h.engine.vertical().is_some() {
        counts.values().sum()
    } else {
        tables.values().map(|t| t.n).sum()
    };
    // A `sketch+locmrf` collection takes no records: its uploads below are all it has.
    if reports == 0 && h.engine.takes_records() {
        return Err(IngestError::refused(
            ProblemType::Conflict,
            "no reports collected yet: a provisional estimate needs at least one report",
        ));
    }
    let uploads = if h.engine.vertical().is_some() {
        store.datastore.party_uploads(h.id).await?
    } else {
        PartyUploads::default()
    };
    if let Err(e) = h.engine.check_party_uploads(&uploads) {
        return Err(IngestError::refused(
            ProblemType::Conflict,
            format!("no provisional estimate yet: {e}"),
        ));
    }
    h.provisional().refits.fetch_add(1, Relaxed);
    let started = Instant::now();
    let model = build_model(h.engine.clone(), state, tables, uploads).await?;
    tracing::debug!(
        collection = %h.id,
        reports,
        fit_ms = started.elapsed().as_secs_f64() * 1e3,
        "provisional model refitted"
    );
    Ok(Arc::new(ProvisionalModel {
        model,
        reports,
        state_version: version,
        fitted_at: super::now_secs(),
        finished: Instant::now(),
    }))
}
