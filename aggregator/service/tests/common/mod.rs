//! Helpers of the storage tests (`report_groups`, `count_deltas`).

use ldpsyn::mechanism::SufficientStatistics;
use ldpsyn_engine::{Engine, Tables};
use ldpsyn_service::storage::{CollectionRow, Datastore, NewReport};
use uuid::Uuid;

/// The statistics of `reports`.
pub fn reduce<'a>(engine: &Engine, reports: impl IntoIterator<Item = &'a NewReport>) -> Tables {
    let mut t = Tables::new();
    for r in reports {
        let m = engine.mechanism(&r.key).unwrap();
        let s = t
            .entry(r.key.clone())
            .or_insert_with(|| SufficientStatistics::new(&m));
        m.accumulate(&r.payload, s).unwrap();
    }
    t
}

/// A new collection row in `db` (an empty config and state: storage does not read them).
pub async fn collection(db: &Datastore) -> Uuid {
    let id = Uuid::new_v4();
    let row = CollectionRow {
        id,
        config: "{}".into(),
        state: "{}".into(),
        state_version: 0,
    };
    db.insert_collection(&row, 0).await.unwrap();
    id
}

/// The PostgreSQL URL (`LDPSYN_TEST_DATABASE_URL`), or `None` after a `SKIPPED` line when
/// `LDPSYN_ALLOW_MISSING_SERVICES=1` allows running without it (else the test fails).
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("LDPSYN_TEST_DATABASE_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            assert!(
                std::env::var("LDPSYN_ALLOW_MISSING_SERVICES").as_deref() == Ok("1"),
                "{test}: LDPSYN_TEST_DATABASE_URL is not set. Provide it, or set \
                 LDPSYN_ALLOW_MISSING_SERVICES=1 to skip this test"
            );
            eprintln!("{test}: SKIPPED (no LDPSYN_TEST_DATABASE_URL)");
            None
        }
    }
}
