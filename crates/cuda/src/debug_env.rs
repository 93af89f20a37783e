//! Every environment switch the CUDA backend reads, in one place, parsed once per process
//! ([`get`]). They are A/B toggles and measurement knobs: each keeps results correct (bit for bit the
//! default's, or equal to rounding where noted), and unset each keeps the default. The rest of the crate
//! takes them from [`DebugEnv`], through `LoadOptions::default()` where the choice is per load.
//!
//! Per load (`LoadOptions` defaults; a caller's options override them):
//! - `TURBOSPARK_CUDA_GRAPHS=0`: decode steps launch their kernels directly (`LoadOptions::graphs`).
//! - `TURBOSPARK_TENSOR_CORE_GEMV=0|1`: the GEMV kernel family, instead of the per-checkpoint choice
//!   (`LoadOptions::for_checkpoint`).
//! - `TURBOSPARK_VERIFY_GRAPHS=0`: verify blocks run without CUDA graphs (`LoadOptions::verify_graphs`).
//! - `TURBOSPARK_GDN_CHUNKED=0`: prefill runs the GDN step form, not the chunked one (`gdn_chunked`).
//! - `TURBOSPARK_SEGMENTS=0`: decode GEMVs launch one by one, not as segments (`segments`).
//! - `TURBOSPARK_CHAIN=0`: greedy decoding waits for each step's token (`chain`).
//! - `TURBOSPARK_CANDIDATES=0`: sampled top-k rows come back as full logits (`candidates`).
//!
//! Per process (kernel choices and launch shapes, read when a device opens or a kernel first runs):
//! - `TURBOSPARK_CUDA_DRIVER=none`: behave as on a machine without an NVIDIA driver (`driver_present`
//!   is false, `--device cuda` fails, `auto` is the CPU): the no-GPU tests run on GPU machines too.
//! - `TURBOSPARK_PDL=0`: kernels launch without programmatic dependent launch (device.rs).
//! - `TURBOSPARK_CUDA_CACHE=DIR`: where compiled kernels are cached (`nvrtc::cache_dir`).
//! - `TURBOSPARK_CARVEOUT=PCT`: preferred shared-memory carveout of every kernel (device.rs).
//! - `TURBOSPARK_ATT_SPLITS=N` (1..=64): key chunks of decode and verify attention rows (ops.rs).
//! - `TURBOSPARK_GDN_STEP=0`: a decode row's GDN runs as two launches instead of gdn_step (gdn.rs).
//! - `TURBOSPARK_GDN_STEP_SMEM_KB=N`: gdn_step's dynamic shared memory (gdn.rs).
//! - `TURBOSPARK_SEG_*`: how segments run (segment_config.rs `Config`):
//!   `_CONSUMERS` (8 or 12) consumer warps; `_PAGE` a fixed page size in bytes; `_EVICT_FIRST` (1 / 0)
//!   the L2 hint for every step; `_RING_KB` (32..=224) the ring; `_NORM_STAGED=0` RMSNorm weights not
//!   staged; `_FLIGHT` / `_FLIGHT_EDGE` pages in flight in the rows / at a stage boundary;
//!   `_EDGE_TO_BARRIER=1` the boundary ends at the grid barrier; `_COOP=0` no cooperative launch;
//!   `_MAX` / `_MAX_ROWS` stages per launch / rows per queued GEMV; `_SINGLE=1` lone GEMVs as segments;
//!   `_TRACE=1` the trace kernels (the lab's segment trace); `_REGCAP=1` registers capped at 88;
//!   `_PREFETCH=0` no weight prefetch; `_GATED_NORM=0` gated norms not staged; `_XREG=0` no
//!   register-held inputs.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The switches, parsed ([`get`]). `None` / the default where unset or unparsable.
#[derive(Clone, Debug)]
pub(crate) struct DebugEnv {
    pub no_driver: bool,
    pub graphs: bool,
    pub tensor_core_gemv: Option<bool>,
    pub pdl: bool,
    pub verify_graphs: bool,
    pub gdn_chunked: bool,
    pub segments: bool,
    pub chain: bool,
    pub candidates: bool,
    pub cuda_cache: Option<PathBuf>,
    pub carveout: Option<i32>,
    pub att_splits: Option<usize>,
    pub gdn_step: bool,
    pub gdn_step_smem_kb: Option<usize>,
    pub seg: SegEnv,
}

