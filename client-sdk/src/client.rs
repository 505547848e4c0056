//! The native HTTP client (feature `http`): fetch a collection's public config, then for one
//! person's record fetch a task, randomize on the device, record the spend in the
//! [`BudgetLedger`], and post the report.
//!
//! The client trusts the server with nothing private: it refuses a config or task asking
//! more ε than the app accepts (or a task whose ε differs from the config's), validates and
//! encodes the record *before* fetching a task, and never randomizes twice for a collection
//! whatever the server answers (see [`crate::ledger`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), ldpsyn::client::ClientError> {
//! use ldpsyn::{Epsilon, client::{Client, ClientOptions}, ledger::FileLedger};
//! let collection = "c0ffee00-0000-4000-8000-000000000000".parse().unwrap();
//! let ledger = FileLedger::open("ldpsyn-ledger.json")?;
//! let options = ClientOptions::new(Epsilon::new(4.0).unwrap());
//! let mut client = Client::connect("http://127.0.0.1:8080", collection, options, ledger).await?;
//! let receipt = client.submit(&serde_json::json!({"age": 37, "sex": "Male"})).await?;
//! println!("report {} {:?}", receipt.report_id, receipt.status);
//! # Ok(()) }
//! ```

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

use crate::Epsilon;
use crate::ledger::{
    BudgetLedger, DeviceBudget, NextStep, next_step_within, remaining_budget_within,
};
use crate::schema::{EncodedRecord, Schema};
pub use crate::submission::{ClientError, Receipt, randomize_task};
use crate::submission::{
    SpendLimits, apply_answer, check_config, decision, pending_of, randomize_and_record,
    settle_upload,
};
use crate::upload::{Piece, published_limits, split_reports};
use crate::wire::{
    CollectionConfig, MAX_TASKS_PER_REQUEST, Problem, Report, ReportAnswer, Task, UploadLimits,
};

/// Client settings. [`ClientOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The largest ε per report the app accepts.
    pub max_epsilon: Epsilon,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
    /// Attempts per request on 5xx, 408, 429 and connection errors (≥ 1).
    pub max_attempts: u32,
    /// First retry delay; doubles each attempt up to `max_backoff` (jittered).
    pub initial_backoff: Duration,
    /// Largest retry delay.
    pub max_backoff: Duration,
    /// A device-wide ε cap over a rolling window, across every collection this ledger
    /// records (default [`DeviceBudget::DEFAULT`]: ε = 10 per 30 days): a collection whose ε
    /// would take the ε spent within the window above it is refused with
    /// [`ClientError::DeviceBudgetExhausted`] before its task is fetched, and again, under the
    /// ledger's lock, before randomizing. Give every client of one ledger the same budget.
    /// `None` removes the cap: only for a ledger that serves one collection (e.g. a simulated
    /// person).
    pub device_budget: Option<DeviceBudget>,
    /// Seed of the privacy RNG: only `ClientOptions::insecure_simulation` (cargo feature
    /// `insecure-simulation`) sets it. `None` (always, from [`ClientOptions::new`]) seeds
    /// ChaCha12 (`StdRng`, a CSPRNG) from the operating system.
    #[cfg(feature = "insecure-simulation")]
    seed: Option<u64>,
}

impl ClientOptions {
    /// Defaults: 10 s timeout, 5 attempts, backoff 100 ms doubling to 5 s, the device budget
    /// [`DeviceBudget::DEFAULT`], OS-seeded RNG.
    /// The privacy RNG cannot be seeded on options made here:
    ///
    /// ```compile_fail
    /// let mut o = ldpsyn::client::ClientOptions::new(ldpsyn::Epsilon::new(1.0).unwrap());
    /// o.seed = Some(1);
    /// ```
    ///
    /// and the default build has no seeded constructor at all (it needs the cargo feature
    /// `insecure-simulation`):
    ///
    #[cfg_attr(not(feature = "insecure-simulation"), doc = "```compile_fail")]
    #[cfg_attr(feature = "insecure-simulation", doc = "```")]
    /// let e = ldpsyn::Epsilon::new(1.0).unwrap();
    /// let o = ldpsyn::client::ClientOptions::insecure_simulation(e, 1);
    /// ```
    pub fn new(max_epsilon: Epsilon) -> Self {
        Self {
            max_epsilon,
            request_timeout: Duration::from_secs(10),
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            device_budget: Some(DeviceBudget::DEFAULT),
            #[cfg(feature = "insecure-simulation")]
            seed: None,
        }
    }

