//! Host emulation of the device's operations (`exec::HostEmulation`, the test double behind the seam in
//! `exec.rs`), for [`crate::CudaDevice::emulated`]: the same inputs, outputs, layouts and strides as the
//! GPU kernels, computed with the CPU engine's kernels. Buffers of the emulated device are host memory, so
//! a device address is a host address here.
//!
//! What this proves is everything above the kernels (fused projection layouts, strides, KV and state
//! buffers, multi-pass forwards, tape replay, snapshots); the kernels themselves are checked on the GPU
//! by the lab's self-test (`crates/cuda-lab`). The cuBLAS path is mirrored by rounding activations
//! to bf16 for bf16 weights.

use half::bf16;

use crate::argmax::Topk;
use crate::error::CudaError;
use crate::moe::{MoeShape, MoeW};
use crate::ops::{AttnBufs, AttnShape, GdnShape};
use crate::scratch::Scratch;
use crate::weights::{BlockFormat, Mat, WDtype};

/// A view of `len` f32 at host address `ptr`.
///
/// SAFETY (callers): `ptr` is the address of a live emulated buffer holding at least `len` f32, not
/// mutably aliased for the view's lifetime.
unsafe fn view<'a>(ptr: u64, len: usize) -> &'a [f32] {
    std::slice::from_raw_parts(ptr as *const f32, len)
}

/// A mutable view; SAFETY (callers): as [`view`], and no other view of the range is alive.
unsafe fn view_mut<'a>(ptr: u64, len: usize) -> &'a mut [f32] {
    std::slice::from_raw_parts_mut(ptr as *mut f32, len)
}

/// The matrix as f32 [rows, cols] (a quantized one dequantized as ggml does, in stored column order).
fn weights_f32(w: &Mat) -> Vec<f32> {
    let n = w.rows * w.cols;
    match w.dtype {
        WDtype::Quant => {
            let mut out = vec![0f32; n];
            for (m, first) in quant_parts(w) {
                for r in 0..m.rows() {
                    let at = (first + r) * w.cols;
                    m.dequantize_row(r, &mut out[at..at + w.cols]);
                }
            }
            out
        }
        // SAFETY: the matrix buffer holds n elements of its dtype.
        WDtype::F32 => unsafe { view(w.buf.ptr, n) }.to_vec(),
        WDtype::Bf16 => {
            // SAFETY: as above, n bf16 values.
            let raw = unsafe { std::slice::from_raw_parts(w.buf.ptr as *const u16, n) };
            raw.iter().map(|&b| bf16::from_bits(b).to_f32()).collect()
        }
    }
}

/// A part of a quantized matrix as the CPU engine holds it.
enum Part {
    Ggml(kernels::QuantMatrix),
    Fp8(kernels::Fp8Matrix),
}

impl Part {
    fn rows(&self) -> usize {
        match self {
            Part::Ggml(m) => m.rows(),
            Part::Fp8(m) => m.rows(),
        }
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self {
            Part::Ggml(m) => m.dequantize_row(r, out),
            Part::Fp8(m) => m.dequantize_row(r, out),
        }
    }

    fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        match self {
            Part::Ggml(m) => kernels::linear_quant(x, m, n, out),
            Part::Fp8(m) => kernels::linear_fp8(x, m, n, out),
        }
    }
}

