//! Several requests at once (`WorkerOptions::parallel` over a batching model): every request returns
//! what it returns alone — identical greedy requests identical text whatever the concurrency, seeded
//! sampled requests the same draws — while the model's steps hold several sequences.

mod common;

use axum::http::StatusCode;
use common::{encode, greedy, post, reference, testbed};
use serde_json::{json, Value};
use turbospark::device::Device;
use turbospark::runtime::{DrafterRequest, Speculation};

const PROMPTS: [&str; 4] = [
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n",
    "Once upon a time",
];

/// A worker pool of `parallel` on the testbed, speculating as the CLI does by default; the model too.
fn start(parallel: usize) -> (server::Queue, turbospark::Model) {
    let (tx, rx) = std::sync::mpsc::channel();
    let q = server::spawn(
        move || {
            let model = turbospark::Model::builder(testbed())
                .device(Device::Cpu)
                .speculation(Speculation::Auto)
                .drafter(DrafterRequest::Auto)
                .batching(parallel > 1)
                .build()?;
            let _ = tx.send(model.clone());
            let session = model.session()?;
            Ok((model, session, "testbed".to_string()))
        },
        server::WorkerOptions {
            max_queue: 64,
            parallel,
            ..Default::default()
        },
    )
    .expect("the testbed loads");
    (q, rx.recv().unwrap())
}

async fn text(q: &server::Queue, body: Value) -> String {
    let (status, v) = post(q, "/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}: {v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_each_get_their_answer_alone() {
    let (q, model) = start(4);
    assert!(model.batches());
    // Each prompt twice, greedy, all at once.
    let bodies: Vec<Value> = PROMPTS
        .iter()
        .chain(PROMPTS.iter())
        .map(|p| json!({"prompt": p, "max_tokens": 24, "temperature": 0}))
        .collect();
    let got = futures_util::future::join_all(bodies.iter().map(|b| text(&q, b.clone()))).await;
    for (i, p) in PROMPTS.iter().chain(PROMPTS.iter()).enumerate() {
        let want = reference(&encode(p), &greedy(24));
        assert_eq!(got[i], want.text, "request {i} ({p:?})");
    }
    let stats = model.batch_stats().unwrap();
    assert!(
        stats.largest > 1 && stats.sequences > stats.steps,
        "the requests did not share steps: {stats:?}"
    );
    // /metrics reports them (as of the last finished request).
    let metrics = common::get(&q, "/metrics").await;
    let value = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("turbospark_{name}{{")))
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (steps, sequences) = (value("batch_steps_total"), value("batch_sequences_total"));
    assert!(
        steps > 0 && sequences > steps,
        "{steps} steps, {sequences} sequences"
    );
    // Seeded sampled requests: the same draws together as alone (one worker, one at a time).
    let sampled = |seed: u64| json!({"prompt": PROMPTS[3], "max_tokens": 20, "temperature": 0.9, "seed": seed});
    let together = futures_util::future::join_all((0..4).map(|i| text(&q, sampled(i % 2)))).await;
    let (alone_q, _) = start(1);
    for (i, t) in together.iter().enumerate() {
        assert_eq!(
            *t,
            text(&alone_q, sampled(i as u64 % 2)).await,
            "seeded request {i}"
        );
    }
}
