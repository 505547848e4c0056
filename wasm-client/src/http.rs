//! HTTP through the global `fetch` (browsers; node ≥ 18), with the native client's retry
//! rules: connection errors, timeouts, 5xx, 408 and 429 are retried (honouring `Retry-After`
//! seconds) with exponential, jittered backoff; the body is the same bytes on every attempt;
//! any other non-2xx answer is a [`Problem`] and is not retried.

use ldpsyn::wire::Problem;
use ldpsyn::submission::ClientError;
use rand::Rng;
use rand::rngs::StdRng;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    /// The global `fetch`, looked up at call time.
    #[wasm_bindgen(js_name = fetch)]
    fn global_fetch(url: &str, init: &web_sys::RequestInit) -> js_sys::Promise;
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(handler: &js_sys::Function, ms: i32) -> JsValue;
    #[wasm_bindgen(js_name = clearTimeout)]
    fn clear_timeout(id: &JsValue);
}

/// Retry and timeout settings (the JS options `requestTimeoutMs`, `maxAttempts`,
/// `initialBackoffMs`, `maxBackoffMs`; defaults as the native `ClientOptions::new`).
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Timeout of one request, milliseconds.
    pub request_timeout_ms: u32,
    /// Attempts per request, ≥ 1.
    pub max_attempts: u32,
    /// First retry delay, milliseconds; doubles each attempt up to `max_backoff_ms`.
    pub initial_backoff_ms: u32,
    /// Largest retry delay, milliseconds.
    pub max_backoff_ms: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            request_timeout_ms: 10_000,
            max_attempts: 5,
            initial_backoff_ms: 100,
            max_backoff_ms: 5_000,
        }
    }
}

/// Resolves after `ms` milliseconds.
pub async fn sleep(ms: u32) {
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        set_timeout(&resolve, ms.min(i32::MAX as u32) as i32);
    });
    // The promise only resolves.
    let _ = JsFuture::from(promise).await;
}

struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

/// One `fetch`, aborted after `timeout_ms`.
async fn fetch_once(
    url: &str,
    method: &str,
    body: Option<&str>,
    timeout_ms: u32,
) -> Result<Answer, JsValue> {
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    let headers = web_sys::Headers::new()?;
    headers.set("accept", "application/json, application/problem+json")?;
    if let Some(b) = body {
        headers.set("content-type", "application/json")?;
        init.set_body(&JsValue::from_str(b));
    }
    init.set_headers(&headers);
    let controller = web_sys::AbortController::new().ok();
    let abort = controller.as_ref().map(|c| {
        init.set_signal(Some(&c.signal()));
        let c = c.clone();
        Closure::once(move || c.abort())
    });
    let timer = abort.as_ref().map(|a| {
        set_timeout(
            a.as_ref().unchecked_ref(),
            timeout_ms.min(i32::MAX as u32) as i32,
        )
    });
    let result = async {
        let resp: web_sys::Response = JsFuture::from(global_fetch(url, &init)).await?.dyn_into()?;
        let text = JsFuture::from(resp.text()?).await?;
        Ok(Answer {
            status: resp.status(),
            retry_after: resp.headers().get("retry-after").ok().flatten(),
            body: text.as_string().unwrap_or_default(),
        })
    }
    .await;
    if let Some(t) = timer {
        clear_timeout(&t);
    }
    drop(abort); // after clearTimeout: the closure is never called once dropped
    result
}

/// Sends a request with retries and decodes a 2xx JSON body, or the problem document of a
/// non-retryable answer. `rng` only jitters the backoff.
pub async fn send_json<T: serde::de::DeserializeOwned>(
    url: &str,
    method: &str,
    body: Option<&str>,
    policy: RetryPolicy,
    rng: &mut StdRng,
) -> Result<T, ClientError> {
    let attempts = policy.max_attempts.max(1);
    let mut delay = policy.initial_backoff_ms;
    let mut last_error = String::new();
    for attempt in 1..=attempts {
        let mut retry_after_ms = None;
        match fetch_once(url, method, body, policy.request_timeout_ms).await {
            Ok(answer) if (200..300).contains(&answer.status) => {
                return serde_json::from_str(&answer.body)
                    .map_err(|e| ClientError::Protocol(format!("bad JSON answer: {e}")));
            }
            Ok(answer) => {
                let status = answer.status;
                let retryable = status >= 500 || status == 408 || status == 429;
                retry_after_ms = answer
                    .retry_after
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .map(|s| s.saturating_mul(1000));
                let problem = Problem::of_answer(status, &answer.body);
                if !retryable {
                    return Err(ClientError::Problem(problem));
                }
                last_error = format!("HTTP {status}: {}", problem.detail);
            }
            Err(e) => last_error = crate::describe_js_error(&e),
        }
        if attempt < attempts {
            let jitter: f64 = rng.random_range(0.5..1.0);
            let wait = retry_after_ms
                .unwrap_or((f64::from(delay) * jitter) as u32)
                .min(policy.max_backoff_ms.max(delay));
            sleep(wait).await;
            delay = delay.saturating_mul(2).min(policy.max_backoff_ms);
        }
    }
    Err(ClientError::Unavailable {
        attempts,
        last_error,
    })
}
