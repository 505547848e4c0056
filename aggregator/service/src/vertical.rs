//! Party uploads of vertical collections (VertiMRF; [`ldpsyn_engine::protocols::vertical`]):
//! the committer's side. The routes are in [`super::http`] (`parties`).
//!
//! `POST /v1/collections/{id}/parties/{party}/records` with `Authorization: Bearer <party
//! token>` and a [`ldpsyn::vertical::PartyUpload`] body. Each party's token is an HMAC of the collection id and
//! the party name under the server's token key: returned once at creation and to the admin
//! at `GET /v1/collections/{id}/parties` (a party token can only upload for its party).
//!
//! The records are committed by the committer task (the single writer of in-memory state,
//! so finalize cannot read the tables between a commit and its merge), in one transaction
//! behind the same barrier as device reports: the shared ingest lock and the finalized check
//! (PostgreSQL), then the collection's lock, which serializes the uploads of every party so
//! that the second party to upload a record id always sees the first's row. A record is
//! stored as the party's row ([`ldpsyn_engine::protocols::vertical::Vertical::row`]: under
//! `sampled+locmrf` the sampled attribute's code and `NOT_SAMPLED` elsewhere, in the same
//! `codes` column). Per record: the same id with the same codes is a duplicate; with other codes the whole request is refused
//! (`409 record-id-conflict`, nothing stored); a new id is stored and adds its table cells
//! ([`ldpsyn_engine::protocols::vertical::Vertical::record_cells`]) to `table_counts`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ldpsyn::mechanism::SufficientStatistics;
use ldpsyn::vertical::{PartyRecord, PartyUploadResult};
use ldpsyn::wire::ProblemType;

use super::ingest::CollectionHandle;
use super::now_secs;
use super::storage::{IngestGate, StorageError, Transaction, Writer};
use ldpsyn_engine::{EngineError, Model, ModelDescription, Phase, Tables};

/// Errors of party uploads. The HTTP layer wraps them (`ApiError::Vertical`) and maps each to
/// its problem document; the refusals' messages are their details.
#[derive(Debug, thiserror::Error)]
pub enum VerticalError {
    /// The collection was deleted, as the upload's transaction found (`unknown-collection`).
    #[error("collection {0} was deleted")]
    Deleted(uuid::Uuid),
    /// The collection was deleted before the upload's turn on the committer
    /// (`unknown-collection`).
    #[error("no collection {0} (it was deleted)")]
    DeletedBefore(uuid::Uuid),
    /// Records for a finalized collection (`collection-finalized`).
    #[error("the collection is finalized and takes no more records")]
    Finalized,
    /// A local model or sketch report for a finalized collection (`collection-finalized`).
    #[error("the collection is finalized and takes no more local models or sketch reports")]
    FinalizedUpload,
    /// A record id the party already uploaded with other codes (`record-id-conflict`).
    #[error(
        "party `{party}` already uploaded record {record} with other codes; a party resends \
         the codes it first sent (nothing of this upload was stored)"
    )]
    RecordIdConflict {
        /// The party's name.
        party: String,
        /// The record id.
        record: String,
    },
    /// The storage layer failed.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// The engine failed.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// Anything else internal (a record or stored row that cannot be).
    #[error("internal: {0}")]
    Internal(String),
}

impl VerticalError {
    /// The problem type of a refusal; `None` for the internal errors.
    pub fn problem_type(&self) -> Option<ProblemType> {
        match self {
            VerticalError::Deleted(_) | VerticalError::DeletedBefore(_) => {
                Some(ProblemType::UnknownCollection)
            }
            VerticalError::Finalized | VerticalError::FinalizedUpload => {
                Some(ProblemType::CollectionFinalized)
            }
            VerticalError::RecordIdConflict { .. } => Some(ProblemType::RecordIdConflict),
            VerticalError::Storage(_) | VerticalError::Engine(_) | VerticalError::Internal(_) => {
                None
            }
        }
    }
}

/// Commits one party upload (the committer's side; module docs). Errors: the collection
/// was finalized, an id already holds other codes of this party (nothing is stored), or
/// the database failed.
pub(crate) async fn commit_party_records(
    writer: &mut Writer,
    handle: &Arc<CollectionHandle>,
    party: usize,
    records: &[PartyRecord],
) -> Result<PartyUploadResult, VerticalError> {
    let (accepted, duplicate, delta) = writer
        .run_tx(|tx| Box::pin(write_party_records(tx, handle, party, records)))
        .await?;
    handle.apply_committed(&BTreeMap::from([(0, accepted)]), &delta);
    Ok(PartyUploadResult {
        accepted,
        duplicate,
    })
}

