//! The block of an `auto` speculative run, tuned while it runs: the proposals per round that commit
//! the most tokens per second on this model, device, drafter and text. Block 0 is a plain decoding
//! step (the drafter only observes the committed row), so a drafter that does not pay is all but
//! switched off rather than slowing the run (the testbed's DFlash drafter on the CPU: 0.54x at its best
//! block ≥ 1).
//!
//! Why measure instead of deriving it: the best block is the argmax over b of E[tokens | b] / cost(b),
//! and both factors move. Acceptance decays along the block at a rate that depends on the drafter and
//! the text (the testbed's MTP head: 0.94 at position 1, 0.73 at 2; code differs from prose), and the
//! verify cost curve depends on the device and model (H200, 4B shape: 1.32 / 1.63 / 2.34x one row
//! for 2 / 4 / 8 rows, `cuda_check --table`; the testbed on the same GPU is launch-bound and nearly
//! flat; on the CPU verify cost grows with the rows). Measured on the testbed, GPU: block 2 1.03x,
//! block 4 1.25x over sequential.
//!
//! Model: E[tokens | b] = 1 + a1 + a1 a2 + ... + a1 ... ab, with a_i the acceptance of position i
//! given the ones before it, pooled over every round that reached i whatever its block (position i's
//! draft does not depend on how many follow it), each round's weight decaying by `MEMORY` per round
//! after it (the text changes what the drafter gets right), smoothed toward the acceptance pooled over all
//! positions (weight `PRIOR` rounds), so a position rarely reached counts as an average one rather
//! than a bad one. cost(b) = the median seconds of the last `WINDOW` rounds of block b (drafting,
//! verify, rollback, the drafter's observe), not counting its first round nor a round during which the
//! backend did one-time work (`Backend::one_time_work`: a CUDA graph captured, 1.1-2.3 ms against
//! 0.3-0.7 ms rounds on the testbed's H200 rounds, and a block's first several rounds meet new row
//! counts), and the lower median
//! (with two rounds, the cheaper): one-time costs only ever add, and they come later too (the GPU
//! MTP drafter captures a graph the first time a round keeps each number of rows). A simulation with
//! such costs (`one_time_costs_do_not_mislead_it`) reaches 93-97% of the best fixed block's rate in
//! 120 rounds with it, 91-95% with the plain median. A round's token count is too noisy to average
//! per block (it varies from 1 to b + 1); its acceptance outcomes, pooled, are not.
//!
//! Search: the run sits on a current block. A block it has not timed yet is *promising* when its
//! modelled rate, with cost(b) estimated from the timed blocks (interpolated between the nearest timed
//! blocks around b, or extrapolated along the slope of the two nearest on one side, never falling with
//! b), beats the current one by `MARGIN`; the next rounds run the most promising block until it is
//! timed, so the run jumps towards the optimum instead of walking one block per probe (on a GPU-like
//! curve the old walk took ~100 rounds from block 2 to 5; a generation of 128 tokens has ~50). Besides,
//! every `PROBE_EVERY` rounds (`PROBE_EVERY_SETTLED` after `SETTLED` rounds) it tries a block at an
//! offset cycling through `PROBES` (+1, -1, +2, -2: keeps the neighbours' timings fresh and steps over
//! a local optimum, as where the verify cost jumps).
//! After each round it moves to the block with the best modelled rate among those with at least
//! `MIN_ROUNDS` timed rounds, if that beats the current one by `MARGIN`: only measured costs move it.
//!
//! A session keeps its tuner between generations (session.rs), so the next request starts where the
//! last one settled, with what it learnt about acceptance and cost.
//!
//! Invariant: tuning only changes how many tokens a round proposes, never which tokens are committed,
//! so it is used only where the output does not depend on the block: selection without random draws
//! (temperature 0, with or without penalties). A sampled run keeps its block so that a seeded run
//! reproduces (its draws depend on the rounds, and the tuner's choices on wall-clock time).

