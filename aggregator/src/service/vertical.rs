//! Party uploads of vertical collections (VertiMRF; [`crate::engine::protocols::vertical`]).
//!
//! `POST /v1/collections/{id}/parties/{party}/records` with `Authorization: Bearer <party
//! token>` and a [`PartyUpload`] body. Each party's token is an HMAC of the collection id and
//! the party name under the server's token key: returned once at creation and to the admin
//! at `GET /v1/collections/{id}/parties` (a party token can only upload for its party).
//!
//! The records are committed by the committer task (the single writer of in-memory state,
//! so finalize cannot read the tables between a commit and its merge), in one transaction
//! behind the same barrier as device reports: the shared ingest lock and the finalized check
//! (PostgreSQL), then the collection's lock, which serializes the uploads of every party so
//! that the second party to upload a record id always sees the first's row. Per record: the
//! same id with the same codes is a duplicate; with other codes the whole request is refused
//! (`409 record-id-conflict`, nothing stored); a new id is stored and adds its table cells
//! ([`crate::engine::protocols::vertical::Vertical::record_cells`]) to `table_counts`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use ldpsyn::mechanism::SufficientStatistics;
use ldpsyn::protocol::ProblemType;
use ldpsyn::vertical::{
    MAX_RECORDS_PER_UPLOAD, PartyRecord, PartyUpload, PartyUploadResult, is_record_id,
};

use super::AppState;
use super::api::PartyTokens;
use super::error::ApiError;
use super::http::{Admin, handle_of, now_secs, read_body};
use super::ingest::{CollectionHandle, Command};
use super::storage::{self, Db, Writer};
use crate::engine::{Phase, Tables};

/// Every party's upload token of a vertical collection (admin).
#[utoipa::path(get, path = "/v1/collections/{id}/parties", tag = "parties",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "`{party name: upload token}`.", body = PartyTokens),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
    ))]
pub async fn get_party_tokens(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<PartyTokens>, ApiError> {
    let h = handle_of(&state, &id).await?;
    Ok(Json(party_tokens(&state, &h)?))
}

/// `{party name: token}` of a vertical collection. Errors: `conflict` for a device
/// collection.
pub fn party_tokens(state: &AppState, h: &CollectionHandle) -> Result<PartyTokens, ApiError> {
    let v = h.engine.vertical().ok_or_else(not_vertical)?;
    Ok(v.parties()
        .iter()
        .map(|p| (p.name.clone(), state.token_key().party_token(h.id, &p.name)))
        .collect())
}

fn not_vertical() -> ApiError {
    ApiError::problem(
        ProblemType::Conflict,
        "not a vertical collection (it takes device reports through …/task and …/reports)",
    )
}

/// `POST /v1/collections/{id}/parties/{party}/records`.
#[utoipa::path(post, path = "/v1/collections/{id}/parties/{party}/records", tag = "parties",
    security(("party" = [])),
    params(
        ("id" = uuid::Uuid, Path, description = "The collection id."),
        ("party" = String, Path, description = "The party's name."),
    ),
    request_body(content = PartyUpload, content_type = "application/json"),
    responses(
        (status = 200, description = "How many records were new and how many identical resends.", body = PartyUploadResult),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
        (status = 413, response = super::openapi::PayloadTooLarge),
    ))]
