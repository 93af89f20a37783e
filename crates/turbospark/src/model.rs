//! [`Model`]: an opened checkpoint (the target on its device, tokenizer, chat template, drafters) with
//! its own kernel thread pool and speculation setting.
//!
//! Invariant: every call that runs kernels — loading, prefill, decode, drafting — runs inside the
//! model's pool ([`Model::install`]). Rayon work submitted from a thread outside a pool pays a
//! cross-thread hand-off per parallel kernel; inside, the calling thread is one of the pool's workers
//! and joins the work directly (measured with `turbospark bench` against `turbospark generate` on the
//! testbed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use device::{Device, ModelState};
use runtime::{DrafterOptions, DrafterRequest, Engine, Speculation};

use crate::error::Error;
use crate::session::Session;

/// Options of [`Model::builder`]; [`ModelBuilder::build`] opens the model.
#[derive(Clone, Debug)]
pub struct ModelBuilder {
    dir: PathBuf,
    device: Device,
    speculation: Speculation,
    drafter: DrafterRequest,
    drafter_options: DrafterOptions,
    threads: Option<usize>,
    batching: bool,
    quantize: Option<model_io::Quantize>,
}

impl ModelBuilder {
    /// Where the model runs (default [`Device::Auto`]: the GPU when a CUDA driver and device are
    /// present, else the CPU).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Whether sessions speculate (default [`Speculation::Auto`]: with the checkpoint's drafter, the
    /// block tuned while greedy runs go; a named block the model cannot serve fails at
    /// [`Model::session`]).
    pub fn speculation(mut self, speculation: Speculation) -> Self {
        self.speculation = speculation;
        self
    }

    /// Which drafter speculating sessions use (default [`DrafterRequest::Auto`]: MTP when the
    /// checkpoint has a head, else DFlash, else the suffix drafter).
    pub fn drafter(mut self, drafter: DrafterRequest) -> Self {
        self.drafter = drafter;
        self
    }

    /// Whether sessions generating at once on several threads share forward steps (continuous
    /// batching, the CPU engine; default off). On: each generation's loop runs on its own thread and
    /// every step of the model inside its pool, the steps holding every generation's rows; what a
    /// generation returns is unchanged (each row keeps its bits). Off: a generation runs wholly inside
    /// the pool, as one thread would use the model (the drafter too).
    pub fn batching(mut self, batching: bool) -> Self {
        self.batching = batching;
        self
    }

    /// How the weight-free drafters are built (n-gram sizes, the suffix drafter's memory bound;
    /// default [`DrafterOptions::default`]).
    pub fn drafter_options(mut self, options: DrafterOptions) -> Self {
        self.drafter_options = options;
        self
    }

    /// Quantize a bf16/f32 checkpoint's weight matrices at load (default None: as stored), into the
    /// block formats the CPU's quantized kernels run ([`model_io::Quantize`]); the model then runs on
    /// the CPU (`Device::Auto` resolves to it; a GPU device is an error), as does a checkpoint that is
    /// already quantized.
    pub fn quantize(mut self, quantize: Option<model_io::Quantize>) -> Self {
        self.quantize = quantize;
        self
    }

    /// Kernel threads of this model's pool (default: rayon's, i.e. `RAYON_NUM_THREADS` or one per
    /// core). Must be at least 1.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// Starts the thread pool and loads the checkpoint on the device inside it. A named speculative
    /// block the checkpoint cannot serve is refused before the weights are loaded.
    pub fn build(self) -> Result<Model, Error> {
        if self.threads == Some(0) {
            return Err(Error::InvalidOption {
                option: "threads",
                reason: "at least one thread is needed".into(),
            });
        }
        let threads = self.threads.unwrap_or(0);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("turbospark-{i}"))
            .build()
            .map_err(|source| Error::ThreadPool { threads, source })?;
        let mut engine = pool.install(|| {
            Engine::open_with(
                &self.dir,
                self.device,
                self.speculation,
                self.drafter,
                self.quantize,
            )
        })?;
        engine.drafter_options = self.drafter_options;
        let batching = self.batching && matches!(engine.model, device::Model::Cpu(_));
        Ok(Model {
            inner: Arc::new(Inner {
                engine,
                pool,
                speculation: self.speculation,
                drafter: self.drafter,
                hub: batching.then(runtime::BatchHub::default),
            }),
        })
    }
}

struct Inner {
    engine: Engine,
    pool: rayon::ThreadPool,
    speculation: Speculation,
    drafter: DrafterRequest,
    /// Where the generations of this model's sessions on several threads meet in shared forward
    /// steps (CPU: `runtime::BatchHub`).
    hub: Option<runtime::BatchHub<ModelState>>,
}

