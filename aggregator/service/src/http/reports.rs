//! Devices: tasks (`GET …/task`) and report uploads (`POST …/reports`).

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ldpsyn::wire::{MAX_TASKS_PER_REQUEST, ProblemType, Report, ReportAnswer, ReportStatus, Task};
use serde::Deserialize;
use utoipa::IntoParams;

use super::super::error::ApiError;
use super::super::ingest::{CollectionHandle, Command, Outcome, PendingReport};
use super::super::tokens::{MAX_FACTOR_LEN, MAX_TOKEN_CUTS, TaskClaims, validate_report};
use super::super::{AppState, api, now_millis, now_secs};
use super::extract::{ParamKind, Query, QueryParam, QueryParams, handle_of, read_body};
use ldpsyn_engine::{Phase, TaskSpec};

/// The query of `GET /v1/collections/{id}/task`; any other parameter is a 400.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TaskQuery {
    /// Ask for this many tasks (a JSON array); without it, one task object.
    #[param(minimum = 1, maximum = 1000, example = 10)]
    pub count: Option<u32>,
}

impl QueryParams for TaskQuery {
    const PARAMS: &'static [QueryParam] = &[QueryParam {
        name: "count",
        required: false,
        kind: ParamKind::Integer {
            min: 1,
            max: MAX_TASKS_PER_REQUEST as u64,
        },
        allowed: "a whole number from 1 to 1000; without it, one task object",
    }];
}

// `allowed` above spells the limit out.
const _: () = assert!(MAX_TASKS_PER_REQUEST == 1000);

fn issue(
    state: &AppState,
    h: &CollectionHandle,
    spec: TaskSpec,
    now: i64,
    nonce: [u8; 16],
) -> Task {
    let claims = TaskClaims {
        collection: h.id,
        round: spec.round,
        factor: spec.factor.clone(),
        mechanism: spec.mechanism,
        epsilon: h.config.epsilon,
        expires_at: now.saturating_add(state.config().task_ttl_secs),
        nonce,
        bins: spec.bins.clone(),
    };
    Task {
        collection_id: h.id,
        round: spec.round,
        factor: spec.factor,
        mechanism: spec.mechanism,
        bins: spec.bins,
        epsilon: h.config.epsilon,
        token: state.token_key().sign(&claims),
        expires_at: claims.expires_at,
    }
}

#[utoipa::path(get, path = "/v1/collections/{id}/task", tag = "devices",
    params(("id" = uuid::Uuid, Path, description = "The collection id."), TaskQuery),
    responses(
        (status = 200, description = "One task, or an array of `count` independently drawn tasks.", body = api::TaskAnswer),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
        (status = 429, response = super::super::openapi::TooManyRequests),
    ))]
pub(crate) async fn get_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<TaskQuery>, ApiError>,
) -> Result<Response, ApiError> {
    let h = handle_of(&state, &id).await?;
    // Parsed after the id, as before: an unknown collection answers 404 whatever the query.
    let Query(q) = query?;
    let count = match q.count {
        None => None,
        Some(n) => {
            let n = n as usize;
            if !(1..=MAX_TASKS_PER_REQUEST).contains(&n) {
                return Err(ApiError::problem(
                    ProblemType::InvalidParameter,
                    format!("`count` must be in 1..={MAX_TASKS_PER_REQUEST}, got {n}"),
                ));
            }
            Some(n)
        }
    };
    let s = h.state();
    if h.target_reached() {
        // No task for a report that would be refused: the device spends nothing.
        return Err(ApiError::from_problem(
            crate::ingest::target_reached_problem(&h, true),
        ));
    }
    if s.phase == Phase::Finalized {
        return Err(ApiError::problem(
            ProblemType::CollectionFinalized,
            "the collection is finalized and hands out no more tasks",
        ));
    }
    let now_ms = now_millis();
    let now = (now_ms / 1000) as i64;
    let n = count.unwrap_or(1);
    let mut tasks = Vec::with_capacity(n);
    // The choices of the state checked above, once per state ([`CollectionHandle::sampler`]);
    // each task an O(log n) draw.
    let sampler = h.sampler(&s)?;
    let nonces = TaskClaims::fresh_nonces(now_ms, n);
    for (spec, nonce) in state.draw_tasks(&sampler, n).into_iter().zip(nonces) {
        if spec.factor.len() > MAX_FACTOR_LEN
            || spec.bins.iter().map(Vec::len).sum::<usize>() > MAX_TOKEN_CUTS
        {
            return Err(ApiError::Internal("task too large for a token".into()));
        }
        tasks.push(issue(&state, &h, spec, now, nonce));
    }
    state.metrics().task_request(n as u64);
    Ok(match count {
        None => Json(tasks.pop()).into_response(),
        Some(_) => json_sized(&tasks, n * TASK_JSON_BYTES),
    })
}

/// Room for one task in a `?count=n` answer, bytes: a pair's task without bin maps is 270
/// (its token 150); a longer one regrows the buffer once.
const TASK_JSON_BYTES: usize = 320;

