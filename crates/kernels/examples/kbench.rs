//! Throughput of the CPU kernels: `cargo run -p kernels --release --example kbench [SECTION]`, SECTION one
//! of `linear`, `paths`, `gdn`, `attention` (default: all).
//!
//! - `linear`: GFLOP/s (and weight GB/s, the memory-bound figure) of `linear` on a 4096x4096 f32 weight for
//!   n = 1 (decode matvec) and n = 128 (prefill GEMM), with 1 and 2 threads.
//! - `paths`: both linear paths forced for small n, the numbers that set `MATVEC_MAX_ROWS`.
//! - `gdn`: gated DeltaNet chunked vs recurrent forms on a prefill-sized input.
//! - `attention`: one decode step over a 4096-position cache.
//! - `roofs`: one core's arithmetic and load roofs: f32 FMA from registers (AVX2, AVX-512), AMX
//!   `TDPBF16PS` from tiles, and vector loads streaming 32 KiB / 1 MiB / 64 MiB buffers (L1 / L2 / L3 or
//!   memory), the ceilings the kernels' GFLOP/s and GB/s are read against.
//! - `verify`: bf16 linear layers as the model holds them (`Bf16Matrix`: AMX tiles where the CPU has them,
//!   else row-major) for n = 1..17 rows (decode and verify blocks) on the testbed's matrix shapes and a
//!   ~0.8B model's, 2 threads: ms a call, GFLOP/s, and the cost of n rows in one-row calls.
//!
//! - `quant`: quantized linear layers (`QuantMatrix`, integer dot products against 8-bit inputs; and FP8,
//!   `Fp8Matrix`) against
//!   the bf16 layer the model holds otherwise, on a stack of 128 [4096, 1024] matrices (a ~0.5B model's
//!   weights, larger than the caches, so n = 1 is memory-bound as a real decode step): ms a sweep, weight
//!   GB/s and GMAC/s for n = 1, 4, 8, 17 and 64 rows, 2 threads.
//!
//! Each figure is the best of repeated runs over ~0.4 s, which filters out noise from other processes.
//!
//! On the 2-core AVX2 development machine (Xeon, 260 MiB L3, so the 64 MiB weight is L3-resident), quiet:
//! linear n=1: 13.7 GFLOP/s (27 GB/s) with 1 thread, 27.7 (55 GB/s) with 2; n=128: 67 / 102 GFLOP/s.
//! gated DeltaNet n=512, h=16, 128x128: chunked 27.5 / 15.0 ms, recurrent 60 / 30 ms (1 / 2 threads).
//! attention decode over 4096 positions (16 q heads, 4 kv heads, d=128): 2.35 / 1.30 ms.
//! `verify` on the 2-vCPU Sapphire Rapids VM (AMX tiles): 5 rows cost 1.0-1.26x one row, 9 rows 1.35-2.0x,
//! 17 rows 2.7-3.9x (130-220 GFLOP/s against 27-48 for one row).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kernels::{
    attention, gdn_chunked, gdn_recurrent, linear, linear_bf16_matrix, linear_gemm, linear_matvec,
    Bf16Matrix,
};

const BUDGET: Duration = Duration::from_millis(400);
const THREADS: [usize; 2] = [1, 2];

/// Best seconds per call over repetitions totalling at least BUDGET (and at least 3).
fn time_best(mut f: impl FnMut()) -> f64 {
    f(); // warm-up: page in the inputs, start the pool's threads
    let started = Instant::now();
    let mut best = f64::INFINITY;
    let mut reps = 0;
    while reps < 3 || started.elapsed() < BUDGET {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        reps += 1;
    }
    best
}

/// Cheap deterministic values in [-1, 1): the kernels' speed does not depend on them.
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

fn main() {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("kbench: simd path {}, {cpus} CPUs", kernels::simd_path());
    let only = std::env::args().nth(1);
    let wanted = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let (k, m) = (4096usize, 4096usize);
    let w = values(m * k, 1);
    if wanted("linear") {
        bench_linear(&w, k, m);
    }
    if wanted("paths") {
        bench_paths(&w, k, m);
    }
    if wanted("gdn") {
        bench_gdn();
    }
    if wanted("attention") {
        bench_attention();
    }
    if wanted("verify") {
        bench_verify();
    }
    if wanted("quant") {
        bench_quant();
    }
    if wanted("roofs") {
        roofs::print();
    }
}

