//! Sampling candidates of logits rows taken on the device (`topk_parts` + `topk_merge` in misc.cu), for
//! forwards whose caller shapes top-k requests (`families::Wanted::candidates`): a sampled step then copies
//! ~2k values instead of the [vocab] row (608 KB at Qwen's 151936) and the host shapes k of them instead of
//! scanning the row (sampling's `ShapedDistribution::from_candidates`, the row's bits). H200, 4B shape,
//! Qwen3's card: sampled decoding 0.80x of greedy with the rows copied, 0.96-0.97x with candidates (the two
//! kernels 10 + 17 us a row).
//!
//! Algorithm: per chunk of 2048-8192 logits (in shared memory; `chunk_for`), the keys at or above the chunk's K-th largest in
//! `f32::total_cmp`'s order (radix selection: four passes of 8 bits, counting the digits of the keys that
//! match the prefix chosen so far); then per row the same selection over the union of its chunks' sets,
//! which holds every row candidate (fewer than K of the row's keys exceed one, so fewer exceed it in its
//! chunk): the K largest and all their ties.
//!
//! Invariant: a row's candidates are exactly {i : key(row[i]) >= key(K-th largest)} (sorted by id here),
//! so every logit at or above the smallest candidate is one; a row with a NaN or +inf, with more than
//! `CAP` candidates, or with fewer than K logits above -inf, is never answered by candidates — the caller copies the rows, so errors read
//! as they would from the row.

use families::{Candidates, Wanted};