    /// **Not private**: the defaults with the privacy RNG (and the report ids drawn from it)
    /// seeded from `seed`, so anyone who knows the seed can undo the randomization. For
    /// simulations and tests that must reproduce their reports; never for real people. Only
    /// with the cargo feature `insecure-simulation` (off by default).
    #[cfg(feature = "insecure-simulation")]
    pub fn insecure_simulation(max_epsilon: Epsilon, seed: u64) -> Self {
        Self {
            seed: Some(seed),
            ..Self::new(max_epsilon)
        }
    }
}

/// One simulated person for [`Client::submit_batch`]: their record and their own ledger.
#[derive(Debug, Clone)]
pub struct SimulatedPerson<L> {
    /// The person's encoded record.
    pub record: EncodedRecord,
    /// The person's own budget ledger.
    pub ledger: L,
}

/// Simulated people's reports, randomized and recorded pending in their ledgers but not yet
/// posted ([`Client::prepare_batch`]; post them with [`Client::send_batch`]).
#[derive(Debug)]
pub struct PreparedBatch {
    /// People in the prepared slice.
    people: usize,
    /// Per person, an outcome known without posting (a refusal, an invalid record).
    results: Vec<Option<Result<Receipt, ClientError>>>,
    /// Per person to post: their index and report.
    outgoing: Vec<(usize, Report)>,
}

/// A client bound to one collection of one aggregator, with the device's ledger `L`.
pub struct Client<L> {
    http: reqwest::Client,
    base: String,
    config: CollectionConfig,
    upload_limits: UploadLimits,
    options: ClientOptions,
    ledger: L,
    rng: StdRng,
}

impl<L> std::fmt::Debug for Client<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("collection", &self.config.id)
            .finish_non_exhaustive()
    }
}

impl<L: BudgetLedger> Client<L> {
    /// Fetches the public config of `collection_id` from `base_url` and checks it: protocol
    /// version, and ε ≤ `options.max_epsilon`. The server's [`UploadLimits`] published with
    /// it size every upload of this client.
    ///
    /// Errors: [`ClientError::EpsilonTooLarge`], [`ClientError::Problem`] (e.g. unknown
    /// collection), [`ClientError::Unavailable`], [`ClientError::Protocol`].
    pub async fn connect(
        base_url: &str,
        collection_id: Uuid,
        options: ClientOptions,
        ledger: L,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(options.request_timeout)
            .build()
            .map_err(|e| ClientError::Protocol(format!("cannot build HTTP client: {e}")))?;
        #[cfg(feature = "insecure-simulation")]
        let rng = match options.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        #[cfg(not(feature = "insecure-simulation"))]
        let rng = StdRng::from_os_rng();
        let base = base_url.trim_end_matches('/').to_owned();
        let url = format!("{base}/v1/collections/{collection_id}");
        let (config, upload_limits) = fetch_config(&http, &options, &url).await?;
        check_config(&config, collection_id, options.max_epsilon)?;
        Ok(Self {
            http,
            base,
            config,
            upload_limits,
            options,
            ledger,
            rng,
        })
    }

    /// The collection's public config.
    pub fn config(&self) -> &CollectionConfig {
        &self.config
    }

    /// The server's upload limits, as published with the config (its defaults when the
    /// server published none).
    pub fn upload_limits(&self) -> &UploadLimits {
        &self.upload_limits
    }

    /// The collection's schema.
    pub fn schema(&self) -> &Schema {
        &self.config.schema
    }

    /// The device ledger.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// ε this device may still spend on the collection: the collection's ε before the first
    /// report if the device budget (if any) allows it now, else 0.
    pub fn remaining_budget(&self) -> Result<f64, ClientError> {
        Ok(remaining_budget_within(
            &self.ledger.entries()?,
            self.config.id,
            self.config.epsilon.get(),
            self.options.device_budget.as_ref(),
            now_unix_ms(),
        ))
    }

    fn limits(&self) -> SpendLimits {
        SpendLimits {
            max_epsilon: self.options.max_epsilon,
            device_budget: self.options.device_budget,
        }
    }

