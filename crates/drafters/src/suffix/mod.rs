//! Suffix drafter (`--drafter suffix`), after SuffixDecoding (Oliaro et al., 2024): no weights; it
//! proposes the most frequent continuation of the history's longest well-supported suffix, found in a
//! suffix structure over the current sequence and the earlier sequences it was told to remember.
//!
//! Structure: a suffix trie of bounded depth ([`DEPTH`] = 24) with occurrence counts, rather than
//! a suffix tree or automaton. Every indexed start position adds one path of its next 24 tokens, so
//! appending a token is 24 constant-time steps (extend the paths of the 23 starts still growing, open
//! a new one), removing the oldest start is one path walk, and a node's count is exactly its string's
//! occurrences: what the proposal rule needs, with no suffix links to repair when text is evicted
//! from the front (a suffix tree's or automaton's occurrence counts are not maintained that cheaply
//! under deletion). The price is memory: up to 24 nodes a token, bounded below.
//!
//! Memory. The indexed text is a queue of segments, oldest first: earlier sequences (archived), then
//! the current one (live). At most `memory_tokens` start positions are indexed in all ([`SuffixDrafter::
//! with_memory`], default [`DEFAULT_MEMORY_TOKENS`]); past that the oldest is evicted (archived ones
//! first, then the live sequence's oldest tokens), however long a prompt is. So the trie holds at most
//! `memory_tokens * 24` nodes and [`BYTES_PER_NODE_BOUND`] bytes each (with the token queues, 4
//! bytes a token): at the default, 32768 tokens, 75 MiB in the worst case (text that never repeats).
//! A sequence is archived when it is reset, and its discarded tail when the session rewinds into it
//! (the next request shares only a prefix), unless [`Drafter::forget_earlier_requests`] was called
//! since: then it is dropped, and so is everything archived (the server calls it when a request comes
//! from another API key, and for every request when the server has none).
//!
//! Proposal. For each suffix of the history of `m` tokens (m = 1, 2, ... while it occurred before), walk
//! from its node to the most frequent child, up to `min(k, 2m, 24 - m)` steps, multiplying the step's
//! probability (the child's count over its parent's, the parent's count less the occurrence at the end
//! of the history on the first step), and stop once that product drops below [`MIN_PROBABILITY`]. The
//! proposal is the walk whose summed products (its expected accepted tokens under those counts) is
//! highest, the longer match on a tie. So a weak match (a short suffix, or a continuation that varies)
//! proposes few tokens and a strong one up to `k` (never more: `k` is the round's limit, the named
//! block or under `auto` the exactness cap of 16); a history whose last token never occurred before
//! proposes nothing and the loop takes a plain step.
//!
//! Length (greedy `auto` runs, [`crate::cost`]): the walk is cut where its next tokens would cost more
//! verify time than they are expected to commit. Token i's chance is the step's frequency times the
//! measured acceptance of copy position i given the ones before it: every round's planned walk, taken or
//! not, is judged against the tokens the round committed (greedy output does not depend on what was
//! proposed), counts decayed per round and smoothed toward [`COPY_PRIOR_ACCEPTANCE`], so a drafter
//! whose copies failed is tried again once the failures have faded. Without measured costs (sampled
//! runs, the first round) nothing is cut.
//!
//! Invariant (exactness). Proposals depend only on committed tokens and are deterministic, so the
//! drafter's q is a point mass at each: like prompt lookup it never calls the [`Chooser`] and the loop
//! judges its proposals as `Draft::PointMass`. No taps; `observe` advances the committed position and
//! appends the committed tokens it is given. Cost: measured by `cargo bench -p drafters --bench suffix`.

mod trie;

pub use trie::{BYTES_PER_NODE_BOUND, DEPTH};

use std::collections::VecDeque;

use crate::cost::RoundCosts;
use crate::{Chooser, Drafter, RoundTiming};
use families::{BackendError, ModelError, Tap};
use trie::{Trie, ROOT};

