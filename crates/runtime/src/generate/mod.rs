//! The decode loop: chunked prefill (`prefill.rs`), then rounds of draft → verify → judge → roll back →
//! observe (`round.rs`, one function a step) → account and tune (here, with `tuner.rs`); plain greedy
//! steps may run as one backend chain (`chain.rs`); tokens are chosen by the request's shaping
//! (`select.rs`).
//! Sequential decoding is the same loop with zero drafts per round (DESIGN.md §1), so both commit through
//! one `TokenSink` and share every stop rule.
//!
//! A round starts by committing `next` (chosen but not yet run). The drafter proposes d₁..d_k; one target
//! forward over [next, d₁..d_k] gives k+1 logits rows. Row i judges d_{i+1} against the target's shaped
//! distribution p_i built from the history *with every earlier accepted token committed*: at temperature 0
//! accept iff d_{i+1} = argmax p_i; when sampled accept iff r·q(d) ≤ p(d), else commit a draw from
//! normalize(max(p − q, 0)) (`sampling::verify_step`). If all k pass, row k gives the bonus token.
//! The state then keeps exactly the rows whose successors were committed — by tape replay (GDN), a KV
//! cursor move (attention), or restoring a snapshot and re-running the kept rows.
//! Invariant after every round: `state.position() == history.len() - 1` (only `next` is unrun).
//!
//! The loop touches the model and its state only through `families::Backend` / `BackendState`, so the
//! same code runs on the CPU engine and on the GPU (verify batches, tape replay and snapshots execute on
//! the device; logits and drafter taps come back to the host, where acceptance is judged — or, for a
//! plain-argmax shaping, only each row's argmax: `Wanted::argmax_only`).

mod chain;
mod prefill;
mod round;
mod select;

use std::time::Instant;

use drafters::RoundTiming;
use families::{Backend, BackendState, ForwardOut, SeqRows, Tap, Wanted};
use sampling::DrawCounter;

use self::chain::greedy_chain;
use self::prefill::prefill;
use self::round::{draft, judge, observe, roll_back, verify};
use self::select::Selector;
use crate::config::{check_admission, GenerationConfig, GenerationResult, SpecStats};
use crate::detok::Detokenizer;
use crate::error::RuntimeError;
use crate::session::Session;
use crate::sink::{CancelFlag, Event, StopReason, TokenSink};
use crate::tuner::BlockTuner;

/// Prompt tokens per prefill forward on the CPU engine (`Backend::prefill_chunk`'s default): large enough
/// for GEMM efficiency, small enough that cancellation and progress are polled often.
pub const PREFILL_CHUNK: usize = families::PREFILL_CHUNK;

/// How a rejected suffix is removed from recurrent state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rollback {
    /// Replay the recorded GDN inputs of the kept rows from the round's start state (no forward pass).
    Tape,
    /// Restore the round's start state and re-run the kept rows through the model.
    Snapshot,
}

#[derive(Clone, Copy, Debug)]
pub struct Speculative {
    /// Proposals per round (≥ 1); where tuning starts when `tune_up_to` is set.
    pub block: usize,
    /// Tune the block within 0..=this (0: plain steps) while the run goes (`auto` runs, tuner.rs),
    /// when selection is greedy; `None`: keep `block`.
    pub tune_up_to: Option<usize>,
    pub rollback: Rollback,
    pub acceptance: Acceptance,
}

impl Speculative {
    pub fn new(block: usize) -> Self {
        Speculative {
            block,
            tune_up_to: None,
            rollback: Rollback::Tape,
            acceptance: Acceptance::Exact,
        }
    }

    /// An `auto` run's speculation: starts at `block`, tuned within 0..=`max` (0: plain steps).
    pub fn tuned(block: usize, max: usize) -> Self {
        Speculative {
            tune_up_to: Some(max),
            ..Speculative::new(block)
        }
    }

    /// The most proposals a round may make.
    pub fn max_block(&self) -> usize {
        self.tune_up_to.map_or(self.block, |m| m.max(self.block))
    }
}

/// The rule that judges a sampled proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acceptance {
    /// Rejection sampling with residual correction: exact in distribution (DESIGN.md §3).
    Exact,
    /// WRONG on purpose: on rejection, redraw from p instead of the residual, which over-weights the
    /// drafter's tokens. Exists only as the negative control of the distribution test, which must fail it
    /// (feature `negative-control`, enabled for this crate's tests only).
    #[cfg(feature = "negative-control")]
    ResampleTargetOnReject,
}

