//! A GGUF model whose weight matrices are stored quantized runs on the quantized kernels, with the
//! converter's value-head reordering undone on whole block rows and on the inputs.
//!
//! The quantized files are written here from the committed fixture `gguf/qwen3_5.gguf` (made by
//! llama.cpp's converter, f32, value heads tiled): every 2-D weight whose rows divide into the
//! format's blocks is quantized with `kernels::quantize_row` (the bytes llama.cpp's reference quantizer
//! writes: kernels' tests), the rest copied. References: the f32 file's logits (quantization error
//! bounded), and the model's own one-row steps (verify blocks give their bits: speculation stays exact).

use std::path::Path;

use families::layers::{Linear, Tensors, Weights};
use families::{Transformer, Wanted};
use kernels::QuantFormat;
use model_io::gguf::writer::rewrite;
use model_io::gguf::GgmlType;
use model_io::Checkpoint;

/// Writes `src` (an f32 GGUF) to `dst` with its 2-D F32 tensors quantized to `format` where their rows
/// divide into its blocks; returns how many were quantized.
fn quantized_copy(src: &Path, dst: &Path, format: QuantFormat) -> usize {
    let ggml = GgmlType::from_id(match format {
        QuantFormat::Q4_0 => 2,
        QuantFormat::Q4_1 => 3,
        QuantFormat::Q5_0 => 6,
        QuantFormat::Q5_1 => 7,
        QuantFormat::Q8_0 => 8,
        QuantFormat::Q4K => 12,
        QuantFormat::Q5K => 13,
        QuantFormat::Q6K => 14,
    })
    .unwrap();
    rewrite(src, dst, |t, bytes| {
        let cols = t.extents[0];
        if t.ggml_type != GgmlType::F32 || t.extents.len() != 2 || cols % format.block_len() != 0 {
            return None;
        }
        let x: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut q = vec![0u8; x.len() / cols * format.row_bytes(cols)];
        for (row, out) in x
            .chunks_exact(cols)
            .zip(q.chunks_exact_mut(format.row_bytes(cols)))
        {
            kernels::quantize_row(format, row, out);
        }
        Some((ggml, q))
    })
    .unwrap()
}

/// Logits of every row of `tokens` from an empty state: [n, vocab].
fn logits(model: &Transformer, tokens: &[u32]) -> Vec<f32> {
    let mut state = model.new_state();
    let out = model
        .forward(tokens, 0, &mut state, &Wanted::all())
        .unwrap();
    (0..tokens.len())
        .flat_map(|i| out.row(i).to_vec())
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every weight matrix of the quantized file runs on its blocks and computes the product of its
/// dequantized matrix in Hugging Face order (`load_f32`, the path checked against the gguf package and
/// transformers) with the input, within what the 8-bit inputs allow: |error| <= Σ_c |w_rc| · max|x| / 254
/// per output (a wrong row or input order would be off by the outputs' own size); and a model of those
/// layers gives verify rows the bits of one-row steps (speculation stays exact).
#[test]
fn quantized_gguf_runs_on_its_blocks() {
    let src = testdata::fixture("gguf/qwen3_5.gguf");
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 512).collect();
    let dir = tempfile::tempdir().unwrap();
    for format in [QuantFormat::Q8_0, QuantFormat::Q5_1, QuantFormat::Q4_0] {
        let path = dir.path().join(format!("{}.gguf", format.name()));
        let n = quantized_copy(&src, &path, format);
        assert!(n > 10, "{}: {n} tensors quantized", format.name());
        let mut ck = Checkpoint::open(&path).unwrap();
        let store = &ck.tensors;
        let t = Tensors::new(store, "");
        let (mut matrices, mut reordered) = (0, 0);
        let names: Vec<String> = store.names().map(str::to_string).collect();
        for name in names {
            let shape = store.shape(&name).unwrap().to_vec();
            let [rows, cols] = shape[..] else { continue };
            if store.quantized(&name, [rows, cols]).unwrap().is_none() {
                continue;
            }
            let linear = Linear::load(&t, &name, rows, cols).unwrap();
            let Weights::Quant { input_order, .. } = &linear.w else {
                panic!("{name}: not kept in its blocks");
            };
            matrices += 1;
            reordered += usize::from(input_order.is_some());
            let w = store.load_f32(&name, &shape).unwrap();
            let x: Vec<f32> = (0..2 * cols)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 5) as f32))
                .collect();
            let y = linear.forward(&x, 2);
            for i in 0..2 {
                let xi = &x[i * cols..(i + 1) * cols];
                let amax = xi.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                for r in 0..rows {
                    let wr = &w[r * cols..(r + 1) * cols];
                    let exact: f64 = wr.iter().zip(xi).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let bound: f64 =
                        wr.iter().map(|a| (*a as f64).abs()).sum::<f64>() * amax / 254.0;
                    let got = y[i * rows + r] as f64;
                    assert!(
                        (got - exact).abs() <= bound * 1.01 + 1e-5,
                        "{} {name} row {r}: {got} vs {exact} (bound {bound})",
                        format.name()
                    );
                }
            }
        }
        // Every weight matrix but the one-row gates; the GDN output projections' inputs reordered.
        assert!(
            matrices >= n - 2 && reordered >= 1,
            "{matrices} matrices, {reordered} reordered"
        );
        assert!(
            ck.tensors
                .set_quantize(Some(model_io::Quantize::Q8_0))
                .is_err(),
            "--quantize on a quantized file is refused"
        );
        let model = families::load(&ck).unwrap();
        assert!(logits(&model, &tokens).iter().all(|v| v.is_finite()));
        // A verify block of 6 rows gives each row the bits of its one-row step.
        let mut state = model.new_state();
        model
            .forward(&tokens[..10], 0, &mut state, &Wanted::none())
            .unwrap();
        let mut one = state.clone();
        let block = model
            .forward(&tokens[10..16], 10, &mut state, &Wanted::all())
            .unwrap();
        for (i, &t) in tokens[10..16].iter().enumerate() {
            let row = model
                .forward(&[t], 10 + i, &mut one, &Wanted::last())
                .unwrap();
            assert_eq!(
                bits(&row.logits),
                bits(block.row(i)),
                "{}: row {i} of the block",
                format.name()
            );
        }
    }
}
