//! The real binary. Crash safety: SIGKILL `ldpsyn-aggregator serve` while clients upload,
//! restart it on the same SQLite file, resend what was pending; every acknowledged report is
//! counted exactly once and the estimates equal a clean in-process reduction of the same
//! reports. Scale-out: two `serve` processes on one PostgreSQL database give the estimates
//! of one. The helpers (the process, people, uploads, reduction, figures) are in `load/`,
//! shared with `fault_injection.rs`; each kill case prints a `FAULT` figures line.

mod common;
mod load;

use std::time::{Duration, Instant};

use common::free_port;
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::{MemoryLedger, ReportState};
use ldpsyn::schema::Schema;
use ldpsyn::wire::CollectionConfig;
use ldpsyn_aggregator::engine::Engine;
use load::*;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_uploads_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("crash.db").display());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = spawn(&db, port);
    wait_healthy(&base).await;
    let http = reqwest::Client::new();
    let (id, config) = create(
        &http,
        &base,
        json!({"protocol": "privincr", "epsilon": 2.0, "target_users": 1_000_000_000u64}),
    )
    .await;
    let schema = config.schema.clone();

    // Four concurrent uploaders of 1500 people each; kill the server mid-way. Two send
    // batches of 10, whose group commits answer more fetches than a leaf of the replay set
    // holds tokens per fetch: their tokens are staged (`storage::Writer`), and some are
    // still staged at the kill (300-560 of about 1,300 committed in three runs here).
    let all = people(&schema, 6000);
    let mut tasks = Vec::new();
    for (i, chunk) in all.chunks(1500).enumerate() {
        tasks.push(tokio::spawn(upload_all(
            base.clone(),
            id,
            chunk.to_vec(),
            i as u64,
        )));
    }
    // Killed once some batches are committed (their answers sent), whatever the machine's
    // speed.
    status_until(&http, &base, id, "1000 reports committed", |s| {
        s["status"]["reports_accepted"].as_u64() >= Some(1000)
    })
    .await;
    child.0.kill().expect("SIGKILL");
    let _ = child.0.wait();
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = Vec::new();
    for t in tasks {
        people.extend(t.await.unwrap());
    }
    let acked_before = reports(&people, id, ReportState::Acknowledged);
    let pending = reports(&people, id, ReportState::Pending).len();
    eprintln!(
        "before the kill: {} acknowledged, {pending} pending",
        acked_before.len()
    );
    assert!(
        !acked_before.is_empty(),
        "some uploads finished before the kill"
    );

    // Restart on the same database (the fault ends as a supervisor restarts the process):
    // fresh people upload until one batch is acknowledged; then every acknowledged report
    // is there, counted once, and at most the pending ones were committed without an answer.
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let restarted = Instant::now();
    let _child = spawn(&db, port);
    let mut probe = load::people(&schema, 20);
    let recovery = recovery(&base, id, &mut probe, restarted).await;
    let mut figures = Figures {
        case: "sqlite-kill-9",
        acknowledged: acked_before.len(),
        pending,
        stored: accepted(&http, &base, id).await - probe.len() as u64,
        recovery,
        ..Figures::default()
    };
    people.extend(probe);
    let n = people.len();

    // Resend everything pending (same ids: accepted or duplicate), then everyone else; the
    // people already acknowledged are refused by their own ledgers (budget spent).
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 99);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for part in people.chunks_mut(1000) {
        for r in client.submit_batch(part).await.unwrap() {
            match r {
                Ok(_) | Err(ClientError::BudgetExhausted { .. }) => {}
                Err(e) => panic!("resubmission failed: {e}"),
            }
        }
    }
    let acked = reports(&people, id, ReportState::Acknowledged);
    assert_eq!(acked.len(), n, "everyone acknowledged once");
    let fin = admin(
        &http,
        "POST",
        format!("{base}/v1/collections/{id}/finalize"),
    )
    .await;
    figures.final_acknowledged = acked.len();
    figures.final_stored = fin["status"]["reports_accepted"].as_u64().unwrap();
    figures.check();

    // Estimates equal a clean reduction of the same reports.
    let engine = Engine::new(&config).unwrap();
    let tables = reduce(&engine, &acked);
    let mut state = engine.initial_state();
    engine.mark_finalized(&mut state);
    let clean = engine.finalize(&state, &tables).unwrap();
    assert_eq!(
        serde_json::to_value(clean.describe()).unwrap(),
        fin["model"]
    );
    let m = admin(
        &http,
        "GET",
        format!("{base}/v1/collections/{id}/marginals?attrs=a,b"),
    )
    .await;
    assert_eq!(m["frequencies"], json!(clean.frequencies(&[0, 1]).unwrap()));
}

