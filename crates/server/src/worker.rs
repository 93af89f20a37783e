//! The generation worker: one OS thread that owns the engine and its one session, and serves jobs
//! from a bounded queue in arrival order (the engine decodes one sequence at a time).
//!
//! A job's life: queued (`Queue::submit`, refused when the queue is full) → the worker renders its
//! chat template and tokenizes it, then runs admission → [`Msg::Admitted`] or [`Msg::Failed`] → the
//! deltas as they are committed → [`Msg::Done`]. The front end decides the HTTP status from the
//! first message, so a refused request never opens a stream.
//!
//! Cancellation invariant: the job's [`CancelFlag`] is set when its receiver is gone (the client hung
//! up: the handler or its stream was dropped) — by the front end's guard, and by the worker itself
//! when a send fails — so a dropped request stops at its next commit, or is skipped if still queued,
//! and the next job starts at once.
//!
//! Prefix reuse: every job runs on the same session, so a request that extends the previous one
//! (the next chat turn) prefills only what is new (`Session`'s reuse rules).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;

use model_io::GenerationDefaults;
use runtime::{
    check_admission, CancelFlag, ChatMessage, DrafterRequest, Engine, Event, GenerationConfig,
    GenerationResult, Prepared, RenderOptions, RuntimeError, Speculation, SpeculationPlan,
    Speculative, StopReason,
};
use tokio::sync::mpsc as tmpsc;

use crate::error::ApiError;

/// What a request asks the model to continue.
pub enum Input {
    /// Raw text (`/v1/completions`' `prompt`).
    Text(String),
    /// Token ids (`prompt` given as an array of integers).
    Ids(Vec<u32>),
    /// Chat messages rendered with the model's template (`/v1/chat/completions`).
    Chat {
        messages: Vec<ChatMessage>,
        options: RenderOptions,
    },
}

/// A generation request as the worker runs it. `max_tokens: None` takes what the context leaves.
pub struct Job {
    /// The endpoint, for the request log ("completions", "chat").
    pub label: &'static str,
    pub input: Input,
    pub config: GenerationConfig,
    pub max_tokens: Option<usize>,
    /// `ignore_eos`: the model's EOS ids do not stop the run (the request's own stop ids still do).
    pub ignore_eos: bool,
    /// The request's `speculative` (`None` or `auto`: the server's plan).
    pub speculation: Option<Speculation>,
    /// `echo`: the prompt's text (and, with `logprobs`, its scores) comes back first; with
    /// `max_tokens: Some(0)` nothing is generated.
    pub echo: bool,
    pub events: tmpsc::Sender<Msg>,
    pub cancel: CancelFlag,
}

/// What the worker reports about one job, in this order: `Admitted` or `Failed`, then deltas, then
/// `Done` or `Failed`.
#[derive(Debug)]
pub enum Msg {
    Admitted {
        prompt_tokens: usize,
    },
    /// The entries of the tokens committed since the last ones (requests with `logprobs`), sent before
    /// the text that follows them and, for the last tokens, before `Done`.
    Logprobs(Vec<crate::logprobs::Rendered>),
    /// `echo`: the prompt's text, before any delta.
    Echo(String),
    Delta(String),
    Done(Box<GenerationResult>),
    Failed(ApiError),
}

/// Facts about the served model, fixed at load.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The name clients use (`--served-model-name`, else the directory name).
    pub name: String,
    pub context: usize,
    pub vocab: usize,
    pub has_chat_template: bool,
    /// "sequential" or the speculation plan.
    pub mode: String,
    pub device: String,
    pub defaults: GenerationDefaults,
}

/// Counters for `/metrics` (Prometheus text format).
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub refused: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    pub completed: AtomicU64,
    pub queued: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub spec_proposed: AtomicU64,
    pub spec_accepted: AtomicU64,
}

