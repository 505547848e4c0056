//! Periodic upkeep (a tokio interval task that `serve` starts; the first pass runs at
//! startup): the round close of collections whose open round's quota is reached with no close
//! stored ([`close_due`]: a process that stopped between the commit that reached the quota and
//! the close's result, or a close that failed), the report retention sweep
//! ([`sweep_retention`]) and the finalize of collections
//! whose target was reached but which are not finalized yet ([`finalize_due`]: a process that
//! stopped between the commit that reached the target and its finalize, or a finalize that
//! failed). Both are safe to run in every process sharing a PostgreSQL database.

use std::time::Duration;

use serde::Deserialize;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::ingest::{Command, FinalizeStarted};
use super::storage::{Datastore, StorageError};
use ldpsyn_engine::Phase;

/// Seconds in a day of `retain_reports_days`.
const SECS_PER_DAY: i64 = 86_400;

/// One retention sweep at time `now` (Unix seconds; the serve loop passes the clock, tests
/// any time they like): deletes the raw reports (and vertical party records) of every
/// collection with `retain_reports_days = d` finalized at least `d` days before `now`,
/// keeping its tables, counts, state and config, so its model is served and rebuilt at
/// startup as before. Collections finalized before finalize times were stored (no
/// `finalized_at`) keep their reports. Returns the collections swept with the rows deleted.
/// Errors: the database's (a config that does not parse is skipped: loading reports it).
pub async fn sweep_retention(db: &Datastore, now: i64) -> Result<Vec<(Uuid, u64)>, StorageError> {
    /// The one field the sweep reads of a stored config.
    #[derive(Deserialize)]
    struct Retention {
        retain_reports_days: Option<u32>,
    }
    let mut swept = Vec::new();
    for (id, config, finalized_at) in db.finalized_with_reports().await? {
        let Ok(Retention {
            retain_reports_days: Some(days),
        }) = serde_json::from_str::<Retention>(&config)
        else {
            continue;
        };
        let cutoff = now - i64::from(days) * SECS_PER_DAY;
        if finalized_at > cutoff {
            continue;
        }
        if let Some(rows) = db.delete_raw_reports(id, cutoff, now).await? {
            tracing::info!(collection = %id, rows, days, "retention: raw reports deleted");
            swept.push((id, rows));
        }
    }
    Ok(swept)
}

/// Finalizes every collection of `state` that finalizes at its target
/// (`auto_finalize_at_target`), has reached it, and is not finalized, one after the other
/// (each waits for its model). Returns how many it finalized; a failure is logged and the
/// next pass tries again.
pub async fn finalize_due(state: &AppState) -> usize {
    let mut done = 0;
    for h in state.collections() {
        let due = h.config.auto_finalize_at_target
            && h.stops_at_target()
            && h.accepted() >= h.config.target_users
            && h.state().phase != Phase::Finalized
            && !h.is_deleted();
        if !due {
            continue;
        }
        tracing::info!(collection = %h.id, "target reached: finalizing (maintenance)");
        let handle = h.clone();
        let fitted = match state.ask(|reply| Command::Finalize { handle, reply }).await {
            Ok(FinalizeStarted::Ready(_)) => Ok(()),
            // One fit at a time from here: the pass waits for it.
            Ok(FinalizeStarted::Fitting(fit)) => match fit.await {
                Ok(r) => r.map(drop).map_err(ApiError::from),
                Err(_) => Err(ApiError::Internal("the model fit was dropped".into())),
            },
            Err(e) => Err(e),
        };
        match fitted {
            Ok(()) => done += 1,
            Err(e) => tracing::error!(collection = %h.id, error = %e, "finalize at target failed"),
        }
    }
    done
}

/// Starts a round close (off the committer) of every collection of `state` whose open round's
/// quota is reached and that has none running. Returns how many it started (they finish on
/// their own); a failure is logged and the next pass tries again.
pub async fn close_due(state: &AppState) -> usize {
    let handles = state.collections();
    match state
        .ask(|reply| Command::CloseDue { handles, reply })
        .await
    {
        Ok(n) => {
            if n > 0 {
                tracing::info!(
                    started = n,
                    "quota reached with no close: closing (maintenance)"
                );
            }
            n
        }
        Err(e) => {
            tracing::error!(error = %e, "starting due round closes failed");
            0
        }
    }
}

/// Runs [`close_due`], [`finalize_due`] and [`sweep_retention`] now and then every `period`,
/// until aborted.
pub(crate) fn spawn(state: AppState, period: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        // A pass that overran is not followed by a burst of catch-up passes.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            close_due(&state).await;
            finalize_due(&state).await;
            if let Err(e) = sweep_retention(state.db(), super::now_secs()).await {
                tracing::warn!(error = %e, "retention sweep failed; the next pass retries");
            }
        }
    })
}
