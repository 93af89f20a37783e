//! What a request asks for ([`GenerationConfig`], checked by [`check_admission`] before any work)
//! and what it gets back ([`GenerationResult`], with [`SpecStats`] for a speculative run).
//!
//! Admission invariant: a request that passes [`check_admission`] has a non-empty prompt, at least
//! one token to generate, room in the context window for the prompt plus every token it may
//! generate, non-empty stop strings and valid sampling values. The loops rely on it: they never
//! write a KV row past `context_len`, and never need to check a parameter again.

use std::fmt;

use sampling::{SamplingError, Shaping};

use crate::error::RuntimeError;
use crate::sink::StopReason;

/// One generation request, model-independent.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Most tokens to generate (`max_tokens` in the API). Counts every committed token, a stop
    /// token included (as vLLM counts its EOS in `completion_tokens`).
    pub max_new_tokens: usize,
    /// User stop ids, on top of the model's EOS list from `generation_config.json`.
    pub stop_token_ids: Vec<u32>,
    /// Stop strings (`stop`): generation ends when the streamed text contains one; the match and
    /// everything after it is never emitted.
    pub stop_strings: Vec<String>,
    /// Sampling parameters; temperature 0 is greedy.
    pub shaping: Shaping,
    /// Seed of the counter-based generator: a seeded sampled run reproduces exactly.
    pub seed: u64,
    /// `Some(n)`: report each committed token's log-probability and the n most likely tokens of its
    /// row (`crate::logprobs`); the backend then returns whole logits rows.
    pub logprobs: Option<usize>,
}

impl GenerationConfig {
    /// A greedy request for `max_new_tokens` tokens with no user stop conditions.
    pub fn greedy(max_new_tokens: usize) -> Self {
        GenerationConfig {
            max_new_tokens,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            shaping: Shaping::greedy(),
            seed: 0,
            logprobs: None,
        }
    }
}

/// Refuses a request that cannot be served, before any work is done. Checks in this order and
/// reports the first failure, naming the request parameter: `prompt` (empty), `max_tokens` (0, or
/// prompt + max_tokens beyond `context_len`), `stop` (an empty stop string, which would match
/// everywhere), then the sampling fields (`temperature`, `top_p`, ...).
pub fn check_admission(
    prompt_len: usize,
    config: &GenerationConfig,
    context_len: usize,
) -> Result<(), RuntimeError> {
    if prompt_len == 0 {
        return Err(RuntimeError::request(
            "prompt",
            "the prompt is empty: at least one token is needed to predict the first one",
        ));
    }
    if config.max_new_tokens == 0 {
        return Err(RuntimeError::request(
            "max_tokens",
            "must be at least 1 (0 would generate nothing)",
        ));
    }
    if prompt_len >= context_len {
        return Err(RuntimeError::request(
            "prompt",
            format!(
                "the prompt has {prompt_len} tokens, which leaves no room in the model's context \
                 of {context_len} tokens"
            ),
        ));
    }
    // `prompt_len < context_len` here, so the room is positive and the subtraction exact.
    let room = context_len - prompt_len;
    if config.max_new_tokens > room {
        return Err(RuntimeError::request(
            "max_tokens",
            format!(
                "{} plus the prompt's {prompt_len} tokens exceeds the model's context of \
                 {context_len} tokens; at most {room} can be generated",
                config.max_new_tokens
            ),
        ));
    }
    if let Some(index) = config.stop_strings.iter().position(String::is_empty) {
        return Err(RuntimeError::request(
            "stop",
            format!("stop string {index} is empty; an empty string would match before any text"),
        ));
    }
    config.shaping.validate().map_err(|e| match e {
        SamplingError::InvalidParameter { field, .. } => {
            RuntimeError::request(field, e.to_string())
        }
        other => RuntimeError::Sampling(other),
    })
}

/// What ended a generation and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationResult {
    pub reason: StopReason,
    /// Tokens in the prompt, reused ones included.
    pub prompt_tokens: usize,
    /// Tokens committed by the decode, a stop token included (`== token_ids.len()`).
    pub new_tokens: usize,
    /// Prompt tokens whose state a session already held, so prefill skipped them.
    pub reused_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Tokens the model state (KV cache, recurrent state) covers at the end. The last committed
    /// token is never fed, so this is usually `prompt_tokens + new_tokens - 1`.
    pub kv_position: usize,
    /// The generated ids, in order, a stop token included.
    pub token_ids: Vec<u32>,
    /// The generated text: exactly the concatenation of the streamed deltas.
    pub text: String,
    /// Speculative runs only.
    pub spec: Option<SpecStats>,
    /// One entry per generated token when the request asked (`GenerationConfig::logprobs`), else empty.
    pub logprobs: Vec<crate::logprobs::TokenLogprob>,
}

