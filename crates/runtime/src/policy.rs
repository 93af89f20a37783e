//! Whether a run speculates, with which drafter and how many proposals per round: a pure decision
//! from the request (`--speculative auto|off|N`, `--drafter auto|mtp|dflash|ngram|suffix`), what the
//! checkpoint carries ([`DrafterAvailability`]). Pure so every branch is tested without a model;
//! the CLI, the server and the C API all call [`resolve`], so they cannot disagree.
//!
//! Rules:
//! - `off` never speculates, whatever is present.
//! - The two outcomes differ by who asked. A named block (`N`) is a promise the caller made (they
//!   are measuring), so failing to keep it is an error that names the reason: the missing
//!   drafter, or a block outside the drafter's range. `auto` means "speculate if you
//!   can": the same conditions yield [`SpeculationPlan::Disabled`] with a warning, which the front
//!   end prints once before running sequentially.
//! - Detecting a drafter is not enabling it: only `auto` (either flag) picks one by itself. The
//!   drafter `auto` prefers MTP when the checkpoint has the head (with an `auto` block, mixed round by
//!   round with the suffix drafter: `mtp+suffix`, `drafters::MtpOrSuffix`; a named block or
//!   `--drafter mtp` is MTP alone), else DFlash, else (with an `auto` block) the suffix drafter
//!   (`suffix`, which needs no weights, so a checkpoint without drafter weights still speculates, its
//!   block tuned down to plain steps where copying does not pay); it never picks prompt lookup
//!   (`ngram`), which serves every checkpoint too, but only when named.
//!   A named drafter is never swapped for another.
//! - Sampled requests are served by every drafter: a deterministic proposal is a point-mass q, and
//!   rejection sampling against it is exact (DESIGN.md §3). There is no temperature refusal here.
//! - Under `auto` the plan's block is where a run starts (`tune_up_to`: greedy runs then tune it within
//!   the drafter's range, tuner.rs); a named block is kept as named.

use std::fmt;
use std::str::FromStr;

use crate::error::RuntimeError;

/// Proposals per round for the MTP head under `auto`. Measured optimum of the seed runtime's MTP
/// drafter: 1.44x at block 2 against 1.03x at 4 and 0.71x at 8 (verify cost grows about linearly
/// with the block while acceptance decays along it). Re-measure when the drafter changes.
pub const MTP_DEFAULT_BLOCK: usize = 2;

/// Largest MTP block: chaining the head further than this only adds rejected work.
pub const MTP_MAX_BLOCK: usize = 16;

/// The largest DFlash block assumed when the drafter does not state its trained block size:
/// z-lab's released drafters use `block_size = 16` (`-b16`), an anchor plus 15 masks. Under
/// `auto`, DFlash proposes its whole trained block (`block_size - 1`), which is what z-lab's
/// reference decode verifies: the drafter's cost is one pass whatever the block.
pub const DFLASH_DEFAULT_MAX_BLOCK: usize = 15;

/// Proposals per round for prompt lookup under `auto` (where a greedy run's tuning starts, and what a
/// sampled run keeps). Its proposals cost nothing to draft, so the block is bounded by verify cost and
/// acceptance only. Measured on the testbed, CPU, 2 threads, its looping greedy output: a round of 4
/// proposals 3.3 ms, of 5-6 4.1-4.4 ms (the verify's cost steps up past 5 rows); blocks 4 and 8 both
/// 2.7x sequential, block 2 1.9x.
pub const NGRAM_DEFAULT_BLOCK: usize = 4;

/// Largest prompt-lookup block: the exactness cap the other drafters share (a copied run of more than
/// 16 tokens is proposed over several rounds).
pub const NGRAM_MAX_BLOCK: usize = 16;

/// Proposals per round for the suffix drafter under `auto`: a round's ceiling, since the drafter itself
/// proposes only as far as its match supports (at most twice the matched length), so a weak match
/// costs few verify rows whatever the block.
pub const SUFFIX_DEFAULT_BLOCK: usize = 8;

