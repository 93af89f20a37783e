//! TokenSink tests: every pair of stop rules, stop strings across token and character boundaries,
//! withholding and release, and the streaming invariants (deltas concatenate to the text, no text
//! after a match is ever emitted) checked on every run.

use super::*;
use crate::detok::ByteDetokenizer;

const EOS: u32 = 99;
const USER_STOP: u32 = 98;
const PROMPT: [u32; 1] = [6];

/// Token id -> bytes. 10/11 are the two bytes of "é", 20..=23 the four bytes of "😀", 50 decodes
/// to nothing (a special token), 99 is the EOS (its text must never appear).
fn vocab() -> ByteDetokenizer {
    ByteDetokenizer::new([
        (1, b"a".to_vec()),
        (2, b"b".to_vec()),
        (3, b"c".to_vec()),
        (4, b"d".to_vec()),
        (5, b" ".to_vec()),
        (6, b"x".to_vec()),
        (7, b"!".to_vec()),
        (10, vec![0xC3]),
        (11, vec![0xA9]),
        (20, vec![0xF0]),
        (21, vec![0x9F]),
        (22, vec![0x98]),
        (23, vec![0x80]),
        (30, b"ab".to_vec()),
        (31, b"bc".to_vec()),
        (50, Vec::new()),
        (EOS, b"<eos>".to_vec()),
        (USER_STOP, b"STOP".to_vec()),
    ])
}

#[derive(Debug, Clone, PartialEq)]
enum Rec {
    Delta(String),
    Prefill(usize, usize),
    Decode(usize),
    Logprob(u32),
}

/// One scripted run: `tokens` are committed in order until one returns a stop; before the commit
/// at index `cancel_before`, the cancel flag is set.
struct Run {
    /// What each commit returned.
    returns: Vec<Option<StopReason>>,
    events: Vec<Rec>,
    /// Every event, log-probability entries included.
    all: Vec<Rec>,
    out: SinkOutput,
}

struct Script<'s> {
    tokens: &'s [u32],
    stops: &'s [&'s str],
    max_new_tokens: usize,
    context_len: usize,
    cancel_before: Option<usize>,
}

impl<'s> Script<'s> {
    fn new(tokens: &'s [u32]) -> Self {
        Script {
            tokens,
            stops: &[],
            max_new_tokens: 100,
            context_len: 1000,
            cancel_before: None,
        }
    }
    fn stops(mut self, stops: &'s [&'s str]) -> Self {
        self.stops = stops;
        self
    }
    fn max(mut self, max_new_tokens: usize) -> Self {
        self.max_new_tokens = max_new_tokens;
        self
    }
    fn context(mut self, context_len: usize) -> Self {
        self.context_len = context_len;
        self
    }
    fn cancel_before(mut self, index: usize) -> Self {
        self.cancel_before = Some(index);
        self
    }

    fn run(&self) -> Run {
        let detok = vocab();
        let mut config = GenerationConfig::greedy(self.max_new_tokens);
        config.stop_strings = self.stops.iter().map(|s| s.to_string()).collect();
        config.stop_token_ids = vec![USER_STOP];
        let cancel = CancelFlag::new();
        let mut events = Vec::new();
        let mut record = |e: Event<'_>| {
            events.push(match e {
                Event::Delta(d) => Rec::Delta(d.to_string()),
                Event::Prefill { done, total } => Rec::Prefill(done, total),
                Event::Decode { generated } => Rec::Decode(generated),
                Event::Logprob(l) => Rec::Logprob(l.token),
            })
        };
        let mut sink = TokenSink::new(
            &PROMPT,
            &config,
            &[EOS],
            self.context_len,
            &detok,
            cancel.clone(),
            &mut record,
        )
        .unwrap();
        let mut returns = Vec::new();
        for (i, &token) in self.tokens.iter().enumerate() {
            if self.cancel_before == Some(i) {
                cancel.cancel();
            }
            // Every commit carries an entry; only committed tokens may keep theirs.
            let entry = TokenLogprob {
                token,
                logprob: -(i as f32),
                top: Vec::new(),
            };
            let r = sink.commit_scored(token, Some(entry)).unwrap();
            returns.push(r);
            if r.is_some() {
                // Nothing may be committed after a stop.
                assert!(matches!(
                    sink.commit(1),
                    Err(RuntimeError::CommitAfterStop { .. })
                ));
                break;
            }
        }
        if sink.stopped().is_none() {
            sink.stop(StopReason::MaxTokens).unwrap();
        }
        let out = sink.finish().unwrap();
        // `events` without the entries (the tests below list text events); `all` keeps them.
        let all = events.clone();
        events.retain(|e| !matches!(e, Rec::Logprob(_)));
        let run = Run {
            returns,
            events,
            all,
            out,
        };
        run.check_invariants(self.stops);
        run
    }
}

