//! Issue 67: operator input that used to abort or stall the server, and creates that are safe
//! to retry. Over real HTTP against an in-process server on SQLite.

use ldpsyn::wire::ProblemType;
use ldpsyn_tests::*;
use serde_json::{Value, json};

async fn post(base: &str, body: &Value) -> (u16, Value) {
    post_raw(&format!("{base}/v1/collections"), ADMIN, body.clone()).await
}

/// Item 1: a create may name its id; the same request again answers 200 with the stored
/// collection and creates nothing, another config under that id is 409, an id that is not a
/// UUID a 400, and a create without an id still gets a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_with_a_client_chosen_id_is_safe_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("i.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let id = uuid::Uuid::new_v4();
    let body = json!({"id": id, "schema": schema_json(), "protocol": "auto",
                      "epsilon": 4.0, "target_users": 1000});
    let (status, first) = post(&base, &body).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["id"], json!(id));
    let (status, again) = post(&base, &body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], json!(id));
    let (_, listed) = admin(&base, "GET", "/v1/collections").await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    let mut other = body.clone();
    other["epsilon"] = json!(2.0);
    let (status, problem) = post(&base, &other).await;
    assert_eq!(
        (status, problem_kind(&problem)),
        (409, Some(ProblemType::Conflict)),
        "{problem}"
    );
    let mut bad = body.clone();
    bad["id"] = json!("collection-1");
    let (status, problem) = post(&base, &bad).await;
    assert_eq!(status, 400, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("UUID"),
        "{problem}"
    );
    let mut fresh = body.clone();
    fresh.as_object_mut().unwrap().remove("id");
    let (status, created) = post(&base, &fresh).await;
    assert_eq!(status, 201, "{created}");
    assert_ne!(created["id"], json!(id));
    let (_, listed) = admin(&base, "GET", "/v1/collections").await;
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
}

/// Item 1: `auto` over attributes of the largest domain (32,768 labels) is created without
/// allocating their full pair table (2³⁰ cells aborted the process), and the server keeps
/// answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_domains_create_without_aborting() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("l.db").display());
    let server = start(&db, &["--max-body-bytes", "8000000"]).await;
    let base = base(&server);
    let labels: Vec<String> = (0..32_768).map(|i| format!("v{i}")).collect();
    for (attributes, users) in [(2, 1_000_000u64), (4, 100_000)] {
        let schema = json!({"attributes": (0..attributes)
            .map(|a| json!({"name": format!("a{a}"), "type": "categorical", "labels": labels}))
            .collect::<Vec<_>>()});
        let body = json!({"schema": schema, "protocol": "auto", "epsilon": 4.0,
                          "target_users": users});
        let (status, created) = post(&base, &body).await;
        assert_eq!(status, 201, "{attributes} attributes: {created}");
        let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
        assert_eq!(health.status(), 200);
    }
}

