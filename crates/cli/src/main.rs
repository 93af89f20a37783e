//! `turbospark`: the command line over the runtime — `generate`, `chat`, `info`, `perplexity`,
//! `bench`, `synth`, `serve`.
//!
//! Error contract: every failure (bad flag, unreadable model, refused request) ends as one line
//! `error: ...` on stderr and a non-zero exit; nothing reachable from arguments or files panics.
//! Clap reports flag errors itself (exit 2); everything after parsing goes through `anyhow` and
//! [`report`] (exit 1). A closed stdout (`turbospark generate ... | head`) ends the run quietly.
//!
//! Model resolution (every subcommand that takes `--model`): the flag, else `TURBOSPARK_MODEL`, else
//! the embedded testbed: `$TURBOSPARK_EMBEDDED_MODEL`, else `models/testbed` of the repository this
//! binary was built from.
//!
//! Threads: each model runs its kernels on its own pool of `--threads` threads (`turbospark::Model`).
//!
//! Device (`--device cpu|cuda|auto` on generate, chat, perplexity and bench; default auto): the same
//! binary runs with or without a GPU. `cuda` where none can be opened is one `error: --device cuda: ...`
//! line; `auto` takes the GPU when a CUDA driver is present and silently uses the CPU when there is none
//! (one `note:` line when a driver is present but the GPU could not be used).

mod bench;
mod chat;
mod generate;
mod info;
mod perplexity;
mod progress;
mod serve;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use turbospark::device::Device;
use turbospark::{DrafterOptions, DrafterRequest, Model, Speculation};

/// Where the embedded default model is looked for instead of the repository's `models/testbed`
/// (a binary installed away from its source tree, or a packaged copy of the testbed).
const EMBEDDED_MODEL_ENV: &str = "TURBOSPARK_EMBEDDED_MODEL";

#[derive(Parser, Debug)]
#[command(
    name = "turbospark",
    version,
    about = "Lossless speculative decoding for Qwen3 / Qwen3.5 / Qwen3-Next checkpoints"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a continuation of PROMPT (or of stdin), streamed to stdout.
    Generate(generate::GenerateArgs),
    /// Multi-turn chat on stdin/stdout with the model's chat template; Ctrl-C stops a reply.
    Chat(chat::ChatArgs),
    /// Describe a checkpoint: architecture, size, dtype, layer pattern, drafters, template.
    Info(info::InfoArgs),
    /// Perplexity of a text file, llama.cpp-style (second half of each window scored).
    Perplexity(perplexity::PerplexityArgs),
    /// Prefill/decode tokens per second per thread count, and sequential vs MTP speculative.
    Bench(bench::BenchArgs),
    /// Write a random-weight checkpoint of a named shape.
    Synth(SynthArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (completions, chat completions, streaming).
    Serve(serve::ServeArgs),
}

#[derive(clap::Args, Debug)]
struct SynthArgs {
    /// Shape name (e.g. tiny-hybrid, qwen35-100m); a bad name lists the known ones.
    #[arg(long)]
    shape: String,
    /// Output directory (created if absent).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest shard in bytes.
    #[arg(long, default_value_t = 2 << 30)]
    shard_bytes: usize,
    /// Also write a random DFlash drafter for the shape under OUT/dflash/.
    #[arg(long)]
    dflash: bool,
}

/// `--model` and `--threads`, shared by the subcommands that run one model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Checkpoint directory (Hugging Face layout), a `.gguf` file, or the first file of a split GGUF
    /// set. Default: $TURBOSPARK_MODEL, else the embedded testbed `models/testbed`.
    #[arg(long, value_name = "PATH", env = "TURBOSPARK_MODEL")]
    pub model: Option<PathBuf>,
    /// CPU threads for the kernels (default: all cores, or RAYON_NUM_THREADS).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Where the model runs: cpu, cuda (GPU 0; an error where there is none), or auto (CUDA when a
    /// driver is present, else the CPU). `cuda-emulated` runs the CUDA backend on the CPU (slow; tests).
    #[arg(long, value_name = "cpu|cuda|auto", default_value = "auto", value_parser = parse_device)]
    pub device: Device,
    /// Quantize a bf16/f32 checkpoint's weight matrices at load and run them on the quantized kernels:
    /// q8_0 (8.5 bits a weight), q4_k (llama.cpp's Q4_K_M mix: Q4_K, LM head Q6_K), or fp8 (e4m3 with a
    /// scale per 128x128 block, as Qwen's FP8 checkpoints). Default: as stored (a GGUF file's or an FP8
    /// checkpoint's blocks run as they are).
    #[arg(long, value_name = "q8_0|q4_k|fp8", value_parser = parse_quantize)]
    pub quantize: Option<turbospark::model_io::Quantize>,
}

/// clap's parser for `--quantize`.
pub fn parse_quantize(value: &str) -> Result<turbospark::model_io::Quantize, String> {
    value.parse()
}

