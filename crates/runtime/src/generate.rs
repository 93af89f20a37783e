//! The decode loop: chunked prefill, then rounds of draft → verify → accept → roll back → bonus token.
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

use std::time::Instant;

use drafters::Chooser;
use families::{Backend, BackendState, ForwardOut, Rows, Tap, Wanted};
use sampling::{Draft, DrawCounter, ShapedDistribution, Shaping, Verdict};

use crate::config::{check_admission, GenerationConfig, GenerationResult, SpecStats};
use crate::detok::Detokenizer;
use crate::error::RuntimeError;
use crate::logprobs::{token_logprob, TokenLogprob};
use crate::session::Session;
use crate::sink::{CancelFlag, Event, StopReason, TokenSink};
use crate::tuner::BlockTuner;

/// Prompt tokens per prefill forward on the CPU engine (`Backend::prefill_chunk`'s default): large enough
/// for GEMM efficiency, small enough that cancellation and progress are polled often.
pub const PREFILL_CHUNK: usize = families::PREFILL_CHUNK;

/// Largest top-k whose rows may come back as candidates (`Selector::candidates`: 2 top-k of them).
const CANDIDATES_TOP_K_MAX: usize = 256;

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

/// Chooses tokens from logits with the request's shaping: argmax at temperature 0, else a draw with the
/// next counter value; remembers the distribution of every draw so the verifier can ratio against it.
struct Selector<'a> {
    shaping: &'a Shaping,
    draws: DrawCounter,
    prompt_len: usize,
    /// q of each proposal of the current round (sampled only).
    drafted: Vec<ShapedDistribution>,
    error: Option<RuntimeError>,
    /// `Some(n)`: committed tokens get log-probability entries with n alternatives, so every row
    /// must come back whole (no argmax-only or candidate rows).
    logprobs: Option<usize>,
}

