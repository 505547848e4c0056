//! Count deltas (`count_deltas`, migration 10): a group commit appends its statistics as one
//! row, and every so many commits one of them folds a collection's rows into `table_counts`.
//! Whatever the order of appends and folds, a collection's tables as read (counts plus
//! deltas) equal a full scan of its stored reports; on PostgreSQL (`LDPSYN_TEST_DATABASE_URL`)
//! also when two processes fold at once, and for a reader while a fold is uncommitted.

mod common;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::{Payload, Protocol};
use ldpsyn_engine::{Engine, EngineOptions, TableKey, Tables};
use ldpsyn_service::storage::{Datastore, NewReport, StorageError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

use common::{collection, postgres_url, reduce};

/// Attributes of 3, 4 and 5 values, one-way and two-way GRR reports.
fn engine() -> Engine {
    Engine::from_parts(
        vec![3, 4, 5],
        Epsilon::new(1.0).unwrap(),
        100,
        Protocol::Independence {},
        EngineOptions::default(),
    )
    .unwrap()
}

/// A random report of collection `c` on token `nonce`: about one attribute (the second one
/// cut at 2 into two bins, so that deltas carry bin maps) or the pair of the first two, in
/// round 0 or 1.
fn report(c: Uuid, nonce: u32, rng: &mut StdRng) -> NewReport {
    let (factor, bins, cells): (Vec<usize>, Vec<Vec<u32>>, u64) = match rng.random_range(0..4) {
        0 => (vec![0], vec![], 3),
        1 => (vec![1], vec![vec![2]], 2),
        2 => (vec![2], vec![], 5),
        _ => (vec![0, 1], vec![], 12),
    };
    NewReport {
        collection: c,
        report_id: Uuid::new_v4(),
        nonce: format!("{nonce:032x}"),
        task_round: 0,
        key: TableKey {
            round: rng.random_range(0..2),
            factor,
            mechanism: MechanismKind::Grr,
            bins,
        },
        payload: Payload::Grr(rng.random_range(0..cells)),
    }
}

/// Commits `reports` of collection `c` as a group commit does: the reports, and their
/// statistics appended as a delta or, with `fold`, folded with every stored delta.
async fn commit(db: &Datastore, engine: &Engine, c: Uuid, reports: &[NewReport], fold: bool) {
    let delta = reduce(engine, reports);
    let refs: Vec<&NewReport> = reports.iter().collect();
    let (refs, delta) = (&refs, &delta);
    db.run_tx(|tx| {
        Box::pin(async move {
            assert!(tx.insert_reports(refs).await?.iter().all(|&f| f));
            if fold {
                tx.fold_count_deltas(engine, c, delta).await
            } else {
                tx.add_count_delta(c, delta).await
            }
        })
    })
    .await
    .unwrap();
}

/// Collection `c`'s tables as read, and a scan of its reports, in one transaction.
async fn read(db: &Datastore, engine: &Engine, c: Uuid) -> (Tables, Tables) {
    db.run_tx(|tx| {
        Box::pin(async move {
            let tables = tx.tables(engine, c).await?;
            Ok::<_, StorageError>((tables, tx.scan_reports(engine, c).await?))
        })
    })
    .await
    .unwrap()
}

/// Random groups with a fold at random commits, two collections interleaved: after every
/// commit, and after a reconnect, each collection's tables equal the scan of its reports.
async fn reads_equal_a_scan(url: &str, seed: u64) {
    let engine = engine();
    let db = Datastore::connect(url, 2).await.unwrap();
    let ids = [collection(&db).await, collection(&db).await];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut nonce = 0;
    let mut folds = 0;
    for _ in 0..40 {
        let c = ids[rng.random_range(0..2)];
        let size = rng.random_range(1..20);
        let reports: Vec<NewReport> = (0..size)
            .map(|_| {
                nonce += 1;
                report(c, nonce, &mut rng)
            })
            .collect();
        let fold = rng.random_bool(0.2);
        folds += usize::from(fold);
        commit(&db, &engine, c, &reports, fold).await;
        let (tables, scanned) = read(&db, &engine, c).await;
        assert_eq!(tables, scanned, "after a commit (fold: {fold})");
    }
    assert!(folds > 0, "the seed made no fold");
    db.close().await;
    let db = Datastore::connect(url, 2).await.unwrap();
    for c in ids {
        let (tables, scanned) = read(&db, &engine, c).await;
        assert!(scanned.values().map(|s| s.n).sum::<u64>() > 0);
        assert_eq!(tables, scanned, "after a reconnect");
    }
    db.close().await;
}

#[tokio::test]
async fn reads_equal_a_scan_sqlite() {
    for seed in 0..4 {
        let scratch = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", scratch.path().join("d.db").display());
        reads_equal_a_scan(&url, seed).await;
    }
}

#[tokio::test]
async fn reads_equal_a_scan_postgres() {
    if let Some(url) = postgres_url("reads_equal_a_scan_postgres") {
        for seed in 0..2 {
            reads_equal_a_scan(&url, seed).await;
        }
    }
}

/// Two processes (two pools) fold the same collection at once: the second waits for the
/// first one's delete, then finds its rows gone and folds only its own delta, so every delta
/// counts once. A reader meanwhile sees the state before the first fold, whole.
#[tokio::test]
async fn concurrent_folds_count_each_delta_once() {
    let Some(url) = postgres_url("concurrent_folds_count_each_delta_once") else {
        return;
    };
    let engine = engine();
    let (one, two) = (
        Datastore::connect(&url, 2).await.unwrap(),
        Datastore::connect(&url, 2).await.unwrap(),
    );
    let c = collection(&one).await;
    let mut rng = StdRng::seed_from_u64(7);
    let mut batch = |from: u32| -> Vec<NewReport> {
        (from..from + 10).map(|n| report(c, n, &mut rng)).collect()
    };
    let (stored, mine, theirs) = (batch(0), batch(100), batch(200));
    for chunk in stored.chunks(3) {
        commit(&one, &engine, c, chunk, false).await;
    }
    let before = read(&two, &engine, c).await.0;
    assert_eq!(before, reduce(&engine, &stored));

    // The first fold deletes the stored deltas and waits to commit.
    let (folded_tx, folded) = tokio::sync::oneshot::channel();
    let (commit_tx, commit_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (one, engine, mine) = (one.clone(), engine.clone(), mine.clone());
        tokio::spawn(async move {
            let delta = reduce(&engine, &mine);
            let refs: Vec<&NewReport> = mine.iter().collect();
            let (refs, delta, engine) = (&refs, &delta, &engine);
            one.run_tx(|tx| {
                Box::pin(async move {
                    tx.insert_reports(refs).await?;
                    tx.fold_count_deltas(engine, c, delta).await?;
                    let _ = folded_tx.send(());
                    let _ = commit_rx.await;
                    Ok::<_, StorageError>(())
                })
            })
            .await
            .unwrap()
        })
    };
    folded.await.unwrap();
    assert_eq!(
        read(&two, &engine, c).await.0,
        before,
        "an uncommitted fold changes nothing a reader sees"
    );
    let second = {
        let (two, engine, theirs) = (two.clone(), engine.clone(), theirs.clone());
        tokio::spawn(async move { commit(&two, &engine, c, &theirs, true).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second fold waits for the first one's rows"
    );
    commit_tx.send(()).unwrap();
    first.await.unwrap();
    second.await.unwrap();
    let (tables, scanned) = read(&one, &engine, c).await;
    let all: Vec<NewReport> = stored.into_iter().chain(mine).chain(theirs).collect();
    assert_eq!(scanned, reduce(&engine, &all));
    assert_eq!(tables, scanned, "every delta counts once");
    one.close().await;
    two.close().await;
}
