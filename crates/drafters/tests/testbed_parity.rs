//! The embedded testbed model (models/testbed, trained by testbed/) against transformers' float32 reference
//! committed with it: target logits of the last prompt rows, the 32-token greedy continuation, and the MTP
//! head's teacher-forced logits.

use drafters::MtpHead;
use families::{Rows, Tap, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;
use std::path::PathBuf;
use std::sync::Arc;

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
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn testbed_target_and_mtp_match_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = tensor_ids(&st, "prompt_ids");
    let ck = Checkpoint::open(&dir).unwrap();
    let model = Arc::new(families::load(&ck).unwrap());
    let v = model.vocab;
    let t = prompt.len();

    let mut state = model.new_state();
    let out = model
        .forward(
            &prompt,
            0,
            &mut state,
            &Wanted {
                logits: Rows::From(t - 4),
                taps: vec![Tap::FinalHidden],
                argmax_only: false,
                candidates: 0,
            },
        )
        .unwrap();
    let d = max_diff(&out.logits, &tensor_f32(&st, "target_logits_last"));
    assert!(d <= 1e-3, "target logits of the last 4 rows: max |Δ| = {d}");

    let mut next = kernels::argmax(out.row(out.rows - 1)) as u32;
    let mut greedy = vec![next];
    for _ in 1..32 {
        let o = model
            .forward(&[next], state.position(), &mut state, &Wanted::last())
            .unwrap();
        next = kernels::argmax(o.row(0)) as u32;
        greedy.push(next);
    }
    assert_eq!(greedy, tensor_ids(&st, "greedy_ids"));

    let hd = model.hidden;
    let h = &out.taps[0];
    let mut mtp = MtpHead::load(&ck, model.clone())
        .unwrap()
        .expect("testbed ships an MTP head");
    let mut rows = Vec::new();
    for slot in 0..t - 1 {
        let (_, logits) = mtp
            .forward(
                &h[slot * hd..(slot + 1) * hd],
                &[prompt[slot + 1]],
                slot,
                true,
            )
            .unwrap();
        if slot >= t - 5 {
            rows.extend(logits);
        }
    }
    let d = max_diff(&rows, &tensor_f32(&st, "mtp_logits_last"));
    assert!(
        d <= 1e-3,
        "MTP logits of rows {}..{}: max |Δ| = {d} (vocab {v})",
        t - 5,
        t - 2
    );
}
