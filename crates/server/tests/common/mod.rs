//! Shared by the server's tests: a worker on the embedded testbed (CPU), the runtime as the reference,
//! and HTTP helpers over the router (no socket).
#![allow(dead_code)]

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use turbospark::device::Device;
use turbospark::runtime::{
    CancelFlag, ChatMessage, DrafterRequest, Engine, GenerationConfig, RenderOptions, Speculation,
};

pub fn testbed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed")
}

/// A worker on the testbed with speculation `auto` (the CLI's default) and queue `max_queue`.
pub fn start(max_queue: usize) -> server::Queue {
    start_with(Speculation::Auto, max_queue)
}

pub fn start_with(speculation: Speculation, max_queue: usize) -> server::Queue {
    start_with_options(
        speculation,
        server::WorkerOptions {
            max_queue,
            ..Default::default()
        },
    )
}

pub fn start_with_options(
    speculation: Speculation,
    options: server::WorkerOptions,
) -> server::Queue {
    start_with_drafter(speculation, DrafterRequest::Auto, options)
}

/// A worker on the testbed speculating with `drafter` (`serve --drafter`).
pub fn start_with_drafter(
    speculation: Speculation,
    drafter: DrafterRequest,
    options: server::WorkerOptions,
) -> server::Queue {
    let batching = options.parallel > 1;
    server::spawn(
        move || {
            let model = turbospark::Model::builder(testbed())
                .device(Device::Cpu)
                .speculation(speculation)
                .drafter(drafter)
                .batching(batching)
                .build()?;
            let session = model.session()?;
            Ok((model, session, "testbed".to_string()))
        },
        options,
    )
    .expect("the testbed loads")
}

/// The reference: `turbospark::runtime::generate` on a fresh sequential session.
pub fn reference(
    prompt: &[u32],
    config: &GenerationConfig,
) -> turbospark::runtime::GenerationResult {
    let engine = Engine::open_on(&testbed(), Device::Cpu).unwrap();
    let prepared = engine
        .prepare(Speculation::Off, DrafterRequest::Auto)
        .unwrap();
    let mut session = prepared.session;
    let request = turbospark::runtime::Request {
        prompt,
        config,
        eos: &engine.eos,
        detok: &engine.tokenizer,
        speculative: None,
        cancel: CancelFlag::new(),
    };
    turbospark::runtime::generate(&engine.model, &mut session, &request, &mut |_| {}).unwrap()
}

pub fn encode(text: &str) -> Vec<u32> {
    Engine::open_on(&testbed(), Device::Cpu)
        .unwrap()
        .encode(text)
        .unwrap()
}

pub fn render(messages: &[ChatMessage]) -> String {
    let engine = Engine::open_on(&testbed(), Device::Cpu).unwrap();
    let options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    engine.chat.unwrap().render(messages, &options).unwrap()
}

pub fn greedy(max: usize) -> GenerationConfig {
    GenerationConfig::greedy(max)
}

pub async fn post(q: &server::Queue, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, bytes) = post_raw(q, path, body.to_string()).await;
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{path}: not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, value)
}

pub async fn post_raw(q: &server::Queue, path: &str, body: String) -> (StatusCode, Vec<u8>) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = server::router(q.clone(), &[])
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

pub async fn get(q: &server::Queue, path: &str) -> String {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = server::router(q.clone(), &[])
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .map(str::to_string)
        })
        .collect()
}

/// The JSON chunks of an SSE body that ends with `[DONE]`, and their concatenated completion text.
pub fn chunks(body: &[u8]) -> (Vec<Value>, String) {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["text"].as_str().map(str::to_string))
        .collect();
    (chunks, text)
}

pub fn metric(text: &str, name: &str) -> u64 {
    let prefix = format!("turbospark_{name}{{");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

pub const PROMPT: &str = "def fibonacci(n):";
