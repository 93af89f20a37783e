//! Launchers of the Gated DeltaNet step form (gdn.cu): `gdn_conv_prep` (conv, SiLU, q/k L2 norm, beta and
//! decay for every row in parallel), then `gdn_rec` (the recurrence, rows in order, state in registers),
//! with the gated output norm in gdn_rec's blocks or the `gated_rmsnorm` kernel; a decode row runs both in
//! one launch (`gdn_step`, the same arithmetic). Decode, verify blocks and the tape replay all run this
//! form, so a row's bits do not depend on how many rows a launch carries;
//! prefill passes over `gemv_max_rows` rows take the chunked form instead (`gdn_chunk.rs`).

use crate::buf::{launch, launch_smem, Arg};
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Largest key head dim of the GDN kernels (GDN_MAX_DK).
pub(crate) const GDN_MAX_DK: usize = 128;
/// Shared memory a gdn_step block reserves without using it, and the most device.rs opts it in to. Launched
/// early (programmatic launch), its blocks take the SMs the segment before it frees first: with none
/// reserved up to 7 land on one SM; 110 KB leaves two per SM, spread over the GPU (4B decode step
/// 2.610 ms against 2.696). `TURBOSPARK_GDN_STEP_SMEM_KB=N` overrides it (measurements).
const GDN_STEP_SMEM: usize = 110 * 1024;
pub(crate) use crate::launch_limits::GDN_STEP_MAX_SMEM;
/// Threads per value column of gdn_rec (GDN_P).
const GDN_P: usize = 8;
/// Largest value head dim of gdn_rec (GDN_P threads per column in one block of at most 1024).
pub(crate) const GDN_MAX_DV: usize = 128;
/// Largest conv kernel of gdn_conv_prep.
pub(crate) const CONV_MAX_K: usize = 8;

/// Shapes of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub struct GdnShape {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub kernel: usize,
}

impl GdnShape {
    pub fn conv_dim(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    /// Width of the fused projection row [qkv ; z ; b ; a].
    pub fn proj_width(&self) -> usize {
        self.conv_dim() + self.hv * self.dv + 2 * self.hv
    }
    /// Width of a gdn_conv_prep output row [q ; k ; v ; beta ; decay ; g = ln decay].
    pub fn prep_width(&self) -> usize {
        self.conv_dim() + 3 * self.hv
    }
    /// The recurrent state in the GPU's layout from the CPU engine's: head h's S [dk, dv] is stored
    /// transposed on the GPU ([dv, dk], a value column's dk entries contiguous), so that a warp's state
    /// loads and stores in gdn_rec / gdn_step cover whole 32-byte sectors (the 4B decode step
    /// 2.505 ms against 2.540 with the [dk, dv] layout's half-sector stores).
    pub fn state_to_device(&self, s: &[f32]) -> Vec<f32> {
        self.transpose_heads(s, self.dk, self.dv)
    }
    /// The inverse of [`Self::state_to_device`].
    pub fn state_from_device(&self, s: &[f32]) -> Vec<f32> {
        self.transpose_heads(s, self.dv, self.dk)
    }
    /// Each head's [rows, cols] block of `s` transposed.
    fn transpose_heads(&self, s: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut t = vec![0.0; s.len()];
        for (src, dst) in s
            .chunks_exact(rows * cols)
            .zip(t.chunks_exact_mut(rows * cols))
        {
            for i in 0..rows {
                for j in 0..cols {
                    dst[j * rows + i] = src[i * cols + j];
                }
            }
        }
        t
    }
}

/// Buffers and parameters of one GDN layer's recurrence.
pub struct GdnArgs {
    pub conv_w: u64,
    pub a_log: u64,
    pub dt_bias: u64,
    pub norm_w: u64,
    pub eps: f32,
}

/// How gdn_rec spreads a head's value columns over blocks, and where the gated norm runs; the results
/// are the same bits either way.
#[derive(Clone, Copy, Debug)]
pub enum GdnCols {
    /// One block per value head, which also applies the gated norm.
    PerHead,
    /// The columns split over up to 8 blocks per head (more parallel: decode GDN 0.424 -> 0.352 ms per
    /// token). The gated norm: each head's last block to finish, counting finished blocks in
    /// `done` (i32 [hv], zero between launches), or, with None, the gated_rmsnorm kernel.
    Split { done: Option<u64> },
}

/// Where a recurrence leaves the new S and conv window: over the old ones (`GdnOut::in_place`), or in
/// another pair of the same shapes (a chained decode step's ping-pong, chain.rs), the old ones then
/// unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GdnOut {
    pub state: u64,
    pub window: u64,
}