impl GenerationResult {
    /// Decode throughput: committed tokens per decode second (0 when no time was measured).
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.new_tokens as f64, self.decode_seconds)
    }

    /// Prefill throughput over the tokens actually prefilled (reused ones excluded).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        let prefilled = self.prompt_tokens.saturating_sub(self.reused_tokens);
        rate(prefilled as f64, self.prefill_seconds)
    }
}

impl fmt::Display for GenerationResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: prompt={} (reused {}) new={} prefill={:.3}s ({:.1} tok/s) decode={:.3}s ({:.1} tok/s)",
            self.reason,
            self.prompt_tokens,
            self.reused_tokens,
            self.new_tokens,
            self.prefill_seconds,
            self.prefill_tokens_per_second(),
            self.decode_seconds,
            self.decode_tokens_per_second()
        )?;
        if let Some(spec) = &self.spec {
            write!(f, " | {spec}")?;
        }
        Ok(())
    }
}

/// Counters of a speculative run. A round drafts `proposed` tokens, verifies them in one pass,
/// and commits its accepted prefix plus one token from the target (the bonus or the correction).
///
/// Per-position counters are conditional: position `i` is *offered* in a round only when the
/// acceptance test reached it (every earlier proposal was accepted and no stop intervened), so
/// `per_position_accepted[i] / per_position_offered[i]` is P(accept i | reached i), the quantity
/// a drafter's training improves; the unconditional rate is `accepted / proposed`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    pub rounds: usize,
    /// Proposals drafted, summed over rounds.
    pub proposed: usize,
    /// Proposals accepted, summed over rounds.
    pub accepted: usize,
    /// `[block]`: rounds whose acceptance test reached position i.
    pub per_position_offered: Vec<usize>,
    /// `[block]`: rounds that accepted position i.
    pub per_position_accepted: Vec<usize>,
    /// `[b]`: rounds that proposed b tokens (one block unless an `auto` run tuned it, tuner.rs; `[0]`:
    /// the plain steps it chose).
    pub rounds_by_block: Vec<usize>,
    /// Rounds whose verify overshot the committed tokens, so the state was rolled back.
    pub rollbacks: usize,
    /// Time in the drafter: proposing, and observing the verified rows after each round.
    pub draft_seconds: f64,
    /// Time in the verify forward (logits and taps back on the host).
    pub verify_seconds: f64,
    /// Time removing the rejected rows from the target's state (tape replay, snapshot, cursor).
    pub rollback_seconds: f64,
    /// Rounds per drafter that proposed, in order of first use (one entry, unless the drafter mixes
    /// several: `auto`'s `mtp+suffix`).
    pub by_drafter: Vec<DrafterRounds>,
}

/// One drafter's share of a run's rounds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrafterRounds {
    pub drafter: &'static str,
    pub rounds: usize,
    pub proposed: usize,
    pub accepted: usize,
}

impl SpecStats {
    /// Counters for rounds of at most `block` proposals.
    pub fn new(block: usize) -> Self {
        SpecStats {
            per_position_offered: vec![0; block],
            per_position_accepted: vec![0; block],
            ..SpecStats::default()
        }
    }

    /// Records one round: `proposed` drafts, of which the first `judged` were tested and the first
    /// `accepted` passed; `rolled_back` when the state had to be rewound. Inconsistent counts are
    /// clamped (`accepted <= judged <= proposed`) rather than trusted.
    /// A plain decoding step an `auto` run chose (block 0, tuner.rs): shows in `rounds_by_block[0]`.
    pub fn record_plain_step(&mut self) {
        if self.rounds_by_block.is_empty() {
            self.rounds_by_block.push(0);
        }
        self.rounds_by_block[0] += 1;
    }

    /// Counts a round's proposals and accepted ones to `drafter` (`Drafter::proposer`).
    pub fn record_drafter(&mut self, drafter: &'static str, proposed: usize, accepted: usize) {
        let at = match self.by_drafter.iter().position(|d| d.drafter == drafter) {
            Some(at) => at,
            None => {
                self.by_drafter.push(DrafterRounds {
                    drafter,
                    ..DrafterRounds::default()
                });
                self.by_drafter.len() - 1
            }
        };
        let d = &mut self.by_drafter[at];
        d.rounds += 1;
        d.proposed += proposed;
        d.accepted += accepted.min(proposed);
    }