/// Two `serve` processes on one PostgreSQL database (`LDPSYN_TEST_DATABASE_URL`; skipped
/// without it): people upload through either, a round closed through one is closed for
/// both, and both serve the model one process computes from the same reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_postgres_database() {
    let Some(db) = common::postgres_url("two_processes_share_one_postgres_database") else {
        return;
    };
    let (port_a, port_b) = (free_port(), free_port());
    let bases = [
        format!("http://127.0.0.1:{port_a}"),
        format!("http://127.0.0.1:{port_b}"),
    ];
    let _a = spawn(&db, port_a);
    let _b = spawn(&db, port_b);
    for b in &bases {
        wait_healthy(b).await;
    }
    let http = reqwest::Client::new();
    let (id, config) = create(
        &http,
        &bases[0],
        json!({"protocol": "privincr", "epsilon": 2.0, "target_users": 1_000_000_000u64,
               "rounds": 2}),
    )
    .await;
    let engine = Engine::new(&config).unwrap();
    let mut people = people(&config.schema, 4000);

    // Round 0 through both processes at once, then close it through the second one.
    let upload = |chunk: Vec<SimulatedPerson<MemoryLedger>>, base: String, seed: u64| {
        tokio::spawn(async move {
            let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), seed);
            let mut client = Client::connect(&base, id, options, MemoryLedger::default())
                .await
                .unwrap();
            let mut chunk = chunk;
            for part in chunk.chunks_mut(100) {
                for r in client.submit_batch(part).await.unwrap() {
                    r.unwrap();
                }
            }
            chunk
        })
    };
    let mut done = Vec::new();
    for (phase, range) in [(0u64, 0..2000), (1, 2000..4000)] {
        let batch: Vec<_> = people.drain(..range.len()).collect();
        let (x, y) = batch.split_at(batch.len() / 2);
        let ta = upload(x.to_vec(), bases[0].clone(), 10 * phase);
        let tb = upload(y.to_vec(), bases[1].clone(), 10 * phase + 1);
        done.extend(ta.await.unwrap());
        done.extend(tb.await.unwrap());
        if phase == 0 {
            admin(
                &http,
                "POST",
                format!("{}/v1/collections/{id}/close-round", bases[1]),
            )
            .await;
        }
    }
    let round0 = reports(&done[..2000], id, ReportState::Acknowledged);
    let all = reports(&done, id, ReportState::Acknowledged);
    assert_eq!((round0.len(), all.len()), (2000, 4000));

    // Each process sees every report and the closed round (after its refresh interval).
    for b in &bases {
        status_until(&http, b, id, "4000 reports in round 1", |s| {
            s["status"]["reports_accepted"] == 4000 && s["status"]["round"] == 1
        })
        .await;
    }

    // Finalize through the first; the second serves the same model, and both equal one
    // process's reduction: round 0 closed on its 2000 reports, the model on all 4000.
    let fin = admin(
        &http,
        "POST",
        format!("{}/v1/collections/{id}/finalize", bases[0]),
    )
    .await;
    let mut state = engine.initial_state();
    engine
        .close_round(&mut state, &reduce(&engine, &round0))
        .unwrap();
    engine.mark_finalized(&mut state);
    let clean = engine.finalize(&state, &reduce(&engine, &all)).unwrap();
    let clean = serde_json::to_value(clean.describe()).unwrap();
    assert_eq!(fin["model"], clean);
    model_served(&http, &bases[1], id).await;
    let other = admin(
        &http,
        "GET",
        format!("{}/v1/collections/{id}/model", bases[1]),
    )
    .await;
    assert_eq!(
        other["model"], fin["model"],
        "both processes serve the same model"
    );
}

