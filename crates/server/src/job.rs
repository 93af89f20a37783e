//! One job on the worker's engine: the prompt tokenized and admitted, then its `n` choices generated one
//! after another on the session (a choice after the first reuses the prompt's state: `Session`'s prefix
//! reuse), choice i sampled with seed + i, so a seeded request reproduces every choice. Messages go out
//! in the order `Admitted`, then per choice `Choice(i)`, (`Logprobs`), (`Echo`), `Logprobs` / `Delta`s,
//! `Done` — or `Failed`, which ends the job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc as tmpsc;
use tokio::sync::mpsc::error::TrySendError;
use turbospark::runtime::{
    check_admission, CancelFlag, DrafterRequest, Engine, Event, GenerationConfig, GenerationResult,
    RuntimeError, Speculation, SpeculationPlan, Speculative, StopReason, TokenLogprob,
};
use turbospark::Session;

use crate::error::ApiError;
use crate::logprobs::Renderer;
use crate::worker::{Input, Job, Metrics, ModelInfo, Msg, WorkerOptions};

/// A job's messages to its client's response. The channel is bounded: a client that stops reading
/// fills it, and a message that cannot be queued within `stall` is not sent (the job is then
/// cancelled), so a stalled client only ever holds its own request, never the worker.
pub(crate) struct Events<'a> {
    tx: &'a tmpsc::Sender<Msg>,
    stall: Duration,
}

/// The client is gone or has not read for the stall timeout.
#[derive(Debug)]
pub(crate) struct Unsent;

impl Events<'_> {
    pub(crate) fn send(&self, mut msg: Msg) -> Result<(), Unsent> {
        let deadline = Instant::now() + self.stall;
        let mut wait = Duration::from_micros(100);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Closed(_)) => return Err(Unsent),
                Err(TrySendError::Full(m)) => {
                    if Instant::now() >= deadline {
                        return Err(Unsent);
                    }
                    msg = m;
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(10));
                }
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The prompt's token ids, or the parameter that is wrong.
fn prompt_ids(engine: &Engine, info: &ModelInfo, input: Input) -> Result<Vec<u32>, ApiError> {
    match input {
        Input::Text(text) => Ok(engine.encode(&text)?),
        Input::Ids(ids) => match ids.iter().position(|&id| id as usize >= info.vocab) {
            Some(i) => Err(ApiError::param(
                "prompt",
                format!(
                    "token id {} at index {i} is outside the vocabulary of {} tokens",
                    ids[i], info.vocab
                ),
            )),
            None => Ok(ids),
        },
        Input::Chat { messages, options } => {
            let Some(template) = &engine.chat else {
                return Err(ApiError::param(
                    "messages",
                    "the model has no chat template (chat_template.jinja or tokenizer_config.json's \
                     chat_template); use /v1/completions",
                ));
            };
            let text = template
                .render(&messages, &options)
                .map_err(|e| ApiError::param("messages", e.to_string()))?;
            Ok(engine.encode(&text)?)
        }
    }
}

/// The speculation a request runs with: the server's plan, none (`off`), or a named block the session's
/// drafter serves, checked by the engine's policy (a block it cannot serve exactly is refused, naming why).
fn speculation_for(
    engine: &Engine,
    session: &mut Session,
    info: &ModelInfo,
    asked: Option<Speculation>,
) -> Result<Option<Speculative>, ApiError> {
    let block = match asked {
        None | Some(Speculation::Auto) => return Ok(session.speculative()),
        Some(Speculation::Off) => return Ok(None),
        Some(Speculation::Block(n)) => n,
    };
    let Some(name) = session.runtime_session().drafter_name() else {
        return Err(ApiError::param(
            "speculative",
            format!(
                "{block} proposals per round were asked for, but this server decodes without a drafter \
                 ({}); start it with --speculative auto or N",
                info.mode
            ),
        ));
    };
    // The session's drafter ("mtp", "dflash (cuda)", ...) as a request the policy understands; `auto`'s
    // per-round mix ("mtp+suffix") is what `auto` asks for.
    let drafter: DrafterRequest = match name.split(' ').next().unwrap_or(name) {
        "mtp+suffix" => DrafterRequest::Auto,
        single => single
            .parse()
            .map_err(|e: RuntimeError| ApiError::internal(e.to_string()))?,
    };
    match engine.plan(Speculation::Block(block), drafter) {
        Ok(SpeculationPlan::Enabled { block, .. }) => Ok(Some(Speculative::new(block))),
        Ok(SpeculationPlan::Disabled { warning }) => Err(ApiError::param(
            "speculative",
            warning.unwrap_or_else(|| "speculative decoding is not available".into()),
        )),
        Err(e) => Err(ApiError::param("speculative", e.to_string())),
    }
}

