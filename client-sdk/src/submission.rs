//! The submission rules shared by the native HTTP client and the WASM client: the typed
//! errors, the checks of a config and a task against what the app accepts, and the
//! randomization of one record for one task. No networking here.

use rand::Rng;
use uuid::Uuid;

use crate::Epsilon;
use crate::factor::{DEFAULT_MAX_CELLS, Factor, FactorError, binned_codes, binned_domain_sizes};
use crate::ledger::{
    BudgetLedger, DeviceBudget, LedgerEntry, LedgerError, NextStep, ReportState, next_step_within,
    update,
};
use crate::mechanism::{Mechanism, MechanismError};
use crate::schema::{EncodedRecord, RecordError};
use crate::wire::{
    CollectionConfig, PROTOCOL_VERSION, Problem, ProblemType, Report, ReportAnswer, ReportStatus,
    Task,
};

/// Errors of a submission (native or WASM client). [`ClientError::problem_type`] maps each to the shared list.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The record does not fit the schema; nothing was fetched or spent.
    #[error("invalid record: {0}")]
    Record(#[from] RecordError),
    /// The config or a task asks more ε than the app accepts; nothing was spent.
    #[error("server asks epsilon {requested}, above the accepted maximum {max}")]
    EpsilonTooLarge {
        /// ε asked for.
        requested: f64,
        /// The app's maximum.
        max: f64,
    },
    /// The task does not match the collection's public config; nothing was spent.
    #[error("invalid task from server: {0}")]
    InvalidTask(String),
    /// This device already spent its budget for the collection.
    #[error(
        "privacy budget for collection {collection} is exhausted (epsilon {epsilon_spent} spent)"
    )]
    BudgetExhausted {
        /// The collection.
        collection: Uuid,
        /// ε already spent.
        epsilon_spent: f64,
    },
    /// Randomizing for this collection would take the ε this device spent on all
    /// collections within its [`DeviceBudget`]'s window above the cap; nothing was randomized
    /// or sent. Problem type `budget-exhausted`, as [`ClientError::BudgetExhausted`].
    #[error(
        "device privacy budget exhausted: epsilon {spent_in_window} spent within the window, \
         {requested} more for collection {collection} would exceed the cap {max_epsilon}"
    )]
    DeviceBudgetExhausted {
        /// The collection.
        collection: Uuid,
        /// ε spent on every collection within the window.
        spent_in_window: f64,
        /// ε the collection's report would spend.
        requested: f64,
        /// The device's cap.
        max_epsilon: f64,
    },
    /// The server answered with a problem (a 4xx, or a per-report `rejected`).
    #[error("server problem {}: {}", .0.problem_type, .0.detail)]
    Problem(Problem),
    /// The server kept failing (5xx, 429) or could not be reached after every retry. A
    /// report that was already randomized stays pending; the next `submit` resends it.
    #[error("aggregator unavailable after {attempts} attempts: {last_error}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last_error: String,
    },
    /// A report (or a party's record) is larger, alone in an upload, than the server's
    /// published body limit allows ([`crate::wire::UploadLimits`], less the clients'
    /// margin): it is not sent, since no upload could carry it. A randomized report stays
    /// pending in the ledger (its budget is spent); it goes out once the server takes larger
    /// bodies. Problem type `payload-too-large`.
    #[error(
        "a report of {bytes} bytes cannot be sent: the server takes bodies of at most \
         {max_body_bytes} bytes (clients keep a 1/64 margin)"
    )]
    ReportTooLarge {
        /// The smallest upload body holding the report, bytes.
        bytes: u64,
        /// The server's published body limit, bytes.
        max_body_bytes: u64,
    },
    /// The server's answer could not be understood.
    #[error("unexpected answer from the aggregator: {0}")]
    Protocol(String),
    /// The budget ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl ClientError {
    /// The problem type of the shared list this error corresponds to.
    pub fn problem_type(&self) -> ProblemType {
        match self {
            ClientError::Record(_) => ProblemType::InvalidRecord,
            ClientError::EpsilonTooLarge { .. } => ProblemType::EpsilonTooLarge,
            ClientError::InvalidTask(_) | ClientError::Protocol(_) => ProblemType::MalformedRequest,
            ClientError::BudgetExhausted { .. } | ClientError::DeviceBudgetExhausted { .. } => {
                ProblemType::BudgetExhausted
            }
            ClientError::Problem(p) => p.problem_type,
            ClientError::ReportTooLarge { .. } => ProblemType::PayloadTooLarge,
            ClientError::Unavailable { .. } => ProblemType::Unavailable,
            ClientError::Ledger(_) => ProblemType::Internal,
        }
    }
}

