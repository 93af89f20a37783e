//! `turbospark bench`: throughput of one checkpoint (or of a random one of a named shape), printed as
//! tables; nothing is asserted about the numbers.
//!
//! 1. Throughput, per thread count of `--threads-list` (each in its own rayon pool, which the kernels
//!    use when called inside it): one greedy generation of `--gen-tokens` from a prompt of
//!    `--prompt-tokens` random ids (seeded), from an empty session; prefill tok/s = prompt tokens /
//!    prefill seconds, decode tok/s = committed tokens / decode seconds, each the median of `--runs`.
//!    No stop token can end a run early (the EOS list is empty), so every run does the same work.
//! 2. Speculative (when the checkpoint has a drafter, `--drafter ngram|suffix` names one that needs no
//!    weights, or
//!    `--speculative` names blocks): with the largest thread count, sequential vs each drafter's
//!    greedy decoding from the same prompt (`--prompt` text, or
//!    a built-in text when the checkpoint has a tokenizer, else the random ids), per block (and `auto`,
//!    whose block is tuned as it runs; labelled with the block most rounds used; its tuner carries
//!    over between runs as in a session, so the first run has its own row, `1st`): tok/s, the
//!    ratio to sequential (each run paired with a sequential run just before it, the median of the
//!    pairs' ratios: the machine's speed drifts between rows, not within a pair), accepted proposals
//!    per round, milliseconds a round spends drafting,
//!    verifying and rolling back, per-position conditional acceptance, and
//!    whether the tokens equal the sequential ones (greedy speculative decoding is lossless, so they
//!    should, up to float ties).
//!
//! 3. With `--acceptance PROFILE` instead of 2: speculation at a chosen acceptance on any checkpoint,
//!    against the bound the acceptance allows and the model of this build's costs (`acceptance.rs`).
//!
//! Timing covers `turbospark::runtime::generate` only (model load and session allocation excluded); text is not
//! detokenized, so the numbers are the model's.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use turbospark::device::{Device, Model, ModelState};
use turbospark::families::{Backend, BackendError};
use turbospark::model_io::Checkpoint;
use turbospark::runtime::{
    Detokenizer, DrafterAvailability, DrafterRequest, GenerationConfig, GenerationResult, Request,
    RuntimeError, Session, SpecStats, Speculation, Speculative,
};

use turbospark::runtime::policy::{Drafter, SpeculationPlan};
use turbospark::sampling::Shaping;

use crate::progress;

mod acceptance;
mod workloads;

use workloads::{encode_prompt, speculative_prompt};