/// Start positions indexed by default (earlier sequences and the current one together).
pub const DEFAULT_MEMORY_TOKENS: usize = 32_768;
/// The smallest bound accepted: the live sequence must keep more than a path's depth indexed.
pub const MIN_MEMORY_TOKENS: usize = 256;
/// The largest bound accepted: 2^20 tokens, at most about 2.4 GiB of trie.
pub const MAX_MEMORY_TOKENS: usize = 1 << 20;
/// A walk stops where the product of its step probabilities falls below this (SuffixDecoding's
/// minimum token probability, 0.1 in its reference implementation).
pub const MIN_PROBABILITY: f32 = 0.1;
/// A match of `m` tokens proposes at most this many tokens per matched one.
pub const TOKENS_PER_MATCHED_TOKEN: usize = 2;
/// A copy position's acceptance (given the ones before it) before it has been measured.
pub const COPY_PRIOR_ACCEPTANCE: f64 = 0.8;
/// Weight, in rounds, of the prior in each position's estimate.
const COPY_PRIOR_ROUNDS: f64 = 2.0;
/// Per-round decay of the positions' counts.
const COPY_MEMORY: f64 = 0.95;
/// Copy positions whose acceptance is tracked (the exactness cap).
const COPY_POSITIONS: usize = 16;

/// A copy the drafter would propose: its tokens, the tokens it expects committed (calibrated), and
/// the round's committed tokens per second at the measured costs ([`RoundCosts::copy_length`]).
#[derive(Clone, Debug, Default)]
pub struct CopyPlan {
    pub tokens: Vec<u32>,
    pub expected: f64,
    pub rate: f64,
}

/// A memory bound out of range, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid suffix drafter option `memory_tokens` = {value}: expected {MIN_MEMORY_TOKENS}..={MAX_MEMORY_TOKENS}")]
pub struct SuffixError {
    pub value: usize,
}

/// Indexed tokens of one sequence: every position in `tokens` is an indexed start.
struct Segment {
    tokens: VecDeque<u32>,
}

impl Segment {
    fn path(&self, start: usize, len: usize) -> impl Iterator<Item = u32> + '_ {
        self.tokens.range(start..start + len).copied()
    }
}

/// Suffix drafter (see the module doc).
pub struct SuffixDrafter {
    memory_tokens: usize,
    trie: Trie,
    /// Earlier sequences, oldest first.
    archive: VecDeque<Segment>,
    /// The current sequence's indexed tokens: absolute positions `live_base..live_base + len`.
    live: Segment,
    live_base: usize,
    /// Nodes ending the live sequence: `active[i]` spells its last `active.len() - i` tokens (the paths
    /// of the starts still growing, depth 1..DEPTH-1, oldest start first).
    active: VecDeque<u32>,
    /// Start positions indexed, all segments together (at most `memory_tokens`).
    indexed: usize,
    /// The live sequence may be archived (no `forget_earlier_requests` since it began).
    keep_live: bool,
    /// Rows observed (the committed position).
    committed: usize,
    scratch: Vec<u32>,
    /// The last planned walk (proposed or not), judged at the next observe.
    planned: Vec<u32>,
    /// Decayed counts of planned walks that reached / got right each position.
    reached: [f64; COPY_POSITIONS],
    accepted: [f64; COPY_POSITIONS],
    /// Round costs measured in this drafter's greedy `auto` runs.
    costs: RoundCosts,
}

impl SuffixDrafter {
    pub fn new() -> Self {
        Self::with_memory(DEFAULT_MEMORY_TOKENS).expect("the default bound is valid")
    }

