//! turbospark's OpenAI-compatible HTTP server (`turbospark serve`).
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions` (whole or `stream: true` as
//! server-sent events), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//!
//! Architecture: axum handlers parse and check a request (request.rs: every refusal names its
//! parameter), then hand it to the one generation worker (worker.rs), a thread that owns the engine
//! and one session and serves requests in arrival order — the engine decodes one sequence at a time,
//! with speculative decoding when the plan enables it. Because every request runs on that one
//! session, a chat turn that extends the previous conversation prefills only its new tokens
//! (`usage.prompt_tokens_details.cached_tokens` says how many were reused). A client that hangs up
//! cancels its generation at the next committed token (or before it starts, if still queued).
//!
//! What comes back is the runtime's generation contract unchanged: the same stop rules, the same
//! UTF-8-safe deltas, and at temperature 0 the same tokens as `turbospark generate`.

mod error;
mod openai;
mod request;
mod worker;

use std::future::Future;
use std::time::Duration;

use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

pub use error::ApiError;
pub use worker::{spawn, Metrics, ModelInfo, Queue};

/// The routes over a running worker.
pub fn router(queue: Queue) -> Router {
    Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
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
        .with_state(queue)
}

/// Serves `queue` on `listener` until `shutdown` resolves; requests in flight then get `grace` to
/// finish before the server returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    queue: Queue,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(queue)).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = stopping_tx.send(());
    });
    tokio::select! {
        result = server => result,
        () = async {
            // The shutdown began (or its sender is gone with the server): give streams `grace`.
            let _ = stopping_rx.await;
            tokio::time::sleep(grace).await;
        } => Ok(()),
    }
}