/// `println!` that returns a closed stdout as an error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*)?
    };
}
pub(crate) use out;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Also measure sampled decoding in the throughput table, side by side with greedy: Qwen3's
    /// recommended non-thinking settings (temperature 0.7, top-p 0.8, top-k 20), seed 0. On a GPU this
    /// prices what sampling costs the host: each token's [vocab] logits row comes back and is shaped there.
    #[arg(long)]
    pub sampled: bool,
    /// Checkpoint directory. Default: $TURBOSPARK_MODEL, else the embedded testbed. Ignored with --shape.
    #[arg(long, value_name = "DIR", env = "TURBOSPARK_MODEL")]
    pub model: Option<PathBuf>,
    /// Quantize the weight matrices at load (q8_0, q4_k or fp8, as the model commands' --quantize).
    #[arg(long, value_name = "q8_0|q4_k|fp8", value_parser = crate::parse_quantize)]
    pub quantize: Option<turbospark::model_io::Quantize>,
    /// Benchmark a random checkpoint of this synth shape (written to a temporary directory).
    #[arg(long, value_name = "NAME")]
    pub shape: Option<String>,
    /// With --shape: also write a random DFlash drafter for the shape (turbospark::synth::write_dflash; it measures
    /// what a DFlash round costs, random proposals are not accepted).
    #[arg(long)]
    pub dflash: bool,
    /// Seed of the synth weights and of the random prompt.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads_list: Vec<usize>,
    /// Length of the random prompt.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Greedy tokens generated per run.
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Runs per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Blocks to compare with sequential decoding, comma-separated, `auto` among them for the tuned
    /// block, or `off` (default per drafter: MTP 1,2,3,4,auto; DFlash 1,2,4,8 and its trained maximum,
    /// auto; ngram 2,4,8,auto; suffix 4,8,16,auto).
    #[arg(long, value_name = "N,..,auto|off")]
    pub speculative: Option<String>,
    /// Drafters to compare: auto (every one the checkpoint carries), mtp, dflash, ngram (prompt
    /// lookup) or suffix (the suffix drafter; both need no weights and serve any checkpoint, only
    /// when named).
    #[arg(long, value_name = "auto|mtp|dflash|ngram|suffix", default_value = "auto", value_parser = crate::generate::parse_drafter)]
    pub drafter: DrafterRequest,
    #[command(flatten)]
    pub drafter_options: crate::generate::DrafterOptionArgs,
    /// Prompt text for the speculative comparison (needs the checkpoint's tokenizer).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Shipped prompts for the speculative comparison, comma-separated, one table each: `copy-edit` (a
    /// source file, then its beginning again), `grounded` (a document, then one of its sentences begun
    /// again), `free` (nothing to copy). Needs the checkpoint's tokenizer.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "copy-edit,grounded,free",
        conflicts_with = "prompt"
    )]
    pub workload: Vec<workloads::Workload>,
    /// Speculation at a chosen acceptance instead of a drafter's own: proposals are the target's greedy
    /// tokens, each corrupted with probability 1 - a_i at block position i: `oracle` (a_i = 1),
    /// `geometric:P`, or a list `0.9,0.8,0.7` (its last value repeats). Prints each block's rate
    /// against the bound the acceptance allows and the model of this build's verify and draft costs.
    #[arg(long, value_name = "PROFILE")]
    pub acceptance: Option<String>,
    /// With --acceptance: the drafter cost charged per round: `mtp` (the checkpoint's MTP head runs a
    /// step per proposal), `dflash` (its DFlash drafter's block pass) or `free`.
    #[arg(long, value_name = "mtp|dflash|free", default_value = "free")]
    pub draft_cost: acceptance::DraftCost,
    /// Where the model runs: cpu, cuda, or auto (CUDA when a driver is present). On the GPU the thread
    /// counts only size the host side (drafters, sampling).
    #[arg(long, value_name = "cpu|cuda|auto", default_value = "auto", value_parser = crate::parse_device)]
    pub device: Device,
}

/// A detokenizer that produces no text: the benchmark measures the model, not the decoder.
struct NoText;

impl Detokenizer for NoText {
    fn decode(&self, _ids: &[u32]) -> Result<String, RuntimeError> {
        Ok(String::new())
    }
}

/// SplitMix64: seeded prompt ids, reproducible across machines.
fn random_ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// The median (mean of the two middle values for an even count); 0 for no values.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Which blocks of `drafter` to compare, from `--speculative`: `Some(n)` a fixed block, `None` the
/// `auto` run (its block tuned as it goes, turbospark::runtime::tuner). Each is checked against the policy.
fn speculative_blocks(
    flag: Option<&str>,
    drafter: Drafter,
    availability: &DrafterAvailability,
) -> Result<Vec<Option<usize>>> {
    let request = request_for(drafter);
    let (_, max) = auto_blocks(drafter, availability)?;
    let Some(flag) = flag else {
        let mut blocks: Vec<Option<usize>> = match drafter {
            Drafter::Mtp | Drafter::MtpSuffix => vec![Some(1), Some(2), Some(3), Some(4)],
            Drafter::Dflash => [1, 2, 4, 8, max].iter().map(|&b| Some(b)).collect(),
            Drafter::Ngram => vec![Some(2), Some(4), Some(8)],
            Drafter::Suffix => vec![Some(4), Some(8), Some(16)],
        };
        blocks.retain(|b| b.is_some_and(|b| b <= max));
        blocks.dedup();
        blocks.push(None);
        return Ok(blocks);
    };
    if flag.trim().eq_ignore_ascii_case("off") {
        return Ok(Vec::new());
    }
    let mut blocks = Vec::new();
    for part in flag.split(',') {
        let speculation: Speculation = part.parse()?;
        let block = match speculation {
            Speculation::Block(block) => Some(block),
            Speculation::Auto => None,
            Speculation::Off => bail!(
                "invalid value {flag:?} for --speculative: expected `off` alone, or blocks and \
                 `auto` such as 1,2,4,auto"
            ),
        };
        turbospark::runtime::resolve(speculation, request, availability)?;
        blocks.push(block);
    }
    Ok(blocks)
}

