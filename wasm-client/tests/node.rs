//! wasm-bindgen tests, run under node by `wasm-bindgen-test-runner` (`cargo test` in this
//! folder, see `test.sh`): the browser CSPRNG behind the mechanisms, the ledger rules through
//! the JS API against a scripted `fetch`, and ε above `maxEpsilon` refused.

use js_sys::Reflect;
use ldpsyn::Epsilon;
use ldpsyn::ledger::{BudgetLedger, LedgerEntry, ReportState};
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use ldpsyn::wire::{Payload, ProblemType, Report};
use ldpsyn_wasm::LdpClient;
use ldpsyn_wasm::ledger::{DeviceLedger, Storage};
use rand::SeedableRng;
use rand::rngs::StdRng;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

// A scripted global `fetch`: answers the config, tasks and report uploads of one collection
// from a plan, and logs every request.
#[wasm_bindgen(inline_js = r#"
let plan = null;
let log = [];
export function installMock(planJson) {
  plan = JSON.parse(planJson);
  log = [];
  globalThis.fetch = async (url, init) => {
    const method = (init && init.method) || "GET";
    const body = init && init.body !== undefined ? String(init.body) : null;
    log.push({ method, url: String(url), body });
    const path = new URL(String(url)).pathname;
    const json = (status, value, headers = {}) => new Response(JSON.stringify(value),
      { status, headers: { "content-type": "application/json", ...headers } });
    if (method === "GET" && path === `/v1/collections/${plan.config.id}`) return json(200, plan.config);
    if (method === "GET" && path === `/v1/collections/${plan.config.id}/task`) return json(200, plan.task);
    if (method === "POST" && path === `/v1/collections/${plan.config.id}/reports`) {
      const next = plan.posts.length > 1 ? plan.posts.shift() : plan.posts[0];
      if (next.network) throw new TypeError("fetch failed");
      if (next.status !== 200) return json(next.status, next.body || {}, next.headers || {});
      const reports = JSON.parse(body);
      return json(200, reports.map((r) => next.answer === "rejected"
        ? { id: r.id, status: "rejected", problem: { type: "urn:ldpsyn:problem:invalid-token",
            title: "Invalid task token", status: 400, detail: "bad signature" } }
        : { id: r.id, status: next.answer || "accepted" }));
    }
    return json(404, { type: "urn:ldpsyn:problem:unknown-collection", title: "Unknown collection",
      status: 404, detail: "no such collection" });
  };
}
export function mockLog() { return JSON.stringify(log); }
// Pretend to be a browser page (a `document` global) without localStorage, or undo it.
export function setBrowserMarker(on) {
  if (on) globalThis.document = {}; else delete globalThis.document;
}
// Replace `navigator` by one without `locks` (a page over plain http), or restore it.
let savedNavigator = null;
export function hideWebLocks(on) {
  if (on) {
    savedNavigator = Object.getOwnPropertyDescriptor(globalThis, "navigator") || null;
    Object.defineProperty(globalThis, "navigator", { value: {}, configurable: true, writable: true });
  } else if (savedNavigator) {
    Object.defineProperty(globalThis, "navigator", savedNavigator);
  } else {
    delete globalThis.navigator;
  }
}
"#)]
extern "C" {
    #[wasm_bindgen(js_name = installMock)]
    fn install_mock(plan_json: &str);
    #[wasm_bindgen(js_name = mockLog)]
    fn mock_log() -> String;
    #[wasm_bindgen(js_name = setBrowserMarker)]
    fn set_browser_marker(on: bool);
    #[wasm_bindgen(js_name = hideWebLocks)]
    fn hide_web_locks(on: bool);
}

const BASE: &str = "http://collector.test";

fn schema() -> serde_json::Value {
    serde_json::json!({"attributes": [
        {"name": "age", "type": "numeric", "min": 17, "max": 90, "bins": 16, "integer": true},
        {"name": "sex", "type": "categorical", "labels": ["Female", "Male"]},
        {"name": "workclass", "type": "categorical",
         "labels": ["Private", "Self-emp-not-inc", "Federal-gov"]}
    ]})
}