/// The transaction of [`commit_party_records`]: returns the records accepted and
/// duplicate, and the statistics the accepted ones add.
async fn write_party_records(
    tx: &mut Transaction<'_>,
    handle: &Arc<CollectionHandle>,
    party: usize,
    records: &[PartyRecord],
) -> Result<(u64, u64, Tables), VerticalError> {
    let v = handle
        .engine
        .vertical()
        .ok_or_else(|| VerticalError::Internal("party upload to a device collection".into()))?;
    let name = v.parties()[party].name.clone();
    match tx.ingest_gate(handle.id).await? {
        IngestGate::Gone => return Err(VerticalError::Deleted(handle.id)),
        IngestGate::Finalized => return Err(VerticalError::Finalized),
        IngestGate::Open if handle.state().phase == Phase::Finalized => {
            return Err(VerticalError::Finalized);
        }
        IngestGate::Open => {}
    }
    tx.lock_collection(handle.id).await?;
    let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    let mut stored: HashMap<String, Vec<(usize, Vec<u32>)>> = HashMap::new();
    for (p, id, codes) in tx.vertical_rows(handle.id, &ids).await? {
        // Rows of parties the config no longer names cannot exist: the config is immutable.
        let q = v
            .party_index(&p)
            .ok_or_else(|| VerticalError::Internal(format!("stored row of unknown party `{p}`")))?;
        stored.entry(id).or_default().push((q, codes));
    }
    let mut delta = Tables::new();
    let mut new_rows: Vec<(&str, Vec<u32>)> = Vec::new();
    let mut duplicate = 0u64;
    for r in records {
        // Validated by the handler: a failure here is the server's.
        let row = v
            .row(party, r.attribute, &r.codes)
            .map_err(|e| VerticalError::Internal(format!("record {}: {e}", r.id)))?;
        let others = stored.remove(&r.id).unwrap_or_default();
        if let Some((_, mine)) = others.iter().find(|(q, _)| *q == party) {
            if *mine == row {
                duplicate += 1;
                continue;
            }
            return Err(VerticalError::RecordIdConflict {
                party: name,
                record: r.id.clone(),
            });
        }
        if others.iter().any(|(q, c)| !v.fits(*q, c)) {
            return Err(VerticalError::Internal(format!(
                "record {} does not fit",
                r.id
            )));
        }
        for (key, cell) in v.record_cells(party, &row, &others) {
            let stats = match delta.entry(key) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let m = handle.mechanism(e.key())?;
                    e.insert(SufficientStatistics::new(&m))
                }
            };
            stats.counts[cell] += 1;
            stats.n += 1;
        }
        new_rows.push((r.id.as_str(), row));
    }
    let accepted = new_rows.len() as u64;
    if accepted > 0 {
        let rows: Vec<(&str, &[u32])> =
            new_rows.iter().map(|(id, c)| (*id, c.as_slice())).collect();
        tx.insert_vertical_records(handle.id, &name, &rows, now_secs())
            .await?;
        tx.add_table_counts(handle.id, &delta).await?;
        tx.bump_round_count(handle.id, 0, accepted).await?;
    }
    Ok((accepted, duplicate, delta))
}

/// Each party's ε per person ([`ldpsyn_engine::protocols::vertical::Vertical::party_epsilon`]:
/// its reports' ε plus its local model's), for the collection view ([`super::http`]); `None` for a device collection.
pub fn party_epsilons(h: &CollectionHandle) -> Option<BTreeMap<String, f64>> {
    let v = h.engine.vertical()?;
    Some(
        v.parties()
            .iter()
            .enumerate()
            .map(|(p, party)| (party.name.clone(), v.party_epsilon(p)))
            .collect(),
    )
}

/// Vertical collections: ε spent on one person over every party (the sum over parties; see
/// [`ldpsyn_engine::protocols::vertical::Vertical::composed_epsilon`]); `None` otherwise.
pub fn composed_epsilon(h: &CollectionHandle) -> Option<f64> {
    Some(h.engine.vertical()?.composed_epsilon())
}

/// The description of `model`, a model of `h`, with the collection's composed ε.
pub fn describe_model(h: &CollectionHandle, model: &Model) -> ModelDescription {
    ModelDescription {
        composed_epsilon: composed_epsilon(h),
        ..model.describe()
    }
}