    pub fn record_round(
        &mut self,
        proposed: usize,
        judged: usize,
        accepted: usize,
        rolled_back: bool,
    ) {
        let judged = judged.min(proposed);
        let accepted = accepted.min(judged);
        self.rounds += 1;
        if self.rounds_by_block.len() <= proposed {
            self.rounds_by_block.resize(proposed + 1, 0);
        }
        self.rounds_by_block[proposed] += 1;
        self.proposed += proposed;
        self.accepted += accepted;
        if self.per_position_offered.len() < judged {
            self.per_position_offered.resize(judged, 0);
            self.per_position_accepted.resize(judged, 0);
        }
        for offered in self.per_position_offered.iter_mut().take(judged) {
            *offered += 1;
        }
        for hit in self.per_position_accepted.iter_mut().take(accepted) {
            *hit += 1;
        }
        if rolled_back {
            self.rollbacks += 1;
        }
    }

    /// Mean accepted proposals per round.
    pub fn accepted_per_round(&self) -> f64 {
        rate(self.accepted as f64, self.rounds as f64)
    }

    /// Mean tokens committed per round: the accepted proposals plus the target's own token. (The
    /// last round of a run may end on a stop before that token; this mean ignores that.)
    pub fn committed_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.accepted_per_round() + 1.0
        }
    }

    /// Unconditional acceptance: accepted / proposed.
    pub fn acceptance_rate(&self) -> f64 {
        rate(self.accepted as f64, self.proposed as f64)
    }

    /// P(accept i | reached i) per position; `None` where position i was never reached.
    pub fn per_position_rate(&self) -> Vec<Option<f64>> {
        self.per_position_offered
            .iter()
            .zip(&self.per_position_accepted)
            .map(|(&offered, &hit)| (offered > 0).then(|| hit as f64 / offered as f64))
            .collect()
    }
}

impl fmt::Display for SpecStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rounds={} accepted/round={:.2} committed/round={:.2} acceptance={:.1}% per-position=[",
            self.rounds,
            self.accepted_per_round(),
            self.committed_per_round(),
            100.0 * self.acceptance_rate()
        )?;
        for (i, r) in self.per_position_rate().iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            match r {
                Some(r) => write!(f, "{sep}{r:.2}")?,
                None => write!(f, "{sep}-")?,
            }
        }
        write!(
            f,
            "] rollbacks={} draft={:.3}s verify={:.3}s rollback={:.3}s",
            self.rollbacks, self.draft_seconds, self.verify_seconds, self.rollback_seconds
        )?;
        if self.rounds_by_block.iter().filter(|&&n| n > 0).count() > 1 {
            write!(f, " rounds-by-block=[")?;
            let used = self
                .rounds_by_block
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0);
            for (i, (b, n)) in used.enumerate() {
                write!(f, "{}{b}:{n}", if i == 0 { "" } else { " " })?;
            }
            write!(f, "]")?;
        }
        if self.by_drafter.len() > 1 {
            write!(f, " by-drafter=[")?;
            for (i, d) in self.by_drafter.iter().enumerate() {
                write!(
                    f,
                    "{}{}: rounds={} accepted={}/{}",
                    if i == 0 { "" } else { ", " },
                    d.drafter,
                    d.rounds,
                    d.accepted,
                    d.proposed
                )?;
            }
            write!(f, "]")?;
        }
        Ok(())
    }
}

