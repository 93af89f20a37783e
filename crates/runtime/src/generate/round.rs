//! The steps of one decode round after `next` is committed: [`draft`] k proposals, [`verify`]
//! [next, d₁..d_k] in one forward, [`judge`] the proposals in order against the target's rows,
//! [`roll_back`] the state to the rows whose successors were committed, and let the drafter
//! [`observe`] the kept rows' taps. A round with no proposals is a plain decode step through the same
//! functions.
//!
//! Invariant after a round: `state.position() == history.len() - 1` (only the chosen next token is
//! unrun) and the drafter has observed exactly the kept rows.

use std::time::Instant;

use families::{Backend, BackendState, ForwardOut, Rows, Tap, Wanted};
use sampling::{Draft, Verdict};

use super::forward_rows;
use super::select::{settle_candidates, Selector};
use super::{Acceptance, Rollback};
use crate::error::RuntimeError;
use crate::logprobs::TokenLogprob;
use crate::session::Session;
use crate::sink::TokenSink;

/// A round's proposals and what drafting them cost.
pub(super) struct Drafted {
    pub proposals: Vec<u32>,
    pub seconds: f64,
}

/// The session's drafter's proposals for a model-drafted block of `k` and at most `limit` tokens
/// (`Drafter::propose_within`: copies may use the room; none without a drafter or room), chosen with the
/// request's shaping (`Selector` as the drafter's `Chooser`: sampled proposals keep their q).
pub(super) fn draft<S: BackendState>(
    session: &mut Session<S>,
    sel: &mut Selector<'_>,
    history: &[u32],
    k: usize,
    limit: usize,
) -> Result<Drafted, RuntimeError> {
    let start = Instant::now();
    sel.drafted.clear();
    let proposals = match (limit.max(k), session.drafter.as_mut()) {
        (0, _) | (_, None) => Vec::new(),
        (_, Some(d)) => d.propose_within(history, k, limit.max(k), sel)?,
    };
    if let Some(e) = sel.error.take() {
        return Err(e);
    }
    Ok(Drafted {
        proposals,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The verify forward of a round and what rolling it back needs.
pub(super) struct Verified<Snap> {
    /// [next, proposals...]: the rows run, from position `base`.
    pub feed: Vec<u32>,
    pub base: usize,
    pub out: ForwardOut,
    /// The state before the round, when the rollback is by snapshot.
    pub snapshot: Option<Snap>,
    pub seconds: f64,
}

/// Runs [next, proposals] in one forward from `base`, recording a tape (or taking a snapshot) first
/// when there are proposals to roll back; every row's logits (or argmax / candidates) and taps return.
#[allow(clippy::too_many_arguments)]
pub(super) fn verify<B: Backend>(
    model: &B,
    session: &mut Session<B::State>,
    sel: &Selector<'_>,
    next: u32,
    proposals: &[u32],
    base: usize,
    rollback: Rollback,
    taps: &[Tap],
    argmax_only: bool,
) -> Result<Verified<<B::State as BackendState>::Snapshot>, RuntimeError> {
    let start = Instant::now();
    let mut feed = Vec::with_capacity(proposals.len() + 1);
    feed.push(next);
    feed.extend_from_slice(proposals);
    let snapshot =
        (!proposals.is_empty() && rollback == Rollback::Snapshot && session.state.is_recurrent())
            .then(|| session.state.save())
            .transpose()?;
    if !proposals.is_empty() && rollback == Rollback::Tape {
        model.begin_tape(&mut session.state)?;
    }
    let wanted = Wanted {
        logits: Rows::All,
        taps: taps.to_vec(),
        argmax_only,
        candidates: sel.candidates(),
    };
    let mut out = forward_rows(model, &feed, base, &mut session.state, &wanted)?;
    settle_candidates(model, &mut session.state, &mut out, sel, model.vocab())?;
    session.tokens.extend_from_slice(&feed);
    Ok(Verified {
        feed,
        base,
        out,
        snapshot,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The outcome of judging a round's proposals.
pub(super) struct Judgement {
    pub accepted: usize,
    pub judged: usize,
    /// A stop rule fired on a committed proposal.
    pub stopped: bool,
    /// The token after the accepted ones (the replacement of the first rejected proposal, or the
    /// bonus token of the last row), unless a stop fired.
    pub chosen: Option<u32>,
    /// The log-probability entry of `chosen`, when the request asked.
    pub chosen_logprob: Option<TokenLogprob>,
}

impl Judgement {
    /// Rows whose successor is committed: `next` and the accepted proposals, less the last one if a
    /// stop fell on it (committed but, like every final token, never run).
    pub fn keep(&self) -> usize {
        if self.stopped {
            self.accepted
        } else {
            self.accepted + 1
        }
    }
}

/// Judges the proposals in order, committing each accepted one before judging the next (so shaping
/// that depends on history sees what a sequential decode would): row i's distribution p against
/// proposal i (`sampling::verify_step`: greedy accepts iff it is p's argmax; sampled accepts iff
/// r·q(d) ≤ p(d), else draws from the residual). If all pass, the last row gives the bonus token.
pub(super) fn judge(
    sel: &mut Selector<'_>,
    sink: &mut TokenSink<'_>,
    out: &ForwardOut,
    proposals: &[u32],
    acceptance: Acceptance,
    vocab: usize,
) -> Result<Judgement, RuntimeError> {
    let mut j = Judgement {
        accepted: 0,
        judged: 0,
        stopped: false,
        chosen: None,
        chosen_logprob: None,
    };
    for (i, &d) in proposals.iter().enumerate() {
        let p = sel.row_distribution(out, i, vocab, sink.history())?;
        j.judged += 1;
        let draft = match sel.drafted.get(i) {
            Some(q) => Draft::Distribution(q),
            None => Draft::PointMass,
        };
        let (r, u) = (sel.draws.next(), sel.draws.next());
        match sampling::verify_step(&p, draft, d, r, u)? {
            Verdict::Accepted => {
                j.accepted += 1;
                if sink
                    .commit_scored(d, sel.score(out, i, d, vocab)?)?
                    .is_some()
                {
                    j.stopped = true;
                    return Ok(j);
                }
            }
            Verdict::Rejected { replacement } => {
                let t = match acceptance {
                    Acceptance::Exact => replacement,
                    #[cfg(feature = "negative-control")]
                    Acceptance::ResampleTargetOnReject => sel.pick(&p),
                };
                j.chosen_logprob = sel.score(out, i, t, vocab)?;
                j.chosen = Some(t);
                return Ok(j);
            }
        }
    }
    let p = sel.row_distribution(out, proposals.len(), vocab, sink.history())?;
    let t = sel.pick(&p);
    j.chosen_logprob = sel.score(out, proposals.len(), t, vocab)?;
    j.chosen = Some(t);
    Ok(j)
}

/// Keeps the first `keep` verified rows in the state: by restoring the snapshot and re-running them,
/// by replaying the tape (recurrent layers) with the KV cursor moved back, or by the cursor alone.
/// Ends the round's tape. Returns whether anything was rolled back.
pub(super) fn roll_back<B: Backend>(
    model: &B,
    session: &mut Session<B::State>,
    verified: &Verified<<B::State as BackendState>::Snapshot>,
    keep: usize,
) -> Result<bool, RuntimeError> {
    let (feed, base) = (&verified.feed, verified.base);
    let rolled_back = keep < feed.len();
    if rolled_back {
        match &verified.snapshot {
            Some(snap) => {
                session.state.restore(snap)?;
                forward_rows(
                    model,
                    &feed[..keep],
                    base,
                    &mut session.state,
                    &Wanted::none(),
                )?;
            }
            None if session.state.has_tape() => {
                model.rollback_retaining(&mut session.state, keep)?;
            }
            None => {
                session.state.rewind(base + keep);
            }
        }
        session.tokens.truncate(base + keep);
    }
    session.state.end_tape();
    Ok(rolled_back)
}

/// When the run speculates (`drafting`), the drafter observes the kept rows' taps (none, for a drafter
/// that asks for none), each row with its successor (the last kept row's is the chosen token, unless a
/// stop fell on the last proposal).
pub(super) fn observe<S: BackendState, Snap>(
    session: &mut Session<S>,
    verified: &Verified<Snap>,
    judgement: &Judgement,
    history: &[u32],
    drafting: bool,
) -> Result<(), RuntimeError> {
    let keep = judgement.keep();
    let out = &verified.out;
    let Some(d) = session.drafter.as_mut().filter(|_| drafting && keep > 0) else {
        return Ok(());
    };
    let hd = out
        .taps
        .first()
        .map_or(0, |t| t.len() / verified.feed.len());
    let kept: Vec<Vec<f32>> = out.taps.iter().map(|t| t[..keep * hd].to_vec()).collect();
    let follow: Vec<u32> = if judgement.stopped {
        history[history.len() - keep..].to_vec()
    } else {
        let mut f = history[history.len() - (keep - 1)..].to_vec();
        f.extend(judgement.chosen);
        f
    };
    d.observe(&kept, keep, &follow)?;
    Ok(())
}