    /// The ledger's rule for this collection on `ledger`'s entries now.
    fn next_step<M: BudgetLedger + ?Sized>(&self, ledger: &M) -> Result<NextStep, ClientError> {
        Ok(next_step_within(
            &ledger.entries()?,
            self.config.id,
            self.config.epsilon.get(),
            self.options.device_budget.as_ref(),
            now_unix_ms(),
        ))
    }

    /// Submits one person's record given as a JSON object `{attribute: value}`.
    ///
    /// Encodes first (an invalid record fails with [`ClientError::Record`] before any
    /// request; under an attribute's `on_invalid: randomize` an invalid value is replaced by
    /// a uniform draw from the privacy RNG instead, see [`Schema::encode_json_with`]), then
    /// follows the ledger: resend a pending report, refuse when the budget is spent (this
    /// collection's, or the device's [`ClientOptions::device_budget`]), else fetch a task,
    /// check it, decide again and randomize and record under the ledger's lock, post. A
    /// report too large for the server's body limit is not posted
    /// ([`ClientError::ReportTooLarge`]; it stays pending).
    pub async fn submit(&mut self, record: &serde_json::Value) -> Result<Receipt, ClientError> {
        let encoded = self.config.schema.encode_json_with(record, &mut self.rng)?;
        self.submit_encoded(&encoded).await
    }

    /// As [`Client::submit`], for a record already encoded with this collection's schema
    /// (checked again here).
    pub async fn submit_encoded(&mut self, record: &EncodedRecord) -> Result<Receipt, ClientError> {
        let record = self.config.schema.encoded(record.codes().to_vec())?;
        let collection = self.config.id;
        let report = match decision(collection, self.next_step(&self.ledger)?)? {
            Some(report) => report,
            None => {
                let task = self
                    .fetch_tasks(1)
                    .await?
                    .pop()
                    .ok_or_else(|| ClientError::Protocol("the server sent no task".into()))?;
                // Decide again, randomize and record under the ledger's lock: another client
                // on the same ledger (another process on the same file) may have randomized
                // while the task was fetched; then its report is resent instead.
                let limits = self.limits();
                randomize_and_record(
                    &mut self.ledger,
                    &self.config,
                    &limits,
                    now_unix_ms(),
                    &task,
                    &record,
                    &mut self.rng,
                )?
            }
        };
        let body = match self.split(std::slice::from_ref(&report))?.pop() {
            Some(Piece::Body { body, .. }) => body,
            Some(Piece::TooLarge { bytes, .. }) => return Err(self.too_large(bytes)),
            None => return Err(ClientError::Protocol("no body for the report".into())),
        };
        let answer = self
            .post_reports(body)
            .await
            .and_then(|mut a| match a.len() {
                1 => Ok(a.remove(0)),
                _ => Err(ClientError::Protocol(
                    "answer does not match the report".into(),
                )),
            });
        settle_upload(&mut self.ledger, collection, report.id, answer)
    }

    /// Submits for many distinct simulated people at once (for simulations and load tests):
    /// [`Client::prepare_batch`] then [`Client::send_batch`]. Returns one result per person,
    /// in order.
    ///
    /// Errors of the whole call (the server unreachable, a problem answer to a task fetch)
    /// are returned as `Err`; people whose reports were already randomized keep them pending.
    pub async fn submit_batch<M: BudgetLedger>(
        &mut self,
        people: &mut [SimulatedPerson<M>],
    ) -> Result<Vec<Result<Receipt, ClientError>>, ClientError> {
        let prepared = self.prepare_batch(people).await?;
        self.send_batch(people, prepared).await
    }

