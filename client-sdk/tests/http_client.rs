//! The native HTTP client against a real axum server started inside the test: it serves a
//! collection config and tasks, validates reports with the shared `Mechanism` code, and can
//! be told to fail in the ways the client must handle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::{BudgetLedger, FileLedger, MemoryLedger, ReportState};
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use ldpsyn::schema::Schema;
use ldpsyn::wire::{
    CollectionConfig, PROBLEM_CONTENT_TYPE, Problem, ProblemType, Protocol, Report, ReportAnswer,
    ReportStatus, Task,
};
use uuid::Uuid;

#[derive(Default)]
struct Behaviour {
    /// Answer this many report uploads with 503 before accepting.
    fail_uploads: u32,
    /// Answer uploads with this problem (a 4xx for the whole upload).
    upload_problem: Option<ProblemType>,
    /// Answer each report `rejected`.
    reject_reports: bool,
    /// ε put in tasks (None: the config's).
    task_epsilon: Option<f64>,
    /// Answer no task request before this many have arrived (so clients race).
    hold_tasks_until: u32,
}

#[derive(Default)]
struct Seen {
    /// Every request: method, path and query, body.
    requests: Vec<(String, String, Vec<u8>)>,
    task_fetches: u32,
    tasks_issued: u32,
    upload_bodies: Vec<Vec<u8>>,
    accepted: Vec<Uuid>,
}

struct Fake {
    config: CollectionConfig,
    behaviour: Mutex<Behaviour>,
    seen: Mutex<Seen>,
    /// Wakes held task requests ([`Behaviour::hold_tasks_until`]).
    release: tokio::sync::Notify,
}

fn schema() -> Schema {
    serde_json::from_value(serde_json::json!({"attributes": [
        {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 10},
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]}
    ]}))
    .unwrap()
}

fn problem(t: ProblemType, detail: &str) -> Response {
    let body = serde_json::to_vec(&Problem::new(t, detail)).unwrap();
    (
        StatusCode::from_u16(t.status()).unwrap(),
        [("content-type", PROBLEM_CONTENT_TYPE)],
        body,
    )
        .into_response()
}

fn task(fake: &Fake, i: u32) -> Task {
    let b = fake.behaviour.lock().unwrap();
    let (factor, mechanism) = if i % 2 == 0 {
        (vec![0, 1], MechanismKind::Oue)
    } else {
        (vec![2, 1], MechanismKind::Grr)
    };
    Task {
        collection_id: fake.config.id,
        round: 0,
        factor,
        mechanism,
        bins: vec![],
        epsilon: Epsilon::new(b.task_epsilon.unwrap_or(fake.config.epsilon.get())).unwrap(),
        token: format!("{}|{}", i, if i % 2 == 0 { "oue" } else { "grr" }),
        expires_at: 4_000_000_000,
    }
}

fn log_request(f: &Fake, method: &str, uri: &Uri, body: &[u8]) {
    f.seen
        .lock()
        .unwrap()
        .requests
        .push((method.into(), uri.to_string(), body.to_vec()));
}

async fn get_config(State(f): State<Arc<Fake>>, uri: Uri) -> Json<CollectionConfig> {
    log_request(&f, "GET", &uri, &[]);
    Json(f.config.clone())
}

async fn get_task(
    State(f): State<Arc<Fake>>,
    uri: Uri,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    log_request(&f, "GET", &uri, &[]);
    let count: Option<u32> = q.get("count").map(|c| c.parse().unwrap());
    // Registered before the count is taken, so the last arrival's wake-up is not missed.
    let released = f.release.notified();
    tokio::pin!(released);
    released.as_mut().enable();
    let (start, fetches) = {
        let mut s = f.seen.lock().unwrap();
        s.task_fetches += 1;
        let start = s.tasks_issued;
        s.tasks_issued += count.unwrap_or(1);
        (start, s.task_fetches)
    };
    // Held requests are all answered at the same instant.
    if fetches >= f.behaviour.lock().unwrap().hold_tasks_until {
        f.release.notify_waiters();
    } else {
        released.await;
    }
    match count {
        None => Json(task(&f, start)).into_response(),
        Some(n) => {
            Json((start..start + n).map(|i| task(&f, i)).collect::<Vec<_>>()).into_response()
        }
    }
}

