//! Where a segment kernel's time goes (`TURBOSPARK_SEG_TRACE=1`, which runs the trace kernels).
//!
//! The trace kernels (`gemv_segment_trace_*`, segment.cu) write per block, after the grid barrier's
//! words, SM clock stamps at each stage's start, input staged, rows done and grid barrier passed, the
//! cycles the consumer warps waited for pages and the producers for free pages, and globaltimer stamps
//! at entry and end. The backend records the words of every un-captured segment launch
//! (`cuda_backend::lab::segment_trace`); [`report`] summarises them per kind of segment (its stage shapes).

use std::collections::BTreeMap;

use cuda_backend::lab::{TracedLaunch, TRACE_WORDS as WORDS};
use cuda_backend::CudaDevice;

/// Where the stages' six words start (SEG_TR_STAGE) and where their staging-loads-returned stamps are
/// (SEG_TR_LOADED: after 8 stages' six words).
const STAGE: usize = 8;
const LOADED: usize = STAGE + 6 * 8;
/// Consumer warp w's end of its rows of stage s (< 4): word WARPS + 16 s + w (SEG_TR_WARPS).
const WARPS: usize = 64;
/// Word WARPS + 16 s + COUPLED (SEG_TR_COUPLED): the producers' waits for a free page of stage s (< 4)
/// during which a consumer warp of the block was waiting for a page too.
const COUPLED: usize = 15;
/// Word WARPS + 16 s + CAPPED (SEG_TR_CAPPED): the producers' waits for their own earlier copy to land (the
/// in-flight cap), part of their waits of stage s (< 4).
const CAPPED: usize = 14;
/// Word WARPS + 16 s + AHEAD (SEG_TR_AHEAD): the units the producers had issued past stage s's first (< 4)
/// when the consumers began its rows: what the ring banked across the boundary.
const AHEAD: usize = 13;
/// The block's SM id + 1 (SEG_TR_SM).
const SM: usize = 6;

