//! Incremental detokenization and the sink on Qwen3's real byte-level BPE tokenizer
//! (fixtures/tokenizers/qwen3): ids and decoded texts were produced by transformers
//! (see fixtures/README.md), so these check our streaming against an independent reference.

use std::path::PathBuf;

use runtime::{
    CancelFlag, Detokenizer, Event, GenerationConfig, IncrementalDecoder, StopReason, TokenSink,
};
use serde::Deserialize;

fn fixtures() -> PathBuf {
    testdata::fixtures().to_path_buf()
}

fn tokenizer() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(fixtures().join("tokenizers/qwen3/tokenizer.json")).unwrap()
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("tokenizers/qwen3/cases.json")).unwrap();
    serde_json::from_str::<Cases>(&text).unwrap().cases
}

/// Streams `ids` after `prompt`; returns the deltas (the flush last).
fn stream(tok: &tokenizers::Tokenizer, prompt: &[u32], ids: &[u32]) -> Vec<String> {
    let mut decoder = IncrementalDecoder::new(prompt, tok).unwrap();
    let mut deltas: Vec<String> = ids
        .iter()
        .map(|&id| decoder.push(id, tok).unwrap())
        .collect();
    deltas.push(decoder.flush(tok).unwrap());
    deltas
}

fn has_special(text: &str) -> bool {
    text.contains("<|") || text.contains("<think>")
}

#[test]
fn streamed_deltas_equal_transformers_decode_and_never_break_a_character() {
    let tok = tokenizer();
    let prompt = [9707, 11, 1879, 0]; // "Hello, world!" as context
    let mut checked = 0;
    for case in cases() {
        let deltas = stream(&tok, &prompt, &case.ids);
        let streamed = deltas.concat();
        for d in &deltas {
            assert!(
                !d.contains(char::REPLACEMENT_CHARACTER),
                "{:?}: delta {d:?}",
                case.text
            );
        }
        // Special tokens are skipped in our output; elsewhere transformers' decode is the reference.
        assert_eq!(streamed, Detokenizer::decode(&tok, &case.ids).unwrap());
        if !has_special(&case.decoded) {
            assert_eq!(streamed, case.decoded, "{:?}", case.text);
            checked += 1;
        } else {
            // `<|im_start|>` / `<|endoftext|>` are special and skipped; Qwen3's `<think>` is an added
            // token that is *not* special, so it stays in the text, as in transformers.
            assert!(!streamed.contains("<|im_start|>") && !streamed.contains("<|endoftext|>"));
            if case.decoded.contains("<think>") {
                assert!(streamed.starts_with("<think>\nreasoning"), "{streamed:?}");
            }
        }
    }
    assert!(checked >= 9, "only {checked} plain-text cases checked");
}

#[test]
fn emoji_with_skin_tone_split_over_byte_tokens_is_withheld_until_complete() {
    let tok = tokenizer();
    let case = cases()
        .into_iter()
        .find(|c| c.text.starts_with("Emoji"))
        .unwrap();
    let deltas = stream(&tok, &[], &case.ids);
    // Some token of this case is a partial character (the byte-level split), so at least one
    // push must have been withheld.
    assert!(
        deltas[..case.ids.len()].iter().any(String::is_empty),
        "{deltas:?}"
    );
    assert_eq!(deltas.concat(), case.decoded);
}

#[test]
fn greedy_output_of_a_random_model_streams_to_transformers_decode() {
    #[derive(Deserialize)]
    struct Reference {
        prompt_ids: Vec<u32>,
        greedy_ids: Vec<u32>,
        greedy_decoded: String,
    }
    let text = std::fs::read_to_string(fixtures().join("qwen3_realtok/reference.json")).unwrap();
    let reference: Reference = serde_json::from_str(&text).unwrap();
    let tok = tokenizer();
    let deltas = stream(&tok, &reference.prompt_ids, &reference.greedy_ids);
    assert_eq!(deltas.concat(), reference.greedy_decoded);
}

#[test]
fn sink_stops_on_a_cjk_stop_string_spanning_tokens() {
    let tok = tokenizer();
    let case = cases()
        .into_iter()
        .find(|c| c.text.starts_with("日本語"))
        .unwrap();
    let mut config = GenerationConfig::greedy(case.ids.len());
    config.stop_strings = vec!["中文".into()];
    let mut streamed = String::new();
    let mut on_event = |e: Event<'_>| {
        if let Event::Delta(d) = e {
            streamed.push_str(d);
        }
    };
    let mut sink = TokenSink::new(
        &[9707],
        &config,
        &[151645],
        1000,
        &tok,
        CancelFlag::new(),
        &mut on_event,
    )
    .unwrap();
    let mut reason = None;
    for &id in &case.ids {
        reason = sink.commit(id).unwrap();
        if reason.is_some() {
            break;
        }
    }
    assert_eq!(reason, Some(StopReason::StopString(0)));
    let out = sink.finish().unwrap();
    assert_eq!(out.text, "日本語のテキストと");
    assert_eq!(streamed, out.text);
}
