//! The OpenAI API's optional fields on the testbed (CPU), against the runtime driven directly:
//! `logprobs` (completions and chat, whole and streamed), `echo` (the prompt scored, `max_tokens: 0`), and
//! `n` choices (choice i = the runtime's run with seed + i).

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};
use turbospark::device::Device;
use turbospark::runtime::{CancelFlag, ChatMessage, Engine, GenerationConfig, Speculation};
use turbospark::sampling::Shaping;

/// The reference's entries for `prompt`, greedy, `max` tokens, `top` alternatives.
fn reference_logprobs(
    prompt: &[u32],
    max: usize,
    top: usize,
) -> turbospark::runtime::GenerationResult {
    let config = GenerationConfig {
        logprobs: Some(top),
        ..greedy(max)
    };
    reference(prompt, &config)
}

fn as_f32(v: &Value) -> f32 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")) as f32
}

#[tokio::test]
async fn completion_logprobs_are_the_runtimes_whole_and_streamed() {
    let q = start(8);
    let want = reference_logprobs(&encode(PROMPT), 24, 3);
    let body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 3});
    let (status, v) = post(&q, "/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["text"], want.text.as_str());
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 24, "one entry per completion token: {lp}");
    // The server speculates; its numbers are the sequential reference's, bit for bit.
    for (i, e) in want.logprobs.iter().enumerate() {
        assert_eq!(as_f32(&lp["token_logprobs"][i]), e.logprob, "token {i}");
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{lp}");
        // Greedy: the chosen token is its row's most likely one.
        let best = top.values().map(as_f32).fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(best, e.logprob);
    }
    // Token strings and offsets spell the text (this prompt's continuation is ASCII).
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, want.text);
    let offsets: Vec<usize> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap() as usize)
        .collect();
    let mut at = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, at);
        at += t.as_str().unwrap().chars().count();
    }
    // Streamed: the chunks' entries concatenate to the whole response's.
    let mut streamed = body;
    streamed["stream"] = true.into();
    let (_, bytes) = post_raw(&q, "/v1/completions", streamed.to_string()).await;
    let (chunks, text) = chunks(&bytes);
    assert_eq!(text, want.text);
    let mut got: Vec<f32> = Vec::new();
    for c in &chunks {
        if let Some(l) = c["choices"].get(0).map(|ch| &ch["logprobs"]) {
            if !l.is_null() {
                got.extend(l["token_logprobs"].as_array().unwrap().iter().map(as_f32));
            }
        }
    }
    let whole: Vec<f32> = want.logprobs.iter().map(|e| e.logprob).collect();
    assert_eq!(got, whole);
    // Without the parameter, choices say null.
    let (_, plain) = post(
        &q,
        "/v1/completions",
        json!({"prompt": PROMPT, "max_tokens": 4}),
    )
    .await;
    assert!(plain["choices"][0]["logprobs"].is_null());
}