/// Everything a generation needs besides the session.
pub struct Request<'a> {
    pub prompt: &'a [u32],
    pub config: &'a GenerationConfig,
    /// The model's end-of-sequence ids (generation_config.json).
    pub eos: &'a [u32],
    pub detok: &'a (dyn Detokenizer + Sync),
    /// `None`, or a session without a drafter: sequential decoding.
    pub speculative: Option<Speculative>,
    pub cancel: CancelFlag,
}

/// Runs one generation on `session` (reusing what it covers of the prompt) and reports what happened.
/// `model` is any backend of the seam (`families::Backend`): the CPU engine, the CUDA backend, or the
/// `device::Model` enum over both; the loop is the same on every device.
pub fn generate<B: Backend>(
    model: &B,
    session: &mut Session<B::State>,
    req: &Request<'_>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<GenerationResult, RuntimeError> {
    let cfg = req.config;
    check_admission(req.prompt.len(), cfg, model.context())?;
    let speculative = req
        .speculative
        .filter(|s| s.block > 0 && session.drafter.is_some());
    let prompt = req.prompt;
    let mut sink = TokenSink::new(
        prompt,
        cfg,
        req.eos,
        model.context(),
        req.detok,
        req.cancel.clone(),
        on_event,
    )?;
    let mut sel = Selector {
        shaping: &cfg.shaping,
        draws: DrawCounter::new(cfg.seed),
        prompt_len: prompt.len(),
        drafted: Vec::new(),
        error: None,
        logprobs: cfg.logprobs,
    };
    let taps: Vec<Tap> = match (&speculative, &session.drafter) {
        (Some(_), Some(d)) => d.taps(),
        _ => Vec::new(),
    };
    // The drafter observes the committed rows (with the taps it asked for, if any) only when the run
    // speculates; `speculative` is `None` without a drafter.
    let drafting = speculative.is_some();
    // Greedy without penalties needs only each row's argmax: the backend may take it where the logits
    // are (unless log-probabilities need the rows).
    let argmax_only = cfg.shaping.is_plain_argmax() && cfg.logprobs.is_none();
    let vocab = model.vocab();

    // -- Prefill. Positions this request can reach: the prompt, every new token, and one verify block
    // past them.
    let reach = prompt
        .len()
        .saturating_add(cfg.max_new_tokens)
        .saturating_add(speculative.map_or(0, |s| s.max_block()) + 1);
    let prefilled = prefill(
        model,
        session,
        &mut sink,
        &sel,
        prompt,
        &taps,
        drafting,
        argmax_only,
        reach,
    )?;
    let reused = prefilled.reused;
    if prefilled.stopped {
        return finish(sink, session, reused, prefilled.seconds, 0.0, None);
    }

    // -- Decode: the first token from the prompt's last row, then rounds.
    let decode_start = Instant::now();
    let last_out = prefilled.last_out;
    let mut next = {
        let p = sel.row_distribution(&last_out, 0, vocab, sink.history())?;
        sel.pick(&p)
    };
    let mut next_logprob = sel.score(&last_out, 0, next, vocab)?;
    if let (Some(d), Some((t, n, _))) = (session.drafter.as_mut(), prefilled.pending_taps) {
        let mut follow = prompt[prompt.len() - n + 1..].to_vec();
        follow.push(next);
        d.observe(&t, n, &follow)?;
    }
    let mut stats = speculative.map(|s| SpecStats::new(s.block));
    // Greedy selection makes the same tokens whatever the block, so only there may it be tuned.
    // A session's tuner continues from its last generation when the range is the same.
    let mut tuner = speculative
        .and_then(|s| s.tune_up_to.map(|max| (s.block, max)))
        .filter(|_| cfg.shaping.is_greedy())
        .map(|(start, max)| match session.tuner.take() {
            Some(t) if t.max() == max => t,
            _ => BlockTuner::new(start, max),
        });
    let rollback = speculative.map_or(Rollback::Tape, |s| s.rollback);
    let acceptance = speculative.map_or(Acceptance::Exact, |s| s.acceptance);
    // Plain greedy steps: the backend may queue each one before the host has read the token before it.
    let mut chain = speculative.is_none() && argmax_only;
    loop {
        if sink.commit_scored(next, next_logprob.take())?.is_some() {
            break;
        }
        let base = session.state.position(); // where `next` goes
        if chain {
            match greedy_chain(model, session, &mut sink, next, base)? {
                true => break,
                false => chain = false,
            }
        }
        // Never propose past max tokens or the context window.
        let room = sink
            .budget_left()
            .min(model.context().saturating_sub(base + 1));
        let block = match tuner.as_mut() {
            Some(t) => t.next_block(),
            None => speculative.map_or(0, |s| s.block),
        };
        let round_start = Instant::now();
        let one_time_work = model.one_time_work();

        // Copies (the suffix drafter, `mtp+suffix`) may run past the tuned block, up to `auto`'s cap.
        let limit = speculative.map_or(0, |s| s.tune_up_to.unwrap_or(s.block));
        let drafted = draft(
            session,
            &mut sel,
            sink.history(),
            block.min(room),
            limit.min(room),
        )?;
        let proposals = &drafted.proposals;
        let verified = verify(
            model,
            session,
            &sel,
            next,
            proposals,
            base,
            rollback,
            &taps,
            argmax_only,
        )?;
        let judgement = judge(
            &mut sel,
            &mut sink,
            &verified.out,
            proposals,
            acceptance,
            vocab,
        )?;
        let rollback_start = Instant::now();
        let rolled_back = roll_back(model, session, &verified, judgement.keep())?;
        let rollback_seconds = rollback_start.elapsed().as_secs_f64();
        let observe_start = Instant::now();
        observe(session, &verified, &judgement, sink.history(), drafting)?;
        let observe_seconds = observe_start.elapsed().as_secs_f64();
        if let Some(d) = session.drafter.as_mut().filter(|_| tuner.is_some()) {
            // Greedy `auto` only (sampled runs never read the clock); not a round of one-time work.
            if model.one_time_work() == one_time_work {
                d.record_costs(RoundTiming {
                    rows: proposals.len() + 1,
                    proposals: proposals.len(),
                    draft_seconds: drafted.seconds,
                    verify_seconds: verified.seconds + rollback_seconds + observe_seconds,
                });
            }
        }

        // -- Account and tune.
        if let Some(s) = stats.as_mut() {
            if proposals.is_empty() && block == 0 {
                // A plain step the tuner chose (block 0): counted by block, not as a round.
                s.record_plain_step();
            } else if !proposals.is_empty() {
                s.record_round(
                    proposals.len(),
                    judgement.judged,
                    judgement.accepted,
                    rolled_back,
                );
                if let Some(d) = &session.drafter {
                    s.record_drafter(d.proposer(), proposals.len(), judgement.accepted);
                }
                // The drafter's cost is its proposal and its observe of the verified rows.
                s.draft_seconds += drafted.seconds + observe_seconds;
                s.verify_seconds += verified.seconds;
                s.rollback_seconds += rollback_seconds;
            }
        }
        if let Some(t) = tuner.as_mut().filter(|_| proposals.len() == block) {
            // A round that captured a graph (or did other one-time work) costs several rounds' worth
            // and would keep its block away: it is recorded untimed.
            let seconds = (model.one_time_work() == one_time_work)
                .then(|| round_start.elapsed().as_secs_f64());
            t.record(block, judgement.judged, judgement.accepted, seconds);
        }
        match (judgement.stopped, judgement.chosen) {
            (false, Some(t)) => {
                next = t;
                next_logprob = judgement.chosen_logprob;
            }
            _ => break,
        }
    }
    let decode_seconds = decode_start.elapsed().as_secs_f64();
    if tuner.is_some() {
        session.tuner = tuner;
    }
    finish(
        sink,
        session,
        reused,
        prefilled.seconds,
        decode_seconds,
        stats,
    )
}

