//! The HTTP server on the embedded testbed (CPU), checked against the runtime driven directly: what
//! a client gets through `/v1/completions` and `/v1/chat/completions` must be what `turbospark::runtime::generate`
//! writes for the same prompt and parameters (greedy: token for token, with the server's speculative
//! `auto` plan against a sequential reference), whole or streamed; refusals name their parameter;
//! a client that hangs up cancels its generation; a full queue answers 503; chat turns reuse the prefix.
//!
//! Each test runs its own worker (its own session), so prefix reuse and the queue are not shared.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use turbospark::runtime::{ChatMessage, DrafterRequest, GenerationConfig, Speculation};
use turbospark::sampling::Shaping;

#[tokio::test]
async fn completion_is_the_runtimes_greedy_generation() {
    let q = start(8);
    let want = reference(&encode(PROMPT), &greedy(40));
    assert_eq!(want.new_tokens, 40, "the reference must run to max_tokens");
    // temperature 0 named, and omitted: the testbed's generation_config.json says do_sample false.
    for body in [
        json!({"model": "testbed", "prompt": PROMPT, "max_tokens": 40, "temperature": 0}),
        json!({"prompt": PROMPT, "max_tokens": 40}),
        json!({"prompt": [PROMPT], "max_tokens": 40, "temperature": 0.0}),
        json!({"prompt": encode(PROMPT), "max_tokens": 40, "temperature": 0}),
    ] {
        let (status, v) = post(&q, "/v1/completions", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}: {v}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["model"], "testbed");
        assert_eq!(v["choices"][0]["text"], want.text.as_str(), "{body}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], want.prompt_tokens);
        assert_eq!(v["usage"]["completion_tokens"], 40);
        assert_eq!(v["usage"]["total_tokens"], want.prompt_tokens + 40);
    }
    // The worker speculates (`auto` with the testbed's MTP head): its counters moved.
    let metrics = get(&q, "/metrics").await;
    assert!(
        metric(&metrics, "spec_proposed_tokens_total") > 0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "requests_completed_total"), 4);
    assert_eq!(metric(&metrics, "generation_tokens_total"), 160);
}

#[tokio::test]
async fn stream_concatenates_to_the_whole_response() {
    let q = start(8);
    let want = reference(&encode(PROMPT), &greedy(48));
    let body = json!({"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (status, bytes) = post_raw(&q, "/v1/completions", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let (chunks, text) = chunks(&bytes);
    assert_eq!(text, want.text);
    assert!(chunks.len() > 3, "the text came in several deltas");
    let finishing: Vec<&Value> = chunks
        .iter()
        .filter(|c| {
            c["choices"]
                .get(0)
                .is_some_and(|ch| !ch["finish_reason"].is_null())
        })
        .collect();
    assert_eq!(finishing.len(), 1);
    assert_eq!(finishing[0]["choices"][0]["finish_reason"], "length");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 48);
    assert_eq!(usage["prompt_tokens"], want.prompt_tokens);
}

#[tokio::test]
async fn stop_strings_end_the_text_before_the_match() {
    let q = start(8);
    let full = reference(&encode(PROMPT), &greedy(64)).text;
    // A stop string from the middle of the greedy text: what comes back is the text before it.
    let chars: Vec<char> = full.chars().collect();
    let mid = chars.len() / 2;
    let stop: String = chars[mid..mid + 3].iter().collect();
    let cut = full.find(&stop).unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": PROMPT, "max_tokens": 64, "temperature": 0,
                          "stop": ["\u{1}never", stop], "stream": stream});
        let (status, bytes) = post_raw(&q, "/v1/completions", body.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        let (text, finish) = if stream {
            let (chunks, text) = chunks(&bytes);
            (
                text,
                chunks.last().unwrap()["choices"][0]["finish_reason"].clone(),
            )
        } else {
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"].clone(),
            )
        };
        assert_eq!(text, &full[..cut], "stream {stream}");
        assert_eq!(finish, "stop");
    }
}