    /// Indexes at most `memory_tokens` start positions (see the module doc for the bytes that makes).
    pub fn with_memory(memory_tokens: usize) -> Result<Self, SuffixError> {
        if !(MIN_MEMORY_TOKENS..=MAX_MEMORY_TOKENS).contains(&memory_tokens) {
            return Err(SuffixError {
                value: memory_tokens,
            });
        }
        Ok(SuffixDrafter {
            memory_tokens,
            trie: Trie::new(),
            archive: VecDeque::new(),
            live: Segment {
                tokens: VecDeque::new(),
            },
            live_base: 0,
            active: VecDeque::new(),
            indexed: 0,
            keep_live: true,
            committed: 0,
            scratch: Vec::with_capacity(DEPTH),
            planned: Vec::new(),
            reached: [0.0; COPY_POSITIONS],
            accepted: [0.0; COPY_POSITIONS],
            costs: RoundCosts::new(),
        })
    }

    /// The bound, in indexed tokens.
    pub fn memory_tokens(&self) -> usize {
        self.memory_tokens
    }

    /// Start positions indexed now (at most the bound).
    pub fn indexed_tokens(&self) -> usize {
        self.indexed
    }

    /// Trie nodes in use (at most `memory_tokens * DEPTH`).
    pub fn nodes(&self) -> usize {
        self.trie.nodes_in_use()
    }

    /// Bytes the structure holds (trie and token queues, by capacity).
    pub fn bytes(&self) -> usize {
        let queue = |s: &Segment| s.tokens.capacity() * 4;
        self.trie.bytes() + queue(&self.live) + self.archive.iter().map(queue).sum::<usize>()
    }

    /// Appends one committed token to the live sequence (`DEPTH` trie steps), evicting the oldest
    /// indexed start when over the bound.
    pub fn push(&mut self, token: u32) {
        for node in self.active.iter_mut() {
            *node = self.trie.extend(*node, token);
        }
        if self.active.len() == DEPTH - 1 {
            // That start's path reached DEPTH tokens: it stops growing.
            self.active.pop_front();
        }
        self.active.push_back(self.trie.extend(ROOT, token));
        self.live.tokens.push_back(token);
        self.indexed += 1;
        while self.indexed > self.memory_tokens {
            self.evict_oldest();
        }
    }

    /// Removes the oldest indexed start (an archived sequence's, else the live one's).
    fn evict_oldest(&mut self) {
        let segment = match self.archive.front_mut() {
            Some(s) => s,
            None => {
                self.live_base += 1;
                &mut self.live
            }
        };
        let len = segment.tokens.len().min(DEPTH);
        self.trie
            .remove_path(segment.path(0, len), &mut self.scratch);
        segment.tokens.pop_front();
        if segment.tokens.is_empty() && !self.archive.is_empty() {
            self.archive.pop_front();
        }
        self.indexed -= 1;
    }

    /// Drops the live sequence's tokens from absolute position `at` on: they become an archived
    /// sequence, or are removed when the live one may not be kept.
    fn truncate_live(&mut self, at: usize) {
        let len = self.live.tokens.len();
        let keep = at.saturating_sub(self.live_base).min(len);
        if keep == len {
            return;
        }
        // The kept starts' paths that run into the tail are cut at the cut; they end the live sequence.
        self.active.clear();
        for start in keep.saturating_sub(DEPTH - 1)..keep {
            let spelled = (len - start).min(DEPTH);
            let end = self.trie.shorten_path(
                self.live.path(start, spelled),
                keep - start,
                &mut self.scratch,
            );
            self.active.push_back(end);
        }
        let tail = Segment {
            tokens: self.live.tokens.drain(keep..).collect(),
        };
        // The tail's own starts spell exactly its paths as a sequence of its own: archived as they
        // are, or removed.
        if self.keep_live {
            self.archive.push_back(tail);
        } else {
            self.remove_segment(&tail);
        }
    }

    /// Removes every path of `segment`.
    fn remove_segment(&mut self, segment: &Segment) {
        let len = segment.tokens.len();
        for start in 0..len {
            let spelled = (len - start).min(DEPTH);
            self.trie
                .remove_path(segment.path(start, spelled), &mut self.scratch);
        }
        self.indexed -= len;
    }