/// Rounds between probes of another block.
pub const PROBE_EVERY: u64 = 3;
/// Rounds between probes once a run has had `SETTLED` rounds.
pub const PROBE_EVERY_SETTLED: u64 = 6;
/// Rounds after which probes thin out (the jumps to promising blocks have usually landed by then).
pub const SETTLED: u64 = 30;
/// Offsets from the current block that successive probes try.
pub const PROBES: [isize; 4] = [1, -1, 2, -2];
/// Timed rounds a block needs before its rate is compared.
pub const MIN_ROUNDS: u32 = 2;
/// How much better another block's rate must be to move to it (one round's timing jitters by ~1-2%).
pub const MARGIN: f64 = 1.03;
/// Rounds of a block whose median is its cost.
pub const WINDOW: usize = 5;
/// Per-round decay of the acceptance counts: text changes what a drafter gets right (the testbed's
/// MTP head: a prompt's first ~100 tokens are harder than the rest), so old rounds count less.
pub const MEMORY: f64 = 0.95;
/// Weight, in rounds, of the pooled acceptance in each position's estimate.
const PRIOR: f64 = 2.0;

#[derive(Clone, Copy, Debug, Default)]
struct Timing {
    /// Whether the block's first round has passed: it is not timed, as it may pay one-time costs (on a
    /// GPU, capturing the verify graph for its row count).
    warm: bool,
    rounds: u32,
    last: [f64; WINDOW], // the latest rounds' seconds, ring-indexed by `rounds`
}

impl Timing {
    fn median(&self) -> f64 {
        let n = (self.rounds as usize).min(WINDOW);
        let mut v = self.last[..n].to_vec();
        v.sort_by(f64::total_cmp);
        match n {
            0 => 0.0,
            // The lower median: with 2 rounds the cheaper one, as one-time costs only ever add.
            n => v[(n - 1) / 2],
        }
    }
}

/// Chooses each round's block within 1..=max (see the module doc).
#[derive(Clone, Debug)]
pub struct BlockTuner {
    max: usize,
    current: usize,
    /// A block being probed until it is timed.
    probing: Option<usize>,
    probe_rounds: u64,
    probes: u64, // periodic probes made, indexing `PROBES`
    round: u64,
    timing: Vec<Timing>, // [block]
    reached: Vec<f64>,   // [position]: rounds whose acceptance test reached it, decayed by `MEMORY`
    accepted: Vec<f64>,  // [position]: rounds that accepted it, likewise
    /// `TURBOSPARK_TUNER_TRACE=1`: each recorded round and the modelled rates, to stderr.
    trace: bool,
}

impl BlockTuner {
    /// Starts at `start` (clamped into 1..=max); chooses blocks within 0..=max.
    pub fn new(start: usize, max: usize) -> Self {
        let max = max.max(1);
        BlockTuner {
            max,
            current: start.clamp(1, max),
            probing: None,
            probe_rounds: 0,
            probes: 0,
            round: 0,
            timing: vec![Timing::default(); max + 1],
            reached: vec![0.0; max + 1],
            accepted: vec![0.0; max + 1],
            trace: std::env::var("TURBOSPARK_TUNER_TRACE").as_deref() == Ok("1"),
        }
    }

    /// The block the run currently prefers.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The largest block it may choose.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Rounds it has chosen a block for.
    pub fn rounds(&self) -> u64 {
        self.round
    }

    /// The block for the next round: a promising untimed block, the current one, or another on probe
    /// rounds.
    pub fn next_block(&mut self) -> usize {
        self.round += 1;
        // A probe of an untimed block runs until the block is timed (a block probed once and left would
        // need several probes, each a round's detour, before its rate counts), for at most
        // `MIN_ROUNDS + 2` rounds (rounds cut short by the token budget are not timed).
        self.probe_rounds += 1;
        if let Some(b) = self
            .probing
            .filter(|&b| self.timed(b).is_none() && self.probe_rounds <= MIN_ROUNDS as u64 + 2)
        {
            return b;
        }
        self.probing = None;
        if self.timed(self.current).is_none() {
            return self.current;
        }
        // With one timed block there is no slope to estimate others from: time a neighbour at once.
        let alone = (0..=self.max).filter(|&b| self.timed(b).is_some()).count() < 2;
        let probe = self.promising().or_else(|| {
            let every = if self.round > SETTLED {
                PROBE_EVERY_SETTLED
            } else {
                PROBE_EVERY
            };
            if !alone && !self.round.is_multiple_of(every) {
                return None;
            }
            // The offset advances on every probe slot, also one that falls outside 1..=max.
            let i = (self.probes % PROBES.len() as u64) as usize;
            self.probes += 1;
            let b = (self.current as isize + PROBES[i]).clamp(0, self.max as isize) as usize;
            let b = if b == self.current && alone {
                (self.current as isize - PROBES[i]).clamp(0, self.max as isize) as usize
            } else {
                b
            };
            (b != self.current).then_some(b)
        });
        if let Some(b) = probe {
            (self.probing, self.probe_rounds) = (Some(b), 1);
            return b;
        }
        self.current
    }