/// The parts of a quantized matrix as CPU matrices, each with its first output row.
fn quant_parts(w: &Mat) -> Vec<(Part, usize)> {
    let q = w
        .quant
        .as_ref()
        .expect("a WDtype::Quant matrix carries its layout");
    let mut first = 0;
    // SAFETY: the matrix buffer holds every part's rows at its offset, and an FP8 part's scales at
    // theirs (weights.rs).
    let bytes = |at: usize, len: usize| unsafe {
        std::slice::from_raw_parts((w.buf.ptr + at as u64) as *const u8, len)
    };
    q.parts
        .iter()
        .map(|p| {
            let data = bytes(p.offset, p.rows * p.format.row_bytes(w.cols));
            let m = match p.format {
                BlockFormat::Ggml(f) => Part::Ggml(
                    kernels::QuantMatrix::new(f, data.to_vec(), p.rows, w.cols)
                        .expect("parts are whole rows of blocks (weights.rs)"),
                ),
                BlockFormat::Fp8 { block, scales } => {
                    let n = p.rows.div_ceil(block[0]) * w.cols.div_ceil(block[1]);
                    let s: Vec<f32> = bytes(scales, 4 * n)
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    Part::Fp8(
                        kernels::Fp8Matrix::new(data, &s, p.rows, w.cols, block)
                            .expect("FP8 parts fit the kernel (weights.rs)"),
                    )
                }
            };
            first += p.rows;
            (m, first - p.rows)
        })
        .collect()
}

/// A quantized linear as the CPU engine computes it (`families::layers::Linear::forward`): the input in
/// the file's column order, the parts' outputs side by side.
fn linear_quant(w: &Mat, x: u64, y: u64, rows: usize, accumulate: bool) -> Result<(), CudaError> {
    let k = w.cols;
    // SAFETY: x holds rows x cols inputs, y rows x out outputs; the order buffer holds cols i32.
    let mut xs = unsafe { view(x, rows * k) }.to_vec();
    if let Some(order) = w.quant.as_ref().and_then(|q| q.input_order.as_ref()) {
        let order = unsafe { std::slice::from_raw_parts(order.ptr as *const i32, k) };
        let src = xs.clone();
        for (r, row) in xs.chunks_exact_mut(k).enumerate() {
            for (v, &c) in row.iter_mut().zip(order) {
                *v = src[r * k + c as usize];
            }
        }
    }
    let ys = unsafe { view_mut(y, rows * w.rows) };
    for (m, first) in quant_parts(w) {
        let mut out = vec![0f32; rows * m.rows()];
        m.forward(&xs, rows, &mut out);
        for (yr, o) in ys.chunks_exact_mut(w.rows).zip(out.chunks_exact(m.rows())) {
            let dst = &mut yr[first..first + m.rows()];
            if accumulate {
                dst.iter_mut().zip(o).for_each(|(d, v)| *d += v);
            } else {
                dst.copy_from_slice(o);
            }
        }
    }
    Ok(())
}

pub(crate) fn linear(
    w: &Mat,
    x: u64,
    y: u64,
    rows: usize,
    accumulate: bool,
    gemv_max_rows: usize,
) -> Result<(), CudaError> {
    if w.dtype == WDtype::Quant {
        return linear_quant(w, x, y, rows, accumulate);
    }
    let wf = weights_f32(w);
    // SAFETY: x holds rows x cols inputs, y rows x out outputs (the callers' scratch sizes).
    let mut xs = unsafe { view(x, rows * w.cols) }.to_vec();
    if rows > gemv_max_rows && w.dtype == WDtype::Bf16 {
        xs.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
    }
    let ys = unsafe { view_mut(y, rows * w.rows) };
    if accumulate {
        kernels::linear_acc(&xs, &wf, rows, w.cols, w.rows, 1.0, ys);
    } else {
        kernels::linear(&xs, &wf, rows, w.cols, w.rows, ys);
    }
    Ok(())
}

