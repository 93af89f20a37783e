//! The device seam: every operation whose computation depends on what the device can run goes through
//! [`Exec`], reached with `dev.exec()`. Two implementations:
//! - [`Kernels`]: launches the CUDA kernels, on the GPU or in the kernel simulator (the `launch_*`
//!   functions of `ops.rs`, `attn.rs`, `gdn.rs`, `gdn_chunk.rs`, `moe.rs`, `argmax.rs`);
//! - [`HostEmulation`]: computes each operation on the host as the CPU engine does (`emu.rs`). It is a
//!   test double: it exists so that everything above the kernels (layouts, passes, state, tape) runs in
//!   tests on machines without a GPU; only tests and the lab (`cuda_check` without a GPU) construct a
//!   device that uses it ([`CudaDevice::emulated`]).
//!
//! The implementation is chosen once, by the device's constructor ([`Engine`]), and mapped to here in
//! one place ([`CudaDevice::exec`]); no launcher asks which one runs.
//!
//! Invariant: both implementations compute the same values into the same outputs (caches and state
//! included), with the same layouts and strides, up to f32 rounding: the order of summations, and the
//! chunked GDN form, which the emulation computes in the step form (`gdn_chunk.rs`); the bf16 rounding of
//! cuBLAS's activations is mirrored. Scratch (attention partials, GDN prep rows, chunk buffers, bf16
//! copies, the normed rows of a fused norm) may hold other contents, or none.

use crate::argmax::{self, Topk};
use crate::attn::{self, AttnBufs, AttnCore, AttnShape};
use crate::buf::DBuf;
use crate::device::{CudaDevice, Engine};
use crate::emu;
use crate::error::CudaError;
use crate::gdn::{self, GdnArgs, GdnCols, GdnOut, GdnShape};
use crate::gdn_chunk;
use crate::moe::{self, MoeShape, MoeW};
use crate::ops;
use crate::scratch::Scratch;
use crate::weights::Mat;

type R = Result<(), CudaError>;

/// The operations a device runs; arguments as the launchers that call them (`ops::linear`, ...), every
/// address a buffer of the device.
#[allow(clippy::too_many_arguments)]
pub(crate) trait Exec: Sync {
    /// Whether the GEMV kernel runs here: `linear_normed` / `linear_swiglu` then fuse the norm and the
    /// SwiGLU into it for rows up to `gemv_max_rows`; without, they run as separate operations.
    fn has_gemv(&self) -> bool;

    /// `ops::linear` of rows >= 1.
    fn linear(
        &self,
        dev: &CudaDevice,
        w: &Mat,
        x: u64,
        y: u64,
        rows: usize,
        accumulate: bool,
        xb: u64,
        gemv_max_rows: usize,
    ) -> R;

    /// `ops::embed`.
    fn embed(&self, dev: &CudaDevice, table: &Mat, ids: u64, x: u64, rows: usize) -> R;

    /// `ops::rmsnorm`.
    fn rmsnorm(
        &self,
        dev: &CudaDevice,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        width: usize,
        eps: f32,
        zero_centred: bool,
    ) -> R;

    /// `ops::silu_mul`.
    fn silu_mul(&self, dev: &CudaDevice, gate_up: u64, act: u64, rows: usize, inter: usize) -> R;

    /// `ops::regroup`.
    fn regroup(
        &self,
        dev: &CudaDevice,
        src: u64,
        dst: u64,
        b: usize,
        hq: usize,
        hkv: usize,
        d: usize,
        inverse: bool,
    ) -> R;

    /// `ops::attn_prep`.
    fn attn_prep(
        &self,
        dev: &CudaDevice,
        s: AttnShape,
        b: &AttnBufs,
        q_norm: u64,
        k_norm: u64,
        inv_freq: u64,
        rows: usize,
    ) -> R;

    /// `ops::attn_run_core` (`core` picks the kernels; the emulation computes the same attention).
    fn attn_run_core(
        &self,
        dev: &CudaDevice,
        s: AttnShape,
        b: &AttnBufs,
        rows: usize,
        core: AttnCore,
    ) -> R;

    /// `gdn::gdn_recurrence_into` of rows >= 1 (`cols` is how the kernels spread the work).
    fn gdn_recurrence(
        &self,
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
    ) -> R;

    /// `gdn_chunk::gdn_chunked` of rows >= 1.
    fn gdn_chunked(
        &self,
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
    ) -> R;

    /// moe_route of `moe::forward`.
    fn moe_route(
        &self,
        dev: &CudaDevice,
        s: MoeShape,
        logits: u64,
        ids: u64,
        wts: u64,
        m: usize,
    ) -> R;

    /// moe_gate_up + moe_down of `moe::forward`.
    fn moe_experts(&self, dev: &CudaDevice, w: &MoeW, sc: &Scratch, m: usize) -> R;

