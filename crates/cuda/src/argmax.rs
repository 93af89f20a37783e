//! The greedy token of logits rows taken on the device (`argmax_rows` in misc.cu), for forwards whose
//! caller needs only that (`families::Wanted::argmax_only`: greedy decoding without penalties). A decode
//! step then copies 8 bytes instead of the 608 KB row of a 151936-token vocabulary and skips the host's
//! scan of it (together 0.13 ms of a 3.38 ms step on the H200).
//!
//! Invariant: the id equals `kernels::argmax` of the row (lowest index of the largest value, NaN
//! skipped), and a row the host would refuse (NaN, +inf, all -inf: `sampling`'s logits check) is never
//! answered by id — its flag sends the caller back to copying the logits, so errors read the same.
//!
//! Also the launches of the sampling candidates' selection ([`Topk`]: `topk_parts` + `topk_merge`), whose
//! buffers and algorithm are candidates.rs's. Both run through the device's operations (`exec.rs`).

use crate::buf::{dtoh, launch, Arg};
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Threads of a chunk's block (ARGMAX_PART_THREADS in misc.cu); a row is split into at most MAX_PARTS
/// chunks of at least MIN_CHUNK logits (a block reads 16 of them a thread in one round trip), merged by
/// one warp.
const ARGMAX_PART_THREADS: u32 = 256;
const MAX_PARTS: usize = 64;
const MIN_CHUNK: usize = 4096;

/// Logits per chunk and chunks of a row of `vocab`.
fn chunking(vocab: usize) -> (usize, usize) {
    let chunk = vocab.div_ceil(MAX_PARTS).next_multiple_of(4).max(MIN_CHUNK);
    (chunk, vocab.div_ceil(chunk).max(1))
}

/// Device bytes of the argmax buffer of `rows` rows: their [id, flag] pairs, then the chunks' partial
/// results ([rows, MAX_PARTS, 3] i32) between the two kernels.
pub(crate) fn pair_bytes(rows: usize) -> usize {
    rows * 2 * 4 + rows * MAX_PARTS * 3 * 4
}

/// The two kernels: the chunks of `rows` rows, then each row's merge into `out`'s pairs (and the feeding:
/// `launch_feeding`'s next id, next start, host pair and counter, or all 0). What `exec::Kernels` runs.
pub(crate) fn launch_both(
    dev: &CudaDevice,
    logits: u64,
    rows: usize,
    vocab: usize,
    out: u64,
    feed: [u64; 4],
) -> Result<(), CudaError> {
    let (chunk, parts) = chunking(vocab);
    let partial = out + (rows * 2 * 4) as u64;
    launch(
        dev,
        "argmax_parts",
        (parts as u32, rows as u32, 1),
        ARGMAX_PART_THREADS,
        &[
            Arg::P(logits),
            Arg::I(vocab as i32),
            Arg::I(chunk as i32),
            Arg::P(partial),
        ],
    )?;
    launch(
        dev,
        "argmax_rows",
        (rows as u32, 1, 1),
        32,
        &[
            Arg::P(partial),
            Arg::I(parts as i32),
            Arg::P(out),
            Arg::P(feed[0]),
            Arg::P(feed[1]),
            Arg::P(feed[2]),
            Arg::P(feed[3]),
        ],
    )
}

/// out [rows, 2] i32 = [argmax, refused] of each row of logits [rows, vocab].
pub(crate) fn launch_rows(
    dev: &CudaDevice,
    logits: u64,
    rows: usize,
    vocab: usize,
    out: u64,
) -> Result<(), CudaError> {
    dev.exec().argmax_rows(dev, logits, rows, vocab, out)
}

/// `launch_rows` of one row that also feeds the next decode step (chain.rs): `next` = ([1] i32 id, [1]
/// i32 start) gets the argmax (0 for a row with nothing above -inf) and start + 1, and `host_pair` (host
/// memory the device can address) a copy of the [argmax, refused] pair: at pair `*counter` (then counted
/// up) when `counter` is not 0.
pub(crate) fn launch_feeding(
    dev: &CudaDevice,
    logits: u64,
    vocab: usize,
    out: u64,
    next: (u64, u64),
    host_pair: u64,
    counter: u64,
) -> Result<(), CudaError> {
    dev.exec()
        .argmax_feeding(dev, logits, vocab, out, next, host_pair, counter)
}

/// The ids of `rows` rows whose pairs `launch_rows` wrote at `out`, or None when any row is refused.
pub(crate) fn read_ids(
    dev: &CudaDevice,
    out: u64,
    rows: usize,
) -> Result<Option<Vec<u32>>, CudaError> {
    let mut pairs = vec![0i32; rows * 2];
    dtoh(dev, &mut pairs, out)?;
    if pairs.chunks_exact(2).any(|p| p[1] != 0) {
        return Ok(None);
    }
    Ok(Some(pairs.chunks_exact(2).map(|p| p[0] as u32).collect()))
}