use crate::argmax::Topk;
use crate::buf::{dtoh, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::model::CudaModel;
use crate::state::{check_signature, CudaState, LOGIT_ROWS};

/// The first kernel's largest chunk of logits (its shared memory); the keys the second kernel holds and the
/// chunks it merges (misc.cu; their threads are argmax.rs's, next to the launches).
const TOPK_CHUNK: usize = 8192;
const TOPK_MERGE_MAX: usize = 10240;
const TOPK_MAX_PARTS: usize = 128;
/// The smallest chunk: more chunks spread the selection over more SMs.
const MIN_CHUNK: usize = 2048;

/// Logits per chunk for K candidates of a `vocab` row: the smallest of 2048 / 4096 / 8192 whose chunks' sets
/// (K each, with a quarter more for ties) fit the merge, else the largest (a row that overflows it is flagged
/// and copied).
fn chunk_for(vocab: usize, k: usize) -> usize {
    [MIN_CHUNK, 2 * MIN_CHUNK, TOPK_CHUNK]
        .into_iter()
        .find(|&c| {
            let parts = vocab.div_ceil(c);
            parts <= TOPK_MAX_PARTS && parts * (k + k / 4) <= TOPK_MERGE_MAX
        })
        .unwrap_or(TOPK_CHUNK)
}

/// Candidates a row may return (K of them plus ties); more sends the caller back to the row.
pub(crate) const CAP: usize = 1024;

/// Candidates a chunk may pass on to the merge (K <= CAP / 2 of them plus ties).
const CHUNK_CAP: usize = 512;

/// Device buffers for the candidates of up to `rows` rows: one allocation, [meta | ids | vals] (4-byte
/// words: rows * 2, rows * CAP, rows * CAP), so a row set comes back in one copy; and the chunks'
/// [ids | vals | meta] between the two kernels.
pub(crate) struct CandidateBufs {
    rows: usize,
    parts: usize,
    all: DBuf,
    chunks: DBuf,
}

impl CandidateBufs {
    pub(crate) fn new(dev: &CudaDevice, rows: usize, vocab: usize) -> Result<Self, CudaError> {
        let parts = vocab.div_ceil(MIN_CHUNK).max(1);
        Ok(CandidateBufs {
            rows,
            parts,
            all: DBuf::zeros(dev, Self::words(rows) * 4)?,
            chunks: DBuf::zeros(dev, rows * parts * (2 * CHUNK_CAP + 2) * 4)?,
        })
    }

    fn words(rows: usize) -> usize {
        rows * 2 + 2 * rows * CAP
    }

    /// Device addresses of (meta, ids, vals).
    fn parts(&self) -> (u64, u64, u64) {
        let meta = self.all.ptr;
        let ids = meta + (self.rows * 2 * 4) as u64;
        (meta, ids, ids + (self.rows * CAP * 4) as u64)
    }

    /// Selects the candidates of `rows` rows of logits [rows, vocab] (K of each, with ties).
    pub(crate) fn launch(
        &self,
        dev: &CudaDevice,
        logits: u64,
        rows: usize,
        vocab: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let chunk = chunk_for(vocab, k);
        let parts = vocab.div_ceil(chunk);
        if rows > self.rows || parts > self.parts {
            return Err(CudaError::Unsupported {
                what: format!(
                    "candidates of {rows} rows of {vocab} in buffers for {}",
                    self.rows
                ),
            });
        }
        let per = rows * parts * CHUNK_CAP * 4;
        let (chunk_ids, chunk_vals) = (self.chunks.ptr, self.chunks.ptr + per as u64);
        let (meta, ids, vals) = self.parts();
        let t = Topk {
            logits,
            rows,
            vocab,
            k,
            chunk,
            parts,
            chunk_cap: CHUNK_CAP,
            cap: CAP,
            chunk_ids,
            chunk_vals,
            chunk_meta: chunk_vals + per as u64,
            meta,
            ids,
            vals,
        };
        dev.exec().topk(dev, &t)
    }

    /// The candidates `launch` selected, each row's sorted by id; None when a row is flagged (a NaN
    /// or +inf in it, or more than `CAP` candidates).
    pub(crate) fn read(
        &self,
        dev: &CudaDevice,
        rows: usize,
    ) -> Result<Option<Vec<Candidates>>, CudaError> {
        // One copy of everything (8 KB a row) rather than the counts first: each copy waits for the device.
        let mut words = vec![0u32; Self::words(self.rows)];
        dtoh(dev, &mut words, self.all.ptr)?;
        let meta: Vec<i32> = words[..rows * 2].iter().map(|&w| w as i32).collect();
        if meta.chunks_exact(2).any(|m| m[1] != 0 || m[0] <= 0) {
            return Ok(None);
        }
        let at = self.rows * 2;
        let ids: Vec<i32> = words[at..at + rows * CAP]
            .iter()
            .map(|&w| w as i32)
            .collect();
        let at = at + self.rows * CAP;
        let vals: Vec<f32> = words[at..at + rows * CAP]
            .iter()
            .map(|&w| f32::from_bits(w))
            .collect();
        let mut out = Vec::with_capacity(rows);
        for (r, m) in meta.chunks_exact(2).enumerate() {
            let n = m[0] as usize;
            let mut pairs: Vec<(u32, f32)> = ids[r * CAP..r * CAP + n]
                .iter()
                .zip(&vals[r * CAP..r * CAP + n])
                .map(|(&i, &v)| (i as u32, v))
                .collect();
            pairs.sort_unstable_by_key(|p| p.0);
            let (ids, logits) = pairs.into_iter().unzip();
            out.push(Candidates { ids, logits });
        }
        Ok(Some(out))
    }
}

impl CudaModel {
    /// `Wanted::candidates` as this forward can serve it: K when the rows' logits would come back
    /// (not argmax-only) and K fits the selection, with its buffers made; else 0 (logits).
    pub(crate) fn candidate_rows(
        &self,
        state: &mut CudaState,
        wanted: &Wanted,
    ) -> Result<usize, CudaError> {
        let k = wanted.candidates;
        if k == 0
            || !self.opts.candidates
            || wanted.argmax_only
            || k >= self.vocab
            || k > crate::candidates::CAP / 2
        {
            return Ok(0);
        }
        if state.candidates.is_none() {
            state.candidates = Some(crate::candidates::CandidateBufs::new(
                &self.dev, LOGIT_ROWS, self.vocab,
            )?);
        }
        Ok(k)
    }

    /// The candidates of `rows` logits rows at `logits` (device), remembering the rows for
    /// `last_logits`; None when a row is flagged (the caller copies the rows).
    pub(crate) fn select_candidates(
        &self,
        state: &mut CudaState,
        logits: u64,
        rows: usize,
        k: usize,
    ) -> Result<Option<Vec<Candidates>>, CudaError> {
        let Some(bufs) = &state.candidates else {
            return Ok(None);
        };
        if rows > LOGIT_ROWS {
            return Ok(None);
        }
        bufs.launch(&self.dev, logits, rows, self.vocab, k)?;
        let got = bufs.read(&self.dev, rows)?;
        if got.is_some() {
            state.last_logits = Some((logits, rows));
        }
        Ok(got)
    }

    /// The rows the last forward answered with candidates (`Backend::last_logits`).
    pub fn last_logits(&self, state: &mut CudaState) -> Result<Option<Vec<f32>>, CudaError> {
        check_signature(state, &self.signature)?;
        let Some((ptr, rows)) = state.last_logits else {
            return Ok(None);
        };
        let mut logits = vec![0.0f32; rows * self.vocab];
        dtoh(&self.dev, &mut logits, ptr)?;
        Ok(Some(logits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::htod;

    /// The kernel (in the simulator) and the emulation against a selection by sorting: the K largest
    /// with every tie, signed zeros and -inf in the row, flags for NaN / +inf and overflow.
    #[test]
    fn device_candidates_are_the_k_largest_with_their_ties() {
        assert_eq!(
            [40, 200, 400].map(|k| chunk_for(151_936, k)),
            [2048, 4096, 8192]
        );
        // Several chunks (151936: Qwen's vocabulary; 20011: a short last chunk), one chunk, the emulation.
        for (dev, vocab) in [
            (CudaDevice::simulated().expect("simulator"), 151_936usize),
            (CudaDevice::simulated().expect("simulator"), 20_011),
            (CudaDevice::simulated().expect("simulator"), 1001),
            (CudaDevice::emulated(), 1001),
        ] {
            let base: Vec<f32> = (0..vocab)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 3.0)
                .collect();
            let mut rows: Vec<Vec<f32>> = vec![base.clone()];
            let mut ties = base.clone();
            // Ties of the largest value in different chunks.
            for i in [3, vocab / 2, vocab - 1] {
                ties[i] = 7.5;
            }
            ties[10] = -0.0;
            ties[11] = 0.0;
            ties[12] = f32::NEG_INFINITY;
            rows.push(ties);
            // Mostly -inf (masked), with both zeros among 60 finite values.
            let mut zeros = vec![f32::NEG_INFINITY; vocab];
            for i in 0..60 {
                zeros[7 * i + 1] = -(i as f32) * 0.25;
            }
            zeros[9] = -0.0;
            zeros[4] = 0.0;
            rows.push(zeros);
            let mut nan = base.clone();
            nan[5] = f32::NAN;
            rows.push(nan);
            let mut inf = base.clone();
            inf[vocab - 1] = f32::INFINITY;
            rows.push(inf);
            let flat: Vec<f32> = rows.concat();
            let x = DBuf::zeros(&dev, flat.len() * 4).unwrap();
            htod(&dev, x.ptr, &flat).unwrap();
            let bufs = CandidateBufs::new(&dev, rows.len(), vocab.max(CAP + 1)).unwrap();
            // At 151936 logits K 40 / 200 / 400 take chunks of 2048 / 4096 / 8192.
            for k in [1usize, 2, 40, 200, 400] {
                let want = |row: &[f32]| {
                    let mut sorted = row.to_vec();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    let kth = sorted[k - 1];
                    let (ids, logits): (Vec<u32>, Vec<f32>) = row
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.total_cmp(&kth).is_ge())
                        .map(|(i, &v)| (i as u32, v))
                        .unzip();
                    Candidates { ids, logits }
                };
                // The good rows together (row 2 has 62 finite logits: fewer than K 200 / 400, which
                // flags it), then each flagged row alone.
                let good = if k <= 60 { 3 } else { 2 };
                bufs.launch(&dev, x.ptr, good, vocab, k).unwrap();
                let got = bufs.read(&dev, good).unwrap().expect("no flags");
                for (r, c) in got.iter().enumerate() {
                    let w = want(&rows[r]);
                    assert_eq!(c.ids, w.ids, "vocab {vocab} k {k} row {r}: ids");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&c.logits),
                        bits(&w.logits),
                        "vocab {vocab} k {k} row {r}"
                    );
                }
                for r in [3, 4] {
                    bufs.launch(&dev, x.f32_at(r * vocab), 1, vocab, k).unwrap();
                    assert!(bufs.read(&dev, 1).unwrap().is_none(), "row {r} not flagged");
                }
            }
            // Fewer than K logits above -inf: flagged (the rest are candidates only as -inf ties).
            let mut few = vec![f32::NEG_INFINITY; vocab];
            for i in 0..10 {
                few[vocab - 1 - 97 * i] = i as f32;
            }
            let z = DBuf::zeros(&dev, vocab * 4).unwrap();
            htod(&dev, z.ptr, &few).unwrap();
            bufs.launch(&dev, z.ptr, 1, vocab, 10).unwrap();
            let got = bufs.read(&dev, 1).unwrap().expect("10 of 10");
            assert_eq!(got[0].ids.len(), 10);
            bufs.launch(&dev, z.ptr, 1, vocab, 11).unwrap();
            assert!(
                bufs.read(&dev, 1).unwrap().is_none(),
                "11 of 10 not flagged"
            );
            // More than CAP candidates (all equal): flagged.
            let flat_row = vec![1.0f32; vocab.max(CAP + 1)];
            let y = DBuf::zeros(&dev, flat_row.len() * 4).unwrap();
            htod(&dev, y.ptr, &flat_row).unwrap();
            bufs.launch(&dev, y.ptr, 1, flat_row.len(), 2).unwrap();
            assert!(
                bufs.read(&dev, 1).unwrap().is_none(),
                "overflow not flagged"
            );
        }
    }
}
