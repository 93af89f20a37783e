//! Prompt lookup (`--drafter ngram`): a drafter without weights that copies from the context, as
//! llama.cpp's `lookup` / `ngram-*` speculation and vLLM's `ngram` speculator do.
//!
//! Algorithm. At `propose(history, k)` take the longest n-gram, n from `max_n` down to `min_n`, that
//! ends at the end of `history` (the last n committed tokens) and also occurred earlier in `history`
//! (the prompt and the output so far); of its earlier occurrences take the most recent. Propose the k
//! tokens that followed that occurrence, reading on into the proposals themselves when the copy
//! reaches the end of `history` (so a loop of period p shorter than k is proposed for k tokens, as
//! llama.cpp's drafts continue from their own drafted tokens). No n-gram of any size matches: the
//! proposal is empty and the loop takes a plain step.
//!
//! Cost. An index maps the hash of every n-gram (`min_n..=max_n`) of the history before its last
//! token to the end of its latest occurrence; a propose extends it over the tokens committed since the
//! last one (`max_n - min_n + 1` hashes a token), looks up at most `max_n - min_n + 1` n-grams and
//! compares each hit's tokens (a hash collision is a miss). It also checks that the history extends
//! what it indexed (a slice comparison, O(history) but a memcmp); a history that does not (a
//! sequence that changed without `rewind` or `reset`) is re-indexed from scratch. `rewind` re-indexes
//! the kept prefix. Memory: `max_n - min_n + 1` entries per position.
//!
//! Invariant (exactness). Proposals depend only on committed tokens and are deterministic: the
//! drafter's q is a point mass at each proposal. It does not call the [`Chooser`]: the loop judges a
//! proposal that came with no drafted distribution as a point mass (`Draft::PointMass`: greedy
//! accepts it iff it is the target's choice; sampling accepts it with probability p(d) and otherwise
//! draws from p with d removed), which is exact in distribution; shaping a one-hot row of the
//! vocabulary's size per proposal would only cost time (and random draws). It needs no taps;
//! `observe` advances the committed position, which is all `position` / `rewind` track.

use std::collections::HashMap;

use crate::{Chooser, Drafter};
use families::{BackendError, ModelError, Tap};

/// Longest n-gram matched by default: llama.cpp's `lookup` matches n-grams up to 4 tokens, vLLM
/// defaults to exactly 5; 3 keeps matches specific on code without missing short repeats.
pub const DEFAULT_MAX_N: usize = 3;
/// Shortest n-gram matched by default: 1, as llama.cpp's `lookup` (vLLM defaults to 5): a single
/// token's last continuation is a weak guess, but on looping or copy-heavy output it is often right,
/// and the block tuner turns speculation down where such guesses do not pay.
pub const DEFAULT_MIN_N: usize = 1;
/// The longest n-gram size accepted at all: a longer match gains nothing over this one.
pub const MAX_N_LIMIT: usize = 64;

/// An n-gram size out of range, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NgramError {
    #[error("invalid ngram drafter option `{option}` = {value}: {reason}")]
    Option {
        option: &'static str,
        value: usize,
        reason: String,
    },
}

/// Prompt-lookup drafter (see the module doc).
pub struct NgramDrafter {
    min_n: usize,
    max_n: usize,
    /// Rows observed (the committed position).
    committed: usize,
    /// The history whose n-grams are indexed: every n-gram lying inside it. A propose extends it to all
    /// of its history but the last token (whose n-grams are the query).
    tokens: Vec<u32>,
    /// n-gram hash -> end (inclusive) of its latest occurrence in `tokens`.
    index: HashMap<u64, usize>,
}

impl NgramDrafter {
    /// The default sizes: n-grams of `DEFAULT_MIN_N..=DEFAULT_MAX_N` tokens.
    pub fn new() -> Self {
        Self::with_sizes(DEFAULT_MIN_N, DEFAULT_MAX_N).expect("the default sizes are valid")
    }

    /// Matches n-grams of `min_n..=max_n` tokens, longest first. Errors name the option: sizes of 0,
    /// `min_n > max_n`, or `max_n` above [`MAX_N_LIMIT`].
    pub fn with_sizes(min_n: usize, max_n: usize) -> Result<Self, NgramError> {
        let bad = |option, value, reason: String| {
            Err(NgramError::Option {
                option,
                value,
                reason,
            })
        };
        if min_n == 0 {
            return bad("min_n", min_n, "n-grams have at least 1 token".into());
        }
        if max_n > MAX_N_LIMIT {
            return bad("max_n", max_n, format!("at most {MAX_N_LIMIT}"));
        }
        if min_n > max_n {
            return bad("min_n", min_n, format!("must not exceed max_n = {max_n}"));
        }
        Ok(NgramDrafter {
            min_n,
            max_n,
            committed: 0,
            tokens: Vec::new(),
            index: HashMap::new(),
        })
    }