/// The request that names `drafter`.
fn request_for(drafter: Drafter) -> DrafterRequest {
    match drafter {
        Drafter::Mtp => DrafterRequest::Mtp,
        Drafter::Dflash => DrafterRequest::Dflash,
        Drafter::Ngram => DrafterRequest::Ngram,
        Drafter::Suffix => DrafterRequest::Suffix,
        // What `auto` runs on a checkpoint with an MTP head.
        Drafter::MtpSuffix => DrafterRequest::Auto,
    }
}

/// `(start, most)` of `drafter`'s `auto` block under the policy (before the device's cap).
fn auto_blocks(drafter: Drafter, availability: &DrafterAvailability) -> Result<(usize, usize)> {
    match turbospark::runtime::resolve(Speculation::Auto, request_for(drafter), availability)? {
        SpeculationPlan::Enabled {
            block, tune_up_to, ..
        } => Ok((block, tune_up_to.unwrap_or(block))),
        SpeculationPlan::Disabled { .. } => bail!("the {drafter} drafter is not available"),
    }
}

/// The drafters `--drafter` asks to compare: `auto`, every one the checkpoint carries (and, with an MTP
/// head, `auto`'s per-round mix of MTP and the suffix drafter), or the suffix drafter when it carries
/// none (prompt lookup, which any checkpoint serves, only when named).
fn drafters_to_bench(
    request: DrafterRequest,
    availability: &DrafterAvailability,
) -> Result<Vec<Drafter>> {
    Ok(match request {
        // Without drafter weights, `auto` is the suffix drafter (policy.rs).
        DrafterRequest::Auto if !availability.mtp && !availability.dflash => vec![Drafter::Suffix],
        DrafterRequest::Auto => [Drafter::Mtp, Drafter::Dflash, Drafter::MtpSuffix]
            .into_iter()
            .filter(|&d| match d {
                Drafter::Mtp | Drafter::MtpSuffix => availability.mtp,
                Drafter::Dflash => availability.dflash,
                Drafter::Ngram | Drafter::Suffix => false,
            })
            .collect(),
        named => match turbospark::runtime::resolve(Speculation::Auto, named, availability)? {
            SpeculationPlan::Enabled { drafter, .. } => vec![drafter],
            SpeculationPlan::Disabled { warning } => bail!(
                "--drafter {named}: {}",
                warning.unwrap_or_else(|| "that drafter is not available".into())
            ),
        },
    })
}

struct Bench {
    model: Model,
    checkpoint: Checkpoint,
    config: GenerationConfig,
}

impl Bench {
    /// One generation from an empty session (`session` is reset first).
    fn once(
        &self,
        session: &mut Session<ModelState>,
        prompt: &[u32],
        speculative: Option<Speculative>,
    ) -> Result<GenerationResult> {
        self.once_with(&self.config, session, prompt, speculative)
    }

