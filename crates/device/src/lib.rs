//! Where a model runs, chosen once per process: `--device cpu|cuda|auto`.
//!
//! - [`Device`] is the request; [`Device::resolve`] turns it into a [`Placement`] on this machine:
//!   `cpu` is the CPU engine; `cuda` opens GPU 0 or fails with one line saying why (no driver, no
//!   device, a missing CUDA library); `auto` takes the GPU when a CUDA driver is present and the device
//!   opens, else the CPU with a note saying why not (none when there is simply no driver);
//!   `cuda-emulated` is the CUDA backend's host emulation (every GPU operation run on the CPU: slow,
//!   for tests of the CUDA path on machines without a GPU).
//! - [`Model`] / [`ModelState`] dispatch the decode loop's seam (`families::Backend`,
//!   `families::BackendState`) to the CPU engine or the CUDA backend with a `match` on the variant
//!   (candle's `enum Storage { Cpu, Cuda }`): the loop is written once, callers carry no `#[cfg]` and
//!   no `dyn`. A state only ever runs on the model kind that made it (a mismatch is an error).
//!
//! Drafters: [`Model::mtp_drafter`] and [`Model::dflash_drafter`] put the checkpoint's MTP head and
//! DFlash drafter on the target's device (the host `drafters::MtpHead` / `DflashDrafter` for a CPU
//! target, `cuda_backend::CudaMtp` / `CudaDflash` next to a GPU target, sharing its embedding and LM
//! head buffers; the GPU forward returns the verified rows' taps in host memory and they upload them).
//! [`Model::head`] lends a host drafter the target's embedding table and LM head (the CPU engine
//! itself, or a host copy for a GPU model). Exactness is unaffected: acceptance depends only on the
//! target's logits.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use cuda_backend::{
    CudaDevice, CudaDflash, CudaError, CudaModel, CudaMtp, CudaSnapshot, CudaState, LoadOptions,
};
use drafters::{DflashDrafter, Drafter, MtpHead};
use families::{
    Backend, BackendError, BackendState, ForwardOut, HostHead, ModelError, SeqRows, SharedHead,
    State, Transformer, Wanted,
};
use model_io::Checkpoint;

/// The device a run asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
    /// CUDA when a driver is present and the device opens, else CPU.
    #[default]
    Auto,
    /// The CUDA backend on its host emulation (tests; never chosen by `auto`).
    CudaEmulated,
}

/// A `--device` value that is none of the known names.
#[derive(Debug, thiserror::Error)]
#[error("unknown device {value:?}: expected cpu, cuda or auto")]
pub struct UnknownDevice {
    pub value: String,
}

impl FromStr for Device {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda),
            "auto" => Ok(Device::Auto),
            "cuda-emulated" => Ok(Device::CudaEmulated),
            _ => Err(UnknownDevice {
                value: s.to_string(),
            }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Auto => "auto",
            Device::CudaEmulated => "cuda-emulated",
        })
    }
}

/// A resolved device.
#[derive(Clone)]
pub enum Placement {
    Cpu,
    Cuda(Arc<CudaDevice>),
}

impl Placement {
    pub fn is_cuda(&self) -> bool {
        matches!(self, Placement::Cuda(_))
    }
}

/// What [`Device::resolve`] chose, and why `auto` fell back to the CPU when a GPU seemed present.
pub struct Resolved {
    pub placement: Placement,
    pub note: Option<String>,
}

/// Whether `e` (e.g. the source of a `BackendError::Device`) says the GPU could not be opened here:
/// no driver, no usable device, or a missing CUDA library (as opposed to a failure while running).
pub fn is_unavailable(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<CudaError>(),
        Some(
            CudaError::NoDriver { .. }
                | CudaError::NoDevice { .. }
                | CudaError::MissingLibrary { .. }
        )
    )
}

impl Device {
    /// Resolves the request on this machine (see the module doc). Only `cuda` can fail.
    pub fn resolve(self) -> Result<Resolved, BackendError> {
        let cpu = |note| Resolved {
            placement: Placement::Cpu,
            note,
        };
        match self {
            Device::Cpu => Ok(cpu(None)),
            Device::CudaEmulated => Ok(Resolved {
                placement: Placement::Cuda(Arc::new(CudaDevice::emulated())),
                note: None,
            }),
            Device::Cuda => Ok(Resolved {
                placement: Placement::Cuda(Arc::new(CudaDevice::open()?)),
                note: None,
            }),
            Device::Auto if !cuda_backend::driver_present() => Ok(cpu(None)),
            Device::Auto => match CudaDevice::open() {
                Ok(dev) => Ok(Resolved {
                    placement: Placement::Cuda(Arc::new(dev)),
                    note: None,
                }),
                Err(e) => Ok(cpu(Some(format!("using the CPU: {e}")))),
            },
        }
    }
}