impl Run {
    fn deltas(&self) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                Rec::Delta(d) => Some(d.as_str()),
                _ => None,
            })
            .collect()
    }

    fn reason(&self) -> StopReason {
        self.out.reason
    }

    /// The streaming contract, checked after every run.
    fn check_invariants(&self, stops: &[&str]) {
        let deltas = self.deltas();
        assert_eq!(deltas, self.out.text, "deltas must concatenate to the text");
        for e in &self.events {
            if let Rec::Delta(d) = e {
                assert!(!d.is_empty(), "empty delta");
            }
        }
        assert!(!deltas.contains("<eos>") && !deltas.contains("STOP"));
        if let StopReason::StopString(_) = self.reason() {
            for stop in stops {
                assert!(
                    !deltas.contains(stop),
                    "stop string {stop:?} leaked: {deltas:?}"
                );
            }
        }
        // One Decode event per committed token, numbered 1.., each after that token's deltas.
        let decodes: Vec<usize> = self
            .events
            .iter()
            .filter_map(|e| match e {
                Rec::Decode(g) => Some(*g),
                _ => None,
            })
            .collect();
        assert_eq!(decodes, (1..=self.out.token_ids.len()).collect::<Vec<_>>());
        // One log-probability entry per committed token, in order, each sent before its Decode.
        let kept: Vec<u32> = self.out.logprobs.iter().map(|l| l.token).collect();
        assert_eq!(kept, self.out.token_ids);
        let mut waiting = None;
        for e in &self.all {
            match e {
                Rec::Logprob(t) => {
                    assert!(waiting.is_none(), "two entries before one Decode");
                    waiting = Some(*t);
                }
                Rec::Decode(_) => assert!(waiting.take().is_some(), "a Decode without its entry"),
                _ => {}
            }
        }
        assert_eq!(
            self.out.history.len(),
            PROMPT.len() + self.out.token_ids.len()
        );
        assert_eq!(self.out.history[..PROMPT.len()], PROMPT);
    }
}

// ---- precedence, every pair -------------------------------------------------------------

#[test]
fn cancel_beats_stop_token_and_drops_the_token() {
    let run = Script::new(&[1, EOS]).cancel_before(1).run();
    assert_eq!(run.reason(), StopReason::Cancelled);
    assert_eq!(run.returns, [None, Some(StopReason::Cancelled)]);
    assert_eq!(run.out.token_ids, [1]);
    assert_eq!(run.out.text, "a");
}

#[test]
fn cancel_beats_stop_string_and_flushes_the_withheld_prefix() {
    // "a" is withheld as a possible start of "ab"; the cancel drops "b", so "a" is released.
    let run = Script::new(&[1, 2]).stops(&["ab"]).cancel_before(1).run();
    assert_eq!(run.reason(), StopReason::Cancelled);
    assert_eq!(run.out.token_ids, [1]);
    assert_eq!(run.out.text, "a");
    assert_eq!(run.events, [Rec::Decode(1), Rec::Delta("a".into())]);
}

#[test]
fn cancel_beats_max_tokens() {
    let run = Script::new(&[1, 2]).max(2).cancel_before(1).run();
    assert_eq!(run.reason(), StopReason::Cancelled);
    assert_eq!(run.out.token_ids, [1]);
}

#[test]
fn cancel_beats_context_full() {
    let run = Script::new(&[1, 2])
        .context(PROMPT.len() + 2)
        .cancel_before(1)
        .run();
    assert_eq!(run.reason(), StopReason::Cancelled);
    assert_eq!(run.out.token_ids, [1]);
}