    /// The first half of [`Client::submit_batch`]: tasks are fetched up to
    /// `MAX_TASKS_PER_REQUEST` at a time, and each person randomizes their own task and
    /// records the report pending in their own ledger. Nothing is posted: a simulation that
    /// must hand out tasks in a fixed order (a reproducible run) prepares batches one at a
    /// time and sends them concurrently.
    ///
    /// Errors: as [`Client::submit_batch`]'s task fetch; a ledger that cannot record.
    pub async fn prepare_batch<M: BudgetLedger>(
        &mut self,
        people: &mut [SimulatedPerson<M>],
    ) -> Result<PreparedBatch, ClientError> {
        let collection = self.config.id;
        let mut results: Vec<Option<Result<Receipt, ClientError>>> =
            (0..people.len()).map(|_| None).collect();
        let mut outgoing: Vec<(usize, Report)> = Vec::with_capacity(people.len());
        let mut need_task = Vec::new();
        for (i, person) in people.iter_mut().enumerate() {
            match self.config.schema.encoded(person.record.codes().to_vec()) {
                Err(e) => results[i] = Some(Err(e.into())),
                Ok(_) => match decision(collection, self.next_step(&person.ledger)?) {
                    Err(e) => results[i] = Some(Err(e)),
                    Ok(Some(r)) => outgoing.push((i, r)),
                    Ok(None) => need_task.push(i),
                },
            }
        }
        let limits = self.limits();
        for chunk in need_task.chunks(MAX_TASKS_PER_REQUEST) {
            let tasks = self.fetch_tasks(chunk.len()).await?;
            if tasks.len() != chunk.len() {
                return Err(ClientError::Protocol(format!(
                    "asked {} tasks, got {}",
                    chunk.len(),
                    tasks.len()
                )));
            }
            for (&i, task) in chunk.iter().zip(&tasks) {
                let person = &mut people[i];
                match randomize_and_record(
                    &mut person.ledger,
                    &self.config,
                    &limits,
                    now_unix_ms(),
                    task,
                    &person.record,
                    &mut self.rng,
                ) {
                    Ok(report) => outgoing.push((i, report)),
                    Err(ClientError::Ledger(e)) => return Err(e.into()),
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
        }
        Ok(PreparedBatch {
            people: people.len(),
            results,
            outgoing,
        })
    }

    /// The second half of [`Client::submit_batch`]: posts a [`PreparedBatch`] of `people`
    /// (the same slice it was prepared for) in uploads within the server's
    /// [`UploadLimits`] (at most its reports per upload and its body budget,
    /// [`crate::upload::split_reports`]) and settles each person's ledger with the answer to
    /// the upload that carried their report, upload after upload. Returns one result per
    /// person, in order; a person whose report cannot fit any upload gets
    /// [`ClientError::ReportTooLarge`] and keeps it pending.
    ///
    /// Errors: [`ClientError::Protocol`] when `people` is not the prepared slice's length or
    /// the server's answers do not match the reports; the server unreachable.
    pub async fn send_batch<M: BudgetLedger>(
        &mut self,
        people: &mut [SimulatedPerson<M>],
        batch: PreparedBatch,
    ) -> Result<Vec<Result<Receipt, ClientError>>, ClientError> {
        let collection = self.config.id;
        let PreparedBatch {
            people: len,
            mut results,
            outgoing,
        } = batch;
        if len != people.len() {
            return Err(ClientError::Protocol(format!(
                "a batch prepared for {len} people sent for {}",
                people.len()
            )));
        }
        let reports: Vec<&Report> = outgoing.iter().map(|(_, r)| r).collect();
        for piece in self.split(&reports)? {
            let (items, body) = match piece {
                Piece::Body { items, body } => (items, body),
                Piece::TooLarge { index, bytes } => {
                    results[outgoing[index].0] = Some(Err(self.too_large(bytes)));
                    continue;
                }
            };
            let chunk = &outgoing[items];
            let answers = self.post_reports(body).await?;
            if answers.len() != chunk.len() {
                return Err(ClientError::Protocol(
                    "one answer per report expected".into(),
                ));
            }
            for ((i, report), answer) in chunk.iter().zip(answers) {
                if answer.id != report.id {
                    return Err(ClientError::Protocol("answers out of order".into()));
                }
                let ledger = &mut people[*i].ledger;
                let mut entry = pending_of(ledger, collection, report.id)?;
                results[*i] = Some(apply_answer(collection, &mut entry, answer));
                ledger.put(collection, entry)?;
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ClientError::Protocol("no outcome".into()))))
            .collect())
    }

    /// **Not private**: restarts the privacy RNG (and the report ids drawn from it) from
    /// `seed`, so that a simulation whose batches may be prepared by any of several clients
    /// draws each batch's randomness from a seed of its own. Only with the cargo feature
    /// `insecure-simulation`.
    #[cfg(feature = "insecure-simulation")]
    pub fn reseed(&mut self, seed: u64) {
        self.rng = StdRng::seed_from_u64(seed);
    }