/// Item 5: a resend of a stored report after its token expired is answered `duplicate` (it
/// was `token-expired`, and the device dropped a report the server holds); a report never
/// stored under an expired token is still `token-expired`; the count stays one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_token_expiry_is_a_duplicate() {
    use ldpsyn::Epsilon;
    use ldpsyn::wire::{CollectionConfig, Task};
    use rand::SeedableRng;

    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let server = start(&db, &["--task-ttl-secs", "1"]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"schema": schema_json(), "protocol": "independence",
                                  "epsilon": 2.0, "target_users": 1000}),
    )
    .await;
    let (_, config) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    let config: CollectionConfig = serde_json::from_value(config).unwrap();
    let (_, tasks) = admin(&base, "GET", &format!("/v1/collections/{id}/task?count=2")).await;
    let tasks: Vec<Task> = serde_json::from_value(tasks).unwrap();
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
    let record = schema().encoded(vec![0; schema().len()]).unwrap();
    let report = |t: &Task, rng: &mut rand_chacha::ChaCha12Rng| {
        ldpsyn::submission::randomize_task(&config, Epsilon::new(2.0).unwrap(), t, &record, rng)
            .unwrap()
    };
    let (stored, never) = (report(&tasks[0], &mut rng), report(&tasks[1], &mut rng));
    let upload = |body: Value| {
        let base = base.clone();
        async move {
            let v: Value = reqwest::Client::new()
                .post(format!("{base}/v1/collections/{id}/reports"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v
        }
    };
    let first = upload(json!([stored])).await;
    assert_eq!(first[0]["status"], "accepted", "{first}");
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let late = upload(json!([stored, never])).await;
    assert_eq!(late[0]["status"], "duplicate", "{late}");
    assert_eq!(late[1]["status"], "rejected", "{late}");
    assert_eq!(
        problem_kind(&late[1]["problem"]),
        Some(ProblemType::TokenExpired),
        "{late}"
    );
    let (_, status) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(status["status"]["reports_accepted"], 1, "{status}");
}

/// Item 4: the in-flight limit is one for the whole service, as documented. Two uploads
/// that trickle their bodies hold the two places of `--max-in-flight-requests 2`; a request
/// to another route is then shed (503), and answered once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_limit_holds_across_routes() {
    let (_dir, _server, base, id) = serve_one(&["--max-in-flight-requests", "2"]).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    for _ in 0..2 {
        slow.push(slow_upload(&addr, "127.0.0.1", id).await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let other = reqwest::get(format!("{base}/v1/collections/{id}"))
        .await
        .unwrap();
    assert_eq!(other.status(), 503, "another route got past a full service");
    drop(slow);
    eventually("the service answers again", || {
        let url = format!("{base}/v1/collections/{id}");
        async move {
            let r = reqwest::get(url).await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
}

/// A server on a fresh SQLite file with the options `extra`, holding an independence
/// collection of 1,000 people: its folder (kept while the test runs), the server, its base URL
/// and the collection's id.
async fn serve_one(
    extra: &[&str],
) -> (
    tempfile::TempDir,
    ldpsyn_service::Server,
    String,
    uuid::Uuid,
) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("one.db").display());
    let server = start(&db, extra).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 2.0, "target_users": 1000}),
    )
    .await;
    (dir, server, base, id)
}

/// A report upload to `addr` that declares a 100 kB body and sends one byte of it, from the
/// local address `from`: it holds its place in flight for as long as the server lets it.
async fn slow_upload(addr: &str, from: &str, id: impl std::fmt::Display) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    let head = format!(
        "POST /v1/collections/{id}/reports HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n["
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

/// Issue 67 item 4: a body trickled slower than `--min-body-bytes-per-sec` is cut once its
/// grace is over and answered 408 `request-timeout` (which the SDKs retry), freeing its
/// place: before, it held it until the request timeout (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_minimum_rate_is_cut() {
    use tokio::io::AsyncReadExt;

    let (_dir, _server, base, id) =
        serve_one(&["--min-body-bytes-per-sec", "1000", "--body-grace-ms", "300"]).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut s = slow_upload(&addr, "127.0.0.1", id).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        s.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "no answer to a stalled body: {answer}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("urn:ldpsyn:problem:request-timeout") && answer.contains("1000 bytes/s"),
        "{answer}"
    );
    let (_, v) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(v["status"]["reports_accepted"], 0, "nothing stored");
}

/// Issue 67 item 4: one client (an address) holds at most `--max-in-flight-per-ip` requests:
/// its next one is refused 429 at once with `Retry-After`, while a client on another address
/// is served; before, one address could take every place of the service-wide limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_hold_every_place_in_flight() {
    let (_dir, _server, base, id) = serve_one(&[
        "--max-in-flight-per-ip",
        "2",
        "--max-in-flight-requests",
        "8",
    ])
    .await;
    let addr = base.trim_start_matches("http://").to_owned();
    let slow = [
        slow_upload(&addr, "127.0.0.1", id).await,
        slow_upload(&addr, "127.0.0.1", id).await,
    ];
    let from = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let url = format!("{base}/v1/collections/{id}");
    let refused = eventually("the third request of 127.0.0.1 to be refused", || {
        let (c, url) = (from("127.0.0.1"), url.clone());
        async move {
            let r = c.get(url).send().await.ok()?;
            (r.status() == 429).then_some(r)
        }
    })
    .await;
    assert_eq!(refused.headers()["retry-after"], "1");
    let p: Value = refused.json().await.unwrap();
    assert_eq!(problem_kind(&p), Some(ProblemType::RateLimited));
    assert!(p["detail"].as_str().unwrap().contains("in flight"), "{p}");
    let other = from("127.0.0.2").get(&url).send().await.unwrap();
    assert_eq!(other.status(), 200, "another client is served");
    drop(slow);
    eventually("127.0.0.1 is served again", || {
        let (c, url) = (from("127.0.0.1"), url.clone());
        async move {
            let r = c.get(url).send().await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
}