#[test]
fn stop_token_beats_stop_string_and_is_counted_but_not_decoded() {
    // The EOS's bytes would complete the stop string "a<eos>" if they were decoded.
    let run = Script::new(&[1, EOS]).stops(&["a<eos>", "<eos>"]).run();
    assert_eq!(run.reason(), StopReason::StopToken(EOS));
    assert_eq!(run.out.token_ids, [1, EOS]);
    // "a" was withheld (prefix of "a<eos>") and is flushed: nothing can follow it now.
    assert_eq!(run.out.text, "a");
}

#[test]
fn stop_token_beats_max_tokens() {
    let run = Script::new(&[1, EOS]).max(2).run();
    assert_eq!(run.reason(), StopReason::StopToken(EOS));
    assert_eq!(run.out.token_ids.len(), 2);
}

#[test]
fn stop_token_beats_context_full() {
    let run = Script::new(&[1, EOS]).context(PROMPT.len() + 2).run();
    assert_eq!(run.reason(), StopReason::StopToken(EOS));
}

#[test]
fn user_stop_ids_stop_like_eos() {
    let run = Script::new(&[1, USER_STOP, 2]).run();
    assert_eq!(run.reason(), StopReason::StopToken(USER_STOP));
    assert_eq!(run.out.text, "a");
}

#[test]
fn stop_string_beats_max_tokens() {
    let run = Script::new(&[3, 1, 2]).stops(&["ab"]).max(3).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.text, "c");
    assert_eq!(run.out.token_ids, [3, 1, 2]);
}

#[test]
fn stop_string_beats_context_full() {
    let run = Script::new(&[1, 2])
        .stops(&["ab"])
        .context(PROMPT.len() + 2)
        .run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.text, "");
}

#[test]
fn max_tokens_beats_context_full_and_flushes_the_withheld_tail() {
    let run = Script::new(&[3, 1, 2])
        .stops(&["ab"])
        .max(2)
        .context(PROMPT.len() + 2)
        .run();
    assert_eq!(run.reason(), StopReason::MaxTokens);
    assert_eq!(run.out.text, "ca");
}

#[test]
fn context_full_ends_a_run_whose_budget_exceeds_the_window() {
    let run = Script::new(&[1, 2, 3]).context(PROMPT.len() + 2).run();
    assert_eq!(run.reason(), StopReason::ContextFull);
    assert_eq!(run.out.text, "ab");
}

// ---- stop strings --------------------------------------------------------------------------