pub async fn post_party_records(
    State(state): State<AppState>,
    Path((id, party)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PartyUploadResult>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let v = h.engine.vertical().ok_or_else(not_vertical)?;
    let p = v.party_index(&party).ok_or_else(|| {
        ApiError::problem(
            ProblemType::NotFound,
            format!("the collection has no party `{party}`"),
        )
    })?;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !state
        .token_key()
        .verify_party_token(h.id, &party, presented.trim())
    {
        return Err(ApiError::problem(
            ProblemType::Unauthorized,
            format!("this route needs `Authorization: Bearer <token of party {party}>`"),
        ));
    }
    let body = read_body(body, state.config().max_body_bytes).await?;
    let upload: PartyUpload = serde_json::from_slice(&body).map_err(|e| {
        ApiError::problem(
            ProblemType::MalformedRequest,
            format!("body is not a party upload: {e}"),
        )
    })?;
    let n = upload.records.len();
    if n > MAX_RECORDS_PER_UPLOAD {
        return Err(ApiError::problem(
            ProblemType::PayloadTooLarge,
            format!("{n} records in one upload; at most {MAX_RECORDS_PER_UPLOAD}"),
        ));
    }
    if n == 0 {
        return Err(ApiError::problem(
            ProblemType::InvalidParameter,
            "`records` is empty",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, r) in upload.records.iter().enumerate() {
        if !is_record_id(&r.id) {
            return Err(ApiError::problem(
                ProblemType::InvalidParameter,
                format!("record {i}: `id` must be 64 lowercase hex digits (HMAC-SHA256)"),
            ));
        }
        if !seen.insert(r.id.as_str()) {
            return Err(ApiError::problem(
                ProblemType::InvalidParameter,
                format!("record {i}: id {} appears twice in this upload", r.id),
            ));
        }
        if !v.fits(p, &r.codes) {
            return Err(ApiError::problem(
                ProblemType::InvalidPayload,
                format!(
                    "record {i}: `codes` must hold {} codes, each below its attribute's domain size",
                    v.parties()[p].attributes.len()
                ),
            ));
        }
    }
    if h.state().phase == Phase::Finalized {
        return Err(finalized());
    }
    let result = state
        .ask(|reply| Command::PartyRecords {
            handle: h.clone(),
            party: p,
            records: upload.records,
            reply,
        })
        .await?;
    state.metrics().reports(result.accepted, result.duplicate);
    Ok(Json(result))
}

fn finalized() -> ApiError {
    ApiError::problem(
        ProblemType::CollectionFinalized,
        "the collection is finalized and takes no more records",
    )
}

/// Commits one party upload (the committer's side; module docs). Errors: the collection
/// was finalized, an id already holds other codes of this party (nothing is stored), or
/// the database failed.
pub(crate) async fn commit_party_records(
    db: &Db,
    writer: &mut Writer,
    handle: &Arc<CollectionHandle>,
    party: usize,
    records: &[PartyRecord],
) -> Result<PartyUploadResult, ApiError> {
    let v = handle
        .engine
        .vertical()
        .ok_or_else(|| ApiError::Internal("party upload to a device collection".into()))?;
    let name = v.parties()[party].name.clone();
    let mut tx = writer.begin().await?;
    if handle.state().phase == Phase::Finalized
        || db.finalized_for_ingest(&mut tx, handle.id).await?
    {
        return Err(finalized());
    }
    db.lock_collection(&mut tx, handle.id).await?;
    let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    let mut stored: HashMap<String, Vec<(usize, Vec<u32>)>> = HashMap::new();
    for (p, id, codes) in db.vertical_rows(&mut tx, handle.id, &ids).await? {
        // Rows of parties the config no longer names cannot exist: the config is immutable.
        let q = v
            .party_index(&p)
            .ok_or_else(|| ApiError::Internal(format!("stored row of unknown party `{p}`")))?;
        stored.entry(id).or_default().push((q, codes));
    }
    let mut delta = Tables::new();
    let mut new_rows: Vec<(&str, &[u32])> = Vec::new();
    let mut duplicate = 0u64;
    for r in records {
        let others = stored.remove(&r.id).unwrap_or_default();
        if let Some((_, mine)) = others.iter().find(|(q, _)| *q == party) {
            if *mine == r.codes {
                duplicate += 1;
                continue;
            }
            return Err(ApiError::problem(
                ProblemType::RecordIdConflict,
                format!(
                    "party `{name}` already uploaded record {} with other codes; a party \
                     resends the codes it first sent (nothing of this upload was stored)",
                    r.id
                ),
            ));
        }
        if !v.fits(party, &r.codes) || others.iter().any(|(q, c)| !v.fits(*q, c)) {
            return Err(ApiError::Internal(format!("record {} does not fit", r.id)));
        }
        for (key, cell) in v.record_cells(party, &r.codes, &others) {
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
        new_rows.push((r.id.as_str(), r.codes.as_slice()));
    }
    let accepted = new_rows.len() as u64;
    if accepted > 0 {
        db.insert_vertical_records(&mut tx, handle.id, &name, &new_rows, now_secs())
            .await?;
        db.add_table_counts(&mut tx, handle.id, &delta).await?;
        Db::bump_round_count(&mut tx, handle.id, 0, accepted).await?;
    }
    storage::commit(tx).await?;
    handle.apply_committed(&BTreeMap::from([(0, accepted)]), &delta);
    Ok(PartyUploadResult {
        accepted,
        duplicate,
    })
}

/// Each party's ε per person (Σ of its attributes' ε), for [`super::http`]'s collection
/// view; `None` for a device collection.
pub fn party_epsilons(h: &CollectionHandle) -> Option<BTreeMap<String, f64>> {
    let v = h.engine.vertical()?;
    Some(
        v.parties()
            .iter()
            .map(|p| {
                let e: f64 = p.attributes.iter().map(|&a| v.epsilon_of(a).get()).sum();
                (p.name.clone(), e)
            })
            .collect(),
    )
}