    async fn fetch_tasks(&mut self, count: usize) -> Result<Vec<Task>, ClientError> {
        let url = format!("{}/v1/collections/{}/task", self.base, self.config.id);
        if count == 1 {
            let task: Task = send_json(&self.http, &self.options, |h| h.get(&url)).await?;
            Ok(vec![task])
        } else {
            let count = count.to_string();
            send_json(&self.http, &self.options, |h| {
                h.get(&url).query(&[("count", count.as_str())])
            })
            .await
        }
    }

    /// `reports` cut into upload bodies within the server's limits.
    fn split<T: serde::Serialize>(&self, reports: &[T]) -> Result<Vec<Piece>, ClientError> {
        split_reports(reports, &self.upload_limits)
            .map_err(|e| ClientError::Protocol(format!("cannot serialize a report: {e}")))
    }

    fn too_large(&self, bytes: usize) -> ClientError {
        ClientError::ReportTooLarge {
            bytes: bytes as u64,
            max_body_bytes: self.upload_limits.max_body_bytes,
        }
    }

    /// Posts one upload body (a JSON array of reports, serialized once: every retry sends
    /// identical bytes).
    async fn post_reports(&mut self, body: Vec<u8>) -> Result<Vec<ReportAnswer>, ClientError> {
        let url = format!("{}/v1/collections/{}/reports", self.base, self.config.id);
        send_json(&self.http, &self.options, |h| {
            h.post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
        })
        .await
    }
}

/// The device clock, ms since the Unix epoch (0 for a clock set before 1970: every dated
/// entry then counts in the device budget's window).
fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Fetches a collection's public view at `url` (`…/v1/collections/{id}`): its config and the
/// server's upload limits ([`published_limits`]). Errors: as [`send_json`];
/// [`ClientError::Protocol`] for a view that is not a config.
pub(crate) async fn fetch_config(
    http: &reqwest::Client,
    options: &ClientOptions,
    url: &str,
) -> Result<(CollectionConfig, UploadLimits), ClientError> {
    let view: serde_json::Value = send_json(http, options, |h| h.get(url)).await?;
    let limits = published_limits(&view)
        .map_err(|e| ClientError::Protocol(format!("bad upload limits: {e}")))?;
    let config = serde_json::from_value(view)
        .map_err(|e| ClientError::Protocol(format!("bad collection config: {e}")))?;
    Ok((config, limits))
}

/// Sends a request with retries on connection errors, timeouts, 5xx, 408 and 429 (honouring
/// `Retry-After` seconds), and decodes a 2xx JSON body or a problem document.
pub(crate) async fn send_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    options: &ClientOptions,
    build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
) -> Result<T, ClientError> {
    let mut delay = options.initial_backoff;
    let attempts = options.max_attempts.max(1);
    let mut last_error = String::new();
    for attempt in 1..=attempts {
        let mut retry_after = None;
        match build(http).send().await {
            Ok(resp) => {
                let status = resp.status();
                if status.is_success() {
                    let bytes = resp
                        .bytes()
                        .await
                        .map_err(|e| ClientError::Protocol(e.to_string()))?;
                    return serde_json::from_slice(&bytes)
                        .map_err(|e| ClientError::Protocol(format!("bad JSON answer: {e}")));
                }
                retry_after = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let bytes = resp.bytes().await.unwrap_or_default();
                let problem = Problem::of_answer(status.as_u16(), &String::from_utf8_lossy(&bytes));
                if !(status.is_server_error() || matches!(status.as_u16(), 408 | 429)) {
                    return Err(ClientError::Problem(problem));
                }
                last_error = format!("HTTP {status}: {}", problem.detail);
            }
            Err(e) => last_error = e.to_string(),
        }
        if attempt < attempts {
            let jitter = rand::rng().random_range(0.5..1.0);
            let wait = retry_after
                .unwrap_or(delay.mul_f64(jitter))
                .min(options.max_backoff.max(delay));
            tracing::debug!(attempt, ?wait, %last_error, "retrying");
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(options.max_backoff);
        }
    }
    Err(ClientError::Unavailable {
        attempts,
        last_error,
    })
}
