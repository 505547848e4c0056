//! The replay set and the group rows (`report_tokens`, `report_groups`, migration 8): a token
//! stored by one group commit is refused in a later one (a retry with the same report id is
//! told apart from a second answer), in the same group as fresh reports that are stored;
//! after a restart; and, on PostgreSQL (`LDPSYN_TEST_DATABASE_URL`), when two processes
//! insert the same token at once. The group rows hold exactly the inserted reports: a scan of
//! them equals the reduction of what was accepted. A whole group stored in a transaction of its
//! own (`Writer::append_group`) is stored whole or, on a replayed token or (PostgreSQL) a
//! collection no longer open in the database, not at all; and on PostgreSQL it waits for a
//! finalize holding the ingest barrier, then sees it. On SQLite, a group of tokens from
//! many fetches is staged (`report_tokens_staged`) and moved into the replay set later: a
//! staged token is refused like a stored one, by the writer that staged it and after a
//! restart, and counted and deleted with its collection.

mod common;

use std::collections::BTreeMap;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::{Payload, Protocol};
use ldpsyn_engine::{Engine, EngineOptions, TableKey, Tables};
use ldpsyn_service::storage::{Datastore, NewReport, StorageError, Writer};
use uuid::Uuid;

use common::{collection, postgres_url, reduce};

/// Attributes of 3 and 4 values, one-way GRR reports.
fn engine() -> Engine {
    Engine::from_parts(
        vec![3, 4],
        Epsilon::new(1.0).unwrap(),
        100,
        Protocol::Independence {},
        EngineOptions::default(),
    )
    .unwrap()
}

/// A report of collection `c` on token `nonce` (hex, as the server issues them) about
/// attribute `i % 2` (the second one cut at 2 into two bins, so that group rows carry bin maps).
fn report(c: Uuid, nonce: u32, i: u32) -> NewReport {
    let a = (i % 2) as usize;
    NewReport {
        collection: c,
        report_id: Uuid::new_v4(),
        nonce: format!("{nonce:032x}"),
        task_round: 0,
        key: TableKey {
            round: 0,
            factor: vec![a],
            mechanism: MechanismKind::Grr,
            bins: if a == 1 { vec![vec![2]] } else { vec![] },
        },
        payload: Payload::Grr(u64::from(i % (3 - a as u32))),
    }
}

/// Inserts `reports` in one transaction of `db`; returns which were inserted.
async fn insert(db: &Datastore, reports: &[&NewReport]) -> Vec<bool> {
    db.run_tx(|tx| Box::pin(tx.insert_reports(reports)))
        .await
        .unwrap()
}

/// The report that answered token `nonce` of collection `c`, and a scan of `c`'s group rows.
async fn stored(db: &Datastore, engine: &Engine, c: Uuid, nonce: &str) -> (Option<Uuid>, Tables) {
    db.run_tx(|tx| {
        Box::pin(async move {
            let report = tx.report_of_token(c, nonce).await?;
            Ok::<_, StorageError>((report, tx.scan_reports(engine, c).await?))
        })
    })
    .await
    .unwrap()
}

/// Replays in later groups, mixed with fresh reports of two collections, then after a
/// reconnect: the replayed tokens keep their first report, the fresh ones are stored once.
async fn replays_across_groups(url: &str) {
    let engine = engine();
    let db = Datastore::connect(url, 2).await.unwrap();
    let (a, b) = (collection(&db).await, collection(&db).await);
    // Nonces apart from other runs on the same PostgreSQL database: the collections are new.
    let first: Vec<NewReport> = (0..5)
        .map(|i| report(a, i, i))
        .chain((0..2).map(|i| report(b, i, i)))
        .collect();
    assert_eq!(
        insert(&db, &first.iter().collect::<Vec<_>>()).await,
        vec![true; 7]
    );

    // A later group: a retry (same id), a second answer (same token, another id), fresh
    // reports, and B's retry; the fresh ones around the replays are stored.
    let mut second_answer = report(a, 2, 7);
    second_answer.report_id = Uuid::new_v4();
    let (fresh_a, fresh_b) = (report(a, 5, 5), report(b, 9, 3));
    let second = [&first[1], &second_answer, &fresh_a, &first[5], &fresh_b];
    assert_eq!(
        insert(&db, &second).await,
        vec![false, false, true, false, true]
    );
    let (answered, scanned) = stored(&db, &engine, a, &first[2].nonce).await;
    assert_eq!(
        answered,
        Some(first[2].report_id),
        "the token keeps the report it answered first"
    );
    assert_eq!(db.count_reports(a).await.unwrap(), 6);
    assert_eq!(db.count_reports(b).await.unwrap(), 3);
    let accepted_a: Vec<&NewReport> = first[..5].iter().chain([&fresh_a]).collect();
    assert_eq!(
        scanned,
        reduce(&engine, accepted_a.iter().copied()),
        "the group rows hold exactly the inserted reports"
    );
    db.close().await;

    // After a restart, every stored token is still refused; a new one is stored.
    let db = Datastore::connect(url, 2).await.unwrap();
    let again: Vec<&NewReport> = first.iter().chain([&fresh_a, &fresh_b]).collect();
    assert_eq!(insert(&db, &again).await, vec![false; 9]);
    let after = report(a, 6, 0);
    assert_eq!(insert(&db, &[&fresh_a, &after]).await, vec![false, true]);
    assert_eq!(db.count_reports(a).await.unwrap(), 7);
    db.close().await;
}

