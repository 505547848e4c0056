//! One client of the aggregator's admin API for the commands (`collections`, `demo`): every
//! admin path they call is spelled here once, an answer that is not 2xx comes back as the
//! server's problem document ([`Problem`]), a create is safe to retry (the body names its
//! id), and a finalize can wait for a model whose fit outlasts the server's wait (`202`).
//! Answers are JSON values: their shapes are the service's `api` types, documented in the
//! OpenAPI document.

use std::time::Duration;

use ldpsyn::wire::Problem;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};

/// Attempts of a create before its error is reported.
const CREATE_ATTEMPTS: u32 = 4;

/// How often [`AdminClient::wait_for_model`] asks whether the model is built.
const MODEL_POLL: Duration = Duration::from_millis(500);

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    /// The server answered with a problem (non-2xx). A body that is not a problem document
    /// is kept as the detail of an `internal` (5xx) or `malformed-request` problem.
    #[error("HTTP {status} {}: {}{}", problem.problem_type.slug(), problem.title,
        if problem.detail.is_empty() { String::new() } else { format!(" ({})", problem.detail) })]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The server's problem document.
        problem: Problem,
    },
    /// The server could not be reached or its answer could not be read; the message names
    /// the URL, and asks whether `serve` runs there when nothing answered.
    #[error("{}", http_message(.0))]
    Http(#[from] reqwest::Error),
    /// The collection is finalized but fitting its model failed (`status.model_error`).
    #[error("the collection is finalized but fitting its model failed: {0}")]
    FitFailed(String),
}

/// What `POST …/finalize` answered.
#[derive(Debug)]
pub enum Finalized {
    /// `200`: `{status, model}`, the model built.
    Built(Value),
    /// `202`: finalized; the model is being fitted ([`AdminClient::wait_for_model`]).
    Building,
}

/// The admin API of one aggregator, with its admin token.
#[derive(Debug, Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl AdminClient {
    /// A client of the aggregator at `base` (e.g. `http://127.0.0.1:8080`) with the admin
    /// `token`.
    pub fn new(base: &str, token: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        }
    }

    /// A request to `path` (below the base) with the admin token.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// Sends `req`: the answer if it is a success, else its problem.
    async fn send(req: RequestBuilder) -> Result<Response, ApiClientError> {
        let resp = req.send().await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(refusal(resp).await)
        }
    }

    async fn json(req: RequestBuilder) -> Result<Value, ApiClientError> {
        Ok(Self::send(req).await?.json().await?)
    }

    /// `POST /v1/collections` with `body`, which gets a fresh `id` unless it names one: sent
    /// again after a connection error or a 5xx, 1, 2, 4 s apart, which is safe because the
    /// id makes the server answer a repeat with the collection it stored. The collection's
    /// view. Errors: the last attempt's.
    pub async fn create(&self, body: &Value) -> Result<Value, ApiClientError> {
        let mut body = body.clone();
        if let Some(obj) = body.as_object_mut() {
            obj.entry("id")
                .or_insert_with(|| json!(uuid::Uuid::new_v4()));
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= CREATE_ATTEMPTS;
            match self
                .request(Method::POST, "/v1/collections")
                .json(&body)
                .send()
                .await
            {
                Ok(resp) if resp.status().is_server_error() && !last => {}
                Ok(resp) if resp.status().is_success() => return Ok(resp.json().await?),
                Ok(resp) => return Err(refusal(resp).await),
                Err(e) if last || !(e.is_connect() || e.is_timeout() || e.is_request()) => {
                    return Err(e.into());
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
        }
    }

    /// `GET /v1/collections`: every collection's view.
    pub async fn list(&self) -> Result<Value, ApiClientError> {
        Self::json(self.request(Method::GET, "/v1/collections")).await
    }

    /// `GET /v1/collections/{id}`: the collection's view with its `status`.
    pub async fn collection(&self, id: &str) -> Result<Value, ApiClientError> {
        Self::json(self.request(Method::GET, &format!("/v1/collections/{id}"))).await
    }

    /// `POST /v1/collections/{id}/close-round[?force=true]`: what the close did.
    pub async fn close_round(&self, id: &str, force: bool) -> Result<Value, ApiClientError> {
        let mut req = self.request(Method::POST, &format!("/v1/collections/{id}/close-round"));
        if force {
            req = req.query(&[("force", "true")]);
        }
        Self::json(req).await
    }

    /// `DELETE /v1/collections/{id}`: the id and how many reports went with it.
    pub async fn delete(&self, id: &str) -> Result<Value, ApiClientError> {
        Self::json(self.request(Method::DELETE, &format!("/v1/collections/{id}"))).await
    }

    /// `POST /v1/collections/{id}/finalize`: the model if it was built within the server's
    /// wait, else [`Finalized::Building`].
    pub async fn finalize(&self, id: &str) -> Result<Finalized, ApiClientError> {
        let resp =
            Self::send(self.request(Method::POST, &format!("/v1/collections/{id}/finalize")))
                .await?;
        Ok(if resp.status() == StatusCode::ACCEPTED {
            Finalized::Building
        } else {
            Finalized::Built(resp.json().await?)
        })
    }

    /// The collection's `status` and `GET /v1/collections/{id}/model` (the model, its fitness
    /// report and what it was fitted from) of a finalized collection once its model is built,
    /// polling `status.model` while it is `building`. Errors: [`ApiClientError::FitFailed`]
    /// when the fit failed; a collection that is not finalized is refused `model-not-ready`.
    pub async fn wait_for_model(&self, id: &str) -> Result<(Value, Value), ApiClientError> {
        loop {
            let status = self.collection(id).await?["status"].clone();
            match status["model"].as_str() {
                Some("building") => tokio::time::sleep(MODEL_POLL).await,
                Some("failed") => {
                    return Err(ApiClientError::FitFailed(
                        status["model_error"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    ));
                }
                _ => return Ok((status, self.model(id).await?)),
            }
        }
    }

    /// `GET /v1/collections/{id}/model`: the final model with its fitness report.
    pub async fn model(&self, id: &str) -> Result<Value, ApiClientError> {
        Self::json(self.request(Method::GET, &format!("/v1/collections/{id}/model"))).await
    }

    /// `GET /v1/collections/{id}/synthetic` with `query` (`rows`, `seed`, `format`,
    /// `numeric`): the streaming answer, to be read chunk by chunk.
    pub async fn synthetic(
        &self,
        id: &str,
        query: &[(&str, String)],
    ) -> Result<Response, ApiClientError> {
        Self::send(
            self.request(Method::GET, &format!("/v1/collections/{id}/synthetic"))
                .query(query),
        )
        .await
    }
}

/// A reqwest error in words: the URL, the innermost cause (reqwest's own message says
/// only "error sending request"), and for a connection that failed whether `serve` runs.
fn http_message(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let url = e.url().map_or_else(String::new, ToString::to_string);
    if e.is_connect() {
        let server = e
            .url()
            .map_or_else(String::new, |u| u.origin().ascii_serialization());
        format!("cannot connect to {url} ({cause}): is `serve` running at {server}?")
    } else if e.is_timeout() {
        format!("{url}: no answer in time ({cause})")
    } else if url.is_empty() {
        format!("HTTP: {cause}")
    } else {
        format!("{url}: {cause}")
    }
}

/// The problem of a non-2xx answer.
async fn refusal(resp: Response) -> ApiClientError {
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap_or_default();
    ApiClientError::Refused {
        status,
        problem: Problem::of_answer(status, &String::from_utf8_lossy(&bytes)),
    }
}