impl Metrics {
    pub fn render(&self, info: &ModelInfo) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let model = info.name.replace(['\\', '"', '\n'], "_");
        let rows: [(&str, &str, &str, u64); 11] = [
            (
                "requests_total",
                "counter",
                "requests received",
                get(&self.requests),
            ),
            (
                "requests_refused_total",
                "counter",
                "requests refused (bad parameters, full queue)",
                get(&self.refused),
            ),
            (
                "requests_failed_total",
                "counter",
                "requests that failed while generating",
                get(&self.failed),
            ),
            (
                "requests_cancelled_total",
                "counter",
                "generations cancelled (client gone)",
                get(&self.cancelled),
            ),
            (
                "requests_completed_total",
                "counter",
                "generations that ended normally",
                get(&self.completed),
            ),
            (
                "requests_queued",
                "gauge",
                "requests waiting for the worker",
                get(&self.queued),
            ),
            (
                "prompt_tokens_total",
                "counter",
                "prompt tokens of admitted requests",
                get(&self.prompt_tokens),
            ),
            (
                "cached_prompt_tokens_total",
                "counter",
                "prompt tokens reused from the session (not prefilled)",
                get(&self.cached_tokens),
            ),
            (
                "generation_tokens_total",
                "counter",
                "tokens generated",
                get(&self.generated_tokens),
            ),
            (
                "spec_proposed_tokens_total",
                "counter",
                "draft tokens proposed",
                get(&self.spec_proposed),
            ),
            (
                "spec_accepted_tokens_total",
                "counter",
                "draft tokens accepted",
                get(&self.spec_accepted),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            out.push_str(&format!(
                "# HELP turbospark_{name} {help}\n# TYPE turbospark_{name} {kind}\nturbospark_{name}{{model=\"{model}\"}} {value}\n"
            ));
        }
        out
    }
}

/// The front end's side of the worker.
#[derive(Clone)]
pub struct Queue {
    jobs: SyncSender<Job>,
    pub info: Arc<ModelInfo>,
    pub metrics: Arc<Metrics>,
    /// The model's tokenizer, for `/tokenize` and `/detokenize` (no need to wait for the worker).
    pub tokenizer: Arc<tokenizers::Tokenizer>,
}

impl Queue {
    /// Enqueues `job`, or refuses it when `max_queue` jobs already wait.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(_) => ApiError::busy(),
                    TrySendError::Disconnected(_) => {
                        ApiError::internal("the generation worker has stopped")
                    }
                })
            }
        }
    }
}

