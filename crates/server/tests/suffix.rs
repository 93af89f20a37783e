//! `serve --drafter suffix`: the suffix drafter serves requests with the greedy text unchanged, and what
//! it remembers of a request serves only later requests of the same API key: asked the same prompt
//! again, the same key's request is proposed the earlier output (nearly every proposal accepted), another
//! key's is not, also with several workers (a key's request goes back to the worker holding its memory),
//! and a server without keys remembers nothing across requests.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{encode, greedy, reference, start_with_drafter};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use turbospark::runtime::{DrafterRequest, Speculation};

const KEYS: [&str; 2] = ["alice-key", "bob-key"];
const MAX_TOKENS: usize = 32;
/// Text whose continuation the testbed does not simply loop on within 32 tokens.
const PROMPT: &str = "Dear Sir, I am writing to";

/// A completion of PROMPT through a router with `keys`, carrying `key`; returns (text, accepted).
async fn complete(q: &server::Queue, keys: &[String], key: Option<&str>) -> (String, u64) {
    let body = json!({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0});
    let mut request = Request::post("/v1/completions").header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Body::from(body.to_string())).unwrap();
    let response = server::router(q.clone(), keys)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    (text, v["timings"]["draft_n_accepted"].as_u64().unwrap())
}

#[tokio::test]
async fn the_suffix_drafter_remembers_requests_only_within_one_api_key() {
    let options = || server::WorkerOptions {
        max_queue: 4,
        ..Default::default()
    };
    let want = reference(&encode(PROMPT), &greedy(MAX_TOKENS)).text;
    let keys: Vec<String> = KEYS.iter().map(|k| k.to_string()).collect();
    let q = start_with_drafter(Speculation::Block(16), DrafterRequest::Suffix, options());
    let (text, first) = complete(&q, &keys, Some(KEYS[0])).await;
    assert_eq!(text, want);
    // The same key again: the earlier output is proposed and accepted.
    let (text, again) = complete(&q, &keys, Some(KEYS[0])).await;
    assert_eq!(text, want);
    assert!(
        again as usize >= MAX_TOKENS - 4,
        "the same key's second request accepted {again} (its first {first})"
    );
    // Another key asking the same: nothing of alice's requests is proposed to bob.
    let (text, other) = complete(&q, &keys, Some(KEYS[1])).await;
    assert_eq!(text, want);
    assert!(
        other <= first + 2 && other + 8 < again,
        "another key's request accepted {other} (the first request {first}, the same key again {again})"
    );
    // Several workers: the key's next request goes back to the worker that holds its memory.
    let q = start_with_drafter(
        Speculation::Block(16),
        DrafterRequest::Suffix,
        server::WorkerOptions {
            parallel: 8,
            ..options()
        },
    );
    // Alternating keys: each key's next request finds its own worker idle, with its memory (the
    // most recently idle worker served the other key).
    let (_, first) = complete(&q, &keys, Some(KEYS[0])).await;
    complete(&q, &keys, Some(KEYS[1])).await;
    for key in [KEYS[0], KEYS[1], KEYS[0]] {
        let (text, again) = complete(&q, &keys, Some(key)).await;
        assert_eq!(text, want);
        assert!(
            again as usize >= MAX_TOKENS - 4,
            "8 workers: {key}'s next request accepted {again} (a first request {first})"
        );
    }
    // A server without keys treats every request as a stranger.
    let q = start_with_drafter(Speculation::Block(16), DrafterRequest::Suffix, options());
    let (_, first) = complete(&q, &[], None).await;
    let (text, again) = complete(&q, &[], None).await;
    assert_eq!(text, want);
    assert!(
        again <= first + 2,
        "keyless: the second request accepted {again}, the first {first}"
    );
}
