use super::*;

/// A chooser the drafter must not need.
struct Unused;
impl Chooser for Unused {
    fn choose(&mut self, _logits: &[f32], _context: &[u32]) -> u32 {
        panic!("the suffix drafter called the chooser")
    }
}

fn propose(d: &mut SuffixDrafter, history: &[u32], k: usize) -> Vec<u32> {
    d.propose(history, k, &mut Unused).unwrap()
}

/// Counts of every string of up to DEPTH tokens over `segments`, as the trie should hold them.
fn reference_nodes(segments: &[&[u32]]) -> usize {
    let mut strings = std::collections::HashSet::new();
    for seg in segments {
        for s in 0..seg.len() {
            for e in s + 1..=(s + DEPTH).min(seg.len()) {
                strings.insert(seg[s..e].to_vec());
            }
        }
    }
    strings.len()
}

#[test]
fn a_repeated_phrase_is_proposed_as_far_as_its_match_supports() {
    let mut d = SuffixDrafter::new();
    // "10 11 12 13 14 15" then "10 11 12" again: three matched tokens allow six proposals.
    let h = [10, 11, 12, 13, 14, 15, 16, 17, 18, 99, 10, 11, 12];
    assert_eq!(propose(&mut d, &h, 16), vec![13, 14, 15, 16, 17, 18]);
    // Never more than k.
    assert_eq!(propose(&mut d, &h, 2), vec![13, 14]);
    assert!(propose(&mut d, &h, 0).is_empty());
    // A single matched token allows two.
    let h = [10, 11, 12, 13, 14, 15, 99, 10];
    assert_eq!(propose(&mut d, &h, 16), vec![11, 12]);
}

#[test]
fn no_earlier_occurrence_gives_an_empty_proposal() {
    let mut d = SuffixDrafter::new();
    assert!(propose(&mut d, &[1, 2, 3, 4, 5], 4).is_empty());
    assert!(propose(&mut d, &[7], 4).is_empty());
    assert!(propose(&mut d, &[], 4).is_empty());
}

#[test]
fn the_most_frequent_continuation_wins_and_a_split_one_is_cut_short() {
    let mut d = SuffixDrafter::new();
    // "5 6" was followed by "1 2 3" three times and by "9" once: propose "1 2 ...".
    let h = [
        5, 6, 1, 2, 3, 5, 6, 9, 5, 6, 1, 2, 3, 5, 6, 1, 2, 3, 0, 5, 6,
    ];
    let p = propose(&mut d, &h, 16);
    assert_eq!(&p[..2], &[1, 2], "{p:?}");
    // A continuation split twelve ways falls under the probability floor at once.
    let mut h = Vec::new();
    for t in 0..12 {
        h.extend([50, 51, 100 + t, 200 + t]);
    }
    h.extend([50, 51]);
    let mut d = SuffixDrafter::new();
    assert!(propose(&mut d, &h, 16).is_empty());
}

#[test]
fn earlier_sequences_are_remembered_across_a_reset_unless_forgotten() {
    let mut d = SuffixDrafter::new();
    let first = [1, 2, 3, 4, 5, 6, 7, 8];
    assert!(propose(&mut d, &first, 4).is_empty());
    d.reset();
    // A new sequence that begins like the first one: the archived one continues it.
    assert_eq!(propose(&mut d, &[9, 1, 2, 3], 4), vec![4, 5, 6, 7]);
    d.forget_earlier_requests();
    assert!(propose(&mut d, &[9, 1, 2, 3], 4).is_empty());
    // The live one, forgotten before its reset, is not archived either.
    d.reset();
    assert!(propose(&mut d, &[1, 2], 4).is_empty());
}

#[test]
fn a_rewind_keeps_the_prefix_live_and_archives_the_tail() {
    let mut d = SuffixDrafter::new();
    let h = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    propose(&mut d, &h, 4);
    d.observe(&[], 8, &h[1..]).unwrap();
    d.rewind(4).unwrap();
    assert_eq!(d.position(), 4);
    assert!(d.rewind(5).is_err(), "rewinding forwards");
    // The kept prefix plus the archived tail: "5 6" continues "7 8".
    assert_eq!(propose(&mut d, &[1, 2, 3, 4, 20, 5, 6], 2), vec![7, 8]);
    // The trie holds exactly the strings of the live sequence and the archived tail.
    let live = [1, 2, 3, 4, 20, 5, 6];
    let tail = [5, 6, 7, 8, 9];
    assert_eq!(d.nodes(), reference_nodes(&[&live, &tail]));
    assert_eq!(d.indexed_tokens(), live.len() + tail.len());
}

