//! `turbospark bench --acceptance PROFILE [--draft-cost mtp|dflash|free]`: speculation priced on any
//! checkpoint, trained or random, at an acceptance the caller chooses.
//!
//! The drafter ([`ProfileDrafter`]) proposes the target's own greedy continuation, known from a
//! sequential run, and corrupts the proposal at block position i with probability 1 - a_i (the
//! profile: `oracle` a_i = 1, `geometric:P` a_i = P, or a list `0.9,0.8,0.7` whose last value repeats).
//! A corrupted proposal differs from the target's token, so it is rejected for certain: position i,
//! once reached, is accepted with probability a_i whatever the weights. It is charged a real drafter's
//! cost: `mtp` runs the checkpoint's MTP head (its proposals discarded, its taps observed as usual),
//! `dflash` the DFlash drafter's block pass, `free` nothing.
//!
//! Per block k: realized tokens/s and the ratio to sequential decoding, and two references, as ratios:
//! - bound = E_k = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens per round at the cost of one decode step
//!   (verify of any size costs one step, drafting is free): what the acceptance alone allows;
//! - model = E_k / (the round's measured draft + verify + rollback seconds x sequential tokens/s): the
//!   bound with this build's costs. realized / model is the loop's own overhead; model / bound is what
//!   verifying and drafting cost.

use std::io::Write;

use anyhow::{bail, Context, Result};
use turbospark::device::BoxedDrafter;
use turbospark::drafters::{Chooser, Drafter};
use turbospark::families::{Backend, BackendError, Tap};
use turbospark::runtime::policy::Drafter as DrafterKind;
use turbospark::runtime::{
    DrafterAvailability, GenerationConfig, GenerationResult, Session, SpecStats, Speculative,
};

use super::{median, pool, Bench, BenchArgs};

/// Blocks measured when `--speculative` names none (capped by what the device verifies exactly).
const DEFAULT_BLOCKS: [usize; 7] = [1, 2, 3, 4, 8, 12, 15];

/// Per-position acceptance probabilities (`--acceptance`).
#[derive(Clone, Debug, PartialEq)]
pub enum Profile {
    Oracle,
    Geometric(f64),
    /// a_1, a_2, ...; positions past the list take its last value.
    List(Vec<f64>),
}

impl Profile {
    pub fn parse(value: &str) -> Result<Self> {
        let bad = |reason: &str| {
            anyhow::anyhow!(
                "invalid value {value:?} for --acceptance: {reason} (expected oracle, \
                 geometric:P or a list such as 0.9,0.8,0.7, each in [0, 1])"
            )
        };
        let prob = |s: &str| -> Result<f64> {
            let p: f64 = s.trim().parse().map_err(|_| bad("not a number"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(bad("a probability outside [0, 1]"));
            }
            Ok(p)
        };
        let v = value.trim();
        if v.eq_ignore_ascii_case("oracle") {
            return Ok(Profile::Oracle);
        }
        if let Some(p) = v.strip_prefix("geometric:") {
            return Ok(Profile::Geometric(prob(p)?));
        }
        if v.is_empty() {
            return Err(bad("empty"));
        }
        Ok(Profile::List(
            v.split(',').map(prob).collect::<Result<_>>()?,
        ))
    }

    /// a_i of block position `i` (0-based).
    pub fn at(&self, i: usize) -> f64 {
        match self {
            Profile::Oracle => 1.0,
            Profile::Geometric(p) => *p,
            Profile::List(a) => a.get(i).or(a.last()).copied().unwrap_or(0.0),
        }
    }

    /// E_k: expected tokens a round of `k` proposals commits (the bonus or replacement included).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut reach = 1.0;
        let mut total = 1.0;
        for i in 0..k {
            reach *= self.at(i);
            total += reach;
        }
        total
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Profile::Oracle => write!(f, "oracle"),
            Profile::Geometric(p) => write!(f, "geometric:{p}"),
            Profile::List(a) => {
                let parts: Vec<String> = a.iter().map(|p| p.to_string()).collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

/// Which real drafter's cost the profile drafter is charged (`--draft-cost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftCost {
    Mtp,
    Dflash,
    Free,
}

impl std::str::FromStr for DraftCost {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "mtp" => Ok(DraftCost::Mtp),
            "dflash" => Ok(DraftCost::Dflash),
            "free" => Ok(DraftCost::Free),
            _ => Err(format!("expected mtp, dflash or free (got {value:?})")),
        }
    }
}

