//! # ldpsyn-service
//!
//! The aggregator service: HTTP API v1 over the estimation engine ([`ldpsyn_engine`]), durable
//! storage in SQLite or PostgreSQL, signed task tokens, group-committed ingestion and metrics.
//! What `ldpsyn-aggregator serve` runs; it does not depend on the simulator and evaluation
//! crate (`ldpsyn-sim`).
//!
//! - [`config`]: `serve` options (clap, every option also from the environment).
//! - [`storage`]: the database (sqlx `Any`, shared migrations) behind
//!   [`storage::Datastore::run_tx`] and typed transactions; the pool stays inside.
//! - [`tokens`]: HMAC-SHA256 task tokens.
//! - [`ingest`]: collections in memory and the group committer; [`ingest::Authority`] (memory
//!   or the database holds the truth) is chosen at startup.
//! - [`http`]: routes, handlers (one file per resource), extractors, layers ([`router`]).
//! - [`listener`]: the accept loop (header-read and idle timeouts, graceful shutdown).
//! - [`ui`]: the dashboard at `/ui/` (embedded static files).
//! - [`maintenance`]: the periodic retention sweep and finalize at target.
//! - [`provisional`]: estimates while collecting (the model refitted from the reports so
//!   far, cached per collection, off the ingest path).
//! - [`metrics`], [`ratelimit`], [`synthetic`].
//!
//! ```no_run
//! # async fn run() -> Result<(), ldpsyn_service::error::ApiError> {
//! use clap::Parser;
//! use ldpsyn_service::{Server, config::ServeConfig};
//! let config = ServeConfig::parse_from(["serve", "--bind", "127.0.0.1:0",
//!     "--database-url", "sqlite://ldpsyn.db", "--admin-token", "s3cret-admin-token"]);
//! let server = Server::start(config).await?;
//! println!("listening on {}", server.addr());
//! server.shutdown().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod api;
pub mod config;
pub mod error;
pub mod http;
pub mod ingest;
pub mod listener;
pub mod maintenance;
pub mod metrics;
pub mod openapi;
pub mod provisional;
pub mod ratelimit;
pub mod storage;
pub mod synthetic;
pub mod tokens;
pub mod ui;
pub mod vertical;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use ldpsyn::wire::CollectionConfig;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

pub use http::router;

use self::config::ServeConfig;
use self::error::ApiError;
use self::ingest::{Authority, CollectionHandle, Command, Store};
use self::metrics::Metrics;
use self::ratelimit::{InFlight, RateLimiter};
use self::storage::Datastore;
use self::tokens::TokenKey;
use ldpsyn_engine::{CollectionState, Engine, Phase, TaskSampler, TaskSpec};

/// Shared state of the HTTP handlers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    inner: Arc<Inner>,
}

/// The routes without an admin token that may cost a database query, each rate-limited per
/// client in a bucket of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitedRoute {
    /// `POST …/reports`.
    Reports,
    /// `GET …/task`.
    Task,
    /// `GET /v1/collections/{id}` and `GET /healthz` (PostgreSQL: an id new to this process
    /// is looked up in the database; `/healthz` pings it).
    Lookup,
    /// `POST …/parties/{party}/records` (the collection is looked up before the party's
    /// token is checked).
    PartyRecords,
}

/// How long an id the database did not know is answered `unknown-collection` without asking
/// again (PostgreSQL; SQLite never asks: its one process holds every collection). A
/// collection created with that id meanwhile is found sooner: registering it here (created
/// by this process, or loaded by the refresher from another's row, every
/// `--refresh-interval-ms`) drops the entry, and held collections are looked up first.
pub const NEGATIVE_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// Most remembered unknown ids: bounded memory against requests for random ids. When full,
/// expired entries are swept (at most once per [`NEGATIVE_TTL`], so a flood of new ids costs
/// no sweep per request); while still full, new ids are not remembered, so a flood cannot
/// evict the ids clients keep asking for (a deleted collection's). Random ids never repeat,
/// so remembering them would buy nothing: the per-IP rate limit bounds their lookups.
pub const MAX_NEGATIVE_ENTRIES: usize = 100_000;