#[test]
fn stop_string_spanning_three_tokens_emits_only_the_text_before_it() {
    let run = Script::new(&[4, 5, 1, 2, 3, 4]).stops(&["abc"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.text, "d ");
    assert_eq!(
        run.returns.len(),
        5,
        "stops on the token that completes the match"
    );
}

#[test]
fn stop_string_inside_a_multibyte_character_split_over_tokens() {
    // "é" arrives as its two bytes in two tokens; the stop is "aé".
    let run = Script::new(&[3, 1, 10, 11, 2]).stops(&["aé"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.text, "c");
    // A stop string that is the character itself.
    let run = Script::new(&[1, 10, 11]).stops(&["é"]).run();
    assert_eq!(run.out.text, "a");
    assert_eq!(run.reason(), StopReason::StopString(0));
}

#[test]
fn emoji_split_into_four_byte_tokens_is_released_whole_once_disambiguated() {
    let run = Script::new(&[20, 21, 22, 23, 2, 7])
        .stops(&["😀!"])
        .max(6)
        .run();
    assert_eq!(run.reason(), StopReason::MaxTokens);
    assert_eq!(run.out.text, "😀b!");
    // The emoji is withheld through its bytes and as a stop prefix, then released with "b".
    assert_eq!(run.events[4], Rec::Delta("😀b".into()));
    let run = Script::new(&[20, 21, 22, 23, 7, 2]).stops(&["😀!"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.text, "");
}

#[test]
fn a_failed_partial_match_is_released() {
    // "ab" could start "abd"; "c" rules it out, so "abc" is released as one delta.
    let run = Script::new(&[1, 2, 3, 4]).stops(&["abd"]).max(4).run();
    assert_eq!(run.reason(), StopReason::MaxTokens);
    assert_eq!(run.out.text, "abcd");
    assert_eq!(
        run.events,
        [
            Rec::Decode(1),
            Rec::Decode(2),
            Rec::Delta("abc".into()),
            Rec::Decode(3),
            Rec::Delta("d".into()),
            Rec::Decode(4),
        ]
    );
}

#[test]
fn a_partial_match_restarting_inside_the_withheld_text_keeps_only_the_new_start() {
    // Stop "aab" over "a a a b": after "aaa" only the last "aa" can still start it, so the first
    // "a" is released; then "b" completes the match at offset 1.
    let run = Script::new(&[1, 1, 1, 2]).stops(&["aab"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.text, "a");
    assert!(run.events.contains(&Rec::Delta("a".into())));
}

#[test]
fn overlapping_stop_strings_earliest_completion_wins() {
    // "bc" completes first; "abcd" could still have matched later but the run is already over.
    let run = Script::new(&[1, 2, 3, 4]).stops(&["abcd", "bc"]).run();
    assert_eq!(run.reason(), StopReason::StopString(1));
    assert_eq!(run.out.text, "a");
}

#[test]
fn overlapping_stop_strings_completing_together_earliest_start_wins() {
    // One token "bc" completes both "abc" (starts at 0) and "bc" (starts at 1).
    let run = Script::new(&[1, 31]).stops(&["bc", "abc"]).run();
    assert_eq!(run.reason(), StopReason::StopString(1));
    assert_eq!(run.out.text, "");
    // Same start: the lower index wins, whichever is shorter.
    let run = Script::new(&[30]).stops(&["ab", "a"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    let run = Script::new(&[30]).stops(&["a", "ab"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
}

#[test]
fn a_token_that_decodes_to_nothing_does_not_disturb_matching() {
    let run = Script::new(&[1, 50, 2]).stops(&["ab"]).run();
    assert_eq!(run.reason(), StopReason::StopString(0));
    assert_eq!(run.out.token_ids, [1, 50, 2]);
    assert_eq!(run.out.text, "");
}

#[test]
fn an_incomplete_character_is_flushed_at_max_tokens() {
    let run = Script::new(&[1, 10]).max(2).run();
    assert_eq!(run.out.text, "a\u{FFFD}");
}

/// Random token streams over {a, b, c, é as two byte tokens, "ab", "bc"}, against a reference
/// that knows nothing of withholding: after each token, decode every complete character so far
/// and look for the earliest stop-string occurrence.
#[test]
fn random_streams_match_a_brute_force_reference() {
    let stops = ["ab", "bé", "éa", "cc"];
    let units: [&[u32]; 6] = [&[1], &[2], &[3], &[10, 11], &[30], &[31]];
    let detok = vocab();
    let mut state = 7u64;
    for _ in 0..400 {
        let mut tokens = Vec::new();
        for _ in 0..8 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            tokens.extend_from_slice(units[((state >> 33) % units.len() as u64) as usize]);
        }
        // Reference: the first prefix whose complete-character text contains a stop string.
        let mut expected = (StopReason::MaxTokens, None, tokens.len());
        for k in 1..=tokens.len() {
            let mut text = detok.decode(&tokens[..k]).unwrap();
            if text.ends_with(char::REPLACEMENT_CHARACTER) {
                text.pop(); // the first byte of é, not a character yet
            }
            let hit = stops
                .iter()
                .enumerate()
                .filter_map(|(i, s)| text.find(s).map(|at| (at, i)))
                .min();
            if let Some((at, i)) = hit {
                expected = (StopReason::StopString(i), Some(text[..at].to_string()), k);
                break;
            }
        }
        let run = Script::new(&tokens).stops(&stops).max(tokens.len()).run();
        assert_eq!(run.reason(), expected.0, "tokens {tokens:?}");
        assert_eq!(run.out.token_ids.len(), expected.2, "tokens {tokens:?}");
        let text = expected.1.unwrap_or_else(|| detok.decode(&tokens).unwrap());
        assert_eq!(run.out.text, text, "tokens {tokens:?}");
    }
}

// ---- prefill, cancel flag and lifecycle ------------------------------------------------------

#[test]
fn poll_prefill_reports_progress_and_stops_on_cancel() {
    let detok = vocab();
    let config = GenerationConfig::greedy(4);
    let cancel = CancelFlag::new();
    let mut events = Vec::new();
    let mut record = |e: Event<'_>| {
        if let Event::Prefill { done, total } = e {
            events.push((done, total));
        }
    };
    let prompt = [1, 2, 3, 4];
    let mut sink = TokenSink::new(
        &prompt,
        &config,
        &[EOS],
        100,
        &detok,
        cancel.clone(),
        &mut record,
    )
    .unwrap();
    assert_eq!(sink.poll_prefill(2, 4).unwrap(), None);
    cancel.cancel();
    assert_eq!(
        sink.poll_prefill(4, 4).unwrap(),
        Some(StopReason::Cancelled)
    );
    assert!(matches!(
        sink.commit(1),
        Err(RuntimeError::CommitAfterStop {
            token: 1,
            reason: StopReason::Cancelled
        })
    ));
    let out = sink.finish().unwrap();
    assert_eq!(out.reason, StopReason::Cancelled);
    assert!(out.token_ids.is_empty() && out.text.is_empty());
    assert_eq!(out.history, prompt);
    assert_eq!(events, [(2, 4), (4, 4)]);
}

#[test]
fn cancel_flag_clones_share_the_flag() {
    let a = CancelFlag::new();
    let b = a.clone();
    assert!(!b.is_cancelled());
    a.cancel();
    assert!(b.is_cancelled());
}

#[test]
fn finish_before_any_stop_is_an_error() {
    let detok = vocab();
    let config = GenerationConfig::greedy(4);
    let mut ignore = |_: Event<'_>| {};
    let sink = TokenSink::new(
        &PROMPT,
        &config,
        &[EOS],
        100,
        &detok,
        CancelFlag::new(),
        &mut ignore,
    )
    .unwrap();
    assert!(matches!(sink.finish(), Err(RuntimeError::NotStopped)));
}

#[test]
fn explicit_stop_keeps_the_first_reason_and_flushes() {
    let detok = vocab();
    let mut config = GenerationConfig::greedy(10);
    config.stop_strings = vec!["ab".into()];
    let mut text = String::new();
    let mut record = |e: Event<'_>| {
        if let Event::Delta(d) = e {
            text.push_str(d);
        }
    };
    let mut sink = TokenSink::new(
        &PROMPT,
        &config,
        &[EOS],
        100,
        &detok,
        CancelFlag::new(),
        &mut record,
    )
    .unwrap();
    assert_eq!(sink.commit(1).unwrap(), None);
    assert_eq!(
        sink.text(),
        "",
        "'a' is withheld as a possible start of 'ab'"
    );
    assert_eq!(
        sink.stop(StopReason::ContextFull).unwrap(),
        StopReason::ContextFull
    );
    assert_eq!(
        sink.stop(StopReason::MaxTokens).unwrap(),
        StopReason::ContextFull
    );
    assert_eq!(sink.text(), "a");
    drop(sink);
    assert_eq!(text, "a");
}

#[test]
fn budget_left_is_the_tighter_of_tokens_and_context() {
    let detok = vocab();
    let config = GenerationConfig::greedy(5);
    let mut ignore = |_: Event<'_>| {};
    let mut sink = TokenSink::new(
        &PROMPT,
        &config,
        &[EOS],
        4,
        &detok,
        CancelFlag::new(),
        &mut ignore,
    )
    .unwrap();
    assert_eq!(sink.budget_left(), 3); // context 4 - prompt 1
    sink.commit(1).unwrap();
    assert_eq!(sink.budget_left(), 2);
    assert_eq!(sink.generated(), 1);
    assert_eq!(sink.generated_ids(), [1]);
    assert_eq!(sink.history(), [6, 1]);
    let history = sink.shaping_history().unwrap();
    assert_eq!(history.generated(), [1]);
    assert_eq!(history.tokens(), [6, 1]);
}

#[test]
fn stop_reasons_map_to_openai_finish_reasons() {
    assert_eq!(StopReason::StopToken(1).finish_reason(), "stop");
    assert_eq!(StopReason::StopString(0).finish_reason(), "stop");
    assert_eq!(StopReason::MaxTokens.finish_reason(), "length");
    assert_eq!(StopReason::ContextFull.finish_reason(), "length");
    assert_eq!(StopReason::Cancelled.finish_reason(), "cancelled");
}
