//! Scratch buffers of forward passes (`Scratch`, sized by `Widths`) and the RoPE table a pass shares
//! between its attention layers (`RopePass`): what the operations write their intermediate rows into.
//! A state (`state.rs`) holds one for one-row passes and one for multi-row passes.

use crate::buf::DBuf;
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Scratch of forward passes of up to `rows` rows whose attention partials need at most `row_splits`
/// (rows x key chunks per row) slots per head.
pub struct Scratch {
    pub rows: usize,
    pub row_splits: usize,
    pub ids: DBuf,      // i32 [rows]
    pub start: DBuf,    // i32 [1]
    pub x: DBuf,        // [rows, hidden] residual stream
    pub h: DBuf,        // [rows, hidden] normed
    pub big: DBuf,      // [rows, widest fused projection]
    pub mid: DBuf,      // [rows, widest of: MLP inner width, hq * d, GDN prep row]
    pub o: DBuf,        // [rows, widest GDN output]
    pub q: DBuf,        // [rows, hq * d]
    pub gate: DBuf,     // [rows, hq * d]
    pub part_m: DBuf,   // [rows, hq, s_max] (row_splits >= rows * s_max)
    pub part_l: DBuf,   // [rows, hq, s_max]
    pub part_acc: DBuf, // [rows, hq, s_max, d]
    pub xb: DBuf,       // bf16 [rows, widest input] for cuBLAS
    pub logits: DBuf,   // [min(rows, LOGIT_ROWS), vocab]
    pub argmax: DBuf,   // i32 [min(rows, LOGIT_ROWS), 2]: each logits row's [argmax, refused]
    pub gdn_done: DBuf, // i32 [>= hv]: gdn_rec's finished column blocks per head (ops::GdnCols)
    /// f32 [rope_rows, 2, ATT_MAX_D]: the pass's RoPE cos / sin (ops::Rope), and where a pass is with it.
    pub rope: DBuf,
    pub rope_rows: usize,
    pub(crate) rope_pass: RopePass,
    pub moe_ids: DBuf, // i32 [rows, moe_k]: routed experts per slot
    pub moe_wts: DBuf, // [rows, moe_k + 1]: their weights, then the shared expert's gate
    /// Chunked GDN work space (gdn_chunk.rs): [rows padded to a chunk, gdn_chunk]; empty for one row.
    pub gdn: DBuf,
}

/// Widths the scratch must hold, from the model.
#[derive(Clone, Copy, Debug, Default)]
pub struct Widths {
    pub hidden: usize,
    pub big: usize,
    pub mid: usize,
    pub o: usize,
    pub q: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub max_in: usize,
    pub vocab: usize,
    /// Most routed experts per row of any MoE layer (0 without MoE).
    pub moe_k: usize,
    /// Widest chunked-GDN scratch per padded row of any GDN layer (gdn_chunk::floats_per_row).
    pub gdn_chunk: usize,
}

/// Rows of a pass whose attention layers share one RoPE table (decode and verify passes).
const ROPE_ROWS: usize = 64;

/// Where a forward pass is with its RoPE table (Scratch::rope): outside a pass every attention layer
/// computes its own cos / sin; inside one, the first layer stores them and the later ones read them.
#[derive(Debug, Default)]
pub(crate) struct RopePass(std::sync::atomic::AtomicU8);

impl RopePass {
    const OUTSIDE: u8 = 0;
    const FIRST: u8 = 1;
    const STORED: u8 = 2;
    /// A pass's layers start; they end when the guard drops.
    pub fn enter(&self) -> RopePassGuard<'_> {
        self.0
            .store(Self::FIRST, std::sync::atomic::Ordering::Relaxed);
        RopePassGuard(self)
    }
    /// The RoPE source of the pass's next attention layer over `rows` rows.
    pub fn next(&self, table: &DBuf, table_rows: usize, rows: usize) -> crate::ops::Rope {
        use std::sync::atomic::Ordering::Relaxed;
        if rows > table_rows {
            return crate::ops::Rope::Compute;
        }
        match self.0.load(Relaxed) {
            Self::FIRST => {
                self.0.store(Self::STORED, Relaxed);
                crate::ops::Rope::Store(table.ptr)
            }
            Self::STORED => crate::ops::Rope::Read(table.ptr),
            _ => crate::ops::Rope::Compute,
        }
    }
}

pub(crate) struct RopePassGuard<'a>(&'a RopePass);
impl Drop for RopePassGuard<'_> {
    fn drop(&mut self) {
        (self.0)
            .0
            .store(RopePass::OUTSIDE, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Logits rows computed per LM-head pass (bounds the logits buffer).
pub(crate) const LOGIT_ROWS: usize = 64;

impl Scratch {
    pub fn new(
        dev: &CudaDevice,
        w: &Widths,
        rows: usize,
        row_splits: usize,
    ) -> Result<Self, CudaError> {
        let parts = row_splits * w.heads;
        let (moe_ids, moe_wts) = crate::moe::routing_buffers(dev, w, rows)?;
        Ok(Scratch {
            rows,
            row_splits,
            ids: DBuf::zeros(dev, rows * 4)?,
            start: DBuf::zeros(dev, 4)?,
            x: DBuf::f32s(dev, rows * w.hidden)?,
            h: DBuf::f32s(dev, rows * w.hidden)?,
            big: DBuf::f32s(dev, rows * w.big)?,
            mid: DBuf::f32s(dev, rows * w.mid)?,
            o: DBuf::f32s(dev, rows * w.o)?,
            q: DBuf::f32s(dev, rows * w.q)?,
            gate: DBuf::f32s(dev, rows * w.q)?,
            part_m: DBuf::f32s(dev, parts)?,
            part_l: DBuf::f32s(dev, parts)?,
            part_acc: DBuf::f32s(dev, parts * w.head_dim)?,
            xb: DBuf::zeros(dev, rows * w.max_in * 2)?,
            logits: DBuf::f32s(dev, rows.min(LOGIT_ROWS) * w.vocab)?,
            argmax: DBuf::zeros(dev, crate::argmax::pair_bytes(rows.min(LOGIT_ROWS)))?,
            // hv <= hv * dv = the widest GDN output row.
            gdn_done: DBuf::zeros(dev, w.o.max(1) * 4)?,
            rope: DBuf::f32s(dev, rows.min(ROPE_ROWS) * 2 * crate::ops::ATT_MAX_D)?,
            rope_rows: rows.min(ROPE_ROWS),
            rope_pass: RopePass::default(),
            moe_ids,
            moe_wts,
            gdn: DBuf::f32s(
                dev,
                if rows > 1 {
                    rows.next_multiple_of(crate::gdn_chunk::CHUNK) * w.gdn_chunk
                } else {
                    0
                },
            )?,
        })
    }
}
