//! A slow or stalled client only ever slows itself: a stream whose client stops reading is cancelled
//! once it has not read for the worker's stall timeout (the requests behind it are served as if it
//! were absent), and a connection that does not finish its headers is closed after the header timeout.

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
    let stalled = server::router(q.clone(), &[])
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    use std::io::{Read, Write};
    let q = start(4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let header_timeout = Duration::from_millis(300);
    let served = tokio::spawn(server::serve_with(
        listener,
        server::router(q, &[]),
        async move {
            let _ = stop_rx.await;
        },
        Duration::from_secs(1),
        header_timeout,
    ));
    let outcome = tokio::task::spawn_blocking(move || {
        // Half a request's headers, then silence.
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        // Meanwhile a whole request on another connection is answered.
        let mut ok = std::net::TcpStream::connect(addr).unwrap();
        ok.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        ok.read_to_string(&mut reply).unwrap();
        // The slow one is closed by the server after the timeout (EOF, or a reset).
        let started = Instant::now();
        let mut rest = Vec::new();
        let closed = match slow.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => {
                e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut
            }
        };
        (reply, closed, started.elapsed())
    })
    .await
    .unwrap();
    let (reply, closed, waited) = outcome;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(closed, "the slow connection was not closed in 20 s");
    assert!(waited < Duration::from_secs(10), "closed after {waited:?}");
    stop_tx.send(()).unwrap();
    served.await.unwrap().unwrap();
}