    /// `once` with another generation config.
    fn once_with(
        &self,
        config: &GenerationConfig,
        session: &mut Session<ModelState>,
        prompt: &[u32],
        speculative: Option<Speculative>,
    ) -> Result<GenerationResult> {
        // Each run is a request alone: a drafter that remembers earlier requests (suffix) would
        // otherwise copy the previous run's output of the same prompt.
        session.forget_earlier_requests();
        session.reset_all()?;
        let request = Request {
            prompt,
            config,
            eos: &[],
            detok: &NoText,
            speculative,
            cancel: turbospark::runtime::CancelFlag::new(),
        };
        Ok(turbospark::runtime::generate(
            &self.model,
            session,
            &request,
            &mut |_| {},
        )?)
    }

    fn runs(
        &self,
        runs: usize,
        session: &mut Session<ModelState>,
        prompt: &[u32],
        speculative: Option<Speculative>,
    ) -> Result<Vec<GenerationResult>> {
        (0..runs)
            .map(|_| self.once(session, prompt, speculative))
            .collect()
    }
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .with_context(|| format!("building a pool of {threads} threads"))
}

fn check_args(args: &BenchArgs, context: usize) -> Result<()> {
    if let Some(&bad) = args.threads_list.iter().find(|&&t| t == 0) {
        bail!("invalid value {bad} in --threads-list: at least one thread is needed");
    }
    if args.threads_list.is_empty() {
        bail!("--threads-list is empty");
    }
    for (flag, value) in [
        ("--prompt-tokens", args.prompt_tokens),
        ("--gen-tokens", args.gen_tokens),
        ("--runs", args.runs),
    ] {
        if value == 0 {
            bail!("invalid value 0 for {flag}: must be at least 1");
        }
    }
    if args.prompt_tokens.saturating_add(args.gen_tokens) > context {
        bail!(
            "--prompt-tokens {} + --gen-tokens {} exceed the model's context of {context} tokens",
            args.prompt_tokens,
            args.gen_tokens
        );
    }
    Ok(())
}