/// The loop's forward: one sequence through the batched seam (`Backend::forward_batch`), which a
/// batching scheduler fills with many.
pub(super) fn forward_rows<B: Backend>(
    model: &B,
    tokens: &[u32],
    start: usize,
    state: &mut B::State,
    wanted: &Wanted,
) -> Result<ForwardOut, RuntimeError> {
    let mut batch = [SeqRows {
        tokens,
        start,
        state,
        wanted,
    }];
    let mut outs = model.forward_batch(&mut batch)?;
    match (outs.pop(), outs.is_empty()) {
        (Some(out), true) => Ok(out),
        _ => Err(RuntimeError::Device(
            "the backend's batched forward did not return one output for one sequence".into(),
        )),
    }
}

fn finish<S: BackendState>(
    sink: TokenSink<'_>,
    session: &mut Session<S>,
    reused: usize,
    prefill_seconds: f64,
    decode_seconds: f64,
    spec: Option<SpecStats>,
) -> Result<GenerationResult, RuntimeError> {
    let mut sink = sink;
    if sink.stopped().is_none() {
        sink.stop(StopReason::Cancelled)?;
    }
    let out = sink.finish()?;
    Ok(GenerationResult {
        reason: out.reason,
        prompt_tokens: out.prompt_len,
        new_tokens: out.token_ids.len(),
        reused_tokens: reused,
        prefill_seconds,
        decode_seconds,
        kv_position: session.state.position(),
        token_ids: out.token_ids,
        text: out.text,
        spec,
        logprobs: out.logprobs,
    })
}