/// `LDPSYN_TEST_DATABASE_URL` and two healthy `serve` processes on it with their base URLs;
/// `None` (the test `name` prints that it was skipped) without the variable.
async fn two_postgres_processes(name: &str) -> Option<(String, [(Server, String); 2])> {
    let db = common::postgres_url(name)?;
    let (port_a, port_b) = (free_port(), free_port());
    let servers = [port_a, port_b].map(|p| (spawn(&db, p), format!("http://127.0.0.1:{p}")));
    for (_, base) in &servers {
        wait_healthy(base).await;
    }
    Some((db, servers))
}

/// Finalize through one process while the other is under upload load (PostgreSQL): no
/// report commits after finalize read its tables — the model is exactly the reduction of
/// the acknowledged reports, the others were answered `collection-finalized` — and both
/// processes and a restart serve the same synthetic bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalize_through_one_process_while_another_ingests() {
    let Some((db, [(a, base_a), (_b, base_b)])) =
        two_postgres_processes("finalize_through_one_process_while_another_ingests").await
    else {
        return;
    };
    let http = reqwest::Client::new();
    let (id, config) = create(
        &http,
        &base_a,
        json!({"protocol": "independence", "epsilon": 2.0, "target_users": 1_000_000_000u64}),
    )
    .await;
    let engine = Engine::new(&config).unwrap();

    // Two uploaders through B; finalize through A once B has accepted some.
    let all = people(&config.schema, 16_000);
    let tasks: Vec<_> = all
        .chunks(8000)
        .enumerate()
        .map(|(i, c)| tokio::spawn(upload_all(base_b.clone(), id, c.to_vec(), 70 + i as u64)))
        .collect();
    let start = Instant::now();
    loop {
        let s = admin(&http, "GET", format!("{base_b}/v1/collections/{id}")).await;
        if s["status"]["reports_accepted"].as_u64().unwrap_or(0) >= 1500 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "uploads stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin(
        &http,
        "POST",
        format!("{base_a}/v1/collections/{id}/finalize"),
    )
    .await;
    let mut done = Vec::new();
    for t in tasks {
        done.extend(t.await.unwrap());
    }
    let acked = reports(&done, id, ReportState::Acknowledged);
    assert!(
        (1500..16_000).contains(&acked.len()),
        "finalize happened mid-upload: {} acknowledged",
        acked.len()
    );

    // A's model is exactly the reduction of the acknowledged reports.
    let mut state = engine.initial_state();
    engine.mark_finalized(&mut state);
    let clean = engine.finalize(&state, &reduce(&engine, &acked)).unwrap();
    let served = admin(
        &http,
        "GET",
        format!("{base_a}/v1/collections/{id}/marginals?attrs=a,b"),
    )
    .await;
    let expected = clean.frequencies(&[0, 1]).unwrap();
    assert_eq!(
        served["frequencies"],
        json!(expected),
        "{} acknowledged reports, model of another set",
        acked.len()
    );

    // Same synthetic bytes from A, from B (after its refresh) and from A restarted.
    let synthetic = |base: String| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!(
                    "{base}/v1/collections/{id}/synthetic?rows=2000&seed=5"
                ))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{base}");
            r.bytes().await.unwrap()
        }
    };
    let from_a = synthetic(base_a.clone()).await;
    model_served(&http, &base_b, id).await;
    assert_eq!(synthetic(base_b.clone()).await, from_a, "process B");
    drop(a);
    let port_c = free_port();
    let base_c = format!("http://127.0.0.1:{port_c}");
    let _c = spawn(&db, port_c);
    wait_healthy(&base_c).await;
    model_served(&http, &base_c, id).await;
    assert_eq!(synthetic(base_c).await, from_a, "after a restart");
}

/// `ldpsyn_collection_lookups_total` of a server's `/metrics`.
async fn lookups(http: &reqwest::Client, base: &str) -> u64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ldpsyn_collection_lookups_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the lookup counter is exported")
}

