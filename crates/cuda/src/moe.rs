//! The Qwen3-Next sparse mixture-of-experts feed-forward on the GPU, with the CPU engine's meaning
//! (`families::layers::ffn::Moe`): router softmax over E experts (f32) → top-k (ties to the lower
//! index) → optional renormalisation (`norm_topk_prob`) → Σ wₛ·expertₛ(x), plus the shared expert
//! scaled by sigmoid(shared_expert_gate(x)).
//!
//! Per MoE layer over m rows: RMSNorm of x into h (materialised, not fused into the router GEMV: every
//! expert reads it too) → one GEMV of [router ; shared gate] (the dense matrices' launcher) → `moe_route` (ids and weights to device memory) → `moe_gate_up`
//! (selected experts' gate_up + SwiGLU, and the shared expert's, weights chosen on the device) →
//! `moe_down` (x += slot 0..k-1 then shared, in that fixed order). Nothing goes to the host, so the
//! one-row decode step stays capturable in the CUDA graph, and every row is computed by the same
//! instructions whatever the row count: verify rows equal decode rows bit for bit (src/cu/moe.cu).
//! Cost: each row streams its k experts' weights (no grouping of rows by expert), right for decode and
//! verify blocks; a long prefill re-reads them per row (a grouped GEMM is the next step there).

use model_io::{ModelConfig, MoeConfig};

use crate::buf::{launch, Arg, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::ops::{self, NormW};
use crate::scratch::{Scratch, Widths};
use crate::weights::{Mat, Uploader, WDtype};

/// Warps per block of moe_gate_up / moe_down (MOE_WARPS).
const MOE_WARPS: usize = 8;
/// Most experts moe_route holds in shared memory (MOE_MAX_EXPERTS).
const MOE_MAX_EXPERTS: usize = 1024;

/// The shape of one MoE block.
#[derive(Clone, Copy, Debug)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: usize,
    pub inter: usize,
    /// 0 when the block has no shared expert.
    pub shared_inter: usize,
    pub norm_topk: bool,
    pub hidden: usize,
}

impl MoeShape {
    pub fn shared(&self) -> bool {
        self.shared_inter > 0
    }
    /// Slots of the activation buffer per row: the k experts, then the shared one.
    pub fn slots(&self) -> usize {
        self.top_k + usize::from(self.shared())
    }
    /// Floats per slot of the activation buffer.
    pub fn ld_act(&self) -> usize {
        self.inter.max(self.shared_inter)
    }
    /// Router logits per row: E, then the shared gate's.
    pub fn ld_logits(&self) -> usize {
        self.experts + usize::from(self.shared())
    }
}

/// The weights of one MoE block.
pub struct MoeW {
    pub router: Mat,                // [E (+1 shared gate), hidden]
    pub gate_up: Mat,               // [E * 2I, hidden]: per expert gate rows then up rows
    pub down: Mat,                  // [E * hidden, I]
    pub shared: Option<(Mat, Mat)>, // ([2 Is, hidden], [hidden, Is])
    pub shape: MoeShape,
}

impl MoeW {
    pub fn bytes(&self) -> usize {
        // What one decode row streams: the router, k experts and the shared one.
        let per_expert = (self.gate_up.bytes() + self.down.bytes()) / self.shape.experts.max(1);
        self.router.bytes()
            + self.shape.top_k * per_expert
            + self
                .shared
                .as_ref()
                .map_or(0, |(g, d)| g.bytes() + d.bytes())
    }
}

/// Loads the MoE block under `mp` (`model.layers.{i}.mlp.`), widening `widths` for its scratch.
pub(crate) fn load_moe(
    up: &Uploader<'_>,
    c: &ModelConfig,
    m: &MoeConfig,
    mp: &str,
    widths: &mut Widths,
) -> Result<MoeW, CudaError> {
    let (h, e, k, inter) = (
        c.hidden_size,
        m.num_experts,
        m.num_experts_per_tok,
        m.moe_intermediate_size,
    );
    let si = m.shared_expert_intermediate_size;
    if e == 0 || e > MOE_MAX_EXPERTS || k == 0 || k > e || inter == 0 {
        return Err(CudaError::Unsupported {
            what: format!(
                "MoE shape at {mp}: {e} experts (max {MOE_MAX_EXPERTS}), top-{k}, expert width {inter}"
            ),
        });
    }
    let shape = MoeShape {
        experts: e,
        top_k: k,
        inter,
        shared_inter: si,
        norm_topk: m.norm_topk_prob,
        hidden: h,
    };
    let mut router = vec![(format!("{mp}gate.weight"), e)];
    if si > 0 {
        router.push((format!("{mp}shared_expert_gate.weight"), 1));
    }
    // The experts' kernels read float matrices: a GGUF file's blocks are dequantized for them.
    let router = up.matrix_float(&router, h)?;
    let fused = match &up.source {
        crate::weights::Source::Checkpoint(ck) => {
            ck.tensors.contains(&format!("{mp}experts.gate_up_proj"))
        }
        crate::weights::Source::Random { .. } => false,
    };
    let (gate_up, down) = if fused {
        (
            up.matrix_stacked(&format!("{mp}experts.gate_up_proj"), e, 2 * inter, h)?,
            up.matrix_stacked(&format!("{mp}experts.down_proj"), e, h, inter)?,
        )
    } else {
        let mut gu = Vec::with_capacity(2 * e);
        let mut dn = Vec::with_capacity(e);
        for x in 0..e {
            gu.push((format!("{mp}experts.{x}.gate_proj.weight"), inter));
            gu.push((format!("{mp}experts.{x}.up_proj.weight"), inter));
            dn.push((format!("{mp}experts.{x}.down_proj.weight"), h));
        }
        (up.matrix_float(&gu, h)?, up.matrix_float(&dn, inter)?)
    };
    let shared = if si > 0 {
        let sp = format!("{mp}shared_expert.");
        Some((
            up.matrix_float(
                &[
                    (format!("{sp}gate_proj.weight"), si),
                    (format!("{sp}up_proj.weight"), si),
                ],
                h,
            )?,
            up.matrix_float(&[(format!("{sp}down_proj.weight"), h)], si)?,
        ))
    } else {
        None
    };
    let dtypes_agree = [&gate_up, &down]
        .into_iter()
        .chain(shared.iter().flat_map(|(g, d)| [g, d]))
        .all(|w| w.dtype == gate_up.dtype);
    if !dtypes_agree {
        return Err(CudaError::Unsupported {
            what: format!("MoE experts at {mp} stored in mixed precisions"),
        });
    }
    widths.big = widths.big.max(shape.ld_logits());
    widths.mid = widths.mid.max(shape.slots() * shape.ld_act());
    widths.moe_k = widths.moe_k.max(k);
    Ok(MoeW {
        router,
        gate_up,
        down,
        shared,
        shape,
    })
}

