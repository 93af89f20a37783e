//! Host cost of the suffix drafter per committed token (the trie update, eviction included once the
//! bound is reached) and per proposal (k = 16), on a synthetic stream that mixes fresh tokens with
//! copies of earlier stretches (as copy-heavy generations are). `cargo bench -p drafters --bench
//! suffix`; median of 5 rounds.

use std::time::Instant;

use drafters::suffix::{SuffixDrafter, DEFAULT_MEMORY_TOKENS};
use drafters::{Chooser, Drafter};

struct Unused;
impl Chooser for Unused {
    fn choose(&mut self, _logits: &[f32], _context: &[u32]) -> u32 {
        unreachable!("the suffix drafter drafts without logits")
    }
}

/// `len` tokens: runs of fresh ids (a 30000-token vocabulary) alternating with copies of earlier runs.
fn stream(len: usize) -> Vec<u32> {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        rng >> 33
    };
    let mut out: Vec<u32> = Vec::with_capacity(len);
    while out.len() < len {
        let run = 8 + (next() % 40) as usize;
        if out.len() > 200 && next() % 2 == 0 {
            let from = (next() as usize) % (out.len() - run);
            out.extend_from_within(from..from + run);
        } else {
            out.extend((0..run).map(|_| (next() % 30_000) as u32));
        }
    }
    out.truncate(len);
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // Past the default bound, so eviction runs on every token in the second half.
    let tokens = stream(2 * DEFAULT_MEMORY_TOKENS);
    let mut update = Vec::new();
    let mut evicting = Vec::new();
    let mut propose = Vec::new();
    for _ in 0..5 {
        // Update: the loop's observe after a proposal, one committed token at a time.
        let mut d = SuffixDrafter::new();
        d.propose(&tokens[..2], 1, &mut Unused).unwrap();
        d.observe(&[], 1, &[]).ok();
        let half = DEFAULT_MEMORY_TOKENS;
        let start = Instant::now();
        for &t in &tokens[2..half] {
            d.observe(&[], 1, &[t]).unwrap();
        }
        update.push(start.elapsed().as_secs_f64() / (half - 2) as f64);
        // Past the bound: every token also evicts the oldest.
        let start = Instant::now();
        for &t in &tokens[half..] {
            d.observe(&[], 1, &[t]).unwrap();
        }
        evicting.push(start.elapsed().as_secs_f64() / (tokens.len() - half) as f64);
        assert_eq!(d.indexed_tokens(), DEFAULT_MEMORY_TOKENS);
        // Proposals over the filled structure, at 2000 points of the stream: the first call at a
        // point appends the tokens since the last (the update, untimed), the second only proposes.
        let mut d = SuffixDrafter::new();
        let points: Vec<usize> = (1..=2000).map(|i| tokens.len() / 2 + i * 16).collect();
        let mut elapsed = 0.0;
        let mut proposed = 0;
        for &p in &points {
            d.propose(&tokens[..p], 16, &mut Unused).unwrap();
            let start = Instant::now();
            proposed += d.propose(&tokens[..p], 16, &mut Unused).unwrap().len();
            elapsed += start.elapsed().as_secs_f64();
        }
        propose.push(elapsed / points.len() as f64);
        std::hint::black_box(proposed);
    }
    println!(
        "suffix drafter, bound {DEFAULT_MEMORY_TOKENS} tokens: update {:.2} us/token ({:.2} when evicting), \
         propose (k = 16) {:.2} us/call",
        median(update) * 1e6,
        median(evicting) * 1e6,
        median(propose) * 1e6
    );
}