#[tokio::test]
async fn replays_across_groups_sqlite() {
    let scratch = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", scratch.path().join("r.db").display());
    replays_across_groups(&url).await;
}

#[tokio::test]
async fn replays_across_groups_postgres() {
    if let Some(url) = postgres_url("replays_across_groups_postgres") {
        replays_across_groups(&url).await;
    }
}

/// Two processes (two pools) insert the same token in concurrent transactions, with fresh
/// reports beside it: the second waits for the first, then stores its fresh reports and not
/// the token; the token keeps the first process's report.
#[tokio::test]
async fn concurrent_replay_across_two_postgres_processes() {
    let Some(url) = postgres_url("concurrent_replay_across_two_postgres_processes") else {
        return;
    };
    let (one, two) = (
        Datastore::connect(&url, 2).await.unwrap(),
        Datastore::connect(&url, 2).await.unwrap(),
    );
    let c = collection(&one).await;
    let (mine, theirs) = (report(c, 1, 0), report(c, 1, 1));
    let (fresh, fresh_too) = (report(c, 2, 2), report(c, 3, 3));
    // The first transaction inserts, says so, and commits when told to.
    let (inserted_tx, inserted) = tokio::sync::oneshot::channel();
    let (commit_tx, commit) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (one, mine, fresh) = (one.clone(), mine.clone(), fresh.clone());
        tokio::spawn(async move {
            one.run_tx(|tx| {
                Box::pin(async move {
                    let r = tx.insert_reports(&[&mine, &fresh]).await?;
                    let _ = inserted_tx.send(r);
                    let _ = commit.await;
                    Ok::<_, StorageError>(())
                })
            })
            .await
            .unwrap()
        })
    };
    assert_eq!(inserted.await.unwrap(), vec![true, true]);
    let second = {
        let (two, theirs, fresh_too) = (two.clone(), theirs.clone(), fresh_too.clone());
        tokio::spawn(async move { insert(&two, &[&fresh_too, &theirs]).await })
    };
    // The second transaction is waiting on the first one's row (its key is not yet
    // committed); it cannot finish before this commit.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second insert waits for the first"
    );
    commit_tx.send(()).unwrap();
    first.await.unwrap();
    assert_eq!(second.await.unwrap(), vec![true, false]);
    let engine = engine();
    let (answered, scanned) = stored(&two, &engine, c, &mine.nonce).await;
    assert_eq!(answered, Some(mine.report_id));
    assert_eq!(scanned, reduce(&engine, [&mine, &fresh, &fresh_too]));
    one.close().await;
    two.close().await;
}

