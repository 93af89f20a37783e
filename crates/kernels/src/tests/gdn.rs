//! Gated DeltaNet: the step form against an f64 definition; the chunked form equal to both, across chunk
//! boundaries and across calls.

use super::{assert_close, isas, rel_err, widen, Rng};
use crate::gdn::gdn_recurrent_with_isa;
use crate::{gdn_chunked, gdn_recurrent, l2_normalize_rows, sigmoid, softplus};

/// Inputs shaped like the model's: q, k L2-normalised (q scaled by dk^-1/2), g = -A * softplus(a) <= 0,
/// beta = sigmoid(b), and a non-zero initial state.
struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

fn case(rng: &mut Rng, n: usize, h: usize, dk: usize, dv: usize) -> Case {
    let mut q = rng.vec(n * h * dk);
    let mut k = rng.vec(n * h * dk);
    l2_normalize_rows(&mut q, dk, 1e-6);
    l2_normalize_rows(&mut k, dk, 1e-6);
    q.iter_mut().for_each(|x| *x /= (dk as f32).sqrt());
    let v: Vec<f32> = rng.vec(n * h * dv).iter().map(|x| x * 2.0).collect();
    let g = (0..n * h)
        .map(|_| -0.8 * softplus(2.0 * rng.uniform()))
        .collect();
    let beta = (0..n * h).map(|_| sigmoid(3.0 * rng.uniform())).collect();
    let state = rng.vec(h * dk * dv);
    Case {
        q,
        k,
        v,
        g,
        beta,
        state,
    }
}

/// The step recurrence from its definition, in f64, on raw loops; returns (out, final state).
fn naive(c: &Case, n: usize, h: usize, dk: usize, dv: usize) -> (Vec<f64>, Vec<f64>) {
    let mut s = widen(&c.state);
    let mut out = vec![0.0f64; n * h * dv];
    for t in 0..n {
        for hh in 0..h {
            let row = t * h + hh;
            let st = &mut s[hh * dk * dv..(hh + 1) * dk * dv];
            let decay = (c.g[row] as f64).exp();
            st.iter_mut().for_each(|x| *x *= decay);
            for j in 0..dv {
                let kv: f64 = (0..dk)
                    .map(|i| st[i * dv + j] * c.k[row * dk + i] as f64)
                    .sum();
                let delta = c.beta[row] as f64 * (c.v[row * dv + j] as f64 - kv);
                for i in 0..dk {
                    st[i * dv + j] += c.k[row * dk + i] as f64 * delta;
                }
                out[row * dv + j] = (0..dk)
                    .map(|i| st[i * dv + j] * c.q[row * dk + i] as f64)
                    .sum();
            }
        }
    }
    (out, s)
}

#[test]
fn recurrent_matches_definition_on_both_isas() {
    let mut rng = Rng::new(11);
    let (h, dk, dv) = (3, 16, 12);
    for n in [1, 5, 40] {
        let c = case(&mut rng, n, h, dk, dv);
        let (out_ref, state_ref) = naive(&c, n, h, dk, dv);
        for isa in isas() {
            let mut state = c.state.clone();
            let mut out = vec![f32::NAN; n * h * dv];
            gdn_recurrent_with_isa(
                isa, &c.q, &c.k, &c.v, &c.g, &c.beta, &mut state, n, h, dk, dv, &mut out,
            );
            assert_close(&out, &out_ref, 1e-5, &format!("{isa:?} out n={n}"));
            assert_close(&state, &state_ref, 1e-5, &format!("{isa:?} state n={n}"));
        }
    }
}

#[test]
fn chunked_equals_recurrent_across_chunk_boundaries() {
    let mut rng = Rng::new(12);
    for (h, dk, dv) in [(2, 32, 24), (1, 64, 64)] {
        for n in [1, 63, 64, 65, 200] {
            let c = case(&mut rng, n, h, dk, dv);
            let mut state_rec = c.state.clone();
            let mut out_rec = vec![0.0f32; n * h * dv];
            gdn_recurrent(
                &c.q,
                &c.k,
                &c.v,
                &c.g,
                &c.beta,
                &mut state_rec,
                n,
                h,
                dk,
                dv,
                &mut out_rec,
            );
            let mut state_chunk = c.state.clone();
            let mut out_chunk = vec![f32::NAN; n * h * dv];
            gdn_chunked(
                &c.q,
                &c.k,
                &c.v,
                &c.g,
                &c.beta,
                &mut state_chunk,
                n,
                h,
                dk,
                dv,
                &mut out_chunk,
            );
            let what = format!("h={h} dk={dk} dv={dv} n={n}");
            assert_close(&out_chunk, &widen(&out_rec), 1e-5, &format!("out {what}"));
            assert_close(
                &state_chunk,
                &widen(&state_rec),
                1e-5,
                &format!("state {what}"),
            );
            // And both against the f64 definition, so the pair cannot agree on a shared mistake.
            let (out_ref, state_ref) = naive(&c, n, h, dk, dv);
            assert_close(
                &out_chunk,
                &out_ref,
                1e-5,
                &format!("out vs definition {what}"),
            );
            assert_close(
                &state_chunk,
                &state_ref,
                1e-5,
                &format!("state vs definition {what}"),
            );
        }
    }
}

#[test]
fn chunked_state_carries_across_calls() {
    let mut rng = Rng::new(13);
    let (n, h, dk, dv, split) = (200, 2, 32, 24, 90);
    let c = case(&mut rng, n, h, dk, dv);
    let (out_ref, state_ref) = naive(&c, n, h, dk, dv);
    let mut state = c.state.clone();
    let mut out = vec![0.0f32; n * h * dv];
    let (qs, ks, vs, gs) = (split * h * dk, split * h * dk, split * h * dv, split * h);
    gdn_chunked(
        &c.q[..qs],
        &c.k[..ks],
        &c.v[..vs],
        &c.g[..gs],
        &c.beta[..gs],
        &mut state,
        split,
        h,
        dk,
        dv,
        &mut out[..vs],
    );
    let rest = n - split;
    gdn_chunked(
        &c.q[qs..],
        &c.k[ks..],
        &c.v[vs..],
        &c.g[gs..],
        &c.beta[gs..],
        &mut state,
        rest,
        h,
        dk,
        dv,
        &mut out[vs..],
    );
    assert_close(&out, &out_ref, 1e-5, "out over two calls");
    assert_close(&state, &state_ref, 1e-5, "state over two calls");
}

#[test]
fn chunked_survives_strong_decay() {
    // g = -30 per step: exp of cumulative decays underflows to 0 and must not produce inf or NaN.
    let mut rng = Rng::new(14);
    let (n, h, dk, dv) = (130, 1, 8, 8);
    let mut c = case(&mut rng, n, h, dk, dv);
    c.g.iter_mut().for_each(|g| *g = -30.0);
    let (out_ref, state_ref) = naive(&c, n, h, dk, dv);
    let mut state = c.state.clone();
    let mut out = vec![0.0f32; n * h * dv];
    gdn_chunked(
        &c.q, &c.k, &c.v, &c.g, &c.beta, &mut state, n, h, dk, dv, &mut out,
    );
    assert_close(&out, &out_ref, 1e-5, "out");
    assert!(rel_err(&state, &state_ref) <= 1e-5);
}
