//! The chunked (WY) Gated DeltaNet recurrence for prefill passes (`src/cu/gdn_chunk.cu` states the
//! algorithm): gdn_conv_prep, gdn_chunk_prep (all chunks in parallel: T = (I + A)^-1, W, U, P),
//! gdn_chunk_state (chunks in order, S in shared memory, moves the conv window), gated_rmsnorm.
//!
//! Invariant: it agrees with the step form (`ops::gdn_recurrence`) to f32 rounding, not bit for bit, so
//! the forward runs it only for passes of more than `gemv_max_rows` rows without a tape
//! ([`use_chunked`]): decode and verify rows, and the tape replay that rebuilds state with the step
//! form, never see it. The conv window comes out bit-identical to the step form's (same code).

use crate::buf::{launch, launch_smem, Arg, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::ops::{self, GdnArgs, GdnShape};

pub(crate) use crate::launch_limits::GDN_CHUNK as CHUNK;
use crate::launch_limits::GDN_CHUNK_COLS as COLS;
/// Threads of gdn_chunk_prep (GDC_THREADS).
const THREADS: u32 = 512;
/// Threads of gdn_chunk_state (GDC_ST_THREADS).
const STATE_THREADS: u32 = 512;
pub(crate) use crate::launch_limits::GDN_CHUNK_STATE_SMEM as STATE_SMEM_BYTES;

/// Whether a pass of `rows` rows runs the chunked form: a prefill (more than `gemv_max_rows` rows,
/// whose rows need not equal decode rows) with no tape recording (the replay uses the step form).
pub(crate) fn use_chunked(enabled: bool, rows: usize, gemv_max_rows: usize, tape: bool) -> bool {
    enabled && rows > gemv_max_rows && !tape
}

/// Floats of scratch per padded row for a layer of shape `s`: w [hv, dk], u [hv, dv], p [hv, CHUNK],
/// fac [hv, 2].
pub(crate) fn floats_per_row(s: GdnShape) -> usize {
    s.hv * (s.dk + s.dv + CHUNK + 2)
}

/// Scratch floats for a pass of `rows` rows (rows padded to whole chunks).
pub fn scratch_floats(s: GdnShape, rows: usize) -> usize {
    rows.next_multiple_of(CHUNK) * floats_per_row(s)
}

/// The chunked recurrence over `rows` rows of the fused projection `proj` [rows, proj_width]: prep
/// [rows, prep_width] and `scratch` (>= scratch_floats) are work space; o [rows, hv, dv] = gated-normed
/// outputs; window and state [hv, dk, dv] updated in place. On the host emulation: the step form.
#[allow(clippy::too_many_arguments)]
pub fn gdn_chunked(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    window: u64,
    prep: u64,
    state: u64,
    o: u64,
    scratch: &DBuf,
    rows: usize,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    dev.exec()
        .gdn_chunked(dev, s, g, proj, window, prep, state, o, scratch, rows)
}

/// [`gdn_chunked`] as kernels (`exec::Kernels`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_chunked(
    dev: &CudaDevice,
    s: GdnShape,
    g: &GdnArgs,
    proj: u64,
    window: u64,
    prep: u64,
    state: u64,
    o: u64,
    scratch: &DBuf,
    rows: usize,
) -> Result<(), CudaError> {
    let need = scratch_floats(s, rows);
    if scratch.bytes < need * 4 {
        return Err(CudaError::Unsupported {
            what: format!(
                "gdn chunk scratch of {} bytes for {rows} rows (hv {} dk {} dv {}) needs {}",
                scratch.bytes,
                s.hv,
                s.dk,
                s.dv,
                need * 4
            ),
        });
    }
    let np = rows.next_multiple_of(CHUNK);
    let w = scratch.ptr;
    let u = w + (s.hv * np * s.dk * 4) as u64;
    let p = u + (s.hv * np * s.dv * 4) as u64;
    let fac = p + (s.hv * np * CHUNK * 4) as u64;
    let (ldp, ldq) = (s.proj_width() as i32, s.prep_width() as i32);
    let dims = [s.hk, s.hv, s.dk, s.dv].map(|x| Arg::I(x as i32));
    ops::conv_prep(dev, s, g, proj, window, prep, rows)?;
    let mut a = vec![
        Arg::P(prep),
        Arg::I(ldq),
        Arg::P(w),
        Arg::P(u),
        Arg::P(p),
        Arg::P(fac),
        Arg::I(rows as i32),
    ];
    a.extend(dims);
    let chunks = np / CHUNK;
    launch(
        dev,
        "gdn_chunk_prep",
        (s.hv as u32, chunks as u32, 1),
        THREADS,
        &a,
    )?;
    let mut a = vec![
        Arg::P(prep),
        Arg::I(ldq),
        Arg::P(w),
        Arg::P(u),
        Arg::P(p),
        Arg::P(fac),
        Arg::P(proj),
        Arg::I(ldp),
        Arg::P(window),
        Arg::P(state),
        Arg::P(o),
        Arg::I(rows as i32),
    ];
    a.extend(dims);
    a.push(Arg::I(s.kernel as i32));
    launch_smem(
        dev,
        "gdn_chunk_state",
        (s.hv as u32, s.dv.div_ceil(COLS) as u32, 1),
        STATE_THREADS,
        STATE_SMEM_BYTES as u32,
        &a,
    )?;
    ops::gated_norm(dev, s, g, proj, o, rows)
}