    /// One finished round that proposed `block` tokens, judged the first `judged` of them and
    /// accepted the first `accepted`, in `seconds`; None when it paid a one-time cost the caller knows
    /// of (`Backend::one_time_work`: a CUDA graph captured), so only its acceptance counts.
    pub fn record(&mut self, block: usize, judged: usize, accepted: usize, seconds: Option<f64>) {
        if block > self.max || seconds.is_some_and(|s| !s.is_finite() || s <= 0.0) {
            return;
        }
        let judged = judged.min(block);
        for (r, a) in self.reached.iter_mut().zip(self.accepted.iter_mut()) {
            (*r, *a) = (*r * MEMORY, *a * MEMORY);
        }
        for i in 1..=judged {
            self.reached[i] += 1.0;
            if i <= accepted {
                self.accepted[i] += 1.0;
            }
        }
        let t = &mut self.timing[block];
        let Some(seconds) = seconds.filter(|_| t.warm) else {
            // A block's first round may pay one-time costs nobody reported (the CPU's caches, a
            // scratch grown): never timed, and neither is a round that reported one.
            t.warm = true;
            if self.trace {
                let why = match seconds {
                    Some(_) => "its first round",
                    None => "one-time work",
                };
                eprintln!("tuner: block {block} not timed ({why}), accepted {accepted}/{judged}");
            }
            return;
        };
        t.last[t.rounds as usize % WINDOW] = seconds;
        t.rounds = t.rounds.saturating_add(1);
        if let Some(here) = self.rate(self.current) {
            let mut best = (self.current, here * MARGIN);
            for b in 0..=self.max {
                if let Some(r) = self.rate(b).filter(|_| b != self.current) {
                    if r > best.1 {
                        best = (b, r);
                    }
                }
            }
            self.current = best.0;
        }
        if self.trace {
            let rates: Vec<String> = (0..=self.max)
                .filter_map(|b| Some(format!("{b}:{:.0}", self.rate(b)?)))
                .collect();
            eprintln!(
                "tuner: block {block} {:.3} ms, accepted {accepted}/{judged} -> block {} (tok/s {})",
                seconds * 1e3,
                self.current,
                rates.join(" ")
            );
        }
    }

    /// Modelled tokens per second of block b, once it has been timed enough.
    fn rate(&self, b: usize) -> Option<f64> {
        let seconds = self.timed(b)?;
        Some(self.tokens(b) / seconds)
    }

    /// The median seconds of block b's rounds, once it has `MIN_ROUNDS` of them.
    fn timed(&self, b: usize) -> Option<f64> {
        let t = self.timing[b];
        let seconds = t.median();
        (t.rounds >= MIN_ROUNDS && seconds > 0.0).then_some(seconds)
    }

    /// The untimed block whose estimated rate beats the current block's by `MARGIN` the most, if any,
    /// within twice the largest timed block: a cost extrapolated from two noisy neighbours can make a far
    /// block look free, and on a CPU a far block is ruinous (2-vCPU Xeon, testbed MTP: 2.9 ms a round at
    /// block 2, 28 ms at 16; an early 64-token `generate` spent 3 rounds there, 0.74x of sequential).
    fn promising(&self) -> Option<usize> {
        let mut best = (None, self.rate(self.current)? * MARGIN);
        let reach = (0..=self.max)
            .filter(|&b| self.timed(b).is_some())
            .max()
            .map_or(self.max, |b| (2 * b).max(2));
        for b in (0..=reach.min(self.max)).filter(|&b| self.timed(b).is_none()) {
            if let Some(r) = self.estimated_cost(b).map(|c| self.tokens(b) / c) {
                if r > best.1 {
                    best = (Some(b), r);
                }
            }
        }
        best.0
    }

