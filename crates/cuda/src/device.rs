//! Opening the GPU: dlopen the driver (cudarc dynamic loading, so the binary builds and starts without
//! CUDA), create a context and one non-default stream (graph capture needs one), compile the kernel
//! module with NVRTC for the device's sm_XY (cached on disk), and create a cuBLAS handle on the stream.
//!
//! Invariant: `open` never panics for a missing driver, library or device; each is one [`CudaError`]
//! line saying what is missing. Presence is checked with cudarc's `is_culib_present` before any call
//! that would otherwise panic inside the lazy loader.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{sys as dsys, CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::error::CudaError;
use crate::nvrtc;

/// Every kernel the backend launches (all must exist in the compiled module).
pub const KERNELS: &[&str] = &[
    "quant_input",
    "qgemv_q4_0",
    "qgemv_q4_1",
    "qgemv_q5_0",
    "qgemv_q5_1",
    "qgemv_q8_0",
    "qgemv_q4_k",
    "qgemv_q5_k",
    "qgemv_q6_k",
    "qdequant_bf16",
    "qembed",
    "fp8_gemv",
    "fp8_dequant_bf16",
    "linear_bf16_1",
    "linear_bf16_2",
    "linear_bf16_3",
    "linear_bf16_4",
    "linear_bf16_5",
    "linear_bf16_6",
    "linear_bf16_7",
    "linear_bf16_8",
    "linear_bf16_9",
    "linear_bf16_10",
    "linear_bf16_11",
    "linear_bf16_12",
    "linear_bf16_13",
    "linear_bf16_14",
    "linear_bf16_15",
    "linear_bf16_16",
    "linear_f32_1",
    "linear_f32_2",
    "linear_f32_3",
    "linear_f32_4",
    "linear_f32_5",
    "linear_f32_6",
    "linear_f32_7",
    "linear_f32_8",
    "linear_f32_9",
    "linear_f32_10",
    "linear_f32_11",
    "linear_f32_12",
    "linear_f32_13",
    "linear_f32_14",
    "linear_f32_15",
    "linear_f32_16",
    "linear_mma_t1_u4_b4_half",
    "mma_split_rows",
    "linear_mma_t1_u4_b4_full",
    "linear_mma_t1_u8_b3_half",
    "linear_mma_t1_u8_b3_full",
    "linear_mma_t2_u2_b4_half",
    "linear_mma_t2_u2_b4_full",
    "linear_mma_t2_u4_b2_half",
    "linear_mma_t2_u4_b2_full",
    "linear_mma_t2_u4_b3_half",
    "linear_mma_t2_u4_b3_full",
    "linear_mma_t4_u2_b2_half",
    "linear_mma_t4_u2_b2_full",
    "linear_mma_t4_u2_b3_half",
    "linear_mma_t4_u2_b3_full",
    "to_bf16",
    "embed_bf16",
    "embed_f32",
    "rmsnorm",
    "gated_rmsnorm",
    "silu_mul",
    "dflash_regroup",
    "argmax_parts",
    "argmax_rows",
    "topk_parts",
    "topk_merge",
    "fill_normal_bf16",
    "read_stream",
    "moe_route",
    "moe_gate_up_bf16",
    "moe_gate_up_f32",
    "moe_down_bf16",
    "moe_down_f32",
    "attn_prep",
    "attn_split_1",
    "attn_split_2",
    "attn_split_4",
    "attn_split_1_d128",
    "attn_split_2_d128",
    "attn_split_4_d128",
    "attn_combine",
    "attn_tc_16",
    "attn_tc_32",
    "attn_tc_64",
    "attn_tc_128",
    "attn_tc_256",
    "attn_tc_combine",
    "gdn_conv_prep",
    "gdn_rec",
    "gdn_step",
    "gdn_step_into",
    "gdn_chunk_prep",
    "gdn_chunk_state",
];

/// Streaming multiprocessors the kernel simulator reports (small, so that grid-stride loops run).
pub const SIM_SMS: i32 = 3;