/// PostgreSQL, two processes: a collection created through A is loaded once by B however
/// many requests ask for it at once (single flight), and requests for an unknown id reach
/// the database once per negative-cache period, not once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_and_unknown_ids_are_looked_up_once() {
    let Some((_db, [(_a, base_a), (_b, base_b)])) =
        two_postgres_processes("new_and_unknown_ids_are_looked_up_once").await
    else {
        return;
    };
    let http = reqwest::Client::new();
    let before = lookups(&http, &base_b).await;
    let (id, _) = create(
        &http,
        &base_a,
        json!({"protocol": "independence", "epsilon": 1.0, "target_users": 1000}),
    )
    .await;
    let gets = |path: String, n: usize| {
        let http = http.clone();
        async move {
            let calls = (0..n).map(|_| {
                let (http, path) = (http.clone(), path.clone());
                tokio::spawn(async move { http.get(path).send().await.unwrap().status().as_u16() })
            });
            let mut statuses = Vec::new();
            for c in calls.collect::<Vec<_>>() {
                statuses.push(c.await.unwrap());
            }
            statuses
        }
    };
    let statuses = gets(format!("{base_b}/v1/collections/{id}"), 32).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    // Loaded by one request (or by B's refresher first, then none).
    let after_new = lookups(&http, &base_b).await;
    assert!(after_new - before <= 1, "{before} → {after_new}");

    let missing = Uuid::new_v4();
    let statuses = gets(format!("{base_b}/v1/collections/{missing}"), 32).await;
    assert!(statuses.iter().all(|&s| s == 404), "{statuses:?}");
    for _ in 0..20 {
        let s = http
            .get(format!("{base_b}/v1/collections/{missing}/task"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s, 404);
    }
    assert_eq!(
        lookups(&http, &base_b).await,
        after_new + 1,
        "52 requests, one lookup"
    );
}