/// A target model on its device.
#[derive(Clone)]
pub enum Model {
    Cpu(Arc<Transformer>),
    Cuda(Arc<CudaModel>),
}

/// The per-sequence state of a [`Model`], on the same device (the CUDA state is boxed: it holds its
/// scratch descriptors inline and is ~2 KB, the CPU state ~100 bytes).
pub enum ModelState {
    Cpu(State),
    Cuda(Box<CudaState>),
}

/// A saved [`ModelState`].
pub enum ModelSnapshot {
    Cpu(State),
    Cuda(CudaSnapshot),
}

/// A loaded model and, when `auto` fell back to the CPU, why.
pub struct Loaded {
    pub model: Model,
    pub note: Option<String>,
}

impl From<Transformer> for Model {
    fn from(m: Transformer) -> Self {
        Model::Cpu(Arc::new(m))
    }
}

impl From<Arc<Transformer>> for Model {
    fn from(m: Arc<Transformer>) -> Self {
        Model::Cpu(m)
    }
}

impl From<CudaModel> for Model {
    fn from(m: CudaModel) -> Self {
        Model::Cuda(Arc::new(m))
    }
}

fn mismatch(model: &str, state: &str) -> BackendError {
    ModelError::StateMismatch(format!("a {state} state given to a {model} model")).into()
}