/// x [m, hidden] += moe(rmsnorm(x)), in the scratch's buffers: h (normed rows), big (router logits),
/// moe_ids / moe_wts (routing), mid (expert activations).
pub fn forward(
    dev: &CudaDevice,
    w: &MoeW,
    norm: NormW,
    sc: &Scratch,
    m: usize,
    gemv_max_rows: usize,
) -> Result<(), CudaError> {
    let s = w.shape;
    let h = s.hidden;
    ops::rmsnorm(
        dev,
        sc.x.ptr,
        norm.w,
        sc.h.ptr,
        m,
        h,
        norm.eps,
        norm.zero_centred,
    )?;
    ops::linear(
        dev,
        &w.router,
        sc.h.ptr,
        sc.big.ptr,
        m,
        false,
        sc.xb.ptr,
        gemv_max_rows,
    )?;
    let exec = dev.exec();
    exec.moe_route(dev, s, sc.big.ptr, sc.moe_ids.ptr, sc.moe_wts.ptr, m)?;
    exec.moe_experts(dev, w, sc, m)
}

/// moe_route over m rows of router logits (`exec::Kernels`).
pub(crate) fn launch_route(
    dev: &CudaDevice,
    s: MoeShape,
    logits: u64,
    ids: u64,
    wts: u64,
    m: usize,
) -> Result<(), CudaError> {
    launch(
        dev,
        "moe_route",
        (m as u32, 1, 1),
        32,
        &[
            Arg::P(logits),
            Arg::I(s.ld_logits() as i32),
            Arg::I(s.experts as i32),
            Arg::I(s.top_k as i32),
            Arg::I(s.norm_topk as i32),
            Arg::I(s.shared() as i32),
            Arg::P(ids),
            Arg::P(wts),
        ],
    )
}

/// moe_gate_up then moe_down: the selected experts and the shared one, added to x (`exec::Kernels`).
pub(crate) fn launch_experts(
    dev: &CudaDevice,
    w: &MoeW,
    sc: &Scratch,
    m: usize,
) -> Result<(), CudaError> {
    let s = w.shape;
    let (sh_gu, sh_dn) = w
        .shared
        .as_ref()
        .map_or((0, 0), |(g, d)| (g.buf.ptr, d.buf.ptr));
    let suffix = match w.gate_up.dtype {
        WDtype::Bf16 => "bf16",
        WDtype::F32 => "f32",
        WDtype::Quant => unreachable!("experts are uploaded as floats (matrix_float)"),
    };
    let (hd, inter, si, k, ld) = (
        s.hidden as i32,
        s.inter as i32,
        s.shared_inter as i32,
        s.top_k as i32,
        s.ld_act() as i32,
    );
    launch(
        dev,
        &format!("moe_gate_up_{suffix}"),
        (
            s.ld_act().div_ceil(MOE_WARPS) as u32,
            s.slots() as u32,
            m as u32,
        ),
        (MOE_WARPS * 32) as u32,
        &[
            Arg::P(sc.h.ptr),
            Arg::P(w.gate_up.buf.ptr),
            Arg::P(sh_gu),
            Arg::P(sc.moe_ids.ptr),
            Arg::P(sc.mid.ptr),
            Arg::I(hd),
            Arg::I(inter),
            Arg::I(si),
            Arg::I(k),
            Arg::I(ld),
        ],
    )?;
    launch(
        dev,
        &format!("moe_down_{suffix}"),
        (s.hidden.div_ceil(MOE_WARPS) as u32, m as u32, 1),
        (MOE_WARPS * 32) as u32,
        &[
            Arg::P(sc.mid.ptr),
            Arg::P(w.down.buf.ptr),
            Arg::P(sh_dn),
            Arg::P(sc.moe_ids.ptr),
            Arg::P(sc.moe_wts.ptr),
            Arg::P(sc.x.ptr),
            Arg::I(hd),
            Arg::I(inter),
            Arg::I(si),
            Arg::I(k),
            Arg::I(s.shared() as i32),
            Arg::I(ld),
        ],
    )
}

/// Allocates the routing buffers of `rows` rows (ids i32 [rows, k], weights f32 [rows, k + 1]); at
/// least one element each so a model without MoE still has valid addresses.
pub(crate) fn routing_buffers(
    dev: &CudaDevice,
    w: &Widths,
    rows: usize,
) -> Result<(DBuf, DBuf), CudaError> {
    Ok((
        DBuf::zeros(dev, (rows * w.moe_k).max(1) * 4)?,
        DBuf::f32s(dev, (rows * (w.moe_k + 1)).max(1))?,
    ))
}