/// An opened model. Cloning is cheap and shares the weights and the pool.
#[derive(Clone)]
pub struct Model {
    inner: Arc<Inner>,
}

impl Model {
    /// Options for opening the checkpoint directory `dir` (Hugging Face layout: `config.json`,
    /// `*.safetensors`, `tokenizer.json`, optionally the chat template and `generation_config.json`),
    /// or a GGUF file (`.gguf`, or the first file of a split `-00001-of-0000N.gguf` set).
    pub fn builder(dir: impl AsRef<Path>) -> ModelBuilder {
        ModelBuilder {
            dir: dir.as_ref().to_path_buf(),
            device: Device::Auto,
            speculation: Speculation::Auto,
            drafter: DrafterRequest::Auto,
            drafter_options: DrafterOptions::default(),
            threads: None,
            batching: false,
            quantize: None,
        }
    }

    /// Opens `dir` with the default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Model, Error> {
        Self::builder(dir).build()
    }

    /// A new session under the model's speculation setting.
    pub fn session(&self) -> Result<Session, Error> {
        self.session_with(self.inner.speculation, self.inner.drafter)
    }

    /// A new session under another speculation setting (the server's per-request `speculative`).
    /// A named block the checkpoint or device cannot serve is the error, naming why.
    pub fn session_with(
        &self,
        speculation: Speculation,
        drafter: DrafterRequest,
    ) -> Result<Session, Error> {
        let prepared = self.install(|| self.inner.engine.prepare(speculation, drafter))?;
        Ok(Session::new(self.clone(), prepared))
    }

    /// Runs `f` on this model's thread pool (the calling thread waits). Everything that runs kernels
    /// goes through here; tools that drive the layers beneath (benchmarks) use it too.
    /// Whether sessions generating at once share forward steps ([`ModelBuilder::batching`], on the
    /// CPU).
    pub fn batches(&self) -> bool {
        self.inner.hub.is_some()
    }

    /// What the shared steps have run so far (None: this model does not batch).
    pub fn batch_stats(&self) -> Option<runtime::BatchStats> {
        self.inner.hub.as_ref().map(|h| h.stats())
    }

    /// The hub of continuous batching ([`ModelBuilder::batching`] on a CPU model).
    pub(crate) fn hub(&self) -> Option<&runtime::BatchHub<ModelState>> {
        self.inner.hub.as_ref()
    }

    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.inner.pool.install(f)
    }

    /// Whether the calling thread is one of this model's pool threads (inside a generation's
    /// callback, for instance).
    pub fn is_pool_thread(&self) -> bool {
        self.inner.pool.current_thread_index().is_some()
    }

    /// The engine underneath: the model on its device, tokenizer, EOS ids, chat template.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The speculation setting sessions get from [`Model::session`].
    pub fn speculation(&self) -> (Speculation, DrafterRequest) {
        (self.inner.speculation, self.inner.drafter)
    }

    /// Threads in this model's kernel pool.
    pub fn threads(&self) -> usize {
        self.inner.pool.current_num_threads()
    }

    /// `"cpu"` or the GPU's name.
    pub fn device_name(&self) -> &'static str {
        self.inner.engine.model.device_name()
    }

    /// Why [`Device::Auto`] fell back to the CPU although a GPU seemed present, if it did.
    pub fn device_note(&self) -> Option<&str> {
        self.inner.engine.device_note.as_deref()
    }

    /// Positions the model can attend over (`max_position_embeddings`).
    pub fn context(&self) -> usize {
        families::Backend::context(&self.inner.engine.model)
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.inner.engine.tokenizer
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        Ok(self.inner.engine.encode(text)?)
    }

    /// Renders `messages` with the checkpoint's chat template (an error naming the missing template when
    /// it has none).
    pub fn render_chat(
        &self,
        messages: &[runtime::ChatMessage],
        options: &runtime::RenderOptions,
    ) -> Result<String, Error> {
        let template =
            self.inner
                .engine
                .chat
                .as_ref()
                .ok_or_else(|| runtime::RuntimeError::Config {
                    origin: self.inner.engine.checkpoint.dir.display().to_string(),
                    reason:
                        "the model has no chat template (chat_template.jinja, or chat_template in \
                         tokenizer_config.json)"
                            .into(),
                })?;
        Ok(template.render(messages, options)?)
    }

    pub(crate) fn new_state_session(
        &self,
    ) -> Result<runtime::Session<ModelState>, runtime::RuntimeError> {
        runtime::Session::open(&self.inner.engine.model)
    }
}

// The front door is usable across threads: a model can be opened on one thread and its sessions
// driven from others.
#[allow(dead_code)]
fn assert_send_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send::<Session>();
}