async fn post_reports(State(f): State<Arc<Fake>>, uri: Uri, body: axum::body::Bytes) -> Response {
    log_request(&f, "POST", &uri, &body);
    f.seen.lock().unwrap().upload_bodies.push(body.to_vec());
    {
        let mut b = f.behaviour.lock().unwrap();
        if b.fail_uploads > 0 {
            b.fail_uploads -= 1;
            return problem(ProblemType::Unavailable, "try again");
        }
        if let Some(t) = b.upload_problem {
            return problem(t, "token signature does not verify");
        }
    }
    let reports: Vec<Report> = serde_json::from_slice(&body).unwrap();
    let reject = f.behaviour.lock().unwrap().reject_reports;
    let dims = f.config.schema.domain_sizes();
    let answers: Vec<ReportAnswer> = reports
        .iter()
        .map(|r| {
            // The token says which task: the factor and mechanism to validate against.
            let i: u32 = r.token.split('|').next().unwrap().parse().unwrap();
            let t = task(&f, i);
            let m = Mechanism::new(
                t.mechanism,
                t.epsilon,
                &t.factor.iter().map(|&a| dims[a]).collect::<Vec<_>>(),
            )
            .unwrap();
            let valid = m.validate(&r.payload).is_ok();
            let mut seen = f.seen.lock().unwrap();
            if reject || !valid {
                ReportAnswer {
                    id: r.id,
                    status: ReportStatus::Rejected,
                    problem: Some(Problem::new(
                        ProblemType::InvalidPayload,
                        "payload does not fit",
                    )),
                }
            } else if seen.accepted.contains(&r.id) {
                ReportAnswer {
                    id: r.id,
                    status: ReportStatus::Duplicate,
                    problem: None,
                }
            } else {
                seen.accepted.push(r.id);
                ReportAnswer {
                    id: r.id,
                    status: ReportStatus::Accepted,
                    problem: None,
                }
            }
        })
        .collect();
    Json(answers).into_response()
}

async fn start(epsilon: f64, behaviour: Behaviour) -> (String, Arc<Fake>) {
    start_with(schema(), epsilon, behaviour).await
}

async fn start_with(schema: Schema, epsilon: f64, behaviour: Behaviour) -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake {
        config: CollectionConfig {
            auto_finalize_at_target: false,
            past_target: ldpsyn::wire::PastTarget::Accept,
            retain_reports_days: None,
            target: Vec::new(),
            name: None,
            description: None,
            version: 1,
            id: Uuid::new_v4(),
            schema,
            epsilon: Epsilon::new(epsilon).unwrap(),
            target_users: 1000,
            protocol: Protocol::Independence {},
        },
        behaviour: Mutex::new(behaviour),
        seen: Mutex::new(Seen::default()),
        release: tokio::sync::Notify::new(),
    });
    let app = Router::new()
        .route("/v1/collections/{id}", get(get_config))
        .route("/v1/collections/{id}/task", get(get_task))
        .route("/v1/collections/{id}/reports", post(post_reports))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), fake)
}

fn options(max: f64) -> ClientOptions {
    let mut o = ClientOptions::new(Epsilon::new(max).unwrap());
    o.initial_backoff = Duration::from_millis(5);
    o.max_backoff = Duration::from_millis(20);
    o.max_attempts = 3;
    o
}

fn record() -> serde_json::Value {
    serde_json::json!({"age": 37, "sex": "M", "smoker": "no"})
}