#[derive(Debug)]
struct Inner {
    /// The datastore, and whether it or this process's memory holds the truth.
    store: Store,
    config: ServeConfig,
    admin_token_hash: [u8; 32],
    token_key: TokenKey,
    collections: DashMap<Uuid, Arc<CollectionHandle>>,
    /// Ids the database did not know, and when it said so ([`NEGATIVE_TTL`]).
    unknown: DashMap<Uuid, std::time::Instant>,
    /// When `unknown` was last swept of expired entries ([`MAX_NEGATIVE_ENTRIES`]).
    unknown_swept: std::sync::Mutex<std::time::Instant>,
    /// Stored collections this process could not load, with why (logged): answered
    /// `collection-unavailable` while the others are served; PostgreSQL retries them at
    /// every refresh.
    unavailable: DashMap<Uuid, String>,
    /// One loader per id new to this process; concurrent requests wait for it.
    loading: DashMap<Uuid, Arc<tokio::sync::Mutex<()>>>,
    committer: mpsc::Sender<Command>,
    metrics: Arc<Metrics>,
    upload_limiter: RateLimiter,
    task_limiter: RateLimiter,
    lookup_limiter: RateLimiter,
    party_limiter: RateLimiter,
    /// Requests in flight per client on the rate-limited routes.
    in_flight: InFlight,
    /// The task stream of [`ServeConfig::task_seed`] (`None`: each draw from the OS-seeded
    /// thread RNG).
    task_rng: Option<std::sync::Mutex<rand_chacha::ChaCha12Rng>>,
    /// Permits of the background refits ([`ServeConfig::refit_concurrency`]).
    refits: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// Connects to the database, runs migrations, loads the token key and every collection
    /// (rebuilding sufficient statistics from the stored reports) and starts the committer.
    /// Returns the state and the committer's join handle (it ends when every state clone is
    /// dropped).
    pub async fn open(
        config: ServeConfig,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), ApiError> {
        let db =
            Datastore::connect(config.database_url.expose(), config.db_max_connections).await?;
        // Chosen once, here: memory is the truth when this process is the database's one
        // writer (SQLite), the database when several processes share it (PostgreSQL).
        let store = Store {
            authority: Authority::for_datastore(&db),
            datastore: db,
        };
        let key = match &config.token_key {
            Some(k) => k.expose().as_bytes().to_vec(),
            None => {
                let mut fresh = [0u8; 32];
                rand::rng().fill_bytes(&mut fresh);
                store.datastore.token_key(&fresh).await?
            }
        };
        let token_key = TokenKey::new(key).map_err(|e| ApiError::Internal(e.to_string()))?;
        let admin_token_hash = Sha256::digest(config.admin_token.expose().as_bytes()).into();
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel(config.commit_queue_len.max(1));
        let committer = tokio::spawn(ingest::run_committer(
            store.clone(),
            metrics.clone(),
            rx,
            tx.downgrade(),
        ));
        let upload_limiter = RateLimiter::new(config.rate_limit_per_ip);
        let task_limiter = RateLimiter::new(config.rate_limit_per_ip);
        let lookup_limiter = RateLimiter::new(config.rate_limit_per_ip);
        let party_limiter = RateLimiter::new(config.rate_limit_per_ip);
        let in_flight = InFlight::new(config.max_in_flight_per_ip);
        let task_rng = config
            .task_seed
            .map(|s| std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(s)));
        let refits = config.refit_pool.clone().unwrap_or_else(|| {
            Arc::new(tokio::sync::Semaphore::new(
                config.refit_concurrency.max(1) as usize
            ))
        });
        let state = Self {
            inner: Arc::new(Inner {
                store,
                config,
                admin_token_hash,
                token_key,
                collections: DashMap::new(),
                unknown: DashMap::new(),
                unknown_swept: std::sync::Mutex::new(std::time::Instant::now()),
                unavailable: DashMap::new(),
                loading: DashMap::new(),
                committer: tx,
                metrics,
                upload_limiter,
                task_limiter,
                lookup_limiter,
                party_limiter,
                in_flight,
                task_rng,
                refits,
            }),
        };
        state.load_all().await?;
        Ok((state, committer))
    }

    async fn load_all(&self) -> Result<(), ApiError> {
        let started = std::time::Instant::now();
        let rows = self.inner.store.datastore.collections().await?;
        let n = rows.len();
        for row in rows {
            // One unreadable row must not keep the others from being served.
            let id = row.id;
            if let Err(e) = self.load_row(row).await {
                self.mark_unavailable(id, &e);
            }
        }
        tracing::info!(
            collections = n,
            unavailable = self.inner.unavailable.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "state rebuilt from the database"
        );
        Ok(())
    }

    async fn load_row(
        &self,
        row: storage::CollectionRow,
    ) -> Result<Arc<CollectionHandle>, ApiError> {
        let config: CollectionConfig = serde_json::from_str(&row.config)?;
        let state: CollectionState = serde_json::from_str(&row.state)?;
        let engine = Engine::new(&config)?;
        // Table counts (rebuilt once from the reports for a collection older than them).
        let db = &self.inner.store.datastore;
        let tables = db.rebuild_table_counts(&engine, row.id).await?;
        let counts = db.round_counts(row.id).await?;
        let finalized = state.phase == Phase::Finalized;
        let handle = Arc::new(CollectionHandle::new(
            config,
            engine,
            state,
            row.state_version,
            tables,
            counts,
        ));
        self.inner.collections.insert(row.id, handle.clone());
        self.inner.unknown.remove(&row.id);
        self.inner.unavailable.remove(&row.id);
        if finalized {
            // Served at once; the model follows in the background.
            self.queue_refit(&handle);
        }
        Ok(handle)
    }

    /// Refits the model of finalized collection `handle` in the background, on the bounded
    /// pool of [`ServeConfig::refit_concurrency`] fits, unless one is queued or running. The
    /// fit is deterministic given the finalized state and its tables: the same model as
    /// before a restart, also when the process stopped during the fit after committing the
    /// finalized state. A failure is logged and kept for the model routes; `POST …/finalize`
    /// fits again, as does a PostgreSQL refresh.
    fn queue_refit(&self, handle: &Arc<CollectionHandle>) {
        if handle.model().is_some() || !handle.claim_refit() {
            return;
        }
        let (app, handle) = (self.clone(), handle.clone());
        tokio::spawn(async move {
            let Ok(_permit) = app.inner.refits.clone().acquire_owned().await else {
                handle.end_refit();
                return;
            };
            let state = (*handle.state()).clone();
            if handle.model().is_some() || handle.is_deleted() || state.phase != Phase::Finalized {
                handle.end_refit();
                return;
            }
            let started = std::time::Instant::now();
            let fitted = async {
                let tables = app.inner.store.tables(&handle).await?;
                let uploads = app.inner.store.datastore.party_uploads(handle.id).await?;
                handle.ensure_model(state, tables, uploads).await?;
                Ok::<_, ApiError>(())
            }
            .await;
            match fitted {
                Ok(()) => {
                    tracing::info!(
                        collection = %handle.id,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "model refitted"
                    );
                    handle.end_refit();
                }
                Err(e) => {
                    tracing::error!(
                        collection = %handle.id,
                        error = %e,
                        "refitting the finalized model failed; its model routes say so and \
                         POST …/finalize fits again"
                    );
                    handle.set_fit_error(Some(e.to_string()));
                    handle.end_refit();
                }
            }
        });
    }

    /// Finalized collections in memory whose model is not built yet (being refitted, or
    /// whose refit failed).
    pub fn models_pending(&self) -> usize {
        self.inner
            .collections
            .iter()
            .filter(|h| h.model().is_none() && h.state().phase == Phase::Finalized)
            .count()
    }

    /// Records that collection `id` could not be loaded; logs the cause when it is new.
    fn mark_unavailable(&self, id: Uuid, e: &ApiError) {
        let reason = e.to_string();
        let new = self.inner.unavailable.get(&id).is_none_or(|r| *r != reason);
        if new {
            tracing::error!(
                collection = %id,
                error = %reason,
                "cannot load this collection; it is answered collection-unavailable, the \
                 others are served"
            );
        }
        self.inner.unavailable.insert(id, reason);
    }

    /// The answer for a stored collection this process could not load.
    fn unavailable_problem(id: Uuid) -> ApiError {
        ApiError::problem(
            ldpsyn::wire::ProblemType::CollectionUnavailable,
            format!(
                "collection {id} is stored but this server could not load it (its stored \
                 config or state is unreadable); the other collections are served. Ask the \
                 operator to check the server log for this id and repair the row; a PostgreSQL \
                 deployment picks the repair up on its next refresh, SQLite at restart"
            ),
        )
    }

    /// The database.
    pub fn db(&self) -> &Datastore {
        &self.inner.store.datastore
    }

    /// The database and the authority chosen over it at startup ([`Authority`]).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Draws `n` task specs from `sampler`: from the seeded stream of
    /// [`ServeConfig::task_seed`] when set, else from the OS-seeded thread RNG.
    pub(crate) fn draw_tasks(&self, sampler: &TaskSampler, n: usize) -> Vec<TaskSpec> {
        match &self.inner.task_rng {
            Some(rng) => {
                // A poisoned lock only means a panic elsewhere; the stream is still whole.
                let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
                (0..n).map(|_| sampler.draw(&mut *rng)).collect()
            }
            None => {
                let mut rng = rand::rng();
                (0..n).map(|_| sampler.draw(&mut rng)).collect()
            }
        }
    }

    /// The serve config.
    pub fn config(&self) -> &ServeConfig {
        &self.inner.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The token key.
    pub fn token_key(&self) -> &TokenKey {
        &self.inner.token_key
    }

    /// The per-client cap on requests in flight ([`ServeConfig::max_in_flight_per_ip`]).
    pub fn in_flight(&self) -> &InFlight {
        &self.inner.in_flight
    }

    /// The per-client limiter of `route` (each [`LimitedRoute`] has its own).
    pub fn limiter(&self, route: LimitedRoute) -> &RateLimiter {
        match route {
            LimitedRoute::Reports => &self.inner.upload_limiter,
            LimitedRoute::Task => &self.inner.task_limiter,
            LimitedRoute::Lookup => &self.inner.lookup_limiter,
            LimitedRoute::PartyRecords => &self.inner.party_limiter,
        }
    }

    /// Addresses of the reverse proxies whose forwarding headers are believed.
    pub fn trusted_proxies(&self) -> &[std::net::IpAddr] {
        &self.inner.config.trusted_proxies
    }

    /// Whether `presented` is the admin token (constant-time comparison of SHA-256 digests,
    /// so neither content nor length leaks through timing).
    pub fn is_admin(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let h: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        h.ct_eq(&self.inner.admin_token_hash).into()
    }

    /// A collection, loading it from the database if another process created it.
    pub async fn collection(&self, id: Uuid) -> Result<Arc<CollectionHandle>, ApiError> {
        if let Some(h) = self.inner.collections.get(&id) {
            return Ok(h.clone());
        }
        if self.inner.unavailable.contains_key(&id) {
            return Err(Self::unavailable_problem(id));
        }
        let unknown = || {
            Err(ApiError::problem(
                ldpsyn::wire::ProblemType::UnknownCollection,
                format!("no collection {id}"),
            ))
        };
        // Memory holds every collection when it is the truth.
        if self.inner.store.authority == Authority::Memory {
            return unknown();
        }
        // Another process may have created it: ask the database, unless it said no lately.
        if self.recently_unknown(id) {
            return unknown();
        }
        // Single flight: the first request loads (its table counts, or a rebuild from its
        // reports for a collection older than them); the others wait and find the handle.
        let gate = self.load_gate(id);
        let found = {
            let _turn = gate.lock().await;
            if let Some(h) = self.inner.collections.get(&id) {
                Ok(Some(Ok(h.clone())))
            } else if self.recently_unknown(id) {
                Ok(None)
            } else {
                self.inner.metrics.collection_lookup();
                match self.inner.store.datastore.collection(id).await {
                    Ok(Some(row)) => Ok(Some(self.load_row(row).await)),
                    Ok(None) => {
                        self.remember_unknown(id);
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            }
        };
        // On every path, so that ids asked for once leave no gate behind.
        self.inner
            .loading
            .remove_if(&id, |_, g| Arc::ptr_eq(g, &gate));
        match found? {
            Some(Ok(h)) => Ok(h),
            Some(Err(e)) => {
                self.mark_unavailable(id, &e);
                Err(Self::unavailable_problem(id))
            }
            None => unknown(),
        }
    }

    /// Remembers that the database does not know `id` ([`NEGATIVE_TTL`], bounded by
    /// [`MAX_NEGATIVE_ENTRIES`]).
    fn remember_unknown(&self, id: Uuid) {
        let unknown = &self.inner.unknown;
        if unknown.len() >= MAX_NEGATIVE_ENTRIES {
            // try_lock: a request that finds another sweeping does not wait for it.
            if let Ok(mut swept) = self.inner.unknown_swept.try_lock()
                && swept.elapsed() >= NEGATIVE_TTL
            {
                *swept = std::time::Instant::now();
                unknown.retain(|_, t| t.elapsed() < NEGATIVE_TTL);
            }
            if unknown.len() >= MAX_NEGATIVE_ENTRIES {
                return;
            }
        }
        unknown.insert(id, std::time::Instant::now());
    }

    /// Whether `id` is remembered as unknown to the database ([`NEGATIVE_TTL`]). Feature
    /// `test-util`.
    #[cfg(feature = "test-util")]
    pub fn is_remembered_unknown(&self, id: Uuid) -> bool {
        self.recently_unknown(id)
    }

    /// Every collection in memory, sorted by id.
    pub fn collections(&self) -> Vec<Arc<CollectionHandle>> {
        let mut v: Vec<_> = self
            .inner
            .collections
            .iter()
            .map(|e| e.value().clone())
            .collect();
        v.sort_by_key(|h| h.id);
        v
    }

    /// Registers a newly created collection (and forgets that its id was unknown).
    pub fn insert_collection(&self, handle: Arc<CollectionHandle>) {
        let id = handle.id;
        self.inner.collections.insert(id, handle);
        self.inner.unknown.remove(&id);
    }

    /// Deletes collection `id` through the committer ([`Command::Delete`]: every row of it in
    /// one transaction, after which reports still queued for it are refused), then forgets
    /// it here, so later requests answer `unknown-collection`. A stored collection this
    /// process could not load can be deleted too. Returns the reports (or vertical records)
    /// deleted. Errors: `unknown-collection`, the database's.
    pub async fn delete_collection(&self, id: Uuid) -> Result<u64, ApiError> {
        let handle = match self.collection(id).await {
            Ok(h) => Some(h),
            Err(_) if self.inner.unavailable.contains_key(&id) => None,
            Err(e) => return Err(e),
        };
        let r = self
            .ask(|reply| Command::Delete { id, handle, reply })
            .await;
        // Also when another process deleted it first (unknown-collection): forget it here.
        let gone = matches!(
            &r,
            Err(ApiError::Ingest(ingest::IngestError::Refused {
                kind: ldpsyn::wire::ProblemType::UnknownCollection,
                ..
            }))
        );
        if r.is_ok() || gone {
            self.forget(id);
        }
        r
    }

    /// Drops collection `id` from memory (its rows are gone).
    fn forget(&self, id: Uuid) {
        if let Some((_, h)) = self.inner.collections.remove(&id) {
            h.mark_deleted();
        }
        self.inner.unavailable.remove(&id);
        self.inner.loading.remove(&id);
    }

    /// Hands a command to the committer and waits for its answer. Errors: the committer
    /// stopped or dropped the command (500), or the command's own error.
    pub async fn ask<T, E>(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<T, E>>) -> Command,
    ) -> Result<T, ApiError>
    where
        ApiError: From<E>,
    {
        let (reply, answer) = oneshot::channel();
        self.inner
            .committer
            .send(command(reply))
            .await
            .map_err(|_| ApiError::Internal("committer stopped".into()))?;
        Ok(answer
            .await
            .map_err(|_| ApiError::Internal("the committer dropped the command".into()))??)
    }

    /// Whether the database said within [`NEGATIVE_TTL`] that it does not know `id`.
    fn recently_unknown(&self, id: Uuid) -> bool {
        self.inner
            .unknown
            .get(&id)
            .is_some_and(|t| t.elapsed() < NEGATIVE_TTL)
    }

    /// The lock that makes one task at a time load collection `id` into this process.
    fn load_gate(&self, id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
        self.inner.loading.entry(id).or_default().clone()
    }

    /// PostgreSQL: picks up other processes' collections, transitions, counts,
    /// finalizations and deletions.
    pub async fn refresh_from_db(&self) -> Result<(), ApiError> {
        let mut known = Vec::new();
        let mut finalized = Vec::new();
        let rows = self.inner.store.datastore.collections().await?;
        let stored: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.id).collect();
        for id in self.collections().iter().map(|h| h.id) {
            // Asked again: a collection created here after `rows` were read is not gone.
            if !stored.contains(&id) && self.inner.store.datastore.collection(id).await?.is_none() {
                tracing::info!(collection = %id, "collection deleted by another process");
                self.forget(id);
            }
        }
        for row in rows {
            let Some(handle) = self.inner.collections.get(&row.id).map(|h| h.clone()) else {
                let id = row.id;
                let gate = self.load_gate(id);
                let _turn = gate.lock().await;
                if !self.inner.collections.contains_key(&id)
                    && let Err(e) = self.load_row(row).await
                {
                    // Skipped (and retried next time); the others still refresh.
                    self.mark_unavailable(id, &e);
                }
                self.inner.loading.remove(&id);
                continue;
            };
            let state: CollectionState = match serde_json::from_str(&row.state) {
                Ok(s) => s,
                Err(e) => {
                    // This process keeps serving the state it last read; the others refresh.
                    tracing::warn!(
                        collection = %row.id,
                        error = %e,
                        "stored state unreadable; keeping this process's last state"
                    );
                    continue;
                }
            };
            if state.phase == Phase::Finalized && handle.model().is_none() {
                finalized.push(handle.clone());
            }
            known.push((handle, state, row.state_version));
        }
        self.ask(|reply| Command::Refresh {
            items: known,
            reply,
        })
        .await?;
        // After the refresh: each refit reads the finalized state it installed.
        for handle in finalized {
            self.queue_refit(&handle);
        }
        Ok(())
    }
}

