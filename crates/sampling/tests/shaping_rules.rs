//! Each shaping rule, and their order, against values computed by hand in the comments.

use sampling::{penalized_logits, History, SamplingError, ShapedDistribution, Shaping};

const TOL: f64 = 1e-6;

fn shaped(logits: &[f32], shaping: Shaping, history: History<'_>) -> Vec<f64> {
    let d = ShapedDistribution::new(logits, &shaping, history).unwrap();
    (0..logits.len() as u32).map(|t| d.probability(t)).collect()
}

fn assert_probs(actual: &[f64], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len());
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= TOL,
            "token {i}: probability {a}, expected {e} (all: {actual:?})"
        );
        if *e == 0.0 {
            assert_eq!(*a, 0.0, "token {i} must be filtered exactly");
        }
    }
}

/// Logits whose softmax is `probs` (ln p; -inf for 0).
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

#[test]
fn repetition_penalty_divides_positive_multiplies_negative_once_per_token() {
    // History [0, 1, 1] (prompt only), penalty 2:
    // token 0: 2.0 > 0 -> 2.0 / 2 = 1.0; token 1 (seen twice, penalised once): -1.0 * 2 = -2.0;
    // token 2: 0.0 -> 0.0 either way; token 3 unseen: 3.0.
    let logits = [2.0, -1.0, 0.0, 3.0];
    let shaping = Shaping {
        repetition_penalty: 2.0,
        ..Shaping::default()
    };
    let history = History::new(&[0, 1, 1, 2], 0).unwrap();
    let out = penalized_logits(&logits, &shaping, history).unwrap();
    assert_eq!(out, vec![1.0, -2.0, 0.0, 3.0]);
}

#[test]
fn repetition_penalty_reads_prompt_and_generated() {
    // tokens [0 | 1]: 0 from the prompt, 1 generated; penalty 4 hits both:
    // 8 / 4 = 2, 8 / 4 = 2, token 2 untouched 8.
    let logits = [8.0, 8.0, 8.0];
    let shaping = Shaping {
        repetition_penalty: 4.0,
        ..Shaping::default()
    };
    let history = History::new(&[0, 1], 1).unwrap();
    let out = penalized_logits(&logits, &shaping, history).unwrap();
    assert_eq!(out, vec![2.0, 2.0, 8.0]);
}

#[test]
fn presence_and_frequency_count_generated_tokens_only() {
    // tokens [3 | 0, 0, 1]: 3 is prompt, then 0 twice and 1 once generated.
    // frequency 0.5, presence 0.25:
    // token 0: 1 - 0.5 * 2 - 0.25 = -0.25; token 1: 1 - 0.5 - 0.25 = 0.25;
    // token 2: 1 (never seen); token 3: 1 (prompt only: not counted).
    let logits = [1.0, 1.0, 1.0, 1.0];
    let shaping = Shaping {
        presence_penalty: 0.25,
        frequency_penalty: 0.5,
        ..Shaping::default()
    };
    let history = History::new(&[3, 0, 0, 1], 3).unwrap();
    let out = penalized_logits(&logits, &shaping, history).unwrap();
    assert_eq!(out, vec![-0.25, 0.25, 1.0, 1.0]);
}

#[test]
fn negative_penalties_reward_repeats() {
    // presence -1 on generated token 1: 0 - (-1) = 1.
    let shaping = Shaping {
        presence_penalty: -1.0,
        ..Shaping::default()
    };
    let history = History::new(&[1], 1).unwrap();
    let out = penalized_logits(&[0.0, 0.0], &shaping, history).unwrap();
    assert_eq!(out, vec![0.0, 1.0]);
}

#[test]
fn temperature_scales_logits_before_softmax() {
    // logits [0, ln 2, ln 4] -> softmax [1, 2, 4] / 7.
    // T = 0.5 -> [0, 2 ln 2, 4 ln 2] -> [1, 4, 16] / 21.
    // T = 2   -> [0, ln 2 / 2, ln 2] -> [1, sqrt 2, 2] / (3 + sqrt 2).
    let logits = logits_of(&[1.0, 2.0, 4.0]);
    let at = |temperature| {
        let shaping = Shaping {
            temperature,
            ..Shaping::default()
        };
        shaped(&logits, shaping, History::empty())
    };
    assert_probs(&at(1.0), &[1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]);
    assert_probs(&at(0.5), &[1.0 / 21.0, 4.0 / 21.0, 16.0 / 21.0]);
    let s2 = 2f64.sqrt();
    let z = 3.0 + s2;
    assert_probs(&at(2.0), &[1.0 / z, s2 / z, 2.0 / z]);
}