#[tokio::test]
async fn chat_logprobs_carry_bytes_and_alternatives() {
    let q = start(8);
    let messages = [ChatMessage::new("user", "Write a Python function.")];
    let prompt = encode(&render(&messages));
    let want = reference_logprobs(&prompt, 16, 2);
    let body = json!({"messages": [{"role": "user", "content": "Write a Python function."}],
                      "max_tokens": 16, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (status, v) = post(&q, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), want.logprobs.len());
    let mut bytes = Vec::new();
    for (entry, e) in content.iter().zip(&want.logprobs) {
        assert_eq!(as_f32(&entry["logprob"]), e.logprob);
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(
            top[0]["token"], entry["token"],
            "greedy: the chosen token leads"
        );
        assert!(as_f32(&top[0]["logprob"]) >= as_f32(&top[1]["logprob"]));
        bytes.extend(
            entry["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    // The tokens' bytes are the reply's bytes (the reply ran to max_tokens, no stop token in it).
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(String::from_utf8(bytes).unwrap(), want.text);
    assert_eq!(v["choices"][0]["message"]["content"], want.text.as_str());
}

#[tokio::test]
async fn echo_scores_the_prompt_and_continues_it() {
    let q = start(8);
    let ids = encode(PROMPT);
    let engine = Engine::open_on(&testbed(), Device::Cpu).unwrap();
    let scored = turbospark::runtime::prompt_logprobs(&engine.model, &ids, 2, &CancelFlag::new())
        .unwrap()
        .unwrap();
    // Score only: the prompt back, its first token unscored, the rest the runtime's scores.
    let body = json!({"prompt": PROMPT, "max_tokens": 0, "echo": true, "logprobs": 2});
    let (status, v) = post(&q, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], PROMPT);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let lp = &choice["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for (i, e) in scored.iter().enumerate() {
        assert_eq!(
            as_f32(&lp["token_logprobs"][i + 1]),
            e.logprob,
            "prompt token {}",
            i + 1
        );
    }
    // Echo and continue: the prompt's text and scores, then the greedy completion's.
    let want = reference_logprobs(&ids, 8, 2);
    let body =
        json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "echo": true, "logprobs": 2});
    let (_, v) = post(&q, "/v1/completions", body.clone()).await;
    assert_eq!(v["choices"][0]["text"], format!("{PROMPT}{}", want.text));
    let got: Vec<Value> = v["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(got.len(), ids.len() + 8);
    for (i, e) in want.logprobs.iter().enumerate() {
        assert_eq!(
            as_f32(&got[ids.len() + i]),
            e.logprob,
            "completion token {i}"
        );
    }
    // Streamed, the first chunk is the prompt, and the text is the whole response's.
    let mut streamed = body;
    streamed["stream"] = true.into();
    let (_, bytes) = post_raw(&q, "/v1/completions", streamed.to_string()).await;
    let (chunks, text) = chunks(&bytes);
    assert_eq!(chunks[0]["choices"][0]["text"], PROMPT);
    assert_eq!(text, format!("{PROMPT}{}", want.text));
    // Echo without logprobs: the text alone.
    let (_, v) = post(
        &q,
        "/v1/completions",
        json!({"prompt": PROMPT, "max_tokens": 0, "echo": true}),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], PROMPT);
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[tokio::test]
async fn n_choices_are_the_runtimes_runs_with_consecutive_seeds() {
    // Sequential, so that each seeded choice is the runtime's run for its seed (speculative sampling
    // is equal in distribution, not per seed).
    let q = start_with(Speculation::Off, 8);
    let shaping = Shaping {
        temperature: 0.9,
        top_k: 40,
        ..Shaping::default()
    };
    let want: Vec<turbospark::runtime::GenerationResult> = (0..3)
        .map(|i| {
            let config = GenerationConfig {
                shaping,
                seed: 77 + i,
                ..greedy(12)
            };
            reference(&encode(PROMPT), &config)
        })
        .collect();
    let texts: std::collections::BTreeSet<&str> = want.iter().map(|r| r.text.as_str()).collect();
    assert!(
        texts.len() > 1,
        "the seeds sample different texts: {texts:?}"
    );
    let body = json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "top_k": 40,
                      "seed": 77, "n": 3});
    let (status, v) = post(&q, "/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, (c, w)) in choices.iter().zip(&want).enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], w.text.as_str(), "choice {i}");
    }
    let completion: usize = want.iter().map(|r| r.new_tokens).sum();
    assert_eq!(v["usage"]["completion_tokens"], completion);
    assert_eq!(v["usage"]["prompt_tokens"], want[0].prompt_tokens);
    // Streamed: each index's deltas spell its choice; one finishing chunk per choice.
    let mut streamed = body;
    streamed["stream"] = true.into();
    let (_, bytes) = post_raw(&q, "/v1/completions", streamed.to_string()).await;
    let (parts, _) = chunks(&bytes);
    let mut by_index = vec![String::new(); 3];
    let mut finished = 0;
    for c in &parts {
        if let Some(ch) = c["choices"].get(0) {
            let i = ch["index"].as_u64().unwrap() as usize;
            by_index[i].push_str(ch["text"].as_str().unwrap_or(""));
            finished += usize::from(!ch["finish_reason"].is_null());
        }
    }
    assert_eq!(finished, 3);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(by_index[i], w.text, "streamed choice {i}");
    }
    // Chat: each choice opens with the assistant's role.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2,
                      "temperature": 0, "stream": true});
    let (_, bytes) = post_raw(&q, "/v1/chat/completions", chat.to_string()).await;
    let (parts, _) = chunks(&bytes);
    let roles: Vec<u64> = parts
        .iter()
        .filter(|c| c["choices"][0]["delta"]["role"] == "assistant")
        .map(|c| c["choices"][0]["index"].as_u64().unwrap())
        .collect();
    assert_eq!(roles, [0, 1]);
}