fn bench_verify() {
    // (k, m): the testbed's attention/MLP projections and LM head, then a ~0.8B model's MLP projection.
    let shapes = [
        (384usize, 1024usize),
        (1024, 384),
        (384, 8192),
        (1024, 3584),
    ];
    let pool = pool(2);
    println!("\nbf16 linear, 2 threads: ms/call, GFLOP/s, cost in one-row calls");
    for (k, m) in shapes {
        let w: Vec<half::bf16> = values(m * k, 11)
            .iter()
            .map(|&v| half::bf16::from_f32(v))
            .collect();
        let w = Bf16Matrix::new(w, m, k);
        let layout = match w {
            Bf16Matrix::RowMajor { .. } => "row-major",
            _ => "AMX tiles",
        };
        println!("k={k} m={m} ({} KiB, {layout})", m * k * 2 / 1024);
        println!("{:>5} {:>9} {:>9} {:>7}", "n", "ms", "GFLOP/s", "x n=1");
        let mut one_row = 0.0;
        for n in [1usize, 2, 3, 4, 5, 8, 9, 12, 16, 17] {
            let x = values(n * k, 12);
            let mut out = vec![0.0f32; n * m];
            let secs =
                pool.install(|| time_best(|| linear_bf16_matrix(black_box(&x), &w, n, &mut out)));
            if n == 1 {
                one_row = secs;
            }
            let gflops = 2.0 * (n * k * m) as f64 / secs / 1e9;
            println!(
                "{n:>5} {:>9.4} {gflops:>9.2} {:>7.2}",
                secs * 1e3,
                secs / one_row
            );
        }
    }
}

fn bench_linear(w: &[f32], k: usize, m: usize) {
    println!("\nlinear, weight {m}x{k} f32 ({} MiB)", (m * k * 4) >> 20);
    println!(
        "{:>7} {:>5} {:>10} {:>9} {:>13}",
        "threads", "n", "ms/call", "GFLOP/s", "weight GB/s"
    );
    for threads in THREADS {
        let pool = pool(threads);
        for n in [1usize, 128] {
            let x = values(n * k, 2);
            let mut out = vec![0.0f32; n * m];
            let secs = pool.install(|| time_best(|| linear(black_box(&x), w, n, k, m, &mut out)));
            let gflops = 2.0 * (n * k * m) as f64 / secs / 1e9;
            let gbps = (m * k * 4) as f64 / secs / 1e9;
            println!(
                "{threads:>7} {n:>5} {:>10.3} {gflops:>9.2} {gbps:>13.2}",
                secs * 1e3
            );
        }
    }
}

fn bench_paths(w: &[f32], k: usize, m: usize) {
    println!("\nlinear paths forced (GFLOP/s), threshold check");
    println!("{:>7} {:>5} {:>9} {:>9}", "threads", "n", "matvec", "gemm");
    for threads in THREADS {
        let pool = pool(threads);
        for n in [1usize, 2, 3, 4, 6, 8, 12, 16, 24] {
            let x = values(n * k, 3);
            let mut out = vec![0.0f32; n * m];
            let gflop = 2.0 * (n * k * m) as f64 / 1e9;
            let matvec =
                pool.install(|| time_best(|| linear_matvec(black_box(&x), w, n, k, m, &mut out)));
            let gemm =
                pool.install(|| time_best(|| linear_gemm(black_box(&x), w, n, k, m, &mut out)));
            println!(
                "{threads:>7} {n:>5} {:>9.2} {:>9.2}",
                gflop / matvec,
                gflop / gemm
            );
        }
    }
}

fn bench_gdn() {
    // Prefill: 512 rows, 16 heads with a 128x128 state each.
    let (n, h, dk, dv) = (512usize, 16usize, 128usize, 128usize);
    let q: Vec<f32> = values(n * h * dk, 4).iter().map(|x| x * 0.01).collect();
    let k: Vec<f32> = values(n * h * dk, 5).iter().map(|x| x * 0.08).collect();
    let v = values(n * h * dv, 6);
    let g = vec![-0.05f32; n * h];
    let beta = vec![0.5f32; n * h];
    let mut out = vec![0.0f32; n * h * dv];
    println!("\ngated DeltaNet, n={n} h={h} dk={dk} dv={dv} (ms/call)");
    println!("{:>7} {:>9} {:>9}", "threads", "chunked", "recurrent");
    for threads in THREADS {
        let pool = pool(threads);
        let mut state = vec![0.0f32; h * dk * dv];
        let mut run = |chunked: bool| {
            pool.install(|| {
                time_best(|| {
                    let f = if chunked { gdn_chunked } else { gdn_recurrent };
                    f(&q, &k, &v, &g, &beta, &mut state, n, h, dk, dv, &mut out)
                })
            })
        };
        let (chunked, recurrent) = (run(true), run(false));
        println!(
            "{threads:>7} {:>9.2} {:>9.2}",
            chunked * 1e3,
            recurrent * 1e3
        );
    }
}