/// Starts the worker thread: `open` runs on it (so the engine never crosses threads) and returns the
/// engine, its prepared session and the served name. Returns once the model is loaded, or `open`'s error.
/// With `log`, each finished request prints one line on stderr (tokens, cache, times, drafts).
pub fn spawn<F>(open: F, max_queue: usize, log: bool) -> Result<Queue, RuntimeError>
where
    F: FnOnce() -> Result<(Engine, Prepared, String), RuntimeError> + Send + 'static,
{
    // 0: no request waits; one is taken only while the worker is idle (a rendezvous channel).
    let (jobs, rx) = mpsc::sync_channel::<Job>(max_queue);
    let (ready_tx, ready_rx) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let worker_metrics = metrics.clone();
    thread::Builder::new()
        .name("turbospark-worker".into())
        .spawn(move || {
            let (engine, mut prepared, name) = match open() {
                Ok(v) => v,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let info = ModelInfo {
                name,
                context: families::Backend::context(&engine.model),
                vocab: engine.checkpoint.config.vocab_size,
                has_chat_template: engine.chat.is_some(),
                mode: prepared.mode.clone(),
                device: engine.model.device_name().to_string(),
                defaults: engine.checkpoint.generation.clone(),
            };
            if ready_tx
                .send(Ok((info.clone(), engine.tokenizer.clone())))
                .is_err()
            {
                return;
            }
            while let Ok(job) = rx.recv() {
                worker_metrics.queued.fetch_sub(1, Ordering::Relaxed);
                let events = job.events.clone();
                // A bug that panics fails its request, not the server: the next one starts afresh.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_job(&engine, &mut prepared, &info, &worker_metrics, log, job)
                }));
                if run.is_err() {
                    worker_metrics.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = prepared.session.reset_all();
                    let _ = events.blocking_send(Msg::Failed(ApiError::internal(
                        "internal error (a bug in turbospark) while generating; the server goes on",
                    )));
                }
            }
        })
        .map_err(|e| RuntimeError::Io {
            path: "<worker thread>".into(),
            source: e,
        })?;
    let (info, tokenizer) = ready_rx.recv().map_err(|_| RuntimeError::Config {
        origin: "server".into(),
        reason: "the worker thread ended while loading the model".into(),
    })??;
    Ok(Queue {
        jobs,
        info: Arc::new(info),
        metrics,
        tokenizer: Arc::new(tokenizer),
    })
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
    prepared: &Prepared,
    info: &ModelInfo,
    asked: Option<Speculation>,
) -> Result<Option<Speculative>, ApiError> {
    let block = match asked {
        None | Some(Speculation::Auto) => return Ok(prepared.speculative),
        Some(Speculation::Off) => return Ok(None),
        Some(Speculation::Block(n)) => n,
    };
    let Some(name) = prepared.session.drafter_name() else {
        return Err(ApiError::param(
            "speculative",
            format!(
                "{block} proposals per round were asked for, but this server decodes without a drafter \
                 ({}); start it with --speculative auto or N",
                info.mode
            ),
        ));
    };
    // The session's drafter ("mtp", "dflash (cuda)", ...) as a request the policy understands.
    let drafter: DrafterRequest = name
        .split(' ')
        .next()
        .unwrap_or(name)
        .parse()
        .map_err(|e: RuntimeError| ApiError::internal(e.to_string()))?;
    match engine.plan(Speculation::Block(block), drafter) {
        Ok(SpeculationPlan::Enabled { block, .. }) => Ok(Some(Speculative::new(block))),
        Ok(SpeculationPlan::Disabled { warning }) => Err(ApiError::param(
            "speculative",
            warning.unwrap_or_else(|| "speculative decoding is not available".into()),
        )),
        Err(e) => Err(ApiError::param("speculative", e.to_string())),
    }
}