/// PostgreSQL, two processes under upload load: SIGKILL one. No acknowledged report is lost,
/// the survivor keeps accepting, the killed one restarts and converges (same count, same
/// estimates), and everything equals one clean reduction of the acknowledged reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_one_of_two_postgres_processes() {
    let Some((db, [(mut a, base_a), (_b, base_b)])) =
        two_postgres_processes("sigkill_one_of_two_postgres_processes").await
    else {
        return;
    };
    let http = reqwest::Client::new();
    let (id, config) = create(
        &http,
        &base_a,
        json!({"protocol": "samprivsyn", "epsilon": 2.0, "target_users": 1_000_000_000u64,
               "batch_size": 500}),
    )
    .await;
    // Two uploaders per process; kill A while they run.
    let all = people(&config.schema, 8000);
    let tasks: Vec<_> = all
        .chunks(2000)
        .enumerate()
        .map(|(i, c)| {
            let base = if i % 2 == 0 { &base_a } else { &base_b };
            tokio::spawn(upload_all(base.clone(), id, c.to_vec(), 40 + i as u64))
        })
        .collect();
    status_until(&http, &base_a, id, "some reports committed", |s| {
        s["status"]["reports_accepted"].as_u64() >= Some(200)
    })
    .await;
    a.0.kill().expect("SIGKILL");
    let _ = a.0.wait();
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = Vec::new();
    for t in tasks {
        people.extend(t.await.unwrap());
    }
    let acked_before = reports(&people, id, ReportState::Acknowledged).len();
    let pending = reports(&people, id, ReportState::Pending).len();
    eprintln!("at the kill: {acked_before} acknowledged, {pending} pending");
    // The survivor counts what A committed at its next refresh (500 ms): wait for it, with
    // a deadline of ten refresh intervals.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let seen = loop {
        let s = admin(&http, "GET", format!("{base_b}/v1/collections/{id}")).await;
        let seen = s["status"]["reports_accepted"].as_u64().unwrap();
        if seen >= acked_before as u64 || std::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        (acked_before as u64..=(acked_before + pending) as u64).contains(&seen),
        "survivor counts {seen}: {acked_before} acknowledged, {pending} pending"
    );

    // A restarts; everyone not yet acknowledged (pending ones resent with their own bytes)
    // goes through the survivor and the restarted process alike.
    // The fault ends as a supervisor restarts A (as C); its recovery is until C acknowledges
    // an upload (the survivor never stopped).
    let port_c = free_port();
    let base_c = format!("http://127.0.0.1:{port_c}");
    let restarted = Instant::now();
    let _c = spawn(&db, port_c);
    let mut probe = load::people(&config.schema, 20);
    let mut figures = Figures {
        case: "postgres-kill-9-one-of-two",
        acknowledged: acked_before,
        pending,
        stored: seen,
        recovery: recovery(&base_c, id, &mut probe, restarted).await,
        ..Figures::default()
    };
    people.extend(probe);
    let n = people.len();
    for (i, part) in people.chunks_mut(2000).enumerate() {
        let base = if i % 2 == 0 { &base_c } else { &base_b };
        let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 90 + i as u64);
        let mut client = Client::connect(base, id, options, MemoryLedger::default())
            .await
            .unwrap();
        for chunk in part.chunks_mut(500) {
            for r in client.submit_batch(chunk).await.unwrap() {
                match r {
                    Ok(_) | Err(ClientError::BudgetExhausted { .. }) => {}
                    Err(e) => panic!("resubmission failed: {e}"),
                }
            }
        }
    }
    let acked = reports(&people, id, ReportState::Acknowledged);
    assert_eq!(acked.len(), n, "everyone acknowledged once");

    // Both processes converge on the same count and, after finalize, the same model: one
    // clean reduction of the acknowledged reports (with the rounds each closed).
    for b in [&base_b, &base_c] {
        status_until(&http, b, id, "every report", |s| {
            s["status"]["reports_accepted"] == n
        })
        .await;
    }
    let fin = admin(
        &http,
        "POST",
        format!("{base_c}/v1/collections/{id}/finalize"),
    )
    .await;
    figures.final_acknowledged = n;
    figures.final_stored = fin["status"]["reports_accepted"].as_u64().unwrap();
    figures.check();
    for b in [&base_b, &base_c] {
        model_served(&http, b, id).await;
    }
    let engine = Engine::new(&config).unwrap();
    let tables = reduce(&engine, &acked);
    let mut state = engine.initial_state();
    engine.mark_finalized(&mut state);
    // SamPrivSyn pools every batch in round 0: the reduction does not depend on the closes.
    let clean = engine.finalize(&state, &tables).unwrap();
    let expected = json!(clean.frequencies(&[0, 1]).unwrap());
    for b in [&base_b, &base_c] {
        let m = admin(
            &http,
            "GET",
            format!("{b}/v1/collections/{id}/marginals?attrs=a,b"),
        )
        .await;
        assert_eq!(m["frequencies"], expected, "{b}");
    }
}

