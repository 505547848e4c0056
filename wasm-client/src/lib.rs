//! # ldpsyn-wasm — the ldpsyn client SDK for web pages
//!
//! A thin wasm-bindgen layer over [`ldpsyn`]: the schema encoding, the mechanisms, the
//! submission checks ([`ldpsyn::submission`]) and the ledger rules ([`ldpsyn::ledger`]) are
//! the native SDK's; this crate adds networking through the browser's `fetch`, a ledger in
//! `localStorage` (in memory under node) and randomness from the browser's CSPRNG
//! (`crypto.getRandomValues`, getrandom's `wasm_js` backend).
//!
//! ```js
//! import init, { LdpClient } from "ldpsyn-wasm";
//! await init();
//! const client = await LdpClient.connect("https://collector.example.org", collectionId, { maxEpsilon: 4 });
//! client.schema;                          // attributes and domains from the public config
//! const receipt = await client.submit({ age: 37, workclass: "Private" /* , … */ });
//! client.remainingBudget();               // ε left for this collection on this device
//! ```
//!
//! Errors are `LdpError`s (`instanceof Error`, `name === "LdpError"`) with `code`, the slug of
//! the shared problem type ([`ldpsyn::wire::ProblemType::slug`]), `detail` (the server's
//! detail for server problems) and, for server problems, `status`.
#![warn(missing_docs)]

