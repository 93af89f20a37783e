//! The DFlash drafter on the embedded testbed model (models/testbed/dflash) against the f32 reference the
//! testbed's export wrote with it (testbed/tb/reference.py): `dflash_block_logits` [block, vocab] is the
//! block [x_{T-1}, mask × (B-1)] at positions T-1..T-1+B over context = the taps of prompt rows 0..T-2
//! (T = prompt length, B = block size).
//! `TURBOSPARK_TESTBED` may point at another export directory with the same layout.

use drafters::{Chooser, DflashDrafter, Drafter};
use families::{Rows, Tap, Transformer, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;
use std::path::PathBuf;
use std::sync::Arc;

fn testbed_dir() -> PathBuf {
    std::env::var_os("TURBOSPARK_TESTBED").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed"),
        PathBuf::from,
    )
}

fn tensor_f32(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn tensor_ids(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Rows `from..to` of every tap buffer ([n, width] each).
fn rows(taps: &[Vec<f32>], width: usize, from: usize, to: usize) -> Vec<Vec<f32>> {
    taps.iter()
        .map(|t| t[from * width..to * width].to_vec())
        .collect()
}

struct Argmax;

impl Chooser for Argmax {
    fn choose(&mut self, logits: &[f32], _context: &[u32]) -> u32 {
        kernels::argmax(logits) as u32
    }
}

struct Setup {
    target: Arc<Transformer>,
    drafter: DflashDrafter,
    prompt: Vec<u32>,
    taps: Vec<Vec<f32>>,
    reference: Vec<f32>,
}

fn setup() -> Setup {
    let dir = testbed_dir();
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the testbed export is incomplete)",
            dir.join("reference.safetensors").display()
        )
    });
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let target = Arc::new(families::load(&ck).unwrap());
    let drafter = DflashDrafter::load(&dir.join("dflash"), target.clone()).unwrap();
    let prompt = tensor_ids(&st, "prompt_ids");
    let mut state = target.new_state();
    let wanted = Wanted {
        logits: Rows::None,
        taps: drafter.taps(),
        argmax_only: false,
        candidates: 0,
    };
    let taps = target
        .forward(&prompt, 0, &mut state, &wanted)
        .unwrap()
        .taps;
    Setup {
        reference: tensor_f32(&st, "dflash_block_logits"),
        target,
        drafter,
        prompt,
        taps,
    }
}

#[test]
fn dflash_block_logits_match_reference() {
    let Setup {
        target,
        mut drafter,
        prompt,
        taps,
        reference,
    } = setup();
    let (t, hd, v) = (prompt.len(), target.hidden, target.vocab);
    let b = drafter.block_size();
    assert_eq!(reference.len(), b * v);
    let ids = &drafter.config().target_layer_ids;
    assert_eq!(
        drafter.taps(),
        ids.iter().map(|&i| Tap::LayerOutput(i)).collect::<Vec<_>>()
    );

    // Context = rows 0..t-1 (everything before the anchor), observed in one call.
    drafter
        .observe(&rows(&taps, hd, 0, t - 1), t - 1, &prompt[1..t])
        .unwrap();
    assert_eq!(drafter.position(), t - 1);
    let logits = drafter.block_logits(prompt[t - 1]).unwrap();
    let d = max_diff(&logits, &reference);
    eprintln!("dflash block logits vs reference: max |Δ| = {d:e}");
    assert!(d <= 1e-3, "block logits: max |Δ| = {d}");

    // The same context observed in uneven chunks (prefill chunks, then single verified rows).
    drafter.reset();
    assert_eq!(drafter.position(), 0);
    for (from, to) in [(0, 30), (30, 31), (31, 70), (70, t - 1)] {
        drafter
            .observe(
                &rows(&taps, hd, from, to),
                to - from,
                &prompt[from + 1..=to],
            )
            .unwrap();
    }
    let chunked = drafter.block_logits(prompt[t - 1]).unwrap();
    let d = max_diff(&chunked, &reference);
    assert!(
        d <= 1e-3,
        "block logits after chunked observe: max |Δ| = {d}"
    );

    // Rewinding drops context rows: re-observing them restores the same logits.
    drafter.rewind(t - 9).unwrap();
    assert_eq!(drafter.position(), t - 9);
    let shorter = drafter.block_logits(prompt[t - 9]).unwrap();
    assert!(
        max_diff(&shorter, &reference) > 1e-2,
        "another anchor and context gives other logits"
    );
    drafter
        .observe(&rows(&taps, hd, t - 9, t - 1), 8, &prompt[t - 8..t])
        .unwrap();
    let again = drafter.block_logits(prompt[t - 1]).unwrap();
    assert!(max_diff(&again, &reference) <= 1e-3);
    assert!(drafter.rewind(t).is_err(), "cannot rewind forward");
}