/// A running server: its address and a way to stop it gracefully.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ApiError>>,
    state: AppState,
}

impl Server {
    /// Opens the state, binds `config.bind` and serves until [`Server::shutdown`].
    pub async fn start(config: ServeConfig) -> Result<Self, ApiError> {
        let (tx, rx) = oneshot::channel::<()>();
        Self::start_with_signal(
            config,
            async move {
                let _ = rx.await;
            },
            tx,
        )
        .await
    }

    async fn start_with_signal(
        config: ServeConfig,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
        shutdown: oneshot::Sender<()>,
    ) -> Result<Self, ApiError> {
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|e| ApiError::Internal(format!("cannot bind {}: {e}", config.bind)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        // The port answers at once: 503 `unavailable` (with /healthz) while the state loads,
        // then the API. Requests never hang on a process that is still starting.
        let ready: Arc<std::sync::OnceLock<axum::Router>> = Arc::new(std::sync::OnceLock::new());
        let gate = ready.clone();
        let app = axum::Router::new().fallback_service(tower::service_fn(
            move |req: axum::extract::Request| {
                let gate = gate.clone();
                async move {
                    use tower::ServiceExt as _;
                    match gate.get() {
                        Some(router) => router.clone().oneshot(req).await,
                        None => Ok(axum::response::IntoResponse::into_response(
                            ApiError::problem(
                                ldpsyn::wire::ProblemType::Unavailable,
                                "the aggregator is loading its state; retry shortly",
                            ),
                        )),
                    }
                }
            },
        ));
        let (signal_tx, signal_rx) = oneshot::channel::<()>();
        let timeouts = listener::ConnectionTimeouts {
            header_read: Duration::from_millis(config.header_read_timeout_ms.max(1)),
            idle: Duration::from_millis(config.idle_timeout_ms.max(1)),
        };
        let serving = tokio::spawn(listener::serve_connections(
            listener,
            app,
            timeouts,
            async move {
                let _ = signal_rx.await;
            },
        ));
        let (state, committer) = match AppState::open(config).await {
            Ok(opened) => opened,
            Err(e) => {
                let _ = signal_tx.send(());
                let _ = serving.await;
                return Err(e);
            }
        };
        let _ = ready.set(router(state.clone()));
        let refresher = spawn_refresher(state.clone());
        let upkeep = maintenance::spawn(
            state.clone(),
            Duration::from_secs(state.config().maintenance_interval_secs.max(1)),
        );
        let st = state.clone();
        let task = tokio::spawn(async move {
            signal.await;
            let _ = signal_tx.send(());
            serving
                .await
                .map_err(|e| ApiError::Internal(format!("server task: {e}")))?;
            if let Some(r) = refresher {
                r.abort();
            }
            upkeep.abort();
            // In-flight requests have been answered: their commits are done. Stop the
            // committer and close the pool.
            let db = st.db().clone();
            drop(st);
            let _ = tokio::time::timeout(Duration::from_secs(30), committer).await;
            db.close().await;
            Ok(())
        });
        tracing::info!(%addr, "listening");
        Ok(Self {
            addr,
            shutdown,
            task,
            state,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state (for tests: in-memory tables and states).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops accepting connections, finishes in-flight requests and commits, closes the
    /// database.
    pub async fn shutdown(self) -> Result<(), ApiError> {
        let Server {
            shutdown,
            task,
            state,
            ..
        } = self;
        drop(state);
        let _ = shutdown.send(());
        task.await
            .map_err(|e| ApiError::Internal(format!("server task: {e}")))?
    }
}

fn spawn_refresher(state: AppState) -> Option<tokio::task::JoinHandle<()>> {
    if state.store().authority == Authority::Memory {
        return None;
    }
    let period = Duration::from_millis(state.config().refresh_interval_ms.max(50));
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = state.refresh_from_db().await {
                tracing::warn!(error = %e, "refresh from the database failed");
            }
        }
    }))
}

/// Runs `serve` until SIGINT/SIGTERM, then shuts down gracefully.
pub async fn serve(config: ServeConfig) -> Result<(), ApiError> {
    let (tx, _rx) = oneshot::channel();
    let server = Server::start_with_signal(config, shutdown_signal(), tx).await?;
    // A wildcard bind (0.0.0.0, ::) is reachable on loopback from this machine.
    let mut shown = server.addr();
    if shown.ip().is_unspecified() {
        shown.set_ip(if shown.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    println!("dashboard: http://{shown}/ui/  (API: http://{shown}/v1/openapi.json)");
    let Server { task, state, .. } = server;
    drop(state);
    task.await
        .map_err(|e| ApiError::Internal(format!("server task: {e}")))?
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing in-flight requests and commits");
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