/// The `TURBOSPARK_SEG_*` switches (module doc), raw; `segment_config::Config` applies them.
#[derive(Clone, Debug)]
pub(crate) struct SegEnv {
    pub consumers: Option<usize>,
    pub page: Option<usize>,
    pub evict_first: Option<u32>,
    pub ring_kb: Option<usize>,
    pub norm_staged: Option<usize>,
    pub flight: Option<usize>,
    pub flight_edge: Option<usize>,
    pub edge_to_barrier: Option<usize>,
    pub coop: Option<usize>,
    pub max: Option<usize>,
    pub max_rows: Option<usize>,
    pub single: Option<usize>,
    pub trace: Option<usize>,
    pub regcap: Option<usize>,
    pub prefetch: Option<usize>,
    pub gated_norm: Option<usize>,
    pub xreg: Option<usize>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// On unless set to `0`.
fn on_unless_zero(name: &str) -> bool {
    var(name).is_none_or(|v| v != "0")
}

fn parsed<T: std::str::FromStr>(name: &str) -> Option<T> {
    var(name).and_then(|v| v.parse().ok())
}

impl DebugEnv {
    fn read() -> Self {
        DebugEnv {
            no_driver: var("TURBOSPARK_CUDA_DRIVER").as_deref() == Some("none"),
            graphs: on_unless_zero("TURBOSPARK_CUDA_GRAPHS"),
            tensor_core_gemv: match var("TURBOSPARK_TENSOR_CORE_GEMV").as_deref() {
                Some("0") => Some(false),
                Some("1") => Some(true),
                _ => None,
            },
            pdl: on_unless_zero("TURBOSPARK_PDL"),
            verify_graphs: on_unless_zero("TURBOSPARK_VERIFY_GRAPHS"),
            gdn_chunked: on_unless_zero("TURBOSPARK_GDN_CHUNKED"),
            segments: on_unless_zero("TURBOSPARK_SEGMENTS"),
            chain: on_unless_zero("TURBOSPARK_CHAIN"),
            candidates: on_unless_zero("TURBOSPARK_CANDIDATES"),
            cuda_cache: std::env::var_os("TURBOSPARK_CUDA_CACHE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            carveout: parsed("TURBOSPARK_CARVEOUT"),
            att_splits: parsed("TURBOSPARK_ATT_SPLITS"),
            gdn_step: on_unless_zero("TURBOSPARK_GDN_STEP"),
            gdn_step_smem_kb: parsed("TURBOSPARK_GDN_STEP_SMEM_KB"),
            seg: SegEnv {
                consumers: parsed("TURBOSPARK_SEG_CONSUMERS"),
                page: parsed("TURBOSPARK_SEG_PAGE"),
                evict_first: parsed("TURBOSPARK_SEG_EVICT_FIRST"),
                ring_kb: parsed("TURBOSPARK_SEG_RING_KB"),
                norm_staged: parsed("TURBOSPARK_SEG_NORM_STAGED"),
                flight: parsed("TURBOSPARK_SEG_FLIGHT"),
                flight_edge: parsed("TURBOSPARK_SEG_FLIGHT_EDGE"),
                edge_to_barrier: parsed("TURBOSPARK_SEG_EDGE_TO_BARRIER"),
                coop: parsed("TURBOSPARK_SEG_COOP"),
                max: parsed("TURBOSPARK_SEG_MAX"),
                max_rows: parsed("TURBOSPARK_SEG_MAX_ROWS"),
                single: parsed("TURBOSPARK_SEG_SINGLE"),
                trace: parsed("TURBOSPARK_SEG_TRACE"),
                regcap: parsed("TURBOSPARK_SEG_REGCAP"),
                prefetch: parsed("TURBOSPARK_SEG_PREFETCH"),
                gated_norm: parsed("TURBOSPARK_SEG_GATED_NORM"),
                xreg: parsed("TURBOSPARK_SEG_XREG"),
            },
        }
    }
}

/// The switches of this process, read from the environment on first use.
pub(crate) fn get() -> &'static DebugEnv {
    static ENV: OnceLock<DebugEnv> = OnceLock::new();
    ENV.get_or_init(DebugEnv::read)
}