/// The outcome of a successful submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    /// The collection.
    pub collection_id: Uuid,
    /// The report id.
    pub report_id: Uuid,
    /// `accepted`, or `duplicate` when a resend found the report already committed.
    pub status: ReportStatus,
    /// ε spent on this report.
    pub epsilon_spent: f64,
}

/// What the app accepts to spend: ε per report, and optionally a device-wide cap across
/// collections. Shared by the native client's options and the WASM client's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendLimits {
    /// The largest ε per report; configs and tasks asking more are refused.
    pub max_epsilon: Epsilon,
    /// The device-wide cap over a rolling window, if any.
    pub device_budget: Option<DeviceBudget>,
}

/// The ledger's decision for `collection` as a result: the report to resend (`Some`),
/// nothing yet (`None`: randomize), or the refusal ([`ClientError::BudgetExhausted`],
/// [`ClientError::DeviceBudgetExhausted`]).
pub fn decision(collection: Uuid, step: NextStep) -> Result<Option<Report>, ClientError> {
    match step {
        NextStep::Randomize => Ok(None),
        NextStep::Resend(report) => Ok(Some(report)),
        NextStep::Exhausted { epsilon_spent } => Err(ClientError::BudgetExhausted {
            collection,
            epsilon_spent,
        }),
        NextStep::DeviceBudgetExhausted {
            spent_in_window,
            requested,
            max_epsilon,
        } => Err(ClientError::DeviceBudgetExhausted {
            collection,
            spent_in_window,
            requested,
            max_epsilon,
        }),
    }
}

/// Checks a fetched public config: protocol version, the collection asked for, and
/// ε ≤ `max_epsilon`.
///
/// Errors: [`ClientError::Protocol`], [`ClientError::EpsilonTooLarge`].
pub fn check_config(
    config: &CollectionConfig,
    collection_id: Uuid,
    max_epsilon: Epsilon,
) -> Result<(), ClientError> {
    if config.version != PROTOCOL_VERSION {
        return Err(ClientError::Protocol(format!(
            "protocol version {} (this SDK speaks {PROTOCOL_VERSION})",
            config.version
        )));
    }
    if config.id != collection_id {
        return Err(ClientError::Protocol("config of another collection".into()));
    }
    check_epsilon(config.epsilon, max_epsilon)
}

fn check_epsilon(requested: Epsilon, max: Epsilon) -> Result<(), ClientError> {
    if requested > max {
        return Err(ClientError::EpsilonTooLarge {
            requested: requested.get(),
            max: max.get(),
        });
    }
    Ok(())
}

/// Checks `task` against the collection config and the app's maximum ε, then randomizes the
/// record's factor value, mapped through the task's bin maps if it has any, with the task's
/// mechanism. Shared by the native and WASM clients.
///
/// Errors: [`ClientError::EpsilonTooLarge`], [`ClientError::InvalidTask`] (other collection,
/// ε differing from the config's, unknown attributes, invalid bin maps, mechanism not fitting
/// the (binned) factor).
pub fn randomize_task<R: Rng + ?Sized>(
    config: &CollectionConfig,
    max_epsilon: Epsilon,
    task: &Task,
    record: &EncodedRecord,
    rng: &mut R,
) -> Result<Report, ClientError> {
    check_epsilon(task.epsilon, max_epsilon)?;
    if task.collection_id != config.id {
        return Err(ClientError::InvalidTask(
            "task of another collection".into(),
        ));
    }
    if task.epsilon != config.epsilon {
        return Err(ClientError::InvalidTask(format!(
            "task epsilon {} differs from the collection's {}",
            task.epsilon, config.epsilon
        )));
    }
    let invalid = |e: FactorError| ClientError::InvalidTask(e.to_string());
    let sizes = binned_domain_sizes(&config.schema.domain_sizes(), &task.factor, &task.bins)
        .map_err(invalid)?;
    let factor = Factor::new(task.factor.clone(), &sizes, DEFAULT_MAX_CELLS).map_err(invalid)?;
    let mechanism = Mechanism::new(task.mechanism, task.epsilon, factor.dims())
        .map_err(|e: MechanismError| ClientError::InvalidTask(e.to_string()))?;
    let codes: Vec<u32> = binned_codes(record.codes(), factor.attributes(), &task.bins).collect();
    let payload = mechanism
        .randomize(&codes, rng)
        .map_err(|e| ClientError::InvalidTask(e.to_string()))?;
    Ok(Report {
        id: uuid::Builder::from_random_bytes(rng.random()).into_uuid(),
        token: task.token.clone(),
        payload,
    })
}