/// `num / den`, or 0 when the denominator is 0 (nothing measured).
fn rate(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(err: RuntimeError) -> &'static str {
        match err {
            RuntimeError::InvalidRequest { field, .. } => field,
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[test]
    fn admission_accepts_a_request_that_exactly_fills_the_context() {
        // 6 prompt + 4 new = 10 = context: the last committed token is never fed, but admission
        // is sized for the committed stream, so this is the largest admissible request.
        assert!(check_admission(6, &GenerationConfig::greedy(4), 10).is_ok());
    }

    #[test]
    fn admission_names_the_field_at_fault() {
        let ok = GenerationConfig::greedy(4);
        assert_eq!(field_of(check_admission(0, &ok, 10).unwrap_err()), "prompt");
        assert_eq!(
            field_of(check_admission(10, &ok, 10).unwrap_err()),
            "prompt"
        );
        assert_eq!(
            field_of(check_admission(7, &ok, 10).unwrap_err()),
            "max_tokens"
        );
        let zero = GenerationConfig::greedy(0);
        assert_eq!(
            field_of(check_admission(3, &zero, 10).unwrap_err()),
            "max_tokens"
        );
        let mut empty_stop = GenerationConfig::greedy(4);
        empty_stop.stop_strings = vec!["ok".into(), String::new()];
        let err = check_admission(3, &empty_stop, 10).unwrap_err();
        assert!(err.to_string().contains("stop string 1"), "{err}");
        assert_eq!(field_of(err), "stop");
    }

    #[test]
    fn admission_reports_the_context_arithmetic() {
        let err = check_admission(7, &GenerationConfig::greedy(4), 10).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("at most 3 can be generated"), "{msg}");
    }

    #[test]
    fn admission_names_invalid_sampling_fields() {
        type Spoil = fn(&mut Shaping);
        let cases: [(&str, Spoil); 5] = [
            ("temperature", |s| s.temperature = -0.5),
            ("temperature", |s| s.temperature = f64::NAN),
            ("top_p", |s| s.top_p = 0.0),
            ("min_p", |s| s.min_p = 1.5),
            ("frequency_penalty", |s| s.frequency_penalty = 3.0),
        ];
        for (field, spoil) in cases {
            let mut config = GenerationConfig::greedy(4);
            spoil(&mut config.shaping);
            assert_eq!(
                field_of(check_admission(3, &config, 10).unwrap_err()),
                field
            );
        }
    }

    #[test]
    fn spec_stats_count_conditional_per_position_acceptance() {
        let mut stats = SpecStats::new(3);
        // Round 1: 3 proposed, all judged, 3 accepted (no rollback).
        stats.record_round(3, 3, 3, false);
        // Round 2: first rejected.
        stats.record_round(3, 1, 0, true);
        // Round 3: second rejected.
        stats.record_round(3, 2, 1, true);
        assert_eq!(stats.per_position_offered, vec![3, 2, 1]);
        assert_eq!(stats.per_position_accepted, vec![2, 1, 1]);
        assert_eq!(
            stats.per_position_rate(),
            vec![Some(2.0 / 3.0), Some(0.5), Some(1.0)]
        );
        assert_eq!(stats.accepted, 4);
        assert_eq!(stats.proposed, 9);
        assert_eq!(stats.rollbacks, 2);
        assert!((stats.accepted_per_round() - 4.0 / 3.0).abs() < 1e-12);
        assert!((stats.committed_per_round() - 7.0 / 3.0).abs() < 1e-12);
        let line = stats.to_string();
        assert!(
            line.contains("rounds=3 accepted/round=1.33 committed/round=2.33"),
            "{line}"
        );
        assert!(line.contains("per-position=[0.67 0.50 1.00]"), "{line}");
        assert!(line.contains("rollbacks=2"), "{line}");
        assert!(!line.contains("by-drafter"), "one drafter: {line}");
    }

    #[test]
    fn spec_stats_split_rounds_by_drafter() {
        let mut stats = SpecStats::new(4);
        stats.record_drafter("mtp", 2, 1);
        stats.record_drafter("suffix", 4, 4);
        stats.record_drafter("mtp", 2, 3);
        let d = &stats.by_drafter;
        assert_eq!(
            (d[0].drafter, d[0].rounds, d[0].proposed, d[0].accepted),
            ("mtp", 2, 4, 3)
        );
        assert_eq!(
            (d[1].drafter, d[1].rounds, d[1].proposed, d[1].accepted),
            ("suffix", 1, 4, 4)
        );
        let line = stats.to_string();
        assert!(
            line.contains("by-drafter=[mtp: rounds=2 accepted=3/4, suffix: rounds=1 accepted=4/4]"),
            "{line}"
        );
    }

    #[test]
    fn result_line_reports_rates_over_prefilled_and_committed_tokens() {
        let mut spec = SpecStats::new(2);
        spec.record_round(2, 2, 2, false);
        let result = GenerationResult {
            reason: StopReason::MaxTokens,
            prompt_tokens: 30,
            new_tokens: 8,
            reused_tokens: 10,
            prefill_seconds: 0.5,
            decode_seconds: 2.0,
            kv_position: 37,
            token_ids: vec![0; 8],
            text: String::new(),
            spec: Some(spec),
            logprobs: Vec::new(),
        };
        // 20 prefilled tokens in 0.5 s; 8 committed tokens in 2 s.
        assert_eq!(result.prefill_tokens_per_second(), 40.0);
        assert_eq!(result.decode_tokens_per_second(), 4.0);
        let line = result.to_string();
        assert!(
            line.starts_with("max tokens: prompt=30 (reused 10) new=8"),
            "{line}"
        );
        assert!(
            line.contains("(40.0 tok/s)") && line.contains("| rounds=1"),
            "{line}"
        );
    }

    #[test]
    fn spec_stats_clamp_inconsistent_counts_and_mark_unreached_positions() {
        let mut stats = SpecStats::new(3);
        stats.record_round(2, 5, 9, false); // judged and accepted clamp to 2
        assert_eq!(stats.per_position_offered, vec![1, 1, 0]);
        assert_eq!(stats.per_position_accepted, vec![1, 1, 0]);
        assert_eq!(stats.per_position_rate()[2], None);
        assert!(stats.to_string().contains("[1.00 1.00 -]"));
        let empty = SpecStats::default();
        assert_eq!(empty.committed_per_round(), 0.0);
    }
}