/// gdn_conv_prep then gdn_rec (+ gated_rmsnorm) over `rows` rows of the fused projection `proj`
/// [rows, proj_width]: prep [rows, prep_width] (scratch), o [rows, hv, dv] = gated-normed outputs;
/// window and state updated in place.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrence(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    window: u64,
    prep: u64,
    state: u64,
    o: u64,
    rows: usize,
    cols: GdnCols,
) -> Result<(), CudaError> {
    let into = GdnOut { state, window };
    gdn_recurrence_into(dev, s, g, proj, window, prep, state, o, rows, cols, into)
}

/// [`gdn_recurrence`] reading S and the window from `state` / `window` and leaving the new ones in `into`.
/// gdn_step writes them there directly; the other forms copy them over first and update the copies.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_recurrence_into(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    window: u64,
    prep: u64,
    state: u64,
    o: u64,
    rows: usize,
    cols: GdnCols,
    into: GdnOut,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    dev.exec()
        .gdn_recurrence(dev, s, g, proj, window, prep, state, o, rows, cols, into)
}

/// [`gdn_recurrence_into`] as kernels (`exec::Kernels`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_recurrence(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    window: u64,
    prep: u64,
    state: u64,
    o: u64,
    rows: usize,
    cols: GdnCols,
    into: GdnOut,
) -> Result<(), CudaError> {
    let (ldp, ldq) = (s.proj_width() as i32, s.prep_width() as i32);
    // Column blocks per head: GDN_P (8) threads per column, 4 columns per warp, at least 16 columns
    // (128 threads) per block, so each thread stages at most 2 of the next row's 2 dk <= 256 q/k values.
    let (cb, done) = match cols {
        GdnCols::PerHead => (1, None),
        GdnCols::Split { done } => {
            let cb = [8, 4, 2, 1]
                .into_iter()
                .find(|&c| s.dv.is_multiple_of(4 * c) && s.dv / c >= 16)
                .unwrap_or(1);
            (cb, done)
        }
    };
    // A decode step's segment applies the gated norm as it stages the out projection's input
    // (segment::defer_gated_norm): no fence, counter or extra pass at the end of gdn_rec.
    // (cb == 1: gdn_rec norms its head itself.)
    let defer = rows == 1 && cb > 1 && done.is_some() && crate::segment::takes_gated_norms(dev);
    let threads = GDN_P * s.dv / cb;
    let fused_here = rows == 1 && cb > 1 && step_fused(s, threads);
    if into != (GdnOut { state, window }) && !(fused_here && done.is_some()) {
        // Only gdn_step writes elsewhere: the other forms update copies.
        crate::buf::dtod(dev, into.state, state, s.hv * s.dk * s.dv * 4)?;
        crate::buf::dtod(dev, into.window, window, (s.kernel - 1) * s.conv_dim() * 4)?;
        return gdn_recurrence(
            dev,
            s,
            g,
            proj,
            into.window,
            prep,
            into.state,
            o,
            rows,
            cols,
        );
    }
    if let (Some(counter), true) = (done, fused_here) {
        // A decode row: conv and recurrence in one launch (gdn_step), the counter as kh_done.
        let into = (into != GdnOut { state, window }).then_some(into);
        let mut args = vec![
            Arg::P(proj),
            Arg::I(ldp),
            Arg::P(g.conv_w),
            Arg::P(window),
            Arg::P(g.a_log),
            Arg::P(g.dt_bias),
            Arg::P(state),
            Arg::P(o),
            Arg::I(s.hk as i32),
            Arg::I(s.hv as i32),
            Arg::I(s.dk as i32),
            Arg::I(s.dv as i32),
            Arg::P(counter),
        ];
        if let Some(into) = into {
            args.extend([Arg::P(into.window), Arg::P(into.state)]);
        }
        launch_smem(
            dev,
            if into.is_some() {
                "gdn_step_into"
            } else {
                "gdn_step"
            },
            (s.hv as u32, cb as u32, 1),
            threads as u32,
            step_smem(),
            &args,
        )?;
        return finish_gated_norm(dev, s, g, proj, o, rows, defer);
    }
    conv_prep(dev, s, g, proj, window, prep, rows)?;
    let done = if defer { None } else { done };
    launch(
        dev,
        "gdn_rec",
        (s.hv as u32, cb as u32, 1),
        (GDN_P * s.dv / cb) as u32,
        &[
            Arg::P(prep),
            Arg::I(ldq),
            Arg::P(proj),
            Arg::I(ldp),
            Arg::P(window),
            Arg::P(state),
            Arg::P(o),
            Arg::P(g.norm_w),
            Arg::F(g.eps),
            Arg::I(rows as i32),
            Arg::I(s.hk as i32),
            Arg::I(s.hv as i32),
            Arg::I(s.dk as i32),
            Arg::I(s.dv as i32),
            Arg::I(s.kernel as i32),
            Arg::P(done.unwrap_or(0)),
        ],
    )?;
    if defer {
        return finish_gated_norm(dev, s, g, proj, o, rows, true);
    }
    if cb == 1 || done.is_some() {
        return Ok(());
    }
    gated_norm(dev, s, g, proj, o, rows)
}