/// The submission step that must not race: inside one [`BudgetLedger::transact`] (for a
/// [`crate::ledger::FileLedger`], under its file lock), decides again on the entries read
/// afresh ([`next_step_within`], with `limits.device_budget` at `now_unix_ms`, ms since the
/// Unix epoch) and, if the collection still needs a report, randomizes `record` for `task`
/// ([`randomize_task`]) and records the pending report stamped `now_unix_ms`. Another client
/// sharing the ledger (another process on the same file) that decided meanwhile is seen
/// here, so a collection is randomized for once and the device cap holds across them.
/// Returns the report to send: the new one, or the pending one that other client recorded
/// (resent, spending nothing).
///
/// Errors: [`ClientError::BudgetExhausted`] (the other client's report was already
/// answered), [`ClientError::DeviceBudgetExhausted`], [`randomize_task`]'s (nothing
/// recorded in all three cases), the ledger's.
pub fn randomize_and_record<L: BudgetLedger + ?Sized, R: Rng + ?Sized>(
    ledger: &mut L,
    config: &CollectionConfig,
    limits: &SpendLimits,
    now_unix_ms: u64,
    task: &Task,
    record: &EncodedRecord,
    rng: &mut R,
) -> Result<Report, ClientError> {
    let collection = config.id;
    update(ledger, collection, |entries| {
        let step = next_step_within(
            entries,
            collection,
            config.epsilon.get(),
            limits.device_budget.as_ref(),
            now_unix_ms,
        );
        match decision(collection, step) {
            Ok(None) => match randomize_task(config, limits.max_epsilon, task, record, rng) {
                Ok(report) => (Some(pending_entry(task, &report, now_unix_ms)), Ok(report)),
                Err(e) => (None, Err(e)),
            },
            Ok(Some(report)) => (None, Ok(report)),
            Err(e) => (None, Err(e)),
        }
    })?
}

/// The ledger entry recorded before `report` (answering `task`) leaves the device, spent at
/// `spent_at_unix_ms` (ms since the Unix epoch).
pub fn pending_entry(task: &Task, report: &Report, spent_at_unix_ms: u64) -> LedgerEntry {
    LedgerEntry {
        epsilon_spent: task.epsilon.get(),
        report: report.clone(),
        state: ReportState::Pending,
        spent_at_unix_ms: Some(spent_at_unix_ms),
    }
}

/// The ledger's entry of `collection`, which must hold the pending report `report_id`.
/// Errors: the ledger's own, or [`ClientError::Protocol`] when it no longer holds that report.
pub fn pending_of<L: BudgetLedger + ?Sized>(
    ledger: &L,
    collection: Uuid,
    report_id: Uuid,
) -> Result<LedgerEntry, ClientError> {
    ledger
        .get(collection)?
        .filter(|e| e.report.id == report_id)
        .ok_or_else(|| ClientError::Protocol("ledger lost the pending report".into()))
}

/// Settles the pending report `report_id` of `collection` with the outcome of its one-report
/// upload and stores the entry: an answer goes through [`apply_answer`]; a problem answer to
/// the whole upload ([`ClientError::Problem`]) refuses the report (the budget stays spent);
/// any other error leaves it pending for a resend. Errors: the upload's, the answer's (see
/// [`apply_answer`]), [`ClientError::Protocol`] for an answer about another report, and the
/// ledger's.
pub fn settle_upload<L: BudgetLedger + ?Sized>(
    ledger: &mut L,
    collection: Uuid,
    report_id: Uuid,
    answer: Result<ReportAnswer, ClientError>,
) -> Result<Receipt, ClientError> {
    let answer = match answer {
        Ok(a) if a.id == report_id => a,
        Ok(_) => {
            return Err(ClientError::Protocol(
                "answer does not match the report".into(),
            ));
        }
        Err(ClientError::Problem(p)) => {
            let mut entry = pending_of(ledger, collection, report_id)?;
            entry.state = ReportState::Refused;
            ledger.put(collection, entry)?;
            return Err(ClientError::Problem(p));
        }
        Err(e) => return Err(e),
    };
    let mut entry = pending_of(ledger, collection, report_id)?;
    let receipt = apply_answer(collection, &mut entry, answer);
    ledger.put(collection, entry)?;
    receipt
}

