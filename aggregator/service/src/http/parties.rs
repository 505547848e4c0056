//! Parties of vertical collections: their upload tokens (admin), their record uploads
//! (committed by the committer; [`super::super::vertical`]) and their one-time uploads, stored
//! directly behind the ingest barrier: local models ([`post_party_model`]; every encoding but
//! `fo`) and sketch reports ([`post_party_sketch`]; `sketch+locmrf`).

use std::collections::BTreeSet;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use ldpsyn::vertical::{MAX_RECORDS_PER_UPLOAD, PartyUpload, PartyUploadResult, is_record_id};
use ldpsyn::wire::ProblemType;

use super::super::AppState;
use super::super::api::PartyTokens;
use super::super::error::ApiError;
use super::super::ingest::{CollectionHandle, Command};
use super::super::storage::PartyUploadStore;
use super::super::vertical::VerticalError;
use super::extract::{Admin, handle_of, read_body};
use ldpsyn_engine::Phase;
use ldpsyn_engine::measure::local_model::LocalModel;
use ldpsyn_engine::protocols::cross_party::{SketchUpload, check_upload};
use ldpsyn_engine::protocols::vertical::Vertical;

/// Every party's upload token of a vertical collection (admin).
#[utoipa::path(get, path = "/v1/collections/{id}/parties", tag = "parties",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "`{party name: upload token}`.", body = PartyTokens),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
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

/// The rules of `h`'s vertical collection and the index of its party `party`. Errors: `409`
/// when the collection is not vertical, `404` when it has no such party.
fn party_of<'a>(h: &'a CollectionHandle, party: &str) -> Result<(&'a Vertical, usize), ApiError> {
    let v = h.engine.vertical().ok_or_else(not_vertical)?;
    let p = v.party_index(party).ok_or_else(|| {
        ApiError::problem(
            ProblemType::NotFound,
            format!("the collection has no party `{party}`"),
        )
    })?;
    Ok((v, p))
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
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
        (status = 408, response = super::super::openapi::RequestTimeout),
        (status = 413, response = super::super::openapi::PayloadTooLarge),
        (status = 429, response = super::super::openapi::TooManyRequests),
    ))]