pub(crate) fn embed(table: &Mat, ids: u64, x: u64, rows: usize) -> Result<(), CudaError> {
    let h = table.cols;
    // SAFETY: ids holds `rows` i32 written by the host; x holds rows x hidden.
    let ids = unsafe { std::slice::from_raw_parts(ids as *const i32, rows) };
    let xs = unsafe { view_mut(x, rows * h) };
    if table.dtype == WDtype::Quant {
        let parts = quant_parts(table);
        for (r, &id) in ids.iter().enumerate() {
            let id = id as usize;
            let (m, first) = parts
                .iter()
                .rev()
                .find(|(_, first)| *first <= id)
                .expect("ids index the table");
            m.dequantize_row(id - first, &mut xs[r * h..(r + 1) * h]);
        }
        return Ok(());
    }
    let wf = weights_f32(table);
    for (r, &id) in ids.iter().enumerate() {
        let id = id as usize;
        xs[r * h..(r + 1) * h].copy_from_slice(&wf[id * h..(id + 1) * h]);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm(
    x: u64,
    w: u64,
    y: u64,
    rows: usize,
    width: usize,
    eps: f32,
    zero_centred: bool,
) -> Result<(), CudaError> {
    // SAFETY: x and y are distinct buffers of rows x width; w holds width values.
    let (xs, ws) = unsafe { (view(x, rows * width).to_vec(), view(w, width)) };
    kernels::rms_norm(&xs, ws, eps, zero_centred, unsafe {
        view_mut(y, rows * width)
    });
    Ok(())
}

pub(crate) fn silu_mul(gate_up: u64, act: u64, rows: usize, inter: usize) -> Result<(), CudaError> {
    // SAFETY: gate_up holds rows x 2I, act rows x I, distinct buffers.
    let gu = unsafe { view(gate_up, rows * 2 * inter) };
    let out = unsafe { view_mut(act, rows * inter) };
    for r in 0..rows {
        let row = &gu[r * 2 * inter..(r + 1) * 2 * inter];
        kernels::silu_mul(
            &row[..inter],
            &row[inter..],
            &mut out[r * inter..(r + 1) * inter],
        );
    }
    Ok(())
}

/// attn_prep: q (normed, rotated) and gate rows to `b.q` / `b.gate`; k (normed, rotated) and v rows
/// into the caches at positions start..start+rows.
pub(crate) fn attn_prep(
    s: AttnShape,
    b: &AttnBufs,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let (hq, hkv, d) = (s.hq, s.hkv, s.d);
    let qw = hq * d * if s.gated { 2 } else { 1 };
    let width = qw + 2 * hkv * d;
    // SAFETY: start holds one i32; every other buffer is sized for `rows` rows / the cache capacity
    // (at least start + rows positions), and the buffers are pairwise distinct.
    let start = unsafe { *(b.start as *const i32) } as usize;
    let qkv = unsafe { view(b.qkv, rows * width) };
    let (qn, kn) = unsafe { (view(q_norm, d), view(k_norm, d)) };
    let freqs = unsafe { view(inv_freq, s.rot_half) };
    let total = start + rows;
    let kc = unsafe { view_mut(b.k_cache, total * hkv * d) };
    let vc = unsafe { view_mut(b.v_cache, total * hkv * d) };
    let (mut q, mut gate) = (vec![0.0; rows * hq * d], vec![0.0; rows * hq * d]);
    let mut k = vec![0.0; rows * hkv * d];
    for r in 0..rows {
        let row = &qkv[r * width..(r + 1) * width];
        for h in 0..hq {
            let src = h * d * if s.gated { 2 } else { 1 };
            q[(r * hq + h) * d..][..d].copy_from_slice(&row[src..src + d]);
            if s.gated {
                gate[(r * hq + h) * d..][..d].copy_from_slice(&row[src + d..src + 2 * d]);
            }
        }
        k[r * hkv * d..(r + 1) * hkv * d].copy_from_slice(&row[qw..qw + hkv * d]);
        let at = (start + r) * hkv * d;
        vc[at..at + hkv * d].copy_from_slice(&row[qw + hkv * d..]);
    }
    kernels::rms_norm_inplace(&mut q, qn, s.eps, s.zero_centred);
    kernels::rms_norm_inplace(&mut k, kn, s.eps, s.zero_centred);
    let positions: Vec<usize> = (start..total).collect();
    kernels::rope_with_inv_freq(&mut q, &positions, hq, d, freqs);
    kernels::rope_with_inv_freq(&mut k, &positions, hkv, d, freqs);
    kc[start * hkv * d..].copy_from_slice(&k);
    unsafe { view_mut(b.q, rows * hq * d) }.copy_from_slice(&q);
    unsafe { view_mut(b.gate, rows * hq * d) }.copy_from_slice(&gate);
    Ok(())
}

/// The attention core over `rows` query rows in `b.q` whose keys are cache rows 0..=start+r (row r),
/// gated by `b.gate` when `s.gated`.
pub(crate) fn attn_core(s: AttnShape, b: &AttnBufs, rows: usize) -> Result<(), CudaError> {
    let (hq, hkv, d) = (s.hq, s.hkv, s.d);
    // SAFETY: as attn_prep; the caches hold positions 0..start+rows.
    let start = unsafe { *(b.start as *const i32) } as usize;
    let total = start + rows;
    let kc = unsafe { view(b.k_cache, total * hkv * d) };
    let vc = unsafe { view(b.v_cache, total * hkv * d) };
    let q = unsafe { view(b.q, rows * hq * d) };
    let out = unsafe { view_mut(b.out, rows * hq * d) };
    kernels::attention(
        q,
        kc,
        vc,
        rows,
        start,
        hq,
        hkv,
        d,
        1.0 / (d as f32).sqrt(),
        out,
    );
    if s.gated {
        let gate = unsafe { view(b.gate, rows * hq * d) };
        for (o, g) in out.iter_mut().zip(gate) {
            *o *= kernels::sigmoid(*g);
        }
    }
    Ok(())
}

/// dflash_regroup: [b, hq, d] rows <-> one row of b * hq heads grouped by kv head
/// ((kvh * b + r) * group + j), `inverse` the way back.
pub(crate) fn regroup(
    src: u64,
    dst: u64,
    b: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    inverse: bool,
) -> Result<(), CudaError> {
    let n = b * hq * d;
    // SAFETY: both buffers hold b * hq * d floats and are distinct.
    let (from, to) = unsafe { (view(src, n), view_mut(dst, n)) };
    let group = hq / hkv;
    for r in 0..b {
        for h in 0..hq {
            let rowed = (r * hq + h) * d;
            let grouped = ((h / group * b + r) * group + h % group) * d;
            let (i, o) = if inverse {
                (grouped, rowed)
            } else {
                (rowed, grouped)
            };
            to[o..o + d].copy_from_slice(&from[i..i + d]);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_recurrence(
    s: GdnShape,
    proj: u64,
    conv_w: u64,
    window: u64,
    mixed: u64,
    a_log: u64,
    dt_bias: u64,
    state: u64,
    o: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let (hk, hv, dk, dv, kk) = (s.hk, s.hv, s.dk, s.dv, s.kernel);
    let (cd, pw) = (s.conv_dim(), s.proj_width());
    // SAFETY: buffers sized by the layer's shapes for `rows` rows; all distinct.
    let p = unsafe { view(proj, rows * pw) };
    let (cw, al, dt) = unsafe { (view(conv_w, cd * kk), view(a_log, hv), view(dt_bias, hv)) };
    let win = unsafe { view_mut(window, (kk - 1) * cd) };
    let mx = unsafe { view_mut(mixed, rows * cd) };
    let st = unsafe { view_mut(state, hv * dk * dv) };
    let out = unsafe { view_mut(o, rows * hv * dv) };
    let mut qkv_in = vec![0.0; rows * cd];
    for r in 0..rows {
        qkv_in[r * cd..(r + 1) * cd].copy_from_slice(&p[r * pw..r * pw + cd]);
    }
    kernels::causal_conv1d_silu(&qkv_in, cw, win, rows, cd, kk, mx);
    let (mut q, mut k) = (vec![0.0; rows * hv * dk], vec![0.0; rows * hv * dk]);
    let mut v = vec![0.0; rows * hv * dv];
    let (mut beta, mut g) = (vec![0.0; rows * hv], vec![0.0; rows * hv]);
    for r in 0..rows {
        let m = &mx[r * cd..(r + 1) * cd];
        for h in 0..hv {
            let kh = h / (hv / hk);
            q[(r * hv + h) * dk..][..dk].copy_from_slice(&m[kh * dk..(kh + 1) * dk]);
            k[(r * hv + h) * dk..][..dk]
                .copy_from_slice(&m[hk * dk + kh * dk..hk * dk + (kh + 1) * dk]);
            let ba = r * pw + cd + hv * dv;
            beta[r * hv + h] = kernels::sigmoid(p[ba + h]);
            g[r * hv + h] = -al[h].exp() * kernels::softplus(p[ba + hv + h] + dt[h]);
        }
        v[r * hv * dv..(r + 1) * hv * dv].copy_from_slice(&m[2 * hk * dk..]);
    }
    kernels::l2_normalize_rows(&mut q, dk, 1e-6);
    kernels::l2_normalize_rows(&mut k, dk, 1e-6);
    let scale = 1.0 / (dk as f32).sqrt();
    q.iter_mut().for_each(|x| *x *= scale);
    // The CPU kernel's state is [dk, dv] per head, the device's [dv, dk] (GdnShape::state_to_device).
    let mut host_state = s.state_from_device(st);
    kernels::gdn_recurrent(
        &q,
        &k,
        &v,
        &g,
        &beta,
        &mut host_state,
        rows,
        hv,
        dk,
        dv,
        out,
    );
    st.copy_from_slice(&s.state_to_device(&host_state));
    Ok(())
}

pub(crate) fn gated_norm(
    s: GdnShape,
    o: u64,
    proj: u64,
    w: u64,
    eps: f32,
    rows: usize,
) -> Result<(), CudaError> {
    let (hv, dv, cd, pw) = (s.hv, s.dv, s.conv_dim(), s.proj_width());
    // SAFETY: o holds rows x hv x dv, proj rows x proj_width, w dv values; o is distinct from both.
    let os = unsafe { view_mut(o, rows * hv * dv) };
    let (p, ws) = unsafe { (view(proj, rows * pw), view(w, dv)) };
    for (i, orow) in os.chunks_exact_mut(dv).enumerate() {
        let (r, h) = (i / hv, i % hv);
        kernels::rms_norm_inplace(orow, ws, eps, false);
        let z = &p[r * pw + cd + h * dv..r * pw + cd + (h + 1) * dv];
        for (y, &zz) in orow.iter_mut().zip(z) {
            *y *= zz * kernels::sigmoid(zz);
        }
    }
    Ok(())
}

/// Routing of m rows as the CPU engine (`families::layers::ffn::Moe::forward`): softmax, top-k by a
/// stable descending sort (lower index first on ties), optional renormalisation; slot k holds the
/// shared expert's sigmoid gate.
pub(crate) fn moe_route(
    s: MoeShape,
    logits: u64,
    ids: u64,
    wts: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let (e, k, ld) = (s.experts, s.top_k, s.ld_logits());
    // SAFETY: logits holds rows x ld, ids rows x k i32, wts rows x (k + 1); all distinct.
    let lg = unsafe { view(logits, rows * ld) };
    let ids = unsafe { std::slice::from_raw_parts_mut(ids as *mut i32, rows * k) };
    let ws = unsafe { view_mut(wts, rows * (k + 1)) };
    for r in 0..rows {
        let mut p = lg[r * ld..r * ld + e].to_vec();
        kernels::softmax_inplace(&mut p);
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&i, &j| p[j].total_cmp(&p[i]));
        let sum: f32 = order[..k].iter().map(|&i| p[i]).sum();
        for (slot, &x) in order[..k].iter().enumerate() {
            ids[r * k + slot] = x as i32;
            ws[r * (k + 1) + slot] = if s.norm_topk { p[x] / sum } else { p[x] };
        }
        ws[r * (k + 1) + k] = if s.shared() {
            kernels::sigmoid(lg[r * ld + e])
        } else {
            0.0
        };
    }
    Ok(())
}

/// act[r, slot] = silu(gate) * up of the slot's expert (slot k: the shared expert) on h[r].
pub(crate) fn moe_gate_up(
    s: MoeShape,
    h: u64,
    gate_up: &Mat,
    shared: Option<&Mat>,
    ids: u64,
    act: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let (hd, k, ld, slots) = (s.hidden, s.top_k, s.ld_act(), s.slots());
    let (wf, sf) = (weights_f32(gate_up), shared.map(weights_f32));
    // SAFETY: h holds rows x hidden, ids rows x k i32, act rows x slots x ld; distinct buffers.
    let hs = unsafe { view(h, rows * hd) };
    let ids = unsafe { std::slice::from_raw_parts(ids as *const i32, rows * k) };
    let out = unsafe { view_mut(act, rows * slots * ld) };
    for r in 0..rows {
        for slot in 0..slots {
            let (w, inter) = if slot < k {
                let x = ids[r * k + slot] as usize;
                let n = 2 * s.inter * hd;
                (&wf[x * n..(x + 1) * n], s.inter)
            } else {
                (sf.as_deref().unwrap_or(&[]), s.shared_inter)
            };
            let mut gu = vec![0.0; 2 * inter];
            kernels::linear(&hs[r * hd..(r + 1) * hd], w, 1, hd, 2 * inter, &mut gu);
            let at = (r * slots + slot) * ld;
            kernels::silu_mul(&gu[..inter], &gu[inter..], &mut out[at..at + inter]);
        }
    }
    Ok(())
}

/// x[r] += Σ_slot w[r, slot] · down_slot(act[r, slot]), slots 0..k-1 then the shared expert.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_down(
    s: MoeShape,
    act: u64,
    down: &Mat,
    shared: Option<&Mat>,
    ids: u64,
    wts: u64,
    x: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let (hd, k, ld, slots) = (s.hidden, s.top_k, s.ld_act(), s.slots());
    let (wf, sf) = (weights_f32(down), shared.map(weights_f32));
    // SAFETY: act rows x slots x ld, ids rows x k i32, wts rows x (k + 1), x rows x hidden; distinct.
    let a = unsafe { view(act, rows * slots * ld) };
    let ids = unsafe { std::slice::from_raw_parts(ids as *const i32, rows * k) };
    let ws = unsafe { view(wts, rows * (k + 1)) };
    let xs = unsafe { view_mut(x, rows * hd) };
    for r in 0..rows {
        let mut y = vec![0.0; hd];
        for slot in 0..slots {
            let (w, inter) = if slot < k {
                let e = ids[r * k + slot] as usize;
                let n = hd * s.inter;
                (&wf[e * n..(e + 1) * n], s.inter)
            } else {
                (sf.as_deref().unwrap_or(&[]), s.shared_inter)
            };
            let at = (r * slots + slot) * ld;
            kernels::linear_acc(
                &a[at..at + inter],
                w,
                1,
                inter,
                hd,
                ws[r * (k + 1) + slot],
                &mut y,
            );
        }
        for (o, v) in xs[r * hd..(r + 1) * hd].iter_mut().zip(&y) {
            *o += v;
        }
    }
    Ok(())
}

/// moe_gate_up then moe_down of m rows in the scratch's buffers (h, moe_ids, moe_wts, mid; added to x).
pub(crate) fn moe_experts(w: &MoeW, sc: &Scratch, m: usize) -> Result<(), CudaError> {
    let shared = w.shared.as_ref();
    moe_gate_up(
        w.shape,
        sc.h.ptr,
        &w.gate_up,
        shared.map(|p| &p.0),
        sc.moe_ids.ptr,
        sc.mid.ptr,
        m,
    )?;
    moe_down(
        w.shape,
        sc.mid.ptr,
        &w.down,
        shared.map(|p| &p.1),
        sc.moe_ids.ptr,
        sc.moe_wts.ptr,
        sc.x.ptr,
        m,
    )
}

/// argmax_rows: out [rows, 2] i32 = [argmax, refused] of each row, from the CPU engine's argmax.
pub(crate) fn argmax_rows(
    logits: u64,
    rows: usize,
    vocab: usize,
    out: u64,
) -> Result<(), CudaError> {
    // SAFETY: `logits` holds rows * vocab f32 and `out` rows * 2 i32 (the scratch sizes both from the
    // same row bound), and they do not overlap.
    let (x, pairs) = unsafe {
        (
            std::slice::from_raw_parts(logits as *const f32, rows * vocab),
            std::slice::from_raw_parts_mut(out as *mut i32, rows * 2),
        )
    };
    for (row, pair) in x.chunks_exact(vocab.max(1)).zip(pairs.chunks_exact_mut(2)) {
        let refused = row.iter().any(|v| v.is_nan() || *v == f32::INFINITY)
            || row.iter().all(|v| *v == f32::NEG_INFINITY);
        pair[0] = kernels::argmax(row) as i32;
        pair[1] = refused as i32;
    }
    Ok(())
}

/// argmax_rows of one row with the feeding of the next decode step (`argmax::launch_feeding`).
pub(crate) fn argmax_feeding(
    logits: u64,
    vocab: usize,
    out: u64,
    next: (u64, u64),
    host_pair: u64,
    counter: u64,
) -> Result<(), CudaError> {
    argmax_rows(logits, 1, vocab, out)?;
    // SAFETY: the one-row scratch's [1] i32 id and start, the [2] i32 pair just written, the slots (pair
    // `counter` of them, or the first) and the [1] i32 counter; all distinct.
    unsafe {
        let pair = [*(out as *const i32), *(out as *const i32).add(1)];
        *(next.0 as *mut i32) = pair[0];
        *(next.1 as *mut i32) += 1;
        let c = if counter == 0 {
            0
        } else {
            *(counter as *const i32) as usize
        };
        *(host_pair as *mut [i32; 2]).add(c) = pair;
        if counter != 0 {
            *(counter as *mut i32) += 1;
        }
    }
    Ok(())
}

/// topk_parts + topk_merge: each row's candidates (its K largest and their ties, at most `t.cap`) and
/// [count, flags], selected by sorting (the chunk buffers are not used).
pub(crate) fn topk(t: &Topk) -> Result<(), CudaError> {
    let (rows, vocab, k, cap) = (t.rows, t.vocab, t.k, t.cap);
    // SAFETY: `logits` holds rows * vocab f32 (the caller's scratch), the buffers rows * cap ids / values
    // and rows * 2 meta (`CandidateBufs::new`); all distinct.
    let (x, ids, vals, meta) = unsafe {
        (
            std::slice::from_raw_parts(t.logits as *const f32, rows * vocab),
            std::slice::from_raw_parts_mut(t.ids as *mut i32, rows * cap),
            std::slice::from_raw_parts_mut(t.vals as *mut f32, rows * cap),
            std::slice::from_raw_parts_mut(t.meta as *mut i32, rows * 2),
        )
    };
    for (r, row) in x.chunks_exact(vocab.max(1)).enumerate() {
        let bad = row.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
        let mut sorted = row.to_vec();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let kth = sorted[k.clamp(1, vocab) - 1];
        let mut n = 0;
        for (i, v) in row.iter().enumerate() {
            if v.total_cmp(&kth).is_ge() {
                if n < cap {
                    ids[r * cap + n] = i as i32;
                    vals[r * cap + n] = *v;
                }
                n += 1;
            }
        }
        // As the kernels: fewer than K logits above -inf send the caller back to the row too.
        let finite = row.iter().filter(|v| **v > f32::NEG_INFINITY).count();
        meta[2 * r] = n as i32;
        meta[2 * r + 1] = i32::from(bad) | if n > cap || finite < k { 2 } else { 0 };
    }
    Ok(())
}
