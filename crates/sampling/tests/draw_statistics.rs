//! Drawing: the inverse CDF by hand, draw frequencies against probabilities (chi-square), greedy
//! argmax, and the counter-based uniforms.

mod common;

use common::{assert_distributed_as, chi_square};
use sampling::{greedy, uniform, DrawCounter, History, SamplingError, ShapedDistribution, Shaping};

#[test]
fn draw_is_inverse_cdf_in_index_order() {
    // probs [0.25, 0, 0.5, 0.25]: CDF steps at 0.25 (token 0), 0.75 (token 2), 1.0 (token 3);
    // token 1 has no interval and is never drawn.
    let d = ShapedDistribution::from_probs(&[0.25, 0.0, 0.5, 0.25]).unwrap();
    let cases = [
        (0.0, 0),
        (0.2499, 0),
        (0.25, 2),
        (0.7499, 2),
        (0.75, 3),
        (0.9999, 3),
        // Out of range: clamped to the support's ends.
        (-0.5, 0),
        (1.0, 3),
        (f64::NAN, 3),
    ];
    for (u, token) in cases {
        assert_eq!(d.draw(u), token, "draw({u})");
    }
}

#[test]
fn from_probs_normalises_and_rejects_garbage() {
    // [1, 3] -> [0.25, 0.75]
    let d = ShapedDistribution::from_probs(&[1.0, 3.0]).unwrap();
    assert_eq!((d.probability(0), d.probability(1)), (0.25, 0.75));
    assert_eq!(d.probability(2), 0.0, "outside the vocabulary");
    assert_eq!(d.support().collect::<Vec<_>>(), vec![(0, 0.25), (1, 0.75)]);
    assert_eq!(
        ShapedDistribution::from_probs(&[0.5, -0.1]).unwrap_err(),
        SamplingError::InvalidProbability {
            index: 1,
            value: -0.1
        }
    );
    assert!(matches!(
        ShapedDistribution::from_probs(&[f64::NAN]).unwrap_err(),
        SamplingError::InvalidProbability { index: 0, .. }
    ));
    assert!(matches!(
        ShapedDistribution::from_probs(&[0.0, 0.0]).unwrap_err(),
        SamplingError::NoMass { vocab: 2, .. }
    ));
    assert!(ShapedDistribution::from_probs(&[]).is_err());
}

