//! Launch limits the device layer needs when it loads the kernel module and runs segments, defined here
//! so that `device.rs` and `segment.rs` need nothing from the operations above them: the kernels'
//! shared-memory opt-ins above 48 KiB, the tensor-core GEMV's fragment scratch, and the GEMV kernel's
//! warps per block. The operation modules re-export the constants they own (mma.rs, ops.rs, gdn.rs,
//! gdn_chunk.rs).

/// Rows per launch of the tensor-core GEMV (MMA_MAX_ROWS: the m16 of its mma).
pub(crate) const MMA_MAX_ROWS: usize = 16;
/// Bytes of the device's fragment scratch (`CudaDevice::frag_scratch`): 16 rows of up to 32768 columns
/// at 6 bytes (three bf16 terms) per value.
pub(crate) const FRAG_SCRATCH_BYTES: usize = MMA_MAX_ROWS * 32768 * 6;
/// Largest split-fragment stage (rows x cols x 6 bytes) of a tensor-core GEMV block: two blocks per SM
/// within the H100/H200's 227 KiB; the kernels are opted in to it at load (`device.rs`).
pub(crate) const MMA_STAGE_BYTES: usize = 96 * 1024;
/// Largest head_dim the attention kernels hold per lane (ATT_MAX_D).
pub const ATT_MAX_D: usize = 256;
/// The most any attn_tc kernel asks for (d = ATT_MAX_D); device.rs opts the kernels in to it.
pub(crate) const ATT_TC_MAX_SMEM: usize = 256 * (ATT_MAX_D + 8);
/// Most dynamic shared memory gdn_step is opted in to (gdn.rs GDN_STEP_SMEM takes at most this).
pub(crate) const GDN_STEP_MAX_SMEM: usize = 112 * 1024;
/// Rows per chunk of the chunked GDN form (GDC_C).
pub(crate) const GDN_CHUNK: usize = 64;
/// Value columns per gdn_chunk_state block (GDC_COLS).
pub(crate) const GDN_CHUNK_COLS: usize = 32;
/// Dynamic shared memory of gdn_chunk_state (GDC_ST_FLOATS floats): the S slice [128, COLS], V' and
/// its scaled copy [CHUNK, COLS] each, W, Q and K rows [CHUNK, 132] each, P rows [CHUNK, 68]. Above
/// 48 KiB: device.rs opts the kernel in.
pub(crate) const GDN_CHUNK_STATE_SMEM: usize = 4
    * (128 * GDN_CHUNK_COLS
        + 2 * GDN_CHUNK * GDN_CHUNK_COLS
        + 3 * GDN_CHUNK * 132
        + GDN_CHUNK * 68);
/// Warps per block of the FMA GEMV kernel (linear.cu LIN_WARPS).
pub(crate) const LIN_WARPS: usize = 8;
/// Most rows of one quantized GEMV launch (quant.cu QGEMV_MAX_ROWS) and most columns of a quantized
/// matrix: the 8-bit input scratch holds that many rows.
pub(crate) const QUANT_MAX_ROWS: usize = 16;
pub(crate) const QUANT_MAX_COLS: usize = 65536;
/// Bytes of the quantized GEMV's input scratch: q (1 byte) and d, d·Σq (4 bytes per 32 values each).
pub(crate) const QUANT_INPUT_BYTES: usize = QUANT_MAX_ROWS * QUANT_MAX_COLS * 5 / 4;
/// Bytes of the dequantized bf16 weight tile of a quantized prefill GEMM.
pub(crate) const QUANT_TILE_BYTES: usize = 64 << 20;