/// One selection of sampling candidates (`topk_parts` + `topk_merge` in misc.cu) for candidates.rs, which
/// owns the buffers and states the algorithm: `rows` rows of logits [rows, vocab] in `parts` chunks of
/// `chunk`, each chunk's K plus ties (at most `chunk_cap`) into the chunk buffers [ids | vals | meta],
/// then each row's (at most `cap`) into `ids` / `vals` [rows, cap] with [count, flags] in `meta`.
pub(crate) struct Topk {
    pub logits: u64,
    pub rows: usize,
    pub vocab: usize,
    pub k: usize,
    pub chunk: usize,
    pub parts: usize,
    pub chunk_cap: usize,
    pub cap: usize,
    pub chunk_ids: u64,
    pub chunk_vals: u64,
    pub chunk_meta: u64,
    pub meta: u64,
    pub ids: u64,
    pub vals: u64,
}

/// Threads of `topk_parts` and of `topk_merge` (misc.cu).
const TOPK_PART_THREADS: u32 = 1024;
const TOPK_MERGE_THREADS: u32 = 1024;

/// The two kernels of a [`Topk`] selection (`exec::Kernels`).
pub(crate) fn launch_topk(dev: &CudaDevice, t: &Topk) -> Result<(), CudaError> {
    launch(
        dev,
        "topk_parts",
        (t.parts as u32, t.rows as u32, 1),
        TOPK_PART_THREADS,
        &[
            Arg::P(t.logits),
            Arg::I(t.vocab as i32),
            Arg::I(t.chunk as i32),
            Arg::I(t.k as i32),
            Arg::I(t.chunk_cap as i32),
            Arg::P(t.chunk_ids),
            Arg::P(t.chunk_vals),
            Arg::P(t.chunk_meta),
        ],
    )?;
    launch(
        dev,
        "topk_merge",
        (t.rows as u32, 1, 1),
        TOPK_MERGE_THREADS,
        &[
            Arg::P(t.chunk_ids),
            Arg::P(t.chunk_vals),
            Arg::P(t.chunk_meta),
            Arg::I(t.parts as i32),
            Arg::I(t.chunk_cap as i32),
            Arg::I(t.k as i32),
            Arg::I(t.cap as i32),
            Arg::P(t.ids),
            Arg::P(t.vals),
            Arg::P(t.meta),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::{htod, DBuf};

    /// The kernel (in the simulator) against the CPU engine's argmax: ties to the lowest index, NaN
    /// skipped but flagged, +inf and all -inf flagged, odd widths on the scalar path.
    #[test]
    fn device_argmax_equals_the_host_argmax_and_flags_refused_rows() {
        for (dev, vocab) in [
            (CudaDevice::simulated().expect("simulator"), 151_936usize),
            (CudaDevice::simulated().expect("simulator"), 1001),
            (CudaDevice::emulated(), 1001),
        ] {
            let mut rows: Vec<Vec<f32>> = Vec::new();
            let base: Vec<f32> = (0..vocab)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 3.0)
                .collect();
            rows.push(base.clone());
            let mut tie = base.clone();
            tie[vocab / 3] = 50.0;
            tie[vocab - 2] = 50.0;
            tie[vocab / 2] = 50.0;
            rows.push(tie);
            let mut nan = base.clone();
            nan[5] = f32::NAN;
            rows.push(nan);
            let mut inf = base.clone();
            inf[vocab - 1] = f32::INFINITY;
            rows.push(inf);
            rows.push(vec![f32::NEG_INFINITY; vocab]);
            let mut zeros = vec![f32::NEG_INFINITY; vocab];
            zeros[9] = -0.0;
            zeros[4] = 0.0;
            rows.push(zeros);
            let flat: Vec<f32> = rows.concat();
            let x = DBuf::zeros(&dev, flat.len() * 4).unwrap();
            let out = DBuf::zeros(&dev, pair_bytes(rows.len())).unwrap();
            htod(&dev, x.ptr, &flat).unwrap();
            launch_rows(&dev, x.ptr, rows.len(), vocab, out.ptr).unwrap();
            let mut pairs = vec![0i32; rows.len() * 2];
            dtoh(&dev, &mut pairs, out.ptr).unwrap();
            let refused = [false, false, true, true, true, false];
            for (r, row) in rows.iter().enumerate() {
                let (id, flag) = (pairs[2 * r], pairs[2 * r + 1]);
                assert_eq!(flag != 0, refused[r], "vocab {vocab} row {r}: refused flag");
                if !refused[r] || r == 2 {
                    assert_eq!(
                        id as usize,
                        kernels::argmax(row),
                        "vocab {vocab} row {r}: argmax"
                    );
                }
            }
            assert_eq!(pairs[2], (vocab / 3) as i32, "ties go to the lowest index");
            assert_eq!(
                read_ids(&dev, out.ptr, 2).unwrap(),
                Some(vec![pairs[0] as u32, pairs[2] as u32])
            );
            assert_eq!(
                read_ids(&dev, out.ptr, 3).unwrap(),
                None,
                "a refused row sends the logits"
            );
        }
    }
}
