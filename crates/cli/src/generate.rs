//! `turbospark generate`: one prompt in, its continuation streamed to stdout.
//!
//! Flow: resolve the model directory → [`load`] (`turbospark::Model`: a named `--speculative N` the
//! checkpoint cannot serve is refused before the weights load; then the session's plan) → render the
//! chat template when `--chat` → [`stream`] the generation, writing each committed delta to stdout
//! and flushing it → the stats lines on stderr with `--stats`.
//!
//! The plan is decided by `Engine::plan` (the one policy the server and C API share): a named
//! block it cannot serve is the error exit; `auto` that cannot speculate prints `warning: ...` once
//! and decodes sequentially. Output: the generated text followed by one newline.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{bail, Context, Result};
use turbospark::runtime::{
    CancelFlag, ChatMessage, DrafterOptions, DrafterRequest, Event, GenerationConfig,
    GenerationResult, RenderOptions, RuntimeError, Speculation,
};
use turbospark::sampling::Shaping;
use turbospark::{Model, Session};

use crate::progress::{self, PREFILL_BAR_MIN_TOKENS};
use crate::ModelArgs;

/// Sampling, stopping and speculation flags, shared by `generate` and `chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate (a stop token counts).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Keep the K most likely tokens; 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Nucleus sampling mass in (0, 1]; 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f64,
    /// Drop tokens below MIN_P times the most likely one; 0 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f64,
    /// transformers' repetition penalty (> 0); 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f64,
    /// OpenAI presence penalty in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f64,
    /// OpenAI frequency penalty in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f64,
    /// Seed of the sampler (a seeded sampled run reproduces exactly).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop string (repeatable); the match and what follows are not printed.
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Speculative decoding: auto (the drafter's default block, tuned as a greedy run goes), off, or N
    /// proposals per round (kept as given).
    #[arg(long, value_name = "auto|off|N", default_value = "auto", value_parser = parse_speculation)]
    pub speculative: Speculation,
    /// Which drafter speculative decoding uses: auto (the checkpoint's MTP head, else its DFlash
    /// drafter, else the suffix drafter), mtp, dflash, ngram (prompt lookup: copies from the context,
    /// needs no weights), or suffix (the most frequent continuation in this and earlier requests;
    /// needs no weights).
    #[arg(long, value_name = "auto|mtp|dflash|ngram|suffix", default_value = "auto", value_parser = parse_drafter)]
    pub drafter: DrafterRequest,
    #[command(flatten)]
    pub drafter_options: DrafterOptionArgs,
    /// Print the result line (and speculative statistics) to stderr.
    #[arg(long)]
    pub stats: bool,
}

/// The reason of a flag error, without repeating the flag (clap names it).
fn flag_reason(err: RuntimeError) -> String {
    match err {
        RuntimeError::InvalidFlag { reason, .. } => reason,
        other => other.to_string(),
    }
}

pub fn parse_speculation(value: &str) -> Result<Speculation, String> {
    value.parse().map_err(flag_reason)
}

pub fn parse_drafter(value: &str) -> Result<DrafterRequest, String> {
    value.parse().map_err(flag_reason)
}

/// The weight-free drafters' options, shared by `generate`, `chat`, `serve` and `bench`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DrafterOptionArgs {
    /// Prompt lookup (`--drafter ngram`): the shortest n-gram matched, 1..=64 (default 1).
    #[arg(long, value_name = "N")]
    pub ngram_min: Option<usize>,
    /// Prompt lookup: the longest n-gram matched, 1..=64 (default 3, or --ngram-min if larger).
    #[arg(long, value_name = "N")]
    pub ngram_max: Option<usize>,
    /// The suffix drafter's memory: at most N tokens of this and earlier requests indexed, oldest
    /// evicted first (256..=1048576, default 32768; up to 24 trie nodes of about 100 bytes a token).
    #[arg(long, value_name = "N")]
    pub suffix_memory: Option<usize>,
}

impl DrafterOptionArgs {
    /// The options, checked: a value out of range is an error naming its flag.
    pub fn options(&self) -> Result<DrafterOptions> {
        Ok(DrafterOptions::new(
            self.ngram_min,
            self.ngram_max,
            self.suffix_memory,
        )?)
    }
}

