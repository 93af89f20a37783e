//! [`Session`]: one sequence on a [`Model`], kept between calls so a prompt that extends what the
//! session already covers (the next chat turn) prefills only its new tokens.
//!
//! Each call runs the runtime's one decode loop (`runtime::generate`: sequential, or speculative
//! with the session's drafter) inside the model's thread pool and commits every token through the
//! runtime's `TokenSink`, so stop rules, UTF-8-safe deltas and exactness are the same as every other
//! front end's.

use device::ModelState;
use runtime::{
    CancelFlag, ChatMessage, Event, GenerationConfig, GenerationResult, Prepared, RenderOptions,
    Speculative,
};

use crate::error::Error;
use crate::model::Model;

/// One sequence on a model; see the module doc.
pub struct Session {
    model: Model,
    prepared: Prepared,
    cancel: CancelFlag,
}

impl Session {
    pub(crate) fn new(model: Model, prepared: Prepared) -> Self {
        Session {
            model,
            prepared,
            cancel: CancelFlag::new(),
        }
    }

    /// Generates a continuation of `prompt` (encoded without special tokens), streaming events to
    /// `on_event`; returns the text, stop reason, timings and speculation statistics.
    pub fn generate(
        &mut self,
        prompt: &str,
        config: &GenerationConfig,
        on_event: impl FnMut(Event<'_>) + Send,
    ) -> Result<GenerationResult, Error> {
        let ids = self.model.encode(prompt)?;
        self.generate_ids(&ids, config, on_event)
    }

    /// [`Session::generate`] from token ids.
    pub fn generate_ids(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        mut on_event: impl FnMut(Event<'_>) + Send,
    ) -> Result<GenerationResult, Error> {
        let model = self.model.clone();
        let engine = model.engine();
        let request = runtime::Request {
            prompt,
            config,
            eos: &engine.eos,
            detok: &engine.tokenizer,
            speculative: self.prepared.speculative,
            cancel: self.cancel.clone(),
        };
        let result = self.run(&request, &mut on_event);
        // A cancel stops the generation it reached; the next one starts uncancelled.
        if self.cancel.is_cancelled() {
            self.cancel = CancelFlag::new();
        }
        Ok(result?)
    }

    /// Runs a request built by the caller (its own stop ids, speculation and cancel flag: the
    /// server's) on this session, as [`Session::generate_ids`] runs its own.
    pub fn run(
        &mut self,
        request: &runtime::Request<'_>,
        on_event: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<GenerationResult, runtime::RuntimeError> {
        let engine = self.model.engine();
        let session = &mut self.prepared.session;
        // Sessions generating at once on several threads share forward steps (`Model::hub`): the loop
        // runs on this thread and each step inside the model's pool, so a thread waiting for a step
        // never holds a pool thread. Otherwise the generation runs wholly inside the pool.
        match self.model.hub() {
            Some(hub) => {
                let _in = hub.enter();
                let model = &self.model;
                let install = |f: &mut (dyn FnMut() + Send)| model.install(f);
                let backend = hub.backend_in(&engine.model, &install);
                runtime::generate(&backend, session, request, on_event)
            }
            None => self
                .model
                .install(|| runtime::generate(&engine.model, session, request, on_event)),
        }
    }

    /// Renders `messages` with the model's chat template (`add_generation_prompt` and template
    /// variables from `options`) and generates the assistant's reply. A conversation that grows turn
    /// by turn reuses the previous turns' state.
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        options: &RenderOptions,
        config: &GenerationConfig,
        on_event: impl FnMut(Event<'_>) + Send,
    ) -> Result<GenerationResult, Error> {
        let text = self.model.render_chat(messages, options)?;
        self.generate(&text, config, on_event)
    }

    /// A flag that stops this session's running generation (or, set while idle, its next one) at the
    /// next committed token. Clones share it; it can be set from any thread.
    pub fn cancel_flag(&self) -> CancelFlag {
        self.cancel.clone()
    }

    /// Forgets the sequence: the next prompt is prefilled from scratch.
    pub fn reset(&mut self) -> Result<(), Error> {
        let session = &mut self.prepared.session;
        self.model.install(|| session.reset_all())?;
        Ok(())
    }

    /// Token ids the session's state covers.
    pub fn tokens(&self) -> &[u32] {
        self.prepared.session.tokens()
    }

    /// How this session decodes: `"sequential"` or e.g. `"mtp, block 3 (auto: ...)"`.
    pub fn mode(&self) -> &str {
        &self.prepared.mode
    }

    /// Why an `auto` session decodes sequentially, when it does although speculation was asked for.
    pub fn warning(&self) -> Option<&str> {
        self.prepared.warning.as_deref()
    }

    /// The speculative setting each generation passes to the decode loop (`None`: sequential).
    pub fn speculative(&self) -> Option<Speculative> {
        self.prepared.speculative
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The runtime session underneath (state, drafter, block tuner), for tools that drive the
    /// decode loop themselves; run such work through [`Model::install`].
    pub fn runtime_session(&mut self) -> &mut runtime::Session<ModelState> {
        &mut self.prepared.session
    }

    /// A fresh state on the model's device with no drafter (e.g. scoring a prompt apart from the
    /// session's sequence).
    pub fn fresh_runtime_session(&self) -> Result<runtime::Session<ModelState>, Error> {
        let model = &self.model;
        Ok(model.install(|| model.new_state_session())?)
    }
}