/// clap's parser for `--device` (the reason without the flag: clap names it).
pub fn parse_device(value: &str) -> Result<Device, String> {
    value
        .parse()
        .map_err(|e: turbospark::device::UnknownDevice| {
            format!("expected cpu, cuda or auto (got {:?})", e.value)
        })
}

/// Opens `--model` on `--device` with `--threads`, speculating as `speculation` / `drafter` /
/// `options` ask (a
/// GPU that cannot be opened is an error naming `--device`; `auto` falling back to the CPU although a
/// driver is present prints one `note:` line).
pub fn open_model(
    args: &ModelArgs,
    dir: &Path,
    speculation: Speculation,
    drafter: DrafterRequest,
    options: DrafterOptions,
) -> Result<Model> {
    let mut builder = Model::builder(dir)
        .device(args.device)
        .speculation(speculation)
        .drafter(drafter)
        .drafter_options(options)
        .quantize(args.quantize);
    if let Some(threads) = args.threads {
        if threads == 0 {
            bail!("invalid value 0 for --threads: at least one thread is needed");
        }
        builder = builder.threads(threads);
    }
    let model = builder.build().map_err(|e| open_error(e, args.device))?;
    note_fallback(args.device, model.device_note());
    Ok(model)
}

/// Why a model did not open: a refused speculation as it is, `--device X: ...` when the GPU could not
/// be opened, else `cannot load the model: ...`.
pub fn open_error(e: turbospark::Error, device: Device) -> anyhow::Error {
    if matches!(
        e.as_runtime(),
        Some(turbospark::runtime::RuntimeError::SpeculationUnavailable { .. })
    ) {
        return anyhow::Error::new(e);
    }
    let unavailable = e.is_device_unavailable();
    load_error(e, device, unavailable)
}

/// `--device X: ...` when the GPU could not be opened, else `cannot load the model: ...`.
pub fn load_error(
    e: impl std::error::Error + Send + Sync + 'static,
    device: Device,
    unavailable: bool,
) -> anyhow::Error {
    let e = anyhow::Error::new(e);
    if unavailable {
        e.context(format!("--device {device}"))
    } else {
        e.context("cannot load the model")
    }
}

/// The one `note:` line of an `auto` that fell back to the CPU although a driver is present.
pub fn note_fallback(device: Device, note: Option<&str>) {
    if let Some(note) = note {
        eprintln!("note: --device {device}: {note}");
    }
}

impl ModelArgs {
    /// The model directory: the flag or env var, else the embedded testbed, which must exist.
    pub fn model_dir(&self) -> Result<PathBuf> {
        match &self.model {
            Some(dir) => Ok(dir.clone()),
            None => embedded_model(),
        }
    }
}

/// The embedded testbed, or a clear error saying how to get a model.
fn embedded_model() -> Result<PathBuf> {
    let dir = std::env::var_os(EMBEDDED_MODEL_ENV)
        .map_or_else(|| PathBuf::from(turbospark::EMBEDDED_MODEL), PathBuf::from);
    let dir = dir.canonicalize().unwrap_or(dir);
    if !dir.join("config.json").is_file() {
        bail!(
            "no --model given and the embedded model is not available at {} (no config.json: \
             the testbed recipe under testbed/ builds it, {EMBEDDED_MODEL_ENV} moves it); pass \
             --model DIR or set TURBOSPARK_MODEL",
            dir.display()
        );
    }
    Ok(dir)
}

fn synth(args: &SynthArgs) -> Result<()> {
    let shape = turbospark::synth::shape(&args.shape).context("--shape")?;
    if args.shard_bytes == 0 {
        bail!("invalid value 0 for --shard-bytes: a shard must hold at least one tensor");
    }
    let mut files = turbospark::synth::write(shape, &args.out, args.seed, args.shard_bytes)
        .with_context(|| {
            format!(
                "writing the {} checkpoint to {}",
                shape.name,
                args.out.display()
            )
        })?;
    if args.dflash {
        files.extend(
            turbospark::synth::write_dflash(shape, &args.out, args.seed)
                .with_context(|| format!("writing a DFlash drafter to {}", args.out.display()))?,
        );
    }
    // Reopen what was written: checks it and counts what a loader sees (the MTP head included).
    let written = turbospark::model_io::Checkpoint::open(&args.out)
        .context("reading back the written checkpoint")?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "wrote {} (seed {}, {} parameters) to {}: {} files",
        shape.name,
        args.seed,
        written.parameter_count(),
        args.out.display(),
        files.len()
    )?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate::run(&args),
        Command::Chat(args) => chat::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Synth(args) => synth(&args),
        Command::Serve(args) => serve::run(&args),
    }
}

/// True when the failure is only that stdout was closed by its reader.
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Prints `error: <cause chain>` on one line.
pub(crate) fn report(err: &anyhow::Error) {
    let line = format!("{err:#}").replace('\n', " ");
    let _ = writeln!(io::stderr(), "error: {line}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            report(&err);
            ExitCode::FAILURE
        }
    }
}
