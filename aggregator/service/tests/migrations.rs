//! Upgrading a database written by an earlier release keeps every stored report: a SQLite
//! file migrated to the first schema only, with reports in it, then opened by the current
//! `Datastore::connect` (which runs the remaining migrations and, on SQLite, rebuilds the replay
//! set and the round counts as `WITHOUT ROWID` tables).

use std::path::PathBuf;

use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::Payload;
use ldpsyn_engine::TableKey;
use ldpsyn_service::storage::{Datastore, NewReport, StorageError};
use sqlx::migrate::Migrator;
use uuid::Uuid;

#[tokio::test]
async fn upgrade_keeps_reports_and_token_identity() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    // The first migration alone, as the first release shipped it.
    let first = dir.join("migrations");
    std::fs::create_dir_all(&first).unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert!(names.len() >= 2, "this test needs a later migration");
    std::fs::copy(root.join(&names[0]), first.join(&names[0])).unwrap();

    let url = format!("sqlite://{}?mode=rwc", dir.join("old.db").display());
    sqlx::any::install_default_drivers();
    let collection = Uuid::new_v4();
    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    {
        let pool = sqlx::AnyPool::connect(&url).await.unwrap();
        Migrator::new(first.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (i, id) in ids.iter().enumerate() {
            sqlx::query(
                "INSERT INTO reports (collection_id, report_id, token_nonce, round, factor, mechanism, payload) \
                 VALUES ($1, $2, $3, 0, '0', 'grr', $4)",
            )
            .bind(collection.to_string())
            .bind(id.to_string())
            .bind(format!("{i:032x}"))
            .bind(format!("{{\"grr\":{i}}}"))
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }

    let db = Datastore::connect(&url, 2).await.unwrap();
    assert_eq!(db.count_reports(collection).await.unwrap(), 3);
    for (i, id) in ids.iter().enumerate() {
        let nonce = format!("{i:032x}");
        let stored = db
            .run_tx(|tx| Box::pin(tx.report_of_token(collection, &nonce)))
            .await
            .unwrap();
        assert_eq!(stored, Some(*id), "report {i} kept with its token");
    }
    // Their payloads moved to group rows (migration 8): a scan finds report i in cell i.
    let engine = ldpsyn_engine::Engine::from_parts(
        vec![3],
        ldpsyn::Epsilon::new(1.0).unwrap(),
        100,
        ldpsyn::wire::Protocol::Independence {},
        ldpsyn_engine::EngineOptions::default(),
    )
    .unwrap();
    let scanned = db
        .run_tx(|tx| Box::pin(tx.scan_reports(&engine, collection)))
        .await
        .unwrap();
    let grr0 = TableKey {
        round: 0,
        factor: vec![0],
        mechanism: MechanismKind::Grr,
        bins: vec![],
    };
    assert_eq!(scanned.len(), 1);
    assert_eq!(
        (scanned[&grr0].n, &scanned[&grr0].counts[..]),
        (3, &[1, 1, 1][..])
    );
    // The token is the report's identity now: a second answer to token 0 is not stored,
    // a report on a new token is.
    let report = |nonce: String| NewReport {
        collection,
        report_id: Uuid::new_v4(),
        nonce,
        task_round: 0,
        key: TableKey {
            round: 0,
            factor: vec![0],
            mechanism: MechanismKind::Grr,
            bins: vec![],
        },
        payload: Payload::Grr(1),
    };
    let (again, fresh) = (report(format!("{:032x}", 0)), report(format!("{:032x}", 9)));
    let both = [&again, &fresh];
    let inserted = db
        .run_tx(|tx| Box::pin(tx.insert_reports(&both)))
        .await
        .unwrap();
    assert_eq!(inserted, vec![false, true]);
    assert_eq!(db.count_reports(collection).await.unwrap(), 4);
    db.close().await;

    // On SQLite the replay set and the round counts were rebuilt as WITHOUT ROWID tables
    // (`Datastore::connect`), with their rows; opening the file again changes nothing.
    let db = Datastore::connect(&url, 2).await.unwrap();
    assert_eq!(db.count_reports(collection).await.unwrap(), 4);
    let inserted = db
        .run_tx(|tx| Box::pin(tx.insert_reports(&both)))
        .await
        .unwrap();
    assert_eq!(inserted, vec![false, false], "both tokens are kept");
    db.close().await;
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    for table in ["report_tokens", "round_counts"] {
        let sql: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = $1")
            .bind(table)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(sql.contains("WITHOUT ROWID"), "{table}: {sql}");
    }
    pool.close().await;
}

/// A collection stored by an earlier release keeps its state: the flat state JSON (every
/// protocol's fields, and the `z` field `auto` used to record per edge) written under the
/// first schema reads back, after the current migrations, as the tagged state.
#[tokio::test]
async fn upgrade_keeps_stored_collection_state() {
    use ldpsyn_engine::{CollectionState, Phase, ProtocolState};
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let first = dir.join("migrations");
    std::fs::create_dir_all(&first).unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    std::fs::copy(root.join(&names[0]), first.join(&names[0])).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("old.db").display());
    sqlx::any::install_default_drivers();
    let id = Uuid::new_v4();
    let old_state = r#"{"protocol":"privincr","phase":"graph_construction","round":2,
        "round_quota":1000,"edges":[{"a":0,"b":1,"active":false,"pruned_in":1,"mi":0.01,
        "tau":0.045,"ell":0.02,"reports":900,"score":null,"z":null}],"plan":null,
        "pair_weights":[]}"#;
    {
        let pool = sqlx::AnyPool::connect(&url).await.unwrap();
        Migrator::new(first.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO collections (id, config, state, state_version, created_at) \
             VALUES ($1, '{}', $2, 7, 0)",
        )
        .bind(id.to_string())
        .bind(old_state)
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let db = Datastore::connect(&url, 2).await.unwrap();
    let row = db.collection(id).await.unwrap().expect("collection kept");
    assert_eq!(row.state_version, 7);
    let state: CollectionState = serde_json::from_str(&row.state).unwrap();
    assert_eq!(state.phase, Phase::GraphConstruction);
    assert_eq!((state.round, state.round_quota), (2, Some(1000)));
    assert!(matches!(state.protocol, ProtocolState::Privincr(_)));
    assert_eq!(state.edges().len(), 1);
    assert_eq!(state.edges()[0].pruned_in, Some(1));
    db.close().await;
}

