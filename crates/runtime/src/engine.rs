//! An opened checkpoint ready to generate: the target model on its device (`device::Model`: the CPU
//! engine or the CUDA backend), its tokenizer, EOS ids, chat template, and which drafters it carries.
//! Front ends (CLI, server, C ABI) all go through this and `policy::resolve`.
//!
//! The drafters with weights run on the target's device (`Model::mtp_drafter`, `Model::dflash_drafter`:
//! the host drafter for a CPU target, the GPU one next to a GPU target; a drafter the GPU cannot run is
//! an error, not a silent move to the host). Prompt lookup (`ngram`) and the suffix drafter (`suffix`)
//! read only committed token ids, on the host, for any target, built with [`Engine::drafter_options`]. Where a drafter runs never changes what is generated: acceptance depends
//! only on the target's logits.

use std::path::Path;

use device::{BoxedDrafter, Device, Model, ModelState};
use model_io::Checkpoint;

use crate::chat::ChatTemplate;
use crate::drafter_options::DrafterOptions;
use crate::error::RuntimeError;
use crate::generate::Speculative;
use crate::policy::{
    self, Drafter, DrafterAvailability, DrafterRequest, Speculation, SpeculationPlan,
};
use crate::session::Session;

/// What drafters a checkpoint carries, read from its files without loading any weights: the MTP head from
/// the `mtp.*` tensor names, the DFlash drafter from `dflash/config.json` (its block size bounds the block).
pub fn availability(ck: &Checkpoint) -> DrafterAvailability {
    let dflash_block = ck
        .has_dflash
        .then(|| {
            drafters::dflash::DflashConfig::from_json_file(
                &ck.dir.join("dflash").join("config.json"),
            )
            .ok()
        })
        .flatten()
        .map(|c| c.block_size.saturating_sub(1));
    DrafterAvailability {
        mtp: ck.has_mtp,
        dflash: dflash_block.is_some(),
        dflash_max_block: dflash_block,
    }
}

/// Loads `drafter` for `model`, on the model's device (a weight-free one built with `options`).
pub fn load_drafter(
    model: &Model,
    ck: &Checkpoint,
    drafter: Drafter,
    options: &DrafterOptions,
) -> Result<BoxedDrafter, RuntimeError> {
    let mtp = || match model.mtp_drafter(ck)? {
        Some(head) => Ok(head),
        None => Err(RuntimeError::SpeculationUnavailable {
            request: "--drafter mtp".into(),
            reason: "this checkpoint carries no MTP head (mtp.* tensors)".into(),
        }),
    };
    Ok(match drafter {
        Drafter::Mtp => mtp()?,
        Drafter::MtpSuffix => Box::new(drafters::MtpOrSuffix::new(mtp()?, options.suffix())),
        Drafter::Dflash => model.dflash_drafter(ck)?,
        // No weights and no taps: the same host drafter whatever the target's device.
        Drafter::Ngram => options.ngram(),
        Drafter::Suffix => Box::new(options.suffix()),
    })
}

/// A session ready to serve requests under one speculation plan (`Engine::prepare`).
pub struct Prepared {
    pub session: Session<ModelState>,
    /// What to pass as `Request::speculative` (`None`: sequential).
    pub speculative: Option<Speculative>,
    /// "mtp, block 2 (auto: ...)" or "sequential", for stats lines and logs.
    pub mode: String,
    /// Why an `auto` plan decodes sequentially, to show once.
    pub warning: Option<String>,
}

pub struct Engine {
    pub checkpoint: Checkpoint,
    pub model: Model,
    /// Why `--device auto` fell back to the CPU although a GPU seemed present, if it did.
    pub device_note: Option<String>,
    pub tokenizer: tokenizers::Tokenizer,
    pub eos: Vec<u32>,
    pub chat: Option<ChatTemplate>,
    /// How the weight-free drafters of the sessions opened from here are built (the front end's
    /// `--ngram-min`, `--ngram-max`, `--suffix-memory`; defaults until it sets them).
    pub drafter_options: DrafterOptions,
}

impl Engine {
    /// Opens `dir` on the CPU (config, weights, tokenizer); a missing chat template is not an error
    /// until `--chat`.
    pub fn open(dir: &Path) -> Result<Self, RuntimeError> {
        Self::open_on(dir, Device::Cpu)
    }

    /// Opens `dir` with the target on `device` (`cuda` on a machine without a GPU is the error).
    pub fn open_on(dir: &Path, device: Device) -> Result<Self, RuntimeError> {
        Self::open_checked(dir, device, Speculation::Off, DrafterRequest::Auto)
    }

    /// [`Engine::open_on`] for sessions that will speculate as `spec` / `drafter` ask: a named block the
    /// checkpoint cannot serve (no such drafter, a block outside its range) is refused from the
    /// checkpoint's files, before any weight is loaded. What the device verifies exactly is checked
    /// when a session is planned ([`Engine::plan`]).
    pub fn open_checked(
        dir: &Path,
        device: Device,
        spec: Speculation,
        drafter: DrafterRequest,
    ) -> Result<Self, RuntimeError> {
        Self::open_with(dir, device, spec, drafter, None)
    }