pub fn run(args: &BenchArgs) -> Result<()> {
    // Checked before anything loads (the drafters are built per table).
    args.drafter_options.options()?;
    if args.dflash && args.shape.is_none() {
        bail!("--dflash writes a drafter for a --shape checkpoint; with --model the checkpoint's own is used");
    }
    // The temporary directory lives until the end of the run (the weights are memory-mapped).
    let mut _synth_dir = None;
    let (dir, label) = match &args.shape {
        Some(name) => {
            let shape = turbospark::synth::shape(name).context("--shape")?;
            let tmp = tempfile::tempdir().context("creating a temporary directory")?;
            let spinner = progress::spinner(format!("writing a random {name} checkpoint"));
            let written =
                turbospark::synth::write(shape, tmp.path(), args.seed, 2 << 30).and_then(|files| {
                    if args.dflash {
                        turbospark::synth::write_dflash(shape, tmp.path(), args.seed)?;
                    }
                    Ok(files)
                });
            spinner.finish_and_clear();
            written.with_context(|| format!("writing the {name} checkpoint"))?;
            let dir = tmp.path().to_path_buf();
            _synth_dir = Some(tmp);
            (dir, format!("synth {name} (seed {})", args.seed))
        }
        None => {
            let dir = match &args.model {
                Some(dir) => dir.clone(),
                None => crate::embedded_model()?,
            };
            let label = dir.display().to_string();
            (dir, label)
        }
    };
    let spinner = progress::spinner(format!("loading {label}"));
    let loaded = (|| -> Result<(Checkpoint, turbospark::device::Loaded)> {
        let mut checkpoint = Checkpoint::open(&dir).context("cannot load the model")?;
        let device = args.device;
        checkpoint
            .tensors
            .set_quantize(args.quantize)
            .context("cannot load the model")?;
        let loaded = Model::load(&checkpoint, device).map_err(|e| {
            let unavailable =
                matches!(&e, BackendError::Device(d) if turbospark::device::is_unavailable(d.as_ref()));
            crate::load_error(e, device, unavailable)
        })?;
        Ok((checkpoint, loaded))
    })();
    spinner.finish_and_clear();
    let (checkpoint, loaded) = loaded?;
    crate::note_fallback(args.device, loaded.note.as_deref());
    let model = loaded.model;
    check_args(args, model.context())?;
    let availability = turbospark::runtime::availability(&checkpoint);
    let profile = args
        .acceptance
        .as_deref()
        .map(acceptance::Profile::parse)
        .transpose()?;
    if profile.is_none() && args.draft_cost != acceptance::DraftCost::Free {
        bail!("--draft-cost prices the --acceptance drafter: give --acceptance PROFILE too");
    }
    let mut plans = Vec::new();
    if let Some(flag) = args.speculative.as_deref().map(str::trim) {
        if profile.is_none()
            && flag != "off"
            && !availability.mtp
            && !availability.dflash
            && args.drafter == DrafterRequest::Auto
        {
            bail!(
                "--speculative {flag}: this checkpoint carries no drafter to compare (no MTP head, \
                 mtp.* tensors; no DFlash drafter, dflash/config.json); name --drafter suffix or ngram"
            );
        }
    }
    if profile.is_none() && args.speculative.as_deref().map(str::trim) != Some("off") {
        for drafter in drafters_to_bench(args.drafter, &availability)? {
            let blocks = speculative_blocks(args.speculative.as_deref(), drafter, &availability)?;
            plans.push((drafter, blocks, auto_blocks(drafter, &availability)?));
        }
    }
    let bench = Bench {
        model,
        checkpoint,
        config: GenerationConfig::greedy(args.gen_tokens),
    };
    let c = &bench.checkpoint.config;
    out!(
        "model: {label}\n  {}, {}, {} parameters, MTP head: {}, DFlash drafter: {}",
        c.architecture,
        crate::info::family_name(c.family),
        crate::info::human_count(bench.checkpoint.parameter_count()),
        if availability.mtp { "yes" } else { "no" },
        if availability.dflash { "yes" } else { "no" }
    );
    out!("  device: {}", bench.model.device_name());
    if let Some(notes) = bench.model.device_notes() {
        out!("  {notes}");
    }
    let random = random_ids(args.seed, args.prompt_tokens, bench.model.vocab());
    throughput(&bench, args, &random)?;
    if let Some(profile) = &profile {
        let prompt = speculative_prompt(&bench, args, random)?;
        return acceptance::table(
            &bench,
            args,
            &prompt,
            profile,
            args.draft_cost,
            &availability,
        );
    }
    plans.retain(|(_, blocks, _)| !blocks.is_empty());
    if plans.is_empty() {
        return Ok(());
    }
    if args.workload.is_empty() {
        let prompt = speculative_prompt(&bench, args, random)?;
        return speculative(&bench, args, &prompt, &plans);
    }
    for workload in &args.workload {
        let prompt = encode_prompt(&bench, args, &workload.text(), "--workload")?;
        out!(
            "\nworkload {}: {} prompt tokens",
            workload.name(),
            prompt.len()
        );
        speculative(&bench, args, &prompt, &plans)?;
    }
    Ok(())
}

