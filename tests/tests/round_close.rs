//! Round closes run outside the committer (issue 33 item 6): the group commit that reaches a
//! round's quota commits its reports and answers them; the engine's close runs on a task of
//! its own, while uploads to every collection go on; its result is stored only if the state
//! has not changed since its snapshot (a finalize or an operator's close in between drops
//! it); and a reached quota left unclosed (a kill -9 before the close was stored) is closed
//! by the startup upkeep pass of the next process.
//!
//! The close is held with `CollectionHandle::hold_closes` (feature `test-util`) between its
//! snapshot and the engine's close, for as long as the test needs, so the test asserts on
//! states and order, never on time.

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::wire::ReportStatus;
use ldpsyn_tests::*;
use serde_json::{Value, json};
use uuid::Uuid;

async fn view(base: &str, id: Uuid) -> Value {
    admin(base, "GET", &format!("/v1/collections/{id}")).await.1
}

async fn client(base: &str, id: Uuid, seed: u64) -> Client<MemoryLedger> {
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), seed);
    Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap()
}

/// Uploads `n` people (seed `seed`) to `id` in batches of 100; every report is accepted.
async fn upload(base: &str, id: Uuid, n: usize, seed: u64) {
    let mut c = client(base, id, seed).await;
    let mut ps = people(&schema(), n, seed + 1000);
    for part in ps.chunks_mut(100) {
        for r in c.submit_batch(part).await.unwrap() {
            assert_eq!(r.unwrap().status, ReportStatus::Accepted);
        }
    }
}

/// A privincr collection (rounds with quotas) and its round-0 quota.
async fn privincr(base: &str) -> (Uuid, usize) {
    let id = create(
        base,
        json!({"protocol": "privincr", "epsilon": 4.0, "target_users": 4000}),
    )
    .await;
    let v = view(base, id).await;
    let quota = v["status"]["round_quota"].as_u64().unwrap() as usize;
    assert!(quota > 0 && quota < 4000, "{v}");
    (id, quota)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_committed_while_a_round_close_runs() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("r.db").display());
    let server = start(&db, &[]).await;
    let base = base(&server);
    let (a, quota) = privincr(&base).await;
    let b = create(
        &base,
        json!({"protocol": "independence", "epsilon": 4.0, "target_users": 100_000}),
    )
    .await;
    let handle = server.state().collection(a).await.unwrap();

    // A reaches its quota with its close held: the upload that reaches it is answered (all
    // accepted), the round is still open, a close is running.
    let hold = handle.hold_closes().await;
    upload(&base, a, quota, 1).await;
    let v = view(&base, a).await;
    assert_eq!(
        (&v["status"]["round"], &v["status"]["reports_accepted"]),
        (&json!(0), &json!(quota)),
        "{v}"
    );
    assert!(handle.close_running());

    // Meanwhile the committer is free: B's uploads are committed and answered, and A's
    // reports (round 0's tasks, as late reports) are accepted and counted in round 0.
    upload(&base, b, 300, 2).await;
    assert_eq!(view(&base, b).await["status"]["reports_accepted"], 300);
    upload(&base, a, 50, 3).await;
    assert_eq!(handle.round_count(0), quota as u64 + 50);
    let v = view(&base, a).await;
    assert_eq!(v["status"]["round"], 0, "still held: {v}");

    // Released, the close lands: the round advanced, every acknowledged report counted.
    drop(hold);
    let v = eventually("A's round 0 to close", || async {
        let v = view(&base, a).await;
        (v["status"]["round"] == 1).then_some(v)
    })
    .await;
    assert_eq!(v["status"]["reports_accepted"], quota + 50, "{v}");
    eventually("the close to finish", || async {
        (!handle.close_running()).then_some(())
    })
    .await;
    // Reports of round 1's tasks count there.
    upload(&base, a, 20, 4).await;
    assert_eq!(handle.round_count(1), 20);
}

/// A close whose snapshot was overtaken (a finalize, or the operator's synchronous
/// `close-round`, committed while it ran) is dropped: the state stays what the committer
/// stored last (its version too), not the stale close's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_result_is_dropped_when_the_state_changed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("d.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let (fin, quota) = privincr(&base).await;
    let (op, _) = privincr(&base).await;
    let hf = server.state().collection(fin).await.unwrap();
    let ho = server.state().collection(op).await.unwrap();
    let (hold_f, hold_o) = (hf.hold_closes().await, ho.hold_closes().await);
    upload(&base, fin, quota, 1).await;
    upload(&base, op, quota, 2).await;
    assert!(hf.close_running() && ho.close_running());

    // `fin` is finalized, `op` closed by the operator, while their quota closes are held.
    let (s, v) = admin(&base, "POST", &format!("/v1/collections/{fin}/finalize")).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = admin(&base, "POST", &format!("/v1/collections/{op}/close-round")).await;
    assert_eq!(s, 200, "{v}");
    let (vf, vo) = (hf.state_version(), ho.state_version());
    let before_op = view(&base, op).await;
    assert_eq!(before_op["status"]["round"], 1, "{before_op}");

    drop((hold_f, hold_o));
    eventually("both closes to finish", || async {
        (!hf.close_running() && !ho.close_running()).then_some(())
    })
    .await;
    let v = view(&base, fin).await;
    assert_eq!(v["status"]["phase"], "finalized", "not reopened: {v}");
    assert_eq!(hf.state_version(), vf, "nothing stored over the finalize");
    assert_eq!(
        ho.state_version(),
        vo,
        "nothing stored over the operator's close"
    );
    assert_eq!(view(&base, op).await["status"], before_op["status"]);
}

/// A reached quota whose close was never stored (the process stopped with it held, as a
/// kill -9 would leave it) is closed by the next process's startup upkeep pass, with every
/// acknowledged report counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reached_quota_left_unclosed_is_closed_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("s.db").display());
    let server = start(&db, &[]).await;
    let base = base(&server);
    let (a, quota) = privincr(&base).await;
    let handle = server.state().collection(a).await.unwrap();
    let hold = handle.hold_closes().await;
    upload(&base, a, quota + 10, 1).await;
    assert_eq!(view(&base, a).await["status"]["round"], 0);
    server.shutdown().await.unwrap();
    drop(hold);

    let second = start(&db, &[]).await;
    let base = ldpsyn_tests::base(&second);
    let v = eventually("the startup pass to close round 0", || async {
        let v = view(&base, a).await;
        (v["status"]["round"] == 1).then_some(v)
    })
    .await;
    assert_eq!(v["status"]["reports_accepted"], quota + 10, "{v}");
}