#[test]
fn observe_appends_the_committed_tokens_after_a_proposal() {
    let mut d = SuffixDrafter::new();
    let h = [1, 2, 3, 4];
    d.observe(&[], 3, &h[1..]).unwrap();
    propose(&mut d, &h, 2);
    // The round's committed tokens follow on without another propose.
    d.observe(&[], 3, &[7, 8, 9]).unwrap();
    assert_eq!(d.position(), 6);
    assert_eq!(d.indexed_tokens(), 7);
    assert!(d.observe(&[], 2, &[6]).is_err());
    d.reset();
    assert_eq!(propose(&mut d, &[0, 4, 7], 2), vec![8, 9]);
}

#[test]
fn a_changed_history_is_followed_without_stale_matches() {
    let mut d = SuffixDrafter::new();
    propose(&mut d, &[1, 2, 3, 4, 5], 2);
    // The same prefix, then something else: the old tail is archived, the new one indexed.
    let h = [1, 2, 3, 9, 9, 1, 2, 3];
    assert_eq!(propose(&mut d, &h, 2), vec![9, 9]);
    assert_eq!(d.nodes(), reference_nodes(&[&[4, 5], &h]));
}

#[test]
fn memory_never_exceeds_its_bound_however_long_the_input() {
    let bound = MIN_MEMORY_TOKENS;
    let mut d = SuffixDrafter::with_memory(bound).unwrap();
    let mut rng = 0x1234_5678u64;
    let mut next = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) as u32 % 5000
    };
    let mut most_bytes = 0;
    for request in 0..8 {
        let prompt: Vec<u32> = (0..3000 + request * 100).map(|_| next()).collect();
        let mut h = prompt.clone();
        propose(&mut d, &h, 8);
        for _ in 0..50 {
            h.push(next());
            propose(&mut d, &h, 8);
            assert!(d.indexed_tokens() <= bound);
            assert!(d.nodes() <= bound * DEPTH);
        }
        most_bytes = most_bytes.max(d.bytes());
        d.reset();
    }
    assert_eq!(d.indexed_tokens(), bound);
    assert!(
        most_bytes <= bound * (DEPTH * BYTES_PER_NODE_BOUND + 8),
        "{most_bytes} bytes for a bound of {bound} tokens"
    );
    // The live sequence alone past the bound: only its last `bound` tokens stay indexed, and what
    // they hold is what the reference counts.
    let long: Vec<u32> = (0..5000).map(|_| next()).collect();
    d.forget_earlier_requests();
    d.reset();
    propose(&mut d, &long, 4);
    assert_eq!(d.indexed_tokens(), bound);
    assert_eq!(d.nodes(), reference_nodes(&[&long[long.len() - bound..]]));
}

#[test]
fn eviction_keeps_the_counts_of_what_remains() {
    let mut d = SuffixDrafter::with_memory(MIN_MEMORY_TOKENS).unwrap();
    let a: Vec<u32> = (0..200).map(|i| i % 37).collect();
    let b: Vec<u32> = (0..150).map(|i| 1000 + i % 11).collect();
    propose(&mut d, &a, 2);
    d.reset();
    propose(&mut d, &b, 2);
    // 350 indexed past a bound of 256: the oldest 94 of `a` are gone.
    assert_eq!(d.indexed_tokens(), MIN_MEMORY_TOKENS);
    assert_eq!(d.nodes(), reference_nodes(&[&a[94..], &b]));
}

#[test]
fn bounds_out_of_range_are_errors_naming_the_option() {
    for bad in [0, MIN_MEMORY_TOKENS - 1, MAX_MEMORY_TOKENS + 1] {
        let e = SuffixDrafter::with_memory(bad).err().unwrap().to_string();
        assert!(e.contains(&format!("`memory_tokens` = {bad}")), "{e}");
    }
    assert_eq!(SuffixDrafter::new().memory_tokens(), DEFAULT_MEMORY_TOKENS);
}