/// Which implementation of the operations a device runs (`exec.rs`), chosen once by its constructor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The CUDA kernels on the GPU, GEMMs by cuBLAS ([`CudaDevice::open`]).
    Gpu,
    /// The CUDA kernels in the kernel simulator, which has no cuBLAS ([`CudaDevice::simulated`]).
    Simulator,
    /// The host emulation (`emu.rs`): no kernels ([`CudaDevice::emulated`]).
    HostEmulation,
}

/// Facts about the opened device, for logs and roofline arithmetic.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    /// Compute capability as major * 10 + minor (90 for H100/H200).
    pub arch: u32,
    pub sms: i32,
    pub total_memory: usize,
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    pub include_dirs: Vec<PathBuf>,
    pub kernel_cache: PathBuf,
    pub kernels_from_cache: bool,
    pub compile_seconds: f64,
}

/// The driver-side handles of an opened GPU.
pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
    /// Page-locked staging for large device-to-host copies (`buf::dtoh`), grown on demand.
    pub staging: Mutex<Option<cudarc::driver::PinnedHostSlice<u8>>>,
}

/// An opened GPU with its stream, compiled kernels and cuBLAS handle, or the host emulation of the
/// backend's operations ([`CudaDevice::emulated`]).
pub struct CudaDevice {
    gpu: Option<Gpu>,
    /// What runs the operations (`exec.rs`).
    engine: Engine,
    /// Launch kernels with programmatic dependent launch (see `set_pdl`).
    pdl: AtomicBool,
    /// Why programmatic launches were turned off after a failure.
    pdl_failure: Mutex<Option<String>>,
    /// Set while a prefill pass runs (`pause_pdl`): its kernels launch plainly.
    pdl_paused: AtomicBool,
    /// The kernel simulator (`CudaDevice::simulated`): kernels run on the CPU.
    sim: Option<crate::simulate::Sim>,
    /// Split input fragments of the tensor-core GEMV (`mma::gemv_mma`, mma_split_rows): allocated once
    /// at open, never moved, so captured graphs may hold its address.
    frag_scratch: std::sync::OnceLock<crate::buf::DBuf>,
    /// The quantized kernels' scratch (`quant.rs`), allocated with the first quantized matrix.
    quant_scratch: std::sync::OnceLock<QuantScratch>,
    /// One-row GEMV runs as persistent kernels (`segment.rs`): sm_90 GPUs whose blocks fit its ring.
    segments: std::sync::OnceLock<crate::segment::Segments>,
    pub info: DeviceInfo,
}

/// Scratch of the quantized kernels (`quant.rs`; sizes in `launch_limits.rs`).
pub(crate) struct QuantScratch {
    /// The 8-bit input rows of a GEMV call: q [rows, cols] i8, then d and d·Σq [rows, cols / 32] f32 each.
    pub input: crate::buf::DBuf,
    /// A prefill GEMM's weight tile dequantized to bf16.
    pub tile: crate::buf::DBuf,
}

/// Resumes programmatic launches when dropped (`CudaDevice::pause_pdl`).
pub(crate) struct PdlPause<'a>(&'a CudaDevice);

impl Drop for PdlPause<'_> {
    fn drop(&mut self) {
        self.0.pdl_paused.store(false, Ordering::Relaxed);
    }
}

/// Whether the CUDA driver library can be loaded here (cheap; never panics). `--device auto` uses it.
/// `TURBOSPARK_CUDA_DRIVER=none` answers no (debug_env.rs).
pub fn driver_present() -> bool {
    if crate::debug_env::get().no_driver {
        return false;
    }
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { dsys::is_culib_present() }
}

impl CudaDevice {
    /// Opens device 0. On a machine without an NVIDIA driver this is `Err(CudaError::NoDriver)`.
    pub fn open() -> Result<Self, CudaError> {
        Self::open_ordinal(0)
    }