#[tokio::test]
async fn retries_503_with_identical_bytes_and_no_second_randomization() {
    let (url, fake) = start(
        2.0,
        Behaviour {
            fail_uploads: 2,
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&url, fake.config.id, options(4.0), MemoryLedger::default())
        .await
        .unwrap();
    assert_eq!(c.remaining_budget().unwrap(), 2.0);
    let receipt = c.submit(&record()).await.unwrap();
    assert_eq!(receipt.status, ReportStatus::Accepted);
    assert_eq!(receipt.epsilon_spent, 2.0);
    {
        let seen = fake.seen.lock().unwrap();
        assert_eq!(seen.task_fetches, 1, "one task, one randomization");
        assert_eq!(seen.upload_bodies.len(), 3);
        assert!(
            seen.upload_bodies
                .iter()
                .all(|b| *b == seen.upload_bodies[0]),
            "identical bytes"
        );
        assert_eq!(seen.accepted, vec![receipt.report_id]);
    }
    assert_eq!(c.remaining_budget().unwrap(), 0.0);
    let entry = c.ledger().get(fake.config.id).unwrap().unwrap();
    assert_eq!(entry.state, ReportState::Acknowledged);
    // The budget is spent: refused locally, without a request.
    let e = c.submit(&record()).await.unwrap_err();
    assert!(
        matches!(e, ClientError::BudgetExhausted { epsilon_spent, .. } if epsilon_spent == 2.0)
    );
    assert_eq!(e.problem_type(), ProblemType::BudgetExhausted);
    assert_eq!(fake.seen.lock().unwrap().task_fetches, 1);
}

#[tokio::test]
async fn pending_report_is_resent_after_outage() {
    let (url, fake) = start(
        1.0,
        Behaviour {
            fail_uploads: 3,
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&url, fake.config.id, options(1.0), MemoryLedger::default())
        .await
        .unwrap();
    let e = c.submit(&record()).await.unwrap_err();
    assert!(
        matches!(e, ClientError::Unavailable { attempts: 3, .. }),
        "{e}"
    );
    let entry = c.ledger().get(fake.config.id).unwrap().unwrap();
    assert_eq!(entry.state, ReportState::Pending);
    // The server is back: the same report goes out again, no new task.
    let receipt = c.submit(&record()).await.unwrap();
    assert_eq!(receipt.report_id, entry.report.id);
    let seen = fake.seen.lock().unwrap();
    assert_eq!(seen.task_fetches, 1);
    assert_eq!(seen.upload_bodies.len(), 4);
    assert!(
        seen.upload_bodies
            .iter()
            .all(|b| *b == seen.upload_bodies[0])
    );
}

#[tokio::test]
async fn epsilon_above_the_apps_maximum_is_refused() {
    let (url, fake) = start(4.0, Behaviour::default()).await;
    let e = Client::connect(&url, fake.config.id, options(2.0), MemoryLedger::default())
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::EpsilonTooLarge { requested, max } if requested == 4.0 && max == 2.0)
    );

    // A config within the limit but a task asking more: refused, nothing spent or sent.
    let (url, fake) = start(
        1.0,
        Behaviour {
            task_epsilon: Some(8.0),
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&url, fake.config.id, options(2.0), MemoryLedger::default())
        .await
        .unwrap();
    let e = c.submit(&record()).await.unwrap_err();
    assert!(
        matches!(e, ClientError::EpsilonTooLarge { requested, .. } if requested == 8.0),
        "{e}"
    );
    assert_eq!(c.ledger().get(fake.config.id).unwrap(), None);
    assert!(fake.seen.lock().unwrap().upload_bodies.is_empty());

    // A task whose ε differs from the config's (even if below the maximum) is refused too.
    let (url, fake) = start(
        1.0,
        Behaviour {
            task_epsilon: Some(0.5),
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&url, fake.config.id, options(2.0), MemoryLedger::default())
        .await
        .unwrap();
    assert!(matches!(
        c.submit(&record()).await,
        Err(ClientError::InvalidTask(_))
    ));
    assert_eq!(c.remaining_budget().unwrap(), 1.0);
}

#[tokio::test]
async fn problems_are_surfaced_and_leave_the_budget_spent() {
    let (url, fake) = start(
        1.0,
        Behaviour {
            upload_problem: Some(ProblemType::InvalidToken),
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&url, fake.config.id, options(1.0), MemoryLedger::default())
        .await
        .unwrap();
    let e = c.submit(&record()).await.unwrap_err();
    match &e {
        ClientError::Problem(p) => {
            assert_eq!(p.problem_type, ProblemType::InvalidToken);
            assert_eq!(p.status, 400);
            assert_eq!(p.detail, "token signature does not verify");
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        fake.seen.lock().unwrap().upload_bodies.len(),
        1,
        "4xx is not retried"
    );
    assert_eq!(
        c.ledger().get(fake.config.id).unwrap().unwrap().state,
        ReportState::Refused
    );
    assert!(matches!(
        c.submit(&record()).await,
        Err(ClientError::BudgetExhausted { .. })
    ));

    let (url, fake) = start(
        1.0,
        Behaviour {
            reject_reports: true,
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&url, fake.config.id, options(1.0), MemoryLedger::default())
        .await
        .unwrap();
    let e = c.submit(&record()).await.unwrap_err();
    assert_eq!(e.problem_type(), ProblemType::InvalidPayload);
    assert_eq!(
        c.ledger().get(fake.config.id).unwrap().unwrap().state,
        ReportState::Refused
    );

    // A config for another collection than asked is not trusted.
    let e = Client::connect(&url, Uuid::new_v4(), options(1.0), MemoryLedger::default()).await;
    assert!(matches!(e, Err(ClientError::Protocol(ref m)) if m.contains("another collection")));
}

#[tokio::test]
async fn invalid_record_fails_before_any_request() {
    let (url, fake) = start(1.0, Behaviour::default()).await;
    let mut c = Client::connect(&url, fake.config.id, options(1.0), MemoryLedger::default())
        .await
        .unwrap();
    let e = c
        .submit(&serde_json::json!({"age": 300, "sex": "M", "smoker": "no"}))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Record(_)), "{e}");
    assert!(e.to_string().contains("age"));
    assert_eq!(fake.seen.lock().unwrap().task_fetches, 0);
    assert_eq!(c.remaining_budget().unwrap(), 1.0);
}

#[tokio::test]
async fn batch_mode_gives_every_person_their_own_task_and_ledger() {
    let (url, fake) = start(2.0, Behaviour::default()).await;
    let mut c = Client::connect(&url, fake.config.id, options(2.0), MemoryLedger::default())
        .await
        .unwrap();
    let schema = schema();
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = (0..1500)
        .map(|i| SimulatedPerson {
            record: schema.encoded(vec![i % 10, i % 2, (i / 2) % 2]).unwrap(),
            ledger: MemoryLedger::default(),
        })
        .collect();
    let results = c.submit_batch(&mut people).await.unwrap();
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(rc) if rc.status == ReportStatus::Accepted))
    );
    {
        let seen = fake.seen.lock().unwrap();
        assert_eq!(seen.task_fetches, 2, "1000 + 500 tasks");
        assert_eq!(seen.tasks_issued, 1500);
        assert_eq!(seen.upload_bodies.len(), 2);
        assert_eq!(seen.accepted.len(), 1500);
    }
    for p in &people {
        assert_eq!(
            p.ledger.get(fake.config.id).unwrap().unwrap().state,
            ReportState::Acknowledged
        );
    }
    // Again: everyone's budget is spent.
    let again = c.submit_batch(&mut people).await.unwrap();
    assert!(
        again
            .iter()
            .all(|r| matches!(r, Err(ClientError::BudgetExhausted { .. })))
    );
}