fn bench_attention() {
    // One decode step at position 4095: 16 query heads, 4 kv heads, d = 128.
    let (ctx, hq, hkv, d) = (4096usize, 16usize, 4usize, 128usize);
    let (q, k_cache, v_cache) = (
        values(hq * d, 7),
        values(ctx * hkv * d, 8),
        values(ctx * hkv * d, 9),
    );
    let mut out = vec![0.0f32; hq * d];
    println!("\nattention decode, context {ctx}, hq={hq} hkv={hkv} d={d}");
    println!("{:>7} {:>9} {:>13}", "threads", "ms/call", "cache GB/s");
    for threads in THREADS {
        let pool = pool(threads);
        let secs = pool.install(|| {
            time_best(|| {
                attention(
                    &q,
                    &k_cache,
                    &v_cache,
                    1,
                    ctx - 1,
                    hq,
                    hkv,
                    d,
                    0.088,
                    &mut out,
                )
            })
        });
        let gbps = (2 * ctx * hkv * d * 4) as f64 / secs / 1e9;
        println!("{threads:>7} {:>9.3} {gbps:>13.2}", secs * 1e3);
    }
}

#[cfg(target_arch = "x86_64")]
mod roofs {
    use std::arch::x86_64::*;
    use std::time::Instant;

    pub fn print() {
        println!("\nroofs, one core");
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected.
            let g = unsafe { fma_avx2(20_000_000) };
            println!("f32 FMA, AVX2:    {g:8.1} GFLOP/s");
        }
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected.
            let g = unsafe { fma_avx512(20_000_000) };
            println!("f32 FMA, AVX-512: {g:8.1} GFLOP/s");
        }
        if let Some(g) = amx_bf16(5_000_000) {
            println!("AMX TDPBF16PS:    {g:8.1} GFLOP/s (bf16 products, f32 sums)");
        }
        for (label, bytes) in [
            ("32 KiB", 32usize << 10),
            ("1 MiB", 1 << 20),
            ("64 MiB", 64 << 20),
        ] {
            if is_x86_feature_detected!("avx2") {
                // SAFETY: the feature was detected.
                let rate = unsafe { load_rate(bytes) };
                println!("loads, {label:>6}:    {rate:8.1} GB/s");
            }
        }
    }

    /// 12 independent 8-lane FMA chains (the latency x ports product).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_avx2(iters: usize) -> f64 {
        let (b, c) = (_mm256_set1_ps(0.999), _mm256_set1_ps(1e-3));
        let mut acc = [_mm256_setzero_ps(); 12];
        let t = Instant::now();
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, b, c);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(acc);
        (iters * 12 * 8 * 2) as f64 / secs / 1e9
    }

    /// 16 independent 16-lane FMA chains.
    #[target_feature(enable = "avx512f")]
    unsafe fn fma_avx512(iters: usize) -> f64 {
        let (b, c) = (_mm512_set1_ps(0.999), _mm512_set1_ps(1e-3));
        let mut acc = [_mm512_setzero_ps(); 16];
        let t = Instant::now();
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, b, c);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(acc);
        (iters * 16 * 16 * 2) as f64 / secs / 1e9
    }

    /// Four independent 16x16x32 tile products a step; None when this machine does not run AMX (the
    /// kernels' own check also asks Linux for the tile state, which this relies on).
    fn amx_bf16(iters: usize) -> Option<f64> {
        use kernels::Bf16Matrix;
        // Building a matrix asks for the tile permission when the CPU has AMX.
        let probe = Bf16Matrix::new(vec![half::bf16::ZERO; 16 * 32], 16, 32);
        if matches!(probe, Bf16Matrix::RowMajor { .. }) {
            return None;
        }
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = 16;
        }
        let a = vec![0x3f80u16; 16 * 32];
        let t = Instant::now();
        // SAFETY: AMX runs here (the probe got tiles); the configuration is palette 1 with 16 x 64-byte
        // tiles, and the loads read 1 KiB inside `a`.
        unsafe {
            std::arch::asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr());
            std::arch::asm!("tileloadd tmm4, [{0} + {1}*1]", "tileloadd tmm5, [{0} + {1}*1]",
                in(reg) a.as_ptr(), in(reg) 64usize);
            for _ in 0..iters {
                std::arch::asm!(
                    "tdpbf16ps tmm0, tmm4, tmm5",
                    "tdpbf16ps tmm1, tmm4, tmm5",
                    "tdpbf16ps tmm2, tmm4, tmm5",
                    "tdpbf16ps tmm3, tmm4, tmm5",
                    options(nostack, nomem)
                );
            }
            std::arch::asm!("tilerelease");
        }
        let secs = t.elapsed().as_secs_f64();
        Some((iters * 4 * 16 * 16 * 32 * 2) as f64 / secs / 1e9)
    }

    /// Bytes a second summing a buffer of `bytes` (its f32 values in two 8-lane accumulators), best of
    /// ~256 MiB of passes.
    #[target_feature(enable = "avx2")]
    unsafe fn load_rate(bytes: usize) -> f64 {
        let data: Vec<f32> = (0..bytes / 4).map(|i| (i % 7) as f32).collect();
        let mut best = f64::INFINITY;
        let reps = ((256usize << 20) / bytes).max(3);
        for _ in 0..reps {
            let t = Instant::now();
            let mut acc = [0.0f32; 16];
            for chunk in data.chunks_exact(16) {
                for (a, v) in acc.iter_mut().zip(chunk) {
                    *a += v;
                }
            }
            std::hint::black_box(acc);
            best = best.min(t.elapsed().as_secs_f64());
        }
        bytes as f64 / best / 1e9
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod roofs {
    pub fn print() {
        println!("\nroofs: measured on x86_64 only");
    }
}

fn bench_quant() {
    use kernels::{linear_fp8, linear_quant, QuantFormat, QuantMatrix};
    let (k, m, layers) = (1024usize, 4096usize, 128usize);
    let pool = pool(2);
    println!(
        "\nquantized linear ({}), {layers} x [{m}, {k}], 2 threads: ms a sweep, weight GB/s, GMAC/s",
        kernels::quant_simd_path()
    );
    println!(
        "{:>6} {:>5} {:>9} {:>8} {:>8}",
        "format", "n", "ms", "GB/s", "GMAC/s"
    );
    let bf16: Vec<half::bf16> = values(m * k, 3)
        .iter()
        .map(|&v| half::bf16::from_f32(v * 0.05))
        .collect();
    let bf16_stack: Vec<Bf16Matrix> = (0..layers)
        .map(|_| Bf16Matrix::new(bf16.clone(), m, k))
        .collect();
    let formats = [
        QuantFormat::Q8_0,
        QuantFormat::Q6K,
        QuantFormat::Q4K,
        QuantFormat::Q4_0,
    ];
    let stacks: Vec<(QuantFormat, Vec<QuantMatrix>)> = formats
        .iter()
        .map(|&f| {
            // Random bytes with the scale fields small and finite: speed does not depend on the values.
            let mut data: Vec<u8> = values(m * f.row_bytes(k), 5)
                .iter()
                .map(|v| (v * 127.0) as i8 as u8)
                .collect();
            let scale = half::f16::from_f32(0.01).to_le_bytes();
            for block in data.chunks_exact_mut(f.block_bytes()) {
                let at = if f == QuantFormat::Q6K { 208 } else { 0 };
                block[at..at + 2].copy_from_slice(&scale);
                if matches!(f, QuantFormat::Q4K | QuantFormat::Q5K) {
                    block[2..4].copy_from_slice(&scale);
                }
            }
            let one = QuantMatrix::new(f, data, m, k).expect("bench matrix");
            (f, vec![one; layers])
        })
        .collect();
    let fp8 = kernels::Fp8Matrix::quantize(&values(m * k, 9), m, k, [128, 128]);
    let fp8_stack = vec![fp8; layers];
    for n in [1usize, 4, 8, 17, 64] {
        let x = values(n * k, 7);
        let mut out = vec![0f32; n * m];
        let row = |name: &str, bytes: usize, secs: f64| {
            println!(
                "{name:>6} {n:>5} {:>9.3} {:>8.1} {:>8.1}",
                secs * 1e3,
                bytes as f64 / secs / 1e9,
                (n * k * m * layers) as f64 / secs / 1e9
            );
        };
        let secs = pool.install(|| {
            time_best(|| {
                for w in &bf16_stack {
                    linear_bf16_matrix(black_box(&x), w, n, &mut out);
                }
            })
        });
        row("bf16", m * k * 2 * layers, secs);
        for (f, stack) in &stacks {
            let secs = pool.install(|| {
                time_best(|| {
                    for w in stack {
                        linear_quant(black_box(&x), w, n, &mut out);
                    }
                })
            });
            row(f.name(), stack[0].bytes() * layers, secs);
        }
        let secs = pool.install(|| {
            time_best(|| {
                for w in &fp8_stack {
                    linear_fp8(black_box(&x), w, n, &mut out);
                }
            })
        });
        row("FP8", fp8_stack[0].bytes() * layers, secs);
    }
}