    /// `(min_n, max_n)`.
    pub fn sizes(&self) -> (usize, usize) {
        (self.min_n, self.max_n)
    }

    /// Indexes the n-grams ending at each position `from..tokens.len()`.
    fn index_from(&mut self, from: usize) {
        for end in from..self.tokens.len() {
            let mut h = SEED;
            for n in 1..=self.max_n.min(end + 1) {
                h = mix(h, self.tokens[end + 1 - n]);
                if n >= self.min_n {
                    self.index.insert(h, end);
                }
            }
        }
    }

    /// Brings the index to `history[..len - 1]`: extends it when `history` continues what it
    /// covers, else rebuilds it.
    fn sync(&mut self, history: &[u32]) {
        let upto = history.len().saturating_sub(1);
        if self.tokens.len() > upto || !history.starts_with(&self.tokens) {
            self.tokens.clear();
            self.index.clear();
        }
        let from = self.tokens.len();
        self.tokens.extend_from_slice(&history[from..upto]);
        self.index_from(from);
    }

    /// Where the copy starts: the position after the most recent earlier occurrence of the longest
    /// matching n-gram that ends `history`, if any. Needs `sync(history)` first.
    fn source(&self, history: &[u32]) -> Option<usize> {
        let len = history.len();
        // An earlier occurrence ends at `len - 2` at the latest, so n <= len - 1.
        let longest = self.max_n.min(len.saturating_sub(1));
        let mut hashes = [0u64; MAX_N_LIMIT + 1];
        let mut h = SEED;
        for n in 1..=longest {
            h = mix(h, history[len - n]);
            hashes[n] = h;
        }
        (self.min_n..=longest).rev().find_map(|n| {
            let &end = self.index.get(&hashes[n])?;
            let tail = &history[len - n..];
            (end + 1 >= n && &history[end + 1 - n..=end] == tail).then_some(end + 1)
        })
    }
}

impl Default for NgramDrafter {
    fn default() -> Self {
        Self::new()
    }
}

const SEED: u64 = 0x243F_6A88_85A3_08D3;