/// A whole group in a transaction of its own (`Writer::append_group`): with every token new
/// it stores the tokens, the group row, the count delta and the round counts, and returns
/// the counts and total; with one token already stored, or past a target, it writes nothing
/// at all and says so, and the statement-by-statement path then stores the fresh reports;
/// the writer goes on after a decline. On PostgreSQL it also declines, writing nothing, for
/// a collection finalized or deleted in the database.
async fn append_group_all_or_nothing(url: &str) {
    let engine = engine();
    let db = Datastore::connect(url, 2).await.unwrap();
    let c = collection(&db).await;
    let writer = tokio::sync::Mutex::new(Writer::new(db.clone()));
    let append_to = |c: Uuid, reports: Vec<NewReport>, rounds: Vec<(u32, u64)>, target| {
        let (engine, writer) = (engine.clone(), &writer);
        async move {
            let refs: Vec<&NewReport> = reports.iter().collect();
            let delta = reduce(&engine, refs.iter().copied());
            let rounds = BTreeMap::from_iter(rounds);
            let mut writer = writer.lock().await;
            let appended = writer.append_group(c, &refs, &delta, &rounds, target);
            appended.await.unwrap().map(|a| (a.rounds, a.total))
        }
    };
    let append = |c, reports, rounds| append_to(c, reports, rounds, None);
    let first: Vec<NewReport> = (0..6).map(|i| report(c, i, i)).collect();
    let written = append(c, first.clone(), vec![(0, 4), (1, 2)]).await;
    assert_eq!(written, Some(([(0, 4), (1, 2)].into(), 6)));
    let (_, scanned) = stored(&db, &engine, c, &first[0].nonce).await;
    let refs: Vec<&NewReport> = first.iter().collect();
    assert_eq!(scanned, reduce(&engine, refs.iter().copied()));
    let tables = db.tables(&engine, c).await.unwrap();
    assert_eq!(
        tables, scanned,
        "the count delta holds the group's statistics"
    );

    // A replayed token among fresh ones: nothing of the group is written.
    let later: Vec<NewReport> = vec![report(c, 10, 0), first[3].clone(), report(c, 11, 1)];
    assert_eq!(append(c, later.clone(), vec![(0, 3)]).await, None);
    assert_eq!(db.count_reports(c).await.unwrap(), 6);
    assert_eq!(db.tables(&engine, c).await.unwrap(), tables);
    assert_eq!(db.round_counts(c).await.unwrap(), vec![(0, 4), (1, 2)]);
    // The same reports statement by statement: the fresh ones are stored.
    let refs: Vec<&NewReport> = later.iter().collect();
    assert_eq!(insert(&db, &refs).await, vec![true, false, true]);
    assert_eq!(db.count_reports(c).await.unwrap(), 8);

    // A later group adds to the round counts (the two above were not counted in them).
    let third: Vec<NewReport> = (20..23).map(|i| report(c, i, i)).collect();
    let written = append(c, third, vec![(1, 3)]).await;
    assert_eq!(written, Some(([(1, 5)].into(), 9)));

    // With a target: a group that would pass it writes nothing; one that reaches it is
    // stored, and then no other fits.
    let fourth: Vec<NewReport> = (30..33).map(|i| report(c, i, i)).collect();
    let past = append_to(c, fourth.clone(), vec![(1, 3)], Some(11)).await;
    assert_eq!(past, None, "9 counted + 3 is past a target of 11");
    assert_eq!(db.count_reports(c).await.unwrap(), 11);
    assert_eq!(db.round_counts(c).await.unwrap(), vec![(0, 4), (1, 5)]);
    let reached = append_to(c, fourth, vec![(1, 3)], Some(12)).await;
    assert_eq!(reached, Some(([(1, 8)].into(), 12)));
    let fifth = vec![report(c, 40, 0)];
    assert_eq!(append_to(c, fifth, vec![(1, 1)], Some(12)).await, None);
    assert_eq!(db.count_reports(c).await.unwrap(), 14);

    if url.starts_with("postgres") {
        // Finalized in the database (as by another process): declined, nothing written.
        let finalized = r#"{"phase":"finalized"}"#;
        let sql = format!("UPDATE collections SET state = '{finalized}' WHERE id = '{c}'");
        db.run_tx(|tx| Box::pin(tx.execute_sql(&sql)))
            .await
            .unwrap();
        let sixth: Vec<NewReport> = (50..52).map(|i| report(c, i, i)).collect();
        assert_eq!(append(c, sixth, vec![(1, 2)]).await, None);
        assert_eq!(db.count_reports(c).await.unwrap(), 14);
        assert_eq!(db.round_counts(c).await.unwrap(), vec![(0, 4), (1, 8)]);
        // A collection the database does not store: declined, nothing written.
        let gone = Uuid::new_v4();
        let seventh: Vec<NewReport> = (60..62).map(|i| report(gone, i, i)).collect();
        assert_eq!(append(gone, seventh, vec![(0, 2)]).await, None);
        assert_eq!(db.count_reports(gone).await.unwrap(), 0);
        assert_eq!(db.round_counts(gone).await.unwrap(), vec![]);
    }
    // The writer keeps its connection, which the pool's close waits for.
    drop(writer);
    db.close().await;
}