/// The requests a client made, with everything randomized blanked out: method, path (the
/// collection id replaced), query, and the body's JSON shape (every string by its length,
/// every number by `0`) and length.
fn request_shapes(fake: &Fake) -> Vec<(String, String, serde_json::Value, usize)> {
    fn shape(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::String(s) => serde_json::json!(format!("string of {}", s.len())),
            serde_json::Value::Number(_) => serde_json::json!(0),
            serde_json::Value::Array(a) => a.iter().map(shape).collect(),
            serde_json::Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), shape(v))).collect(),
            other => other.clone(),
        }
    }
    let id = fake.config.id.to_string();
    fake.seen
        .lock()
        .unwrap()
        .requests
        .iter()
        .map(|(method, uri, body)| {
            let body_shape = if body.is_empty() {
                serde_json::Value::Null
            } else {
                shape(&serde_json::from_slice(body).unwrap())
            };
            (
                method.clone(),
                uri.replace(&id, "{id}"),
                body_shape,
                body.len(),
            )
        })
        .collect()
}

/// Issue 13 item 11: under `on_invalid: randomize` a record with missing, unknown and
/// out-of-range values makes exactly the requests a valid record makes (same methods, paths,
/// body shapes and lengths; only the randomized content differs), and its report is one the
/// server accepts; under the default policy the same record is refused before any request
/// (participation would depend on the data).
#[tokio::test]
async fn invalid_record_under_randomize_sends_the_same_requests_as_a_valid_one() {
    let randomizing: Schema = serde_json::from_value(serde_json::json!({"attributes": [
        {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 10,
         "on_invalid": "randomize"},
        {"name": "sex", "type": "categorical", "labels": ["F", "M"], "on_invalid": "randomize"},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"],
         "on_invalid": "randomize"}
    ]}))
    .unwrap();
    let invalid = serde_json::json!({"age": 140, "sex": "X", "smoker": null});
    let mut shapes = Vec::new();
    for record in [record(), invalid.clone()] {
        let (url, fake) = start_with(randomizing.clone(), 2.0, Behaviour::default()).await;
        let mut c = Client::connect(&url, fake.config.id, options(4.0), MemoryLedger::default())
            .await
            .unwrap();
        let receipt = c.submit(&record).await.unwrap();
        assert_eq!(receipt.status, ReportStatus::Accepted, "{record}");
        shapes.push(request_shapes(&fake));
    }
    assert_eq!(shapes[0].len(), 3, "config, task, upload: {:?}", shapes[0]);
    assert_eq!(shapes[0], shapes[1]);
    // The default policy: refused on the device, nothing sent after the config.
    let (url, fake) = start(2.0, Behaviour::default()).await;
    let mut c = Client::connect(&url, fake.config.id, options(4.0), MemoryLedger::default())
        .await
        .unwrap();
    assert!(matches!(
        c.submit(&invalid).await,
        Err(ClientError::Record(_))
    ));
    assert_eq!(request_shapes(&fake).len(), 1);
}