    /// `argmax::launch_rows`.
    fn argmax_rows(&self, dev: &CudaDevice, logits: u64, rows: usize, vocab: usize, out: u64) -> R;

    /// `argmax::launch_feeding`.
    fn argmax_feeding(
        &self,
        dev: &CudaDevice,
        logits: u64,
        vocab: usize,
        out: u64,
        next: (u64, u64),
        host_pair: u64,
        counter: u64,
    ) -> R;

    /// The candidates selection of `CandidateBufs::launch`.
    fn topk(&self, dev: &CudaDevice, t: &Topk) -> R;
}

/// The CUDA kernels, launched on the device's stream (or run by the kernel simulator).
pub(crate) struct Kernels {
    /// Whether GEMMs (passes over `gemv_max_rows` rows) go to cuBLAS; the simulator has none, and its
    /// GEMMs are the host emulation's (the same bf16 activation rounding).
    cublas: bool,
}

/// The host emulation (`emu.rs`), the test double of [`Kernels`].
pub(crate) struct HostEmulation;

static GPU: Kernels = Kernels { cublas: true };
static SIMULATOR: Kernels = Kernels { cublas: false };

impl CudaDevice {
    /// The implementation of this device's operations (the one place that maps [`Engine`] to it).
    pub(crate) fn exec(&self) -> &'static dyn Exec {
        match self.engine() {
            Engine::Gpu => &GPU,
            Engine::Simulator => &SIMULATOR,
            Engine::HostEmulation => &HostEmulation,
        }
    }
}

impl Exec for Kernels {
    fn has_gemv(&self) -> bool {
        true
    }

    fn linear(
        &self,
        dev: &CudaDevice,
        w: &Mat,
        x: u64,
        y: u64,
        rows: usize,
        accumulate: bool,
        xb: u64,
        gemv_max_rows: usize,
    ) -> R {
        if rows > gemv_max_rows && !self.cublas {
            return HostEmulation.linear(dev, w, x, y, rows, accumulate, xb, gemv_max_rows);
        }
        ops::launch_linear(dev, w, x, y, rows, accumulate, xb, gemv_max_rows)
    }

    fn embed(&self, dev: &CudaDevice, table: &Mat, ids: u64, x: u64, rows: usize) -> R {
        ops::launch_embed(dev, table, ids, x, rows)
    }

    fn rmsnorm(
        &self,
        dev: &CudaDevice,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        width: usize,
        eps: f32,
        zero_centred: bool,
    ) -> R {
        ops::launch_rmsnorm(dev, x, w, y, rows, width, eps, zero_centred)
    }

    fn silu_mul(&self, dev: &CudaDevice, gate_up: u64, act: u64, rows: usize, inter: usize) -> R {
        ops::launch_silu_mul(dev, gate_up, act, rows, inter)
    }

    fn regroup(
        &self,
        dev: &CudaDevice,
        src: u64,
        dst: u64,
        b: usize,
        hq: usize,
        hkv: usize,
        d: usize,
        inverse: bool,
    ) -> R {
        ops::launch_regroup(dev, src, dst, b, hq, hkv, d, inverse)
    }

    fn attn_prep(
        &self,
        dev: &CudaDevice,
        s: AttnShape,
        b: &AttnBufs,
        q_norm: u64,
        k_norm: u64,
        inv_freq: u64,
        rows: usize,
    ) -> R {
        attn::launch_prep(dev, s, b, q_norm, k_norm, inv_freq, rows)
    }

    fn attn_run_core(
        &self,
        dev: &CudaDevice,
        s: AttnShape,
        b: &AttnBufs,
        rows: usize,
        core: AttnCore,
    ) -> R {
        attn::launch_core(dev, s, b, rows, core)
    }

    fn gdn_recurrence(
        &self,
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
    ) -> R {
        gdn::launch_recurrence(dev, s, g, proj, window, prep, state, o, rows, cols, into)
    }

    fn gdn_chunked(
        &self,
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
    ) -> R {
        gdn_chunk::launch_chunked(dev, s, g, proj, window, prep, state, o, scratch, rows)
    }

    fn moe_route(
        &self,
        dev: &CudaDevice,
        s: MoeShape,
        logits: u64,
        ids: u64,
        wts: u64,
        m: usize,
    ) -> R {
        moe::launch_route(dev, s, logits, ids, wts, m)
    }

    fn moe_experts(&self, dev: &CudaDevice, w: &MoeW, sc: &Scratch, m: usize) -> R {
        moe::launch_experts(dev, w, sc, m)
    }

    fn argmax_rows(&self, dev: &CudaDevice, logits: u64, rows: usize, vocab: usize, out: u64) -> R {
        argmax::launch_both(dev, logits, rows, vocab, out, [0; 4])
    }

    fn argmax_feeding(
        &self,
        dev: &CudaDevice,
        logits: u64,
        vocab: usize,
        out: u64,
        next: (u64, u64),
        host_pair: u64,
        counter: u64,
    ) -> R {
        let feed = [next.0, next.1, host_pair, counter];
        argmax::launch_both(dev, logits, 1, vocab, out, feed)
    }