#[test]
fn dflash_propose_takes_argmax_of_block_rows() {
    let Setup {
        target,
        mut drafter,
        prompt,
        taps,
        reference,
    } = setup();
    let (t, hd, v) = (prompt.len(), target.hidden, target.vocab);
    let b = drafter.block_size();
    let want: Vec<u32> = (1..b)
        .map(|i| kernels::argmax(&reference[i * v..(i + 1) * v]) as u32)
        .collect();

    // Before the context covers every row ahead of the anchor there is nothing to propose.
    assert!(drafter.propose(&prompt, 4, &mut Argmax).unwrap().is_empty());
    drafter
        .observe(&rows(&taps, hd, 0, t - 1), t - 1, &prompt[1..t])
        .unwrap();
    let all = drafter.propose(&prompt, 100, &mut Argmax).unwrap();
    assert_eq!(
        all, want,
        "k beyond the block gives block_size - 1 proposals"
    );
    // Proposing leaves no trace: a second call (fewer proposals) gives the same prefix.
    let three = drafter.propose(&prompt, 3, &mut Argmax).unwrap();
    assert_eq!(three, want[..3]);
    assert!(drafter.propose(&prompt, 0, &mut Argmax).unwrap().is_empty());
    assert_eq!(drafter.position(), t - 1);

    // The chooser sees the history plus the earlier proposals as its context.
    struct Recorder(Vec<Vec<u32>>);
    impl Chooser for Recorder {
        fn choose(&mut self, logits: &[f32], context: &[u32]) -> u32 {
            self.0.push(context.to_vec());
            kernels::argmax(logits) as u32
        }
    }
    let mut rec = Recorder(Vec::new());
    let got = drafter.propose(&prompt, 3, &mut rec).unwrap();
    for (i, ctx) in rec.0.iter().enumerate() {
        assert_eq!(ctx[..t], prompt[..]);
        assert_eq!(ctx[t..], got[..i]);
    }
}

#[test]
fn dflash_observe_rejects_wrong_taps() {
    let Setup {
        target,
        mut drafter,
        taps,
        ..
    } = setup();
    let hd = target.hidden;
    let err = drafter
        .observe(&rows(&taps, hd, 0, 3), 4, &[1, 2, 3, 4])
        .unwrap_err();
    assert!(err.to_string().contains("expected 4 rows"), "{err}");
    let err = drafter
        .observe(&rows(&taps[..1], hd, 0, 3), 3, &[1, 2, 3])
        .unwrap_err();
    assert!(err.to_string().contains("tap buffers"), "{err}");
    assert_eq!(drafter.position(), 0);
}

#[test]
fn dflash_load_checks_the_drafter_against_its_target() {
    let dir = testbed_dir();
    let ck = Checkpoint::open(&dir).unwrap();
    let target = Arc::new(families::load(&ck).unwrap());
    let text = std::fs::read_to_string(dir.join("dflash/config.json")).unwrap();
    let base: serde_json::Value = serde_json::from_str(&text).unwrap();
    let layers = target.layers.len();
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "hidden",
            serde_json::json!({"hidden_size": 2 * target.hidden}),
            "hidden_size",
        ),
        (
            "trained_on",
            serde_json::json!({"num_target_layers": layers + 4}),
            "num_target_layers",
        ),
        (
            "tap_range",
            serde_json::json!({"dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, layers]}}),
            "target_layer_ids",
        ),
        (
            "mask_range",
            serde_json::json!({"dflash_config": {"mask_token_id": target.vocab, "target_layer_ids": [0]}}),
            "mask_token_id",
        ),
        ("no_weights", serde_json::json!({}), "no weights"),
    ];
    for (name, patch, needle) in cases {
        let mut cfg = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let tmp = std::env::temp_dir().join(format!("dflash_load_{}_{name}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
        let err = DflashDrafter::load(&tmp, target.clone())
            .err()
            .expect(name)
            .to_string();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert!(
            err.contains(needle) && err.contains(&tmp.display().to_string()),
            "{name}: {err}"
        );
    }
}