#[test]
fn greedy_is_argmax_with_lowest_index_on_ties() {
    assert_eq!(greedy(&[0.1, 0.7, 0.3]).unwrap(), 1);
    assert_eq!(greedy(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
    assert_eq!(greedy(&[5.0, 5.0]).unwrap(), 0);
    assert_eq!(greedy(&[f32::NEG_INFINITY, -7.0, -9.0]).unwrap(), 1);
    assert_eq!(greedy(&[-0.0, 0.0]).unwrap(), 0, "-0 == 0 is a tie");
    assert_eq!(greedy(&[]).unwrap_err(), SamplingError::EmptyLogits);
    assert!(matches!(
        greedy(&[0.0, f32::NAN]).unwrap_err(),
        SamplingError::NonFiniteLogit { index: 1, .. }
    ));
    // The greedy distribution agrees with `greedy` and is a point mass for every u.
    let logits = [0.5, 2.0, -1.0, 2.0];
    let d = ShapedDistribution::new(&logits, &Shaping::greedy(), History::empty()).unwrap();
    assert_eq!(d.as_point_mass(), Some(greedy(&logits).unwrap()));
    assert_eq!(d.support().collect::<Vec<_>>(), vec![(1, 1.0)]);
    for u in [0.0, 0.3, 0.9999] {
        assert_eq!(d.draw(u), 1);
    }
}

#[test]
fn point_mass_constructor_checks_vocab() {
    let d = ShapedDistribution::point_mass(2, 3).unwrap();
    assert_eq!(
        (d.probability(2), d.probability(0), d.vocab_size()),
        (1.0, 0.0, 3)
    );
    assert_eq!(
        ShapedDistribution::point_mass(3, 3).unwrap_err(),
        SamplingError::TokenOutOfVocab {
            what: "point mass",
            token: 3,
            vocab: 3
        }
    );
}

/// Draws `n` tokens from `d` with a fixed seed and counts them per token id.
fn draw_counts(d: &ShapedDistribution, n: usize, seed: u64) -> Vec<u64> {
    let mut counts = vec![0u64; d.vocab_size()];
    let mut counter = DrawCounter::new(seed);
    for _ in 0..n {
        counts[d.draw(counter.next()) as usize] += 1;
    }
    counts
}

fn probs(d: &ShapedDistribution) -> Vec<f64> {
    (0..d.vocab_size() as u32)
        .map(|t| d.probability(t))
        .collect()
}

#[test]
fn draw_frequencies_match_probabilities() {
    // A shaped row with a top-k-filtered tail: filtered tokens must never be drawn.
    let logits = [1.0, 2.5, 0.3, -0.5, 2.0, 1.7, -3.0, 0.9];
    let shaping = Shaping {
        temperature: 0.8,
        top_k: 6,
        ..Shaping::default()
    };
    let d = ShapedDistribution::new(&logits, &shaping, History::empty()).unwrap();
    let p = probs(&d);
    assert_eq!(
        (p[3], p[6]),
        (0.0, 0.0),
        "top-6 of 8 filters tokens 3 and 6"
    );
    let counts = draw_counts(&d, 200_000, 0x5eed);
    assert_distributed_as(&counts, &p);
}

#[test]
fn frequencies_of_a_different_distribution_fail_the_test() {
    // The chi-square test has power: draws from d judged against a slightly different e fail.
    let d = ShapedDistribution::from_probs(&[0.3, 0.3, 0.4]).unwrap();
    let counts = draw_counts(&d, 200_000, 1);
    assert!(!chi_square(&counts, &[0.31, 0.29, 0.4]).consistent());
    assert!(chi_square(&counts, &[0.3, 0.3, 0.4]).consistent());
}

#[test]
fn uniforms_reproduce_and_counter_walks_steps() {
    let mut counter = DrawCounter::new(42);
    for step in 0..1000 {
        let u = counter.next();
        assert_eq!(u.to_bits(), uniform(42, step).to_bits());
        assert!((0.0..1.0).contains(&u));
        // A multiple of 2^-53: 53 bits of mantissa, no more.
        assert_eq!((u * (1u64 << 53) as f64).fract(), 0.0);
    }
    assert_eq!(
        counter,
        DrawCounter {
            seed: 42,
            step: 1000
        }
    );
    // Another seed is another stream.
    assert_ne!(uniform(42, 0), uniform(43, 0));
}

#[test]
fn a_million_steps_never_repeat_a_uniform() {
    let mut bits: Vec<u64> = (0..1_000_000).map(|s| uniform(7, s).to_bits()).collect();
    bits.sort_unstable();
    bits.dedup();
    assert_eq!(bits.len(), 1_000_000);
}

#[test]
fn neighbouring_seeds_do_not_share_values() {
    // Seeds s and s + 1 must not be shifted copies of one stream.
    let mut a: Vec<u64> = (0..10_000).map(|s| uniform(1, s).to_bits()).collect();
    let b: Vec<u64> = (0..10_000).map(|s| uniform(2, s).to_bits()).collect();
    a.sort_unstable();
    assert!(b.iter().all(|x| a.binary_search(x).is_err()));
}

#[test]
fn uniforms_are_uniform() {
    // 1M uniforms into 20 equal bins.
    let mut counts = vec![0u64; 20];
    for step in 0..1_000_000 {
        counts[(uniform(99, step) * 20.0) as usize] += 1;
    }
    assert_distributed_as(&counts, &[0.05; 20]);
}

/// Over a row of several summation blocks the draw is still the inverse CDF in id order: it agrees
/// with a straight cumulative scan wherever the target is not within rounding of a step, and never
/// returns a zero-probability id.
#[test]
fn draw_over_many_blocks_is_the_inverse_cdf() {
    let weights: Vec<f64> = (0..20_011u64)
        .map(|i| {
            if i % 11 == 0 {
                0.0
            } else {
                (i * 7919 % 13 + 1) as f64
            }
        })
        .collect();
    let d = ShapedDistribution::from_probs(&weights).unwrap();
    let p: Vec<f64> = (0..weights.len())
        .map(|i| d.probability(i as u32))
        .collect();
    let total: f64 = p.iter().sum();
    let mut checked = 0;
    for k in 0..2000 {
        let u = (k as f64 + 0.5) / 2000.0;
        let target = u * total;
        let (mut cumulative, mut want, mut margin) = (0.0, None, f64::INFINITY);
        for (i, &q) in p.iter().enumerate() {
            if q > 0.0 {
                let before = cumulative;
                cumulative += q;
                margin = margin
                    .min((target - before).abs())
                    .min((cumulative - target).abs());
                if want.is_none() && target < cumulative {
                    want = Some(i as u32);
                }
            }
        }
        let got = d.draw(u);
        assert!(p[got as usize] > 0.0, "draw({u}) = {got} has probability 0");
        if margin > 1e-9 {
            assert_eq!(Some(got), want, "draw({u})");
            checked += 1;
        }
    }
    assert!(checked > 1900, "{checked} draws away from a step");
}
