//! Upload load against a real `ldpsyn-aggregator serve` process, shared by the crash and
//! fault tests (`crash_safety.rs`, `fault_injection.rs`): the process (with a known token key,
//! so a test can reduce the acknowledged reports itself), simulated people and their
//! uploads, the acknowledged and pending reports their ledgers hold, a clean in-process
//! reduction of them, and the figures line each fault case prints.
// Each test file uses a part of this module.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions, Receipt, SimulatedPerson};
use ldpsyn::ledger::{BudgetLedger, MemoryLedger, ReportState};
use ldpsyn::mechanism::SufficientStatistics;
use ldpsyn::schema::Schema;
use ldpsyn::wire::{CollectionConfig, Report};
use ldpsyn_aggregator::engine::{Engine, Tables};
use ldpsyn_aggregator::service::tokens::TokenKey;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use uuid::Uuid;

/// The admin token of every process [`spawn`] starts.
pub const ADMIN: &str = "crash-admin-token-42";
/// The task-token key of every process [`spawn`] starts ([`reduce`] verifies with it).
pub const KEY: &str = "crash-token-key-0123456789abcdef0123456789";

/// Kills the server when dropped, so a failing test leaves no process behind.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve` on `db` and `127.0.0.1:port` (no per-IP limit, the known [`KEY`]).
pub fn spawn(db: &str, port: u16) -> Server {
    Server(
        Command::new(env!("CARGO_BIN_EXE_ldpsyn-aggregator"))
            .args([
                "serve",
                "--bind",
                &format!("127.0.0.1:{port}"),
                "--database-url",
                db,
            ])
            .env("LDPSYN_ADMIN_TOKEN", ADMIN)
            .env("LDPSYN_TOKEN_KEY", KEY)
            .env("LDPSYN_RATE_LIMIT_PER_IP", "0")
            .env("LDPSYN_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the aggregator binary starts"),
    )
}

/// Waits (30 s at most) until `base` answers `/healthz` 200.
pub async fn wait_healthy(base: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(r) = reqwest::get(format!("{base}/healthz")).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server did not become healthy");
}

/// How long a test waits for a state it expects (a commit, another process's refresh).
pub const WAIT: Duration = Duration::from_secs(20);

/// Polls `GET {base}/v1/collections/{id}` (admin) every 50 ms until `ok` holds for it, and
/// returns it; panics naming `what` after [`WAIT`]. Tests wait for the state they assert
/// rather than sleeping a fixed time.
pub async fn status_until(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = http
            .get(format!("{base}/v1/collections/{id}"))
            .bearer_auth(ADMIN)
            .send()
            .await;
        let seen = match r {
            Ok(r) if r.status() == 200 => r.json::<Value>().await.unwrap(),
            Ok(r) => json!(r.status().as_u16()),
            Err(e) => json!(e.to_string()),
        };
        if ok(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{base}: not {what} after {WAIT:?}: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (as [`status_until`]) until `base` serves collection `id`'s model.
pub async fn model_served(http: &reqwest::Client, base: &str, id: Uuid) {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = http
            .get(format!("{base}/v1/collections/{id}/model"))
            .bearer_auth(ADMIN)
            .send()
            .await;
        if r.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(Instant::now() < deadline, "{base}: no model after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three small categorical attributes, the second correlated with the first ([`people`]).
pub fn schema() -> Value {
    json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["0", "1", "2"]},
        {"name": "b", "type": "categorical", "labels": ["0", "1", "2"]},
        {"name": "c", "type": "categorical", "labels": ["0", "1"]}
    ]})
}

/// `n` simulated people of [`schema`] (the same `n` on every call), with empty ledgers.
pub fn people(schema: &Schema, n: usize) -> Vec<SimulatedPerson<MemoryLedger>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    (0..n)
        .map(|_| {
            let a = rng.random_range(0..3u32);
            let b = if rng.random::<f64>() < 0.7 {
                a
            } else {
                rng.random_range(0..3)
            };
            let c = rng.random_range(0..2u32);
            SimulatedPerson {
                record: schema.encoded(vec![a, b, c]).unwrap(),
                ledger: MemoryLedger::default(),
            }
        })
        .collect()
}

/// The reports of `people` for collection `id` whose ledger entry is in `state`.
pub fn reports(
    people: &[SimulatedPerson<MemoryLedger>],
    id: Uuid,
    state: ReportState,
) -> Vec<Report> {
    people
        .iter()
        .filter_map(|p| p.ledger.get(id).unwrap())
        .filter(|e| e.state == state)
        .map(|e| e.report)
        .collect()
}

/// The tables an uninterrupted server would hold for `reports`: each verified with [`KEY`]
/// and accumulated under its task's table key.
pub fn reduce(engine: &Engine, reports: &[Report]) -> Tables {
    let key = TokenKey::new(KEY.as_bytes().to_vec()).unwrap();
    let mut t = Tables::new();
    for r in reports {
        let c = key.verify(&r.token).unwrap();
        let k = engine.table_key(&c.task_spec());
        let m = engine.mechanism(&k).unwrap();
        m.accumulate(
            &r.payload,
            t.entry(k).or_insert_with(|| SufficientStatistics::new(&m)),
        )
        .unwrap();
    }
    t
}

/// Uploads `chunk` through `base` in batches of 50 people (one task fetch each), or of 10
/// for an even `seed`, until an upload fails; returns the people with their ledgers.
pub async fn upload_all(
    base: String,
    id: Uuid,
    mut chunk: Vec<SimulatedPerson<MemoryLedger>>,
    seed: u64,
) -> Vec<SimulatedPerson<MemoryLedger>> {
    let mut options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), seed);
    options.max_attempts = 1;
    let Ok(mut client) = Client::connect(&base, id, options, MemoryLedger::default()).await else {
        return chunk;
    };
    let batch = if seed % 2 == 0 { 10 } else { 50 };
    for part in chunk.chunks_mut(batch) {
        if client.submit_batch(part).await.is_err() {
            break;
        }
    }
    chunk
}

