//! The native HTTP client against a real axum server started inside the test: it serves a
//! collection config and tasks, validates reports with the shared `Mechanism` code, and can
//! be told to fail in the ways the client must handle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::{BudgetLedger, MemoryLedger, ReportState};
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use ldpsyn::protocol::{
    CollectionConfig, PROBLEM_CONTENT_TYPE, Problem, ProblemType, Protocol, Report, ReportAnswer,
    ReportStatus, Task,
};
use ldpsyn::schema::Schema;
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
}

#[derive(Default)]
struct Seen {
    task_fetches: u32,
    tasks_issued: u32,
    upload_bodies: Vec<Vec<u8>>,
    accepted: Vec<Uuid>,
}

struct Fake {
    config: CollectionConfig,
    behaviour: Mutex<Behaviour>,
    seen: Mutex<Seen>,
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

async fn get_config(State(f): State<Arc<Fake>>) -> Json<CollectionConfig> {
    Json(f.config.clone())
}

async fn get_task(
    State(f): State<Arc<Fake>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let count: Option<u32> = q.get("count").map(|c| c.parse().unwrap());
    let start = {
        let mut s = f.seen.lock().unwrap();
        s.task_fetches += 1;
        let start = s.tasks_issued;
        s.tasks_issued += count.unwrap_or(1);
        start
    };
    match count {
        None => Json(task(&f, start)).into_response(),
        Some(n) => {
            Json((start..start + n).map(|i| task(&f, i)).collect::<Vec<_>>()).into_response()
        }
    }
}

async fn post_reports(State(f): State<Arc<Fake>>, body: axum::body::Bytes) -> Response {
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
    let fake = Arc::new(Fake {
        config: CollectionConfig {
            version: 1,
            id: Uuid::new_v4(),
            schema: schema(),
            epsilon: Epsilon::new(epsilon).unwrap(),
            target_users: 1000,
            protocol: Protocol::Independence {},
        },
        behaviour: Mutex::new(behaviour),
        seen: Mutex::new(Seen::default()),
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
    let mut o = ClientOptions::insecure_simulation(Epsilon::new(max).unwrap(), 42);
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