/// `echo`'s prompt text, and its entries when `logprobs` is asked.
type Echo = (String, Option<Vec<TokenLogprob>>);

/// What a job's choices share.
struct Shared<'a> {
    engine: &'a Engine,
    metrics: &'a Metrics,
    log: bool,
    label: &'static str,
    prompt: &'a [u32],
    eos: &'a [u32],
    speculative: Option<Speculative>,
    events: &'a Events<'a>,
    cancel: &'a CancelFlag,
    echo: Option<Echo>,
    /// `echo` with `max_tokens: 0`: the prompt only.
    score_only: bool,
}

pub(crate) fn run_job(
    engine: &Engine,
    session: &mut Session,
    info: &ModelInfo,
    metrics: &Metrics,
    options: &WorkerOptions,
    job: Job,
) {
    let log = options.log;
    let Job {
        label,
        input,
        mut config,
        max_tokens,
        ignore_eos,
        speculation,
        echo,
        n,
        client: _,
        events: tx,
        cancel,
    } = job;
    let events = Events {
        tx: &tx,
        stall: options.stalled_client,
    };
    if cancel.is_cancelled() || events.is_closed() {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let refuse = |e: ApiError| {
        metrics.refused.fetch_add(1, Ordering::Relaxed);
        let _ = events.send(Msg::Failed(e));
    };
    let speculative = match speculation_for(engine, session, info, speculation) {
        Ok(s) => s,
        Err(e) => return refuse(e),
    };
    let prompt_text = match &input {
        Input::Text(text) => Some(text.clone()),
        _ => None,
    };
    let prompt = match prompt_ids(engine, info, input) {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    // Without max_tokens: generation_config.json's max_new_tokens, within what the context leaves;
    // without that either, what the context leaves (vLLM's default). (At least 1, so an over-long
    // prompt is refused as such, not as `max_tokens`.)
    let room = info.context.saturating_sub(prompt.len()).max(1);
    config.max_new_tokens = max_tokens.unwrap_or_else(|| {
        info.defaults
            .max_new_tokens
            .map_or(room, |m| m.clamp(1, room))
    });
    // An echo of 0 tokens only scores the prompt: admitted as a request for 1 would be.
    let score_only = echo && max_tokens == Some(0);
    let admitted = GenerationConfig {
        max_new_tokens: config.max_new_tokens.max(usize::from(score_only)),
        ..config.clone()
    };
    if let Err(e) = check_admission(prompt.len(), &admitted, info.context) {
        return refuse(e.into());
    }
    if events
        .send(Msg::Admitted {
            prompt_tokens: prompt.len(),
        })
        .is_err()
    {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let fail = |e: RuntimeError| {
        metrics.failed.fetch_add(1, Ordering::Relaxed);
        let _ = events.send(Msg::Failed(e.into()));
    };
    let echo = match echo.then(|| echo_prompt(engine, &prompt, prompt_text, &config, &cancel)) {
        None => None,
        Some(Ok(Some(e))) => Some(e),
        Some(Ok(None)) => {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Some(Err(e)) => return fail(e),
    };
    let no_eos: [u32; 0] = [];
    let shared = Shared {
        engine,
        metrics,
        log,
        label,
        prompt: &prompt,
        eos: if ignore_eos { &no_eos } else { &engine.eos },
        speculative,
        events: &events,
        cancel: &cancel,
        echo,
        score_only,
    };
    for choice in 0..n {
        if events.send(Msg::Choice(choice)).is_err() {
            cancel.cancel();
        }
        let config = GenerationConfig {
            seed: config.seed.wrapping_add(choice as u64),
            ..config.clone()
        };
        if !run_choice(&shared, session, &config) {
            break;
        }
    }
}

/// Generates one choice and reports it; false when the job must stop (cancelled or failed).
fn run_choice(s: &Shared<'_>, session: &mut Session, config: &GenerationConfig) -> bool {
    let (events, cancel, metrics) = (s.events, s.cancel, s.metrics);
    let mut renderer = Renderer::new(&s.engine.tokenizer);
    if let Some((text, scored)) = &s.echo {
        if let Some(scored) = scored {
            let mut rendered = Vec::with_capacity(s.prompt.len());
            rendered.extend(s.prompt.first().map(|&t| renderer.render_unscored(t)));
            rendered.extend(scored.iter().map(|e| renderer.render(e)));
            if events.send(Msg::Logprobs(rendered)).is_err() {
                cancel.cancel();
            }
        }
        if events.send(Msg::Echo(text.clone())).is_err() {
            cancel.cancel();
        }
    }
    if s.score_only {
        metrics.completed.fetch_add(1, Ordering::Relaxed);
        metrics
            .prompt_tokens
            .fetch_add(s.prompt.len() as u64, Ordering::Relaxed);
        let result = GenerationResult {
            reason: StopReason::MaxTokens,
            prompt_tokens: s.prompt.len(),
            new_tokens: 0,
            reused_tokens: 0,
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
            // The session was not run.
            kv_position: session.runtime_session().tokens().len(),
            token_ids: Vec::new(),
            text: String::new(),
            spec: None,
            logprobs: Vec::new(),
        };
        return events.send(Msg::Done(Box::new(result))).is_ok();
    }
    let request = turbospark::runtime::Request {
        prompt: s.prompt,
        config,
        eos: s.eos,
        detok: &s.engine.tokenizer,
        speculative: s.speculative,
        cancel: cancel.clone(),
    };
    let mut entries = Vec::new();
    let mut on_event = |event: Event<'_>| match event {
        Event::Logprob(e) => entries.push(renderer.render(e)),
        Event::Delta(text) => {
            let lp = (!entries.is_empty()).then(|| Msg::Logprobs(std::mem::take(&mut entries)));
            let sent = lp.map_or(Ok(()), |m| events.send(m));
            if sent.is_err() || events.send(Msg::Delta(text.to_string())).is_err() {
                cancel.cancel();
            }
        }
        _ => {}
    };
    let result = session.run(&request, &mut on_event);
    if !entries.is_empty() && result.is_ok() {
        let _ = events.send(Msg::Logprobs(entries));
    }
    match result {
        Ok(result) => {
            let cancelled = result.reason == StopReason::Cancelled;
            let counter = match cancelled {
                true => &metrics.cancelled,
                false => &metrics.completed,
            };
            let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
            add(counter, 1);
            add(&metrics.prompt_tokens, result.prompt_tokens);
            add(&metrics.cached_tokens, result.reused_tokens);
            add(&metrics.generated_tokens, result.new_tokens);
            if let Some(spec) = &result.spec {
                add(&metrics.spec_proposed, spec.proposed);
                add(&metrics.spec_accepted, spec.accepted);
            }
            if s.log {
                eprintln!("{}", log_line(s.label, &result));
            }
            events.send(Msg::Done(Box::new(result))).is_ok() && !cancelled
        }
        Err(e) => {
            if s.log {
                eprintln!("{}: failed: {e}", s.label);
            }
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            // The session may hold a half-run state: start the next request from scratch.
            let _ = session.runtime_session().reset_all();
            let _ = events.send(Msg::Failed(e.into()));
            false
        }
    }
}

/// `echo`'s prompt text (the request's own, or the ids decoded) and, when `logprobs` is asked, the
/// prompt's entries. `None`: cancelled while scoring.
fn echo_prompt(
    engine: &Engine,
    prompt: &[u32],
    text: Option<String>,
    config: &GenerationConfig,
    cancel: &CancelFlag,
) -> Result<Option<Echo>, RuntimeError> {
    let scored = match config.logprobs {
        None => None,
        Some(top) => {
            match turbospark::runtime::prompt_logprobs(&engine.model, prompt, top, cancel)? {
                Some(s) => Some(s),
                None => return Ok(None),
            }
        }
    };
    let text = match text {
        Some(t) => t,
        None => turbospark::runtime::Detokenizer::decode(&engine.tokenizer, prompt)?,
    };
    Ok(Some((text, scored)))
}

/// One request's log line: "chat: prompt 18 (cached 0) + 20 new, length; prefill 24.2 ms, decode
/// 115.7 ms (172.9 tok/s); drafts 8/18 accepted".
fn log_line(label: &str, r: &GenerationResult) -> String {
    let mut line = format!(
        "{label}: prompt {} (cached {}) + {} new, {}; prefill {:.1} ms, decode {:.1} ms ({:.1} tok/s)",
        r.prompt_tokens,
        r.reused_tokens,
        r.new_tokens,
        r.reason.finish_reason(),
        r.prefill_seconds * 1e3,
        r.decode_seconds * 1e3,
        r.decode_tokens_per_second()
    );
    if let Some(spec) = &r.spec {
        line.push_str(&format!(
            "; drafts {}/{} accepted",
            spec.accepted, spec.proposed
        ));
    }
    line
}