#[tokio::test]
async fn chat_uses_the_template_and_reuses_the_previous_turn() {
    let q = start(8);
    let mut messages = vec![ChatMessage::new(
        "user",
        "Write a function that adds two numbers.",
    )];
    let prompt1 = encode(&render(&messages));
    let want1 = reference(&prompt1, &greedy(24));
    let turn = |messages: &[ChatMessage]| {
        let list: Vec<Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        json!({"messages": list, "max_tokens": 24, "temperature": 0})
    };
    let (status, v) = post(&q, "/v1/chat/completions", turn(&messages)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want1.text.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], prompt1.len());
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // Turn 2 extends turn 1: the session reuses its prefix, and the reply is a fresh session's.
    messages.push(ChatMessage::new("assistant", want1.text.clone()));
    messages.push(ChatMessage::new("user", "Now make it subtract."));
    let prompt2 = encode(&render(&messages));
    let want2 = reference(&prompt2, &greedy(24));
    let (status, v) = post(&q, "/v1/chat/completions", turn(&messages)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want2.text.as_str());
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0, "turn 2 reused nothing: {v}");
    assert_eq!(v["timings"]["prompt_n"], prompt2.len() as u64 - cached);

    // Text parts are joined as one content string: the same prompt, the same reply.
    let parts = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Write a function that "}, {"type": "text", "text": "adds two numbers."}]}],
        "max_tokens": 24, "temperature": 0});
    let (_, v) = post(&q, "/v1/chat/completions", parts).await;
    assert_eq!(v["choices"][0]["message"]["content"], want1.text.as_str());
}

#[tokio::test]
async fn seeded_sampling_reproduces_the_runtime() {
    let q = start(8);
    let config = GenerationConfig {
        shaping: Shaping {
            temperature: 0.8,
            top_k: 20,
            ..Shaping::default()
        },
        seed: 1234,
        ..greedy(32)
    };
    let want = reference(&encode(PROMPT), &config);
    let body =
        json!({"prompt": PROMPT, "max_tokens": 32, "temperature": 0.8, "top_k": 20, "seed": 1234});
    // Sampled runs speculate with exact rejection sampling, which is equal in distribution, not per
    // seed; the server's plan is `auto`, whose sampled runs keep the fixed block. So compare the
    // server against itself for reproducibility, and a sequential server against the runtime.
    let (_, a) = post(&q, "/v1/completions", body.clone()).await;
    let (_, b) = post(&q, "/v1/completions", body.clone()).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let sequential = start_with(Speculation::Off, 4);
    let (_, c) = post(&sequential, "/v1/completions", body).await;
    assert_eq!(c["choices"][0]["text"], want.text.as_str());
}