/// Per kind of segment: launches, kernel time (globaltimer, first entry to last end), and per stage
/// the medians over launches of the blocks' median staging / rows / barrier times, the slowest
/// block's rows time, how far apart a block's consumer warps end their rows (the median block; stages
/// 0-3), the stage's bytes over the median rows time, and the share of the rows time
/// the consumer warps waited for pages and the producers for free pages. `clock_khz`: the SM clock
/// that converts cycles (the kernel's own cycles per globaltimer ns are printed beside it).
pub fn report(launches: &[TracedLaunch], clock_khz: f64) -> Option<String> {
    if launches.is_empty() {
        return None;
    }
    let mut kinds: BTreeMap<&str, Vec<&TracedLaunch>> = BTreeMap::new();
    for l in launches.iter() {
        kinds.entry(&l.kind).or_default().push(l);
    }
    let us = |cycles: f64| cycles / clock_khz * 1e3;
    let mut out = String::new();
    for (kind, ls) in kinds {
        let n = ls[0].bytes.len();
        let (consumers, producers) = ls[0].warps;
        let mut kernel_ns = Vec::new();
        let mut ghz = Vec::new();
        let mut first_copy = Vec::new();
        // The consumers' entries (globaltimer, past the PDL wait): the last block's after the median one.
        let mut late_entry = Vec::new();
        // [stage][metric] -> per-launch values
        let mut m: Vec<[Vec<f64>; 12]> = (0..n).map(|_| Default::default()).collect();
        // [stage] -> per launch, the block whose rows ended last
        let mut slowest: Vec<Vec<usize>> = vec![Vec::new(); n];
        for l in &ls {
            let blocks: Vec<&[u64]> = l.words.chunks_exact(WORDS).collect();
            let entry = blocks.iter().map(|b| b[2]).filter(|&t| t > 0).min();
            let end = blocks.iter().map(|b| b[3]).max();
            if let (Some(a), Some(e)) = (entry, end) {
                kernel_ns.push(e.saturating_sub(a) as f64);
            }
            let entries = || blocks.iter().map(|b| b[2] as f64).filter(|&t| t > 0.0);
            late_entry.push(entries().fold(0.0, f64::max) - median(entries()));
            ghz.push(median(blocks.iter().map(|b| {
                b[1].saturating_sub(b[0]) as f64 / (b[3].saturating_sub(b[2]).max(1)) as f64
            })));
            first_copy.push(median(blocks.iter().map(|b| b[4] as f64 - b[0] as f64)));
            for (s, ms) in m.iter_mut().enumerate() {
                let w = |b: &[u64], k: usize| b[STAGE + 6 * s + k] as f64;
                let rows: Vec<f64> = blocks.iter().map(|b| w(b, 2) - w(b, 1)).collect();
                if let Some((b, _)) = rows.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)) {
                    slowest[s].push(b);
                }
                ms[0].push(median(blocks.iter().map(|b| w(b, 1) - w(b, 0))));
                ms[1].push(median(rows.iter().copied()));
                ms[2].push(rows.iter().copied().fold(0.0, f64::max));
                ms[3].push(median(blocks.iter().map(|b| w(b, 3) - w(b, 2))));
                // The shortest wait: the last block to arrive, whose wait is the barrier's own round
                // trips (every block leaves as the count completes); the median's exceeds it by how much
                // later the last block arrived.
                ms[10].push(
                    blocks
                        .iter()
                        .map(|b| w(b, 3) - w(b, 2))
                        .fold(f64::INFINITY, f64::min),
                );
                ms[4].push(median(
                    blocks
                        .iter()
                        .zip(&rows)
                        .map(|(b, r)| w(b, 4) / (consumers as f64 * r.max(1.0))),
                ));
                ms[5].push(median(
                    blocks
                        .iter()
                        .zip(&rows)
                        .map(|(b, r)| w(b, 5) / (producers as f64 * r.max(1.0))),
                ));
                ms[6].push(median(
                    blocks
                        .iter()
                        .filter(|b| b[LOADED + s] > 0)
                        .map(|b| b[LOADED + s] as f64 - w(b, 0)),
                ));
                // The block's first and last consumer warp to finish its rows, apart.
                ms[7].push(median(blocks.iter().filter(|_| s < 4).map(|b| {
                    let ends: Vec<f64> = (0..consumers.min(16))
                        .map(|k| b[WARPS + 16 * s + k] as f64)
                        .filter(|&t| t > 0.0)
                        .collect();
                    ends.iter().copied().fold(f64::MIN, f64::max)
                        - ends.iter().copied().fold(f64::MAX, f64::min)
                })));
                // The producers' coupled waits, as a share of their waits (stages 0-3).
                ms[8].push(median(
                    blocks
                        .iter()
                        .filter(|b| s < 4 && w(b, 5) > 0.0)
                        .map(|b| b[WARPS + 16 * s + COUPLED] as f64 / w(b, 5)),
                ));
                ms[11].push(median(
                    blocks
                        .iter()
                        .filter(|_| s < 4)
                        .map(|b| b[WARPS + 16 * s + AHEAD] as f64),
                ));
                // The producers' waits on the in-flight cap, as a share of their waits.
                ms[9].push(median(
                    blocks
                        .iter()
                        .filter(|b| s < 4 && w(b, 5) > 0.0)
                        .map(|b| b[WARPS + 16 * s + CAPPED] as f64 / w(b, 5)),
                ));
            }
        }
        // Stage 0 with fewer than 5 stages: thread 0 past the consumers' barrier after the loads, and
        // done with its part of a gated norm (words LOADED + 4 and + 5).
        let stamp = |k: usize| {
            us(median(ls.iter().map(|l| {
                median(
                    l.words
                        .chunks_exact(WORDS)
                        .filter(|b| b[LOADED + k] > 0)
                        .map(|b| b[LOADED + k] as f64 - b[STAGE] as f64),
                )
            })))
        };
        let (synced, normed) = (stamp(4), stamp(5));
        out += &format!(
            "segment trace [{kind}]: {} launches, kernel {:.1} us (globaltimer), SM clock {:.2} cycles/ns, \
             first copy {:.2} us after the consumers' entry, the last block's entry {:.2} us after the median \
             one; stage 0 loads synced {synced:.2} us, gated norm done {normed:.2} us after its start\n",
            ls.len(),
            median(kernel_ns.into_iter()) / 1e3,
            median(ghz.into_iter()),
            us(median(first_copy.into_iter())),
            median(late_entry.into_iter()) / 1e3,
        );
        for (s, ms) in m.iter().enumerate() {
            let med = |k: usize| median(ms[k].iter().copied());
            let rows_us = us(med(1));
            out += &format!(
                "  stage {s}: staging {:5.2} us (loads {:5.2}), rows {:6.2} us (slowest block {:6.2}; a block's \
                 warps end {:4.2} apart), barrier {:5.2} us (the last to arrive waited {:4.2}), {:5.0} GB/s over the \
                 median rows time; consumers waited \
                 {:3.0}%, producers {:3.0}% ({:3.0}% of it while a consumer waited for a page too, {:3.0}% for their \
                 own copies to land); {:.0} of the ring's {} pages issued ahead as the rows began\n",
                us(med(0)),
                us(med(6)),
                rows_us,
                us(med(2)),
                us(med(7)),
                us(med(3)),
                us(med(10)),
                ls[0].bytes[s] / (rows_us * 1e3),
                100.0 * med(4),
                100.0 * med(5),
                100.0 * med(8),
                100.0 * med(9),
                med(11),
                ls[0].pages,
            );
            // The block most often slowest: its SM and jobs (the same SMs each launch: placement; the
            // blocks with a job more: the split; neither: contention).
            let mut counts = BTreeMap::new();
            for &b in &slowest[s] {
                *counts.entry(b).or_insert(0usize) += 1;
            }
            if let Some((&b, &k)) = counts.iter().max_by_key(|&(_, k)| *k) {
                let blocks = ls[0].words.len() / WORDS;
                let sm = ls[0].words[b * WORDS + SM];
                let jobs = ls[0].jobs[s];
                let (base, extra) = (jobs / blocks.max(1), jobs % blocks.max(1));
                out += &format!(
                    "    slowest block most often: {b} ({k} of {} launches; SM {}, {} jobs, {} of the {} blocks \
                     have {})\n",
                    slowest[s].len(),
                    if sm > 0 { format!("{}", sm - 1) } else { "?".into() },
                    base + usize::from(b < extra),
                    if extra > 0 { extra } else { blocks },
                    blocks,
                    base + usize::from(extra > 0),
                );
            }
        }
    }
    Some(out)
}