impl SamplingArgs {
    pub fn config(&self) -> GenerationConfig {
        GenerationConfig {
            max_new_tokens: self.max_tokens,
            stop_token_ids: Vec::new(),
            stop_strings: self.stop.clone(),
            shaping: Shaping {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
            },
            seed: self.seed,
            logprobs: None,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The prompt; read from stdin when absent.
    pub prompt: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Wrap the prompt as a user turn with the model's chat template (add_generation_prompt).
    #[arg(long)]
    pub chat: bool,
    /// A system message for --chat.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub system: Option<String>,
    /// With --chat: pass enable_thinking = false to the template (Qwen3-style templates).
    #[arg(long, requires = "chat")]
    pub no_think: bool,
}

/// A loaded model ready to generate, and the session its plan opened (the plan's drafter attached).
pub struct Loaded {
    pub model: Model,
    pub session: Session,
}

/// Loads the model of `model` and plans speculation for `sampling`; prints the plan's warning.
pub fn load(model: &ModelArgs, sampling: &SamplingArgs) -> Result<Loaded> {
    let dir = model.model_dir()?;
    let spinner = progress::spinner(format!("loading {}", dir.display()));
    let options = sampling.drafter_options.options()?;
    let opened = crate::open_model(model, &dir, sampling.speculative, sampling.drafter, options);
    spinner.finish_and_clear();
    let model = opened?;
    let session = model.session()?;
    if let Some(warning) = session.warning() {
        eprintln!("warning: {warning}");
    }
    Ok(Loaded { model, session })
}

/// Runs one generation on the loaded session, streaming deltas to stdout (flushed each) and a
/// prefill bar to stderr for long prompts. A stdout failure cancels the run and is returned.
pub fn stream(
    loaded: &mut Loaded,
    prompt: &[u32],
    config: &GenerationConfig,
) -> Result<GenerationResult> {
    let stdout = io::stdout();
    let mut write_error: Option<io::Error> = None;
    let mut bar: Option<indicatif::ProgressBar> = None;
    let watch = loaded.session.cancel_flag();
    let on_event = |event: Event<'_>| match event {
        Event::Delta(text) => {
            if write_error.is_none() {
                let mut out = stdout.lock();
                if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                    write_error = Some(e);
                    watch.cancel();
                }
            }
        }
        Event::Prefill { done, total } => {
            if total > PREFILL_BAR_MIN_TOKENS {
                let b = bar.get_or_insert_with(|| progress::bar(total, "prefill"));
                b.set_position(done as u64);
                if done >= total {
                    b.finish_and_clear();
                }
            }
        }
        Event::Decode { .. } | Event::Logprob(_) => {}
    };
    let result = loaded.session.generate_ids(prompt, config, on_event);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if let Some(e) = write_error {
        return Err(anyhow::Error::new(e).context("writing to stdout"));
    }
    let result = result?;
    let mut out = stdout.lock();
    if !result.text.ends_with('\n') {
        out.write_all(b"\n").context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")?;
    Ok(result)
}

/// `--stats`: the result line, then for a speculative run the counters and a per-position table of
/// conditional acceptance (P(accept i | position i reached)).
pub fn print_stats(result: &GenerationResult, mode: &str, device: &str) {
    let plain = GenerationResult {
        spec: None,
        token_ids: Vec::new(),
        text: String::new(),
        ..result.clone()
    };
    eprintln!("stats ({mode}): {plain}");
    eprintln!("device: {device}");
    if let Some(spec) = &result.spec {
        eprintln!("speculative: {spec}");
        let positions: Vec<String> = spec
            .per_position_offered
            .iter()
            .zip(&spec.per_position_accepted)
            .enumerate()
            .map(|(i, (offered, accepted))| format!("{}: {accepted}/{offered}", i + 1))
            .collect();
        eprintln!("accepted/reached per position: {}", positions.join("  "));
    }
}

/// What Ctrl-C does: cancel the reply being generated if there is one; with none running, exit
/// after `idle_presses_to_exit` presses (chat: the second press at the prompt; generate: the first).
pub struct Interrupt {
    current: Mutex<Option<CancelFlag>>,
    idle_presses: AtomicUsize,
    idle_presses_to_exit: usize,
}

impl Interrupt {
    pub fn install(idle_presses_to_exit: usize) -> Result<Arc<Interrupt>> {
        let interrupt = Arc::new(Interrupt {
            current: Mutex::new(None),
            idle_presses: AtomicUsize::new(0),
            idle_presses_to_exit,
        });
        let handler = interrupt.clone();
        ctrlc::set_handler(move || handler.pressed()).context("installing the Ctrl-C handler")?;
        Ok(interrupt)
    }

    fn pressed(&self) {
        let running = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(flag) = running {
            flag.cancel();
            return;
        }
        let presses = self.idle_presses.fetch_add(1, Ordering::SeqCst) + 1;
        if presses >= self.idle_presses_to_exit {
            std::process::exit(130);
        }
        eprintln!("\n(press Ctrl-C again to exit, or Ctrl-D)");
    }

    /// The next reply starts: Ctrl-C now sets `flag` (the session's cancel flag).
    pub fn begin(&self, flag: CancelFlag) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(flag);
        self.idle_presses.store(0, Ordering::SeqCst);
    }

    /// The reply ended: Ctrl-C counts towards exiting again.
    pub fn end(&self) {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// The user typed something at the prompt: a later Ctrl-C starts counting afresh.
    pub fn typed(&self) {
        self.idle_presses.store(0, Ordering::SeqCst);
    }
}

/// Template options of a turn: the generation prompt, and `enable_thinking = false` on request.
pub fn render_options(no_think: bool) -> RenderOptions {
    let mut options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    if no_think {
        options
            .extra
            .insert("enable_thinking".into(), serde_json::Value::Bool(false));
    }
    options
}

fn read_prompt(args: &GenerateArgs) -> Result<String> {
    match &args.prompt {
        Some(prompt) => Ok(prompt.clone()),
        None => {
            let mut text = String::new();
            io::stdin()
                .read_to_string(&mut text)
                .context("reading the prompt from stdin")?;
            Ok(text)
        }
    }
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let text = read_prompt(args)?;
    let config = args.sampling.config();
    let mut loaded = load(&args.model, &args.sampling)?;
    let text = if args.chat {
        let Some(template) = &loaded.model.engine().chat else {
            bail!(
                "--chat: the model has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)"
            );
        };
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.clone()));
        }
        // A prompt piped from stdin ends with the line's newline, which is not part of the turn.
        let turn = text.strip_suffix('\n').unwrap_or(&text);
        let turn = turn.strip_suffix('\r').unwrap_or(turn);
        messages.push(ChatMessage::new("user", turn));
        template.render(&messages, &render_options(args.no_think))?
    } else {
        text
    };
    let prompt = loaded.model.encode(&text)?;
    let interrupt = Interrupt::install(1)?;
    interrupt.begin(loaded.session.cancel_flag());
    let result = stream(&mut loaded, &prompt, &config);
    interrupt.end();
    let result = result?;
    if args.sampling.stats {
        print_stats(&result, loaded.session.mode(), loaded.model.device_name());
    }
    Ok(())
}