pub async fn post_party_records(
    State(state): State<AppState>,
    Path((id, party)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PartyUploadResult>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let (v, p) = party_of(&h, &party)?;
    check_party_token(&state, &h, &party, &headers)?;
    if !h.engine.takes_records() {
        return Err(ApiError::problem(
            ProblemType::Conflict,
            "under encoding `sketch+locmrf` a party uploads no records: only its local model \
             (…/model) and its sketch report (…/sketch), both made by `ldpsyn-aggregator party \
             upload`",
        ));
    }
    let body = read_body(body, state.config()).await?;
    let upload: PartyUpload = super::extract::from_json_slice(&body, "").map_err(|e| {
        ApiError::problem(
            ProblemType::MalformedRequest,
            format!("the body must be a party upload {{\"records\": [{{id, codes}} or {{id, attribute, codes}}, …]}}: {e}"),
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
        if let Err(why) = v.row(p, r.attribute, &r.codes) {
            return Err(ApiError::problem(
                ProblemType::InvalidPayload,
                format!("record {i}: {why}"),
            ));
        }
    }
    if h.state().phase == Phase::Finalized {
        return Err(VerticalError::Finalized.into());
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

/// `POST /v1/collections/{id}/parties/{party}/model`: party `party`'s local model
/// ([`LocalModel`]; every encoding but `fo`, VertiMRF §4.1 LocMRF). Stored once: `201` when
/// stored, `200` for an identical resend; a different second model is refused (`409`:
/// re-measuring would spend the party's budget twice). Every refusal changes nothing.
#[utoipa::path(post, path = "/v1/collections/{id}/parties/{party}/model", tag = "parties",
    security(("party" = [])),
    params(
        ("id" = uuid::Uuid, Path, description = "The collection id."),
        ("party" = String, Path, description = "The party's name."),
    ),
    request_body(content = super::super::api::LocalModelUpload, content_type = "application/json"),
    responses(
        (status = 200, description = "The same model was stored before.", body = super::super::api::PartyModelAnswer),
        (status = 201, description = "Stored.", body = super::super::api::PartyModelAnswer),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
        (status = 408, response = super::super::openapi::RequestTimeout),
        (status = 413, response = super::super::openapi::PayloadTooLarge),
        (status = 429, response = super::super::openapi::TooManyRequests),
    ))]
pub async fn post_party_model(
    State(state): State<AppState>,
    Path((id, party)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::response::Response, ApiError> {
    let h = handle_of(&state, &id).await?;
    let (v, p) = party_of(&h, &party)?;
    check_party_token(&state, &h, &party, &headers)?;
    if v.parties()[p].locmrf.is_none() {
        return Err(ApiError::problem(
            ProblemType::Conflict,
            format!(
                "party `{party}` has no `locmrf` budget in this collection's config (encoding \
                 `{}`): it uploads records only",
                serde_json::json!(v.encoding()).as_str().unwrap_or_default()
            ),
        ));
    }
    let body = read_body(body, state.config()).await?;
    let model: LocalModel = super::extract::from_json_slice(&body, "").map_err(|e| {
        ApiError::problem(
            ProblemType::MalformedRequest,
            format!(
                "the body must be a local model {{\"party\", \"measurements\", \"graph\", \
                 \"privacy\"}}: {e}"
            ),
        )
    })?;
    let resolved = &v.parties()[p];
    model
        .check(
            &resolved.name,
            &resolved.attributes,
            resolved.locmrf,
            h.engine.schema_dims(),
        )
        .map_err(|e| ApiError::problem(ProblemType::InvalidParameter, e))?;
    if h.state().phase == Phase::Finalized {
        return Err(VerticalError::FinalizedUpload.into());
    }
    let stored = state
        .db()
        .store_party_model(h.id, &party, &model, super::super::now_secs())
        .await?;
    let answer = super::super::api::PartyModelAnswer {
        party: party.clone(),
        stored: true,
        measurements: model.measurements().len(),
    };
    one_time_answer(stored, h.id, &party, "local model", answer, |a, stored| {
        a.stored = stored
    })
}

/// `POST /v1/collections/{id}/parties/{party}/sketch`: party `party`'s sketch report
/// ([`SketchUpload`]; `sketch+locmrf` collections, VertiMRF §4.3 LocEnc with n̂). Stored
/// once: `201` when stored, `200` for an identical resend; a different second report is
/// refused (`409`: it would spend the party's budget again), and so is a report under
/// another key than the parties' reports stored before (`409`: they could not be merged).
/// Every refusal changes nothing.
#[utoipa::path(post, path = "/v1/collections/{id}/parties/{party}/sketch", tag = "parties",
    security(("party" = [])),
    params(
        ("id" = uuid::Uuid, Path, description = "The collection id."),
        ("party" = String, Path, description = "The party's name."),
    ),
    request_body(content = super::super::api::SketchReportUpload, content_type = "application/json"),
    responses(
        (status = 200, description = "The same report was stored before.", body = super::super::api::PartySketchAnswer),
        (status = 201, description = "Stored.", body = super::super::api::PartySketchAnswer),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
        (status = 408, response = super::super::openapi::RequestTimeout),
        (status = 413, response = super::super::openapi::PayloadTooLarge),
        (status = 429, response = super::super::openapi::TooManyRequests),
    ))]
pub async fn post_party_sketch(
    State(state): State<AppState>,
    Path((id, party)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::response::Response, ApiError> {
    let h = handle_of(&state, &id).await?;
    let (v, _) = party_of(&h, &party)?;
    check_party_token(&state, &h, &party, &headers)?;
    if !v.encoding().is_sketch() {
        return Err(ApiError::problem(
            ProblemType::Conflict,
            format!(
                "sketch reports are for encoding `sketch+locmrf`; this collection's is `{}`",
                v.encoding().name()
            ),
        ));
    }
    let body = read_body(body, state.config()).await?;
    let sketch: SketchUpload = super::extract::from_json_slice(&body, "").map_err(|e| {
        ApiError::problem(
            ProblemType::MalformedRequest,
            format!(
                "the body must be a sketch report {{\"party\", \"report\": {{\"params\", \
                 \"key_fingerprint\", \"domain_sizes\", \"sketches\", \"noisy_count\"}}}}: {e}"
            ),
        )
    })?;
    if sketch.party != party {
        return Err(ApiError::problem(
            ProblemType::InvalidParameter,
            format!(
                "the report is party `{}`'s, uploaded to party `{party}`'s route",
                sketch.party
            ),
        ));
    }
    check_upload(v, &sketch).map_err(|e| ApiError::problem(ProblemType::InvalidParameter, e))?;
    if h.state().phase == Phase::Finalized {
        return Err(VerticalError::FinalizedUpload.into());
    }
    let stored = state
        .db()
        .store_party_sketch(h.id, &party, &sketch, super::super::now_secs())
        .await?;
    let answer = super::super::api::PartySketchAnswer {
        party: party.clone(),
        stored: true,
        noisy_count: sketch.report.noisy_count(),
        sketches: sketch.report.sketch_count(),
    };
    one_time_answer(
        stored,
        h.id,
        &party,
        "sketch report",
        answer,
        |a, stored| a.stored = stored,
    )
}

/// The answer to a one-time upload (`what`: "local model", "sketch report") from what the
/// store did: `201` with `answer`, `200` with `answer` marked not stored by `set_stored`, or
/// the refusal (collection `collection`).
fn one_time_answer<A: serde::Serialize>(
    stored: PartyUploadStore,
    collection: uuid::Uuid,
    party: &str,
    what: &str,
    mut answer: A,
    set_stored: impl FnOnce(&mut A, bool),
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    match stored {
        PartyUploadStore::Stored => {
            Ok((axum::http::StatusCode::CREATED, Json(answer)).into_response())
        }
        PartyUploadStore::Identical => {
            set_stored(&mut answer, false);
            Ok((axum::http::StatusCode::OK, Json(answer)).into_response())
        }
        PartyUploadStore::Different => Err(ApiError::problem(
            ProblemType::Conflict,
            format!(
                "party `{party}` already uploaded another {what}; a party makes it once (a \
                 second one would spend its budget again)"
            ),
        )),
        PartyUploadStore::OtherKey => Err(ApiError::problem(
            ProblemType::Conflict,
            format!(
                "party `{party}`'s {what} was made under another sketch key than the reports \
                 the other parties uploaded: every party uses the same key file"
            ),
        )),
        PartyUploadStore::Finalized => Err(VerticalError::FinalizedUpload.into()),
        PartyUploadStore::Gone => Err(VerticalError::Deleted(collection).into()),
    }
}

/// Checks `Authorization: Bearer <token of party>`. Errors: `unauthorized`.
fn check_party_token(
    state: &AppState,
    h: &CollectionHandle,
    party: &str,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if state
        .token_key()
        .verify_party_token(h.id, party, presented.trim())
    {
        Ok(())
    } else {
        Err(ApiError::problem(
            ProblemType::Unauthorized,
            format!("this route needs `Authorization: Bearer <token of party {party}>`"),
        ))
    }
}