    /// [`Engine::open_checked`], with the weight matrices quantized at load as `quantize` asks
    /// (`--quantize`; the CPU's kernels: a GPU device is refused, as is a checkpoint already quantized).
    pub fn open_with(
        dir: &Path,
        device: Device,
        spec: Speculation,
        drafter: DrafterRequest,
        quantize: Option<model_io::Quantize>,
    ) -> Result<Self, RuntimeError> {
        let mut checkpoint = Checkpoint::open(dir)?;
        checkpoint.tensors.set_quantize(quantize)?;
        if let Speculation::Block(_) = spec {
            policy::resolve(spec, drafter, &availability(&checkpoint))?;
        }
        let loaded = Model::load(&checkpoint, device)?;
        let tokenizer = checkpoint.tokenizer()?;
        let eos = checkpoint.eos_token_ids();
        let chat = match &checkpoint.gguf_vocab {
            // A GGUF model: `tokenizer.chat_template`, with its vocabulary's bos/eos tokens.
            Some(vocab) => checkpoint.chat_template.as_ref().and_then(|t| {
                ChatTemplate::new(t.clone(), vocab.special_tokens(), dir.display().to_string()).ok()
            }),
            None => ChatTemplate::from_model_dir(dir).ok(),
        };
        Ok(Engine {
            checkpoint,
            model: loaded.model,
            device_note: loaded.note,
            tokenizer,
            eos,
            chat,
            drafter_options: DrafterOptions::default(),
        })
    }

    /// Drafters this checkpoint carries (detection only).
    pub fn availability(&self) -> DrafterAvailability {
        availability(&self.checkpoint)
    }

    /// Resolves the request against what the checkpoint carries (errors for a named block that cannot be
    /// served; `auto` comes back Disabled with a warning). On a device whose verify pass is exact only
    /// up to some rows (`Model::max_exact_block`), a named larger block is refused and `auto`'s block is
    /// capped, so speculative decoding always reproduces sequential decoding.
    pub fn plan(
        &self,
        spec: Speculation,
        drafter: DrafterRequest,
    ) -> Result<SpeculationPlan, RuntimeError> {
        let plan = policy::resolve(spec, drafter, &self.availability())?;
        // Tuning stays within what the device verifies exactly.
        let plan = match (plan, self.model.max_exact_block()) {
            (
                SpeculationPlan::Enabled {
                    drafter,
                    block,
                    tune_up_to: Some(up),
                },
                Some(max),
            ) => SpeculationPlan::Enabled {
                drafter,
                block,
                tune_up_to: Some(up.min(max.max(1))),
            },
            (plan, _) => plan,
        };
        match (plan, self.model.max_exact_block()) {
            (
                SpeculationPlan::Enabled {
                    drafter,
                    block,
                    tune_up_to,
                },
                Some(max),
            ) if block > max => {
                if let Speculation::Block(n) = spec {
                    return Err(RuntimeError::SpeculationUnavailable {
                        request: format!("--speculative {n}"),
                        reason: format!(
                            "on {} a verify pass of more than {} rows is not batch-invariant, so it \
                             would not reproduce sequential decoding; use a block of at most {max}",
                            self.model.device_name(),
                            max + 1
                        ),
                    });
                }
                Ok(if max == 0 {
                    SpeculationPlan::Disabled {
                        warning: Some(format!(
                            "speculative decoding is off: {} verifies one row at a time exactly",
                            self.model.device_name()
                        )),
                    }
                } else {
                    SpeculationPlan::Enabled {
                        drafter,
                        block: max,
                        tune_up_to,
                    }
                })
            }
            (plan, _) => Ok(plan),
        }
    }

    /// Plans `spec` / `drafter` (`Engine::plan`: a named block that cannot be served is the error) and
    /// opens a session for it: tape rollback and exact acceptance; an `auto` plan tunes the block of
    /// greedy runs. The one place the CLI, the server and the C API turn flags into a session.
    pub fn prepare(
        &self,
        spec: Speculation,
        drafter: DrafterRequest,
    ) -> Result<Prepared, RuntimeError> {
        let plan = self.plan(spec, drafter)?;
        let (speculative, mode, warning) = match &plan {
            SpeculationPlan::Enabled {
                drafter,
                block,
                tune_up_to,
            } => match tune_up_to {
                Some(max) => (
                    Some(Speculative::tuned(*block, *max)),
                    format!(
                        "{drafter}, block {block} (auto: tuned within 0..={max} when greedy, 0 = plain steps)"
                    ),
                    None,
                ),
                None => (
                    Some(Speculative::new(*block)),
                    format!("{drafter}, block {block}"),
                    None,
                ),
            },
            SpeculationPlan::Disabled { warning } => (None, "sequential".into(), warning.clone()),
        };
        Ok(Prepared {
            session: self.session(&plan)?,
            speculative,
            mode,
            warning,
        })
    }

    /// A new session on the model's device; with the drafter the plan enabled attached.
    pub fn session(&self, plan: &SpeculationPlan) -> Result<Session<ModelState>, RuntimeError> {
        let session = Session::open(&self.model)?;
        Ok(match plan {
            SpeculationPlan::Enabled { drafter, .. } => session.with_drafter(load_drafter(
                &self.model,
                &self.checkpoint,
                *drafter,
                &self.drafter_options,
            )?),
            SpeculationPlan::Disabled { .. } => session,
        })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, RuntimeError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| RuntimeError::InvalidRequest {
                field: "prompt",
                reason: format!("tokenizer could not encode it: {e}"),
            })?;
        Ok(enc.get_ids().to_vec())
    }
}
