//! `turbospark perplexity FILE`: perplexity of a text file, computed as llama.cpp's `perplexity`
//! tool does by default.
//!
//! Exactly: the file is tokenized whole (no BOS or other special tokens added — Qwen tokenizers add
//! none). Windows of `ctx` tokens are taken at starts 0, stride, 2·stride, … while a full window
//! fits (a tail shorter than `ctx` is not scored). Each window is evaluated from an empty state (no
//! context carries between windows). Within a window, logits row j predicts window token j+1; the
//! scored targets are window tokens `first..ctx` and their negative log-likelihoods
//! `−log softmax(row j−1)[token j]` (f64) are summed over all windows:
//!
//! - default (`stride = ctx`, non-overlapping windows): `first = ctx/2 + 1`, i.e. llama.cpp's
//!   "second half": rows `ctx/2 ..= ctx−2` are scored, `ctx − 1 − ctx/2` targets per window, and
//!   the first half of every window is context only;
//! - `--stride S` (1 ≤ S < ctx): windows start every S tokens and each scores its last S targets
//!   (`first = ctx − S`), so every token after the first window's context is scored exactly once,
//!   with at least `ctx − S` tokens of context (the sliding-window evaluation of HF's perplexity
//!   guide).
//!
//! Perplexity = exp(Σ nll / number of scored targets); the running value after each window is
//! printed, then the final value with its token count.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use turbospark::families::{Backend, Rows, Wanted};
use turbospark::runtime::PREFILL_CHUNK;

use crate::{progress, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score (UTF-8).
    pub file: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Start a window every N tokens and score its last N targets (default: ctx, scoring the
    /// second half of each window).
    #[arg(long, value_name = "N")]
    pub stride: Option<usize>,
}

/// Where the windows start and which of their tokens are scored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowPlan {
    pub ctx: usize,
    pub stride: usize,
    /// Window-local index of the first scored target; targets `first..ctx` are scored.
    pub first: usize,
    pub windows: usize,
}

impl WindowPlan {
    /// Plans `n_tokens` tokens; errors name the flag to change.
    pub fn new(n_tokens: usize, ctx: usize, stride: Option<usize>) -> Result<WindowPlan> {
        if ctx < 3 {
            bail!("invalid value {ctx} for --ctx: a window needs at least 3 tokens to score one");
        }
        let (stride, first) = match stride {
            None => (ctx, ctx / 2 + 1),
            Some(s) if (1..ctx).contains(&s) => (s, ctx - s),
            Some(s) => bail!("invalid value {s} for --stride: expected 1..={}", ctx - 1),
        };
        if n_tokens < ctx {
            bail!(
                "the file has {n_tokens} tokens, fewer than one window of --ctx {ctx}; pass a smaller --ctx"
            );
        }
        let windows = (n_tokens - ctx) / stride + 1;
        Ok(WindowPlan {
            ctx,
            stride,
            first,
            windows,
        })
    }

    /// Targets scored per window.
    pub fn scored_per_window(&self) -> usize {
        self.ctx - self.first
    }
}

/// `−log softmax(logits)[target]`, in f64.
pub fn negative_log_likelihood(logits: &[f32], target: u32) -> Result<f64> {
    let Some(&chosen) = logits.get(target as usize) else {
        bail!(
            "token {target} is outside the model's vocabulary of {}",
            logits.len()
        );
    };
    if let Some((index, bad)) = logits
        .iter()
        .enumerate()
        .find(|(_, x)| x.is_nan() || **x == f32::INFINITY)
    {
        bail!("the model produced logit {bad} at index {index}");
    }
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    if !max.is_finite() {
        bail!("every logit is -inf: the target has no probability");
    }
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    Ok(max + sum.ln() - chosen as f64)
}

/// Forward sizes: context-only chunks, and chunks that return logits (bounded so the [rows, vocab]
/// f32 buffer stays near 64 MiB).
#[derive(Clone, Copy, Debug)]
struct Chunks {
    context: usize,
    scored: usize,
}