    pub fn open_ordinal(ordinal: usize) -> Result<Self, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver {
                searched: "libcuda.so, libcuda.so.1 (and cudarc's other candidate names)".into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| CudaError::NoDevice {
            reason: format!("cuInit / cuDeviceGetCount failed: {e}"),
        })?;
        if count <= ordinal as i32 {
            return Err(CudaError::NoDevice {
                reason: format!("device {ordinal} requested, {count} present"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice {
            reason: format!("cannot create a context on device {ordinal}: {e}"),
        })?;
        // One stream, ordered: cudarc's per-buffer event tracking is unnecessary (and would put event
        // nodes into captured graphs). Buffers allocated from here on are untracked.
        // SAFETY: called before any buffer of this context exists.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(CudaError::driver("creating a stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(CudaError::driver("reading the compute capability"))?;
        let arch = (major * 10 + minor) as u32;
        if !nvrtc::nvrtc_present() {
            return Err(CudaError::MissingLibrary {
                library: "libnvrtc.so.13",
                purpose: "compiling the kernels",
            });
        }
        // SAFETY: only tries to dlopen the candidate library names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::MissingLibrary {
                library: "libcublas.so.13",
                purpose: "prefill GEMMs",
            });
        }
        let nvrtc_version = nvrtc::nvrtc_version();
        let include_dirs = nvrtc::include_dirs();
        let kernel_cache = nvrtc::cache_dir();
        let t = std::time::Instant::now();
        let compiled = nvrtc::compile_cached(
            "turbospark kernels",
            &nvrtc::module_source(),
            arch,
            &include_dirs,
            &kernel_cache,
        )?;
        let compile_seconds = t.elapsed().as_secs_f64();
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(CudaError::driver("loading the kernel module"))?;
        let mut functions = HashMap::new();
        // Preferred shared-memory carveout of every kernel, percent (`TURBOSPARK_CARVEOUT`, measurements:
        // at 100 an SM that ran a mixer core can take a segment block before it drains; segment.cu).
        let carveout = crate::debug_env::get().carveout;
        for &name in KERNELS {
            let f = module
                .load_function(name)
                .map_err(CudaError::driver(format!("looking up kernel {name}")))?;
            let opt_in = if name.starts_with("linear_mma_") {
                crate::launch_limits::MMA_STAGE_BYTES
            } else if name.starts_with("attn_tc_") && name != "attn_tc_combine" {
                crate::launch_limits::ATT_TC_MAX_SMEM
            } else if name == "gdn_step" || name == "gdn_step_into" {
                crate::launch_limits::GDN_STEP_MAX_SMEM
            } else if name == "gdn_chunk_state" {
                crate::launch_limits::GDN_CHUNK_STATE_SMEM
            } else {
                0
            };
            if opt_in > 0 {
                f.set_attribute(
                    dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    opt_in as i32,
                )
                .map_err(CudaError::driver(format!(
                    "opting {name} in to its shared memory"
                )))?;
            }
            if let Some(c) = carveout {
                f.set_attribute(
                    dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    c,
                )
                .map_err(CudaError::driver(format!("setting {name}'s carveout")))?;
            }
            functions.insert(name, f);
        }
        // The segment kernel (sm_90 only: bulk copies, mbarriers) with the opt-in shared memory of its ring.
        let mut seg_config = crate::segment::Config::from_env();
        let smem_optin = ctx
            .attribute(
                dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .unwrap_or(0);
        // A launch's ring takes at most what its input leaves (less a trace kernel's static word).
        seg_config.smem_limit = (smem_optin.max(0) as usize).saturating_sub(64);
        // Every segment kernel the configuration may launch (segment::Config::kernel_for), or none.
        let seg_kernels: Vec<_> = seg_config
            .kernels()
            .into_iter()
            .map(|k| {
                (arch >= 90 && seg_config.max_smem_bytes(&k) <= seg_config.smem_limit)
                    .then(|| module.load_function(k.name).ok())
                    .flatten()
                    .filter(|f| {
                        f.set_attribute(
                            dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            seg_config.max_smem_bytes(&k) as i32,
                        )
                        .is_ok()
                    })
                    .map(|f| (k.name, f))
            })
            .collect();
        // The base kernel (first) is needed; without every held kernel, segments run on the base kernel.
        let has_segments = seg_kernels.first().is_some_and(Option::is_some);
        if !seg_kernels.iter().all(Option::is_some) {
            seg_config.held_inputs = false;
        }
        if has_segments {
            functions.extend(seg_kernels.into_iter().flatten());
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas {
            context: "creating the handle".into(),
            reason: format!("{e:?}"),
        })?;
        let mut driver_version = 0;
        // SAFETY: plain out-parameter; the driver is loaded.
        unsafe { dsys::cuDriverGetVersion(&mut driver_version) };
        let info = DeviceInfo {
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            arch,
            sms: ctx
                .attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .unwrap_or(0),
            total_memory: ctx.total_mem().unwrap_or(0),
            driver_version,
            nvrtc_version,
            include_dirs,
            kernel_cache: compiled.path,
            kernels_from_cache: compiled.from_cache,
            compile_seconds,
        };
        let dev = CudaDevice {
            engine: Engine::Gpu,
            sim: None,
            frag_scratch: std::sync::OnceLock::new(),
            quant_scratch: std::sync::OnceLock::new(),
            segments: std::sync::OnceLock::new(),
            pdl: AtomicBool::new(arch >= 90 && crate::debug_env::get().pdl),
            pdl_failure: Mutex::new(None),
            pdl_paused: AtomicBool::new(false),
            gpu: Some(Gpu {
                ctx,
                stream,
                blas,
                _module: module,
                functions,
                staging: Mutex::new(None),
            }),
            info,
        };
        dev.alloc_frag_scratch()?;
        if has_segments {
            let seg = crate::segment::Segments::new(&dev, seg_config)?;
            let _ = dev.segments.set(seg);
        }
        Ok(dev)
    }

