//! Token choice: how a row of logits becomes a token under the request's shaping (argmax at temperature
//! 0, else a draw with the next counter value of the seeded generator), for the target's rows and, as the
//! drafters' `Chooser`, for their proposals. The distribution of every sampled proposal is kept so the
//! judge can ratio against it (q of rejection sampling).

use drafters::Chooser;
use families::{Backend, ForwardOut};
use sampling::{DrawCounter, ShapedDistribution, Shaping};

use crate::error::RuntimeError;
use crate::logprobs::{token_logprob, TokenLogprob};

/// Largest top-k whose rows may come back as candidates (`Selector::candidates`: 2 top-k of them).
const CANDIDATES_TOP_K_MAX: usize = 256;

/// Chooses tokens from logits with the request's shaping: argmax at temperature 0, else a draw with the
/// next counter value; remembers the distribution of every draw so the verifier can ratio against it.
pub(super) struct Selector<'a> {
    pub(super) shaping: &'a Shaping,
    pub(super) draws: DrawCounter,
    pub(super) prompt_len: usize,
    /// q of each proposal of the current round (sampled only).
    pub(super) drafted: Vec<ShapedDistribution>,
    pub(super) error: Option<RuntimeError>,
    /// `Some(n)`: committed tokens get log-probability entries with n alternatives, so every row
    /// must come back whole (no argmax-only or candidate rows).
    pub(super) logprobs: Option<usize>,
}

impl Selector<'_> {
    pub(super) fn distribution(
        &self,
        logits: &[f32],
        history: &[u32],
    ) -> Result<ShapedDistribution, RuntimeError> {
        let generated = history.len().saturating_sub(self.prompt_len);
        Ok(ShapedDistribution::new(
            logits,
            self.shaping,
            sampling::History::new(history, generated)?,
        )?)
    }

    /// `Wanted::candidates` for this shaping: twice top-k for a top-k request without penalties (its rows
    /// shape from the backend's candidates: 40 values of a 151936-logit row for Qwen3's card), else 0.
    pub(super) fn candidates(&self) -> usize {
        if self.logprobs.is_some() {
            return 0;
        }
        let s = self.shaping;
        let k = s.top_k as usize;
        match !s.is_greedy() && !s.has_penalties() && (1..=CANDIDATES_TOP_K_MAX).contains(&k) {
            true => 2 * k,
            false => 0,
        }
    }

    /// Whether every row of `out` that came back as candidates shapes from them (else the rows are
    /// needed: `settle_candidates`).
    pub(super) fn candidates_answer(
        &self,
        out: &ForwardOut,
        vocab: usize,
    ) -> Result<bool, RuntimeError> {
        for c in out.candidates.iter().flatten() {
            if ShapedDistribution::from_candidates(vocab, &c.ids, &c.logits, self.shaping)?
                .is_none()
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The distribution of returned row `i` of a forward: the point mass at the backend's argmax when it
    /// answered `Wanted::argmax_only` with one (only asked for a plain-argmax shaping), the top-k
    /// distribution of its candidates when it answered `Wanted::candidates` (the row's bits), else
    /// shaped from the row's logits.
    pub(super) fn row_distribution(
        &self,
        out: &ForwardOut,
        i: usize,
        vocab: usize,
        history: &[u32],
    ) -> Result<ShapedDistribution, RuntimeError> {
        if let Some(rows) = &out.candidates {
            let c = rows.get(i).ok_or_else(|| {
                RuntimeError::Device(
                    format!(
                        "the backend returned {} candidate rows, row {i} was asked for",
                        rows.len()
                    )
                    .into(),
                )
            })?;
            return ShapedDistribution::from_candidates(vocab, &c.ids, &c.logits, self.shaping)?
                .ok_or_else(|| {
                    RuntimeError::Device(format!("row {i}'s candidates do not shape it").into())
                });
        }
        match &out.argmax {
            Some(ids) => {
                let token = ids.get(i).copied().ok_or_else(|| {
                    RuntimeError::Device(
                        format!(
                            "the backend returned {} argmax rows, row {i} was asked for",
                            ids.len()
                        )
                        .into(),
                    )
                })?;
                Ok(ShapedDistribution::point_mass(token, vocab)?)
            }
            None => self.distribution(out.row(i), history),
        }
    }

    /// The log-probability entry of `token` chosen from row `i` of `out`, when the request asked.
    pub(super) fn score(
        &self,
        out: &ForwardOut,
        i: usize,
        token: u32,
        vocab: usize,
    ) -> Result<Option<TokenLogprob>, RuntimeError> {
        let Some(top) = self.logprobs else {
            return Ok(None);
        };
        if out.logits.len() < (i + 1) * vocab {
            return Err(RuntimeError::Device(
                format!(
                    "logprobs need logits row {i}; the backend returned {} logits",
                    out.logits.len()
                )
                .into(),
            ));
        }
        Ok(Some(token_logprob(
            &out.logits[i * vocab..(i + 1) * vocab],
            token,
            top,
        )))
    }

    pub(super) fn pick(&mut self, dist: &ShapedDistribution) -> u32 {
        match dist.as_point_mass() {
            Some(t) => t,
            None => dist.draw(self.draws.next()),
        }
    }
}

impl Chooser for Selector<'_> {
    fn choose(&mut self, logits: &[f32], context: &[u32]) -> u32 {
        match self.distribution(logits, context) {
            Ok(q) => {
                let t = self.pick(&q);
                if q.as_point_mass().is_none() {
                    self.drafted.push(q);
                }
                t
            }
            Err(e) => {
                self.error.get_or_insert(e);
                0
            }
        }
    }

    fn plain_argmax(&self) -> bool {
        self.shaping.is_plain_argmax()
    }
}

/// Rows that came back as candidates stay so when every one of them shapes from its candidates; else
/// they come back whole (`Backend::last_logits`; rare: top-k keeping a value below the candidates).
pub(super) fn settle_candidates<B: Backend>(
    model: &B,
    state: &mut B::State,
    out: &mut ForwardOut,
    sel: &Selector<'_>,
    vocab: usize,
) -> Result<(), RuntimeError> {
    if out.candidates.is_none() || sel.candidates_answer(out, vocab)? {
        return Ok(());
    }
    let logits = model.last_logits(state)?.ok_or_else(|| {
        RuntimeError::Device("the backend answered with candidates but kept no rows".into())
    })?;
    if logits.len() != out.rows * vocab {
        return Err(RuntimeError::Device(
            format!(
                "the backend kept {} logits for {} rows",
                logits.len(),
                out.rows
            )
            .into(),
        ));
    }
    out.logits = logits;
    out.candidates = None;
    Ok(())
}