impl Chunks {
    fn for_model(model: &impl Backend) -> Chunks {
        Chunks {
            context: PREFILL_CHUNK,
            scored: ((16 << 20) / model.vocab().max(1)).clamp(1, PREFILL_CHUNK),
        }
    }
}

/// Σ nll over the scored targets `first..` of one window, from an empty state. Feeds tokens
/// `0..ctx-1` (the last token is only a target); rows `first-1 ..= ctx-2` predict the targets, and
/// only chunks holding such rows ask for logits.
fn score_window<B: Backend>(
    model: &B,
    window: &[u32],
    first: usize,
    chunks: Chunks,
) -> Result<(f64, usize)> {
    let mut state = model.new_state()?;
    model.reserve(&mut state, window.len())?;
    let first_row = first.saturating_sub(1);
    let fed = window.len() - 1;
    let mut sum = 0.0;
    let mut count = 0;
    let mut pos = 0;
    while pos < fed {
        let limit = if pos < first_row {
            first_row.min(pos + chunks.context.max(1))
        } else {
            pos + chunks.scored.max(1)
        };
        let end = limit.min(fed);
        let logits = if end <= first_row {
            Rows::None
        } else {
            Rows::From(first_row.saturating_sub(pos))
        };
        let wanted = Wanted {
            logits,
            taps: Vec::new(),
            argmax_only: false,
            candidates: 0,
        };
        let out = model.forward(&window[pos..end], pos, &mut state, &wanted)?;
        for i in 0..out.rows {
            let row = pos + out.first_row + i;
            let target = window
                .get(row + 1)
                .copied()
                .context("internal: a logits row past the window")?;
            sum += negative_log_likelihood(out.row(i), target)?;
            count += 1;
        }
        pos = end;
    }
    Ok((sum, count))
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let dir = args.model.model_dir()?;
    let spinner = progress::spinner(format!("loading {}", dir.display()));
    let opened = crate::open_model(
        &args.model,
        &dir,
        turbospark::Speculation::Off,
        turbospark::DrafterRequest::Auto,
        turbospark::DrafterOptions::default(),
    );
    spinner.finish_and_clear();
    let model = opened?;
    let engine = model.engine();
    if args.ctx > engine.model.context() {
        bail!(
            "invalid value {} for --ctx: the model's context is {} tokens",
            args.ctx,
            engine.model.context()
        );
    }
    let tokens = engine
        .encode(&text)
        .with_context(|| format!("tokenizing {}", args.file.display()))?;
    let plan = WindowPlan::new(tokens.len(), args.ctx, args.stride)?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{}: {} tokens, {} windows of {} (stride {}), {} scored per window",
        args.file.display(),
        tokens.len(),
        plan.windows,
        plan.ctx,
        plan.stride,
        plan.scored_per_window()
    )?;
    let bar = progress::bar(plan.windows, "perplexity");
    let (mut total, mut scored) = (0.0f64, 0usize);
    for w in 0..plan.windows {
        let start = w * plan.stride;
        let window = tokens
            .get(start..start + plan.ctx)
            .context("internal: a window past the end of the file")?;
        let (sum, count) = model.install(|| {
            score_window(
                &engine.model,
                window,
                plan.first,
                Chunks::for_model(&engine.model),
            )
        })?;
        total += sum;
        scored += count;
        bar.inc(1);
        bar.suspend(|| {
            writeln!(
                out,
                "[{}/{}] window ppl {:.4}  running ppl {:.4}",
                w + 1,
                plan.windows,
                (sum / count.max(1) as f64).exp(),
                (total / scored.max(1) as f64).exp()
            )
        })?;
    }
    bar.finish_and_clear();
    let ppl = (total / scored.max(1) as f64).exp();
    writeln!(out, "perplexity: {ppl:.4} over {scored} tokens")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_windows_score_llama_cpp_second_half() {
        // 1100 tokens, ctx 512: windows at 0 and 512 (1024 + 512 > 1100); rows 256..=510 scored.
        let plan = WindowPlan::new(1100, 512, None).unwrap();
        assert_eq!(plan.windows, 2);
        assert_eq!(plan.stride, 512);
        assert_eq!(plan.first, 257);
        assert_eq!(plan.scored_per_window(), 255);
    }

    #[test]
    fn strided_windows_score_their_last_stride_targets() {
        // 20 tokens, ctx 8, stride 4: starts 0, 4, 8, 12 (12 + 8 = 20 fits), 4 targets each.
        let plan = WindowPlan::new(20, 8, Some(4)).unwrap();
        assert_eq!(plan.windows, 4);
        assert_eq!(plan.first, 4);
        assert_eq!(plan.scored_per_window(), 4);
    }

    #[test]
    fn bad_plans_name_the_flag() {
        let msg = |r: Result<WindowPlan>| format!("{:#}", r.unwrap_err());
        assert!(msg(WindowPlan::new(100, 2, None)).contains("--ctx"));
        assert!(msg(WindowPlan::new(100, 8, Some(8))).contains("--stride"));
        assert!(msg(WindowPlan::new(100, 8, Some(0))).contains("--stride"));
        assert!(msg(WindowPlan::new(7, 8, None)).contains("7 tokens"));
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        testdata::fixture(name)
    }

    /// Σ nll of targets `first..` from transformers' `logits_full` of the fixture's prompt.
    fn reference_nll(name: &str, first: usize) -> (Vec<u32>, f64) {
        let dir = fixture(name);
        let json = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        let ids: Vec<u32> = json["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let store = turbospark::model_io::TensorStore::open_files(
            &dir,
            &[dir.join("reference.safetensors")],
        )
        .unwrap();
        let logits = store.load_f32("logits_full", &[ids.len(), 512]).unwrap(); // [80, 512]
        let sum = (first..ids.len())
            .map(|t| negative_log_likelihood(&logits[(t - 1) * 512..t * 512], ids[t]).unwrap())
            .sum();
        (ids, sum)
    }

    #[test]
    fn window_nll_matches_transformers_logits_under_any_chunking() {
        for name in ["qwen3", "qwen3_5"] {
            let checkpoint = turbospark::model_io::Checkpoint::open(&fixture(name)).unwrap();
            let model = turbospark::families::load(&checkpoint).unwrap();
            let plan = WindowPlan::new(80, 80, None).unwrap(); // first = 41: rows 40..=78
            let (ids, expected) = reference_nll(name, plan.first);
            for chunks in [
                Chunks::for_model(&model),
                Chunks {
                    context: 7,
                    scored: 5,
                },
                Chunks {
                    context: 1,
                    scored: 1,
                },
            ] {
                let (sum, count) = score_window(&model, &ids, plan.first, chunks).unwrap();
                assert_eq!(count, 39, "{name} {chunks:?}");
                assert!(
                    (sum - expected).abs() < 1e-3 * expected.abs().max(1.0),
                    "{name} {chunks:?}: {sum} vs transformers {expected}"
                );
            }
        }
    }

    #[test]
    fn nll_is_minus_log_softmax() {
        // logits [0, ln 3]: softmax = [1/4, 3/4].
        let logits = [0.0f32, 3f32.ln()];
        assert!((negative_log_likelihood(&logits, 0).unwrap() - 4f64.ln()).abs() < 1e-6);
        assert!((negative_log_likelihood(&logits, 1).unwrap() - (4.0f64 / 3.0).ln()).abs() < 1e-6);
        assert!(negative_log_likelihood(&logits, 2).is_err());
        assert!(negative_log_likelihood(&[f32::NAN, 0.0], 0).is_err());
    }
}