    /// Ends the live sequence (archived or removed, as `truncate_live`); the next one starts empty
    /// at absolute position `base`.
    fn restart_live(&mut self, base: usize) {
        self.truncate_live(self.live_base);
        self.live_base = base;
        self.active.clear();
        self.keep_live = true;
    }

    /// Brings the live sequence to `history`: appends what it lacks when `history` continues it, else
    /// ends it at the first difference (checked over its last `DEPTH` tokens, the ones the matches
    /// read) and appends from there. Only the last `memory_tokens` of a longer history are indexed.
    fn sync(&mut self, history: &[u32]) {
        let end = self.live_base + self.live.tokens.len();
        let len = self.live.tokens.len();
        let from = len.saturating_sub(DEPTH);
        let continues = end <= history.len()
            && self
                .live
                .tokens
                .range(from..)
                .zip(&history[self.live_base + from..end])
                .all(|(a, b)| a == b);
        if !continues {
            let common = (self.live_base..end.min(history.len()))
                .find(|&p| self.live.tokens[p - self.live_base] != history[p])
                .unwrap_or(end.min(history.len()));
            self.truncate_live(common);
        }
        if self.live.tokens.is_empty() {
            self.live_base = history.len().saturating_sub(self.memory_tokens);
        }
        let end = self.live_base + self.live.tokens.len();
        for &t in &history[end..] {
            self.push(t);
        }
    }

    /// The copy to propose after `history`, at most `limit` tokens, cut where more tokens would cost
    /// more than they bring at `costs` (see the module doc). The whole walk is judged at the next
    /// observe, whether the caller proposes the copy or not.
    pub fn plan_copy(&mut self, history: &[u32], limit: usize, costs: &RoundCosts) -> CopyPlan {
        self.planned.clear();
        if limit == 0 || history.len() < 2 {
            return CopyPlan::default();
        }
        self.sync(history);
        let (mut walk, products) = self.best_walk(limit);
        let (mut chance, mut before) = (1.0f64, 1.0f32);
        let chances: Vec<f64> = products
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let step = f64::from(p / before);
                before = p;
                chance *= (step * self.position_acceptance(i)).min(1.0);
                chance
            })
            .collect();
        let (len, rate) = costs.copy_length(&chances);
        self.planned = walk.clone();
        walk.truncate(len);
        CopyPlan {
            tokens: walk,
            expected: chances[..len].iter().sum(),
            rate,
        }
    }

    /// Measured acceptance of copy position `i` given the ones before it (smoothed; see the module doc).
    pub fn position_acceptance(&self, i: usize) -> f64 {
        let i = i.min(COPY_POSITIONS - 1);
        (self.accepted[i] + COPY_PRIOR_ROUNDS * COPY_PRIOR_ACCEPTANCE)
            / (self.reached[i] + COPY_PRIOR_ROUNDS)
    }

    /// Sets position 0's counts (tests of the callers' rules).
    #[cfg(test)]
    pub(crate) fn set_first_position_counts(&mut self, reached: f64, accepted: f64) {
        (self.reached[0], self.accepted[0]) = (reached, accepted);
    }

    /// Judges the planned walk against the committed tokens that followed it.
    fn learn(&mut self, next_tokens: &[u32]) {
        let planned = std::mem::take(&mut self.planned);
        if planned.is_empty() {
            return;
        }
        for i in 0..COPY_POSITIONS {
            self.reached[i] *= COPY_MEMORY;
            self.accepted[i] *= COPY_MEMORY;
        }
        for (i, (p, t)) in planned
            .iter()
            .zip(next_tokens)
            .take(COPY_POSITIONS)
            .enumerate()
        {
            self.reached[i] += 1.0;
            if p != t {
                break;
            }
            self.accepted[i] += 1.0;
        }
    }

    /// The best-supported walk from the suffixes of the live sequence (see the module doc), at most
    /// `k` tokens, with each step's product of frequencies (the chance its prefix is all accepted).
    fn best_walk(&self, k: usize) -> (Vec<u32>, Vec<f32>) {
        let mut best = (0.0f32, Vec::new(), Vec::new());
        // active[len - m] spells the last m tokens; shorter suffixes occur at least as often.
        for (m, &node) in self
            .active
            .iter()
            .rev()
            .enumerate()
            .map(|(i, n)| (i + 1, n))
        {
            let earlier = self.trie.count(node) - 1;
            if earlier == 0 {
                break;
            }
            let budget = k.min(TOKENS_PER_MATCHED_TOKEN * m).min(DEPTH - m);
            if (budget as f32) < best.0 {
                // Every step adds at most 1: this walk cannot win.
                continue;
            }
            let (mut at, mut total, mut p) = (node, earlier, 1.0f32);
            let (mut score, mut walk, mut chances) = (0.0f32, Vec::new(), Vec::new());
            while walk.len() < budget {
                let Some(child) = self.trie.most_frequent_child(at) else {
                    break;
                };
                p *= self.trie.count(child) as f32 / total as f32;
                if p < MIN_PROBABILITY {
                    break;
                }
                score += p;
                walk.push(self.trie.token(child));
                chances.push(p);
                at = child;
                total = self.trie.count(child);
            }
            if score >= best.0 && !walk.is_empty() {
                best = (score, walk, chances);
            }
        }
        (best.1, best.2)
    }
}

