//! Collections in memory and the group committer.
//!
//! Every validated report goes through one committer task per process. It drains whatever
//! uploads are waiting, writes them in one transaction (duplicates and reused tokens are
//! caught by the database's unique keys, so nothing is counted twice even across processes),
//! bumps the per-round counts, commits, and only then updates the in-memory sufficient
//! statistics and answers the requests. A round whose quota the group reached is closed off
//! the committer (`start_close`): a task runs the engine's close on a snapshot and hands the
//! result back, stored only if the state has not changed since the snapshot. A collection
//! that stops at its target ([`CollectionHandle::stops_at_target`]) takes reports only up to `target_users`, counted
//! in the same transaction, and the commit that reaches the target finalizes it (under
//! `auto_finalize_at_target`) before answering. Admin transitions (close round, finalize,
//! delete) go through the same task, so the in-memory state has a single writer, and an
//! upload queued behind a delete is refused rather than stored into a deleted collection. Finalize's model fit does
//! not: the committer commits the finalized state (after which the collection's reports are
//! refused `collection-finalized`) and hands the fit to a task of its own, so uploads to
//! every collection go on while it runs ([`CollectionHandle::ensure_model`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use dashmap::DashMap;
use ldpsyn::mechanism::{Mechanism, SufficientStatistics};
use ldpsyn::wire::{CollectionConfig, PastTarget, Problem, ProblemType};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::api::ModelStatus;
use super::metrics::Metrics;
use super::provisional::ProvisionalCache;
use super::storage::{
    DATABASE_UNAVAILABLE, Datastore, IngestGate, NewReport, Snapshot, StorageError, Transaction,
    Writer,
};
use super::vertical::VerticalError;
use ldpsyn_engine::{
    CollectionState, Engine, EngineError, Model, PartyUploads, Phase, TableKey, Tables,
    TaskSampler, Transition,
};

/// Errors of ingest: the committer's commands and the collections in memory. The HTTP layer
/// wraps them (`ApiError::Ingest`) and maps each to its problem document.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Refused: a problem for the client (4xx, or 503 when the database cannot store now)
    /// with its type and what went wrong.
    #[error("{kind}: {detail}")]
    Refused {
        /// The problem type (gives the status).
        kind: ProblemType,
        /// What went wrong.
        detail: String,
    },
    /// The storage layer failed (the database, or stored data it could not read).
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// The engine refused or failed.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// Anything else internal (a panicked task, a stored row that cannot be).
    #[error("internal: {0}")]
    Internal(String),
}

impl IngestError {
    /// A refusal of type `kind`.
    pub fn refused(kind: ProblemType, detail: impl Into<String>) -> Self {
        IngestError::Refused {
            kind,
            detail: detail.into(),
        }
    }
}

/// Most reports written in one transaction.
const MAX_GROUP_REPORTS: usize = 16_384;

/// A collection's group commits per fold of its count deltas ([`CollectionHandle::fold_due`]).
/// Each commit between folds appends one row; a fold upserts every cell the deltas touched
/// (at most the collection's cells), once instead of once per commit. Reads (startup, a round
/// close on PostgreSQL) parse at most this many rows per process beyond the counts.
const FOLD_EVERY: u32 = 256;

/// Which holds the truth of a collection's state, tables and round counts: chosen once at
/// startup ([`Authority::for_datastore`]), outside storage, and handed to ingest with the
/// datastore ([`Store`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// This process's memory: it is the database's one writer (SQLite, one process). Round
    /// closes, finalize and estimates read the state and tables it holds; an id it does not
    /// hold is unknown.
    Memory,
    /// The database, which several processes write (PostgreSQL): round closes, finalize and
    /// estimates read it, so every process's reports count; an id unknown here is looked up
    /// there, and a refresher brings other processes' work into memory.
    Database,
}

impl Authority {
    /// The authority over `datastore`: the database when several processes may share it,
    /// else this process's memory.
    pub fn for_datastore(datastore: &Datastore) -> Self {
        if datastore.is_shared() {
            Authority::Database
        } else {
            Authority::Memory
        }
    }
}

/// What ingest reads and writes through: the datastore and the [`Authority`] over it.
#[derive(Debug, Clone)]
pub struct Store {
    /// The database.
    pub datastore: Datastore,
    /// Which holds the truth.
    pub authority: Authority,
}

impl Store {
    /// What a computation off the committer (a quota close, a provisional refit) starts
    /// from: memory's `state` at `version` with this process's tables and counts, or
    /// ([`Authority::Database`]) the stored collection in one consistent read. Errors: the
    /// database's, stored data that cannot be read.
    pub async fn snapshot(
        &self,
        handle: &CollectionHandle,
        state: &CollectionState,
        version: i64,
    ) -> Result<Snapshot, StorageError> {
        match self.authority {
            Authority::Database => self.datastore.snapshot(&handle.engine, handle.id).await,
            Authority::Memory => Ok(Snapshot {
                state: state.clone(),
                version,
                tables: handle.tables_snapshot(),
                round_counts: handle.round_counts_snapshot(),
            }),
        }
    }

    /// The tables to estimate `handle`'s model from (memory's, or every process's from the
    /// database). Errors: the database's, stored data that cannot be read.
    pub async fn tables(&self, handle: &CollectionHandle) -> Result<Tables, StorageError> {
        match self.authority {
            Authority::Database => self.datastore.tables(&handle.engine, handle.id).await,
            Authority::Memory => Ok(handle.tables_snapshot()),
        }
    }
}

/// What a round close of `handle` reads in `tx` after the collection's lock: the state, the
/// tables and the accepted reports per round. [`Authority::Database`]: all three from the
/// database, so every process's reports count and a state another process advanced is seen;
/// [`Authority::Memory`]: state and tables from memory, the per-round counts from memory
/// overlaid with the database's.
async fn close_inputs(
    authority: Authority,
    tx: &mut Transaction<'_>,
    handle: &CollectionHandle,
) -> Result<(CollectionState, Tables, BTreeMap<u32, u64>), StorageError> {
    let id = handle.id;
    match authority {
        Authority::Database => {
            let (state, _) = tx
                .state(id)
                .await?
                .ok_or(StorageError::MissingCollection(id))?;
            let tables = tx.tables(&handle.engine, id).await?;
            let counts = tx.round_counts(id).await?.into_iter().collect();
            Ok((state, tables, counts))
        }
        Authority::Memory => {
            let mut counts = handle.round_counts_snapshot();
            for (r, n) in tx.round_counts(id).await? {
                counts.insert(r, n);
            }
            Ok(((*handle.state()).clone(), handle.tables_snapshot(), counts))
        }
    }
}

/// What finalize of `handle` reads in `tx` after the ingest barrier and the collection's
/// lock: the state and the tables, from the database ([`Authority::Database`], every
/// process's reports) or memory.
async fn finalize_inputs(
    authority: Authority,
    tx: &mut Transaction<'_>,
    handle: &CollectionHandle,
) -> Result<(CollectionState, Tables), StorageError> {
    let id = handle.id;
    match authority {
        Authority::Database => {
            let (state, _) = tx
                .state(id)
                .await?
                .ok_or(StorageError::MissingCollection(id))?;
            Ok((state, tx.tables(&handle.engine, id).await?))
        }
        Authority::Memory => Ok(((*handle.state()).clone(), handle.tables_snapshot())),
    }
}

/// A state and the task distribution built from it when it became current (`None`: a state
/// without tasks, e.g. finalized). States are replaced, never changed in place, so the `Arc`
/// identifies one.
#[derive(Debug)]
struct Current {
    state: Arc<CollectionState>,
    sampler: Option<Arc<TaskSampler>>,
}

