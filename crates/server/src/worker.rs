//! The generation workers: `WorkerOptions::parallel` OS threads, each with its own session, taking jobs
//! from one bounded queue in arrival order, a key's job preferring the worker that served the key last
//! (route.rs). With one worker the engine decodes one sequence at a time;
//! with several, the model batches them (`turbospark::ModelBuilder::batching`: their forward steps run
//! as one, each sequence's output what it would be alone).
//!
//! A job's life: queued (`Queue::submit`, refused when the queue is full) → the worker renders its
//! chat template and tokenizes it, then runs admission → [`Msg::Admitted`] or [`Msg::Failed`] → per
//! choice the deltas as they are committed, then [`Msg::Done`] (job.rs). The front end decides the HTTP
//! status from the first message, so a refused request never opens a stream.
//!
//! Cancellation invariant: the job's [`CancelFlag`] is set when its receiver is gone (the client hung
//! up: the handler or its stream was dropped) — by the front end's guard, and by the worker itself
//! when a send fails — so a dropped request stops at its next commit, or is skipped if still queued,
//! and the next job starts at once.
//!
//! Prefix reuse: a worker runs its jobs on its session, so a request that extends the previous one on
//! that worker (the next chat turn) prefills only what is new (`Session`'s reuse rules); with several
//! workers a key's turn goes back to its worker when that one is idle, else it may land on another and
//! prefill again. A drafter that learns across requests
//! (the suffix drafter) is told to forget them before a request from another API key than the previous
//! one's on its worker, and before every request of a server without keys: how fast a request runs must
//! not tell a client whether someone else's text continues its prompt.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use tokio::sync::mpsc as tmpsc;
use turbospark::model_io::GenerationDefaults;
use turbospark::runtime::{
    CancelFlag, ChatMessage, GenerationConfig, GenerationResult, RenderOptions, RuntimeError,
    Speculation,
};
use turbospark::{Model, Session};

use crate::error::ApiError;
use crate::route::{Refused, Router};

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
    /// Choices to generate (`n`), one after another; choice i samples with seed + i.
    pub n: usize,
    /// The API key the request carried (`None`: the server has none). A drafter's memory of earlier
    /// requests serves only the next requests of the same client.
    pub client: Option<crate::Client>,
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
    /// The messages up to the next `Done` are choice i's.
    Choice(usize),
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
    /// Shared forward steps of a batching model (`--parallel`), and the sequences they ran.
    pub batch_steps: AtomicU64,
    pub batch_sequences: AtomicU64,
}

impl Metrics {
    pub fn render(&self, info: &ModelInfo) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let model = info.name.replace(['\\', '"', '\n'], "_");
        let rows: [(&str, &str, &str, u64); 13] = [
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
            (
                "batch_steps_total",
                "counter",
                "forward steps shared by the requests generating at once",
                get(&self.batch_steps),
            ),
            (
                "batch_sequences_total",
                "counter",
                "sequences those steps ran (divided by the steps: the mean batch)",
                get(&self.batch_sequences),
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
    jobs: Arc<Jobs>,
    pub info: Arc<ModelInfo>,
    pub metrics: Arc<Metrics>,
    /// The model's tokenizer, for `/tokenize` and `/detokenize` (no need to wait for the worker).
    pub tokenizer: Arc<tokenizers::Tokenizer>,
}

impl Queue {
    /// Enqueues `job`, or refuses it when `max_queue` jobs already wait.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        match self.jobs.0.submit(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    Refused::Full => ApiError::busy(),
                    Refused::Closed => ApiError::internal("the generation worker has stopped"),
                })
            }
        }
    }
}

/// The front ends' handle on the router: when the last one is dropped, the workers stop.
struct Jobs(Arc<Router>);

impl Drop for Jobs {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// How the worker serves.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Requests that may wait while one runs (0: none; a request arriving while one runs gets 503).
    pub max_queue: usize,
    /// One line on stderr per finished request (tokens, cache, times, drafts).
    pub log: bool,
    /// A request whose client has not read its response for this long is cancelled, freeing the
    /// worker for the others (its own buffer holds 256 messages).
    pub stalled_client: std::time::Duration,
    /// Requests generated at once, each on its own worker and session (1: one at a time). Above 1 the
    /// model must be built with `ModelBuilder::batching` so that they share forward steps.
    pub parallel: usize,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            max_queue: 64,
            log: false,
            stalled_client: std::time::Duration::from_secs(30),
            parallel: 1,
        }
    }
}