/// Environment variable that turns [`two_process_child`] into one of the racing processes of
/// [`two_processes_on_one_ledger_file_randomize_once`]: `<server URL> <collection> <ledger>`.
const CHILD_ENV: &str = "LDPSYN_TEST_LEDGER_RACE_CHILD";

/// One racing process of [`two_processes_on_one_ledger_file_randomize_once`], not a test of
/// its own: ignored, so a plain run lists it as ignored instead of counting it as passed;
/// the parent runs this binary with `--ignored --exact two_process_child` and [`CHILD_ENV`].
/// Submits a record through a `FileLedger` on the shared path and prints its outcome.
#[tokio::test]
#[ignore = "a child process of two_processes_on_one_ledger_file_randomize_once, run by it"]
async fn two_process_child() {
    let args = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!(
            "{CHILD_ENV} is not set: only two_processes_on_one_ledger_file_randomize_once runs this"
        )
    });
    let args: Vec<&str> = args.split(' ').collect();
    let ledger = FileLedger::open(args[2]).unwrap();
    // OS-seeded privacy RNG: the two processes could not draw the same report by chance.
    let mut o = ClientOptions::new(Epsilon::new(4.0).unwrap());
    o.initial_backoff = Duration::from_millis(5);
    o.max_attempts = 3;
    let mut c = Client::connect(args[0], args[1].parse().unwrap(), o, ledger)
        .await
        .unwrap();
    match c.submit(&record()).await {
        Ok(r) => println!("CHILD-OUTCOME {:?} {}", r.status, r.report_id),
        Err(e) => println!("CHILD-OUTCOME error {:?}", e.problem_type()),
    }
}