#[tokio::test]
async fn append_group_all_or_nothing_sqlite() {
    let scratch = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", scratch.path().join("a.db").display());
    append_group_all_or_nothing(&url).await;
}

#[tokio::test]
async fn append_group_all_or_nothing_postgres() {
    if let Some(url) = postgres_url("append_group_all_or_nothing_postgres") {
        append_group_all_or_nothing(&url).await;
    }
}

/// A report of collection `c` on a token of its own fetch `f` (a nonce whose first 48 bits,
/// the fetch's issue millisecond, are `f`), about attribute `f % 2`.
fn fetched(c: Uuid, f: u64) -> NewReport {
    let mut r = report(c, 0, f as u32);
    r.nonce = format!("{f:012x}{:020x}", f * 7);
    r
}

/// Rows of `table` for collection `c`, read with a connection of its own.
async fn rows(url: &str, table: &str, c: Uuid) -> i64 {
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap();
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE collection_id = $1");
    sqlx::query_scalar(&sql)
        .bind(c.to_string())
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

/// SQLite stages the tokens of a group that answers many fetches: one row, counted as its
/// reports. A replay of a staged token is refused whether it comes in a staged group or in
/// one of a single fetch (whose tokens go straight into the replay set), from the writer
/// that staged it or from a new one (a restart), and a retry is told from a second answer.
/// Past `MERGE_STAGED_AT` staged tokens, the writer moves them all into `report_tokens`.
/// Deleting the collection counts and deletes its staged reports.
#[tokio::test]
async fn staged_tokens_are_the_replay_set_sqlite() {
    sqlx::any::install_default_drivers();
    let engine = engine();
    let scratch = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", scratch.path().join("s.db").display());
    let db = Datastore::connect(&url, 2).await.unwrap();
    let c = collection(&db).await;
    let append = async |writer: &mut Writer, reports: &[NewReport]| {
        let refs: Vec<&NewReport> = reports.iter().collect();
        let delta = reduce(&engine, refs.iter().copied());
        let rounds = BTreeMap::from([(0, reports.len() as u64)]);
        let appended = writer.append_group(c, &refs, &delta, &rounds, None).await;
        appended.unwrap().map(|a| a.total)
    };

    let mut writer = Writer::new(db.clone());
    let spread: Vec<NewReport> = (1..=5).map(|f| fetched(c, f)).collect();
    assert_eq!(append(&mut writer, &spread).await, Some(5));
    assert_eq!(rows(&url, "report_tokens_staged", c).await, 1);
    assert_eq!(rows(&url, "report_tokens", c).await, 0);
    assert_eq!(db.count_reports(c).await.unwrap(), 5);

    // The same writer: a staged group with a retry of a staged report, declined whole; the
    // statement-by-statement path stores the fresh one and tells the retry.
    let later = vec![fetched(c, 6), spread[2].clone()];
    assert_eq!(append(&mut writer, &later).await, None);
    let refs: Vec<&NewReport> = later.iter().collect();
    assert_eq!(insert(&db, &refs).await, vec![true, false]);
    let (answered, _) = stored(&db, &engine, c, &spread[2].nonce).await;
    assert_eq!(answered, Some(spread[2].report_id));
    assert_eq!(db.count_reports(c).await.unwrap(), 6);

    // More staged groups, then a restart before they move: a new writer refuses a second
    // answer to one of them in a staged group and in a group of one fetch.
    let more: Vec<NewReport> = (10..20).map(|f| fetched(c, f)).collect();
    // The total is of the round counts, which groups written statement by statement (the
    // fresh report above) do not add to.
    assert_eq!(append(&mut writer, &more).await, Some(15));
    assert_eq!(rows(&url, "report_tokens_staged", c).await, 1);
    drop(writer);
    let mut writer = Writer::new(db.clone());
    let mut second_answer = more[3].clone();
    second_answer.report_id = Uuid::new_v4();
    let staged_replay = vec![fetched(c, 30), second_answer.clone()];
    assert_eq!(append(&mut writer, &staged_replay).await, None);
    // One fetch's 40 tokens and the second answer, which shares their millisecond.
    let fetch = more[3].nonce[..12].to_owned();
    let mut one_fetch: Vec<NewReport> = (0..40u32)
        .map(|i| {
            let mut r = report(c, 0, i);
            r.nonce = format!("{fetch}{:020x}", 1000 + i);
            r
        })
        .collect();
    one_fetch.push(second_answer.clone());
    assert_eq!(append(&mut writer, &one_fetch).await, None);
    assert_eq!(rows(&url, "report_tokens_staged", c).await, 0, "moved");
    assert_eq!(rows(&url, "report_tokens", c).await, 16);
    one_fetch.pop();
    assert_eq!(append(&mut writer, &one_fetch).await, Some(55));
    assert_eq!(
        rows(&url, "report_tokens", c).await,
        56,
        "one fetch goes straight in"
    );
    let refs = [&second_answer];
    assert_eq!(insert(&db, &refs).await, vec![false]);
    let (answered, _) = stored(&db, &engine, c, &second_answer.nonce).await;
    assert_eq!(
        answered,
        Some(more[3].report_id),
        "a second answer is refused"
    );

    // Past MERGE_STAGED_AT (1,024) staged tokens the writer moves them.
    let mut next = 100;
    for _ in 0..17 {
        let group: Vec<NewReport> = (next..next + 64).map(|f| fetched(c, f)).collect();
        next += 64;
        assert!(append(&mut writer, &group).await.is_some());
    }
    let staged = rows(&url, "report_tokens_staged", c).await;
    assert!(staged < 17, "{staged} staged rows: they were not moved");
    assert_eq!(db.count_reports(c).await.unwrap(), 56 + 17 * 64);

    // Deleting the collection counts its staged reports and leaves none.
    drop(writer);
    let deleted = db
        .run_tx(|tx| Box::pin(tx.delete_collection(c)))
        .await
        .unwrap();
    assert_eq!(deleted, Some(56 + 17 * 64));
    assert_eq!(rows(&url, "report_tokens_staged", c).await, 0);
    assert_eq!(rows(&url, "report_tokens", c).await, 0);
    db.close().await;
}

/// PostgreSQL: a group appended while a finalize holds the ingest barrier waits for it, then
/// reads the collection as the finalize committed it, and writes nothing: the group's checks
/// read a snapshot taken after its locks, not before its wait.
#[tokio::test]
async fn append_group_waits_for_a_finalize_postgres() {
    let Some(url) = postgres_url("append_group_waits_for_a_finalize_postgres") else {
        return;
    };
    let engine = engine();
    let db = Datastore::connect(&url, 4).await.unwrap();
    let c = collection(&db).await;
    // The finalize: takes the barrier, marks the collection finalized, commits when told to.
    let (held_tx, held) = tokio::sync::oneshot::channel();
    let (commit_tx, commit) = tokio::sync::oneshot::channel::<()>();
    let finalize = {
        let db = db.clone();
        tokio::spawn(async move {
            db.run_tx(|tx| {
                Box::pin(async move {
                    tx.lock_ingest_exclusive(c).await?;
                    let finalized = r#"{"phase":"finalized"}"#;
                    let sql =
                        format!("UPDATE collections SET state = '{finalized}' WHERE id = '{c}'");
                    tx.execute_sql(&sql).await?;
                    let _ = held_tx.send(());
                    let _ = commit.await;
                    Ok::<_, StorageError>(())
                })
            })
            .await
            .unwrap()
        })
    };
    held.await.unwrap();
    let append = {
        let (db, engine) = (db.clone(), engine.clone());
        tokio::spawn(async move {
            let reports: Vec<NewReport> = (0..3).map(|i| report(c, i, i)).collect();
            let refs: Vec<&NewReport> = reports.iter().collect();
            let delta = reduce(&engine, refs.iter().copied());
            let mut writer = Writer::new(db);
            let rounds = BTreeMap::from([(0, 3)]);
            writer.append_group(c, &refs, &delta, &rounds, None).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!append.is_finished(), "the group waits at the barrier");
    commit_tx.send(()).unwrap();
    finalize.await.unwrap();
    assert_eq!(append.await.unwrap().unwrap(), None, "finalized meanwhile");
    assert_eq!(db.count_reports(c).await.unwrap(), 0);
    assert_eq!(db.round_counts(c).await.unwrap(), vec![]);
    db.close().await;
}