/// One collection, in memory. The state and the tables are derived from the database.
#[derive(Debug)]
pub struct CollectionHandle {
    /// Id.
    pub id: Uuid,
    /// Public config.
    pub config: CollectionConfig,
    /// Its engine.
    pub engine: Engine,
    /// The current state with its task distribution, replaced together.
    state: RwLock<Current>,
    state_version: AtomicI64,
    tables: DashMap<TableKey, SufficientStatistics>,
    mechanisms: DashMap<TableKey, Arc<Mechanism>>,
    round_counts: DashMap<u32, u64>,
    accepted: AtomicU64,
    model: RwLock<Option<Arc<Model>>>,
    /// Held by the one fit of the model at a time (a finalize, a second finalize asked while
    /// the first fits, a PostgreSQL refresh that finds the collection finalized elsewhere).
    fit: Arc<tokio::sync::Mutex<()>>,
    /// Set while a round close of this collection runs off the committer ([`start_close`]):
    /// at most one at a time.
    closing: AtomicBool,
    /// Taken by a round close off the committer between its snapshot and the engine's close
    /// ([`CollectionHandle::hold_closes`]).
    close_hold: Arc<tokio::sync::Mutex<()>>,
    /// Task samplers built so far ([`CollectionHandle::sampler_builds`]).
    sampler_builds: AtomicU64,
    /// Set once the collection's rows are deleted: the committer refuses what is still queued
    /// for it (`unknown-collection`).
    deleted: AtomicBool,
    /// The model refitted from the reports so far, while collecting ([`super::provisional`]).
    provisional: ProvisionalCache,
    /// Set while a background refit of the finalized model is queued or running
    /// (`AppState::queue_refit`): at most one at a time.
    refit_queued: AtomicBool,
    /// Why the last fit of the finalized model failed, if it did (answered by the model
    /// routes and the collection's status); cleared when a fit starts.
    fit_error: RwLock<Option<String>>,
    /// Group commits of this collection by this process since its last fold of the count
    /// deltas ([`CollectionHandle::fold_due`]).
    deltas_since_fold: AtomicU32,
}

impl CollectionHandle {
    /// A handle with the given state and tables.
    pub fn new(
        config: CollectionConfig,
        engine: Engine,
        state: CollectionState,
        state_version: i64,
        tables: Tables,
        round_counts: Vec<(u32, u64)>,
    ) -> Self {
        // A device report counts in one table; a party record counts in many, so vertical
        // collections count accepted records from their round counts.
        let accepted = if engine.vertical().is_some() {
            round_counts.iter().map(|c| c.1).sum()
        } else {
            tables.values().map(|s| s.n).sum()
        };
        let sampler_builds = AtomicU64::new(0);
        let current = build_current(&engine, state, &sampler_builds);
        Self {
            id: config.id,
            config,
            engine,
            state: RwLock::new(current),
            state_version: AtomicI64::new(state_version),
            tables: tables.into_iter().collect(),
            mechanisms: DashMap::new(),
            round_counts: round_counts.into_iter().collect(),
            accepted: AtomicU64::new(accepted),
            model: RwLock::new(None),
            refit_queued: AtomicBool::new(false),
            fit_error: RwLock::new(None),
            fit: Arc::default(),
            closing: AtomicBool::new(false),
            close_hold: Arc::default(),
            sampler_builds,
            deleted: AtomicBool::new(false),
            provisional: ProvisionalCache::default(),
            deltas_since_fold: AtomicU32::new(0),
        }
    }

    /// Whether the group commit being written folds this collection's count deltas into its
    /// table counts ([`Transaction::fold_count_deltas`]): every [`FOLD_EVERY`]th commit of it
    /// by this process; the others append their delta ([`Transaction::add_count_delta`]).
    fn fold_due(&self) -> bool {
        let n = self.deltas_since_fold.fetch_add(1, Relaxed) + 1;
        if n >= FOLD_EVERY {
            self.deltas_since_fold.store(0, Relaxed);
        }
        n >= FOLD_EVERY
    }

    /// Whether this collection stops at `target_users`: it refuses reports past the target
    /// (`past_target: refuse`) or finalizes there (`auto_finalize_at_target`). Device
    /// collections only: a vertical one is finalized by hand.
    pub fn stops_at_target(&self) -> bool {
        self.engine.vertical().is_none()
            && (self.config.past_target == PastTarget::Refuse
                || self.config.auto_finalize_at_target)
    }

    /// Whether the collection refuses reports because its target is reached (in this
    /// process's count; the commit checks the database's): `past_target: refuse` and
    /// `target_users` reports accepted.
    pub fn target_reached(&self) -> bool {
        self.stops_at_target()
            && self.config.past_target == PastTarget::Refuse
            && self.accepted() >= self.config.target_users
    }

    /// The refusal of a report (or task) for this collection once it takes no more:
    /// `collection-target-reached` when it refuses reports past its reached target (whether
    /// or not it is finalized since), else `collection-finalized`.
    pub fn closed_problem(&self) -> Problem {
        if self.target_reached() {
            target_reached_problem(self, false)
        } else {
            Problem::new(
                ProblemType::CollectionFinalized,
                "the collection is finalized and takes no more reports",
            )
        }
    }