pub mod http;
pub mod ledger;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use ldpsyn::Epsilon;
use ldpsyn::ledger::{
    BudgetLedger, DeviceBudget, ReportState, next_step_within, remaining_budget_within,
};
use ldpsyn::wire::{CollectionConfig, ProblemType, ReportAnswer, ReportStatus, Task};
use ldpsyn::submission::{
    ClientError, Receipt, SpendLimits, check_config, decision, randomize_and_record, settle_upload,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use wasm_bindgen::prelude::*;

use crate::http::{RetryPolicy, send_json};
use crate::ledger::{
    DeviceLedger, Environment, StorageChoice, choose_storage, lock_required, with_origin_lock,
};

#[wasm_bindgen(inline_js = r#"
export class LdpError extends Error {
  constructor(code, detail, message, status) {
    super(message);
    this.name = "LdpError";
    this.code = code;
    this.detail = detail;
    if (status !== undefined) this.status = status;
  }
}
export function makeLdpError(code, detail, message, status) {
  return new LdpError(code, detail, message, status);
}
"#)]
extern "C" {
    #[wasm_bindgen(js_name = makeLdpError)]
    fn make_ldp_error(code: &str, detail: &str, message: &str, status: Option<u16>) -> JsValue;
}

/// TypeScript declarations of the JS-side types (added to the generated `.d.ts`).
const TS_TYPES: &str = r#"
/** The shared problem types (`urn:ldpsyn:problem:<code>`), as `LdpError.code`. */
export type ProblemCode =
  | "malformed-request" | "invalid-parameter" | "invalid-schema" | "invalid-record"
  | "invalid-payload" | "invalid-token" | "token-expired" | "token-reused" | "unauthorized"
  | "unknown-collection" | "not-found" | "method-not-allowed" | "collection-finalized"
  | "collection-target-reached" | "model-not-ready"
  | "conflict" | "round-empty" | "record-id-conflict" | "payload-too-large" | "rate-limited" | "request-timeout" | "epsilon-too-large"
  | "budget-exhausted" | "ledger-unavailable" | "internal" | "unavailable"
  | "collection-unavailable";

/** What every promise of this package rejects with (`instanceof Error`). */
export interface LdpError extends Error {
  name: "LdpError";
  /** The shared problem type slug. */
  code: ProblemCode;
  /** What went wrong; for a server problem, the server's `detail`. */
  detail: string;
  /** HTTP status, for problems answered by the server. */
  status?: number;
}

/** Options of `LdpClient.connect`. */
export interface LdpClientOptions {
  /** The largest ε per report the app accepts; configs and tasks asking more are refused. */
  maxEpsilon: number;
  /**
   * Where the budget ledger lives (default `"auto"`): `localStorage`; in memory only under
   * node. In a browser whose `localStorage` is blocked, or without `navigator.locks` (pages
   * not served over https or from localhost), `"auto"` and `"localStorage"` reject with
   * `ledger-unavailable`. `"memory"` keeps the ledger in this page only: a reload forgets it
   * and may randomize the same record again for the same collection, so the server could
   * average the noise away. Ask for it only if the app ensures one submission per person.
   */
  storage?: "auto" | "localStorage" | "memory";
  /** Timeout of one request, ms (default 10000). */
  requestTimeoutMs?: number;
  /** Attempts per request on network errors, timeouts, 5xx, 408 and 429 (default 5). */
  maxAttempts?: number;
  /** First retry delay, ms, doubling (jittered) up to `maxBackoffMs` (default 100). */
  initialBackoffMs?: number;
  /** Largest retry delay, ms (default 5000). */
  maxBackoffMs?: number;
  /**
   * A cap on the ε this origin's ledger spends over every collection within a rolling window
   * (default `{ maxEpsilon: 10, windowMs: 30 days }`, the native SDK's
   * `DeviceBudget::DEFAULT`): a collection whose ε would take the ε spent within the last
   * `windowMs` above `maxEpsilon` is refused with `budget-exhausted`, before anything is
   * fetched, randomized or sent. Give every client of the origin the same cap.
   */
  deviceBudget?: { maxEpsilon: number; windowMs: number };
}

/** A record: attribute name → label (categorical), number (numeric), or null (missing). */
export type LdpRecord = Record<string, string | number | null>;

/** One attribute of a collection's schema. */
export type LdpAttribute = {
  name: string;
  missing?: "reject" | "category";
  missing_markers?: string[];
  /** A value the attribute cannot encode: refuse the record (default), or replace it on the device by a uniformly drawn code before randomizing, so every device reports. */
  on_invalid?: "reject" | "randomize";
} & (
  | { type: "categorical"; labels: string[] }
  | { type: "numeric"; min: number; max: number; bins: number | "auto"; grid?: number; max_bins?: number; integer?: boolean; out_of_range?: "reject" | "clamp"; points?: number[] }
);

/** A collection's schema. */
export interface LdpSchema { attributes: LdpAttribute[] }

/** The outcome of a successful `submit`. */
export interface Receipt {
  collectionId: string;
  reportId: string;
  /** `"duplicate"` when a resend found the report already committed; it counts once. */
  status: "accepted" | "duplicate";
  /** ε spent on this report. */
  epsilonSpent: number;
}

/** What the device ledger holds for the collection. */
export interface LedgerState {
  state: "pending" | "acknowledged" | "refused";
  epsilonSpent: number;
  reportId: string;
}
"#;

#[wasm_bindgen(typescript_custom_section)]
const TS_SECTION: &'static str = TS_TYPES;

/// Builds the JS `LdpError`.
fn js_error(code: ProblemType, detail: &str, message: &str, status: Option<u16>) -> JsValue {
    make_ldp_error(code.slug(), detail, message, status)
}

/// The JS `LdpError` of a client error: `code` from [`ClientError::problem_type`].
fn client_error(e: &ClientError) -> JsValue {
    match e {
        ClientError::Problem(p) => {
            js_error(p.problem_type, &p.detail, &e.to_string(), Some(p.status))
        }
        other => {
            let message = other.to_string();
            js_error(other.problem_type(), &message, &message, None)
        }
    }
}

/// An `LdpError` raised on the device (no HTTP status).
pub(crate) fn usage_error(code: ProblemType, detail: impl Into<String>) -> JsValue {
    let detail = detail.into();
    js_error(code, &detail, &detail, None)
}

/// A readable text for a thrown JS value (an `Error`'s message, or its string form).
pub(crate) fn describe_js_error(e: &JsValue) -> String {
    if let Some(err) = e.dyn_ref::<js_sys::Error>() {
        let name: String = err.name().into();
        let message: String = err.message().into();
        return format!("{name}: {message}");
    }
    e.as_string().unwrap_or_else(|| format!("{e:?}"))
}

/// A JS value through `JSON.stringify` into serde (numbers, strings, null, objects).
fn from_js<T: serde::de::DeserializeOwned>(v: &JsValue) -> Result<T, String> {
    let text = js_sys::JSON::stringify(v)
        .map_err(|e| describe_js_error(&e))?
        .as_string()
        .ok_or("not JSON-serializable")?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// A serde value into a plain JS value through `JSON.parse`.
fn to_js<T: Serialize>(v: &T) -> JsValue {
    // Serializing plain data (strings, numbers, maps with string keys) cannot fail, and its
    // output is valid JSON.
    let text = serde_json::to_string(v).expect("plain data serializes");
    js_sys::JSON::parse(&text).expect("serde_json writes valid JSON")
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsOptions {
    max_epsilon: f64,
    #[serde(default)]
    storage: Option<String>,
    #[serde(default)]
    request_timeout_ms: Option<u32>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    initial_backoff_ms: Option<u32>,
    #[serde(default)]
    max_backoff_ms: Option<u32>,
    #[serde(default)]
    device_budget: Option<JsDeviceBudget>,
}

/// `options.deviceBudget`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsDeviceBudget {
    max_epsilon: f64,
    window_ms: f64,
}

/// The browser's clock, ms since the Unix epoch.
fn now_unix_ms() -> u64 {
    // `Date.now()` is a whole, non-negative number of ms (`as` saturates).
    js_sys::Date::now() as u64
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsReceipt {
    collection_id: Uuid,
    report_id: Uuid,
    status: ReportStatus,
    epsilon_spent: f64,
}

impl From<Receipt> for JsReceipt {
    fn from(r: Receipt) -> Self {
        Self {
            collection_id: r.collection_id,
            report_id: r.report_id,
            status: r.status,
            epsilon_spent: r.epsilon_spent,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsLedgerState {
    state: ReportState,
    epsilon_spent: f64,
    report_id: Uuid,
}

thread_local! {
    /// Collections with a `submit` under way in this WASM instance: a second one would read
    /// the ledger before the first recorded its report and randomize twice.
    static IN_FLIGHT: RefCell<BTreeSet<Uuid>> = const { RefCell::new(BTreeSet::new()) };
}

/// Marks a collection busy until dropped.
struct InFlight(Uuid);

impl InFlight {
    fn take(collection: Uuid) -> Option<Self> {
        IN_FLIGHT
            .with(|s| s.borrow_mut().insert(collection))
            .then_some(InFlight(collection))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.with(|s| s.borrow_mut().remove(&self.0));
    }
}

struct Inner {
    base: String,
    config: CollectionConfig,
    limits: SpendLimits,
    policy: RetryPolicy,
    ledger: DeviceLedger,
    /// Privacy randomness and backoff jitter: ChaCha12 seeded from `crypto.getRandomValues`.
    rng: StdRng,
}

/// A connection to one collection of an ldpsyn aggregator.
#[wasm_bindgen]
pub struct LdpClient {
    // `Rc<RefCell<…>>` so a pending `submit` promise keeps the state alive; no borrow is
    // held across an `await`.
    inner: Rc<RefCell<Inner>>,
}

#[wasm_bindgen]
impl LdpClient {
    /// Fetches the public config of `collectionId` from `baseUrl` and checks it (protocol
    /// version, ε ≤ `options.maxEpsilon`). Rejects with an `LdpError`: `epsilon-too-large`,
    /// `unknown-collection`, `unavailable`, `invalid-parameter` (bad options),
    /// `ledger-unavailable` (no ledger that outlives the page: `options.storage`), …
    #[wasm_bindgen(
        unchecked_return_type = "Promise<LdpClient>",
        js_name = connect
    )]
    pub fn connect(
        #[wasm_bindgen(js_name = baseUrl)] base_url: String,
        #[wasm_bindgen(js_name = collectionId)] collection_id: String,
        #[wasm_bindgen(unchecked_param_type = "LdpClientOptions")] options: JsValue,
    ) -> js_sys::Promise {
        wasm_bindgen_futures::future_to_promise(async move {
            Self::open(base_url, collection_id, options)
                .await
                .map(JsValue::from)
        })
    }

    /// The collection's schema (attributes and domains), from its public config.
    #[wasm_bindgen(getter, unchecked_return_type = "LdpSchema")]
    pub fn schema(&self) -> JsValue {
        to_js(&self.inner.borrow().config.schema)
    }

    /// The collection's whole public config (schema, `epsilon`, `protocol`, …), snake_case
    /// as on the wire.
    #[wasm_bindgen(getter, unchecked_return_type = "Record<string, unknown>")]
    pub fn config(&self) -> JsValue {
        to_js(&self.inner.borrow().config)
    }

    /// The collection id.
    #[wasm_bindgen(getter, js_name = collectionId)]
    pub fn collection_id(&self) -> String {
        self.inner.borrow().config.id.to_string()
    }

    /// ε of every report of the collection.
    #[wasm_bindgen(getter)]
    pub fn epsilon(&self) -> f64 {
        self.inner.borrow().config.epsilon.get()
    }

    /// Where the ledger lives: `"localStorage"` or `"memory"`.
    #[wasm_bindgen(getter)]
    pub fn storage(&self) -> String {
        self.inner.borrow().ledger.storage().name().to_owned()
    }

    /// ε this device may still spend on the collection: the collection's ε before the first
    /// report if the device budget (`options.deviceBudget`, or the default cap) allows it
    /// now, else 0. Throws an `LdpError`
    /// (`internal`) if the ledger cannot be read.
    #[wasm_bindgen(js_name = remainingBudget)]
    pub fn remaining_budget(&self) -> Result<f64, JsValue> {
        let inner = self.inner.borrow();
        let entries = inner
            .ledger
            .entries()
            .map_err(|e| client_error(&e.into()))?;
        Ok(remaining_budget_within(
            &entries,
            inner.config.id,
            inner.config.epsilon.get(),
            inner.limits.device_budget.as_ref(),
            now_unix_ms(),
        ))
    }

    /// What the device ledger holds for the collection, or `null` before the first report.
    #[wasm_bindgen(js_name = ledgerState, unchecked_return_type = "LedgerState | null")]
    pub fn ledger_state(&self) -> Result<JsValue, JsValue> {
        let inner = self.inner.borrow();
        let entry = inner
            .ledger
            .get(inner.config.id)
            .map_err(|e| client_error(&e.into()))?;
        Ok(match entry {
            None => JsValue::NULL,
            Some(e) => to_js(&JsLedgerState {
                state: e.state,
                epsilon_spent: e.epsilon_spent,
                report_id: e.report.id,
            }),
        })
    }

    /// Submits one person's record `{attribute: value}`: validates and encodes it first (an
    /// invalid record rejects with `invalid-record` before any request; under an attribute's
    /// `on_invalid: "randomize"` an invalid value is replaced by a uniform draw from the
    /// browser's CSPRNG instead), then follows the ledger: resend a pending report byte for
    /// byte, refuse once the budget is spent (`budget-exhausted`: this collection's, or the
    /// origin's device budget, `options.deviceBudget` or the default), else fetch a task, check it, decide again, randomize
    /// and record the report in one ledger step, and post it. Resolves to a `Receipt`.
    #[wasm_bindgen(unchecked_return_type = "Promise<Receipt>")]
    pub fn submit(
        &self,
        #[wasm_bindgen(unchecked_param_type = "LdpRecord")] record: JsValue,
    ) -> js_sys::Promise {
        let inner = Rc::clone(&self.inner);
        wasm_bindgen_futures::future_to_promise(async move {
            match submit(&inner, &record).await {
                Ok(receipt) => Ok(to_js(&JsReceipt::from(receipt))),
                Err(Failure::Client(e)) => Err(client_error(&e)),
                Err(Failure::Js(v)) => Err(v),
            }
        })
    }
}

impl LdpClient {
    /// [`LdpClient::connect`] for Rust callers (and the tests): the client itself, or the JS
    /// `LdpError` to throw.
    pub async fn open(
        base_url: String,
        collection_id: String,
        options: JsValue,
    ) -> Result<LdpClient, JsValue> {
        let invalid = |d: String| usage_error(ProblemType::InvalidParameter, d);
        let collection: Uuid = collection_id
            .trim()
            .parse()
            .map_err(|e| invalid(format!("collectionId is not a UUID: {e}")))?;
        let options = if options.is_undefined() || options.is_null() {
            js_sys::Object::new().into()
        } else {
            options
        };
        let opts: JsOptions = from_js(&options).map_err(|e| invalid(format!("options: {e}")))?;
        let max_epsilon = Epsilon::new(opts.max_epsilon)
            .map_err(|e| invalid(format!("options.maxEpsilon: {e}")))?;
        let device_budget = match opts.device_budget {
            // On by default: a server cannot steer the page into collecting N·ε.
            None => Some(DeviceBudget::DEFAULT),
            Some(b) if !(b.window_ms.is_finite() && b.window_ms >= 1.0) => {
                return Err(invalid(format!(
                    "options.deviceBudget.windowMs: must be at least 1, got {}",
                    b.window_ms
                )));
            }
            Some(b) => Some(
                // `as` saturates; the window is ≥ 1 ms here.
                DeviceBudget::new(b.max_epsilon, Duration::from_millis(b.window_ms as u64))
                    .map_err(|e| invalid(format!("options.deviceBudget: {e}")))?,
            ),
        };
        let choice = StorageChoice::parse(opts.storage.as_deref())
            .map_err(|e| invalid(format!("options.storage: {e}")))?;
        // Fails closed: no silent in-memory ledger in a browser, no localStorage ledger
        // without the origin's lock.
        let storage = choose_storage(choice, Environment::probe())
            .map_err(|e| usage_error(ProblemType::LedgerUnavailable, e.to_string()))?;
        let ledger = DeviceLedger::new(storage).map_err(|e| client_error(&e.into()))?;
        let defaults = RetryPolicy::default();
        let policy = RetryPolicy {
            request_timeout_ms: opts
                .request_timeout_ms
                .unwrap_or(defaults.request_timeout_ms),
            max_attempts: opts.max_attempts.unwrap_or(defaults.max_attempts).max(1),
            initial_backoff_ms: opts
                .initial_backoff_ms
                .unwrap_or(defaults.initial_backoff_ms),
            max_backoff_ms: opts.max_backoff_ms.unwrap_or(defaults.max_backoff_ms),
        };
        let mut rng = StdRng::from_os_rng();
        let base = base_url.trim_end_matches('/').to_owned();
        let url = format!("{base}/v1/collections/{collection}");
        let config: CollectionConfig = send_json(&url, "GET", None, policy, &mut rng)
            .await
            .map_err(|e| client_error(&e))?;
        check_config(&config, collection, max_epsilon).map_err(|e| client_error(&e))?;
        Ok(LdpClient {
            inner: Rc::new(RefCell::new(Inner {
                base,
                config,
                limits: SpendLimits {
                    max_epsilon,
                    device_budget,
                },
                policy,
                ledger,
                rng,
            })),
        })
    }
}

enum Failure {
    Client(ClientError),
    Js(JsValue),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Client(e)
    }
}

impl From<ldpsyn::ledger::LedgerError> for Failure {
    fn from(e: ldpsyn::ledger::LedgerError) -> Self {
        Failure::Client(e.into())
    }
}

/// The native client's `submit` (ldpsyn `client.rs`), over `fetch` and the device ledger.
async fn submit(inner: &Rc<RefCell<Inner>>, record: &JsValue) -> Result<Receipt, Failure> {
    let record_json: serde_json::Value = from_js(record).map_err(|e| {
        Failure::Js(usage_error(
            ProblemType::InvalidRecord,
            format!("record: {e}"),
        ))
    })?;
    let (collection, base, policy, encoded, storage) = {
        let mut i = inner.borrow_mut();
        let i = &mut *i;
        // Under `on_invalid: randomize` an invalid value is drawn from the privacy RNG here,
        // as in the native client.
        let encoded = i
            .config
            .schema
            .encode_json_with(&record_json, &mut i.rng)
            .map_err(ClientError::from)?;
        (
            i.config.id,
            i.base.clone(),
            i.policy,
            encoded,
            i.ledger.storage(),
        )
    };
    let _busy = InFlight::take(collection).ok_or_else(|| {
        Failure::Js(usage_error(
            ProblemType::Conflict,
            "a submission for this collection is already under way",
        ))
    })?;
    // The whole submission under the origin's lock: another page of this origin (sharing
    // localStorage) decides only once this one's report is recorded, sent and settled.
    let inner = Rc::clone(inner);
    with_origin_lock(lock_required(storage), move || async move {
        submit_locked(&inner, collection, &base, policy, &encoded).await
    })
    .await
    .map_err(Failure::Js)?
}

/// [`submit`] once the origin's lock is held: decide from the ledger (refused here, before
/// any request, when this collection's budget or the device's is spent), fetch a task,
/// randomize and record in one ledger step, upload, settle.
async fn submit_locked(
    inner: &Rc<RefCell<Inner>>,
    collection: Uuid,
    base: &str,
    policy: RetryPolicy,
    encoded: &ldpsyn::schema::EncodedRecord,
) -> Result<Receipt, Failure> {
    let step = {
        let i = inner.borrow();
        next_step_within(
            &i.ledger.entries()?,
            collection,
            i.config.epsilon.get(),
            i.limits.device_budget.as_ref(),
            now_unix_ms(),
        )
    };
    let report = match decision(collection, step)? {
        Some(report) => report,
        None => {
            let url = format!("{base}/v1/collections/{collection}/task");
            let mut rng = StdRng::from_os_rng(); // backoff jitter only
            let task: Task = send_json(&url, "GET", None, policy, &mut rng).await?;
            // Decided again on fresh entries, randomized and recorded in one ledger step.
            let mut i = inner.borrow_mut();
            let i = &mut *i;
            randomize_and_record(
                &mut i.ledger,
                &i.config,
                &i.limits,
                now_unix_ms(),
                &task,
                encoded,
                &mut i.rng,
            )?
        }
    };
    let url = format!("{base}/v1/collections/{collection}/reports");
    // Serialized once: every retry sends identical bytes.
    let body = serde_json::to_string(std::slice::from_ref(&report))
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    let mut rng = StdRng::from_os_rng();
    let answers: Result<Vec<ReportAnswer>, ClientError> =
        send_json(&url, "POST", Some(&body), policy, &mut rng).await;
    let answer = answers.and_then(|mut a| match a.len() {
        1 => Ok(a.remove(0)),
        _ => Err(ClientError::Protocol(
            "answer does not match the report".into(),
        )),
    });
    let mut i = inner.borrow_mut();
    Ok(settle_upload(&mut i.ledger, collection, report.id, answer)?)
}

/// The problem codes of the TypeScript `ProblemCode` type, for the test that keeps it equal to
/// [`ProblemType::ALL`].
#[doc(hidden)]
pub fn typescript_problem_codes() -> Vec<String> {
    let start = TS_TYPES.find("export type ProblemCode =").unwrap_or(0);
    let end = start + TS_TYPES[start..].find(';').unwrap_or(0);
    TS_TYPES[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}