/// While a process loads its state (here: rebuilding the table counts of 60,000 reports
/// stored before them) its port answers at once — `/healthz` 503 `unavailable`, a problem
/// document — and then 200 with everything loaded; no request hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_503_until_the_state_is_loaded() {
    use ldpsyn::mechanism::MechanismKind;
    use ldpsyn::wire::Payload;
    use ldpsyn_aggregator::engine::TableKey;
    use ldpsyn_aggregator::service::storage::{CollectionRow, Datastore, NewReport};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("slow.db").display());
    let config = json!({"version": 1, "id": Uuid::nil(), "schema": schema(),
        "epsilon": 2.0, "target_users": 1_000_000_000u64, "protocol": "independence"});
    let config: CollectionConfig = serde_json::from_value(config).unwrap();
    let id = Uuid::new_v4();
    {
        let db = Datastore::connect(&url, 2).await.unwrap();
        let engine = Engine::new(&config).unwrap();
        let row = CollectionRow {
            id,
            config: serde_json::to_string(&CollectionConfig {
                auto_finalize_at_target: false,
                past_target: ldpsyn::wire::PastTarget::Accept,
                retain_reports_days: None,
                target: Vec::new(),
                name: None,
                description: None,
                id,
                ..config.clone()
            })
            .unwrap(),
            state: serde_json::to_string(&engine.initial_state()).unwrap(),
            state_version: 0,
        };
        db.insert_collection(&row, 0).await.unwrap();
        let reports: Vec<NewReport> = (0..60_000u32)
            .map(|i| NewReport {
                collection: id,
                report_id: Uuid::new_v4(),
                nonce: format!("{i:032x}"),
                task_round: 0,
                key: TableKey {
                    round: 0,
                    factor: vec![(i % 3) as usize],
                    mechanism: MechanismKind::Grr,
                    bins: vec![],
                },
                payload: Payload::Grr(u64::from(i % 2)),
            })
            .collect();
        for chunk in reports.chunks(4096) {
            let chunk: Vec<&NewReport> = chunk.iter().collect();
            db.run_tx(|tx| Box::pin(async move { tx.insert_reports(&chunk).await }))
                .await
                .unwrap();
        }
        // As stored before table counts: their rebuild is the slow part of the start.
        db.run_tx(|tx| Box::pin(tx.execute_sql("DELETE FROM table_counts_ready")))
            .await
            .unwrap();
        db.close().await;
    }
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = spawn(&url, port);
    let http = reqwest::Client::new();
    let (mut unavailable, start) = (0, Instant::now());
    loop {
        assert!(start.elapsed() < Duration::from_secs(60), "never ready");
        let Ok(r) = http.get(format!("{base}/healthz")).send().await else {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue; // not bound yet
        };
        match r.status().as_u16() {
            200 => break,
            503 => {
                let problem: Value = r.json().await.unwrap();
                assert!(problem["type"].as_str().unwrap().ends_with("unavailable"));
                unavailable += 1;
            }
            other => panic!("healthz answered {other}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(unavailable > 0, "the port answered 503 while loading");
    let s = admin(&http, "GET", format!("{base}/v1/collections/{id}")).await;
    assert_eq!(
        s["status"]["reports_accepted"], 60_000,
        "rebuilt from the reports: {s}"
    );
}

/// Issue 33 item 10: every PostgreSQL session pins `synchronous_commit = on`, even when the
/// server, role or connection string says `off` (an acknowledged report must survive a crash).
/// Runs only with `LDPSYN_TEST_DATABASE_URL`.
#[tokio::test]
async fn postgres_sessions_pin_synchronous_commit() {
    use ldpsyn_aggregator::service::storage::Datastore;
    let Some(url) = common::postgres_url("postgres_sessions_pin_synchronous_commit") else {
        return;
    };
    // The connection string asks for `off`; the session must say `on`.
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-c%20synchronous_commit%3Doff");
    let db = Datastore::connect(&url, 2).await.unwrap();
    for _ in 0..2 {
        let value = db.fetch_text("SHOW synchronous_commit").await.unwrap();
        assert_eq!(value, "on");
    }
}

/// A wide schema for [`sigkill_during_a_finalize_fit_loses_nothing`]: `d` categorical
/// attributes of `labels` labels.
fn wide_schema(d: usize, labels: usize) -> Value {
    let attrs: Vec<Value> = (0..d)
        .map(|i| {
            let labels: Vec<String> = (0..labels).map(|l| l.to_string()).collect();
            json!({"name": format!("x{i}"), "type": "categorical", "labels": labels})
        })
        .collect();
    json!({ "attributes": attrs })
}

/// People of a chain: each attribute a noisy copy of the one before (so every pair is
/// dependent and the model keeps many of them).
fn chain_people(schema: &Schema, n: usize, seed: u64) -> Vec<SimulatedPerson<MemoryLedger>> {
    let dims = schema.domain_sizes();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut codes = Vec::with_capacity(dims.len());
            for (i, &k) in dims.iter().enumerate() {
                let c = if i > 0 && rng.random::<f64>() < 0.8 {
                    codes[i - 1] % k as u32
                } else {
                    rng.random_range(0..k as u32)
                };
                codes.push(c);
            }
            SimulatedPerson {
                record: schema.encoded(codes).unwrap(),
                ledger: MemoryLedger::default(),
            }
        })
        .collect()
}