/// Table counts: a collection stored before they existed (reports, no counts) gets them
/// rebuilt from its reports once, and from then on the counts the ingest path adds in the
/// same transaction as its reports equal a full scan of the reports.
#[tokio::test]
async fn table_counts_rebuild_and_track_the_reports() {
    use ldpsyn::Epsilon;
    use ldpsyn::mechanism::SufficientStatistics;
    use ldpsyn::wire::Protocol;
    use ldpsyn_engine::{Engine, EngineOptions, Tables};
    use ldpsyn_service::storage::CollectionRow;

    let scratch = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        scratch.path().join("c.db").display()
    );
    let db = Datastore::connect(&url, 2).await.unwrap();
    let engine = Engine::from_parts(
        vec![3, 4],
        Epsilon::new(1.0).unwrap(),
        100,
        Protocol::Independence {},
        EngineOptions::default(),
    )
    .unwrap();
    let id = Uuid::new_v4();
    let row = CollectionRow {
        id,
        config: "{}".into(),
        state: "{}".into(),
        state_version: 0,
    };
    db.insert_collection(&row, 0).await.unwrap();
    let report = |i: u32, a: usize| NewReport {
        collection: id,
        report_id: Uuid::new_v4(),
        nonce: format!("{a}-{i:030x}"),
        task_round: 0,
        key: TableKey {
            round: 0,
            factor: vec![a],
            mechanism: MechanismKind::Grr,
            bins: vec![],
        },
        payload: Payload::Grr(u64::from(i % (3 + a as u32))),
    };
    // Reports as an earlier release stored them: no counts, no marker.
    let old: Vec<NewReport> = (0..40).map(|i| report(i, (i % 2) as usize)).collect();
    let old: Vec<&NewReport> = old.iter().collect();
    db.run_tx(|tx| {
        Box::pin(async move {
            tx.insert_reports(&old).await?;
            tx.execute_sql("DELETE FROM table_counts_ready").await
        })
    })
    .await
    .unwrap();
    let rebuilt = db.rebuild_table_counts(&engine, id).await.unwrap();
    // A full scan of the group rows, and the tables as read (from the table counts).
    let (db, engine) = (&db, &engine);
    let read = || {
        db.run_tx(|tx| {
            Box::pin(async move {
                let scanned = tx.scan_reports(engine, id).await?;
                Ok::<_, StorageError>((scanned, tx.tables(engine, id).await?))
            })
        })
    };
    let (scanned, tables) = read().await.unwrap();
    assert_eq!(rebuilt, scanned);
    assert_eq!(rebuilt.values().map(|s| s.n).sum::<u64>(), 40);
    assert_eq!(tables, scanned);

    // New reports with their counts, as the ingest path writes them.
    let new: Vec<NewReport> = (40..100).map(|i| report(i, (i % 2) as usize)).collect();
    let mut delta = Tables::new();
    for r in &new {
        let m = engine.mechanism(&r.key).unwrap();
        let s = delta
            .entry(r.key.clone())
            .or_insert_with(|| SufficientStatistics::new(&m));
        m.accumulate(&r.payload, s).unwrap();
    }
    let new: Vec<&NewReport> = new.iter().collect();
    let delta = &delta;
    db.run_tx(|tx| {
        Box::pin(async move {
            tx.insert_reports(&new).await?;
            tx.add_table_counts(id, delta).await
        })
    })
    .await
    .unwrap();
    let (scanned, tables) = read().await.unwrap();
    assert_eq!(scanned.values().map(|s| s.n).sum::<u64>(), 100);
    assert_eq!(tables, scanned);
    db.close().await;
}