/// Largest suffix-drafter block: the exactness cap the other drafters share.
pub const SUFFIX_MAX_BLOCK: usize = 16;

/// `--speculative`: whether and how far a run drafts ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speculation {
    /// Speculate if the checkpoint can; otherwise warn and decode sequentially.
    #[default]
    Auto,
    /// Never speculate.
    Off,
    /// Propose this many tokens per round, or fail naming the reason.
    Block(usize),
}

impl FromStr for Speculation {
    type Err = RuntimeError;

    fn from_str(value: &str) -> Result<Self, RuntimeError> {
        let invalid = |reason: &str| RuntimeError::InvalidFlag {
            flag: "--speculative",
            value: value.to_string(),
            reason: reason.to_string(),
        };
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Speculation::Auto),
            "off" => Ok(Speculation::Off),
            number => match number.parse::<usize>() {
                Ok(0) => Err(invalid("a block of 0 proposes nothing; use `off`")),
                Ok(block) => Ok(Speculation::Block(block)),
                Err(_) => Err(invalid(
                    "expected `auto`, `off` or a number of proposals per round",
                )),
            },
        }
    }
}

impl fmt::Display for Speculation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Speculation::Auto => write!(f, "auto"),
            Speculation::Off => write!(f, "off"),
            Speculation::Block(n) => write!(f, "{n}"),
        }
    }
}

/// `--drafter`: which drafter [`Speculation`] drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrafterRequest {
    /// Whichever the checkpoint carries, MTP first, then DFlash; the suffix drafter without either.
    #[default]
    Auto,
    Mtp,
    Dflash,
    /// Prompt lookup: copies what followed an earlier occurrence of the history's last n-gram.
    Ngram,
    /// The suffix drafter: the most frequent continuation of the history's suffix, in this and
    /// earlier requests.
    Suffix,
}

impl FromStr for DrafterRequest {
    type Err = RuntimeError;

    fn from_str(value: &str) -> Result<Self, RuntimeError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DrafterRequest::Auto),
            "mtp" => Ok(DrafterRequest::Mtp),
            "dflash" => Ok(DrafterRequest::Dflash),
            "ngram" => Ok(DrafterRequest::Ngram),
            "suffix" => Ok(DrafterRequest::Suffix),
            _ => Err(RuntimeError::InvalidFlag {
                flag: "--drafter",
                value: value.to_string(),
                reason: "expected `auto`, `mtp`, `dflash`, `ngram` or `suffix`".to_string(),
            }),
        }
    }
}

impl fmt::Display for DrafterRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(request_name(*self))
    }
}

/// A drafter a plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafter {
    /// The checkpoint's multi-token-prediction head (`mtp.*`): one token per draft step.
    Mtp,
    /// A DFlash block drafter: a whole block in one pass.
    Dflash,
    /// Prompt lookup (`drafters::NgramDrafter`): no weights, any checkpoint.
    Ngram,
    /// The suffix drafter (`drafters::SuffixDrafter`): no weights, any checkpoint.
    Suffix,
    /// `auto` with an MTP head (`drafters::MtpOrSuffix`): each round the MTP head's proposal or the
    /// suffix drafter's, whichever is expected to commit more.
    MtpSuffix,
}

impl fmt::Display for Drafter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drafter::Mtp => write!(f, "mtp"),
            Drafter::Dflash => write!(f, "dflash"),
            Drafter::Ngram => write!(f, "ngram"),
            Drafter::Suffix => write!(f, "suffix"),
            Drafter::MtpSuffix => write!(f, "mtp+suffix"),
        }
    }
}

/// What the loaded checkpoint carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DrafterAvailability {
    /// The checkpoint has MTP weights (`mtp_num_hidden_layers > 0` and `mtp.*` tensors).
    pub mtp: bool,
    /// A DFlash drafter was found for this target.
    pub dflash: bool,
    /// The DFlash drafter's most proposals per round, `block_size - 1` from its config; `None`
    /// when unknown ([`DFLASH_DEFAULT_MAX_BLOCK`] is assumed).
    pub dflash_max_block: Option<usize>,
}