impl Model {
    /// Resolves `device` and loads the checkpoint's target there. The GPU keeps its default load
    /// options (bf16 weights, batch-invariant verify kernels, decode graphs). Under `auto`, a model the
    /// CUDA backend does not implement (an `Unsupported` shape or feature) runs on the CPU, with a note.
    pub fn load(ck: &Checkpoint, device: Device) -> Result<Loaded, BackendError> {
        let resolved = device.resolve()?;
        match resolved.placement {
            Placement::Cpu => Ok(Loaded {
                model: Model::Cpu(Arc::new(families::load(ck)?)),
                note: resolved.note,
            }),
            Placement::Cuda(dev) => {
                match CudaModel::load(&dev, ck, LoadOptions::for_checkpoint(ck)) {
                    Ok(m) => Ok(Loaded {
                        model: Model::Cuda(Arc::new(m)),
                        note: None,
                    }),
                    Err(e @ CudaError::Unsupported { .. }) if device == Device::Auto => {
                        Ok(Loaded {
                            model: Model::Cpu(Arc::new(families::load(ck)?)),
                            note: Some(format!("using the CPU: {e}")),
                        })
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// "cpu", "cuda" or "cuda (host emulation)".
    pub fn device_name(&self) -> &'static str {
        match self {
            Model::Cpu(_) => "cpu",
            Model::Cuda(m) if m.device().is_emulated() => "cuda (host emulation)",
            Model::Cuda(_) => "cuda",
        }
    }

    /// How the model runs decode steps, for logs. GPU: CUDA graphs, programmatic launch, GEMV segments and
    /// chained greedy steps, each with why it is off when it is (a slower path, never silent). CPU: the
    /// kernels' instruction sets (AMX tiles, AVX-512, AVX2).
    pub fn device_notes(&self) -> Option<String> {
        let Model::Cuda(m) = self else {
            return Some(format!("cpu kernels: {}", kernels::simd_path()));
        };
        let (dev, opts) = (m.device(), m.options());
        let pdl = match dev.pdl_failure() {
            Some(why) => format!("off ({why})"),
            None if dev.pdl() => "on".into(),
            None => "off".into(),
        };
        let segments = match (opts.segments, dev.segment_status()) {
            (false, _) => "off (TURBOSPARK_SEGMENTS=0)".into(),
            (true, Ok(kernel)) => format!("on, {kernel}"),
            (true, Err(why)) => format!("off ({why})"),
        };
        Some(format!(
            "graphs {}, programmatic launch {pdl}, GEMV segments {segments}, greedy steps {}",
            if opts.graphs { "on" } else { "off" },
            if opts.chain {
                "chained"
            } else {
                "one at a time (TURBOSPARK_CHAIN=0)"
            }
        ))
    }

    /// Most proposals per speculative round whose verify pass computes every row exactly as a one-row
    /// decode step (so speculative decoding reproduces sequential decoding): on the CPU the kernels' row
    /// paths (`families::EXACT_ROWS` rows: 16 proposals); on the GPU, rows up to
    /// `LoadOptions::gemv_max_rows` stay on the batch-invariant kernel.
    pub fn max_exact_block(&self) -> Option<usize> {
        match self {
            Model::Cpu(_) => Some(families::EXACT_ROWS - 1),
            Model::Cuda(m) => Some(m.options().gemv_max_rows.saturating_sub(1)),
        }
    }

    /// The CPU engine, when the model runs on the CPU.
    pub fn as_cpu(&self) -> Option<&Arc<Transformer>> {
        match self {
            Model::Cpu(m) => Some(m),
            Model::Cuda(_) => None,
        }
    }

    /// What host drafters read from this target: the CPU engine itself, or for a GPU model the
    /// embedding table (f32) and LM head of `ck` loaded to host memory (loaded on each call).
    pub fn head(&self, ck: &Checkpoint) -> Result<SharedHead, BackendError> {
        Ok(match self {
            Model::Cpu(m) => m.clone(),
            Model::Cuda(_) => Arc::new(HostHead::load(ck)?),
        })
    }
}

/// The MTP drafter [`Model::mtp_drafter`] built, with the device it runs on.
pub type BoxedDrafter = Box<dyn Drafter + Send>;

impl Model {
    /// The checkpoint's MTP head on this model's device: the host `MtpHead` reading the CPU engine, or
    /// `CudaMtp` on the GPU next to the target. `Ok(None)` when the checkpoint carries no head. A head
    /// the GPU cannot run (an `Unsupported` shape) is an error, never a silent move to the
    /// host.
    pub fn mtp_drafter(&self, ck: &Checkpoint) -> Result<Option<BoxedDrafter>, BackendError> {
        Ok(match self {
            Model::Cpu(m) => MtpHead::load(ck, m.clone())?.map(|h| {
                let tokens = drafters::mtp::draft_vocab(m.vocab);
                Box::new(h.with_draft_vocab(tokens)) as BoxedDrafter
            }),
            Model::Cuda(m) => match CudaMtp::load(m, ck)? {
                Some(h) => {
                    let h = h.with_draft_vocab(drafters::mtp::draft_vocab(m.vocab))?;
                    Some(Box::new(h) as BoxedDrafter)
                }
                None => None,
            },
        })
    }

    /// The checkpoint's DFlash drafter (`dflash/`) on this model's device: the host `DflashDrafter`
    /// reading the CPU engine, or `CudaDflash` on the GPU next to the target (a shape the GPU cannot
    /// run is an error, never a silent move to the host).
    pub fn dflash_drafter(&self, ck: &Checkpoint) -> Result<BoxedDrafter, BackendError> {
        let dir = ck.dir.join("dflash");
        Ok(match self {
            Model::Cpu(m) => Box::new(DflashDrafter::load(&dir, m.clone())?),
            Model::Cuda(m) => Box::new(CudaDflash::load(m, &dir)?),
        })
    }
}

impl Backend for Model {
    type State = ModelState;

    fn context(&self) -> usize {
        match self {
            Model::Cpu(m) => m.context,
            Model::Cuda(m) => m.context,
        }
    }

    fn vocab(&self) -> usize {
        match self {
            Model::Cpu(m) => m.vocab,
            Model::Cuda(m) => m.vocab,
        }
    }

    fn new_state(&self) -> Result<ModelState, BackendError> {
        Ok(match self {
            Model::Cpu(m) => ModelState::Cpu(Backend::new_state(&**m)?),
            Model::Cuda(m) => ModelState::Cuda(Box::new(Backend::new_state(&**m)?)),
        })
    }

    fn reserve(&self, state: &mut ModelState, positions: usize) -> Result<(), BackendError> {
        match (self, state) {
            (Model::Cpu(m), ModelState::Cpu(s)) => m.reserve(s, positions),
            (Model::Cuda(m), ModelState::Cuda(s)) => m.reserve(s, positions),
            (m, s) => Err(mismatch(m.device_name(), s.device_name())),
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut ModelState,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        match (self, state) {
            (Model::Cpu(m), ModelState::Cpu(s)) => Backend::forward(&**m, tokens, start, s, wanted),
            (Model::Cuda(m), ModelState::Cuda(s)) => {
                Backend::forward(&**m, tokens, start, s, wanted)
            }
            (m, s) => Err(mismatch(m.device_name(), s.device_name())),
        }
    }

    /// On the CPU, the engine's batched forward over every sequence (each keeps its own bits); on the
    /// GPU, one forward per sequence.
    fn forward_batch(
        &self,
        batch: &mut [SeqRows<'_, ModelState>],
    ) -> Result<Vec<ForwardOut>, BackendError> {
        match self {
            Model::Cpu(m) => {
                let mut cpu = Vec::with_capacity(batch.len());
                for s in batch.iter_mut() {
                    let ModelState::Cpu(state) = &mut *s.state else {
                        return Err(mismatch(self.device_name(), s.state.device_name()));
                    };
                    cpu.push(SeqRows {
                        tokens: s.tokens,
                        start: s.start,
                        state,
                        wanted: s.wanted,
                    });
                }
                Ok(m.forward_batch(&mut cpu)?)
            }
            Model::Cuda(_) => batch
                .iter_mut()
                .map(|s| self.forward(s.tokens, s.start, s.state, s.wanted))
                .collect(),
        }
    }

    fn begin_tape(&self, state: &mut ModelState) -> Result<(), BackendError> {
        match (self, state) {
            (Model::Cpu(m), ModelState::Cpu(s)) => Backend::begin_tape(&**m, s),
            (Model::Cuda(m), ModelState::Cuda(s)) => Backend::begin_tape(&**m, s),
            (m, s) => Err(mismatch(m.device_name(), s.device_name())),
        }
    }

    fn rollback_retaining(
        &self,
        state: &mut ModelState,
        keep: usize,
    ) -> Result<bool, BackendError> {
        match (self, state) {
            (Model::Cpu(m), ModelState::Cpu(s)) => Backend::rollback_retaining(&**m, s, keep),
            (Model::Cuda(m), ModelState::Cuda(s)) => Backend::rollback_retaining(&**m, s, keep),
            (m, s) => Err(mismatch(m.device_name(), s.device_name())),
        }
    }

    fn greedy_chain(
        &self,
        first: u32,
        start: usize,
        state: &mut ModelState,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, BackendError> {
        match (self, state) {
            (Model::Cpu(m), ModelState::Cpu(s)) => {
                Backend::greedy_chain(&**m, first, start, s, max_steps, on_token)
            }
            (Model::Cuda(m), ModelState::Cuda(s)) => {
                Backend::greedy_chain(&**m, first, start, s, max_steps, on_token)
            }
            (m, s) => Err(mismatch(m.device_name(), s.device_name())),
        }
    }

    fn last_logits(&self, state: &mut ModelState) -> Result<Option<Vec<f32>>, BackendError> {
        match (self, state) {
            (Model::Cpu(m), ModelState::Cpu(s)) => Backend::last_logits(&**m, s),
            (Model::Cuda(m), ModelState::Cuda(s)) => Backend::last_logits(&**m, s),
            (m, s) => Err(mismatch(m.device_name(), s.device_name())),
        }
    }

    fn one_time_work(&self) -> u64 {
        match self {
            Model::Cpu(m) => Backend::one_time_work(&**m),
            Model::Cuda(m) => Backend::one_time_work(&**m),
        }
    }

    fn prefill_chunk(&self) -> usize {
        match self {
            Model::Cpu(m) => Backend::prefill_chunk(&**m),
            Model::Cuda(m) => Backend::prefill_chunk(&**m),
        }
    }
}

impl ModelState {
    pub fn device_name(&self) -> &'static str {
        match self {
            ModelState::Cpu(_) => "cpu",
            ModelState::Cuda(_) => "cuda",
        }
    }

    /// The CPU state, when the model runs on the CPU.
    pub fn as_cpu(&self) -> Option<&State> {
        match self {
            ModelState::Cpu(s) => Some(s),
            ModelState::Cuda(_) => None,
        }
    }
}

impl BackendState for ModelState {
    type Snapshot = ModelSnapshot;

    fn position(&self) -> usize {
        match self {
            ModelState::Cpu(s) => s.position(),
            ModelState::Cuda(s) => s.position(),
        }
    }

    fn is_recurrent(&self) -> bool {
        match self {
            ModelState::Cpu(s) => s.is_recurrent(),
            ModelState::Cuda(s) => s.is_recurrent(),
        }
    }

    fn rewind(&mut self, position: usize) -> bool {
        match self {
            ModelState::Cpu(s) => s.rewind(position),
            ModelState::Cuda(s) => s.rewind(position),
        }
    }

    fn has_tape(&self) -> bool {
        match self {
            ModelState::Cpu(s) => s.has_tape(),
            ModelState::Cuda(s) => s.has_tape(),
        }
    }

    fn end_tape(&mut self) {
        match self {
            ModelState::Cpu(s) => s.end_tape(),
            ModelState::Cuda(s) => s.end_tape(),
        }
    }

    fn save(&self) -> Result<ModelSnapshot, BackendError> {
        Ok(match self {
            ModelState::Cpu(s) => ModelSnapshot::Cpu(s.save()?),
            ModelState::Cuda(s) => ModelSnapshot::Cuda(s.save()?),
        })
    }

    fn restore(&mut self, snapshot: &ModelSnapshot) -> Result<(), BackendError> {
        match (self, snapshot) {
            (ModelState::Cpu(s), ModelSnapshot::Cpu(v)) => BackendState::restore(s, v),
            (ModelState::Cuda(s), ModelSnapshot::Cuda(v)) => BackendState::restore(&mut **s, v),
            (s, _) => Err(ModelError::StateMismatch(format!(
                "a snapshot of another device restored into a {} state",
                s.device_name()
            ))
            .into()),
        }
    }
}