/// A migrated SQLite database in a temporary folder, then `sql` run on it as a later migration
/// or an operator might have: the folder (kept while it lives) and the database URL.
async fn sqlite_changed_by(sql: &str) -> (tempfile::TempDir, String) {
    let scratch = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", scratch.path().join("r.db").display());
    Datastore::connect(&url, 2).await.unwrap().close().await;
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::raw_sql(sql).execute(&pool).await.unwrap();
    pool.close().await;
    (scratch, url)
}

/// The `WITHOUT ROWID` rebuild starts from the stored definition: a replay set that a later
/// migration gave one more column and an index is rebuilt with both, and keeps its rows whole.
#[tokio::test]
async fn rowid_rebuild_keeps_a_changed_table() {
    let (_scratch, url) = sqlite_changed_by(
        "DROP TABLE report_tokens; \
         CREATE TABLE report_tokens (collection_id TEXT NOT NULL, token_nonce TEXT NOT NULL, \
         report_id TEXT NOT NULL, extra TEXT, PRIMARY KEY (collection_id, token_nonce)); \
         CREATE INDEX report_tokens_extra ON report_tokens (extra); \
         INSERT INTO report_tokens VALUES ('c', 'n1', 'r1', 'x1'), ('c', 'n2', 'r2', NULL)",
    )
    .await;

    Datastore::connect(&url, 2).await.unwrap().close().await;
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let sql: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = $1")
        .bind("report_tokens")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        sql.ends_with("WITHOUT ROWID") && sql.contains("extra TEXT"),
        "{sql}"
    );
    let index: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE name = 'report_tokens_extra'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(index, 1, "the table's index is created again");
    let rows: Vec<(String, String, String, Option<String>)> =
        sqlx::query_as("SELECT * FROM report_tokens ORDER BY token_nonce")
            .fetch_all(&pool)
            .await
            .unwrap();
    let row = |n: &str, r: &str, x: Option<&str>| {
        (
            "c".to_owned(),
            n.to_owned(),
            r.to_owned(),
            x.map(str::to_owned),
        )
    };
    assert_eq!(rows, [row("n1", "r1", Some("x1")), row("n2", "r2", None)]);
    pool.close().await;
}

/// A replay set that cannot be a `WITHOUT ROWID` table (no primary key) is refused at startup,
/// and left as it was with its rows.
#[tokio::test]
async fn rowid_rebuild_refuses_a_table_without_key() {
    let keyless = "CREATE TABLE report_tokens (collection_id TEXT NOT NULL, \
                   token_nonce TEXT NOT NULL, report_id TEXT NOT NULL)";
    let (_scratch, url) = sqlite_changed_by(&format!(
        "DROP TABLE report_tokens; {keyless}; INSERT INTO report_tokens VALUES ('c', 'n', 'r')"
    ))
    .await;

    let err = Datastore::connect(&url, 2).await.expect_err("refused");
    assert!(
        matches!(&err, StorageError::Database(_)) && err.to_string().contains("PRIMARY KEY"),
        "{err}"
    );
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let sql: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = $1")
        .bind("report_tokens")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sql, keyless);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM report_tokens")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    pool.close().await;
}