impl DrafterAvailability {
    fn has(&self, drafter: Drafter) -> bool {
        match drafter {
            Drafter::Mtp | Drafter::MtpSuffix => self.mtp,
            Drafter::Dflash => self.dflash,
            Drafter::Ngram | Drafter::Suffix => true,
        }
    }

    /// `(default block under auto, largest allowed block)` for `drafter`.
    fn blocks(&self, drafter: Drafter) -> (usize, usize) {
        match drafter {
            Drafter::Mtp | Drafter::MtpSuffix => (MTP_DEFAULT_BLOCK, MTP_MAX_BLOCK),
            Drafter::Dflash => {
                let max = self.dflash_max_block.unwrap_or(DFLASH_DEFAULT_MAX_BLOCK);
                (max, max)
            }
            Drafter::Ngram => (NGRAM_DEFAULT_BLOCK, NGRAM_MAX_BLOCK),
            Drafter::Suffix => (SUFFIX_DEFAULT_BLOCK, SUFFIX_MAX_BLOCK),
        }
    }
}

/// The decision, made once per run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpeculationPlan {
    Enabled {
        drafter: Drafter,
        block: usize,
        /// Under `auto`: the run may tune its block within 0..=this as it measures (tuner.rs; 0:
        /// plain steps), starting at `block`. `None` for a named block, which is kept.
        tune_up_to: Option<usize>,
    },
    /// `warning` is `Some` when the caller asked for `auto` and may have expected speculation;
    /// `None` when they asked for `off`.
    Disabled { warning: Option<String> },
}

/// Decides speculation for a run (see the module doc for the rules).
pub fn resolve(
    speculation: Speculation,
    drafter: DrafterRequest,
    availability: &DrafterAvailability,
) -> Result<SpeculationPlan, RuntimeError> {
    let named_block = match speculation {
        Speculation::Off => return Ok(SpeculationPlan::Disabled { warning: None }),
        Speculation::Auto => None,
        Speculation::Block(n) => Some(n),
    };
    let chosen = choose_drafter(drafter, availability, named_block.is_none()).and_then(|chosen| {
        let (default_block, max_block) = availability.blocks(chosen);
        let block = named_block.unwrap_or(default_block);
        if (1..=max_block).contains(&block) {
            Ok((chosen, block, max_block))
        } else if max_block == 0 {
            Err(format!(
                "the {chosen} drafter's trained block has no room for a proposal (block_size 1)"
            ))
        } else {
            Err(format!(
                "block {block} is outside the {chosen} drafter's allowed range 1..={max_block}"
            ))
        }
    });
    match (chosen, named_block) {
        (Ok((drafter, block, max)), named) => Ok(SpeculationPlan::Enabled {
            drafter,
            block,
            tune_up_to: named.is_none().then_some(max),
        }),
        (Err(reason), None) => Ok(SpeculationPlan::Disabled {
            warning: Some(format!(
                "speculative decoding is off for this run ({reason}); decoding sequentially"
            )),
        }),
        (Err(reason), Some(block)) => Err(RuntimeError::SpeculationUnavailable {
            request: format!("--speculative {block} (drafter {})", request_name(drafter)),
            reason,
        }),
    }
}