    /// The segment state when this device runs one-row GEMV runs as persistent kernels.
    pub(crate) fn segments(&self) -> Option<&crate::segment::Segments> {
        self.segments.get()
    }

    /// Why segments were turned off after a failed launch (then every GEMV launches on its own); None
    /// while they run, or where no segment kernel was built.
    pub fn segment_failure(&self) -> Option<String> {
        self.segments.get().and_then(|s| s.failure())
    }

    /// Segment kernels launched so far (each runs two or more queued GEMVs).
    pub fn segment_launches(&self) -> u64 {
        self.segments.get().map_or(0, |s| s.launches())
    }

    /// GDN gated norms applied by segments as they staged their input (segment::defer_gated_norm).
    pub fn segment_staged_norms(&self) -> u64 {
        self.segments.get().map_or(0, |s| s.staged_norms())
    }

    /// The segment launches traced so far (`TURBOSPARK_SEG_TRACE=1`) and the SM clock in kHz that
    /// converts their cycles; for the lab's report (`lab::segment_trace`).
    pub(crate) fn segment_trace(&self) -> Option<(Vec<crate::segment_trace::TracedLaunch>, f64)> {
        let seg = self.segments.get()?;
        let khz = self
            .gpu
            .as_ref()?
            .ctx
            .attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
            .ok()?;
        Some((seg.trace.launches(), khz as f64))
    }

    /// Whether decode steps can run their GEMV runs as segments (`LoadOptions::segments`), or why not.
    pub fn segment_status(&self) -> Result<String, String> {
        match self.segments.get() {
            None => {
                Err("no segment kernel (needs sm_90 and room for its shared-memory ring)".into())
            }
            Some(s) => match s.failure() {
                Some(why) => Err(format!("turned off after a failed launch: {why}")),
                None => {
                    let c = s.config;
                    let names: Vec<&str> = c.kernels().iter().map(|k| k.name).collect();
                    Ok(format!(
                        "{} ({} consumer warps without a register-held input, pages {})",
                        names.join(" / "),
                        c.consumers,
                        c.page_bytes
                            .map_or("chosen per segment".into(), |b| format!("of {b} B"))
                    ))
                }
            },
        }
    }