#[tokio::test]
async fn refusals_name_the_parameter_and_leave_the_server_serving() {
    let q = start(8);
    let too_long = "x ".repeat(3000);
    let cases: Vec<(&str, String, StatusCode, Option<&str>)> = vec![
        ("/v1/completions", json!({"prompt": "a", "temperature": -1}).to_string(), StatusCode::BAD_REQUEST, Some("temperature")),
        ("/v1/completions", json!({"prompt": "a", "temperature": 1e308}).to_string(), StatusCode::BAD_REQUEST, Some("temperature")),
        ("/v1/completions", json!({"prompt": "a", "seed": 1.5}).to_string(), StatusCode::BAD_REQUEST, Some("seed")),
        ("/v1/chat/completions", json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string(), StatusCode::BAD_REQUEST, Some("messages[0].role")),
        ("/v1/completions", json!({"prompt": "a", "top_p": "high"}).to_string(), StatusCode::BAD_REQUEST, Some("top_p")),
        ("/v1/completions", json!({"prompt": "a", "n": 65}).to_string(), StatusCode::BAD_REQUEST, Some("n")),
        ("/v1/completions", json!({"prompt": "a", "n": 2, "best_of": 3}).to_string(), StatusCode::BAD_REQUEST, Some("best_of")),
        ("/v1/completions", json!({"prompt": "a", "logprobs": 21}).to_string(), StatusCode::BAD_REQUEST, Some("logprobs")),
        ("/v1/completions", json!({"prompt": "a", "top_logprobs": 2}).to_string(), StatusCode::BAD_REQUEST, Some("top_logprobs")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "echo": true}).to_string(), StatusCode::BAD_REQUEST, Some("echo")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}).to_string(), StatusCode::BAD_REQUEST, Some("top_logprobs")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}).to_string(), StatusCode::BAD_REQUEST, Some("logprobs")),
        ("/v1/completions", json!({"prompt": "a", "max_tokens": 100000}).to_string(), StatusCode::BAD_REQUEST, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": "a", "max_tokens": 0}).to_string(), StatusCode::BAD_REQUEST, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": too_long}).to_string(), StatusCode::BAD_REQUEST, Some("prompt")),
        ("/v1/completions", json!({"prompt": ""}).to_string(), StatusCode::BAD_REQUEST, Some("prompt")),
        ("/v1/completions", json!({"prompt": [1, 99999999]}).to_string(), StatusCode::BAD_REQUEST, Some("prompt")),
        ("/v1/completions", json!({"prompt": "a", "stop": ["ok", 3]}).to_string(), StatusCode::BAD_REQUEST, Some("stop[1]")),
        ("/v1/completions", json!({"prompt": "a", "stop": ""}).to_string(), StatusCode::BAD_REQUEST, Some("stop")),
        ("/v1/completions", json!({"max_tokens": 3}).to_string(), StatusCode::BAD_REQUEST, Some("prompt")),
        ("/v1/completions", json!({"prompt": "a", "model": "gpt-4"}).to_string(), StatusCode::NOT_FOUND, Some("model")),
        ("/v1/completions", "{\"prompt\": ".to_string(), StatusCode::BAD_REQUEST, None),
        ("/v1/completions", "[1, 2]".to_string(), StatusCode::BAD_REQUEST, None),
        ("/v1/chat/completions", json!({"max_tokens": 3}).to_string(), StatusCode::BAD_REQUEST, Some("messages")),
        ("/v1/chat/completions", json!({"messages": [{"content": "hi"}]}).to_string(), StatusCode::BAD_REQUEST, Some("messages[0].role")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).to_string(), StatusCode::BAD_REQUEST, Some("messages[0].content[0].type")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}).to_string(), StatusCode::BAD_REQUEST, Some("tools")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}).to_string(), StatusCode::BAD_REQUEST, Some("response_format")),
    ];
    for (path, body, status, param) in &cases {
        let (got, bytes) = post_raw(&q, path, body.clone()).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(got, *status, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"].as_str(), *param, "{path} {body}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        if let Some(p) = param {
            assert!(message.contains(p), "the message names {p}: {message}");
        }
    }
    let metrics = get(&q, "/metrics").await;
    assert_eq!(
        metric(&metrics, "requests_refused_total"),
        cases.len() as u64
    );
    assert_eq!(metric(&metrics, "requests_completed_total"), 0);
    // Nothing was lost: the next good request is served.
    let (status, v) = post(
        &q,
        "/v1/completions",
        json!({"prompt": PROMPT, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

/// Polls `/metrics` until `name` reaches `want` (the worker updates it when the generation stops).
async fn wait_metric(q: &server::Queue, name: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = get(q, "/metrics").await;
        if metric(&text, name) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {want}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_client_that_hangs_up_cancels_its_generation() {
    let q = start(8);
    // ignore_eos and the whole context: without the cancel this would run ~2000 tokens.
    let body = json!({"prompt": PROMPT, "temperature": 0, "ignore_eos": true, "stream": true});
    let request = Request::post("/v1/completions")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = server::router(q.clone(), &[])
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data:")));
    drop(body);
    wait_metric(&q, "requests_cancelled_total", 1).await;
    let metrics = get(&q, "/metrics").await;
    assert!(
        metric(&metrics, "generation_tokens_total") < 1500,
        "the cancelled run stopped early: {metrics}"
    );
    let (status, _) = post(
        &q,
        "/v1/completions",
        json!({"prompt": PROMPT, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_full_queue_answers_503() {
    let q = start(1);
    let long = json!({"prompt": PROMPT, "temperature": 0, "ignore_eos": true, "stream": true});
    // Request 1 runs (its stream is open once the worker admitted it), request 2 waits in the queue.
    let running = server::router(q.clone(), &[])
        .oneshot(
            Request::post("/v1/completions")
                .body(Body::from(long.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(running.status(), StatusCode::OK);
    let router = server::router(q.clone(), &[]);
    let waiting = tokio::spawn(async move {
        let request = Request::post("/v1/completions")
            .body(Body::from(
                json!({"prompt": PROMPT, "max_tokens": 2}).to_string(),
            ))
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    });
    wait_metric(&q, "requests_queued", 1).await;
    let (status, bytes) = post_raw(&q, "/v1/completions", json!({"prompt": "a"}).to_string()).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    // The running stream hangs up: the waiting request is served next.
    drop(running);
    let (status, bytes) = waiting.await.unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

#[tokio::test]
async fn serves_over_tcp() {
    use std::io::{Read, Write};
    let q = start(4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server::serve(
        listener,
        q,
        vec!["sekrit".to_string()],
        async move {
            let _ = stop_rx.await;
        },
        Duration::from_secs(1),
    ));
    let body = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).to_string();
    // Plain HTTP/1.1 exchanges over a real socket, off the runtime's threads: (status line, body).
    let exchange = move |method: &'static str, path: &'static str, auth: Option<&'static str>| {
        let body = body.clone();
        tokio::task::spawn_blocking(move || {
            let mut tcp = std::net::TcpStream::connect(addr).unwrap();
            let auth = auth.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            tcp.write_all(request.as_bytes()).unwrap();
            let mut reply = String::new();
            tcp.read_to_string(&mut reply).unwrap();
            let at = reply.find("\r\n\r\n").unwrap();
            (reply[..12].to_string(), reply[at + 4..].to_string())
        })
    };
    let (status, reply) = exchange("POST", "/v1/completions", Some("sekrit"))
        .await
        .unwrap();
    assert_eq!(status, "HTTP/1.1 200", "{reply}");
    let v: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(
        v["choices"][0]["text"],
        reference(&encode(PROMPT), &greedy(8)).text.as_str()
    );
    // The API key guards /v1, not the probes.
    for auth in [None, Some("wrong")] {
        let (status, reply) = exchange("POST", "/v1/completions", auth).await.unwrap();
        assert_eq!(status, "HTTP/1.1 401", "{reply}");
        assert!(reply.contains("API key"), "{reply}");
    }
    let (status, reply) = exchange("GET", "/health", None).await.unwrap();
    assert_eq!(status, "HTTP/1.1 200", "{reply}");
    stop_tx.send(()).unwrap();
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn openai_conventions_negative_seeds_default_max_tokens_405_and_keys() {
    let q = start(4);
    // Negative seeds are seeds (OpenAI and vLLM take them): reproducible.
    let body = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0.9, "seed": -7});
    let (status, a) = post(&q, "/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    let (_, b) = post(&q, "/v1/completions", body).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    // No max_tokens: generation_config.json's max_new_tokens (256 for the testbed), not the context.
    let (status, v) = post(
        &q,
        "/v1/completions",
        json!({"prompt": PROMPT, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 256, "{}", v["usage"]);
    // A known route with another method: a JSON error, 405.
    let request = Request::get("/v1/completions").body(Body::empty()).unwrap();
    let response = server::router(q.clone(), &[])
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("GET"),
        "{v}"
    );
    // With a key, every route but the probes needs it (tokenize included); the scheme in any case.
    let keyed = |auth: Option<&str>, method: &str, path: &str, body: &str| {
        let mut r = Request::builder().method(method).uri(path);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let request = r.body(Body::from(body.to_string())).unwrap();
        server::router(q.clone(), &["sekrit".to_string()]).oneshot(request)
    };
    let tokenize = json!({"prompt": "hi"}).to_string();
    for (auth, want) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("Bearer wrong"), StatusCode::UNAUTHORIZED),
        (Some("Basic sekrit"), StatusCode::UNAUTHORIZED),
        (Some("Bearer sekrit"), StatusCode::OK),
        (Some("bearer sekrit"), StatusCode::OK),
    ] {
        let got = keyed(auth, "POST", "/tokenize", &tokenize)
            .await
            .unwrap()
            .status();
        assert_eq!(got, want, "/tokenize with {auth:?}");
    }
    let got = keyed(None, "POST", "/detokenize", "{\"tokens\": [1]}")
        .await
        .unwrap()
        .status();
    assert_eq!(got, StatusCode::UNAUTHORIZED);
    for probe in ["/health", "/metrics"] {
        let got = keyed(None, "GET", probe, "").await.unwrap().status();
        assert_eq!(got, StatusCode::OK, "{probe}");
    }
}

#[tokio::test]
async fn per_request_speculation_follows_the_policy() {
    let q = start(8);
    let want = reference(&encode(PROMPT), &greedy(32));
    let ask = |speculative: Value| json!({"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "speculative": speculative});
    // Off decodes sequentially; a named block drafts that many; both write the greedy text.
    let (status, off) = post(&q, "/v1/completions", ask(json!("off"))).await;
    assert_eq!(status, StatusCode::OK, "{off}");
    assert!(off["timings"].get("draft_n").is_none(), "{off}");
    assert_eq!(off["choices"][0]["text"], want.text.as_str());
    for block in [json!(3), json!("5")] {
        let (status, v) = post(&q, "/v1/completions", ask(block.clone())).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert!(
            v["timings"]["draft_n"].as_u64().unwrap() > 0,
            "{block}: {v}"
        );
        assert_eq!(v["choices"][0]["text"], want.text.as_str(), "{block}");
    }
    // A block the policy cannot serve is refused, naming why, never downgraded.
    for bad in [json!(0), json!(99), json!("fast"), json!(true)] {
        let (status, v) = post(&q, "/v1/completions", ask(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert_eq!(v["error"]["param"], "speculative", "{bad}: {v}");
    }
    let sequential = start_with(Speculation::Off, 4);
    let (status, v) = post(&sequential, "/v1/completions", ask(json!(2))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("without a drafter"), "{message}");
}

/// `serve --drafter ngram`: prompt lookup serves the requests (whatever the checkpoint carries),
/// writes the greedy text, copies a prompt that repeats itself, and a per-request block is checked
/// against its own range.
#[tokio::test]
async fn a_server_named_to_prompt_lookup_uses_it() {
    let options = server::WorkerOptions {
        max_queue: 4,
        ..Default::default()
    };
    let q = start_with_drafter(Speculation::Auto, DrafterRequest::Ngram, options);
    let repeated = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n";
    let want = reference(&encode(repeated), &greedy(24));
    let ask = |speculative: Value| json!({"prompt": repeated, "max_tokens": 24, "temperature": 0, "speculative": speculative});
    for speculative in [json!("auto"), json!(6), json!(16)] {
        let (status, v) = post(&q, "/v1/completions", ask(speculative.clone())).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["choices"][0]["text"], want.text.as_str(), "{speculative}");
        assert!(
            v["timings"]["draft_n_accepted"].as_u64().unwrap() > 0,
            "{speculative}: {v}"
        );
    }
    let (status, v) = post(&q, "/v1/completions", ask(json!(17))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ngram") && message.contains("1..=16"),
        "{message}"
    );
}

#[tokio::test]
async fn tokenize_detokenize_and_the_model_object() {
    let q = start(4);
    let (status, v) = post(&q, "/tokenize", json!({"prompt": PROMPT})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let ids = encode(PROMPT);
    assert_eq!(v["tokens"], json!(ids));
    assert_eq!(v["count"], ids.len());
    assert_eq!(v["max_model_len"], 2048);
    let (status, v) = post(&q, "/detokenize", json!({ "tokens": ids })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["prompt"], PROMPT);
    let (status, v) = post(&q, "/detokenize", json!({"tokens": [1, 99999999]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "tokens[1]");
    let (status, v) = post(&q, "/tokenize", json!({"text": PROMPT})).await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (StatusCode::BAD_REQUEST, json!("prompt"))
    );
    let model: Value = serde_json::from_str(&get(&q, "/v1/models/testbed").await).unwrap();
    assert_eq!(model["id"], "testbed");
    let request = Request::get("/v1/models/gpt-4")
        .body(Body::empty())
        .unwrap();
    let response = server::router(q.clone(), &[])
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}