/// What every worker serves jobs with.
#[derive(Clone)]
struct ServeJobs {
    model: Model,
    info: Arc<ModelInfo>,
    metrics: Arc<Metrics>,
    options: WorkerOptions,
    router: Arc<Router>,
}

impl ServeJobs {
    /// As worker `w`, takes jobs until the router closes, running each on `session`.
    fn run(&self, w: usize, mut session: Session) {
        let engine = self.model.engine();
        let mut last_client = None;
        while let Some(job) = self.router.next(w) {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            // Memory of earlier requests stays within one client (keyless: within none).
            if job.client.is_none() || job.client != last_client {
                session.runtime_session().forget_earlier_requests();
            }
            last_client = job.client;
            let events = job.events.clone();
            // A bug that panics fails its request, not the server: the next one starts afresh.
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::job::run_job(
                    engine,
                    &mut session,
                    &self.info,
                    &self.metrics,
                    &self.options,
                    job,
                )
            }));
            if let Some(stats) = self.model.batch_stats() {
                self.metrics
                    .batch_steps
                    .store(stats.steps, Ordering::Relaxed);
                let sequences = &self.metrics.batch_sequences;
                sequences.store(stats.sequences, Ordering::Relaxed);
            }
            if run.is_err() {
                self.metrics.failed.fetch_add(1, Ordering::Relaxed);
                let _ = session.runtime_session().reset_all();
                // Best effort: a client that is not reading does not get it.
                let _ = events.try_send(Msg::Failed(ApiError::internal(
                    "internal error (a bug in turbospark) while generating; the server goes on",
                )));
            }
        }
    }
}

/// Starts the worker thread: `open` runs on it and returns the model, the session every request runs
/// on and the served name; the worker then serves jobs inside the model's thread pool (so every kernel
/// runs there, as in `turbospark bench`). Returns once the model is loaded, or `open`'s error.
pub fn spawn<F>(open: F, options: WorkerOptions) -> Result<Queue, turbospark::Error>
where
    F: FnOnce() -> Result<(Model, Session, String), turbospark::Error> + Send + 'static,
{
    // max_queue 0: no request waits; one is taken only while a worker is idle.
    let router = Arc::new(Router::new(options.parallel.max(1), options.max_queue));
    let jobs = Arc::new(Jobs(router.clone()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let worker_metrics = metrics.clone();
    thread::Builder::new()
        .name("turbospark-worker".into())
        .spawn(move || {
            let (model, session, name) = match open() {
                Ok(v) => v,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let engine = model.engine();
            let info = ModelInfo {
                name,
                context: model.context(),
                vocab: engine.checkpoint.config.vocab_size,
                has_chat_template: engine.chat.is_some(),
                mode: session.mode().to_string(),
                device: model.device_name().to_string(),
                defaults: engine.checkpoint.generation.clone(),
            };
            if ready_tx
                .send(Ok((info.clone(), engine.tokenizer.clone())))
                .is_err()
            {
                return;
            }
            let mut options = options;
            if !model.batches() {
                // Without shared steps, concurrent generations would only contend for the device.
                options.parallel = 1;
            }
            let serve = ServeJobs {
                model: model.clone(),
                info: Arc::new(info),
                metrics: worker_metrics,
                options,
                router,
            };
            // Workers past the first, each with its own session; they share the model's steps.
            for i in 1..serve.options.parallel.max(1) {
                let serve = serve.clone();
                let session = match serve.model.session() {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("error: worker {i} could not open a session: {e}");
                        break;
                    }
                };
                let spawned = thread::Builder::new()
                    .name(format!("turbospark-worker-{i}"))
                    .spawn(move || serve.run(i, session));
                if let Err(e) = spawned {
                    eprintln!("error: starting worker {i}: {e}");
                    break;
                }
            }
            if serve.options.parallel > 1 {
                // Each generation's loop on its worker, its steps inside the pool (`Session`).
                serve.run(0, session);
            } else {
                // One generation at a time, wholly inside the model's pool (as `turbospark bench`).
                let model = serve.model.clone();
                model.install(move || serve.run(0, session));
            }
        })
        .map_err(|e| {
            turbospark::Error::from(RuntimeError::Io {
                path: "<worker thread>".into(),
                source: e,
            })
        })?;
    let (info, tokenizer) = ready_rx.recv().map_err(|_| {
        turbospark::Error::from(RuntimeError::Config {
            origin: "server".into(),
            reason: "the worker thread ended while loading the model".into(),
        })
    })??;
    Ok(Queue {
        jobs,
        info: Arc::new(info),
        metrics,
        tokenizer: Arc::new(tokenizer),
    })
}