/// Room for one report's answer in an upload's, bytes (`{"id":…,"status":"accepted"},`: 65;
/// a rejection's problem regrows the buffer once).
const ANSWER_JSON_BYTES: usize = 72;

/// `value` as an `application/json` response, written into a buffer of `capacity` bytes
/// allocated up front: axum's `Json` starts at 128 bytes and regrows, copying what it wrote
/// each time, a dozen copies for a thousand tasks. Errors: a 500 if `value` does not
/// serialize (none of the wire types fails).
fn json_sized<T: serde::Serialize>(value: &T, capacity: usize) -> Response {
    let mut buf = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut buf, value) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            buf,
        )
            .into_response(),
        Err(e) => ApiError::Internal(format!("cannot serialize the answer: {e}")).into_response(),
    }
}

/// Parses an upload body: a JSON array of 1..=`max` reports. Errors: 400 (not JSON of that
/// shape, empty), 413 (too many).
pub fn parse_upload(body: &[u8], max: usize) -> Result<Vec<Report>, ApiError> {
    let reports: Vec<Report> = super::extract::from_json_slice(body, "").map_err(|e| {
        ApiError::problem(
            ProblemType::MalformedRequest,
            format!("the body must be a JSON array of reports {{id, token, payload}}: {e}"),
        )
    })?;
    if reports.is_empty() {
        return Err(ApiError::problem(
            ProblemType::InvalidParameter,
            "the upload holds no report",
        ));
    }
    if reports.len() > max {
        return Err(ApiError::problem(
            ProblemType::PayloadTooLarge,
            format!("{} reports in one upload; at most {max}", reports.len()),
        ));
    }
    Ok(reports)
}

#[utoipa::path(post, path = "/v1/collections/{id}/reports", tag = "devices",
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    request_body(content = Vec<Report>, content_type = "application/json",
        description = "1..=`--max-reports-per-upload` reports (default 1000)."),
    responses(
        (status = 200, description = "One answer per report, in order, after the commit.", body = Vec<ReportAnswer>),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
        (status = 408, response = super::super::openapi::RequestTimeout),
        (status = 413, response = super::super::openapi::PayloadTooLarge),
        (status = 429, response = super::super::openapi::TooManyRequests),
    ))]
pub(crate) async fn post_reports(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    state.metrics().upload_request();
    let h = handle_of(&state, &id).await?;
    let body = read_body(body, state.config()).await?;
    let reports = parse_upload(&body, state.config().max_reports_per_upload)?;
    if h.state().phase == Phase::Finalized || h.target_reached() {
        return Err(ApiError::from_problem(h.closed_problem()));
    }
    let now = now_secs();
    let mut answers: Vec<ReportAnswer> = Vec::with_capacity(reports.len());
    let mut items = Vec::with_capacity(reports.len());
    let mut slots = Vec::with_capacity(reports.len());
    let mut expired: Vec<(usize, String)> = Vec::new();
    for report in reports {
        let rid = report.id;
        match validate_report(state.token_key(), &h, report, now) {
            Ok(r) => {
                slots.push(answers.len());
                items.push(PendingReport {
                    handle: h.clone(),
                    report: r,
                });
                answers.push(ReportAnswer {
                    id: rid,
                    status: ReportStatus::Accepted,
                    problem: None,
                });
            }
            Err(invalid) => {
                if let Some(nonce) = invalid.expired_nonce {
                    expired.push((answers.len(), nonce));
                } else {
                    state.metrics().rejected(invalid.problem.problem_type);
                }
                answers.push(ReportAnswer {
                    id: rid,
                    status: ReportStatus::Rejected,
                    problem: Some(invalid.problem),
                });
            }
        }
    }
    if !expired.is_empty() {
        // A resend of a stored report is a duplicate however old its token: answering
        // `token-expired` would make the device drop a report the server holds.
        let collection = h.id;
        let stored = state
            .db()
            .run_tx(|tx| {
                Box::pin(async move {
                    let mut stored = Vec::with_capacity(expired.len());
                    for (slot, nonce) in expired {
                        stored.push((slot, tx.report_of_token(collection, &nonce).await?));
                    }
                    Ok::<_, ApiError>(stored)
                })
            })
            .await?;
        for (slot, id) in stored {
            let a = &mut answers[slot];
            if id == Some(a.id) {
                a.status = ReportStatus::Duplicate;
                a.problem = None;
            } else if let Some(p) = &a.problem {
                state.metrics().rejected(p.problem_type);
            }
        }
    }
    if !items.is_empty() {
        let outcomes = state.ask(|reply| Command::Reports { items, reply }).await?;
        for (slot, o) in slots.into_iter().zip(outcomes) {
            let a = &mut answers[slot];
            match o {
                Outcome::Accepted => {}
                Outcome::Duplicate => a.status = ReportStatus::Duplicate,
                Outcome::Rejected(p) => {
                    a.status = ReportStatus::Rejected;
                    a.problem = Some(p);
                }
            }
        }
    }
    Ok(json_sized(&answers, answers.len() * ANSWER_JSON_BYTES))
}