/// Whether a decode row runs gdn_step (conv kernel 4, blocks of `threads`: 4 to 16 whole warps) instead
/// of gdn_conv_prep + gdn_rec; `TURBOSPARK_GDN_STEP=0` keeps the two launches (A/B measurements).
fn step_fused(s: GdnShape, threads: usize) -> bool {
    s.kernel == 4
        && threads.is_multiple_of(32)
        && (128..=512).contains(&threads)
        && crate::debug_env::get().gdn_step
}

/// The dynamic shared memory of a gdn_step launch ([`GDN_STEP_SMEM`]).
fn step_smem() -> u32 {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let bytes = *BYTES.get_or_init(|| {
        crate::debug_env::get()
            .gdn_step_smem_kb
            .map_or(GDN_STEP_SMEM, |kb| kb * 1024)
    });
    bytes.min(GDN_STEP_MAX_SMEM) as u32
}

/// The gated norm of outputs `o` whose kernel did not apply it: deferred into the next segment's
/// staging when `defer` and the segment takes it, else the gated_rmsnorm kernel.
#[allow(clippy::too_many_arguments)]
fn finish_gated_norm(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    o: u64,
    rows: usize,
    defer: bool,
) -> Result<(), CudaError> {
    if defer {
        let norm = crate::segment::GatedNorm {
            o,
            z: proj + (s.conv_dim() * 4) as u64,
            w: g.norm_w,
            eps: g.eps,
            dv: s.dv,
            heads: s.hv,
        };
        if crate::segment::defer_gated_norm(dev, norm)? {
            return Ok(());
        }
    }
    gated_norm(dev, s, g, proj, o, rows)
}

/// gdn_conv_prep over `rows` rows of `proj` [rows, proj_width]: prep [rows, prep_width] (reads the
/// conv window, does not move it).
pub(crate) fn conv_prep(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    window: u64,
    prep: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let (ldp, ldq) = (s.proj_width() as i32, s.prep_width() as i32);
    launch(
        dev,
        "gdn_conv_prep",
        ((s.hk + (s.hv * s.dv).div_ceil(256)) as u32, rows as u32, 1),
        256,
        &[
            Arg::P(proj),
            Arg::I(ldp),
            Arg::P(g.conv_w),
            Arg::P(window),
            Arg::P(g.a_log),
            Arg::P(g.dt_bias),
            Arg::P(prep),
            Arg::I(ldq),
            Arg::I(s.hk as i32),
            Arg::I(s.hv as i32),
            Arg::I(s.dk as i32),
            Arg::I(s.dv as i32),
            Arg::I(s.kernel as i32),
        ],
    )
}

/// gated_rmsnorm over the GDN outputs o [rows, hv, dv] in place, gated by z of `proj`.
pub(crate) fn gated_norm(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    o: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let warps = rows * s.hv;
    launch(
        dev,
        "gated_rmsnorm",
        (warps.div_ceil(8) as u32, 1, 1),
        256,
        &[
            Arg::P(o),
            Arg::P(proj + (s.conv_dim() * 4) as u64),
            Arg::I(s.proj_width() as i32),
            Arg::P(g.norm_w),
            Arg::F(g.eps),
            Arg::I(rows as i32),
            Arg::I(s.hv as i32),
            Arg::I(s.dv as i32),
        ],
    )
}