/// One token into an n-gram hash (built from the n-gram's last token backwards).
fn mix(h: u64, token: u32) -> u64 {
    let x = (h ^ u64::from(token)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn taps(&self) -> Vec<Tap> {
        Vec::new()
    }

    fn reset(&mut self) {
        self.committed = 0;
        self.tokens.clear();
        self.index.clear();
    }

    fn position(&self) -> usize {
        self.committed
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        crate::check_rewind(self.committed, position)?;
        self.committed = position;
        if self.tokens.len() > position {
            self.tokens.truncate(position);
            self.index.clear();
            self.index_from(0);
        }
        Ok(())
    }

    fn observe(
        &mut self,
        _taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        if next_tokens.len() != n {
            return Err(ModelError::EmptyInput.into());
        }
        self.committed += n;
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        _chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        if k == 0 || history.len() < 2 {
            return Ok(Vec::new());
        }
        self.sync(history);
        let Some(src) = self.source(history) else {
            return Ok(Vec::new());
        };
        // src < len: the copy reads history, then (a loop shorter than k) its own proposals.
        let len = history.len();
        let mut out = Vec::with_capacity(k);
        for i in src..src + k {
            let t = if i < len { history[i] } else { out[i - len] };
            out.push(t);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chooser the drafter must not need.
    struct Unused;
    impl Chooser for Unused {
        fn choose(&mut self, _logits: &[f32], _context: &[u32]) -> u32 {
            panic!("the ngram drafter called the chooser")
        }
    }

    fn propose(d: &mut NgramDrafter, history: &[u32], k: usize) -> Vec<u32> {
        d.propose(history, k, &mut Unused).unwrap()
    }

    #[test]
    fn a_repeated_phrase_is_proposed() {
        let mut d = NgramDrafter::new();
        // "10 11 12 13 14" then "10 11" again: propose what followed "10 11".
        let h = [10, 11, 12, 13, 14, 99, 10, 11];
        assert_eq!(propose(&mut d, &h, 3), vec![12, 13, 14]);
        // Fewer asked, fewer given; none asked, none given.
        assert_eq!(propose(&mut d, &h, 1), vec![12]);
        assert!(propose(&mut d, &h, 0).is_empty());
    }

    #[test]
    fn no_match_gives_an_empty_proposal() {
        let mut d = NgramDrafter::new();
        assert!(propose(&mut d, &[1, 2, 3, 4, 5], 4).is_empty());
        assert!(propose(&mut d, &[7], 4).is_empty());
        assert!(propose(&mut d, &[], 4).is_empty());
        // Too short for min_n = 2 to find an earlier occurrence of the last bigram.
        let mut d = NgramDrafter::with_sizes(2, 3).unwrap();
        assert!(propose(&mut d, &[5, 6, 7, 6], 2).is_empty());
    }

    #[test]
    fn the_longest_ngram_wins_over_a_more_recent_shorter_one() {
        let mut d = NgramDrafter::new();
        // Ends with "1 2 3". "2 3" last occurred before 50 (more recent); "1 2 3" only before 40.
        let h = [1, 2, 3, 40, 9, 2, 3, 50, 8, 1, 2, 3];
        assert_eq!(propose(&mut d, &h, 1), vec![40]);
        // Capped at max_n = 2, the bigram's most recent occurrence wins.
        let mut d = NgramDrafter::with_sizes(1, 2).unwrap();
        assert_eq!(propose(&mut d, &h, 1), vec![50]);
    }

    #[test]
    fn the_most_recent_earlier_occurrence_wins() {
        let mut d = NgramDrafter::new();
        // "5 6" was followed by 1, then by 2.
        let h = [5, 6, 1, 8, 5, 6, 2, 9, 5, 6];
        assert_eq!(propose(&mut d, &h, 2), vec![2, 9]);
    }

    #[test]
    fn a_short_loop_is_continued_past_the_end_of_the_history() {
        let mut d = NgramDrafter::new();
        // Period 3: "7 8 9" repeats; the copy runs into its own proposals.
        let h = [1, 7, 8, 9, 7, 8, 9];
        assert_eq!(propose(&mut d, &h, 7), vec![7, 8, 9, 7, 8, 9, 7]);
        // A constant run: period 1.
        assert_eq!(propose(&mut d, &[4, 3, 3], 3), vec![3, 3, 3]);
    }

    #[test]
    fn the_index_follows_a_growing_history_and_a_changed_one() {
        let mut d = NgramDrafter::new();
        let mut h = vec![1, 2, 3, 4, 5];
        assert!(propose(&mut d, &h, 2).is_empty());
        h.extend([6, 2, 3]);
        assert_eq!(propose(&mut d, &h, 2), vec![4, 5]);
        h.extend([4, 5, 6, 1]);
        assert_eq!(propose(&mut d, &h, 3), vec![2, 3, 4]);
        // Another sequence without a reset: re-indexed, never a stale match.
        let other = [9, 8, 7, 2, 3];
        assert!(propose(&mut d, &other, 2).is_empty());
        assert_eq!(propose(&mut d, &[9, 8, 7, 9, 8], 2), vec![7, 9]);
    }

    #[test]
    fn positions_follow_observe_rewind_and_reset() {
        let mut d = NgramDrafter::new();
        assert!(d.taps().is_empty());
        d.observe(&[], 4, &[2, 3, 4, 5]).unwrap();
        d.observe(&[], 2, &[6, 7]).unwrap();
        assert_eq!(d.position(), 6);
        assert!(d.observe(&[], 2, &[6]).is_err());
        // Index a history, then rewind into it: matches past the kept prefix are gone.
        let h = [1, 2, 3, 1, 2, 5, 1, 2];
        assert_eq!(propose(&mut d, &h, 1), vec![5]);
        d.rewind(4).unwrap();
        assert_eq!(d.position(), 4);
        assert!(d.rewind(5).is_err(), "rewinding forwards");
        assert_eq!(propose(&mut d, &[1, 2, 3, 1, 2], 1), vec![3]);
        d.reset();
        assert_eq!(d.position(), 0);
        assert!(propose(&mut d, &[1, 2], 1).is_empty());
    }

    #[test]
    fn sizes_out_of_range_are_errors_naming_the_option() {
        let msg = |r: Result<NgramDrafter, NgramError>| r.err().unwrap().to_string();
        assert!(msg(NgramDrafter::with_sizes(0, 3)).contains("`min_n` = 0"));
        assert!(msg(NgramDrafter::with_sizes(4, 3)).contains("`min_n` = 4"));
        assert!(msg(NgramDrafter::with_sizes(1, 1000)).contains("`max_n` = 1000"));
        assert_eq!(NgramDrafter::with_sizes(2, 2).unwrap().sizes(), (2, 2));
        assert_eq!(NgramDrafter::new().sizes(), (DEFAULT_MIN_N, DEFAULT_MAX_N));
    }
}