    /// cost(b) of an untimed block from the timed ones: linear between the nearest timed blocks below
    /// and above it, else along the slope of the two nearest on its one side, clamped at >= 0 (a
    /// round never gets cheaper with more proposals); `None` with fewer than two timed blocks there.
    fn estimated_cost(&self, b: usize) -> Option<f64> {
        let below: Vec<(usize, f64)> = (0..b)
            .rev()
            .filter_map(|t| Some((t, self.timed(t)?)))
            .take(2)
            .collect();
        let above: Vec<(usize, f64)> = (b + 1..=self.max)
            .filter_map(|t| Some((t, self.timed(t)?)))
            .take(2)
            .collect();
        let line = |(x0, y0): (usize, f64), (x1, y1): (usize, f64)| {
            let slope = ((y1 - y0) / (x1 as f64 - x0 as f64)).max(0.0);
            y0 + slope * (b as f64 - x0 as f64)
        };
        let c = match (below.first(), above.first()) {
            (Some(&lo), Some(&hi)) => line(lo, hi),
            (Some(&lo), None) => line(*below.get(1)?, lo),
            (None, Some(&hi)) => line(hi, *above.get(1)?),
            (None, None) => return None,
        };
        (c > 0.0).then_some(c)
    }

    /// Modelled tokens a round of block b commits (module doc).
    fn tokens(&self, b: usize) -> f64 {
        let (hits, tries) = (
            self.accepted.iter().sum::<f64>(),
            self.reached.iter().sum::<f64>(),
        );
        let pooled = (hits + 1.0) / (tries + 2.0);
        let (mut tokens, mut reach) = (1.0, 1.0);
        for i in 1..=b {
            reach *= (self.accepted[i] + PRIOR * pooled) / (self.reached[i] + PRIOR);
            tokens += reach;
        }
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected tokens a round of block b commits when position i is accepted with probability
    /// `accept(i)` given the ones before it: 1 + a1 + a1 a2 + ...
    fn tokens(accept: &impl Fn(usize) -> f64, b: usize) -> f64 {
        let (mut sum, mut reach) = (1.0, 1.0);
        for i in 1..=b {
            reach *= accept(i);
            sum += reach;
        }
        sum
    }

    /// A model of rounds: position i is accepted with probability `accept(i)` given the ones before
    /// it (outcomes from a seeded generator), and a round costs `draft * b + verify(b + 1)` seconds;
    /// returns where the tuner settles.
    fn settle(
        accept: impl Fn(usize) -> f64,
        draft: f64,
        verify: impl Fn(usize) -> f64,
        start: usize,
        max: usize,
    ) -> usize {
        let mut t = BlockTuner::new(start, max);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..400 {
            let b = t.next_block();
            let mut accepted = 0;
            while accepted < b && uniform() < accept(accepted + 1) {
                accepted += 1;
            }
            let judged = (accepted + 1).min(b);
            t.record(b, judged, accepted, Some(draft * b as f64 + verify(b + 1)));
        }
        t.current()
    }

    fn run(a: f64, draft: f64, verify: impl Fn(usize) -> f64, start: usize, max: usize) -> usize {
        settle(|_| a, draft, verify, start, max)
    }

    /// Tokens per second of block b under a geometric acceptance `a`.
    fn rate(a: f64, draft: f64, verify: &impl Fn(usize) -> f64, b: usize) -> f64 {
        tokens(&|_| a, b) / (draft * b as f64 + verify(b + 1))
    }

    #[test]
    fn steps_over_a_local_optimum() {
        // Verify cost that jumps at 5 rows (as when a launch changes kernels): block 3 beats 4, but
        // 5 and beyond beat 3. Probes one block away would stay at 3.
        let verify =
            |rows: usize| 1.0 + 0.05 * (rows - 1) as f64 + if rows >= 5 { 0.3 } else { 0.0 };
        let rate = |b: usize| tokens(&|_| 0.97, b) / (0.02 * b as f64 + verify(b + 1));
        assert!(
            rate(4) < rate(3) && rate(5) > MARGIN * rate(3),
            "no local optimum at 3"
        );
        let got = settle(|_| 0.97, 0.02, verify, 3, 8);
        assert!(got >= 6, "stuck at {got}");
    }

    fn best(a: f64, draft: f64, verify: impl Fn(usize) -> f64, max: usize) -> usize {
        (0..=max)
            .max_by(|&x, &y| rate(a, draft, &verify, x).total_cmp(&rate(a, draft, &verify, y)))
            .unwrap()
    }

    #[test]
    fn climbs_to_near_the_best_rate_when_verify_is_nearly_free() {
        // A GPU-like curve: extra rows cost 10% each; a good drafter. The rate is flat near the
        // optimum, so the climb may stop a few blocks short, within a few percent of it.
        let verify = |rows: usize| 1.0 + 0.1 * (rows - 1) as f64;
        let want = best(0.9, 0.05, verify, 16);
        assert!(want >= 5, "the model's optimum {want}");
        let got = run(0.9, 0.05, verify, 2, 16);
        let (r_got, r_start) = (rate(0.9, 0.05, &verify, got), rate(0.9, 0.05, &verify, 2));
        let r_best = rate(0.9, 0.05, &verify, want);
        assert!(
            got > 2 && r_got >= r_best / 1.05,
            "tuned to {got} ({r_got:.3}), optimum {want} ({r_best:.3})"
        );
        assert!(
            r_got > 1.1 * r_start,
            "start {r_start:.3}, tuned {r_got:.3}"
        );
    }

    #[test]
    fn reaches_the_optimum_within_a_short_generation() {
        // The GPU-like curve above from block 2: a 128-token generation has ~40 rounds at this
        // acceptance, and should spend most of them near the best rate, not walking towards it.
        let verify = |rows: usize| 1.0 + 0.1 * (rows - 1) as f64;
        let (a, draft) = (0.9, 0.05);
        let want = best(a, draft, verify, 16);
        let mut t = BlockTuner::new(2, 16);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut at = Vec::new();
        for _ in 0..40 {
            let b = t.next_block();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut accepted = 0;
            let mut u = state;
            while accepted < b && (u % 1000) < 900 {
                accepted += 1;
                u = u.rotate_left(10) ^ (u >> 3);
            }
            t.record(
                b,
                (accepted + 1).min(b),
                accepted,
                Some(draft * b as f64 + verify(b + 1)),
            );
            at.push(t.current());
        }
        let r = |b: usize| rate(a, draft, &verify, b);
        let late = &at[20..];
        assert!(
            late.iter().all(|&b| r(b) >= r(want) / 1.05),
            "optimum {want} ({:.3}); current block over rounds 21-40: {late:?}",
            r(want)
        );
    }

    #[test]
    fn a_flat_early_slope_does_not_send_it_far() {
        // Blocks 2 and 3 timed alike (noise: block 3 looks free) with every proposal accepted: the
        // extrapolated cost makes block 16 look best, but it may reach only twice the largest timed block.
        let mut t = BlockTuner::new(2, 16);
        for _ in 0..12 {
            let b = t.next_block();
            assert!(b <= 6, "went to block {b} from blocks timed up to 3");
            let b = b.min(3);
            t.record(b, b, b, Some(if b >= 2 { 1.0 } else { 0.6 }));
        }
    }

    #[test]
    fn descends_to_plain_decoding_when_rows_cost_as_much_as_decoding() {
        // A CPU-like curve: each row costs a full step; a weak drafter: speculation does not pay.
        let verify = |rows: usize| rows as f64;
        assert_eq!(best(0.3, 0.2, verify, 16), 0);
        assert_eq!(run(0.3, 0.2, verify, 6, 16), 0);
        // Rows at half a step each and a good drafter: speculation pays again, and it comes back.
        let verify = |rows: usize| 0.5 + 0.5 * rows as f64;
        let want = best(0.9, 0.05, verify, 16);
        assert!(want >= 2, "the model's optimum {want}");
        let got = run(0.9, 0.05, verify, 1, 16);
        assert!(got >= 2, "settled at {got}");
    }

    #[test]
    fn a_slow_first_round_does_not_hold_it_back() {
        // A run's first round pays one-time costs (graph captures): 50x here.
        let mut t = BlockTuner::new(2, 8);
        let first = t.next_block();
        t.record(first, 2, 2, Some(50.0));
        let verify = |rows: usize| 1.0 + 0.1 * (rows - 1) as f64;
        for _ in 0..300 {
            let b = t.next_block();
            t.record(b, b, b.min(3), Some(0.05 * b as f64 + verify(b + 1)));
        }
        assert!(t.current() >= 3, "settled at {}", t.current());
    }

    #[test]
    fn stays_within_its_bounds_and_probes_both_ways() {
        // Every block costs the same and nothing is accepted: no block is better, so only the
        // periodic probes leave the current one.
        let rounds = |t: &mut BlockTuner| -> Vec<usize> {
            (0..24)
                .map(|_| {
                    let b = t.next_block();
                    t.record(b, 1, 0, Some(1.0));
                    b
                })
                .collect()
        };
        let mut t = BlockTuner::new(9, 4);
        assert_eq!(t.current(), 4);
        let blocks = rounds(&mut t);
        assert!(blocks.iter().all(|&b| b <= 4), "{blocks:?}");
        assert!(blocks.contains(&3), "never probed below: {blocks:?}");
        let mut t = BlockTuner::new(1, 3);
        let blocks = rounds(&mut t);
        assert!(blocks.iter().all(|&b| b <= 3), "{blocks:?}");
        // At the lowest block the downward offsets fall outside: the upward ones must still come round.
        let above = blocks[8..].iter().filter(|&&b| b > 1).count();
        assert!(above >= 2, "stopped probing above: {blocks:?}");
        let mut t = BlockTuner::new(2, 4);
        let blocks = rounds(&mut t);
        assert!(
            blocks.contains(&1) && blocks.contains(&3),
            "not both ways: {blocks:?}"
        );
    }

    #[test]
    fn ignores_rounds_it_cannot_use() {
        let mut t = BlockTuner::new(2, 4);
        for _ in 0..10 {
            t.record(3, 3, 3, Some(0.0));
            t.record(3, 3, 3, Some(f64::NAN));
            t.record(7, 7, 7, Some(1.0));
        }
        assert_eq!(t.current(), 2);
    }
    /// A round pays a one-time cost (`once` rounds' worth) the first time it meets a new `key(block,
    /// accepted)` (on a GPU, graphs captured for a verify block's rows, for the drafter's observe of the
    /// rows kept, for a rollback: 1.1-2.3 ms against 0.3-0.7 ms rounds on the testbed's H200), with
    /// 10% timing noise besides. Averaged over 50 runs of 120 rounds: the tokens per second it reaches,
    /// counting each round at its cost without the one-time part, as a share of the best fixed block's.
    /// `reported`: the rounds that paid are recorded untimed, as `generate` does when the backend's
    /// `one_time_work` grew.
    fn share_with_one_time_costs(
        (verify, accept): Curve,
        key: fn(usize, usize) -> (usize, usize),
        once: f64,
        reported: bool,
    ) -> f64 {
        let draft = 0.05;
        let cost = |b: usize| draft * b as f64 + verify(b + 1);
        let rate = |b: usize| tokens(&accept, b) / cost(b);
        let best = (1..=15).map(rate).fold(0.0, f64::max);
        let mut sum = 0.0;
        for seed in 0..50u64 {
            let mut t = BlockTuner::new(2, 15);
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (seed * 7919 + 1);
            let mut uniform = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let (mut committed, mut seconds) = (0.0, 0.0);
            let mut met = std::collections::HashSet::new();
            for _ in 0..120 {
                let b = t.next_block();
                let mut a = 0;
                while a < b && uniform() < accept(a + 1) {
                    a += 1;
                }
                let c = cost(b) * (1.0 + 0.1 * (uniform() - 0.5));
                let paid = met.insert(key(b, a));
                let timed = match (paid, reported) {
                    (true, true) => None,
                    (true, false) => Some(c + once),
                    (false, _) => Some(c),
                };
                t.record(b, (a + 1).min(b), a, timed);
                committed += (a + 1) as f64;
                seconds += c;
            }
            sum += committed / seconds / best;
        }
        sum / 50.0
    }

    /// (verify cost of r rows, acceptance of position i): one nearly flat, one steeper, one where
    /// verify rows cost about as much as decoding.
    /// (verify cost of r rows, acceptance of position i).
    type Curve = (fn(usize) -> f64, fn(usize) -> f64);

    const CURVES: [Curve; 3] = [
        (|r| 1.0 + 0.02 * r as f64, |i| 0.93 - 0.01 * i as f64),
        (|r| 1.0 + 0.1 * (r as f64 - 1.0), |_| 0.85),
        (|r| 0.5 + 0.5 * r as f64, |_| 0.8),
    ];

    #[test]
    fn one_time_costs_do_not_mislead_it() {
        // Paid per number of rows kept, unreported: the lower median of a block's rounds absorbs them.
        for (curve, floor) in CURVES.into_iter().zip([0.9, 0.92, 0.92]) {
            let got = share_with_one_time_costs(curve, |_, a| (0, a), 3.0, false);
            assert!(got >= floor, "{got:.3} of the best fixed block's rate");
        }
    }

    #[test]
    fn one_time_costs_reported_by_the_backend_are_left_out() {
        // Paid per (block, rows kept), so a block's first several rounds all pay: unreported, the
        // flat curve reaches 0.89 of the best rate; reported (left untimed), >= 0.96 on every curve.
        for curve in CURVES {
            let got = share_with_one_time_costs(curve, |b, a| (b, a), 1.0, true);
            assert!(got >= 0.95, "{got:.3} of the best fixed block's rate");
        }
        let unreported = share_with_one_time_costs(CURVES[0], |b, a| (b, a), 1.0, false);
        assert!(
            unreported < 0.92,
            "{unreported:.3}: the case no longer tells"
        );
    }

    #[test]
    fn follows_the_text_when_it_gets_easier() {
        // The drafter's acceptance depends on where the text is: 0.6 for its first 100 tokens, then
        // 0.97 decaying slowly along the block (the testbed's MTP head on a prompt's continuation);
        // launch-bound verify, one-time costs and timing noise as above. Over 512 tokens the tuned
        // run should commit tokens about as fast as the best fixed block, which cannot adapt.
        let accept = |pos: usize, i: usize| {
            if pos < 100 {
                0.6
            } else {
                0.97 - 0.005 * i as f64
            }
        };
        let cost = |b: usize| 0.05 * b as f64 + 1.0 + 0.02 * (b + 1) as f64;
        let run = |fixed: Option<usize>, seed: u64| -> f64 {
            let mut t = BlockTuner::new(2, 15);
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (seed * 7919 + 1);
            let mut uniform = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let (mut pos, mut seconds) = (0, 0.0);
            let mut kept_before = std::collections::HashSet::new();
            while pos < 512 {
                let b = fixed.unwrap_or_else(|| t.next_block());
                let mut a = 0;
                while a < b && uniform() < accept(pos, a + 1) {
                    a += 1;
                }
                let c = cost(b) * (1.0 + 0.1 * (uniform() - 0.5));
                let once = if kept_before.insert(a) { 3.0 } else { 0.0 };
                t.record(b, (a + 1).min(b), a, Some(c + once));
                pos += a + 1;
                seconds += c;
            }
            pos as f64 / seconds
        };
        let mean = |fixed: Option<usize>| (0..20).map(|s| run(fixed, s)).sum::<f64>() / 20.0;
        let best = (1..=15).map(|b| mean(Some(b))).fold(0.0, f64::max);
        let tuned = mean(None);
        assert!(
            tuned >= 0.98 * best,
            "tuned {tuned:.3}, best fixed {best:.3}"
        );
    }
}
