//! A client that stops reading only ever holds its own request: its stream is cancelled once it has not
//! read for the worker's stall timeout, and the requests behind it are served as if it were absent.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use serde_json::json;
use tower::ServiceExt;
use turbospark::Speculation;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_is_cancelled_and_the_others_are_served() {
    let stall = Duration::from_millis(500);
    let q = start_with_options(
        Speculation::Off,
        server::WorkerOptions {
            max_queue: 8,
            stalled_client: stall,
            ..Default::default()
        },
    );
    // A stream of many tokens whose body is never read: its 256-message buffer fills.
    let request = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": PROMPT, "max_tokens": 1200, "ignore_eos": true, "stream": true})
                .to_string(),
        ))
        .unwrap();
    let stalled = server::router(q.clone(), None)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(stalled.status(), StatusCode::OK);
    // The request behind it: answered in far less than the stalled one would take, and the same
    // text as alone.
    let started = Instant::now();
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(60),
        post(
            &q,
            "/v1/completions",
            json!({"prompt": PROMPT, "max_tokens": 16}),
        ),
    )
    .await
    .expect("the second request was answered");
    assert_eq!(status, StatusCode::OK, "{body}");
    let want = reference(&encode(PROMPT), &greedy(16)).text;
    assert_eq!(body["choices"][0]["text"], want.as_str());
    println!(
        "served after {:?} (stall timeout {stall:?})",
        started.elapsed()
    );
    // The stalled one was cancelled, not completed.
    let text = get(&q, "/metrics").await;
    assert_eq!(metric(&text, "requests_cancelled_total"), 1, "{text}");
    drop(stalled);
}