    /// A device whose buffers live in host memory and whose operations run on the CPU, one by one, as
    /// the GPU kernels define them (`emu.rs`, the test double behind the device seam `exec.rs`). It
    /// exercises everything above the kernels (buffer layout, fused projections, passes, state, tape) on
    /// machines without a GPU, in tests; it is not a fast path.
    pub fn emulated() -> Self {
        CudaDevice {
            gpu: None,
            engine: Engine::HostEmulation,
            sim: None,
            frag_scratch: std::sync::OnceLock::new(),
            quant_scratch: std::sync::OnceLock::new(),
            segments: std::sync::OnceLock::new(),
            pdl: AtomicBool::new(false),
            pdl_failure: Mutex::new(None),
            pdl_paused: AtomicBool::new(false),
            info: DeviceInfo {
                name: "host emulation".into(),
                arch: 0,
                sms: 0,
                total_memory: 0,
                driver_version: 0,
                nvrtc_version: (0, 0),
                include_dirs: Vec::new(),
                kernel_cache: PathBuf::new(),
                kernels_from_cache: false,
                compile_seconds: 0.0,
            },
        }
    }

    /// A device whose buffers live in host memory and whose kernels are the real CUDA kernels compiled
    /// for the CPU by the host C++ compiler (`$CXX`, default g++) against a CUDA shim (`simulate.rs`):
    /// every launch runs the kernel's blocks one by one, its threads as fibers. It checks the kernels'
    /// indexing, barriers and arithmetic without a GPU; `SIM_SMS` streaming multiprocessors are
    /// reported so that grid-size choices are exercised. cuBLAS GEMMs (passes over `gemv_max_rows`
    /// rows) fall back to the host emulation. Slow: for the small fixtures only.
    pub fn simulated() -> Result<Self, CudaError> {
        let t = std::time::Instant::now();
        let kernels: Vec<&str> = KERNELS
            .iter()
            .copied()
            .chain(crate::segment::KERNELS)
            .collect();
        let sim = crate::simulate::Sim::load(&kernels)?;
        let kernel_cache = sim.path.clone();
        let dev = CudaDevice {
            gpu: None,
            engine: Engine::Simulator,
            frag_scratch: std::sync::OnceLock::new(),
            quant_scratch: std::sync::OnceLock::new(),
            segments: std::sync::OnceLock::new(),
            pdl: AtomicBool::new(false),
            pdl_failure: Mutex::new(None),
            pdl_paused: AtomicBool::new(false),
            info: DeviceInfo {
                name: "kernel simulator (host fibers)".into(),
                arch: 0,
                sms: SIM_SMS,
                total_memory: 0,
                driver_version: 0,
                nvrtc_version: (0, 0),
                include_dirs: Vec::new(),
                kernel_cache,
                kernels_from_cache: false,
                compile_seconds: t.elapsed().as_secs_f64(),
            },
            sim: Some(sim),
        };
        dev.alloc_frag_scratch()?;
        let seg = crate::segment::Segments::new(&dev, crate::segment::Config::from_env())?;
        let _ = dev.segments.set(seg);
        Ok(dev)
    }

    /// Allocates the tensor-core GEMV's fragment scratch (see `frag_scratch`).
    fn alloc_frag_scratch(&self) -> Result<(), CudaError> {
        let buf = crate::buf::DBuf::zeros(self, crate::launch_limits::FRAG_SCRATCH_BYTES)?;
        let _ = self.frag_scratch.set(buf);
        Ok(())
    }

    /// The tensor-core GEMV's fragment scratch (None on the host emulation, which runs no kernels).
    pub(crate) fn frag_scratch(&self) -> Option<&crate::buf::DBuf> {
        self.frag_scratch.get()
    }

    /// The quantized kernels' scratch: allocated by the first call (at load, when a quantized matrix is
    /// uploaded), never moved, so captured graphs may hold its addresses.
    pub(crate) fn quant_scratch(&self) -> Result<&QuantScratch, CudaError> {
        if let Some(s) = self.quant_scratch.get() {
            return Ok(s);
        }
        use crate::launch_limits::{QUANT_INPUT_BYTES, QUANT_TILE_BYTES};
        let s = QuantScratch {
            input: crate::buf::DBuf::zeros(self, QUANT_INPUT_BYTES)?,
            tile: crate::buf::DBuf::zeros(self, QUANT_TILE_BYTES)?,
        };
        let _ = self.quant_scratch.set(s);
        Ok(self.quant_scratch.get().expect("set above"))
    }