struct Plan {
    id: String,
    schema: serde_json::Value,
    config_epsilon: f64,
    task_epsilon: f64,
    posts: serde_json::Value,
}

impl Plan {
    fn new(posts: serde_json::Value) -> Self {
        Plan {
            id: uuid::Builder::from_random_bytes(rand::random())
                .into_uuid()
                .to_string(),
            schema: schema(),
            config_epsilon: 2.0,
            task_epsilon: 2.0,
            posts,
        }
    }
    fn install(&self) {
        let plan = serde_json::json!({
            "config": {"version": 1, "id": self.id, "schema": self.schema, "epsilon": self.config_epsilon,
                       "target_users": 1000, "protocol": "privincr"},
            "task": {"collection_id": self.id, "round": 0, "factor": [0, 2], "mechanism": "oue",
                     "epsilon": self.task_epsilon, "token": "tok-1", "expires_at": 4102444800_i64},
            "posts": self.posts,
        });
        install_mock(&plan.to_string());
    }
}

fn log() -> Vec<serde_json::Value> {
    serde_json::from_str(&mock_log()).unwrap()
}

/// Options of most tests: a memory ledger (shared by every test of this instance) and a device
/// budget too large to trip over what earlier tests spent.
fn options(max_epsilon: f64) -> JsValue {
    js_sys::JSON::parse(&format!(
        r#"{{"maxEpsilon": {max_epsilon}, "storage": "memory", "maxAttempts": 3,
            "initialBackoffMs": 1, "maxBackoffMs": 5,
            "deviceBudget": {{"maxEpsilon": 1e9, "windowMs": 86400000}}}}"#
    ))
    .unwrap()
}

async fn connect(plan: &Plan, max_epsilon: f64) -> Result<LdpClient, JsValue> {
    LdpClient::open(BASE.into(), plan.id.clone(), options(max_epsilon)).await
}