/// Applies the server's answer for a collection's pending report to its ledger `entry`:
/// `accepted`/`duplicate` → acknowledged and a [`Receipt`]; `rejected` → refused (the budget
/// stays spent) and [`ClientError::Problem`]. The caller stores `entry` afterwards.
pub fn apply_answer(
    collection: Uuid,
    entry: &mut LedgerEntry,
    answer: ReportAnswer,
) -> Result<Receipt, ClientError> {
    match answer.status {
        ReportStatus::Accepted | ReportStatus::Duplicate => {
            entry.state = ReportState::Acknowledged;
            Ok(Receipt {
                collection_id: collection,
                report_id: answer.id,
                status: answer.status,
                epsilon_spent: entry.epsilon_spent,
            })
        }
        ReportStatus::Rejected => {
            entry.state = ReportState::Refused;
            Err(ClientError::Problem(answer.problem.unwrap_or_else(|| {
                Problem::new(ProblemType::InvalidPayload, "rejected without a reason")
            })))
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    use super::*;
    use crate::mechanism::MechanismKind;
    use crate::schema::Schema;
    use crate::wire::{CollectionConfig, Payload, Protocol};

    fn config() -> CollectionConfig {
        let schema: Schema = serde_json::from_value(serde_json::json!({"attributes": [
            {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 20},
            {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]}]}))
        .unwrap();
        CollectionConfig {
            auto_finalize_at_target: false,
            past_target: crate::wire::PastTarget::Accept,
            retain_reports_days: None,
            target: Vec::new(),
            name: None,
            description: None,
            version: 1,
            id: Uuid::nil(),
            schema,
            epsilon: Epsilon::new(20.0).unwrap(),
            target_users: 10,
            protocol: Protocol::Independence {},
        }
    }

    fn task(bins: Vec<Vec<u32>>, mechanism: MechanismKind) -> Task {
        Task {
            collection_id: Uuid::nil(),
            round: 0,
            factor: vec![0, 1],
            mechanism,
            bins,
            epsilon: Epsilon::new(20.0).unwrap(),
            token: "t".into(),
            expires_at: 0,
        }
    }

    /// A binned task reports the record's bin, over the product of the bin counts (at
    /// ε = 20 GRR keeps the true value but with probability ~e⁻¹⁶); invalid maps are refused
    /// before anything is randomized.
    #[test]
    fn bin_maps_are_applied_and_checked() {
        let c = config();
        let eps = Epsilon::new(20.0).unwrap();
        let record = c
            .schema
            .record()
            .set("age", 42)
            .set("smoker", "yes")
            .build()
            .unwrap();
        let mut rng = ChaCha12Rng::seed_from_u64(1);
        // age 42 is code 8 of 20; cuts [5, 10, 15] put it in bin 1 of 4.
        let t = task(vec![vec![5, 10, 15], vec![]], MechanismKind::Grr);
        let r = randomize_task(&c, eps, &t, &record, &mut rng).unwrap();
        assert_eq!(r.payload, Payload::Grr(2 + 1), "bin 1 × smoker yes");
        let oue = task(vec![vec![5, 10, 15], vec![]], MechanismKind::Oue);
        let p = randomize_task(&c, eps, &oue, &record, &mut rng).unwrap();
        let Payload::Oue(bits) = p.payload else {
            panic!("{p:?}")
        };
        // 8 cells in one byte; only the true cell's bit can be set (OUE keeps it w.p. 1/2).
        assert!(bits.0.len() == 1 && bits.0[0] & !(1 << 3) == 0, "{bits:?}");
        for bins in [
            vec![vec![5, 5], vec![]],
            vec![vec![20], vec![]],
            vec![vec![3]],
            vec![vec![], vec![2]],
        ] {
            let e = randomize_task(
                &c,
                eps,
                &task(bins.clone(), MechanismKind::Grr),
                &record,
                &mut rng,
            )
            .unwrap_err();
            assert!(matches!(e, ClientError::InvalidTask(_)), "{bins:?}: {e:?}");
        }
    }
}