#[test]
fn top_k_keeps_k_largest_and_boundary_ties() {
    let top_k = |logits: &[f32], k| {
        let shaping = Shaping {
            top_k: k,
            ..Shaping::default()
        };
        shaped(logits, shaping, History::empty())
    };
    // [1, 3, 2, 0], k = 2: keep 3 and 2 -> e^3 / (e^3 + e^2) = 1 / (1 + e^-1) = 0.731059.
    let e = std::f64::consts::E;
    let hi = 1.0 / (1.0 + 1.0 / e);
    assert_probs(&top_k(&[1.0, 3.0, 2.0, 0.0], 2), &[0.0, hi, 1.0 - hi, 0.0]);
    // [1, 3, 2, 2, 0], k = 2: the 2nd largest is 2 and both 2s tie with it, so three survive:
    // e^3 / (e^3 + 2 e^2) = 0.576117, e^2 / (e^3 + 2 e^2) = 0.211942 each.
    assert_probs(
        &top_k(&[1.0, 3.0, 2.0, 2.0, 0.0], 2),
        &[0.0, 0.576117, 0.211942, 0.211942, 0.0],
    );
    // k >= vocab is off.
    assert_probs(&top_k(&[0.0, 0.0], 5), &[0.5, 0.5]);
}

#[test]
fn top_p_keeps_smallest_nucleus_reaching_mass() {
    // probs [0.1, 0.2, 0.3, 0.4]; ascending cumulative 0.1, 0.3, 0.6, 1.0; a token goes when its
    // cumulative is <= 1 - top_p.
    let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
    let top_p = |p| {
        let shaping = Shaping {
            top_p: p,
            ..Shaping::default()
        };
        shaped(&logits, shaping, History::empty())
    };
    // top_p 0.65: budget 0.35 drops 0.1 (cum 0.1) and 0.2 (cum 0.3) -> [0.3, 0.4] / 0.7.
    assert_probs(&top_p(0.65), &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
    // top_p 0.75: budget 0.25 drops 0.1 only -> [0.2, 0.3, 0.4] / 0.9.
    assert_probs(&top_p(0.75), &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0]);
    // top_p 0.05: budget 0.95 would drop everything; the most likely token stays.
    assert_probs(&top_p(0.05), &[0.0, 0.0, 0.0, 1.0]);
    // top_p 1: off.
    assert_probs(&top_p(1.0), &[0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn min_p_drops_tokens_below_fraction_of_max() {
    let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
    let min_p = |m| {
        let shaping = Shaping {
            min_p: m,
            ..Shaping::default()
        };
        shaped(&logits, shaping, History::empty())
    };
    // min_p 0.3: threshold 0.12 drops 0.1 -> [0.2, 0.3, 0.4] / 0.9.
    assert_probs(&min_p(0.3), &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0]);
    // min_p 0.6: threshold 0.24 drops 0.1 and 0.2 -> [0.3, 0.4] / 0.7.
    assert_probs(&min_p(0.6), &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
    // min_p 1: only the max survives.
    assert_probs(&min_p(1.0), &[0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn greedy_is_point_mass_at_penalised_argmax() {
    // [2.0, 1.5], token 0 in history, penalty 2 -> [1.0, 1.5]: argmax moves to 1, as in
    // transformers' greedy search (the repetition penalty runs there too). top_k is ignored.
    let shaping = Shaping {
        temperature: 0.0,
        repetition_penalty: 2.0,
        top_k: 1,
        ..Shaping::default()
    };
    let history = History::new(&[0], 0).unwrap();
    let d = ShapedDistribution::new(&[2.0, 1.5], &shaping, history).unwrap();
    assert_eq!(d.as_point_mass(), Some(1));
    assert_eq!((d.probability(0), d.probability(1)), (0.0, 1.0));
    // Ties: lowest index.
    let d = ShapedDistribution::new(&[0.0, 5.0, 5.0], &Shaping::greedy(), History::empty());
    assert_eq!(d.unwrap().as_point_mass(), Some(1));
}

#[test]
fn combined_rules_apply_in_transformers_order() {
    // logits [3, 2, 1, 0.5, 0, -1]; tokens [5 | 0, 0] (5 prompt, 0 generated twice).
    // 1. repetition 2 on {5, 0}: token 0: 3 / 2 = 1.5; token 5: -1 * 2 = -2.
    // 2. frequency 0.25, presence 0.25 on token 0 (count 2): 1.5 - 0.5 - 0.25 = 0.75.
    //    -> [0.75, 2, 1, 0.5, 0, -2]
    // 4. temperature 0.5 -> [1.5, 4, 2, 1, 0, -4]
    // 5. top_k 4: 4th largest is 1 -> keep tokens 0..=3: softmax = e^[1.5, 4, 2, 1] / 69.19
    //    = [0.064776, 0.789137, 0.106798, 0.039289]
    // 6. top_p 0.9 (budget 0.1): ascending cum 0.0393 (token 3, dropped), 0.1041 (token 0, kept)
    //    -> e^[1.5, 4, 2] / 66.47 = [0.067425, 0.821409, 0.111166]
    // 7. min_p 0.1: threshold 0.0821 drops token 0 -> e^[4, 2] / (e^4 + e^2) = [0.880797, 0.119203]
    // (Temperature applied last instead would give top_p nothing to drop: token 3 alone has 0.119.)
    let logits = [3.0, 2.0, 1.0, 0.5, 0.0, -1.0];
    let shaping = Shaping {
        temperature: 0.5,
        top_k: 4,
        top_p: 0.9,
        min_p: 0.1,
        repetition_penalty: 2.0,
        presence_penalty: 0.25,
        frequency_penalty: 0.25,
    };
    let history = History::new(&[5, 0, 0], 2).unwrap();
    let out = shaped(&logits, shaping, history);
    assert_probs(&out, &[0.0, 0.880797, 0.119203, 0.0, 0.0, 0.0]);
}

#[test]
fn top_k_runs_before_top_p() {
    // probs [0.1, 0.2, 0.3, 0.4], top_k 3 -> [0.2, 0.3, 0.4] / 0.9 = [0.222, 0.333, 0.444];
    // then top_p 0.75 (budget 0.25) drops 0.222 -> [0.3, 0.4] / 0.7.
    // (top_p first would drop only 0.1 and leave three tokens.)
    let shaping = Shaping {
        top_k: 3,
        top_p: 0.75,
        ..Shaping::default()
    };
    let out = shaped(&logits_of(&[0.1, 0.2, 0.3, 0.4]), shaping, History::empty());
    assert_probs(&out, &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
}

#[test]
fn top_p_runs_before_min_p() {
    // probs [0.09, 0.09, 0.12, 0.7], top_p 0.8 (budget 0.2): cum 0.09, 0.18 dropped, 0.30 kept
    // -> [0.12, 0.7] / 0.82 = [0.146341, 0.853659]; min_p 0.15: threshold 0.128 keeps both.
    // (min_p first: threshold 0.105 drops both 0.09s, renormalised 0.146 <= 0.2 is then dropped
    // by top_p, leaving a point mass.)
    let shaping = Shaping {
        top_p: 0.8,
        min_p: 0.15,
        ..Shaping::default()
    };
    let out = shaped(
        &logits_of(&[0.09, 0.09, 0.12, 0.7]),
        shaping,
        History::empty(),
    );
    assert_probs(&out, &[0.0, 0.0, 0.12 / 0.82, 0.7 / 0.82]);
}

#[test]
fn tiny_temperature_stays_finite() {
    // l / 1e-300 overflows; shifted by the max first it is 0 for the max and -inf for the rest.
    let shaping = Shaping {
        temperature: 1e-300,
        ..Shaping::default()
    };
    let out = shaped(&[1.0, 2.0, 0.5], shaping, History::empty());
    assert_probs(&out, &[0.0, 1.0, 0.0]);
}

#[test]
fn masked_logits_get_zero_probability() {
    let out = shaped(
        &[f32::NEG_INFINITY, 0.0, 0.0],
        Shaping::default(),
        History::empty(),
    );
    assert_probs(&out, &[0.0, 0.5, 0.5]);
}

fn invalid_field(shaping: Shaping) -> &'static str {
    match shaping.validate() {
        Err(SamplingError::InvalidParameter { field, .. }) => {
            // The message names the field too.
            let message = shaping.validate().unwrap_err().to_string();
            assert!(message.contains(field), "{message}");
            field
        }
        other => panic!("expected InvalidParameter, got {other:?} for {shaping:?}"),
    }
}

#[test]
fn validation_names_the_field() {
    let d = Shaping::default();
    assert!(d.validate().is_ok());
    assert!(Shaping::greedy().validate().is_ok());
    let cases: Vec<(Shaping, &str)> = vec![
        (
            Shaping {
                temperature: -0.1,
                ..d
            },
            "temperature",
        ),
        (
            Shaping {
                temperature: f64::NAN,
                ..d
            },
            "temperature",
        ),
        (
            Shaping {
                temperature: f64::INFINITY,
                ..d
            },
            "temperature",
        ),
        (Shaping { top_p: 0.0, ..d }, "top_p"),
        (Shaping { top_p: 1.5, ..d }, "top_p"),
        (
            Shaping {
                top_p: f64::NAN,
                ..d
            },
            "top_p",
        ),
        (Shaping { min_p: -0.1, ..d }, "min_p"),
        (Shaping { min_p: 1.1, ..d }, "min_p"),
        (
            Shaping {
                min_p: f64::NAN,
                ..d
            },
            "min_p",
        ),
        (
            Shaping {
                repetition_penalty: 0.0,
                ..d
            },
            "repetition_penalty",
        ),
        (
            Shaping {
                repetition_penalty: -1.0,
                ..d
            },
            "repetition_penalty",
        ),
        (
            Shaping {
                repetition_penalty: f64::NAN,
                ..d
            },
            "repetition_penalty",
        ),
        (
            Shaping {
                presence_penalty: 2.5,
                ..d
            },
            "presence_penalty",
        ),
        (
            Shaping {
                presence_penalty: -2.5,
                ..d
            },
            "presence_penalty",
        ),
        (
            Shaping {
                presence_penalty: f64::NAN,
                ..d
            },
            "presence_penalty",
        ),
        (
            Shaping {
                frequency_penalty: 2.01,
                ..d
            },
            "frequency_penalty",
        ),
        (
            Shaping {
                frequency_penalty: f64::NAN,
                ..d
            },
            "frequency_penalty",
        ),
    ];
    for (shaping, field) in cases {
        assert_eq!(invalid_field(shaping), field);
    }
    // Range edges are valid.
    let edges = Shaping {
        temperature: 0.0,
        top_p: 1.0,
        min_p: 1.0,
        presence_penalty: -2.0,
        frequency_penalty: 2.0,
        ..d
    };
    assert!(edges.validate().is_ok());
    // The distribution refuses invalid shaping too.
    let bad = Shaping { top_p: 0.0, ..d };
    let err = ShapedDistribution::new(&[0.0], &bad, History::empty()).unwrap_err();
    assert!(matches!(
        err,
        SamplingError::InvalidParameter { field: "top_p", .. }
    ));
}

#[test]
fn bad_logits_and_history_are_errors() {
    let s = Shaping::default();
    let h = History::empty();
    let err = |logits: &[f32]| ShapedDistribution::new(logits, &s, h).unwrap_err();
    assert_eq!(err(&[]), SamplingError::EmptyLogits);
    assert!(matches!(
        err(&[0.0, f32::NAN]),
        SamplingError::NonFiniteLogit { index: 1, .. }
    ));
    assert!(matches!(
        err(&[f32::INFINITY]),
        SamplingError::NonFiniteLogit { index: 0, .. }
    ));
    assert_eq!(
        err(&[f32::NEG_INFINITY; 2]),
        SamplingError::AllMasked { vocab: 2 }
    );
    assert_eq!(
        History::new(&[1, 2], 3).unwrap_err(),
        SamplingError::GeneratedExceedsHistory {
            generated: 3,
            len: 2
        }
    );
    let penalised = Shaping {
        repetition_penalty: 1.2,
        ..s
    };
    let history = History::new(&[7], 0).unwrap();
    assert_eq!(
        ShapedDistribution::new(&[0.0, 1.0], &penalised, history).unwrap_err(),
        SamplingError::TokenOutOfVocab {
            what: "history",
            token: 7,
            vocab: 2
        }
    );
}

#[test]
fn serde_defaults_every_rule_to_off() {
    let s: Shaping = serde_json::from_str("{}").unwrap();
    assert_eq!(s, Shaping::default());
    let s: Shaping = serde_json::from_str(r#"{"temperature": 0.7, "top_k": 20}"#).unwrap();
    assert_eq!((s.temperature, s.top_k, s.top_p), (0.7, 20, 1.0));
    assert!(serde_json::from_str::<Shaping>(r#"{"temprature": 0.7}"#).is_err());
    let round: Shaping = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(round, s);
}