/// SIGKILL while a finalize fits the model (issue 33): a wide `privincr` collection (every
/// pair measured in its one round, so the fit takes seconds) is fed through the SDK; a
/// finalize starts; once the server shows the collection finalized with its model not ready
/// (the fit is running, polled, not timed) the process is killed. Restarted on the same
/// SQLite file it has every acknowledged report, finishes the fit, and serves the model an
/// uninterrupted finalize of the same reports gives (computed here in-process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_finalize_fit_loses_nothing() {
    let (d, labels, n) = (30, 10, 12_000);
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fit.db").display());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = spawn(&db, port);
    wait_healthy(&base).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": wide_schema(d, labels), "protocol": "privincr",
            "epsilon": 4.0, "target_users": 1_000_000_000u64}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let config: CollectionConfig = serde_json::from_value(created).unwrap();

    let started = Instant::now();
    let mut people = chain_people(&config.schema, n, 7);
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), 3);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for part in people.chunks_mut(1000) {
        for r in client.submit_batch(part).await.unwrap() {
            r.unwrap();
        }
    }
    let acked = reports(&people, id, ReportState::Acknowledged);
    assert_eq!(
        acked.len(),
        n,
        "every report acknowledged before the finalize"
    );
    eprintln!("{n} reports uploaded in {:?}", started.elapsed());
    let status = status_until(&http, &base, id, "all reports counted", |s| {
        s["status"]["reports_accepted"].as_u64() == Some(n as u64)
    })
    .await;
    assert_eq!(status["status"]["round"], 0, "one round: {status}");

    // Finalize; kill the process while its fit runs (finalized state committed, no model).
    let fit_started = Instant::now();
    let finalize = tokio::spawn({
        let (http, url) = (http.clone(), format!("{base}/v1/collections/{id}/finalize"));
        async move { http.post(url).bearer_auth(ADMIN).send().await }
    });
    let seen = status_until(&http, &base, id, "finalized", |s| {
        s["status"]["phase"] == "finalized"
    })
    .await;
    assert_eq!(
        seen["status"]["model_ready"],
        false,
        "the fit ended before the kill (after {:?}): make it longer",
        fit_started.elapsed()
    );
    child.0.kill().expect("SIGKILL");
    let _ = child.0.wait();
    eprintln!("killed {:?} into the finalize", fit_started.elapsed());
    // Killed within the finalize's wait, it never answered; a fit longer than the wait
    // answered 202 first (the fit goes on, and died with the process).
    let answered = finalize.await.unwrap();
    assert!(
        answered.as_ref().map_or(true, |r| r.status() == 202),
        "the killed finalize answered only that the fit goes on: {answered:?}"
    );

    // Restarted on the same file: every acknowledged report is there, and the fit completes
    // with the model of an uninterrupted finalize.
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let restarted = Instant::now();
    let _child = spawn(&db, port);
    wait_healthy(&base).await;
    let status = admin(&http, "GET", format!("{base}/v1/collections/{id}")).await;
    // A finalized collection takes no upload: it has recovered once it answers.
    let recovery = restarted.elapsed();
    assert_eq!(status["status"]["reports_accepted"], n, "{status}");
    assert_eq!(status["status"]["phase"], "finalized", "{status}");
    // The finalize answers 200 with the model, or 202 while the refit goes on.
    admin(
        &http,
        "POST",
        format!("{base}/v1/collections/{id}/finalize"),
    )
    .await;
    model_served(&http, &base, id).await;
    let fin = admin(&http, "GET", format!("{base}/v1/collections/{id}/model")).await;
    let after = admin(&http, "GET", format!("{base}/v1/collections/{id}")).await;
    Figures {
        case: "sqlite-kill-9-during-finalize",
        acknowledged: n,
        pending: 0,
        stored: status["status"]["reports_accepted"].as_u64().unwrap(),
        final_acknowledged: n,
        final_stored: after["status"]["reports_accepted"].as_u64().unwrap(),
        recovery,
    }
    .check();
    eprintln!("restart to model: {:?}", restarted.elapsed());
    let engine = Engine::new(&config).unwrap();
    let mut state = engine.initial_state();
    engine.mark_finalized(&mut state);
    let clean = engine.finalize(&state, &reduce(&engine, &acked)).unwrap();
    assert_eq!(
        serde_json::to_value(clean.describe()).unwrap(),
        fin["model"],
        "the restarted fit is the uninterrupted one"
    );
}