fn record() -> JsValue {
    js_sys::JSON::parse(r#"{"age": 37, "sex": "Male", "workclass": "Private"}"#).unwrap()
}

async fn submit(client: &LdpClient, record: JsValue) -> Result<serde_json::Value, JsValue> {
    let v = JsFuture::from(client.submit(record)).await?;
    Ok(serde_json::from_str(&js_sys::JSON::stringify(&v).unwrap().as_string().unwrap()).unwrap())
}

fn code(err: &JsValue) -> String {
    assert!(err.is_instance_of::<js_sys::Error>(), "an Error: {err:?}");
    assert_eq!(
        Reflect::get(err, &"name".into())
            .unwrap()
            .as_string()
            .as_deref(),
        Some("LdpError")
    );
    Reflect::get(err, &"code".into())
        .unwrap()
        .as_string()
        .unwrap()
}

fn requests(method: &str, suffix: &str) -> Vec<serde_json::Value> {
    log()
        .into_iter()
        .filter(|r| r["method"] == method && r["url"].as_str().unwrap().ends_with(suffix))
        .collect()
}

#[wasm_bindgen_test]
fn grr_keep_rate_with_the_browser_csprng() {
    // Mechanism sanity with the OS (crypto.getRandomValues) RNG: the true value is kept with
    // p = e^ε/(e^ε + k − 1). Bound at 6 standard deviations (false alarm ≈ 2e-9).
    let mut rng = StdRng::from_os_rng();
    let (k, eps, n) = (5usize, 1.0f64, 20_000u32);
    let m = Mechanism::new(MechanismKind::Grr, Epsilon::new(eps).unwrap(), &[k]).unwrap();
    let mut kept = 0u32;
    for _ in 0..n {
        match m.randomize(&[3], &mut rng).unwrap() {
            Payload::Grr(3) => kept += 1,
            Payload::Grr(v) => assert!(v < k as u64),
            other => panic!("{other:?}"),
        }
    }
    let p = eps.exp() / (eps.exp() + k as f64 - 1.0);
    let sd = (p * (1.0 - p) / f64::from(n)).sqrt();
    let rate = f64::from(kept) / f64::from(n);
    assert!(
        (rate - p).abs() < 6.0 * sd,
        "keep rate {rate}, expected {p}"
    );
    // Two OS-seeded generators differ (the CSPRNG is really used).
    let a: u64 = rand::Rng::random(&mut StdRng::from_os_rng());
    let b: u64 = rand::Rng::random(&mut StdRng::from_os_rng());
    assert_ne!(a, b);
}

/// A balance column on an asinh scale encodes to the codes the native SDK pins
/// (`asinh_scale_spreads_a_heavy_tailed_range` in `client-sdk/src/schema.rs`): wasm's `asinh`
/// (from its own math library) puts these values in the same cells.
#[wasm_bindgen_test]
fn asinh_codes_match_the_native_sdk() {
    let schema: ldpsyn::schema::Schema = serde_json::from_value(serde_json::json!({
        "attributes": [
            {"name": "balance", "type": "numeric", "min": -50000, "max": 150000,
             "bins": "auto", "integer": true, "scale": {"asinh": 100.0}},
            {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}))
    .unwrap();
    let attr = &schema.attributes()[0];
    let codes: Vec<u32> = [
        -50000.0, -4518.0, -700.0, -100.0, -1.0, 0.0, 1.0, 99.0, 544.0, 1000.0, 5000.0, 25000.0,
        102127.0, 150000.0,
    ]
    .iter()
    .map(|&x| {
        attr.encode_value(&ldpsyn::schema::Value::Number(x))
            .unwrap()
    })
    .collect();
    assert_eq!(
        codes,
        [
            0, 165, 292, 413, 473, 474, 474, 534, 638, 680, 790, 900, 997, 1023
        ]
    );
}

#[wasm_bindgen_test]
fn typescript_codes_are_the_shared_problem_types() {
    let ours = ldpsyn_wasm::typescript_problem_codes();
    let shared: Vec<String> = ProblemType::ALL
        .iter()
        .map(|t| t.slug().to_owned())
        .collect();
    assert_eq!(ours, shared);
}

#[wasm_bindgen_test]
fn memory_ledger_round_trip_and_is_shared() {
    let collection = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    let mut a = DeviceLedger::new(Storage::Memory).unwrap();
    let b = DeviceLedger::new(Storage::Memory).unwrap();
    assert_eq!(a.get(collection).unwrap(), None);
    let entry = LedgerEntry {
        epsilon_spent: 1.5,
        report: Report {
            id: uuid::Builder::from_random_bytes(rand::random()).into_uuid(),
            token: "t".into(),
            payload: Payload::Grr(3),
        },
        state: ReportState::Pending,
        spent_at_unix_ms: Some(js_sys::Date::now() as u64),
    };
    a.put(collection, entry.clone()).unwrap();
    // A second ledger of the same instance sees it: reconnecting does not reset the budget.
    assert_eq!(b.get(collection).unwrap(), Some(entry));
    // Under node there is no localStorage.
    assert!(DeviceLedger::new(Storage::LocalStorage).is_err());
}

#[wasm_bindgen_test]
async fn epsilon_above_max_in_the_config_is_refused() {
    let mut plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.config_epsilon = 8.0;
    plan.task_epsilon = 8.0;
    plan.install();
    let err = connect(&plan, 4.0).await.err().expect("refused");
    assert_eq!(code(&err), "epsilon-too-large");
    assert!(requests("GET", "/task").is_empty());
}

#[wasm_bindgen_test]
async fn epsilon_above_max_in_a_task_is_refused_and_nothing_spent() {
    let mut plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.task_epsilon = 8.0;
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let err = submit(&client, record()).await.unwrap_err();
    assert_eq!(code(&err), "epsilon-too-large");
    assert!(requests("POST", "/reports").is_empty());
    assert_eq!(client.remaining_budget().unwrap(), 2.0);
    assert!(client.ledger_state().unwrap().is_null());
}

#[wasm_bindgen_test]
async fn one_report_then_budget_exhausted() {
    let plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    assert_eq!(client.remaining_budget().unwrap(), 2.0);
    let receipt = submit(&client, record()).await.unwrap();
    assert_eq!(receipt["status"], "accepted");
    assert_eq!(receipt["epsilonSpent"], 2.0);
    assert_eq!(receipt["collectionId"], plan.id.as_str());
    assert_eq!(client.remaining_budget().unwrap(), 0.0);
    let posts = requests("POST", "/reports");
    assert_eq!(posts.len(), 1);
    // Only the randomized report leaves: id, token, payload; no record values.
    let sent: Vec<Report> = serde_json::from_str(posts[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent[0].token, "tok-1");
    assert!(matches!(sent[0].payload, Payload::Oue(_)));
    // A second submission (even of another record) is refused without any request.
    let before = log().len();
    let other =
        js_sys::JSON::parse(r#"{"age": 50, "sex": "Female", "workclass": "Federal-gov"}"#).unwrap();
    let err = submit(&client, other).await.unwrap_err();
    assert_eq!(code(&err), "budget-exhausted");
    assert_eq!(log().len(), before);
    // So is a fresh client of the same collection in this instance.
    let again = connect(&plan, 4.0).await.unwrap();
    assert_eq!(again.remaining_budget().unwrap(), 0.0);
    assert_eq!(
        code(&submit(&again, record()).await.unwrap_err()),
        "budget-exhausted"
    );
}

#[wasm_bindgen_test]
async fn invalid_record_fails_before_any_request() {
    let plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let before = log().len();
    let bad =
        js_sys::JSON::parse(r#"{"age": 37, "sex": "Other", "workclass": "Private"}"#).unwrap();
    assert_eq!(
        code(&submit(&client, bad).await.unwrap_err()),
        "invalid-record"
    );
    assert_eq!(
        code(&submit(&client, JsValue::UNDEFINED).await.unwrap_err()),
        "invalid-record"
    );
    assert_eq!(log().len(), before);
    assert_eq!(client.remaining_budget().unwrap(), 2.0);
}

#[wasm_bindgen_test]
async fn retries_resend_identical_bytes() {
    // 503, then a network error, then 200: one randomization, three identical uploads.
    let plan = Plan::new(serde_json::json!([
        {"status": 503, "body": {"type": "urn:ldpsyn:problem:unavailable", "title": "x", "status": 503, "detail": "busy"}},
        {"network": true},
        {"status": 200}
    ]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let receipt = submit(&client, record()).await.unwrap();
    assert_eq!(receipt["status"], "accepted");
    let posts = requests("POST", "/reports");
    assert_eq!(posts.len(), 3);
    assert!(posts.iter().all(|p| p["body"] == posts[0]["body"]));
    assert_eq!(requests("GET", "/task").len(), 1);
}

#[wasm_bindgen_test]
async fn unavailable_keeps_the_report_pending_and_resends_it() {
    let plan = Plan::new(serde_json::json!([{"network": true}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let err = submit(&client, record()).await.unwrap_err();
    assert_eq!(code(&err), "unavailable");
    let state = client.ledger_state().unwrap();
    assert_eq!(
        Reflect::get(&state, &"state".into())
            .unwrap()
            .as_string()
            .unwrap(),
        "pending"
    );
    assert_eq!(client.remaining_budget().unwrap(), 0.0);
    let first = requests("POST", "/reports")[0]["body"].clone();
    // The server comes back; the next submit (whatever record) resends the same report.
    let mut plan2 = Plan::new(serde_json::json!([{"status": 200, "answer": "duplicate"}]));
    plan2.id = plan.id.clone();
    plan2.install();
    let other =
        js_sys::JSON::parse(r#"{"age": 60, "sex": "Female", "workclass": "Private"}"#).unwrap();
    let receipt = submit(&client, other).await.unwrap();
    assert_eq!(receipt["status"], "duplicate");
    assert!(
        requests("GET", "/task").is_empty(),
        "no second task, no second randomization"
    );
    assert_eq!(requests("POST", "/reports")[0]["body"], first);
}

#[wasm_bindgen_test]
async fn rejected_report_spends_the_budget() {
    let plan = Plan::new(serde_json::json!([{"status": 200, "answer": "rejected"}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let err = submit(&client, record()).await.unwrap_err();
    assert_eq!(code(&err), "invalid-token");
    assert_eq!(
        Reflect::get(&err, &"detail".into())
            .unwrap()
            .as_string()
            .unwrap(),
        "bad signature"
    );
    assert_eq!(
        code(&submit(&client, record()).await.unwrap_err()),
        "budget-exhausted"
    );
}

#[wasm_bindgen_test]
async fn whole_upload_refused_spends_the_budget() {
    let plan = Plan::new(serde_json::json!([{"status": 413, "body":
        {"type": "urn:ldpsyn:problem:payload-too-large", "title": "x", "status": 413, "detail": "too big"}}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let err = submit(&client, record()).await.unwrap_err();
    assert_eq!(code(&err), "payload-too-large");
    assert_eq!(
        Reflect::get(&err, &"status".into()).unwrap().as_f64(),
        Some(413.0)
    );
    assert_eq!(
        code(&submit(&client, record()).await.unwrap_err()),
        "budget-exhausted"
    );
}

#[wasm_bindgen_test]
async fn concurrent_submissions_randomize_once() {
    let plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    let a = JsFuture::from(client.submit(record()));
    let b = JsFuture::from(client.submit(record()));
    let (a, b) = (a.await, b.await);
    assert!(a.is_ok());
    assert_eq!(code(&b.unwrap_err()), "conflict");
    assert_eq!(requests("GET", "/task").len(), 1);
}

#[wasm_bindgen_test]
async fn unknown_collection_and_bad_options() {
    let plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.install();
    let other = uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string();
    let err = JsFuture::from(LdpClient::connect(BASE.into(), other, options(4.0)))
        .await
        .unwrap_err();
    assert_eq!(code(&err), "unknown-collection");
    let err = JsFuture::from(LdpClient::connect(
        BASE.into(),
        "not-a-uuid".into(),
        options(4.0),
    ))
    .await
    .unwrap_err();
    assert_eq!(code(&err), "invalid-parameter");
    let err = JsFuture::from(LdpClient::connect(
        BASE.into(),
        plan.id.clone(),
        js_sys::JSON::parse(r#"{"maxEpsilon": 0}"#).unwrap(),
    ))
    .await
    .unwrap_err();
    assert_eq!(code(&err), "invalid-parameter");
}

/// In a browser whose localStorage is blocked, the default `storage: "auto"` refuses to
/// connect (`ledger-unavailable`, before any request) instead of keeping the ledger in memory,
/// where a reload would forget it; `"memory"` asked for explicitly is honoured.
#[wasm_bindgen_test]
async fn auto_storage_fails_closed_in_a_browser_without_local_storage() {
    let plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.install();
    set_browser_marker(true);
    let auto = JsFuture::from(LdpClient::connect(
        BASE.into(),
        plan.id.clone(),
        js_sys::JSON::parse(r#"{"maxEpsilon": 4}"#).unwrap(),
    ))
    .await;
    let local = JsFuture::from(LdpClient::connect(
        BASE.into(),
        plan.id.clone(),
        js_sys::JSON::parse(r#"{"maxEpsilon": 4, "storage": "localStorage"}"#).unwrap(),
    ))
    .await;
    let memory = connect(&plan, 4.0).await;
    set_browser_marker(false);
    assert_eq!(code(&auto.unwrap_err()), "ledger-unavailable");
    assert_eq!(code(&local.unwrap_err()), "ledger-unavailable");
    let client = memory.unwrap();
    assert_eq!(client.storage(), "memory");
    // Only the memory client fetched the config.
    assert_eq!(requests("GET", &plan.id).len(), 1);
    // Under node (no browser) `auto` is still a memory ledger.
    let node = LdpClient::open(
        BASE.into(),
        plan.id.clone(),
        js_sys::JSON::parse(r#"{"maxEpsilon": 4}"#).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(node.storage(), "memory");
}

/// Without the Web Locks API, a ledger that needs the origin's lock (localStorage) refuses to
/// run the submission (`ledger-unavailable`, the work never starts) instead of running it
/// unlocked; a memory ledger, which no other page sees, runs.
#[wasm_bindgen_test]
async fn missing_web_locks_refuse_a_locked_submission() {
    use std::cell::Cell;
    use std::rc::Rc;
    hide_web_locks(true);
    let ran = Rc::new(Cell::new(false));
    let flag = Rc::clone(&ran);
    let refused =
        ldpsyn_wasm::ledger::with_origin_lock(true, move || async move { flag.set(true) }).await;
    let unlocked = ldpsyn_wasm::ledger::with_origin_lock(false, || async { 7 }).await;
    hide_web_locks(false);
    assert_eq!(code(&refused.unwrap_err()), "ledger-unavailable");
    assert!(!ran.get(), "the submission ran without the lock");
    assert_eq!(unlocked.unwrap(), 7);
}

/// The request log with the randomized content blanked out: method, path (collection id
/// replaced), and the body's JSON shape (every string by its length, every number by 0) and
/// length.
fn request_shapes(plan: &Plan) -> Vec<serde_json::Value> {
    fn shape(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::String(s) => serde_json::json!(format!("string of {}", s.len())),
            serde_json::Value::Number(_) => serde_json::json!(0),
            serde_json::Value::Array(a) => a.iter().map(shape).collect(),
            serde_json::Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), shape(v))).collect(),
            other => other.clone(),
        }
    }
    log()
        .iter()
        .map(|r| {
            let body = r["body"].as_str();
            serde_json::json!({
                "method": r["method"],
                "url": r["url"].as_str().unwrap().replace(&plan.id, "{id}"),
                "body": body.map(|b| shape(&serde_json::from_str(b).unwrap())),
                "length": body.map(str::len),
            })
        })
        .collect()
}

/// Issue 13 item 11 in the browser client: under `on_invalid: "randomize"` a record with a
/// missing, an unknown and an out-of-range value makes the same requests as a valid record
/// (methods, paths, body shapes and lengths); under the default policy it is refused before
/// any request.
#[wasm_bindgen_test]
async fn invalid_record_under_randomize_sends_the_same_requests_as_a_valid_one() {
    let mut randomizing = schema();
    for a in randomizing["attributes"].as_array_mut().unwrap() {
        a["on_invalid"] = serde_json::json!("randomize");
    }
    let invalid =
        || js_sys::JSON::parse(r#"{"age": 140, "sex": "Other", "workclass": null}"#).unwrap();
    let mut shapes = Vec::new();
    for valid in [true, false] {
        let mut plan = Plan::new(serde_json::json!([{"status": 200}]));
        plan.schema = randomizing.clone();
        plan.install();
        let client = connect(&plan, 4.0).await.unwrap();
        let receipt = submit(&client, if valid { record() } else { invalid() })
            .await
            .unwrap();
        assert_eq!(receipt["status"], "accepted");
        shapes.push(request_shapes(&plan));
    }
    assert_eq!(shapes[0].len(), 3, "config, task, upload: {:?}", shapes[0]);
    assert_eq!(shapes[0], shapes[1]);
    // The default policy: refused on the device, nothing sent after the config.
    let plan = Plan::new(serde_json::json!([{"status": 200}]));
    plan.install();
    let client = connect(&plan, 4.0).await.unwrap();
    assert_eq!(
        code(&submit(&client, invalid()).await.unwrap_err()),
        "invalid-record"
    );
    assert_eq!(log().len(), 1);
}

/// Issue 13 item 12 in the browser client: `options.deviceBudget` caps the ε this origin's
/// ledger spends across collections within a window. The in-memory ledger is shared by the
/// tests of this instance, so the cap is set to what they already spent plus 3: a first
/// collection at ε = 2 reports, a second one is refused with `budget-exhausted` before its
/// task is fetched. A malformed budget is refused at connect.
#[wasm_bindgen_test]
async fn device_budget_caps_epsilon_across_collections() {
    use ldpsyn::ledger::DeviceBudget;
    let window_ms = 86_400_000.0;
    let already = DeviceBudget::new(1.0, std::time::Duration::from_millis(86_400_000))
        .unwrap()
        .spent_in_window(
            &DeviceLedger::new(Storage::Memory)
                .unwrap()
                .entries()
                .unwrap(),
            js_sys::Date::now() as u64,
        );
    let capped = |cap: f64| {
        js_sys::JSON::parse(&format!(
            r#"{{"maxEpsilon": 4, "storage": "memory", "maxAttempts": 1,
                "deviceBudget": {{"maxEpsilon": {cap}, "windowMs": {window_ms}}}}}"#
        ))
        .unwrap()
    };
    let cap = already + 3.0;
    let first = Plan::new(serde_json::json!([{"status": 200}]));
    first.install();
    let client = LdpClient::open(BASE.into(), first.id.clone(), capped(cap))
        .await
        .unwrap();
    assert_eq!(client.remaining_budget().unwrap(), 2.0);
    assert_eq!(
        submit(&client, record()).await.unwrap()["status"],
        "accepted"
    );

    let second = Plan::new(serde_json::json!([{"status": 200}]));
    second.install();
    let client = LdpClient::open(BASE.into(), second.id.clone(), capped(cap))
        .await
        .unwrap();
    assert_eq!(client.remaining_budget().unwrap(), 0.0);
    let err = submit(&client, record()).await.unwrap_err();
    assert_eq!(code(&err), "budget-exhausted");
    assert!(requests("GET", "/task").is_empty(), "nothing fetched");
    assert!(requests("POST", "/reports").is_empty(), "nothing sent");
    assert!(client.ledger_state().unwrap().is_null(), "nothing spent");
    // Without the cap the same collection could report.
    let free = connect(&second, 4.0).await.unwrap();
    assert_eq!(free.remaining_budget().unwrap(), 2.0);
    for bad in [
        r#"{"maxEpsilon": 4, "deviceBudget": {"maxEpsilon": 0, "windowMs": 1000}}"#,
        r#"{"maxEpsilon": 4, "deviceBudget": {"maxEpsilon": 5, "windowMs": 0}}"#,
        r#"{"maxEpsilon": 4, "deviceBudget": {"maxEpsilon": 5}}"#,
    ] {
        let err = LdpClient::open(
            BASE.into(),
            second.id.clone(),
            js_sys::JSON::parse(bad).unwrap(),
        )
        .await
        .err()
        .expect("refused");
        assert_eq!(code(&err), "invalid-parameter", "{bad}");
    }
}

/// Without `deviceBudget` the default cap (ε = 10 per 30 days) applies across collections:
/// collections at ε = 2 report until the next would pass the cap, which is refused with
/// `budget-exhausted` before its task is fetched.
#[wasm_bindgen_test]
async fn default_device_budget_caps_epsilon_across_collections() {
    use ldpsyn::ledger::DeviceBudget;
    let default = DeviceBudget::DEFAULT;
    let spent = || {
        default.spent_in_window(
            &DeviceLedger::new(Storage::Memory)
                .unwrap()
                .entries()
                .unwrap(),
            js_sys::Date::now() as u64,
        )
    };
    let opts = || {
        js_sys::JSON::parse(r#"{"maxEpsilon": 4, "storage": "memory", "maxAttempts": 1}"#).unwrap()
    };
    let mut accepted = 0;
    let err = loop {
        assert!(accepted < 20, "no cap: {accepted} collections reported");
        let plan = Plan::new(serde_json::json!([{"status": 200}]));
        plan.install();
        let client = LdpClient::open(BASE.into(), plan.id.clone(), opts())
            .await
            .unwrap();
        let before = spent();
        match submit(&client, record()).await {
            Ok(_) => {
                assert!(before + 2.0 <= default.max_epsilon() * (1.0 + 1e-9));
                accepted += 1;
            }
            Err(e) => {
                assert!(before + 2.0 > default.max_epsilon(), "refused below the cap");
                assert!(requests("GET", "/task").is_empty(), "nothing fetched");
                break e;
            }
        }
    };
    assert_eq!(code(&err), "budget-exhausted");
}
