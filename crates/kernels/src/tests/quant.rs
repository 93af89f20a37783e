//! Quantized linear layers: dequantization against the `gguf` package's reference values (the committed
//! fixture `gguf/blocks.gguf`), the integer kernel against an f64 dot product over the dequantized weights
//! within the bound the 8-bit inputs allow, and bit equality across instruction sets, row counts and
//! output prefixes (batch invariance); prefills on AMX tiles against the f64 dot of bf16-rounded operands.

use super::Rng;
use crate::quant::{
    dequantize_row, linear_quant, linear_quant_path, linear_quant_portable, linear_quant_rows,
    quant_simd_paths,
};
use crate::{QuantFormat, QuantMatrix};

/// `rows` random rows of `k` elements in `format`: random bytes, with every f16 scale field set to a
/// finite value of a realistic size (scales ~1e-2, minimums ~1e-3: a Q4_K block of weights ~0.1).
fn random_matrix(format: QuantFormat, rows: usize, k: usize, seed: u64) -> QuantMatrix {
    let mut rng = Rng::new(seed);
    let mut data: Vec<u8> = (0..rows * format.row_bytes(k))
        .map(|_| rng.next_u64() as u8)
        .collect();
    let f16_fields: &[(usize, f32)] = match format {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[(0, 0.02)],
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => &[(0, 0.02), (2, 0.1)],
        QuantFormat::Q4K | QuantFormat::Q5K => &[(0, 0.003), (2, 0.002)],
        QuantFormat::Q6K => &[(208, 0.001)],
    };
    for block in data.chunks_exact_mut(format.block_bytes()) {
        for &(at, size) in f16_fields {
            let v = half::f16::from_f32(size * rng.uniform());
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    QuantMatrix::new(format, data, rows, k).unwrap()
}

fn dequantized(w: &QuantMatrix) -> Vec<f32> {
    let k = w.cols();
    let mut out = vec![0f32; w.rows() * k];
    for (r, row) in out.chunks_exact_mut(k).enumerate() {
        w.dequantize_row(r, row);
    }
    out
}

#[test]
fn dequantization_matches_the_gguf_package_bit_for_bit() {
    let set = model_io::gguf::GgufSet::open(&testdata::fixture("gguf/blocks.gguf")).unwrap();
    for format in QuantFormat::ALL {
        let name = format!("q.{}", format.name());
        let (file, info) = set.tensor(&name).unwrap();
        let bytes = file.bytes(info).unwrap();
        let k = info.shape().last().copied().unwrap();
        let reference = set.load_f32(&format!("ref.{}", format.name())).unwrap();
        let mut ours = vec![0f32; reference.len()];
        let rb = format.row_bytes(k);
        for (row, out) in bytes.chunks_exact(rb).zip(ours.chunks_exact_mut(k)) {
            dequantize_row(format, row, k, out);
        }
        let differ = ours
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{}: {differ} values differ", format.name());
    }
}

/// Each output within the error the 8-bit inputs allow: per element |x - d·q| <= d/2 (d = the input
/// block's max|x| / 127), so |y - y_exact| <= Σ |w| · d/2, plus f32 rounding (2^-20 relative to Σ|w·x|).
#[test]
fn the_integer_kernel_is_the_dot_product_within_the_input_quantization_bound() {
    let (m, k, n) = (37, 512, 3);
    for format in QuantFormat::ALL {
        let w = random_matrix(format, m, k, 7);
        let wf = dequantized(&w);
        let x = Rng::new(11).vec(n * k);
        let mut out = vec![0f32; n * m];
        linear_quant_portable(&x, &w, n, &mut out);
        for i in 0..n {
            let xi = &x[i * k..(i + 1) * k];
            for r in 0..m {
                let wr = &wf[r * k..(r + 1) * k];
                let exact: f64 = wr.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mut bound = 0f64;
                let mut magnitude = 0f64;
                for (wb, xb) in wr.chunks(32).zip(xi.chunks(32)) {
                    let d = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                    for (&a, &b) in wb.iter().zip(xb) {
                        bound += (a as f64).abs() * d / 2.0;
                        magnitude += (a as f64 * b as f64).abs();
                    }
                }
                let got = out[i * m + r] as f64;
                let tol = bound * 1.0001 + magnitude * 1e-6 + 1e-12;
                assert!(
                    (got - exact).abs() <= tol,
                    "{} row {r} input {i}: {got} vs {exact} (bound {tol})",
                    format.name()
                );
            }
        }
    }
}

#[test]
fn every_path_row_count_and_prefix_gives_the_same_bits() {
    // k = 352: eleven 32-blocks, so the last 64-element step is half empty and the last 256-element chunk
    // partial; 1056: four whole chunks and a single block; k-quants: two and three super-blocks.
    let shapes = QuantFormat::ALL.into_iter().flat_map(|f| {
        let ks = if f.block_len() == 32 {
            [352, 1056]
        } else {
            [512, 768]
        };
        ks.map(|k| (f, k))
    });
    for (format, k) in shapes {
        let m = 45;
        let w = random_matrix(format, m, k, 3);
        let n = crate::MATVEC_MAX_ROWS; // more than one input group of 8: a whole verify block
        let x = Rng::new(5).vec(n * k);
        let mut all = vec![0f32; n * m];
        linear_quant(&x, &w, n, &mut all);
        let mut portable = vec![0f32; n * m];
        linear_quant_portable(&x, &w, n, &mut portable);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&all), bits(&portable), "{}: paths", format.name());
        for path in quant_simd_paths() {
            // Every path, for one input (the decode tiles) and for all of them.
            for rows in [1, n] {
                let mut one = vec![0f32; rows * m];
                linear_quant_path(path, &x[..rows * k], &w, rows, m, &mut one);
                assert_eq!(
                    bits(&one),
                    bits(&portable[..rows * m]),
                    "{} k={k}: the {path} path, {rows} inputs",
                    format.name()
                );
            }
        }
        for i in 0..n {
            let mut one = vec![0f32; m];
            linear_quant(&x[i * k..(i + 1) * k], &w, 1, &mut one);
            assert_eq!(
                bits(&one),
                bits(&all[i * m..(i + 1) * m]),
                "{}: row {i} alone",
                format.name()
            );
        }
        let rows = 17;
        let mut prefix = vec![0f32; 2 * rows];
        linear_quant_rows(&x[..2 * k], &w, 2, rows, &mut prefix);
        for i in 0..2 {
            assert_eq!(
                bits(&prefix[i * rows..(i + 1) * rows]),
                bits(&all[i * m..i * m + rows]),
                "{}: first {rows} rows",
                format.name()
            );
        }
    }
}