/// An admin request (`GET` or `POST` without a body) that must succeed; its JSON answer.
pub async fn admin(http: &reqwest::Client, method: &str, url: String) -> Value {
    let req = match method {
        "POST" => http.post(url),
        _ => http.get(url),
    };
    let r = req.bearer_auth(ADMIN).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

/// Creates a collection of [`schema`] with `params` (protocol, ε, …) through `base`.
pub async fn create(
    http: &reqwest::Client,
    base: &str,
    mut params: Value,
) -> (Uuid, CollectionConfig) {
    params["schema"] = schema();
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&params)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let id = created["id"].as_str().unwrap().parse().unwrap();
    (id, serde_json::from_value(created).unwrap())
}

/// The bound the issue sets on recovery: the service accepts uploads again within this long
/// of the fault ending.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(10);

/// One fault case's figures, printed as one line that starts with `FAULT` (the suite's
/// figures in `docs/results.md` are these lines, from `--nocapture` runs).
#[derive(Debug, Default)]
pub struct Figures {
    /// The case's name.
    pub case: &'static str,
    /// Reports the service acknowledged before the fault (the devices' ledgers say so).
    pub acknowledged: usize,
    /// Reports sent and not answered (or refused with a 5xx) by the fault.
    pub pending: usize,
    /// Reports the recovered service counts, before anything is resent: at least
    /// `acknowledged`, at most `acknowledged + pending`.
    pub stored: u64,
    /// Reports stored once everyone was resent and acknowledged, and how many people that is.
    pub final_stored: u64,
    /// People acknowledged in the end (each holds one report).
    pub final_acknowledged: usize,
    /// From the fault's end to the first upload acknowledged afterwards.
    pub recovery: Duration,
}

impl Figures {
    /// Prints the greppable line.
    pub fn print(&self) {
        println!(
            "FAULT case={} acknowledged={} pending={} stored={} lost={} final_acknowledged={} \
             final_stored={} duplicates={} recovery_s={:.2}",
            self.case,
            self.acknowledged,
            self.pending,
            self.stored,
            (self.acknowledged as u64).saturating_sub(self.stored),
            self.final_acknowledged,
            self.final_stored,
            self.final_stored as i64 - self.final_acknowledged as i64,
            self.recovery.as_secs_f64(),
        );
    }

    /// Asserts what every fault case promises: nothing acknowledged lost, nothing stored
    /// that was not sent, everyone stored exactly once in the end, recovery within
    /// [`RECOVERY_BOUND`]. Prints the line first, so a failing run still shows its figures.
    pub fn check(&self) {
        self.print();
        assert!(
            self.stored >= self.acknowledged as u64,
            "{}: acknowledged reports lost",
            self.case
        );
        assert!(
            self.stored <= (self.acknowledged + self.pending) as u64,
            "{}: more stored than sent",
            self.case
        );
        assert_eq!(
            self.final_stored, self.final_acknowledged as u64,
            "{}: each acknowledged report stored exactly once",
            self.case
        );
        assert!(
            self.recovery <= RECOVERY_BOUND,
            "{}: recovered after {:?}",
            self.case,
            self.recovery
        );
    }
}

/// Uploads `probe` (fresh people) through `base` until every one is acknowledged, retrying
/// every 50 ms whatever fails (the process not up yet, a 5xx), and returns the time from
/// `since` (the fault's end) to that acknowledgment. Gives up after three times
/// [`RECOVERY_BOUND`] (the caller asserts the bound, with the figure in its message).
pub async fn recovery(
    base: &str,
    id: Uuid,
    probe: &mut [SimulatedPerson<MemoryLedger>],
    since: Instant,
) -> Duration {
    let mut last = String::new();
    while since.elapsed() < 3 * RECOVERY_BOUND {
        let mut options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 7);
        options.max_attempts = 1;
        match Client::connect(base, id, options, MemoryLedger::default()).await {
            Ok(mut client) => match client.submit_batch(probe).await {
                // Someone acknowledged at an earlier try is refused by their own ledger.
                Ok(answers) if answers.iter().all(acknowledged) => return since.elapsed(),
                Ok(answers) => {
                    last = format!("{:?}", answers.into_iter().find(|a| !acknowledged(a)))
                }
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{base}: no upload acknowledged {:?} after the fault: {last}",
        3 * RECOVERY_BOUND
    );
}

/// `reports_accepted` of collection `id` as `base` counts it.
pub async fn accepted(http: &reqwest::Client, base: &str, id: Uuid) -> u64 {
    let s = admin(http, "GET", format!("{base}/v1/collections/{id}")).await;
    s["status"]["reports_accepted"].as_u64().unwrap()
}

/// Posts `report` as an upload of its own, without retries; the status, the media type and
/// the body (JSON, or `null`).
pub async fn post_report(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    report: &Report,
) -> (u16, String, Value) {
    let r = http
        .post(format!("{base}/v1/collections/{id}/reports"))
        .json(&[report])
        .send()
        .await
        .expect("the service answers");
    let status = r.status().as_u16();
    let media = r
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, media, r.json().await.unwrap_or(Value::Null))
}

/// Whether an answer of `submit_batch` leaves its person acknowledged: accepted now, or
/// refused by their own ledger because an earlier send was.
pub fn acknowledged(answer: &Result<Receipt, ClientError>) -> bool {
    matches!(answer, Ok(_) | Err(ClientError::BudgetExhausted { .. }))
}