    /// Turns programmatic dependent launch on or off for launches from now on (on by default on sm_90+):
    /// each kernel may then start while its predecessor finishes, hiding launch gaps and, for GEMVs,
    /// prefetching weights; results are the same either way (see PDL_WAIT in `src/cu/common.cuh`).
    /// A decode graph keeps the mode it was captured with. No effect without a GPU.
    pub fn set_pdl(&self, on: bool) {
        self.pdl.store(
            on && self.gpu.is_some() && self.info.arch >= 90,
            Ordering::Relaxed,
        );
    }

    /// Whether kernels are launched with programmatic dependent launch now.
    pub fn pdl(&self) -> bool {
        self.pdl.load(Ordering::Relaxed) && !self.pdl_paused.load(Ordering::Relaxed)
    }

    /// Plain launches until the guard drops, for passes whose grids fill the GPU (prefill): there an
    /// early-launched successor only occupies SM slots while it waits. Measured on the H200:
    /// prefill of 512 tokens 21.0k tok/s with plain launches, 17.4k with PDL.
    pub(crate) fn pause_pdl(&self) -> PdlPause<'_> {
        self.pdl_paused.store(true, Ordering::Relaxed);
        PdlPause(self)
    }

    /// Why programmatic launches were turned off by a failed launch (then plain launches are used).
    pub fn pdl_failure(&self) -> Option<String> {
        self.pdl_failure.lock().ok().and_then(|g| g.clone())
    }

    pub(crate) fn disable_pdl(&self, why: String) {
        self.pdl.store(false, Ordering::Relaxed);
        if let Ok(mut g) = self.pdl_failure.lock() {
            g.get_or_insert(why);
        }
    }

    /// Whether buffers live in host memory (the host emulation or the kernel simulator): no GPU.
    pub fn is_emulated(&self) -> bool {
        self.gpu.is_none()
    }

    /// What runs the operations: the kernels on the GPU or in the simulator, or the host emulation
    /// (`exec.rs` maps it to the implementation).
    pub(crate) fn engine(&self) -> Engine {
        self.engine
    }

    /// The kernel simulator, when this device is one.
    pub(crate) fn sim(&self) -> Option<&crate::simulate::Sim> {
        self.sim.as_ref()
    }

    /// The driver handles (an error on the emulated device).
    pub(crate) fn gpu(&self) -> Result<&Gpu, CudaError> {
        self.gpu.as_ref().ok_or_else(|| CudaError::Unsupported {
            what: "this operation on the host-emulated device".into(),
        })
    }

    /// A compiled kernel by name (every name in [`KERNELS`] is present after `open`).
    pub(crate) fn kernel(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.gpu()?
            .functions
            .get(name)
            .ok_or_else(|| CudaError::Unsupported {
                what: format!("kernel {name} (not in the compiled module)"),
            })
    }

    /// The stream all work is queued on (None on the emulated device).
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        self.gpu.as_ref().map(|g| &g.stream)
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        crate::segment::flush(self)?;
        match &self.gpu {
            Some(g) => g
                .stream
                .synchronize()
                .map_err(CudaError::driver("synchronizing the stream")),
            None => Ok(()),
        }
    }

    /// One-line summary for logs.
    pub fn summary(&self) -> String {
        let i = &self.info;
        format!(
            "{} sm_{} {} SMs {:.1} GiB, driver {}.{}, NVRTC {}.{}, kernels {} ({:.2} s), include {:?}",
            i.name,
            i.arch,
            i.sms,
            i.total_memory as f64 / (1u64 << 30) as f64,
            i.driver_version / 1000,
            (i.driver_version % 1000) / 10,
            i.nvrtc_version.0,
            i.nvrtc_version.1,
            if i.kernels_from_cache {
                "from cache"
            } else {
                "compiled"
            },
            i.compile_seconds,
            i.include_dirs
        )
    }
}
