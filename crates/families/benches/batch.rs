//! What batching sequences buys the CPU engine: N sequences each decoding one row per step, as one
//! `forward_batch` against N `forward`s, alternated round by round so the machine's drift touches both
//! alike. Prints the median milliseconds a step and the aggregate tokens/s of each, and their ratio.
//! `cargo bench -p families --bench batch` (the embedded testbed; `RAYON_NUM_THREADS` sets the threads;
//! `TURBOSPARK_MODEL=DIR` another checkpoint).

use std::path::PathBuf;
use std::time::Instant;

use families::backend::SeqRows;
use families::{State, Transformer, Wanted};
use model_io::Checkpoint;

fn main() {
    let dir = std::env::var_os("TURBOSPARK_MODEL").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed"),
        PathBuf::from,
    );
    let m = families::load(&Checkpoint::open(&dir).expect("checkpoint")).expect("model");
    let v = m.vocab as u32;
    let prompt = 32;
    let rounds = 15;
    println!(
        "{}: one decode row per sequence a step, median of {rounds} alternated rounds",
        dir.display()
    );
    println!("sequences | batched ms/step | one by one ms/step | batched tok/s | one by one tok/s | ratio");
    for n in [1usize, 2, 4, 8, 16] {
        let fresh = |m: &Transformer| -> Vec<State> {
            (0..n)
                .map(|i| {
                    let mut st = m.new_state();
                    let ids: Vec<u32> = (0..prompt as u32)
                        .map(|t| (t * 37 + i as u32 * 101) % v)
                        .collect();
                    m.forward(&ids, 0, &mut st, &Wanted::none()).unwrap();
                    st
                })
                .collect()
        };
        let (mut a, mut b) = (fresh(&m), fresh(&m));
        let (mut batched, mut single) = (Vec::new(), Vec::new());
        let w = Wanted::last();
        for r in 0..rounds {
            let pos = prompt + r;
            let tokens: Vec<[u32; 1]> = (0..n)
                .map(|i| [(r as u32 * 13 + i as u32 * 7) % v])
                .collect();
            let t = Instant::now();
            let mut batch: Vec<SeqRows<'_, State>> = a
                .iter_mut()
                .zip(&tokens)
                .map(|(st, tok)| SeqRows {
                    tokens: tok,
                    start: pos,
                    state: st,
                    wanted: &w,
                })
                .collect();
            m.forward_batch(&mut batch).unwrap();
            batched.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            for (st, tok) in b.iter_mut().zip(&tokens) {
                m.forward(tok, pos, st, &w).unwrap();
            }
            single.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (bm, sm) = (median(&mut batched), median(&mut single));
        println!(
            "{n:>9} | {bm:>15.3} | {sm:>18.3} | {:>13.0} | {:>16.0} | {:.2}x",
            n as f64 / bm * 1e3,
            n as f64 / sm * 1e3,
            sm / bm
        );
    }
}