fn throughput(bench: &Bench, args: &BenchArgs, prompt: &[u32]) -> Result<()> {
    out!(
        "\nthroughput: prompt {} random ids, {} greedy tokens{}, median of {} run(s)",
        args.prompt_tokens,
        args.gen_tokens,
        if args.sampled {
            " (and sampled: temperature 0.7, top-p 0.8, top-k 20, alternating runs)"
        } else {
            ""
        },
        args.runs
    );
    let sampled_config = GenerationConfig {
        shaping: Shaping {
            temperature: 0.7,
            top_p: 0.8,
            top_k: 20,
            ..Shaping::default()
        },
        ..GenerationConfig::greedy(args.gen_tokens)
    };
    out!(
        "{:>8} | {:>14} | {:>13}{}",
        "threads",
        "prefill tok/s",
        "decode tok/s",
        if args.sampled {
            " |  sampled tok/s |   ratio"
        } else {
            ""
        }
    );
    out!(
        "{:->8}-+-{:->14}-+-{:->13}{}",
        "",
        "",
        "",
        if args.sampled {
            "-+----------------+--------"
        } else {
            ""
        }
    );
    for &threads in &args.threads_list {
        // Greedy and sampled runs alternate, so a drift of the machine's speed touches both alike.
        let (greedy, sampled) = pool(threads)?.install(|| -> Result<_> {
            let mut session = Session::open(&bench.model)?;
            let (mut greedy, mut sampled) = (Vec::new(), Vec::new());
            for _ in 0..args.runs {
                greedy.push(bench.once(&mut session, prompt, None)?);
                if args.sampled {
                    sampled.push(bench.once_with(&sampled_config, &mut session, prompt, None)?);
                }
            }
            Ok((greedy, sampled))
        })?;
        let rate = |results: &[GenerationResult], f: fn(&GenerationResult) -> f64| {
            median(&results.iter().map(f).collect::<Vec<_>>())
        };
        let decode = rate(&greedy, GenerationResult::decode_tokens_per_second);
        let sampled_cols = if args.sampled {
            let s = rate(&sampled, GenerationResult::decode_tokens_per_second);
            let ratio = if decode > 0.0 { s / decode } else { 0.0 };
            format!(" | {s:>14.2} | {ratio:>6.2}x")
        } else {
            String::new()
        };
        out!(
            "{threads:>8} | {:>14.1} | {decode:>13.2}{sampled_cols}",
            rate(&greedy, GenerationResult::prefill_tokens_per_second),
        );
    }
    Ok(())
}

/// "1.52+7.87+0.43": milliseconds a round spends drafting (proposing and observing), verifying and
/// rolling back, averaged over the rounds.
pub(crate) fn round_costs(spec: &SpecStats) -> String {
    if spec.rounds == 0 {
        return "-".into();
    }
    let ms = |s: f64| s * 1e3 / spec.rounds as f64;
    format!(
        "{:.2}+{:.2}+{:.2}",
        ms(spec.draft_seconds),
        ms(spec.verify_seconds),
        ms(spec.rollback_seconds)
    )
}