/// SplitMix64 step: the corruption draws, seeded, reproducible.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Proposes the reference continuation, corrupted per the profile (module doc); charged `charged`'s
/// cost when there is one.
pub struct ProfileDrafter {
    /// Prompt + the target's greedy continuation.
    reference: Vec<u32>,
    profile: Profile,
    vocab: u32,
    seed: u64,
    rng: u64,
    charged: Option<BoxedDrafter>,
    observed: usize,
}

impl ProfileDrafter {
    pub fn new(
        reference: Vec<u32>,
        profile: Profile,
        vocab: usize,
        seed: u64,
        charged: Option<BoxedDrafter>,
    ) -> Self {
        ProfileDrafter {
            reference,
            profile,
            vocab: vocab.max(2) as u32,
            seed,
            rng: seed,
            charged,
            observed: 0,
        }
    }
}

impl Drafter for ProfileDrafter {
    fn name(&self) -> &'static str {
        "profile"
    }

    fn taps(&self) -> Vec<Tap> {
        self.charged.as_ref().map_or_else(Vec::new, |d| d.taps())
    }

    fn reset(&mut self) {
        if let Some(d) = &mut self.charged {
            d.reset();
        }
        self.observed = 0;
        self.rng = self.seed;
    }

    fn position(&self) -> usize {
        self.charged
            .as_ref()
            .map_or(self.observed, |d| d.position())
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        if let Some(d) = &mut self.charged {
            d.rewind(position)?;
        }
        self.observed = position;
        Ok(())
    }

    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        if let Some(d) = &mut self.charged {
            d.observe(taps, n, next_tokens)?;
        }
        self.observed += n;
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        if let Some(d) = &mut self.charged {
            d.propose(history, k, chooser)?;
        }
        let start = history.len();
        let mut proposals = Vec::with_capacity(k);
        for i in 0..k {
            let Some(&token) = self.reference.get(start + i) else {
                break;
            };
            let u = (splitmix(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64;
            proposals.push(if u < self.profile.at(i) {
                token
            } else {
                // Any other token: rejected for certain, since the target's choice is `token`.
                let shift = 1 + (splitmix(&mut self.rng) % u64::from(self.vocab - 1)) as u32;
                (token + shift) % self.vocab
            });
        }
        Ok(proposals)
    }
}

/// The blocks to measure: `--speculative`'s numbers, else the defaults, within what the device verifies
/// exactly.
fn blocks(flag: Option<&str>, max_exact: Option<usize>) -> Result<Vec<usize>> {
    let cap = max_exact.unwrap_or(16).min(16);
    let Some(flag) = flag else {
        return Ok(DEFAULT_BLOCKS.into_iter().filter(|&b| b <= cap).collect());
    };
    flag.split(',')
        .map(|part| {
            let b: usize = part.trim().parse().map_err(|_| {
                anyhow::anyhow!(
                    "invalid value {flag:?} for --speculative: with --acceptance, blocks are numbers \
                     such as 1,2,4,8"
                )
            })?;
            if !(1..=cap).contains(&b) {
                bail!(
                    "invalid block {b} in --speculative: this device verifies 1..={cap} proposals \
                     exactly"
                );
            }
            Ok(b)
        })
        .collect()
}

