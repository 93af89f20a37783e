//! Causal GQA attention against an f64 softmax reference, with start > 0, several query blocks and thread counts.

use super::{assert_close, Rng};
use crate::attention;

/// Definition: for query row i (position start + i), head h, kv head h / (hq / hkv):
/// p = softmax_t<=start+i(q·k_t * scale), out = sum_t p_t v_t, in f64.
#[allow(clippy::too_many_arguments)]
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    start: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f32,
) -> Vec<f64> {
    let mut out = vec![0.0f64; n * hq * d];
    for i in 0..n {
        for h in 0..hq {
            let g = h / (hq / hkv);
            let qv = &q[(i * hq + h) * d..(i * hq + h + 1) * d];
            let scores: Vec<f64> = (0..=start + i)
                .map(|t| {
                    let kv = &k[(t * hkv + g) * d..(t * hkv + g + 1) * d];
                    qv.iter()
                        .zip(kv)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (t, w) in weights.iter().enumerate() {
                for c in 0..d {
                    out[(i * hq + h) * d + c] += w / total * v[(t * hkv + g) * d + c] as f64;
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_with_gqa_and_offset_start() {
    let mut rng = Rng::new(7);
    // (n, start, hq, hkv, d): decode, short verify block, GQA with several query blocks, MHA, MQA, and a
    // shape whose query heads split in pairs with 8 threads.
    let cases = [
        (1, 9, 4, 2, 16),
        (5, 7, 6, 2, 13),
        (70, 3, 6, 2, 13),
        (70, 0, 2, 2, 8),
        (3, 30, 8, 1, 32),
        (2, 5, 16, 4, 8),
    ];
    for (n, start, hq, hkv, d) in cases {
        let scale = 1.0 / (d as f32).sqrt();
        let q: Vec<f32> = rng.vec(n * hq * d).iter().map(|v| v * 3.0).collect();
        // Two extra cache rows past start + n hold NaN: reading them would poison the output.
        let rows = start + n;
        let mut k = rng.vec((rows + 2) * hkv * d);
        let mut v = rng.vec((rows + 2) * hkv * d);
        k[rows * hkv * d..].iter_mut().for_each(|x| *x = f32::NAN);
        v[rows * hkv * d..].iter_mut().for_each(|x| *x = f32::NAN);
        let expected = naive(&q, &k, &v, n, start, hq, hkv, d, scale);
        // 1 thread: one task per kv head; 8 threads: query heads split over tasks (decode-like shapes).
        for threads in [1, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![f32::NAN; n * hq * d];
            pool.install(|| attention(&q, &k, &v, n, start, hq, hkv, d, scale, &mut out));
            let what = format!("threads={threads} n={n} start={start} hq={hq} hkv={hkv} d={d}");
            assert_close(&out, &expected, 1e-5, &what);
        }
    }
}

#[test]
fn public_attention_is_causal_within_the_block() {
    // Changing the value at the last position must change only the last query row's output.
    let mut rng = Rng::new(8);
    let (n, start, hq, hkv, d) = (4, 2, 2, 1, 8);
    let q = rng.vec(n * hq * d);
    let k = rng.vec((start + n) * hkv * d);
    let mut v = rng.vec((start + n) * hkv * d);
    let mut before = vec![0.0f32; n * hq * d];
    attention(&q, &k, &v, n, start, hq, hkv, d, 0.3, &mut before);
    v[(start + n - 1) * hkv * d] += 10.0;
    let mut after = vec![0.0f32; n * hq * d];
    attention(&q, &k, &v, n, start, hq, hkv, d, 0.3, &mut after);
    let row = hq * d;
    assert_eq!(&before[..(n - 1) * row], &after[..(n - 1) * row]);
    assert_ne!(&before[(n - 1) * row..], &after[(n - 1) * row..]);
}
