//! The MTP head against the fixture script's reference forward (vLLM's convention, see fixtures/README.md):
//! slot t reads the target's post-norm hidden h_t and the token x_{t+1}; its logits predict x_{t+2}.

use drafters::MtpHead;
use families::{Tap, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;
use std::sync::Arc;

fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn check(name: &str) {
    let dir = testdata::fixture(name);
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt: Vec<u32> = st
        .tensor("prompt_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let ck = Checkpoint::open(&dir).unwrap();
    let target = Arc::new(families::load(&ck).unwrap());
    let mut mtp = MtpHead::load(&ck, target.clone())
        .unwrap()
        .expect("fixture carries an MTP head");
    let mut state = target.new_state();
    let wanted = Wanted {
        logits: families::Rows::None,
        taps: vec![Tap::FinalHidden],
        argmax_only: false,
        candidates: 0,
    };
    let out = target.forward(&prompt, 0, &mut state, &wanted).unwrap();
    let h = &out.taps[0];
    let hd = target.hidden;
    let t = prompt.len() - 1;
    let want_logits = f32s(&st, "mtp_logits");
    let want_hidden = f32s(&st, "mtp_hidden");
    // Teacher-forced over the prompt, one slot at a time (exercises the head's own KV cache), comparing
    // every slot's logits and normed output.
    let v = target.vocab;
    for slot in 0..t {
        let (hidden, logits) = mtp
            .forward(
                &h[slot * hd..(slot + 1) * hd],
                &[prompt[slot + 1]],
                slot,
                true,
            )
            .unwrap();
        let dh = hidden
            .iter()
            .zip(&want_hidden[slot * hd..(slot + 1) * hd])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let dl = logits
            .iter()
            .zip(&want_logits[slot * v..(slot + 1) * v])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            dh <= 1e-3 && dl <= 1e-3,
            "{name} slot {slot}: |Δhidden| {dh}, |Δlogit| {dl}"
        );
    }
    // All slots in one pass give the same last-row logits.
    let (_, logits) = mtp.forward(&h[..t * hd], &prompt[1..], 0, true).unwrap();
    let dl = logits
        .iter()
        .zip(&want_logits[(t - 1) * v..])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(dl <= 1e-3, "{name} batched: |Δlogit| {dl}");
}

#[test]
fn qwen3_5_mtp_head_matches_reference() {
    check("qwen3_5");
}

/// The MTP layer stored in FP8 blocks (its `fc` unconverted), as Qwen's FP8 releases store it.
#[test]
fn qwen3_5_fp8_mtp_head_matches_reference() {
    check("qwen3_5_fp8");
}

#[test]
fn qwen3_next_mtp_head_matches_reference() {
    check("qwen3_next");
}

#[test]
fn checkpoint_without_head_loads_none() {
    let dir = testdata::fixture("qwen3");
    let ck = Checkpoint::open(&dir).unwrap();
    let target = Arc::new(families::load(&ck).unwrap());
    assert!(MtpHead::load(&ck, target).unwrap().is_none());
}