    /// Whether the collection has been deleted (its handle may still be held by a request
    /// that looked it up before).
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Relaxed)
    }

    /// Marks the collection deleted (after its rows are gone).
    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Relaxed);
    }

    /// The task distribution of `state` (a snapshot from [`CollectionHandle::state`]). It
    /// was built once when `state` became current, so a task request only clones an `Arc`;
    /// a request that raced a state change (its snapshot is no longer current) builds one
    /// for its own snapshot ([`Engine::sampler`]). Errors: a state without tasks (finalized).
    pub fn sampler(&self, state: &Arc<CollectionState>) -> Result<Arc<TaskSampler>, EngineError> {
        {
            let current = self.state.read().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = &current.sampler
                && Arc::ptr_eq(&current.state, state)
            {
                return Ok(t.clone());
            }
        }
        self.sampler_builds.fetch_add(1, Relaxed);
        Ok(Arc::new(self.engine.sampler(state)?))
    }

    /// How many task samplers this handle has built: one per state it held (none for a
    /// state without tasks), plus one per task request that raced a state change. Task
    /// requests alone never add to it.
    pub fn sampler_builds(&self) -> u64 {
        self.sampler_builds.load(Relaxed)
    }

    /// The current state (a snapshot).
    pub fn state(&self) -> Arc<CollectionState> {
        // A poisoned lock only means a panic elsewhere; the Arc inside is still whole.
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .state
            .clone()
    }

    /// Makes `state` current with its task distribution, built here (before the lock is
    /// taken: task requests keep drawing from the old one meanwhile), once per state change.
    fn set_state(&self, state: CollectionState, version: i64) {
        let current = build_current(&self.engine, state, &self.sampler_builds);
        let mut guard = self.state.write().unwrap_or_else(|e| e.into_inner());
        *guard = current;
        // Under the lock, so that [`CollectionHandle::state_and_version`] reads a pair.
        self.state_version.store(version, Relaxed);
    }

    /// The current state and its stored version, read together.
    pub(crate) fn state_and_version(&self) -> (Arc<CollectionState>, i64) {
        let guard = self.state.read().unwrap_or_else(|e| e.into_inner());
        (guard.state.clone(), self.state_version.load(Relaxed))
    }

    /// Whether the open round's quota is reached in this process's count (a round close is
    /// due), and the collection is neither deleted nor finalized.
    fn close_due(&self) -> bool {
        let state = self.state();
        !self.is_deleted()
            && self
                .engine
                .should_close(&state, self.round_count(state.round))
    }

    /// Whether a round close of this collection is running off the committer
    /// (`start_close`).
    pub fn close_running(&self) -> bool {
        self.closing.load(Relaxed)
    }

    /// The stored version of the state this process knows.
    pub fn state_version(&self) -> i64 {
        self.state_version.load(Relaxed)
    }

    /// Accepted reports (this process's view; on PostgreSQL refreshed from the database).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Relaxed)
    }

    /// Accepted reports of `round`.
    pub fn round_count(&self, round: u32) -> u64 {
        self.round_counts.get(&round).map(|c| *c).unwrap_or(0)
    }

    /// Adds what a commit accepted: reports per task round and their statistics.
    pub(crate) fn apply_committed(&self, rounds: &BTreeMap<u32, u64>, delta: &Tables) {
        for (key, s) in delta {
            match self.tables.get_mut(key) {
                // Same mechanism, so same shape: merging cannot fail.
                Some(mut t) => {
                    let _ = t.merge(s);
                }
                None => {
                    self.tables.insert(key.clone(), s.clone());
                }
            }
        }
        for (&round, &n) in rounds {
            *self.round_counts.entry(round).or_insert(0) += n;
            self.accepted.fetch_add(n, Relaxed);
        }
    }

    /// The provisional model's cache ([`super::provisional`]).
    pub fn provisional(&self) -> &ProvisionalCache {
        &self.provisional
    }

    /// The model, once finalized.
    pub fn model(&self) -> Option<Arc<Model>> {
        self.model.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the model.
    pub fn set_model(&self, model: Arc<Model>) {
        *self.model.write().unwrap_or_else(|e| e.into_inner()) = Some(model);
    }

    /// Marks a background refit queued; false if one already is.
    pub(crate) fn claim_refit(&self) -> bool {
        !self.refit_queued.swap(true, Relaxed)
    }

    /// Ends a background refit (it succeeded, failed or was skipped).
    pub(crate) fn end_refit(&self) {
        self.refit_queued.store(false, Relaxed);
    }

    /// Why the last fit of the finalized model failed, if it did and no fit ran since.
    pub fn fit_error(&self) -> Option<String> {
        self.fit_error
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_fit_error(&self, error: Option<String>) {
        *self.fit_error.write().unwrap_or_else(|e| e.into_inner()) = error;
    }

    /// Where the model of this collection stands: [`ModelStatus::Collecting`] before
    /// finalize, then `Building` until the fit ends, `Ready` or `Failed`.
    pub fn model_status(&self) -> ModelStatus {
        if self.model().is_some() {
            ModelStatus::Ready
        } else if self.state().phase != Phase::Finalized {
            ModelStatus::Collecting
        } else if self.fit_error().is_some() {
            ModelStatus::Failed
        } else {
            ModelStatus::Building
        }
    }

    /// The model of the finalized `state` and its `tables`, fitted on the blocking pool unless
    /// it is already set, and then set. One fit at a time per collection: a caller that
    /// finds a fit running waits for it and returns its model. The fit is deterministic given
    /// `(state, tables)`, which are frozen once the finalized state is committed, so every
    /// caller gets the same model (and a restart fits it again from the stored reports).
    /// `uploads`: what the parties of a vertical collection uploaded besides their records
    /// (stored with it; empty otherwise).
    /// Errors: the engine's ([`Engine::finalize_vertical`]), also kept for
    /// [`CollectionHandle::fit_error`] until the next fit starts.
    pub async fn ensure_model(
        &self,
        state: CollectionState,
        tables: Tables,
        uploads: PartyUploads,
    ) -> Result<Arc<Model>, IngestError> {
        let _fit = self.fit.clone().lock_owned().await;
        if let Some(m) = self.model() {
            return Ok(m);
        }
        self.set_fit_error(None);
        match build_model(self.engine.clone(), state, tables, uploads).await {
            Ok(model) => {
                self.set_model(model.clone());
                Ok(model)
            }
            Err(e) => {
                self.set_fit_error(Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// Holds off this collection's model fits ([`CollectionHandle::ensure_model`]) while the
    /// returned guard lives: a test's stand-in for a fit that takes as long as the test
    /// needs. Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub async fn hold_fits(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.fit.clone().lock_owned().await
    }

    /// Holds off this collection's round closes while the returned guard lives: a close
    /// started meanwhile takes its snapshot (state, version, tables) and then waits here
    /// before the engine's close, a test's stand-in for a close that takes as long as the
    /// test needs. Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub async fn hold_closes(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.close_hold.clone().lock_owned().await
    }

    /// The (cached) mechanism of a table. Errors: a factor outside the schema.
    pub fn mechanism(&self, key: &TableKey) -> Result<Arc<Mechanism>, EngineError> {
        if let Some(m) = self.mechanisms.get(key) {
            return Ok(m.clone());
        }
        let m = Arc::new(self.engine.mechanism(key)?);
        self.mechanisms.insert(key.clone(), m.clone());
        Ok(m)
    }

    /// Accepted reports per round as this process counts them.
    pub fn round_counts_snapshot(&self) -> BTreeMap<u32, u64> {
        self.round_counts
            .iter()
            .map(|e| (*e.key(), *e.value()))
            .collect()
    }

    /// A copy of the in-memory tables.
    pub fn tables_snapshot(&self) -> Tables {
        self.tables
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect()
    }

    /// Replaces counts and state from the database (other processes' work, PostgreSQL).
    /// Only the committer calls it ([`Command::Refresh`]).
    pub(crate) fn refresh(&self, state: CollectionState, version: i64, counts: Vec<(u32, u64)>) {
        let total = counts.iter().map(|c| c.1).sum();
        for (r, n) in counts {
            self.round_counts.insert(r, n);
        }
        self.accepted.store(total, Relaxed);
        // Versions only grow: a row read before this process stored a newer state (a
        // finalize, a round close) must not take the handle back.
        if version > self.state_version() {
            self.set_state(state, version);
        }
    }
}

/// `state` with its task distribution (none for a state without tasks); counts the build.
fn build_current(engine: &Engine, state: CollectionState, builds: &AtomicU64) -> Current {
    // Vertical collections hand out no tasks (parties upload records).
    let sampler = match state.phase {
        Phase::Finalized => None,
        _ if engine.vertical().is_some() => None,
        _ => {
            builds.fetch_add(1, Relaxed);
            engine.sampler(&state).ok().map(Arc::new)
        }
    };
    Current {
        state: Arc::new(state),
        sampler,
    }
}

/// A validated report waiting for its commit.
#[derive(Debug)]
pub struct PendingReport {
    /// Its collection.
    pub handle: Arc<CollectionHandle>,
    /// What to store.
    pub report: NewReport,
}

/// What happened to one report.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Committed now.
    Accepted,
    /// Committed before.
    Duplicate,
    /// Refused.
    Rejected(Problem),
}

/// Work for the committer.
#[derive(Debug)]
pub enum Command {
    /// Commit these reports; answer one outcome each, in order.
    Reports {
        /// The reports.
        items: Vec<PendingReport>,
        /// Where to answer.
        reply: oneshot::Sender<Result<Vec<Outcome>, IngestError>>,
    },
    /// Close the current round now.
    CloseRound {
        /// The collection.
        handle: Arc<CollectionHandle>,
        /// Close it even when it has no reports (else `round-empty`).
        force: bool,
        /// Where to answer.
        reply: oneshot::Sender<Result<Vec<Transition>, IngestError>>,
    },
    /// Delete a collection's rows (reports, tables, counts, state) in one transaction, then
    /// mark its handle deleted; answers the number of reports (or vertical records) deleted,
    /// or `unknown-collection` when no row was stored.
    Delete {
        /// The collection id.
        id: Uuid,
        /// Its handle, when this process holds one (not for a collection it cannot load).
        handle: Option<Arc<CollectionHandle>>,
        /// Where to answer.
        reply: oneshot::Sender<Result<u64, IngestError>>,
    },
    /// Commit one party upload of a vertical collection.
    PartyRecords {
        /// The collection.
        handle: Arc<CollectionHandle>,
        /// The party's index.
        party: usize,
        /// Its records (validated).
        records: Vec<ldpsyn::vertical::PartyRecord>,
        /// Where to answer.
        reply: oneshot::Sender<Result<ldpsyn::vertical::PartyUploadResult, VerticalError>>,
    },
    /// Replace collections' counts with the database's, and their state where it is newer
    /// (PostgreSQL: other processes' work). Through the committer because it is the one
    /// writer of the counts: read anywhere else, the database may already hold a group this
    /// process committed but has not yet applied, and applying it would count it twice.
    Refresh {
        /// Per collection: its handle, its stored state and that state's version.
        items: Vec<(Arc<CollectionHandle>, CollectionState, i64)>,
        /// Where to answer.
        reply: oneshot::Sender<Result<(), IngestError>>,
    },
    /// The result of a round close computed off the committer (`start_close`): stored if
    /// the collection's state is still version `base`, else dropped.
    Closed(Box<ClosedRound>),
    /// Start a round close of each of `handles` whose open round's quota is reached and that
    /// has none running (the upkeep pass, at startup and then periodically); answers how
    /// many were started.
    CloseDue {
        /// The collections to look at.
        handles: Vec<Arc<CollectionHandle>>,
        /// Where to answer.
        reply: oneshot::Sender<Result<usize, IngestError>>,
    },
    /// Mark the collection finalized and start the fit of its model; answered once the
    /// finalized state is committed, before the fit ends.
    Finalize {
        /// The collection.
        handle: Arc<CollectionHandle>,
        /// Where to answer.
        reply: oneshot::Sender<Result<FinalizeStarted, IngestError>>,
    },
}

/// What a finalize answers once the finalized state is committed ([`Command::Finalize`]).
#[derive(Debug)]
pub enum FinalizeStarted {
    /// The model was built already.
    Ready(Arc<Model>),
    /// The model is being fitted on a task of its own, which answers here when it ends (the
    /// fit goes on, and keeps its model or its error on the handle, if nobody waits).
    Fitting(oneshot::Receiver<Result<Arc<Model>, IngestError>>),
}

/// A round close computed off the committer, waiting to be stored ([`Command::Closed`]).
#[derive(Debug)]
pub struct ClosedRound {
    handle: Arc<CollectionHandle>,
    /// The stored version of the state the close started from.
    base: i64,
    /// The state after the close.
    state: CollectionState,
    /// The transitions made.
    transitions: Vec<Transition>,
    /// When the close started, and the engine's part of it.
    started: Instant,
    engine_ms: f64,
}

/// Runs `f` on the blocking pool (estimation can take a while).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, IngestError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| IngestError::Internal(format!("estimation task failed: {e}")))
}

/// The committer task: runs until every sender is dropped.
/// `me` is a weak sender on its own channel, for the round closes it starts
/// (`start_close`) to hand their results back without keeping it alive.
pub async fn run_committer(
    store: Store,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<Command>,
    me: mpsc::WeakSender<Command>,
) {
    let mut writer = Writer::new(store.datastore.clone());
    let mut deferred: Option<Command> = None;
    loop {
        let cmd = match deferred.take() {
            Some(c) => c,
            None => match rx.recv().await {
                Some(c) => c,
                None => break,
            },
        };
        match cmd {
            Command::Reports { items, reply } => {
                let mut group = vec![(items, reply)];
                let mut total: usize = group[0].0.len();
                while total < MAX_GROUP_REPORTS {
                    match rx.try_recv() {
                        Ok(Command::Reports { items, reply }) => {
                            total += items.len();
                            group.push((items, reply));
                        }
                        Ok(other) => {
                            deferred = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                commit_group(&store, &mut writer, &metrics, &me, group).await;
            }
            Command::CloseRound {
                handle,
                force,
                reply,
            } => {
                let r = admin_close(&store, &mut writer, &metrics, &handle, force).await;
                let _ = reply.send(r);
            }
            Command::Delete { id, handle, reply } => {
                let r = delete(&mut writer, id, handle.as_deref()).await;
                let _ = reply.send(r);
            }
            Command::Refresh { items, reply } => {
                let _ = reply.send(refresh(&store.datastore, items).await);
            }
            Command::Finalize { handle, reply } => {
                start_finalize(&store, &mut writer, handle, reply).await;
            }
            Command::Closed(closed) => {
                store_close(&store, &mut writer, &metrics, &me, *closed).await;
            }
            Command::CloseDue { handles, reply } => {
                let started = handles
                    .iter()
                    .filter(|h| h.close_due() && start_close(&store, &me, h))
                    .count();
                let _ = reply.send(Ok(started));
            }
            Command::PartyRecords {
                handle,
                party,
                records,
                reply,
            } => {
                let r = if handle.is_deleted() {
                    Err(VerticalError::DeletedBefore(handle.id))
                } else {
                    super::vertical::commit_party_records(&mut writer, &handle, party, &records)
                        .await
                };
                let _ = reply.send(r);
            }
        }
    }
}

/// Finalizes `handle` (the committer's part, [`finalize`]) and fits its model on a task of
/// its own; `reply` is answered once the finalized state is committed, with the model if it
/// was built before, else with where the fit will answer. The committer goes on committing
/// uploads (this collection's are refused from the finalize's commit on) while the model is
/// fit. Used by `POST …/finalize` and by the commit that reaches an
/// `auto_finalize_at_target` collection's target.
async fn start_finalize(
    store: &Store,
    writer: &mut Writer,
    handle: Arc<CollectionHandle>,
    reply: oneshot::Sender<Result<FinalizeStarted, IngestError>>,
) {
    match finalize(store, writer, &handle).await {
        Ok(Finalized::Ready(model)) => {
            let _ = reply.send(Ok(FinalizeStarted::Ready(model)));
        }
        Ok(Finalized::Fit(inputs)) => {
            let (done, fitted) = oneshot::channel();
            let _ = reply.send(Ok(FinalizeStarted::Fitting(fitted)));
            tokio::spawn(async move {
                let (state, tables, uploads) = *inputs;
                let started = Instant::now();
                let r = handle.ensure_model(state, tables, uploads).await;
                match &r {
                    Ok(_) => tracing::info!(
                        collection = %handle.id,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "model fitted"
                    ),
                    Err(e) => tracing::error!(
                        collection = %handle.id,
                        error = %e,
                        "model fit failed; the collection stays finalized without a \
                         model (finalize again retries the fit)"
                    ),
                }
                let _ = done.send(r);
            });
        }
        Err(e) => {
            // Nobody waits for an automatic finalize: its failure is only logged (the next
            // report, or the next maintenance pass, tries again).
            if let Err(Err(e)) = reply.send(Err(e)) {
                tracing::error!(collection = %handle.id, error = %e, "finalize at target failed");
            }
        }
    }
}

/// The answer to a request for a collection that was deleted meanwhile.
fn deleted_problem(id: Uuid) -> IngestError {
    IngestError::refused(
        ProblemType::UnknownCollection,
        format!("no collection {id} (it was deleted)"),
    )
}

/// [`Command::Delete`]: behind the ingest barrier and the collection lock (PostgreSQL: every
/// other process's ingest transaction in flight finishes first, and later ones find no row,
/// [`Transaction::ingest_gate`]), deletes every row of collection `id` and commits; then marks its
/// handle deleted, so reports queued behind this command are refused. Returns the reports
/// (or vertical records) deleted. Errors: `unknown-collection` when no row was stored, the
/// database's.
async fn delete(
    writer: &mut Writer,
    id: Uuid,
    handle: Option<&CollectionHandle>,
) -> Result<u64, IngestError> {
    if handle.is_some_and(CollectionHandle::is_deleted) {
        return Err(deleted_problem(id));
    }
    let deleted = writer
        .run_tx(|tx| {
            Box::pin(async move {
                tx.lock_ingest_exclusive(id).await?;
                tx.lock_collection(id).await?;
                tx.delete_collection(id).await
            })
        })
        .await?;
    if let Some(h) = handle {
        h.mark_deleted();
    }
    match deleted {
        Some(reports) => {
            tracing::info!(collection = %id, reports, "collection deleted");
            Ok(reports)
        }
        None => Err(deleted_problem(id)),
    }
}

/// [`Command::Refresh`]: no commit of this process is between its database commit and its
/// [`CollectionHandle::apply_committed`] while the committer runs this.
async fn refresh(
    datastore: &Datastore,
    items: Vec<(Arc<CollectionHandle>, CollectionState, i64)>,
) -> Result<(), IngestError> {
    let mut counts = datastore.all_round_counts().await?;
    for (handle, state, version) in items {
        handle.refresh(
            state,
            version,
            counts.remove(&handle.id).unwrap_or_default(),
        );
    }
    Ok(())
}

/// The answer to a report of a collection deleted before the report's commit.
fn deleted_before_commit(id: Uuid) -> Outcome {
    Outcome::Rejected(Problem::new(
        ProblemType::UnknownCollection,
        format!("collection {id} was deleted before this report was committed"),
    ))
}

/// The answer to a report of a collection finalized before the report's commit (or, for a
/// collection that refuses reports past its target, once the target is reached).
fn finalized_before_commit(handle: &CollectionHandle) -> Outcome {
    Outcome::Rejected(if handle.target_reached() {
        target_reached_problem(handle, false)
    } else {
        Problem::new(
            ProblemType::CollectionFinalized,
            "the collection was finalized before this report was committed",
        )
    })
}

/// `collection-target-reached` for a report (`task` false) or a task request (`task` true):
/// the collection has its `target_users` reports and refuses more (`past_target: refuse`).
pub fn target_reached_problem(handle: &CollectionHandle, task: bool) -> Problem {
    let c = &handle.config;
    let name = c
        .name
        .as_ref()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    let what = if task {
        "no task is handed out"
    } else {
        "this report was not stored"
    };
    Problem::new(
        ProblemType::CollectionTargetReached,
        format!(
            "collection {}{name} already has the {} reports it asked for and takes no more: \
             {what}, and nothing more is needed from this device",
            handle.id, c.target_users
        ),
    )
}

/// The answer to a report past the target of a collection that stops there
/// ([`CollectionHandle::stops_at_target`]): `collection-target-reached` under
/// `past_target: refuse`; under `accept` the collection finalizes at the target
/// (`auto_finalize_at_target`) in the same committer step, so `collection-finalized`.
fn past_target(handle: &CollectionHandle) -> Outcome {
    Outcome::Rejected(if handle.config.past_target == PastTarget::Refuse {
        target_reached_problem(handle, false)
    } else {
        Problem::new(
            ProblemType::CollectionFinalized,
            format!(
                "collection {} reached its target of {} reports with this commit and is \
                 finalized at it; this report was not stored",
                handle.id, handle.config.target_users
            ),
        )
    })
}

type Group = Vec<(
    Vec<PendingReport>,
    oneshot::Sender<Result<Vec<Outcome>, IngestError>>,
)>;

async fn commit_group(
    store: &Store,
    writer: &mut Writer,
    metrics: &Metrics,
    me: &mpsc::WeakSender<Command>,
    group: Group,
) {
    let start = Instant::now();
    // Flatten; classify in-batch repeats before touching the database.
    let mut outcomes: Vec<Vec<Option<Outcome>>> = group
        .iter()
        .map(|(items, _)| vec![None; items.len()])
        .collect();
    // A report is identified by its token; the same token with the same report id is a
    // retry (duplicate), with another id a second answer to one task (token reused).
    let mut tokens: HashMap<(Uuid, &str), (usize, usize)> = HashMap::new();
    let mut follows: Vec<((usize, usize), (usize, usize))> = Vec::new();
    let mut to_insert: Vec<&NewReport> = Vec::new();
    let mut positions: Vec<(usize, usize)> = Vec::new();
    for (j, (items, _)) in group.iter().enumerate() {
        for (i, p) in items.iter().enumerate() {
            let r = &p.report;
            if p.handle.is_deleted() {
                outcomes[j][i] = Some(deleted_before_commit(r.collection));
            } else if p.handle.state().phase == Phase::Finalized || p.handle.target_reached() {
                outcomes[j][i] = Some(finalized_before_commit(&p.handle));
            } else if let Some(&(fj, fi)) = tokens.get(&(r.collection, r.nonce.as_str())) {
                if group[fj].0[fi].report.report_id == r.report_id {
                    follows.push(((j, i), (fj, fi)));
                } else {
                    outcomes[j][i] = Some(Outcome::Rejected(Problem::new(
                        ProblemType::TokenReused,
                        "another report in the same commit answers this token",
                    )));
                }
            } else {
                tokens.insert((r.collection, r.nonce.as_str()), (j, i));
                to_insert.push(r);
                positions.push((j, i));
            }
        }
    }
    // Whether this commit folds a collection's count deltas, decided once per collection.
    let mut folds: BTreeMap<Uuid, bool> = BTreeMap::new();
    let mut result = None;
    // The usual group: all of one collection, whose deltas this commit does not fold. It is
    // stored whole in a transaction of its own, in fewer round trips; unless that declines
    // (a replayed token, past the target, not open in the database), which leaves nothing
    // written.
    if let Some(first) = to_insert.first() {
        let handle = &group[positions[0].0].0[positions[0].1].handle;
        let usual = to_insert.iter().all(|r| r.collection == first.collection)
            && !*folds.entry(handle.id).or_insert_with(|| handle.fold_due());
        if usual {
            result = append_usual(writer, &group, &to_insert, &positions, handle)
                .await
                .transpose();
        }
    }
    let result = match result {
        Some(r) => r,
        None => {
            let folds = &mut folds;
            writer
                .run_tx(|tx| Box::pin(write_group(tx, &group, &to_insert, &positions, folds)))
                .await
        }
    };
    match result {
        Ok((inserted, classified, committed, due, reached)) => {
            for (k, &(j, i)) in positions.iter().enumerate() {
                outcomes[j][i] = Some(if inserted[k] {
                    Outcome::Accepted
                } else {
                    classified[k].clone()
                });
            }
            for ((j, i), (fj, fi)) in follows {
                outcomes[j][i] = Some(match &outcomes[fj][fi] {
                    Some(Outcome::Accepted) | Some(Outcome::Duplicate) => Outcome::Duplicate,
                    Some(other) => other.clone(),
                    None => Outcome::Duplicate,
                });
            }
            // Committed: update derived state.
            for (handle, rounds, delta) in &committed {
                handle.apply_committed(rounds, delta);
            }
            // The reports that reached a round's quota are committed; the close runs off the
            // committer and its result comes back as a `Command::Closed`.
            for handle in &due {
                start_close(store, me, handle);
            }
            // Before the answers: a device told `accepted` for the report that made the
            // target finds the collection finalized.
            for handle in reached {
                if handle.state().phase == Phase::Finalized {
                    continue;
                }
                // Its last round closes first, here on the committer, as the finalize that
                // follows would drop a close running off it: once in a collection's life.
                close_before_finalize(store, writer, metrics, &handle).await;
                tracing::info!(collection = %handle.id, target = handle.config.target_users,
                    "target reached: finalizing");
                let (reply, _) = oneshot::channel();
                start_finalize(store, writer, handle, reply).await;
            }
            let mut acc = 0;
            let mut dup = 0;
            for o in outcomes.iter().flatten().flatten() {
                match o {
                    Outcome::Accepted => acc += 1,
                    Outcome::Duplicate => dup += 1,
                    Outcome::Rejected(p) => metrics.rejected(p.problem_type),
                }
            }
            metrics.reports(acc, dup);
            metrics.commit(start.elapsed());
            for ((_, reply), outs) in group.into_iter().zip(outcomes) {
                let outs = outs
                    .into_iter()
                    .map(|o| o.unwrap_or(Outcome::Duplicate))
                    .collect();
                let _ = reply.send(Ok(outs));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "group commit failed; nothing of it is acknowledged");
            // A database down or out of space is the devices' cue to retry (503), not a bug.
            let unavailable = matches!(&e, IngestError::Storage(s) if s.is_unavailable());
            for (_, reply) in group {
                let _ = reply.send(Err(if unavailable {
                    IngestError::refused(ProblemType::Unavailable, DATABASE_UNAVAILABLE)
                } else {
                    IngestError::Internal(format!("commit failed: {e}"))
                }));
            }
        }
    }
}

/// A collection's share of a group: its handle, accepted reports per task round, and the
/// statistics they add.
type PerCollection = (Arc<CollectionHandle>, BTreeMap<u32, u64>, Tables);

/// Per report of `to_insert`: inserted, else its outcome; per collection, what it committed;
/// the collections whose open round's quota is reached (in the database's count), for which
/// a round close is due; the collections to finalize because their target is reached
/// (`auto_finalize_at_target`).
type Written = (
    Vec<bool>,
    Vec<Outcome>,
    Vec<PerCollection>,
    Vec<Arc<CollectionHandle>>,
    Vec<Arc<CollectionHandle>>,
);

/// Stores `to_insert` (at `positions` of `group`, all new reports of `handle`'s collection)
/// with [`Writer::append_group`], within the collection's target if it stops there; `None`
/// when it declined and nothing was written.
async fn append_usual(
    writer: &mut Writer,
    group: &Group,
    to_insert: &[&NewReport],
    positions: &[(usize, usize)],
    handle: &Arc<CollectionHandle>,
) -> Result<Option<Written>, IngestError> {
    let all = vec![true; to_insert.len()];
    let per = statistics(group, positions, &all)?;
    let (_, rounds, delta) = &per[&handle.id];
    let target = handle
        .stops_at_target()
        .then_some(handle.config.target_users);
    let Some(appended) = writer
        .append_group(handle.id, to_insert, delta, rounds, target)
        .await?
    else {
        return Ok(None);
    };
    let due = Vec::from_iter(close_due(handle, &appended.rounds));
    let reached = match target {
        Some(t) if appended.total >= t && handle.config.auto_finalize_at_target => {
            vec![handle.clone()]
        }
        _ => Vec::new(),
    };
    Ok(Some((
        all,
        vec![Outcome::Accepted; to_insert.len()],
        per.into_values().collect(),
        due,
        reached,
    )))
}

/// Writes `to_insert` (at `positions` of `group`) in `tx` statement by statement, telling
/// each report's outcome, and bumps the round counts. `folds` holds, per collection, whether
/// this commit folds its count deltas, where already decided. Returns (in [`Written`]) the
/// collections whose open round's quota is now reached: their close runs after the commit,
/// off the committer ([`start_close`]).
async fn write_group(
    tx: &mut Transaction<'_>,
    group: &Group,
    to_insert: &[&NewReport],
    positions: &[(usize, usize)],
    folds: &mut BTreeMap<Uuid, bool>,
) -> Result<Written, IngestError> {
    // Another process may have finalized or deleted the collection since this one last
    // refreshed: ask the database, behind finalize's and delete's barrier, before inserting
    // anything.
    let mut gates = BTreeMap::new();
    for r in to_insert {
        if let std::collections::btree_map::Entry::Vacant(e) = gates.entry(r.collection) {
            e.insert(tx.ingest_gate(r.collection).await?);
        }
    }
    let handle_of = |k: usize| &group[positions[k].0].0[positions[k].1].handle;
    // Collections that stop at their target (`stops_at_target`), by id, with their open
    // reports in upload order.
    let mut capped: BTreeMap<Uuid, Vec<usize>> = BTreeMap::new();
    let mut open: Vec<usize> = Vec::new();
    for k in 0..to_insert.len() {
        if gates[&to_insert[k].collection] != IngestGate::Open {
            continue;
        }
        if handle_of(k).stops_at_target() {
            capped.entry(to_insert[k].collection).or_default().push(k);
        } else {
            open.push(k);
        }
    }
    if !capped.is_empty() {
        // PostgreSQL: the count read below must not move until this commits, so every
        // collection of the group is locked now, in id order (the round closes below take
        // the same locks, none new, so two processes cannot wait for each other).
        for id in gates.keys() {
            tx.lock_collection(*id).await?;
        }
    }
    let open_reports: Vec<&NewReport> = open.iter().map(|&k| to_insert[k]).collect();
    let mut inserted = vec![false; to_insert.len()];
    for (&k, ok) in open.iter().zip(tx.insert_reports(&open_reports).await?) {
        inserted[k] = ok;
    }
    // A capped collection takes reports up to its target, in upload order; a duplicate
    // takes no place, so the next ones are tried until the target or the group runs out.
    let mut excess = vec![false; to_insert.len()];
    let mut reached = Vec::new();
    for (id, ks) in &capped {
        let handle = handle_of(ks[0]);
        let target = handle.config.target_users;
        let mut total = tx.accepted_total(*id).await?;
        let mut next = 0;
        while next < ks.len() && total < target {
            let room = usize::try_from(target - total).unwrap_or(usize::MAX);
            let batch = &ks[next..ks.len().min(next.saturating_add(room))];
            let reports: Vec<&NewReport> = batch.iter().map(|&k| to_insert[k]).collect();
            for (&k, ok) in batch.iter().zip(tx.insert_reports(&reports).await?) {
                inserted[k] = ok;
                total += u64::from(ok);
            }
            next += batch.len();
        }
        for &k in &ks[next..] {
            excess[k] = true;
        }
        if total >= target && handle.config.auto_finalize_at_target {
            reached.push(handle.clone());
        }
    }
    let mut classified = vec![Outcome::Accepted; to_insert.len()];
    // Per finalized collection that refuses reports past its target: whether the database's
    // count reached it (this process's count may lag another process's finalize).
    let mut at_target: BTreeMap<Uuid, bool> = BTreeMap::new();
    for (k, r) in to_insert.iter().enumerate() {
        if gates[&r.collection] == IngestGate::Finalized {
            let h = handle_of(k);
            let refuses = h.stops_at_target() && h.config.past_target == PastTarget::Refuse;
            let reached = match at_target.get(&r.collection) {
                Some(&b) => b,
                None if refuses => {
                    let b = tx.accepted_total(r.collection).await? >= h.config.target_users;
                    at_target.insert(r.collection, b);
                    b
                }
                None => false,
            };
            classified[k] = if reached {
                Outcome::Rejected(target_reached_problem(h, false))
            } else {
                finalized_before_commit(h)
            };
        } else if gates[&r.collection] == IngestGate::Gone {
            classified[k] = deleted_before_commit(r.collection);
        } else if !inserted[k] {
            let stored = tx.report_of_token(r.collection, &r.nonce).await?;
            classified[k] = match stored {
                Some(id) if id == r.report_id => Outcome::Duplicate,
                None if excess[k] => past_target(handle_of(k)),
                _ => Outcome::Rejected(Problem::new(
                    ProblemType::TokenReused,
                    "this task token already answered another report",
                )),
            };
        }
    }
    let per = statistics(group, positions, &inserted)?;
    let mut due = Vec::new();
    for (id, (handle, rounds, delta)) in &per {
        if *folds.entry(*id).or_insert_with(|| handle.fold_due()) {
            tx.fold_count_deltas(&handle.engine, *id, delta).await?;
        } else {
            tx.add_count_delta(*id, delta).await?;
        }
        let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
        for (&round, &n) in rounds {
            let total = tx.bump_round_count(*id, round, n).await?;
            counts.insert(round, total);
        }
        due.extend(close_due(handle, &counts));
    }
    Ok((
        inserted,
        classified,
        per.into_values().collect(),
        due,
        reached,
    ))
}

/// Per collection of `group`, the reports of `positions` that were `inserted`: accepted
/// per task round, and their statistics.
fn statistics(
    group: &Group,
    positions: &[(usize, usize)],
    inserted: &[bool],
) -> Result<BTreeMap<Uuid, PerCollection>, IngestError> {
    let mut per: BTreeMap<Uuid, PerCollection> = BTreeMap::new();
    for (&(j, i), _) in positions.iter().zip(inserted).filter(|(_, ok)| **ok) {
        let p = &group[j].0[i];
        let e = per
            .entry(p.handle.id)
            .or_insert_with(|| (p.handle.clone(), BTreeMap::new(), Tables::new()));
        *e.1.entry(p.report.task_round).or_insert(0) += 1;
        let m = p.handle.mechanism(&p.report.key)?;
        // Looked up before inserting: cloning the key (two vectors) for every report cost an
        // allocation each.
        if !e.2.contains_key(&p.report.key) {
            e.2.insert(p.report.key.clone(), SufficientStatistics::new(&m));
        }
        let stats = e.2.get_mut(&p.report.key).expect("inserted above");
        m.accumulate(&p.report.payload, stats)
            .map_err(|e| IngestError::Internal(e.to_string()))?;
    }
    Ok(per)
}

/// `handle` when its open round's quota is reached, by `counts` (the round counts a commit
/// just wrote) or else this process's count: a close is due after the commit.
fn close_due(
    handle: &Arc<CollectionHandle>,
    counts: &BTreeMap<u32, u64>,
) -> Option<Arc<CollectionHandle>> {
    let state = handle.state();
    let current = counts
        .get(&state.round)
        .copied()
        .unwrap_or_else(|| handle.round_count(state.round));
    handle
        .engine
        .should_close(&state, current)
        .then(|| handle.clone())
}

/// The refusal of an operator's close of round `round` of `state`, which has no reports.
fn round_empty(id: Uuid, state: &CollectionState) -> IngestError {
    let (what, effect) = if state.phase == Phase::PairSampling {
        (
            "batch",
            "would re-weight the attribute pairs from no new data",
        )
    } else {
        (
            "round",
            "would judge its attribute pairs on no data and prune them",
        )
    };
    let quota = state
        .round_quota
        .map(|q| format!(" (this one at {q} reports)"))
        .unwrap_or_default();
    IngestError::refused(
        ProblemType::RoundEmpty,
        format!(
            "{what} {} of collection {id} has no reports yet; closing it now {effect}. Nothing \
             was changed. A {what} closes by itself when it reaches its quota{quota}, so there \
             is usually no need to close one by hand. To close it anyway, repeat the request \
             with `?force=true` (CLI: `collections close-round --force`)",
            state.round
        ),
    )
}

/// Closes the rounds whose quota is reached of `handle`, whose target was just reached
/// (`auto_finalize_at_target`), on the committer before its finalize: the finalized state
/// follows the same closes as when the target is reached at another moment. A failure is
/// logged; the finalize goes on.
async fn close_before_finalize(
    store: &Store,
    writer: &mut Writer,
    metrics: &Metrics,
    handle: &Arc<CollectionHandle>,
) {
    let r = writer
        .run_tx(|tx| Box::pin(close_in_tx(store.authority, tx, handle, None)))
        .await;
    match r {
        Ok((state, transitions, Some(version))) => {
            metrics.rounds_closed(transitions.len() as u64);
            handle.set_state(state, version);
        }
        Ok(_) => {}
        Err(e) => tracing::error!(collection = %handle.id, error = %e,
            "round close at the target failed; the collection is finalized without it"),
    }
}

/// Closes rounds for the operator (`close-round`), inside `tx`, on the committer: takes the
/// collection's lock (PostgreSQL), reads the state and tables ([`close_inputs`] —
/// [`Authority::Database`]: from the database, so every process's reports count; else
/// memory), closes
/// once (`force`: `Some`), then while the quota is reached, and stores the new state if it
/// changed (`force`: `None` is the close of a collection reaching its target,
/// [`close_before_finalize`]: only while the quota is reached). This one stays synchronous
/// (it is rare, and its caller waits for the new round): uploads to every collection of the process wait while it runs. Its stored version makes a quota close
/// running off the committer meanwhile drop its result ([`store_close`]). Returns the current
/// state (PostgreSQL: possibly advanced by another process, which the refresh from the
/// database brings to this process's handle), the transitions made here, and the stored
/// version when they were stored. Errors: `round-empty` when the open round has no reports
/// and not `force` (nothing is written), the engine's, the database's.
async fn close_in_tx(
    authority: Authority,
    tx: &mut Transaction<'_>,
    handle: &Arc<CollectionHandle>,
    force: Option<bool>,
) -> Result<(CollectionState, Vec<Transition>, Option<i64>), IngestError> {
    let started = Instant::now();
    tx.lock_collection(handle.id).await?;
    let (state, tables, counts) = close_inputs(authority, tx, handle).await?;
    // Only phases with rounds are refused: elsewhere the close changes nothing anyway.
    let has_rounds = matches!(state.phase, Phase::GraphConstruction | Phase::PairSampling);
    if force == Some(false) && has_rounds && counts.get(&state.round).copied().unwrap_or(0) == 0 {
        return Err(round_empty(handle.id, &state));
    }
    let (state, transitions, engine_ms) = run_close(
        handle.engine.clone(),
        state,
        tables,
        counts,
        force.is_some(),
    )
    .await?;
    let version = if transitions.is_empty() {
        None
    } else {
        Some(tx.update_state(handle.id, &state).await?)
    };
    log_transitions(handle, &transitions, started, engine_ms, None);
    Ok((state, transitions, version))
}

/// Closes rounds of `state` on the blocking pool: once first if `once`, then while the quota
/// is reached. Returns the new state, the transitions and the engine's time (ms). Errors: the
/// engine's.
async fn run_close(
    engine: Engine,
    mut state: CollectionState,
    tables: Tables,
    counts: BTreeMap<u32, u64>,
    once: bool,
) -> Result<(CollectionState, Vec<Transition>, f64), IngestError> {
    let engine_started = Instant::now();
    let (state, transitions) = blocking(move || {
        let mut transitions = Vec::new();
        let mut forced = once;
        loop {
            let current = counts.get(&state.round).copied().unwrap_or(0);
            if !(forced || engine.should_close(&state, current)) {
                break;
            }
            forced = false;
            match engine.close_round(&mut state, &tables) {
                Ok(Transition::Nothing) => break,
                Ok(t) => transitions.push(t),
                Err(e) => return Err(e),
            }
        }
        Ok((state, transitions))
    })
    .await??;
    Ok((
        state,
        transitions,
        engine_started.elapsed().as_secs_f64() * 1e3,
    ))
}

/// Logs each transition of a close at `info`: `close_ms`, the whole close from its start to
/// its stored state; `engine_ms`, its transitions alone (the engine's MI, pruning and
/// selection); `commit_ms` (a quota close off the committer), the committer's part, the short
/// transaction that stores the state. At 35 attributes (temporal-match2, SQLite, 2 loaded
/// cores) a close takes 12–33 ms for auto's round 0 and 78–145 ms for its selection round,
/// 16–81 ms for privincr, 17–48 ms for samprivsyn, nearly all of it `engine_ms`:
/// `LDPSYN_LOG=info ldpsyn-aggregator demo --data temporal-match2.csv --schema
/// temporal-match2-schema.json --protocol P | grep close_ms` (docs/operations.md, "Round
/// closes off the committer").
fn log_transitions(
    handle: &CollectionHandle,
    transitions: &[Transition],
    started: Instant,
    engine_ms: f64,
    commit_ms: Option<f64>,
) {
    let close_ms = started.elapsed().as_secs_f64() * 1e3;
    for t in transitions {
        tracing::info!(
            collection = %handle.id,
            transition = ?t,
            close_ms,
            engine_ms,
            commit_ms,
            "round transition"
        );
    }
}

/// Starts a round close of `handle` off the committer, unless one is running: a task takes
/// a snapshot (SQLite: the state and version the committer holds now, then the tables and
/// counts in memory, the truth there; PostgreSQL: all of them from the database,
/// [`Store::snapshot`]), runs the engine's close on the blocking pool, and hands the
/// result back to the committer ([`Command::Closed`], stored by [`store_close`] only if the
/// state is still the snapshot's version). The caller checked that the quota is reached.
/// Reports that arrive meanwhile carry the open round's tasks and count in that round (as
/// late reports do after any close). Returns whether a close was started.
fn start_close(
    store: &Store,
    me: &mpsc::WeakSender<Command>,
    handle: &Arc<CollectionHandle>,
) -> bool {
    if handle.is_deleted() || handle.closing.swap(true, Relaxed) {
        return false;
    }
    // Taken here, on the committer (the one writer of the state): a state change committed
    // after this point has a newer version, and drops this close's result.
    let (state, version) = handle.state_and_version();
    let (store, me, handle) = (store.clone(), me.clone(), handle.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        match compute_close(&store, &handle, &state, version).await {
            Ok(Some((base, state, transitions, engine_ms))) => {
                let closed = ClosedRound {
                    handle: handle.clone(),
                    base,
                    state,
                    transitions,
                    started,
                    engine_ms,
                };
                if let Some(tx) = me.upgrade()
                    && tx.send(Command::Closed(Box::new(closed))).await.is_ok()
                {
                    // The committer clears `closing` once it has stored or dropped it.
                    return;
                }
                tracing::info!(collection = %handle.id,
                    "round close dropped: the committer stopped (the next start closes it)");
            }
            Ok(None) => {}
            Err(e) => tracing::error!(
                collection = %handle.id,
                error = %e,
                "round close failed; the reports are committed and the close is retried with \
                 the collection's next reports (or the next upkeep pass)"
            ),
        }
        handle.closing.store(false, Relaxed);
    });
    true
}

/// The off-committer part of a quota close ([`start_close`]), from the committer's snapshot
/// `state` at `version`: returns the version it started from, the new state, the transitions
/// and the engine's time, or `None` when no round closes (PostgreSQL: another process closed
/// it already). Errors: the engine's, the database's.
#[allow(clippy::type_complexity)]
async fn compute_close(
    store: &Store,
    handle: &Arc<CollectionHandle>,
    state: &CollectionState,
    version: i64,
) -> Result<Option<(i64, CollectionState, Vec<Transition>, f64)>, IngestError> {
    let Snapshot {
        state,
        version,
        tables,
        round_counts: counts,
    } = store.snapshot(handle, state, version).await?;
    let _hold = handle.close_hold.clone().lock_owned().await;
    let (state, transitions, engine_ms) =
        run_close(handle.engine.clone(), state, tables, counts, false).await?;
    Ok((!transitions.is_empty()).then_some((version, state, transitions, engine_ms)))
}

/// [`Command::Closed`], on the committer: stores the close's state in a short transaction if
/// the stored state is still the version the close started from, then makes it current;
/// otherwise (a finalize, an operator's close, another process's close, a delete came
/// between) drops it. Then starts the next close if the quota is (still) reached.
async fn store_close(
    store: &Store,
    writer: &mut Writer,
    metrics: &Metrics,
    me: &mpsc::WeakSender<Command>,
    closed: ClosedRound,
) {
    let ClosedRound {
        handle,
        base,
        state,
        transitions,
        started,
        engine_ms,
    } = closed;
    let commit_started = Instant::now();
    let r: Result<_, StorageError> = writer
        .run_tx(|tx| Box::pin(tx.update_state_if(handle.id, &state, base)))
        .await;
    let retry = match r {
        Ok(Some(version)) => {
            handle.set_state(state, version);
            metrics.rounds_closed(transitions.len() as u64);
            let commit_ms = commit_started.elapsed().as_secs_f64() * 1e3;
            log_transitions(&handle, &transitions, started, engine_ms, Some(commit_ms));
            true
        }
        Ok(None) => {
            tracing::info!(
                collection = %handle.id,
                base,
                "round close dropped: the collection's state changed since its snapshot"
            );
            // Retried from the state this process now holds; not when it still holds the
            // snapshot's version (PostgreSQL: another process moved the state; its refresh
            // or the next commit here starts the next close), which would only repeat this.
            handle.state_version() != base
        }
        Err(e) => {
            tracing::error!(collection = %handle.id, error = %e,
                "storing a round close failed; the next reports (or upkeep pass) retry it");
            false
        }
    };
    handle.closing.store(false, Relaxed);
    if retry && handle.close_due() {
        start_close(store, me, &handle);
    }
}

/// [`Command::CloseRound`]. Errors: `collection-finalized`, `unknown-collection` (deleted),
/// `round-empty` (unless `force`), the engine's, the database's.
async fn admin_close(
    store: &Store,
    writer: &mut Writer,
    metrics: &Metrics,
    handle: &Arc<CollectionHandle>,
    force: bool,
) -> Result<Vec<Transition>, IngestError> {
    if handle.is_deleted() {
        return Err(deleted_problem(handle.id));
    }
    if handle.state().phase == Phase::Finalized {
        return Err(IngestError::refused(
            ProblemType::CollectionFinalized,
            "the collection is finalized",
        ));
    }
    let (state, transitions, version) = writer
        .run_tx(|tx| Box::pin(close_in_tx(store.authority, tx, handle, Some(force))))
        .await?;
    metrics.rounds_closed(transitions.len() as u64);
    if let Some(version) = version {
        handle.set_state(state, version);
    }
    Ok(transitions)
}

/// Builds a model from `state`, `tables` and the parties' uploads on the blocking pool.
pub async fn build_model(
    engine: Engine,
    state: CollectionState,
    tables: Tables,
    uploads: PartyUploads,
) -> Result<Arc<Model>, IngestError> {
    Ok(Arc::new(
        blocking(move || engine.finalize_vertical(&state, &tables, &uploads)).await??,
    ))
}

/// What the committer's part of a finalize leaves to do.
enum Finalized {
    /// The model is built already.
    Ready(Arc<Model>),
    /// The finalized state is committed; fit the model of this state, these tables and
    /// these party uploads.
    Fit(Box<(CollectionState, Tables, PartyUploads)>),
}

/// The committer's part of a finalize: the state transition, without the fit. In one
/// transaction behind the ingest barrier, reads the state and tables, marks the state
/// finalized and stores it; once committed, the collection's reports are refused
/// `collection-finalized` and its tables are frozen: every report acknowledged before is in
/// the tables returned, none after. Errors: `conflict` (nothing collected yet; the
/// collection stays open), the database's.
async fn finalize(
    store: &Store,
    writer: &mut Writer,
    handle: &Arc<CollectionHandle>,
) -> Result<Finalized, IngestError> {
    if handle.is_deleted() {
        return Err(deleted_problem(handle.id));
    }
    if let Some(m) = handle.model() {
        return Ok(Finalized::Ready(m));
    }
    let authority = store.authority;
    let (state, tables, uploads, version) = writer
        .run_tx(|tx| {
            Box::pin(async move {
                // Waits for every ingest transaction in flight on any process; later ones see
                // the finalized state (Transaction::ingest_gate).
                tx.lock_ingest_exclusive(handle.id).await?;
                tx.lock_collection(handle.id).await?;
                let (mut state, tables) = finalize_inputs(authority, tx, handle).await?;
                // A vertical collection with local models or sketch reports waits for every
                // party's (409, the collection stays open); read in this transaction, behind
                // the uploads' barrier.
                let uploads = if handle.engine.vertical().is_some() {
                    tx.party_uploads(handle.id).await?
                } else {
                    PartyUploads::default()
                };
                if let Err(e) = handle.engine.check_party_uploads(&uploads) {
                    return Err(IngestError::refused(
                        ProblemType::Conflict,
                        format!("the collection cannot be finalized yet: {e}"),
                    ));
                }
                // Finalized here, or by another process (PostgreSQL) whose version is read
                // back.
                let version = if state.phase != Phase::Finalized {
                    // The one refusal a fit can foresee is checked before the transition (as
                    // Engine::finalize checks it), so that it leaves the collection open.
                    if handle.engine.takes_records() && tables.values().all(|t| t.n == 0) {
                        return Err(EngineError::NoData.into());
                    }
                    handle.engine.mark_finalized(&mut state);
                    tx.set_finalized_at(handle.id, super::now_secs()).await?;
                    // No report commits from here on: its statistics end in its table counts.
                    tx.fold_count_deltas(&handle.engine, handle.id, &Tables::new())
                        .await?;
                    tx.update_state(handle.id, &state).await?
                } else {
                    tx.state(handle.id)
                        .await?
                        .map_or(handle.state_version(), |(_, v)| v)
                };
                Ok((state, tables, uploads, version))
            })
        })
        .await?;
    handle.set_state(state.clone(), version);
    Ok(Finalized::Fit(Box::new((state, tables, uploads))))
}

#[cfg(test)]
mod tests {
    use ldpsyn::Epsilon;
    use ldpsyn::wire::{PROTOCOL_VERSION, PrivIncrParams, Protocol};

    use super::*;

    /// A privincr collection's handle over two attributes at version 1, and its initial state.
    fn handle() -> (CollectionHandle, CollectionState) {
        let schema: ldpsyn::schema::Schema = serde_json::from_value(serde_json::json!({
            "attributes": [
                {"name": "a", "type": "categorical", "labels": ["x", "y"]},
                {"name": "b", "type": "categorical", "labels": ["x", "y", "z"]}]}))
        .unwrap();
        let config = CollectionConfig {
            auto_finalize_at_target: false,
            past_target: ldpsyn::wire::PastTarget::Accept,
            retain_reports_days: None,
            target: Vec::new(),
            name: None,
            description: None,
            version: PROTOCOL_VERSION,
            id: Uuid::nil(),
            schema,
            epsilon: Epsilon::new(2.0).unwrap(),
            target_users: 1000,
            protocol: Protocol::Privincr(PrivIncrParams::default()),
        };
        let engine = Engine::new(&config).unwrap();
        let state = engine.initial_state();
        let h = CollectionHandle::new(config, engine, state.clone(), 1, Tables::new(), vec![]);
        (h, state)
    }

    /// The task sampler is built once per state, when the state becomes current: the same
    /// `Arc` while the state stands, a new one, drawing the new state's tasks, once the state
    /// is replaced; a snapshot that is no longer current gets its own.
    #[test]
    fn sampler_is_kept_per_state() {
        let (h, state) = handle();
        assert_eq!(h.sampler_builds(), 1, "built with the handle");
        let current = h.state();
        let (s1, t1) = (current.clone(), h.sampler(&current).unwrap());
        let (s2, t2) = (h.state(), h.sampler(&h.state()).unwrap());
        assert!(Arc::ptr_eq(&s1, &s2) && Arc::ptr_eq(&t1, &t2));
        let mut rng = <rand_chacha::ChaCha12Rng as rand::SeedableRng>::seed_from_u64(1);
        assert_eq!(t1.draw(&mut rng).factor, vec![0, 1]);

        let mut next = state;
        next.round += 1;
        h.set_state(next, 2);
        assert_eq!(h.sampler_builds(), 2, "built with the new state");
        let s3 = h.state();
        let t3 = h.sampler(&s3).unwrap();
        assert!(!Arc::ptr_eq(&t1, &t3));
        assert_eq!((s3.round, t3.draw(&mut rng).round), (1, 1));
        for _ in 0..100 {
            h.sampler(&h.state()).unwrap();
        }
        assert_eq!(h.sampler_builds(), 2, "task requests build none");
        // A request holding the old snapshot still draws the old state's tasks.
        assert_eq!(h.sampler(&s1).unwrap().draw(&mut rng).round, 0);
        assert_eq!(h.sampler_builds(), 3);
    }

    /// A refresh from a row read before this process stored version 2 (PostgreSQL's
    /// refresher racing a finalize or a round close here) leaves the handle as it is; a newer
    /// row replaces it.
    #[test]
    fn refresh_never_takes_the_state_back() {
        let (h, state) = handle();
        let mut next = state.clone();
        next.round += 1;
        h.set_state(next, 2);
        h.refresh(state.clone(), 1, vec![]);
        assert_eq!((h.state().round, h.state_version()), (1, 2));
        let mut newer = state;
        newer.round = 2;
        h.refresh(newer, 3, vec![]);
        assert_eq!((h.state().round, h.state_version()), (2, 3));
    }
}