/// The drafter to run, or why there is none. `auto_block`: the block is `auto` too, the only case in
/// which `auto` mixes the suffix drafter into MTP's rounds or falls back to it (a named block measures
/// the checkpoint's own drafter).
fn choose_drafter(
    request: DrafterRequest,
    availability: &DrafterAvailability,
    auto_block: bool,
) -> Result<Drafter, String> {
    let named = |drafter: Drafter, missing: &str| {
        if availability.has(drafter) {
            Ok(drafter)
        } else {
            Err(missing.to_string())
        }
    };
    match request {
        DrafterRequest::Mtp => named(
            Drafter::Mtp,
            "this checkpoint has no MTP head (no `mtp.*` weights or mtp_num_hidden_layers = 0)",
        ),
        DrafterRequest::Dflash => named(
            Drafter::Dflash,
            "no DFlash drafter was found for this model",
        ),
        DrafterRequest::Ngram => Ok(Drafter::Ngram),
        DrafterRequest::Suffix => Ok(Drafter::Suffix),
        DrafterRequest::Auto if availability.mtp && auto_block => Ok(Drafter::MtpSuffix),
        DrafterRequest::Auto if availability.mtp => Ok(Drafter::Mtp),
        DrafterRequest::Auto if availability.dflash => Ok(Drafter::Dflash),
        DrafterRequest::Auto if auto_block => Ok(Drafter::Suffix),
        DrafterRequest::Auto => {
            Err("this checkpoint has no MTP head and no DFlash drafter was found".to_string())
        }
    }
}