/// Issue 13 item 13: two processes submit for one collection through `FileLedger`s on one
/// path at the same time. The server answers neither task request before both arrived, so
/// both processes found the ledger empty and hold a task; the ledger's lock lets exactly one
/// randomize. Every upload carries that one report (the other process resends it, answered
/// `duplicate`, or is refused), and the file holds it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_ledger_file_randomize_once() {
    let (url, fake) = start(
        2.0,
        Behaviour {
            hold_tasks_until: 2,
            ..Default::default()
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.json");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["--ignored", "--exact", "two_process_child", "--nocapture"])
                .env(
                    CHILD_ENV,
                    format!("{url} {} {}", fake.config.id, path.display()),
                );
            tokio::task::spawn_blocking(move || cmd.output().unwrap())
        })
        .collect();
    let mut outcomes = Vec::new();
    for child in children {
        let out = child.await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("CHILD-OUTCOME "))
            .unwrap_or_else(|| panic!("no outcome in {stdout}"))
            .to_owned();
        outcomes.push(line);
    }
    let seen = fake.seen.lock().unwrap();
    assert_eq!(seen.task_fetches, 2, "both processes fetched a task");
    let ids: std::collections::BTreeSet<Uuid> = seen
        .upload_bodies
        .iter()
        .flat_map(|b| serde_json::from_slice::<Vec<Report>>(b).unwrap())
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 1, "one randomization: {ids:?}, {outcomes:?}");
    assert_eq!(seen.accepted.len(), 1);
    let id = *ids.first().unwrap();
    outcomes.sort();
    assert!(
        outcomes == [format!("Accepted {id}"), format!("Duplicate {id}")]
            || outcomes == [format!("Accepted {id}"), "error BudgetExhausted".to_owned()],
        "{outcomes:?}"
    );
    let entry = FileLedger::open(&path)
        .unwrap()
        .get(fake.config.id)
        .unwrap()
        .unwrap();
    assert_eq!(
        (entry.report.id, entry.state),
        (id, ReportState::Acknowledged)
    );
}

/// Issue 33 item 3: the device-wide cap is on by default. One app ledger and default options:
/// collections at ε = 4 report until the next would take the ledger past
/// [`ldpsyn::ledger::DEFAULT_DEVICE_MAX_EPSILON`] within the default window; that one is
/// refused with `DeviceBudgetExhausted` before its task is fetched.
#[tokio::test]
async fn device_budget_is_on_by_default() {
    use ldpsyn::ledger::{DEFAULT_DEVICE_MAX_EPSILON, DeviceBudget};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.json");
    assert_eq!(
        ClientOptions::new(Epsilon::new(4.0).unwrap()).device_budget,
        Some(DeviceBudget::DEFAULT)
    );
    let mut accepted = 0;
    let (err, refused) = loop {
        assert!(
            accepted < 10,
            "no default cap: {accepted} collections reported"
        );
        let (url, fake) = start(4.0, Behaviour::default()).await;
        let mut client = Client::connect(
            &url,
            fake.config.id,
            options(4.0),
            FileLedger::open(&path).unwrap(),
        )
        .await
        .unwrap();
        match client.submit(&record()).await {
            Ok(r) => {
                assert_eq!(r.status, ReportStatus::Accepted);
                accepted += 1;
            }
            Err(e) => break (e, fake),
        }
    };
    assert_eq!(
        accepted,
        (DEFAULT_DEVICE_MAX_EPSILON / 4.0).floor() as usize
    );
    assert!(
        matches!(
            err,
            ClientError::DeviceBudgetExhausted { spent_in_window, requested, max_epsilon, .. }
                if (spent_in_window, requested, max_epsilon)
                    == (4.0 * accepted as f64, 4.0, DEFAULT_DEVICE_MAX_EPSILON)
        ),
        "{err:?}"
    );
    assert_eq!(
        request_shapes(&refused).len(),
        1,
        "only the config was fetched"
    );
}