impl Selector<'_> {
    fn distribution(
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
    fn candidates(&self) -> usize {
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
    fn candidates_answer(&self, out: &ForwardOut, vocab: usize) -> Result<bool, RuntimeError> {
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
    fn row_distribution(
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
    fn score(
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

    fn pick(&mut self, dist: &ShapedDistribution) -> u32 {
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

/// Runs one generation on `session` (reusing what it covers of the prompt) and reports what happened.
/// `model` is any backend of the seam (`families::Backend`): the CPU engine, the CUDA backend, or the
/// `backend::Model` enum over both; the loop is the same on every device.
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

    // -- Prefill, in chunks; the drafter sees every row's taps.
    let prefill_start = Instant::now();
    let reused = session.reuse(prompt)?;
    // Positions this request can reach: the prompt, every new token, and one verify block past them.
    let reach = prompt
        .len()
        .saturating_add(cfg.max_new_tokens)
        .saturating_add(speculative.map_or(0, |s| s.max_block()) + 1);
    model.reserve(&mut session.state, reach.min(model.context()))?;
    let taps: Vec<Tap> = match (&speculative, &session.drafter) {
        (Some(_), Some(d)) => d.taps(),
        _ => Vec::new(),
    };
    let hybrid_fork = session.state.is_recurrent() && prompt.len() - reused > 1;
    // Greedy without penalties needs only each row's argmax: the backend may take it where the logits
    // are (unless log-probabilities need the rows).
    let argmax_only = cfg.shaping.is_plain_argmax() && cfg.logprobs.is_none();
    let vocab = model.vocab();
    let mut last_out = ForwardOut::default();
    let mut pending_taps: Option<(Vec<Vec<f32>>, usize, usize)> = None; // last chunk's taps, rows, start
    let chunk = model.prefill_chunk().max(1);
    let mut pos = reused;
    while pos < prompt.len() {
        // Hybrids split off the last prompt token so the state before it can be kept as the fork point.
        let end_limit = if hybrid_fork && pos < prompt.len() - 1 {
            prompt.len() - 1
        } else {
            prompt.len()
        };
        let end = (pos + chunk).min(end_limit);
        let last = end == prompt.len();
        let wanted = Wanted {
            logits: if last { Rows::Last } else { Rows::None },
            taps: taps.clone(),
            argmax_only,
            candidates: sel.candidates(),
        };
        let mut out = model.forward(&prompt[pos..end], pos, &mut session.state, &wanted)?;
        settle_candidates(model, &mut session.state, &mut out, &sel, vocab)?;
        session.tokens.extend_from_slice(&prompt[pos..end]);
        if let Some(d) = session.drafter.as_mut().filter(|_| !taps.is_empty()) {
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
            return finish(
                sink,
                session,
                reused,
                prefill_start.elapsed().as_secs_f64(),
                0.0,
                None,
            );
        }
    }
    let prefill_seconds = prefill_start.elapsed().as_secs_f64();

    // -- Decode.
    let decode_start = Instant::now();
    let mut next = {
        let p = sel.row_distribution(&last_out, 0, vocab, sink.history())?;
        sel.pick(&p)
    };
    let mut next_logprob = sel.score(&last_out, 0, next, vocab)?;
    if let (Some(d), Some((t, n, _))) = (session.drafter.as_mut(), pending_taps.take()) {
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
        let k = block.min(room);
        let draft_start = Instant::now();
        let one_time_work = model.one_time_work();
        sel.drafted.clear();
        let proposals = match (k, session.drafter.as_mut()) {
            (0, _) | (_, None) => Vec::new(),
            (k, Some(d)) => d.propose(sink.history(), k, &mut sel)?,
        };
        if let Some(e) = sel.error.take() {
            return Err(e);
        }
        let draft_seconds = draft_start.elapsed().as_secs_f64();

        // Verify [next, proposals] in one forward.
        let verify_start = Instant::now();
        let mut feed = Vec::with_capacity(proposals.len() + 1);
        feed.push(next);
        feed.extend_from_slice(&proposals);
        let rollback = speculative.map_or(Rollback::Tape, |s| s.rollback);
        let snapshot = (!proposals.is_empty()
            && rollback == Rollback::Snapshot
            && session.state.is_recurrent())
        .then(|| session.state.save())
        .transpose()?;
        if !proposals.is_empty() && rollback == Rollback::Tape {
            model.begin_tape(&mut session.state)?;
        }
        let wanted = Wanted {
            logits: Rows::All,
            taps: taps.clone(),
            argmax_only,
            candidates: sel.candidates(),
        };
        let mut out = model.forward(&feed, base, &mut session.state, &wanted)?;
        settle_candidates(model, &mut session.state, &mut out, &sel, vocab)?;
        session.tokens.extend_from_slice(&feed);
        let verify_seconds = verify_start.elapsed().as_secs_f64();

        // Judge the proposals in order, committing each accepted one before judging the next.
        let mut accepted = 0;
        let mut judged = 0;
        let mut stopped = false;
        let mut chosen = None;
        for (i, &d) in proposals.iter().enumerate() {
            let p = sel.row_distribution(&out, i, vocab, sink.history())?;
            judged += 1;
            let draft = match sel.drafted.get(i) {
                Some(q) => Draft::Distribution(q),
                None => Draft::PointMass,
            };
            let (r, u) = (sel.draws.next(), sel.draws.next());
            match sampling::verify_step(&p, draft, d, r, u)? {
                Verdict::Accepted => {
                    accepted += 1;
                    if sink
                        .commit_scored(d, sel.score(&out, i, d, vocab)?)?
                        .is_some()
                    {
                        stopped = true;
                        break;
                    }
                }
                Verdict::Rejected { replacement } => {
                    let t = match speculative.map(|s| s.acceptance) {
                        #[cfg(feature = "negative-control")]
                        Some(Acceptance::ResampleTargetOnReject) => sel.pick(&p),
                        _ => replacement,
                    };
                    next_logprob = sel.score(&out, i, t, vocab)?;
                    chosen = Some(t);
                    break;
                }
            }
        }
        if !stopped && chosen.is_none() {
            // Every proposal passed: the bonus token comes from the last row.
            let p = sel.row_distribution(&out, proposals.len(), vocab, sink.history())?;
            let t = sel.pick(&p);
            next_logprob = sel.score(&out, proposals.len(), t, vocab)?;
            chosen = Some(t);
        }

        // Keep the rows whose successor is committed: `next` and the accepted proposals, less the last
        // one if a stop fell on it (it is committed but, like every final token, never run).
        let keep = if stopped { accepted } else { accepted + 1 };
        let rollback_start = Instant::now();
        let rolled_back = keep < feed.len();
        if rolled_back {
            match &snapshot {
                Some(snap) => {
                    session.state.restore(snap)?;
                    model.forward(&feed[..keep], base, &mut session.state, &Wanted::none())?;
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
        let rollback_seconds = rollback_start.elapsed().as_secs_f64();
        let observe_start = Instant::now();
        if let Some(d) = session
            .drafter
            .as_mut()
            .filter(|_| !out.taps.is_empty() && keep > 0)
        {
            let hd = out.taps.first().map_or(0, |t| t.len() / feed.len());
            let kept: Vec<Vec<f32>> = out.taps.iter().map(|t| t[..keep * hd].to_vec()).collect();
            let history = sink.history();
            // Row j's successor: the committed token after it (the last kept row's is `chosen`).
            let follow: Vec<u32> = if stopped {
                history[history.len() - keep..].to_vec()
            } else {
                let mut f = history[history.len() - (keep - 1)..].to_vec();
                f.extend(chosen);
                f
            };
            d.observe(&kept, keep, &follow)?;
        }
        if let Some(s) = stats.as_mut() {
            if proposals.is_empty() && block == 0 {
                // A plain step the tuner chose (block 0): counted by block, not as a round.
                s.record_plain_step();
            } else if !proposals.is_empty() {
                s.record_round(proposals.len(), judged, accepted, rolled_back);
                // The drafter's cost is its proposal and its observe of the verified rows.
                s.draft_seconds += draft_seconds + observe_start.elapsed().as_secs_f64();
                s.verify_seconds += verify_seconds;
                s.rollback_seconds += rollback_seconds;
            }
        }
        if let Some(t) = tuner.as_mut().filter(|_| proposals.len() == block) {
            // A round that captured a graph (or did other one-time work) is not timed: it costs 3-7
            // rounds' worth on the testbed's GPU rounds (run 168) and would keep its block away.
            let seconds = (model.one_time_work() == one_time_work)
                .then(|| draft_start.elapsed().as_secs_f64());
            t.record(block, judged, accepted, seconds);
        }
        match (stopped, chosen) {
            (false, Some(t)) => next = t,
            _ => break,
        }
    }
    let decode_seconds = decode_start.elapsed().as_secs_f64();
    if tuner.is_some() {
        session.tuner = tuner;
    }
    if std::env::var("TURBOSPARK_SPEC_STATS").as_deref() == Ok("1") {
        if let Some(s) = &stats {
            eprintln!("turbospark spec: {s}");
        }
    }
    finish(
        sink,
        session,
        reused,
        prefill_seconds,
        decode_seconds,
        stats,
    )
}

/// Rows that came back as candidates stay so when every one of them shapes from its candidates; else
/// they come back whole (`Backend::last_logits`; rare: top-k keeping a value below the candidates).
fn settle_candidates<B: Backend>(
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

/// Runs the rest of a plain greedy generation through `Backend::greedy_chain`, committing each token as
/// it arrives; false when the backend does not chain (nothing ran). The session records what the state
/// ran; a failed chain resets it (the state may be past its tokens).
fn greedy_chain<B: Backend>(
    model: &B,
    session: &mut Session<B::State>,
    sink: &mut TokenSink<'_>,
    next: u32,
    base: usize,
) -> Result<bool, RuntimeError> {
    let budget = sink.budget_left();
    let mut ran = vec![next];
    let mut failed = None;
    let mut on_token = |t: u32| {
        ran.push(t);
        match sink.commit(t) {
            Ok(None) => true,
            Ok(Some(_)) => false,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    };
    match model.greedy_chain(next, base, &mut session.state, budget, &mut on_token) {
        Ok(Some(n)) => {
            session.tokens.extend_from_slice(&ran[..n]);
            failed.map_or(Ok(true), Err)
        }
        Ok(None) => Ok(false),
        Err(e) => {
            session.reset_all()?;
            Err(e.into())
        }
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