/// The drafter whose cost is charged, loaded on the model's device.
fn charged(
    bench: &Bench,
    cost: DraftCost,
    availability: &DrafterAvailability,
) -> Result<Option<BoxedDrafter>> {
    let kind = match cost {
        DraftCost::Free => return Ok(None),
        DraftCost::Mtp if !availability.mtp => {
            bail!("--draft-cost mtp: this checkpoint has no MTP head (mtp.* tensors)")
        }
        DraftCost::Dflash if !availability.dflash => bail!(
            "--draft-cost dflash: this checkpoint has no DFlash drafter (dflash/config.json; \
             with --shape, add --dflash)"
        ),
        DraftCost::Mtp => DrafterKind::Mtp,
        DraftCost::Dflash => DrafterKind::Dflash,
    };
    let options = turbospark::runtime::DrafterOptions::default();
    let drafter =
        turbospark::runtime::load_drafter(&bench.model, &bench.checkpoint, kind, &options)
            .context("--draft-cost")?;
    Ok(Some(drafter))
}

/// Prints the acceptance table (module doc).
pub(super) fn table(
    bench: &Bench,
    args: &BenchArgs,
    prompt: &[u32],
    profile: &Profile,
    cost: DraftCost,
    availability: &DrafterAvailability,
) -> Result<()> {
    let blocks = blocks(args.speculative.as_deref(), bench.model.max_exact_block())?;
    let most = blocks.iter().copied().max().unwrap_or(0);
    let threads = args.threads_list.iter().copied().max().unwrap_or(1);
    pool(threads)?.install(|| -> Result<()> {
        let mut plain = Session::open(&bench.model)?;
        let sequential = bench.runs(args.runs, &mut plain, prompt, None)?;
        let seq_rate = median(
            &sequential
                .iter()
                .map(GenerationResult::decode_tokens_per_second)
                .collect::<Vec<_>>(),
        );
        let seq_ids = sequential
            .first()
            .map(|r| r.token_ids.clone())
            .unwrap_or_default();
        // The reference runs one block past the measured tokens, so every proposal has one.
        let extra = most.min(
            bench
                .model
                .context()
                .saturating_sub(prompt.len() + args.gen_tokens),
        );
        let long = GenerationConfig::greedy(args.gen_tokens + extra);
        let reference_run = bench.once_with(&long, &mut plain, prompt, None)?;
        let mut reference = prompt.to_vec();
        reference.extend_from_slice(&reference_run.token_ids);
        let drafter = ProfileDrafter::new(
            reference,
            profile.clone(),
            bench.model.vocab(),
            args.seed,
            charged(bench, cost, availability)?,
        );
        let mut session = Session::open(&bench.model)?.with_drafter(Box::new(drafter));
        super::out!(
            "\nacceptance {profile}, draft cost {} ({threads} thread(s)): prompt {} tokens, {} \
             tokens, median of {} run(s); sequential {seq_rate:.2} tok/s",
            match cost {
                DraftCost::Mtp => "mtp (the MTP head's step per proposal)",
                DraftCost::Dflash => "dflash (the DFlash drafter's block pass)",
                DraftCost::Free => "free",
            },
            prompt.len(),
            args.gen_tokens,
            args.runs
        );
        super::out!(
            "{:>5} | {:>12} | {:>7} | {:>17} | {:>7} | {:>7} | {:>14} | {:>18} | {:>5}",
            "block",
            "decode tok/s",
            "ratio",
            "accepted/round",
            "bound",
            "model",
            "realized/model",
            "ms/round d+v+r",
            "same"
        );
        super::out!(
            "{:->5}-+-{:->12}-+-{:->7}-+-{:->17}-+-{:->7}-+-{:->7}-+-{:->14}-+-{:->18}-+-{:->5}",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            ""
        );
        for &k in &blocks {
            let results = bench.runs(args.runs, &mut session, prompt, Some(Speculative::new(k)))?;
            let rate = median(
                &results
                    .iter()
                    .map(GenerationResult::decode_tokens_per_second)
                    .collect::<Vec<_>>(),
            );
            // Every run's rounds together (the model and the cost column alike).
            let mut total = SpecStats::default();
            for s in results.iter().filter_map(|r| r.spec.as_ref()) {
                total.rounds += s.rounds;
                total.accepted += s.accepted;
                total.draft_seconds += s.draft_seconds;
                total.verify_seconds += s.verify_seconds;
                total.rollback_seconds += s.rollback_seconds;
            }
            let (rounds, accepted) = (total.rounds, total.accepted);
            let seconds = total.draft_seconds + total.verify_seconds + total.rollback_seconds;
            let expected = profile.expected_tokens(k);
            let ratio = rate / seq_rate.max(f64::MIN_POSITIVE);
            // Model: E_k tokens per round at the round's measured cost, against sequential.
            let model = if rounds > 0 && seconds > 0.0 {
                expected / (seconds / rounds as f64) / seq_rate.max(f64::MIN_POSITIVE)
            } else {
                0.0
            };
            let same = results.iter().all(|r| r.token_ids == seq_ids);
            super::out!(
                "{k:>5} | {rate:>12.2} | {:>7} | {:>17} | {:>7} | {:>7} | {:>14} | {:>18} | {:>5}",
                format!("{ratio:.2}x"),
                format!(
                    "{:.2} (exp {:.2})",
                    accepted as f64 / rounds.max(1) as f64,
                    expected - 1.0
                ),
                format!("{expected:.2}x"),
                format!("{model:.2}x"),
                if model > 0.0 {
                    format!("{:.0}%", 100.0 * ratio / model)
                } else {
                    "-".into()
                },
                super::round_costs(&total),
                if same { "yes" } else { "NO" }
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_name_the_flag_on_error() {
        assert_eq!(Profile::parse("oracle").unwrap(), Profile::Oracle);
        assert_eq!(
            Profile::parse("geometric:0.8").unwrap(),
            Profile::Geometric(0.8)
        );
        assert_eq!(
            Profile::parse("0.9, 0.8,0.7").unwrap(),
            Profile::List(vec![0.9, 0.8, 0.7])
        );
        for bad in ["geometric:1.5", "0.9,x", "", "geometric:"] {
            let e = Profile::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--acceptance"), "{bad}: {e}");
        }
    }

    #[test]
    fn expected_tokens_follow_the_profile() {
        assert_eq!(Profile::Oracle.expected_tokens(8), 9.0);
        let g = Profile::Geometric(0.5);
        assert!((g.expected_tokens(2) - 1.75).abs() < 1e-12);
        let l = Profile::List(vec![0.9, 0.5]);
        // 1 + 0.9 + 0.45 + 0.225 (the last value repeats).
        assert!((l.expected_tokens(3) - 2.575).abs() < 1e-12);
        assert_eq!(l.at(10), 0.5);
    }

    /// Counts the chooser's calls; chooses token 0.
    struct NoChoice;
    impl Chooser for NoChoice {
        fn choose(&mut self, _logits: &[f32], _context: &[u32]) -> u32 {
            0
        }
        fn plain_argmax(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_drafter_corrupts_at_the_profiles_rate() {
        let reference: Vec<u32> = (0..4000).map(|i| i % 50).collect();
        let profile = Profile::List(vec![1.0, 0.7, 0.2]);
        let mut d = ProfileDrafter::new(reference.clone(), profile, 50, 7, None);
        let mut right = [0usize; 3];
        let rounds = 1000;
        for r in 0..rounds {
            let start = 1 + r * 3;
            let proposals = d.propose(&reference[..start], 3, &mut NoChoice).unwrap();
            assert_eq!(proposals.len(), 3);
            for (i, &p) in proposals.iter().enumerate() {
                assert!(p < 50);
                right[i] += usize::from(p == reference[start + i]);
            }
        }
        assert_eq!(right[0], rounds, "a_1 = 1: never corrupted");
        let rate = |n: usize| n as f64 / rounds as f64;
        assert!((rate(right[1]) - 0.7).abs() < 0.05, "{}", rate(right[1]));
        assert!((rate(right[2]) - 0.2).abs() < 0.05, "{}", rate(right[2]));
        // Past the reference: no proposal.
        assert!(d.propose(&reference, 3, &mut NoChoice).unwrap().is_empty());
    }
}