    fn topk(&self, dev: &CudaDevice, t: &Topk) -> R {
        argmax::launch_topk(dev, t)
    }
}

impl Exec for HostEmulation {
    fn has_gemv(&self) -> bool {
        false
    }

    fn linear(
        &self,
        _dev: &CudaDevice,
        w: &Mat,
        x: u64,
        y: u64,
        rows: usize,
        accumulate: bool,
        _xb: u64,
        gemv_max_rows: usize,
    ) -> R {
        emu::linear(w, x, y, rows, accumulate, gemv_max_rows)
    }

    fn embed(&self, _dev: &CudaDevice, table: &Mat, ids: u64, x: u64, rows: usize) -> R {
        emu::embed(table, ids, x, rows)
    }

    fn rmsnorm(
        &self,
        _dev: &CudaDevice,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        width: usize,
        eps: f32,
        zero_centred: bool,
    ) -> R {
        emu::rmsnorm(x, w, y, rows, width, eps, zero_centred)
    }

    fn silu_mul(&self, _dev: &CudaDevice, gate_up: u64, act: u64, rows: usize, inter: usize) -> R {
        emu::silu_mul(gate_up, act, rows, inter)
    }

    fn regroup(
        &self,
        _dev: &CudaDevice,
        src: u64,
        dst: u64,
        b: usize,
        hq: usize,
        hkv: usize,
        d: usize,
        inverse: bool,
    ) -> R {
        emu::regroup(src, dst, b, hq, hkv, d, inverse)
    }

    fn attn_prep(
        &self,
        _dev: &CudaDevice,
        s: AttnShape,
        b: &AttnBufs,
        q_norm: u64,
        k_norm: u64,
        inv_freq: u64,
        rows: usize,
    ) -> R {
        emu::attn_prep(s, b, q_norm, k_norm, inv_freq, rows)
    }

    fn attn_run_core(
        &self,
        _dev: &CudaDevice,
        s: AttnShape,
        b: &AttnBufs,
        rows: usize,
        _core: AttnCore,
    ) -> R {
        emu::attn_core(s, b, rows)
    }

    fn gdn_recurrence(
        &self,
        dev: &CudaDevice,
        s: GdnShape,
        g: &GdnArgs,
        proj: u64,
        window: u64,
        prep: u64,
        state: u64,
        o: u64,
        rows: usize,
        _cols: GdnCols,
        into: GdnOut,
    ) -> R {
        // The emulation updates S and the window in place: into a copy, as the kernels' unfused forms.
        if into != (GdnOut { state, window }) {
            crate::buf::dtod(dev, into.state, state, s.hv * s.dk * s.dv * 4)?;
            crate::buf::dtod(dev, into.window, window, (s.kernel - 1) * s.conv_dim() * 4)?;
        }
        let (state, window) = (into.state, into.window);
        emu::gdn_recurrence(
            s, proj, g.conv_w, window, prep, g.a_log, g.dt_bias, state, o, rows,
        )?;
        emu::gated_norm(s, o, proj, g.norm_w, g.eps, rows)
    }

    /// The step form (the emulation has no chunked form).
    fn gdn_chunked(
        &self,
        dev: &CudaDevice,
        s: GdnShape,
        g: &GdnArgs,
        proj: u64,
        window: u64,
        prep: u64,
        state: u64,
        o: u64,
        _scratch: &DBuf,
        rows: usize,
    ) -> R {
        let (cols, into) = (GdnCols::Split { done: None }, GdnOut { state, window });
        self.gdn_recurrence(dev, s, g, proj, window, prep, state, o, rows, cols, into)
    }

    fn moe_route(
        &self,
        _dev: &CudaDevice,
        s: MoeShape,
        logits: u64,
        ids: u64,
        wts: u64,
        m: usize,
    ) -> R {
        emu::moe_route(s, logits, ids, wts, m)
    }

    fn moe_experts(&self, _dev: &CudaDevice, w: &MoeW, sc: &Scratch, m: usize) -> R {
        emu::moe_experts(w, sc, m)
    }

    fn argmax_rows(
        &self,
        _dev: &CudaDevice,
        logits: u64,
        rows: usize,
        vocab: usize,
        out: u64,
    ) -> R {
        emu::argmax_rows(logits, rows, vocab, out)
    }

    fn argmax_feeding(
        &self,
        _dev: &CudaDevice,
        logits: u64,
        vocab: usize,
        out: u64,
        next: (u64, u64),
        host_pair: u64,
        counter: u64,
    ) -> R {
        emu::argmax_feeding(logits, vocab, out, next, host_pair, counter)
    }

    fn topk(&self, _dev: &CudaDevice, t: &Topk) -> R {
        emu::topk(t)
    }
}