/// "0.81 0.64 -" : conditional acceptance per position.
fn per_position(spec: &SpecStats) -> String {
    spec.per_position_rate()
        .iter()
        .map(|r| r.map_or("-".to_string(), |r| format!("{r:.2}")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One drafter's rows: which drafter, its blocks (`None`: auto), and `(start, most)` of its auto block.
type DrafterPlan = (Drafter, Vec<Option<usize>>, (usize, usize));

fn speculative(
    bench: &Bench,
    args: &BenchArgs,
    prompt: &[u32],
    plans: &[DrafterPlan],
) -> Result<()> {
    let threads = args.threads_list.iter().copied().max().unwrap_or(1);
    pool(threads)?.install(|| -> Result<()> {
        let mut plain = Session::open(&bench.model)?;
        let sequential = bench.runs(args.runs, &mut plain, prompt, None)?;
        let seq_rate = median(
            &sequential
                .iter()
                .map(GenerationResult::decode_tokens_per_second)
                .collect::<Vec<_>>(),
        );
        let seq_ids = sequential.first().map(|r| r.token_ids.clone()).unwrap_or_default();
        out!(
            "\nspeculative (greedy, {threads} thread(s)): prompt {} tokens, {} tokens, median of {} run(s); \
             ratio: median of each run over a sequential run just before it",
            prompt.len(),
            args.gen_tokens,
            args.runs
        );
        out!(
            "{:>18} | {:>12} | {:>7} | {:>14} | {:>18} | {:>22} | {:>11}",
            "decoding",
            "decode tok/s",
            "ratio",
            "accepted/round",
            "ms/round d+v+r",
            "per-position accepted",
            "same tokens"
        );
        out!(
            "{:->18}-+-{:->12}-+-{:->7}-+-{:->14}-+-{:->18}-+-{:->22}-+-{:->11}",
            "", "", "", "", "", "", ""
        );
        out!(
            "{:>18} | {seq_rate:>12.2} | {:>7} | {:>14} | {:>18} | {:>22} | {:>11}",
            "sequential", "1.00x", "-", "-", "-", "-"
        );
        for (drafter, blocks, (auto_start, auto_most)) in plans {
            // The drafter where the engine runs it: on the target's device.
            let options = args.drafter_options.options()?;
            let loaded =
                turbospark::runtime::load_drafter(&bench.model, &bench.checkpoint, *drafter, &options)?;
            let name = loaded.name();
            let mut session = Session::open(&bench.model)?.with_drafter(loaded);
            // `auto` as the engine plans it: tuned up to what the device verifies exactly.
            let auto_max = bench
                .model
                .max_exact_block()
                .map_or(*auto_most, |m| m.clamp(1, *auto_most));
            speculative_rows(
                bench,
                args,
                prompt,
                (&mut session, &mut plain),
                (name, blocks),
                (*auto_start.min(&auto_max), auto_max),
                &seq_ids,
            )?;
        }
        Ok(())
    })
}

/// The rows of one drafter's blocks (its session attached; each run paired with a run of `plain`, the
/// sequential session, just before it), against the sequential tokens.
fn speculative_rows(
    bench: &Bench,
    args: &BenchArgs,
    prompt: &[u32],
    (session, plain): (&mut Session<ModelState>, &mut Session<ModelState>),
    (name, blocks): (&str, &[Option<usize>]),
    (auto_start, auto_max): (usize, usize),
    seq_ids: &[u32],
) -> Result<()> {
    for &block in blocks {
        let spec = match block {
            Some(b) => Speculative::new(b),
            None => Speculative::tuned(auto_start, auto_max),
        };
        let mut results = Vec::with_capacity(args.runs);
        let mut ratios = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            let seq = bench.once(plain, prompt, None)?.decode_tokens_per_second();
            let r = bench.once(session, prompt, Some(spec))?;
            ratios.push(if seq > 0.0 {
                r.decode_tokens_per_second() / seq
            } else {
                0.0
            });
            results.push(r);
        }
        // auto: the session's tuner carries over between runs (as between a server's requests), so
        // the first run, which starts tuning cold, gets its own row, and the rest their median.
        let split = match block {
            Some(_) => 0,
            None => 1.min(results.len()),
        };
        let groups: Vec<(&[GenerationResult], &[f64], &str)> = match block {
            Some(_) => vec![(&results[..], &ratios[..], "")],
            None if results.len() > 1 => vec![
                (&results[..split], &ratios[..split], " 1st"),
                (&results[split..], &ratios[split..], ""),
            ],
            None => vec![(&results[..], &ratios[..], " 1st")],
        };
        for (runs, ratios, suffix) in groups {
            let rate = median(
                &runs
                    .iter()
                    .map(GenerationResult::decode_tokens_per_second)
                    .collect::<Vec<_>>(),
            );
            let ratio = median(ratios);
            let spec = runs
                .first()
                .and_then(|r| r.spec.clone())
                .unwrap_or_default();
            let same = runs.iter().all(|r| r.token_ids == seq_ids);
            // auto: the block most rounds of the group's first run proposed.
            let label = match block {
                Some(b) => format!("{name} {b}"),
                None => {
                    let most = (spec.rounds_by_block.iter().enumerate())
                        .max_by_key(|&(_, n)| *n)
                        .map_or(0, |(b, _)| b);
                    format!("{name} auto ~{most}{suffix}")
                }
            };
            out!(
                "{:>18} | {rate:>12.2} | {:>7} | {:>14.2} | {:>18} | {:>22} | {:>11}",
                label,
                format!("{ratio:.2}x"),
                spec.accepted_per_round(),
                round_costs(&spec),
                per_position(&spec),
                if same { "yes" } else { "NO" }
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn random_ids_are_seeded_and_inside_the_vocabulary() {
        let a = random_ids(7, 100, 50);
        assert_eq!(a, random_ids(7, 100, 50));
        assert_ne!(a, random_ids(8, 100, 50));
        assert!(a.iter().all(|&t| t < 50));
    }

    #[test]
    fn speculative_blocks_follow_the_policy() {
        let both = DrafterAvailability {
            mtp: true,
            dflash: true,
            dflash_max_block: Some(15),
        };
        let mtp = |flag| speculative_blocks(flag, Drafter::Mtp, &both);
        let all = vec![Some(1), Some(2), Some(3), Some(4), None];
        assert_eq!(mtp(None).unwrap(), all);
        assert!(mtp(Some("off")).unwrap().is_empty());
        assert_eq!(mtp(Some("2,3")).unwrap(), vec![Some(2), Some(3)]);
        assert_eq!(mtp(Some("2,auto")).unwrap(), vec![Some(2), None]);
        assert!(mtp(Some("2,off")).is_err());
        let bad = format!("{:#}", mtp(Some("x")).unwrap_err());
        assert!(bad.contains("--speculative"), "{bad}");
        assert!(mtp(Some("99")).is_err()); // beyond the MTP maximum
                                           // DFlash: up to its trained block, which also bounds the defaults.
        let dflash = |flag, max| {
            let a = DrafterAvailability {
                dflash_max_block: Some(max),
                ..both
            };
            speculative_blocks(flag, Drafter::Dflash, &a)
        };
        let defaults = vec![Some(1), Some(2), Some(4), Some(8), Some(15), None];
        assert_eq!(dflash(None, 15).unwrap(), defaults);
        assert_eq!(
            dflash(None, 4).unwrap(),
            vec![Some(1), Some(2), Some(4), None]
        );
        assert_eq!(dflash(Some("12"), 15).unwrap(), vec![Some(12)]);
        assert!(dflash(Some("16"), 15).is_err());
        // Which drafters: auto takes every one there is; a named one must be there.
        let mtp_only = DrafterAvailability {
            dflash: false,
            dflash_max_block: None,
            ..both
        };
        let auto = DrafterRequest::Auto;
        assert_eq!(
            drafters_to_bench(auto, &both).unwrap(),
            vec![Drafter::Mtp, Drafter::Dflash, Drafter::MtpSuffix]
        );
        assert_eq!(
            drafters_to_bench(auto, &mtp_only).unwrap(),
            vec![Drafter::Mtp, Drafter::MtpSuffix]
        );
        let missing = format!(
            "{:#}",
            drafters_to_bench(DrafterRequest::Dflash, &mtp_only).unwrap_err()
        );
        assert!(missing.contains("dflash"), "{missing}");
        // Prompt lookup: any checkpoint, only when named, blocks up to the exactness cap; `auto`
        // without drafter weights is the suffix drafter.
        let none = DrafterAvailability::default();
        assert_eq!(
            drafters_to_bench(auto, &none).unwrap(),
            vec![Drafter::Suffix]
        );
        assert_eq!(
            drafters_to_bench(DrafterRequest::Ngram, &none).unwrap(),
            vec![Drafter::Ngram]
        );
        let ngram = |flag| speculative_blocks(flag, Drafter::Ngram, &none);
        assert_eq!(ngram(None).unwrap(), vec![Some(2), Some(4), Some(8), None]);
        assert_eq!(ngram(Some("16,auto")).unwrap(), vec![Some(16), None]);
        assert!(ngram(Some("17")).is_err());
    }
}