/// Issue 13 item 12: a device-wide cap across collections. Two collections at ε = 2 and a
/// cap of 3 per day on one app's ledger file: the first collection reports; the second is
/// refused with the typed `budget-exhausted` error before any task is fetched (nothing
/// randomized, nothing sent) and stays unspent; an entry older than the window does not
/// count, one without a timestamp (an older ledger) does.
#[tokio::test]
async fn device_budget_caps_epsilon_across_collections() {
    use ldpsyn::ledger::{DeviceBudget, LedgerEntry};
    let day = Duration::from_secs(86_400);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.json");
    let mut o = options(4.0);
    o.device_budget = Some(DeviceBudget::new(3.0, day).unwrap());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Spent two days ago on another collection: outside the window.
    let old = LedgerEntry {
        epsilon_spent: 2.5,
        report: Report {
            id: Uuid::new_v4(),
            token: "old".into(),
            payload: ldpsyn::wire::Payload::Grr(0),
        },
        state: ReportState::Acknowledged,
        spent_at_unix_ms: Some(now_ms - 2 * 86_400_000),
    };
    FileLedger::open(&path)
        .unwrap()
        .put(Uuid::new_v4(), old.clone())
        .unwrap();
    let (url_a, a) = start(2.0, Behaviour::default()).await;
    let mut ca = Client::connect(
        &url_a,
        a.config.id,
        o.clone(),
        FileLedger::open(&path).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(ca.remaining_budget().unwrap(), 2.0);
    assert_eq!(
        ca.submit(&record()).await.unwrap().status,
        ReportStatus::Accepted
    );
    let entry = ca.ledger().get(a.config.id).unwrap().unwrap();
    let stamped = entry.spent_at_unix_ms.unwrap();
    assert!(stamped >= now_ms && stamped < now_ms + 60_000, "{stamped}");

    let (url_b, b) = start(2.0, Behaviour::default()).await;
    let mut cb = Client::connect(
        &url_b,
        b.config.id,
        o.clone(),
        FileLedger::open(&path).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(cb.remaining_budget().unwrap(), 0.0);
    let e = cb.submit(&record()).await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::DeviceBudgetExhausted { spent_in_window, requested, max_epsilon, .. }
                if (spent_in_window, requested, max_epsilon) == (2.0, 2.0, 3.0)
        ),
        "{e:?}"
    );
    assert_eq!(e.problem_type(), ProblemType::BudgetExhausted);
    let seen = request_shapes(&b);
    assert_eq!(seen.len(), 1, "only the config was fetched: {seen:?}");
    assert_eq!(cb.ledger().get(b.config.id).unwrap(), None);
    // Without the cap the same ledger would let collection B report.
    let mut uncapped = options(4.0);
    uncapped.device_budget = None;
    let free = Client::connect(
        &url_b,
        b.config.id,
        uncapped,
        FileLedger::open(&path).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(free.remaining_budget().unwrap(), 2.0);
    // An entry without a timestamp (written by an older SDK) counts in every window.
    let (url_c, c) = start(1.0, Behaviour::default()).await;
    let mut undated = MemoryLedger::default();
    undated
        .put(
            Uuid::new_v4(),
            LedgerEntry {
                spent_at_unix_ms: None,
                ..old
            },
        )
        .unwrap();
    let mut cc = Client::connect(&url_c, c.config.id, o, undated)
        .await
        .unwrap();
    assert!(matches!(
        cc.submit(&record()).await,
        Err(ClientError::DeviceBudgetExhausted { .. })
    ));
}

/// Issue 33 item 3: a party accepts at most the collection's declared ε per person, whatever
/// its own maximum. A config declaring ε = 2 that asks the party `bank` for Σε = 3 is refused
/// on connect with `EpsilonTooLarge { max: 2 }`, even with the app's maximum at 20; the
/// consistent party `telco` (ε = 2) connects.
#[tokio::test]
async fn party_above_the_declared_epsilon_is_refused() {
    use ldpsyn::vertical::PartyClient;
    let config: serde_json::Value = serde_json::json!({
        "version": 1, "id": "c0ffee00-0000-4000-8000-000000000000",
        "schema": {"attributes": [
            {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 4},
            {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
            {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]}]},
        "epsilon": 2.0, "target_users": 10, "protocol": "vertical",
        "parties": [
            {"name": "bank", "attributes": [{"name": "age", "epsilon": 1.0},
                                            {"name": "sex", "epsilon": 2.0}]},
            {"name": "telco", "attributes": [{"name": "plan", "epsilon": 2.0}]}]});
    let app = Router::new().route(
        "/v1/collections/{id}",
        get(move || {
            let config = config.clone();
            async move { Json(config) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("http://{addr}");
    let id: Uuid = "c0ffee00-0000-4000-8000-000000000000".parse().unwrap();
    let err = PartyClient::connect(&url, id, "bank", "token", options(ldpsyn::MAX_EPSILON))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::EpsilonTooLarge { requested, max } if (requested, max) == (3.0, 2.0)),
        "{err:?}"
    );
    PartyClient::connect(&url, id, "telco", "token", options(ldpsyn::MAX_EPSILON))
        .await
        .unwrap();
}