#[test]
fn threads_do_not_change_the_bits() {
    let (m, k, n) = (300, 1024, 2);
    let w = random_matrix(QuantFormat::Q4K, m, k, 9);
    let x = Rng::new(1).vec(n * k);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut out = vec![0f32; n * m];
        pool.install(|| linear_quant(&x, &w, n, &mut out));
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn shapes_that_do_not_fit_the_blocks_are_errors() {
    let err = QuantMatrix::new(QuantFormat::Q4K, vec![0; 144], 1, 384).unwrap_err();
    assert!(err.contains("Q4_K") && err.contains("384"), "{err}");
    let err = QuantMatrix::new(QuantFormat::Q8_0, vec![0; 33], 1, 32).unwrap_err();
    assert!(err.contains("34") && err.contains("33"), "{err}");
}

/// Prefill rows (more than a verify block) on AMX tiles: every output is the f32 sum of the products of
/// bf16-rounded weights and inputs (each product exact), so it lies within f32 accumulation error of that
/// sum in f64 — far inside the 8-bit decode kernel's error, which would fail here; prefixes and thread
/// counts keep the bits, and the first verify block's rows keep the decode kernel's. (Without AMX: the
/// decode kernel's bits for any row count.)
#[test]
fn prefill_rows_run_on_tiles_over_bf16_operands() {
    if !crate::amx::available() {
        // Without AMX every row count runs the decode kernel, each row with the bits it gets alone.
        let (m, k, n) = (45, 512, 40);
        let w = random_matrix(QuantFormat::Q4K, m, k, 13);
        assert_eq!(w.batch_invariant_rows(), usize::MAX);
        let x = Rng::new(17).vec(n * k);
        let (mut all, mut portable) = (vec![0f32; n * m], vec![0f32; n * m]);
        linear_quant(&x, &w, n, &mut all);
        linear_quant_portable(&x, &w, n, &mut portable);
        assert!(all
            .iter()
            .zip(&portable)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        return;
    }
    let bf = |v: f32| half::bf16::from_f32(v).to_f64();
    for format in QuantFormat::ALL {
        let k = if format.block_len() == 32 { 352 } else { 512 };
        let (m, n) = (130, 40); // three groups of output rows (the last of 2), three passes of inputs
        let w = random_matrix(format, m, k, 13);
        assert_eq!(w.batch_invariant_rows(), crate::MATVEC_MAX_ROWS);
        let wf = dequantized(&w);
        let x = Rng::new(17).vec(n * k);
        let mut out = vec![0f32; n * m];
        linear_quant(&x, &w, n, &mut out);
        for i in 0..n {
            for r in 0..m {
                let (xi, wr) = (&x[i * k..(i + 1) * k], &wf[r * k..(r + 1) * k]);
                let exact: f64 = wr.iter().zip(xi).map(|(&a, &b)| bf(a) * bf(b)).sum();
                let magnitude: f64 = wr
                    .iter()
                    .zip(xi)
                    .map(|(&a, &b)| (bf(a) * bf(b)).abs())
                    .sum();
                let got = out[i * m + r] as f64;
                assert!(
                    (got - exact).abs() <= magnitude * 1e-5 + 1e-12,
                    "{} row {r} input {i}: {got} vs {exact}",
                    format.name()
                );
            }
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        super::assert_prefix_and_threads_keep_bits(
            &out,
            n,
            m,
            70,
            |dst| linear_quant(&x, &w, n, dst),
            |rows, dst| linear_quant_rows(&x, &w, n, rows, dst),
            format.name(),
        );
        let verify = crate::MATVEC_MAX_ROWS;
        let mut decode = vec![0f32; verify * m];
        linear_quant_portable(&x[..verify * k], &w, verify, &mut decode);
        let mut block = vec![0f32; verify * m];
        linear_quant(&x[..verify * k], &w, verify, &mut block);
        assert_eq!(
            bits(&block),
            bits(&decode),
            "{}: a verify block",
            format.name()
        );
    }
}