/// [`report`] of the segment launches `dev` traced so far, at the device's SM clock; None when none ran.
pub fn device_report(dev: &CudaDevice) -> Option<String> {
    let (launches, clock_khz) = cuda_backend::lab::segment_trace(dev)?;
    report(&launches, clock_khz)
}

fn median(it: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = it.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps of one block: entry at 1000 cycles, stage s starting at 1000 + 10000 s, staged 500
    /// cycles later, rows done `rows` cycles after that, barrier passed 200 cycles after; globaltimer
    /// entry / end in ns.
    fn block(rows: [u64; 2], gt: (u64, u64)) -> Vec<u64> {
        let mut w = vec![0u64; WORDS];
        w[0] = 1000;
        w[1] = 1000 + 20000;
        w[2] = gt.0;
        w[3] = gt.1;
        w[4] = 1100;
        for (s, r) in rows.iter().enumerate() {
            let base = 1000 + 10000 * s as u64;
            let at = STAGE + 6 * s;
            w[at..at + 6].copy_from_slice(&[
                base,
                base + 500,
                base + 500 + r,
                base + 700 + r,
                2 * r,
                4 * r,
            ]);
            w[LOADED + s] = base + 300;
            w[WARPS + 16 * s] = base + 400 + r;
            w[WARPS + 16 * s + 1] = base + 500 + r;
            w[WARPS + 16 * s + COUPLED] = *r;
            w[WARPS + 16 * s + CAPPED] = 2 * r;
            w[WARPS + 16 * s + AHEAD] = r / 100;
        }
        w
    }

    #[test]
    fn report_gives_each_stages_median_and_slowest_block_in_microseconds() {
        let words = [
            block([2000, 4000], (100, 10_000)),
            block([3000, 4000], (500, 12_100)),
        ]
        .concat();
        let launches = [TracedLaunch {
            kind: "2560x4096, 18432x2560 swiglu".into(),
            warps: (2, 4),
            pages: 32,
            bytes: vec![2e7, 9e7],
            jobs: vec![2560, 9216],
            words,
        }];
        // 1 GHz: a cycle is a ns.
        let r = report(&launches, 1e6).unwrap();
        assert!(r.contains("1 launches, kernel 12.0 us"), "{r}");
        // Stage 0: staging 500 cycles, rows 2000 / 3000 (median of two: the upper), slowest 3000; the two
        // warps end 100 cycles apart.
        assert!(
            r.contains(
                "stage 0: staging  0.50 us (loads  0.30), rows   3.00 us (slowest block   3.00; a block's warps end 0.10 apart)"
            ),
            "{r}"
        );
        // Consumers waited 2 r cycles over 2 warps x r cycles: 100%.
        assert!(
            r.contains("stage 1: staging  0.50 us (loads  0.30), rows   4.00 us"),
            "{r}"
        );
        assert!(r.contains("consumers waited 100%"), "{r}");
        // Both blocks waited 200 cycles at the barrier: the last to arrive too.
        assert!(
            r.contains("barrier  0.20 us (the last to arrive waited 0.20)"),
            "{r}"
        );
        // Producers waited 4 r cycles over 4 warps x r cycles, a quarter of it coupled.
        assert!(
            r.contains("producers 100% ( 25% of it while a consumer waited for a page too,  50% for their own copies to land)"),
            "{r}"
        );
        // Units issued ahead as the rows began: stage 0's blocks 20 / 30 (the median of two: the upper).
        assert!(
            r.contains("land); 30 of the ring's 32 pages issued ahead as the rows began\n"),
            "{r}"
        );
        // Block 1 is stage 0's slowest; no SM stamped.
        assert!(
            r.contains("slowest block most often: 1 (1 of 1 launches; SM ?, 1280 jobs, 2 of the 2 blocks have 1280)"),
            "{r}"
        );
    }
}