impl Default for SuffixDrafter {
    fn default() -> Self {
        Self::new()
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &'static str {
        "suffix"
    }

    fn taps(&self) -> Vec<Tap> {
        Vec::new()
    }

    fn reset(&mut self) {
        self.committed = 0;
        self.planned.clear();
        self.restart_live(0);
    }

    fn forget_earlier_requests(&mut self) {
        self.keep_live = false;
        if self.archive.is_empty() {
            return;
        }
        let archived: usize = self.archive.iter().map(|s| s.tokens.len()).sum();
        if archived <= self.live.tokens.len() {
            while let Some(segment) = self.archive.pop_front() {
                self.remove_segment(&segment);
            }
        } else {
            // Cheaper to index the live sequence again than to remove the archive path by path.
            self.archive.clear();
            self.trie.clear();
            self.indexed = 0;
            self.active.clear();
            let live = std::mem::take(&mut self.live.tokens);
            for t in live {
                self.push(t);
            }
        }
    }

    fn position(&self) -> usize {
        self.committed
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        crate::check_rewind(self.committed, position)?;
        self.committed = position;
        self.planned.clear();
        if position < self.live_base {
            self.restart_live(position);
        } else {
            self.truncate_live(position);
        }
        // What the session keeps is the next request's prefix: its own text from here on.
        self.keep_live = true;
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
        // The live sequence holds every committed token when it ends one past the observed rows
        // (as a propose leaves it): the rows' next tokens follow on.
        let synced = !self.live.tokens.is_empty()
            && self.live_base + self.live.tokens.len() == self.committed + 1;
        self.committed += n;
        if synced {
            for &t in next_tokens {
                self.push(t);
            }
        }
        self.learn(next_tokens);
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        self.propose_within(history, k, k, chooser)
    }

    /// A copy of up to `limit` tokens (the drafter sizes its own proposals; `k` is not used).
    fn propose_within(
        &mut self,
        history: &[u32],
        _k: usize,
        limit: usize,
        _chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        let costs = std::mem::take(&mut self.costs);
        let copy = self.plan_copy(history, limit, &costs);
        self.costs = costs;
        Ok(copy.tokens)
    }

    fn record_costs(&mut self, timing: RoundTiming) {
        self.costs
            .record_verify(timing.rows, timing.verify_seconds + timing.draft_seconds);
    }
}
