//! turbospark's OpenAI-compatible HTTP server (`turbospark serve`).
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions` (whole or `stream: true` as
//! server-sent events), `GET /v1/models` and `/v1/models/{id}`, `POST /tokenize` and `/detokenize`
//! (vLLM's), `GET /health`, `GET /metrics` (Prometheus text).
//!
//! Architecture: axum handlers parse and check a request (request.rs: every refusal names its
//! parameter), then hand it to the one generation worker (worker.rs; a job's run: job.rs), a thread
//! that owns the engine and one session and serves requests in arrival order — the engine decodes one
//! sequence at a time, with speculative decoding when the plan enables it. Because every request runs on that one
//! session, a chat turn that extends the previous conversation prefills only its new tokens
//! (`usage.prompt_tokens_details.cached_tokens` says how many were reused). A client that hangs up
//! cancels its generation at the next committed token (or before it starts, if still queued).
//!
//! What comes back is the runtime's generation contract unchanged: the same stop rules, the same
//! UTF-8-safe deltas, and at temperature 0 the same tokens as `turbospark generate`.

mod error;
mod job;
mod logprobs;
mod openai;
mod request;
mod route;
mod worker;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

pub use error::ApiError;
pub use worker::{spawn, Metrics, ModelInfo, Queue, WorkerOptions};

/// Which of the server's API keys a request carried (its index in the list given to [`router`]): the
/// client it comes from. The suffix drafter's memory of earlier requests is shared only between
/// requests of one client; a server without keys treats every request as a stranger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client(pub usize);

/// The routes over a running worker. With `api_keys`, every route but `/health` and `/metrics`
/// answers 401 unless the request carries `Authorization: Bearer <one of them>` (the scheme in any
/// case, as RFC 7235 says); the key found becomes the request's [`Client`]. A known path with another
/// method is a 405 with a JSON error, like every other refusal.
pub fn router(queue: Queue, api_keys: &[String]) -> Router {
    let mut v1 = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/tokenize", post(openai::tokenize))
        .route("/detokenize", post(openai::detokenize));
    if !api_keys.is_empty() {
        let keys: Arc<[String]> = Arc::from(api_keys);
        v1 = v1.layer(middleware::from_fn(
            move |mut request: Request, next: Next| {
                let keys = keys.clone();
                async move {
                    let given = request
                        .headers()
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.split_once(' '))
                        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                        .map(|(_, token)| token.trim_start());
                    // Every key is compared (in time that depends only on the lengths).
                    let found = given.and_then(|g| {
                        keys.iter().enumerate().fold(None, |hit, (i, k)| {
                            hit.or(same(g.as_bytes(), k.as_bytes()).then_some(i))
                        })
                    });
                    match found {
                        Some(i) => {
                            request.extensions_mut().insert(Client(i));
                            next.run(request).await
                        }
                        None => ApiError::unauthorized().into_response(),
                    }
                }
            },
        ));
    }
    v1.route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route(
            "/metrics",
            get(
                |axum::extract::State(q): axum::extract::State<Queue>| async move {
                    q.metrics.render(&q.info)
                },
            ),
        )
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::not_found(None, format!("no route for {uri}")).into_response()
        })
        .method_not_allowed_fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                ApiError::method_not_allowed(format!("{method} is not served on {uri}"))
                    .into_response()
            },
        )
        .with_state(queue)
}

/// Compares two keys in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long a connection may take to send a request's headers (a slow client holds only its own
/// connection, and not for long).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `queue` on `listener` until `shutdown` resolves; requests in flight then get `grace` to
/// finish before the server returns. A connection that does not send a request's headers within
/// `header_timeout` (`HEADER_READ_TIMEOUT` for `turbospark serve`) is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    queue: Queue,
    api_keys: Vec<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    serve_with(
        listener,
        router(queue, &api_keys),
        shutdown,
        grace,
        HEADER_READ_TIMEOUT,
    )
    .await
}

/// [`serve`] of any router, with the header timeout given.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
    header_timeout: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                // A failed accept (the peer left, no descriptors for a moment) ends only that one.
                let Ok((stream, _)) = accepted else { continue };
                let service = TowerToHyperService::new(app.clone());
                let connection = http.serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    // Stop accepting; connections finish their requests in flight, for at most `grace`.
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {}
    }
    Ok(())
}
