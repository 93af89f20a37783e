//! Host cost of shaping one logits row of Qwen's vocabulary (151936) into a distribution and drawing
//! from it, per sampling setting: what every sampled token pays on top of the forward (the GPU's decode
//! step is ~3 ms on the 4B shape). `cargo bench -p sampling --bench shaping`; median of 5 rounds of 20.

use std::time::Instant;

use sampling::{History, ShapedDistribution, Shaping};

fn main() {
    let vocab = 151_936usize;
    // A peaked row (one clear favourite over a spread of plausible tokens), deterministic.
    let logits: Vec<f32> = (0..vocab)
        .map(|i| {
            ((i * 7919) % 10_007) as f32 / 10_007.0 * 12.0 - 4.0 + if i == 77 { 9.0 } else { 0.0 }
        })
        .collect();
    let history: Vec<u32> = (0..600).map(|i| (i * 31 % vocab) as u32).collect();
    let sampled = |temperature| Shaping {
        temperature,
        ..Shaping::default()
    };
    let cases = [
        ("greedy", sampled(0.0)),
        ("temperature 0.7", sampled(0.7)),
        (
            "temperature 0.7, top-p 0.9",
            Shaping {
                top_p: 0.9,
                ..sampled(0.7)
            },
        ),
        (
            "temperature 0.7, top-k 50, top-p 0.9",
            Shaping {
                top_k: 50,
                top_p: 0.9,
                ..sampled(0.7)
            },
        ),
        (
            "Qwen3's card: 0.6, top-k 20, top-p 0.95",
            Shaping {
                top_k: 20,
                top_p: 0.95,
                ..sampled(0.6)
            },
        ),
        (
            "temperature 0.8, min-p 0.05",
            Shaping {
                min_p: 0.05,
                ..sampled(0.8)
            },
        ),
        (
            "temperature 0.7, repetition 1.1",
            Shaping {
                repetition_penalty: 1.1,
                ..sampled(0.7)
            },
        ),
    ];
    // A Zipf-like row, as language models' rows are: the logit falls with the log of a token's rank.
    let zipf: Vec<f32> = (0..vocab)
        .map(|i| 8.0 - 1.5 * (1.0 + ((i * 7919) % vocab) as f32).ln())
        .collect();
    println!("shaping + draw of one {vocab}-logit row, median of 5 rounds of 20:");
    let zipf_cases = [
        (
            "Zipf row: temperature 0.7, top-p 0.9",
            Shaping {
                top_p: 0.9,
                ..sampled(0.7)
            },
        ),
        ("Zipf row: temperature 0.7", sampled(0.7)),
    ];
    let rows = cases
        .iter()
        .map(|c| (c, &logits))
        .chain(zipf_cases.iter().map(|c| (c, &zipf)));
    for ((name, shaping), logits) in rows {
        let mut rounds: Vec<f64> = (0..6)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..20 {
                    let h = History::new(&history, 100).expect("history");
                    let d = ShapedDistribution::new(logits, shaping, h).expect("shaping");
                    std::hint::black_box(d.draw(0.37));
                }
                t.elapsed().as_secs_f64() * 1e3 / 20.0
            })
            .skip(1) // warm-up round
            .collect();
        rounds.sort_by(f64::total_cmp);
        println!("  {name:42} {:8.3} ms", rounds[2]);
    }
}
