//! Options of the weight-free drafters, shared by every front end (CLI `--ngram-min`, `--ngram-max`,
//! `--suffix-memory`; the C API's `ngram_min`, `ngram_max`, `suffix_memory` keys): checked once here so
//! each refusal names the option, and applied when a plan's drafter is built ([`DrafterOptions::build`]).
//!
//! Invariant: a `DrafterOptions` value is always valid (the only constructor checks it), so building a
//! drafter from it cannot fail.

use drafters::ngram::{DEFAULT_MAX_N, DEFAULT_MIN_N, MAX_N_LIMIT};
use drafters::suffix::{DEFAULT_MEMORY_TOKENS, MAX_MEMORY_TOKENS, MIN_MEMORY_TOKENS};
use drafters::{NgramDrafter, SuffixDrafter};

use crate::error::RuntimeError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrafterOptions {
    ngram_min: usize,
    ngram_max: usize,
    suffix_memory: usize,
}

impl Default for DrafterOptions {
    fn default() -> Self {
        DrafterOptions {
            ngram_min: DEFAULT_MIN_N,
            ngram_max: DEFAULT_MAX_N,
            suffix_memory: DEFAULT_MEMORY_TOKENS,
        }
    }
}

impl DrafterOptions {
    /// The options given, the defaults for the others: n-gram sizes for prompt lookup (`ngram_min`
    /// given alone above the default largest size raises it to match) and the suffix drafter's bound
    /// in indexed tokens. A value out of range is an error naming its flag.
    pub fn new(
        ngram_min: Option<usize>,
        ngram_max: Option<usize>,
        suffix_memory: Option<usize>,
    ) -> Result<Self, RuntimeError> {
        let bad = |flag, value: usize, reason: String| {
            Err(RuntimeError::InvalidFlag {
                flag,
                value: value.to_string(),
                reason,
            })
        };
        let min = ngram_min.unwrap_or(DEFAULT_MIN_N);
        let max = ngram_max.unwrap_or(DEFAULT_MAX_N.max(min));
        if !(1..=MAX_N_LIMIT).contains(&min) {
            return bad("--ngram-min", min, format!("expected 1..={MAX_N_LIMIT}"));
        }
        if !(1..=MAX_N_LIMIT).contains(&max) {
            return bad("--ngram-max", max, format!("expected 1..={MAX_N_LIMIT}"));
        }
        if min > max {
            return bad(
                "--ngram-min",
                min,
                format!("must not exceed --ngram-max ({max})"),
            );
        }
        let memory = suffix_memory.unwrap_or(DEFAULT_MEMORY_TOKENS);
        if !(MIN_MEMORY_TOKENS..=MAX_MEMORY_TOKENS).contains(&memory) {
            return bad(
                "--suffix-memory",
                memory,
                format!("expected {MIN_MEMORY_TOKENS}..={MAX_MEMORY_TOKENS} indexed tokens"),
            );
        }
        Ok(DrafterOptions {
            ngram_min: min,
            ngram_max: max,
            suffix_memory: memory,
        })
    }

    /// `(min, max)` n-gram sizes of prompt lookup.
    pub fn ngram_sizes(&self) -> (usize, usize) {
        (self.ngram_min, self.ngram_max)
    }

    /// The suffix drafter's bound, in indexed tokens.
    pub fn suffix_memory(&self) -> usize {
        self.suffix_memory
    }

    pub(crate) fn ngram(&self) -> Box<dyn drafters::Drafter + Send> {
        Box::new(
            NgramDrafter::with_sizes(self.ngram_min, self.ngram_max)
                .expect("checked by DrafterOptions::new"),
        )
    }

    pub(crate) fn suffix(&self) -> SuffixDrafter {
        SuffixDrafter::with_memory(self.suffix_memory).expect("checked by DrafterOptions::new")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_errors_naming_the_flag() {
        let err = |a, b, c| DrafterOptions::new(a, b, c).unwrap_err().to_string();
        assert!(err(Some(0), None, None).contains("--ngram-min"));
        assert!(err(None, Some(0), None).contains("--ngram-max"));
        assert!(err(None, Some(65), None).contains("--ngram-max"));
        let e = err(Some(5), Some(4), None);
        assert!(
            e.contains("--ngram-min") && e.contains("--ngram-max (4)"),
            "{e}"
        );
        assert!(err(None, None, Some(10)).contains("--suffix-memory"));
        assert!(err(None, None, Some(usize::MAX)).contains("--suffix-memory"));
    }

    #[test]
    fn unnamed_options_take_the_defaults() {
        let d = DrafterOptions::new(None, None, None).unwrap();
        assert_eq!(d, DrafterOptions::default());
        assert_eq!(d.ngram_sizes(), (DEFAULT_MIN_N, DEFAULT_MAX_N));
        // A smallest size alone above the default largest raises the largest.
        let d = DrafterOptions::new(Some(5), None, Some(4096)).unwrap();
        assert_eq!((d.ngram_sizes(), d.suffix_memory()), ((5, 5), 4096));
        assert_eq!(
            DrafterOptions::new(None, Some(2), None)
                .unwrap()
                .ngram_sizes(),
            (1, 2)
        );
    }
}
