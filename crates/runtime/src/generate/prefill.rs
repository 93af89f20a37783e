//! Prefill: the prompt's uncovered tokens run through the model in chunks of `Backend::prefill_chunk`
//! rows, the last chunk returning the last row's logits. When the run speculates, the drafter observes
//! every chunk's taps (none, for a drafter that asks for none) with each row's successor; the last
//! chunk's taps wait for the first generated token (`Pending`).
//! Hybrids split off the prompt's last token so the state before it is kept as the session's fork point.
//! Cancellation is polled after every chunk.

use std::time::Instant;

use families::{Backend, BackendState, ForwardOut, Rows, Tap, Wanted};

use super::forward_rows;
use super::select::{settle_candidates, Selector};
use crate::error::RuntimeError;
use crate::session::Session;
use crate::sink::TokenSink;

/// The last chunk's taps, waiting for the first generated token: (taps, rows, first position).
pub(super) type PendingTaps = (Vec<Vec<f32>>, usize, usize);

/// What prefill leaves for the decode loop.
pub(super) struct Prefilled {
    /// The last chunk's forward (its last row judges the first generated token).
    pub last_out: ForwardOut,
    pub pending_taps: Option<PendingTaps>,
    /// Prompt tokens the session already covered.
    pub reused: usize,
    pub seconds: f64,
    /// Cancelled (or stopped) during prefill.
    pub stopped: bool,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn prefill<B: Backend>(
    model: &B,
    session: &mut Session<B::State>,
    sink: &mut TokenSink<'_>,
    sel: &Selector<'_>,
    prompt: &[u32],
    taps: &[Tap],
    drafting: bool,
    argmax_only: bool,
    reach: usize,
) -> Result<Prefilled, RuntimeError> {
    let start = Instant::now();
    let reused = session.reuse(prompt)?;
    model.reserve(&mut session.state, reach.min(model.context()))?;
    let hybrid_fork = session.state.is_recurrent() && prompt.len() - reused > 1;
    let vocab = model.vocab();
    let chunk = model.prefill_chunk().max(1);
    let mut last_out = ForwardOut::default();
    let mut pending_taps = None;
    let mut pos = reused;
    while pos < prompt.len() {
        let end_limit = if hybrid_fork && pos < prompt.len() - 1 {
            prompt.len() - 1
        } else {
            prompt.len()
        };
        let end = (pos + chunk).min(end_limit);
        let last = end == prompt.len();
        let wanted = Wanted {
            logits: if last { Rows::Last } else { Rows::None },
            taps: taps.to_vec(),
            argmax_only,
            candidates: sel.candidates(),
        };
        let mut out = forward_rows(model, &prompt[pos..end], pos, &mut session.state, &wanted)?;
        settle_candidates(model, &mut session.state, &mut out, sel, vocab)?;
        session.tokens.extend_from_slice(&prompt[pos..end]);
        if let Some(d) = session.drafter.as_mut().filter(|_| drafting) {
            if last {
                pending_taps = Some((std::mem::take(&mut out.taps), end - pos, pos));
            } else {
                d.observe(&out.taps, end - pos, &prompt[pos + 1..=end])?;
            }
        }
        if last {
            last_out = out;
        } else if end == prompt.len() - 1 && hybrid_fork {
            session.save_checkpoint()?;
        }
        pos = end;
        if sink.poll_prefill(pos, prompt.len())?.is_some() {
            return Ok(Prefilled {
                last_out,
                pending_taps,
                reused,
                seconds: start.elapsed().as_secs_f64(),
                stopped: true,
            });
        }
    }
    Ok(Prefilled {
        last_out,
        pending_taps,
        reused,
        seconds: start.elapsed().as_secs_f64(),
        stopped: false,
    })
}