fn request_name(request: DrafterRequest) -> &'static str {
    match request {
        DrafterRequest::Auto => "auto",
        DrafterRequest::Mtp => "mtp",
        DrafterRequest::Dflash => "dflash",
        DrafterRequest::Ngram => "ngram",
        DrafterRequest::Suffix => "suffix",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: DrafterAvailability = DrafterAvailability {
        mtp: false,
        dflash: false,
        dflash_max_block: None,
    };
    const MTP: DrafterAvailability = DrafterAvailability { mtp: true, ..NONE };
    const DFLASH8: DrafterAvailability = DrafterAvailability {
        dflash: true,
        dflash_max_block: Some(7),
        ..NONE
    };
    const BOTH: DrafterAvailability = DrafterAvailability {
        mtp: true,
        dflash: true,
        dflash_max_block: Some(7),
    };

    fn enabled(drafter: Drafter, block: usize) -> SpeculationPlan {
        SpeculationPlan::Enabled {
            drafter,
            block,
            tune_up_to: None,
        }
    }

    fn tuned(drafter: Drafter, block: usize, max: usize) -> SpeculationPlan {
        SpeculationPlan::Enabled {
            drafter,
            block,
            tune_up_to: Some(max),
        }
    }

    fn warning(plan: SpeculationPlan) -> String {
        match plan {
            SpeculationPlan::Disabled { warning: Some(w) } => w,
            other => panic!("expected a warned Disabled plan, got {other:?}"),
        }
    }

    fn refusal(result: Result<SpeculationPlan, RuntimeError>) -> String {
        match result {
            Err(e @ RuntimeError::SpeculationUnavailable { .. }) => e.to_string(),
            other => panic!("expected SpeculationUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn parses_flags_and_names_the_flag_on_error() {
        assert_eq!("auto".parse::<Speculation>().unwrap(), Speculation::Auto);
        assert_eq!(" OFF ".parse::<Speculation>().unwrap(), Speculation::Off);
        assert_eq!("3".parse::<Speculation>().unwrap(), Speculation::Block(3));
        for bad in ["0", "-1", "two", ""] {
            let err = bad.parse::<Speculation>().unwrap_err().to_string();
            assert!(err.contains("--speculative"), "{err}");
        }
        assert_eq!(
            "mtp".parse::<DrafterRequest>().unwrap(),
            DrafterRequest::Mtp
        );
        assert_eq!(
            "DFlash".parse::<DrafterRequest>().unwrap(),
            DrafterRequest::Dflash
        );
        assert_eq!(
            "auto".parse::<DrafterRequest>().unwrap(),
            DrafterRequest::Auto
        );
        assert_eq!(
            " NGram".parse::<DrafterRequest>().unwrap(),
            DrafterRequest::Ngram
        );
        let err = "eagle".parse::<DrafterRequest>().unwrap_err().to_string();
        assert!(err.contains("--drafter") && err.contains("eagle"), "{err}");
        assert!(err.contains("ngram") && err.contains("suffix"), "{err}");
        for request in [
            DrafterRequest::Auto,
            DrafterRequest::Mtp,
            DrafterRequest::Dflash,
            DrafterRequest::Ngram,
            DrafterRequest::Suffix,
        ] {
            assert_eq!(
                request.to_string().parse::<DrafterRequest>().unwrap(),
                request
            );
        }
    }

    #[test]
    fn weight_free_drafters_serve_every_checkpoint_but_only_when_named() {
        let arms = [
            (
                DrafterRequest::Ngram,
                Drafter::Ngram,
                NGRAM_DEFAULT_BLOCK,
                NGRAM_MAX_BLOCK,
            ),
            (
                DrafterRequest::Suffix,
                Drafter::Suffix,
                SUFFIX_DEFAULT_BLOCK,
                SUFFIX_MAX_BLOCK,
            ),
        ];
        for (request, drafter, default_block, max_block) in arms {
            // No weights needed: a dense checkpoint without drafters speculates with it.
            for availability in [NONE, MTP, DFLASH8, BOTH] {
                let plan = resolve(Speculation::Auto, request, &availability).unwrap();
                assert_eq!(plan, tuned(drafter, default_block, max_block));
                let plan = resolve(Speculation::Block(5), request, &availability);
                assert_eq!(plan.unwrap(), enabled(drafter, 5));
            }
            // Its block range is the exactness cap.
            assert_eq!(
                resolve(Speculation::Block(16), request, &NONE).unwrap(),
                enabled(drafter, 16)
            );
            let e = refusal(resolve(Speculation::Block(17), request, &NONE));
            assert!(
                e.contains(&format!("--speculative 17 (drafter {drafter})"))
                    && e.contains(&format!(
                        "outside the {drafter} drafter's allowed range 1..=16"
                    )),
                "{e}"
            );
        }
        // `auto` picks the suffix drafter only for a checkpoint without drafter weights, never prompt
        // lookup, and never swaps a named drafter for either.
        let suffix = tuned(Drafter::Suffix, SUFFIX_DEFAULT_BLOCK, SUFFIX_MAX_BLOCK);
        assert_eq!(
            resolve(Speculation::Auto, DrafterRequest::Auto, &NONE).unwrap(),
            suffix
        );
        // A named block measures the checkpoint's own drafter: none here.
        let e = refusal(resolve(Speculation::Block(2), DrafterRequest::Auto, &NONE));
        assert!(
            e.contains("--speculative 2") && e.contains("no MTP head and no DFlash"),
            "{e}"
        );
        for availability in [MTP, DFLASH8, BOTH] {
            let plan = resolve(Speculation::Auto, DrafterRequest::Auto, &availability).unwrap();
            assert_ne!(plan, suffix);
        }
        let w = warning(resolve(Speculation::Auto, DrafterRequest::Mtp, &NONE).unwrap());
        assert!(w.contains("no MTP head"), "{w}");
    }

    #[test]
    fn off_never_speculates_even_with_drafters_present() {
        for request in [
            DrafterRequest::Auto,
            DrafterRequest::Mtp,
            DrafterRequest::Dflash,
            DrafterRequest::Ngram,
            DrafterRequest::Suffix,
        ] {
            let plan = resolve(Speculation::Off, request, &BOTH).unwrap();
            assert_eq!(plan, SpeculationPlan::Disabled { warning: None });
        }
    }

    #[test]
    fn auto_prefers_mtp_mixed_with_the_suffix_drafter_at_its_measured_block() {
        let plan = resolve(Speculation::Auto, DrafterRequest::Auto, &BOTH).unwrap();
        assert_eq!(plan, tuned(Drafter::MtpSuffix, 2, MTP_MAX_BLOCK));
        let plan = resolve(Speculation::Auto, DrafterRequest::Auto, &MTP).unwrap();
        assert_eq!(plan, tuned(Drafter::MtpSuffix, 2, MTP_MAX_BLOCK));
        // A named block, or MTP named, is MTP alone.
        let plan = resolve(Speculation::Block(3), DrafterRequest::Auto, &MTP).unwrap();
        assert_eq!(plan, enabled(Drafter::Mtp, 3));
        let plan = resolve(Speculation::Auto, DrafterRequest::Mtp, &MTP).unwrap();
        assert_eq!(plan, tuned(Drafter::Mtp, 2, MTP_MAX_BLOCK));
    }

    #[test]
    fn auto_falls_back_to_dflash_at_its_trained_block() {
        let plan = resolve(Speculation::Auto, DrafterRequest::Auto, &DFLASH8).unwrap();
        assert_eq!(plan, tuned(Drafter::Dflash, 7, 7));
        let unknown = DrafterAvailability {
            dflash_max_block: None,
            ..DFLASH8
        };
        let plan = resolve(Speculation::Auto, DrafterRequest::Auto, &unknown).unwrap();
        let max = DFLASH_DEFAULT_MAX_BLOCK;
        assert_eq!(plan, tuned(Drafter::Dflash, max, max));
    }

    #[test]
    fn a_named_drafter_is_used_even_when_auto_would_pick_the_other() {
        let plan = resolve(Speculation::Auto, DrafterRequest::Dflash, &BOTH).unwrap();
        assert_eq!(plan, tuned(Drafter::Dflash, 7, 7));
        // A named block is kept: no tuning.
        let plan = resolve(Speculation::Block(3), DrafterRequest::Mtp, &BOTH).unwrap();
        assert_eq!(plan, enabled(Drafter::Mtp, 3));
    }

    #[test]
    fn auto_with_nothing_servable_warns_and_disables() {
        let w = warning(resolve(Speculation::Auto, DrafterRequest::Mtp, &DFLASH8).unwrap());
        assert!(w.contains("no MTP head"), "{w}");
        let w = warning(resolve(Speculation::Auto, DrafterRequest::Dflash, &MTP).unwrap());
        assert!(w.contains("no DFlash drafter"), "{w}");
        let zero = DrafterAvailability {
            dflash_max_block: Some(0),
            ..DFLASH8
        };
        let w = warning(resolve(Speculation::Auto, DrafterRequest::Auto, &zero).unwrap());
        assert!(w.contains("block_size 1"), "{w}");
    }

    #[test]
    fn a_named_block_that_cannot_be_served_is_an_error_naming_the_reason() {
        let e = refusal(resolve(
            Speculation::Block(2),
            DrafterRequest::Mtp,
            &DFLASH8,
        ));
        assert!(e.contains("no MTP head"), "{e}");
        let e = refusal(resolve(Speculation::Block(2), DrafterRequest::Dflash, &MTP));
        assert!(e.contains("no DFlash drafter"), "{e}");
    }

    #[test]
    fn named_blocks_are_checked_against_each_drafters_range() {
        assert_eq!(
            resolve(Speculation::Block(16), DrafterRequest::Mtp, &MTP).unwrap(),
            enabled(Drafter::Mtp, 16)
        );
        let e = refusal(resolve(Speculation::Block(17), DrafterRequest::Mtp, &MTP));
        assert!(
            e.contains("outside the mtp drafter's allowed range 1..=16"),
            "{e}"
        );
        assert_eq!(
            resolve(Speculation::Block(7), DrafterRequest::Auto, &DFLASH8).unwrap(),
            enabled(Drafter::Dflash, 7)
        );
        let e = refusal(resolve(
            Speculation::Block(8),
            DrafterRequest::Auto,
            &DFLASH8,
        ));
        assert!(
            e.contains("outside the dflash drafter's allowed range 1..=7"),
            "{e}"
        );
        // Block 0 cannot come from the parser, but the API is public: it is refused, not run.
        let e = refusal(resolve(Speculation::Block(0), DrafterRequest::Mtp, &MTP));
        assert!(e.contains("block 0"), "{e}");
    }
}