fn run_job(
    engine: &Engine,
    prepared: &mut Prepared,
    info: &ModelInfo,
    metrics: &Metrics,
    log: bool,
    job: Job,
) {
    let Job {
        label,
        input,
        mut config,
        max_tokens,
        ignore_eos,
        speculation,
        echo,
        events,
        cancel,
    } = job;
    if cancel.is_cancelled() || events.is_closed() {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let refuse = |e: ApiError| {
        metrics.refused.fetch_add(1, Ordering::Relaxed);
        let _ = events.blocking_send(Msg::Failed(e));
    };
    let speculative = match speculation_for(engine, prepared, info, speculation) {
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
    // Without max_tokens a request may use what the context leaves (vLLM's default).
    // (At least 1, so an over-long prompt is refused as such, not as `max_tokens`.)
    config.max_new_tokens =
        max_tokens.unwrap_or_else(|| info.context.saturating_sub(prompt.len()).max(1));
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
        .blocking_send(Msg::Admitted {
            prompt_tokens: prompt.len(),
        })
        .is_err()
    {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let no_eos: [u32; 0] = [];
    let request = runtime::Request {
        prompt: &prompt,
        config: &config,
        eos: if ignore_eos { &no_eos } else { &engine.eos },
        detok: &engine.tokenizer,
        speculative,
        cancel: cancel.clone(),
    };
    let mut renderer = crate::logprobs::Renderer::new(&engine.tokenizer);
    if echo {
        match echo_prompt(
            engine,
            &prompt,
            prompt_text,
            &config,
            &cancel,
            &mut renderer,
        ) {
            Ok(Some(msgs)) => {
                for m in msgs {
                    if events.blocking_send(m).is_err() {
                        cancel.cancel();
                    }
                }
            }
            Ok(None) => {
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                metrics.failed.fetch_add(1, Ordering::Relaxed);
                let _ = events.blocking_send(Msg::Failed(e.into()));
                return;
            }
        }
        if score_only {
            metrics.completed.fetch_add(1, Ordering::Relaxed);
            metrics
                .prompt_tokens
                .fetch_add(prompt.len() as u64, Ordering::Relaxed);
            let result = GenerationResult {
                reason: StopReason::MaxTokens,
                prompt_tokens: prompt.len(),
                new_tokens: 0,
                reused_tokens: 0,
                prefill_seconds: 0.0,
                decode_seconds: 0.0,
                // The session was not run.
                kv_position: prepared.session.tokens().len(),
                token_ids: Vec::new(),
                text: String::new(),
                spec: None,
                logprobs: Vec::new(),
            };
            let _ = events.blocking_send(Msg::Done(Box::new(result)));
            return;
        }
    }
    let mut entries = Vec::new();
    let mut on_event = |event: Event<'_>| match event {
        Event::Logprob(e) => entries.push(renderer.render(e)),
        Event::Delta(text) => {
            let lp = (!entries.is_empty()).then(|| Msg::Logprobs(std::mem::take(&mut entries)));
            let sent = lp.map_or(Ok(()), |m| events.blocking_send(m));
            if sent.is_err() || events.blocking_send(Msg::Delta(text.to_string())).is_err() {
                cancel.cancel();
            }
        }
        _ => {}
    };
    let result = runtime::generate(
        &engine.model,
        &mut prepared.session,
        &request,
        &mut on_event,
    );
    if !entries.is_empty() && result.is_ok() {
        let _ = events.blocking_send(Msg::Logprobs(entries));
    }
    match result {
        Ok(result) => {
            let counter = match result.reason {
                StopReason::Cancelled => &metrics.cancelled,
                _ => &metrics.completed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            metrics
                .prompt_tokens
                .fetch_add(result.prompt_tokens as u64, Ordering::Relaxed);
            metrics
                .cached_tokens
                .fetch_add(result.reused_tokens as u64, Ordering::Relaxed);
            metrics
                .generated_tokens
                .fetch_add(result.new_tokens as u64, Ordering::Relaxed);
            if let Some(spec) = &result.spec {
                metrics
                    .spec_proposed
                    .fetch_add(spec.proposed as u64, Ordering::Relaxed);
                metrics
                    .spec_accepted
                    .fetch_add(spec.accepted as u64, Ordering::Relaxed);
            }
            if log {
                eprintln!("{}", log_line(label, &result));
            }
            let _ = events.blocking_send(Msg::Done(Box::new(result)));
        }
        Err(e) => {
            if log {
                eprintln!("{label}: failed: {e}");
            }
            metrics.failed.fetch_add(1, Ordering::Relaxed);
            // The session may hold a half-run state: start the next request from scratch.
            let _ = prepared.session.reset_all();
            let _ = events.blocking_send(Msg::Failed(e.into()));
        }
    }
}

/// What `echo` sends before the generation: the prompt's entries (its first token unscored) when
/// `logprobs` is asked, then its text (the request's own, or the ids decoded). `None`: cancelled.
fn echo_prompt(
    engine: &Engine,
    prompt: &[u32],
    text: Option<String>,
    config: &GenerationConfig,
    cancel: &CancelFlag,
    renderer: &mut crate::logprobs::Renderer<'_>,
) -> Result<Option<Vec<Msg>>, RuntimeError> {
    let mut msgs = Vec::new();
    if let Some(top) = config.logprobs {
        let Some(scored) = runtime::prompt_logprobs(&engine.model, prompt, top, cancel)? else {
            return Ok(None);
        };
        let mut rendered = Vec::with_capacity(prompt.len());
        rendered.extend(prompt.first().map(|&t| renderer.render_unscored(t)));
        rendered.extend(scored.iter().map(|e| renderer.render(e)));
        msgs.push(Msg::Logprobs(rendered));
    }
    let text = match text {
        Some(t) => t,
        None => runtime::Detokenizer::decode(&engine.tokenizer, prompt)?,
    };
    msgs.push(Msg::Echo(text));
    Ok(Some(msgs))
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
