//! How segments run (segment.rs): the weight ring a launch takes (`Ring`: page size and pieces per row),
//! the configuration the environment's switches ask for (`Config`, `debug_env.rs`), and which kernel a launch runs
//! (`Config::kernel_for`: one holding a stage's input in registers when its rows allow, `HELD_KERNELS`).

use crate::debug_env::SegEnv;
use crate::segment::{Stage, MAX_IN, MAX_STAGES};

/// The kernel instantiations (segment.cu), for the kernel simulator's table (the trace kernels too, so
/// that `TURBOSPARK_SEG_TRACE=1` runs there: their stamps are zeros, their sums must still be exact).
pub(crate) const KERNELS: [&str; 9] = [
    "gemv_segment_c8p4",
    "gemv_segment_c12p4",
    "gemv_segment_c8p4_x10",
    "gemv_segment_c8p4_x16",
    "gemv_segment_r88_c12p4",
    "gemv_segment_trace_c8p4",
    "gemv_segment_trace_c12p4",
    "gemv_segment_trace_c8p4_x10",
    "gemv_segment_trace_c8p4_x16",
];
/// The kernels that hold a stage's input in registers (segment.cu SEG_KERNEL / SegHeld), 8 consumers
/// each, and the input width they hold: of stages with one warp and one piece per row.
struct HeldKernel {
    name: &'static str,
    trace: &'static str,
    width: usize,
    /// Most pages of its rings (its consumers' parity bits: 32 in x16, whose 8 KB pages fit 28 at most).
    max_pages: usize,
}
const HELD_KERNELS: [HeldKernel; 2] = [
    HeldKernel {
        name: "gemv_segment_c8p4_x10",
        trace: "gemv_segment_trace_c8p4_x10",
        width: 2560,
        max_pages: 64,
    },
    HeldKernel {
        name: "gemv_segment_c8p4_x16",
        trace: "gemv_segment_trace_c8p4_x16",
        width: 4096,
        max_pages: 32,
    },
];
/// Shared memory of a block's weight ring, before `Config::ring` trims it to what the launch's staged input
/// leaves of the device's shared memory: "as large as fits". The pages beyond those in flight hold landed
/// data across a stage boundary, so more pages bank more: 4B step with 128 / 144 / 160 KB 2.480 / 2.425 /
/// 2.377 ms, 160 against as large as fits (180 KB of 5 KB pages) 2.388 against 2.359 (9B
/// / 8B flat). `TURBOSPARK_SEG_RING_KB` (32..=224) sets another for measurements.
const RING_BYTES: usize = 224 * 1024;
fn ring_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        crate::debug_env::get()
            .seg
            .ring_kb
            .map_or(RING_BYTES, |kb| kb.clamp(32, 224) * 1024)
    })
}
/// Page sizes a segment may use (the one that wastes least of the ring on its rows is taken).
const PAGE_SIZES: [usize; 5] = [4096, 5120, 6144, 8192, 10240];
/// Most pages of a ring (the consumers keep one parity bit per page, in 64 bits; x16's 32: `HeldKernel`).
const MAX_PAGES: usize = 64;
/// Bytes of a block's dynamic shared memory besides the ring and the staged input: the barriers per page
/// of 12 consumers and the producers, the in-flight cap's words, the norm scratch (smem_bytes).
fn ring_overhead(consumers: usize, pages: usize) -> usize {
    (1 + consumers) * pages * 8 + 32 * 8 + 2 * pages * 4 + 4
}
/// Bytes a block may have in flight while it copies for the stage its consumers are on (segment.cu's
/// in-flight cap; the rest of the ring holds landed pages): fewer queued bytes stream faster and more evenly
/// over the SMs. With the boundary's cap below, 8 / 12 / 16 pages: 4B (5 KB pages) 2.433 / 2.399 / 2.395 ms,
/// 9B (8 KB) 4.260 / 4.269 / 4.259, 8B (8 KB) 4.364 / 4.394 / 4.390; with the 4B's 36-page ring,
/// 8 / 12 / 16 / 20 pages 2.380 / 2.345 / 2.337 / 2.343: 80 KB, which keeps 8 KB pages at 8.
const FLIGHT_BYTES: usize = 80 * 1024;
/// Pages a block may have in flight while it copies for a stage its consumers have not yet staged (they
/// finish the one before, wait at the grid barrier, stage the input): the boundary's round trips wait
/// behind fewer bytes. 4 / 8 pages: 4B 2.399 / 2.467 ms, 9B 4.269 / 4.357, 8B 4.394 / 4.479.
const EDGE_FLIGHT_PAGES: usize = 4;
/// SegParams flags bits 10-15: a multiple of the 4 producers (each waits for its own earlier copy), 0 off.
fn flight_pages(pages: usize) -> usize {
    pages.min(60) / 4 * 4
}
/// A segment's weight ring: `pages` pages of `page_bytes` (a multiple of the 4 producer warps).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ring {
    pub page_bytes: usize,
    pub pages: usize,
}

impl Ring {
    pub(crate) fn of(page_bytes: usize) -> Ring {
        Ring {
            page_bytes,
            pages: (ring_bytes() / page_bytes).clamp(4, MAX_PAGES) / 4 * 4,
        }
    }

    /// Pieces a row of `cols` bf16 values is read in: the fewest equal ones of whole 16-byte vectors
    /// that fit a page.
    pub(crate) fn pieces(&self, cols: usize) -> Option<usize> {
        (1..=cols / 8).find(|&p| {
            cols.is_multiple_of(p)
                && (cols / p).is_multiple_of(8)
                && cols / p * 2 <= self.page_bytes
        })
    }

    /// The ring for `stages`: of the page sizes that hold every stage's rows in pieces, the one whose
    /// pages the streamed bytes fill best (a 2560-wide row fills a 5 KB page, a 4096-wide one 8 KB);
    /// on a tie the larger page (fewer copies).
    fn for_stages(stages: &[Stage]) -> Option<Ring> {
        let mut best: Option<(f64, Ring)> = None;
        for ring in PAGE_SIZES.map(Ring::of) {
            let mut filled = 0.0;
            let mut total = 0.0;
            for s in stages {
                let piece = s.cols / ring.pieces(s.cols)? * 2;
                let bytes = (s.rows * s.cols * 2) as f64;
                filled += bytes * piece as f64 / ring.page_bytes as f64;
                total += bytes;
            }
            let fill = filled / total.max(1.0);
            if best.is_none_or(|(f, _)| fill >= f - 1e-9) {
                best = Some((fill, ring));
            }
        }
        best.map(|(_, ring)| ring)
    }

    /// Dynamic shared memory of a block with `consumers` consumer warps and room for an input of
    /// `xs_floats`: pages, the staged input, the empty barriers and each consumer's full barriers, norm
    /// scratch, the in-flight cap's two words per page and the consumers' staged stages. Only what the segment needs: the less a block
    /// holds, the sooner its neighbours in the stream fit beside it (4B step: 2.980 ms with
    /// a fixed 48 KB room, 2.970-2.975 with the segment's own 36 KB).
    pub(crate) fn smem_bytes(&self, consumers: usize, xs_floats: usize) -> usize {
        self.pages * self.page_bytes + xs_floats * 4 + ring_overhead(consumers, self.pages)
    }

    /// This ring less the pages that do not fit `limit` bytes of shared memory beside `xs_floats` of staged
    /// input (whole rounds of the 4 producers; None if not even 4 pages fit).
    fn within(self, limit: usize, xs_floats: usize) -> Option<Ring> {
        let mut ring = self;
        while ring.pages >= 4 && ring.smem_bytes(12, xs_floats) > limit {
            ring.pages -= 4;
        }
        (ring.pages >= 4).then_some(ring)
    }
}

/// How segments run: consumer warps per block (plus 4 producer warps) and knobs for measurements.
/// Read once, from the environment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    /// Consumer warps of a block (plus 4 producers) of the kernel without a register-held input: 12, or
    /// 8 (measurements; then every segment runs that kernel).
    pub consumers: usize,
    /// A fixed page size instead of the per-segment choice (`TURBOSPARK_SEG_PAGE`).
    pub page_bytes: Option<usize>,
    /// The L2 evict-first hint on the weights (flags bit 0) for every step (`TURBOSPARK_SEG_EVICT_FIRST`
    /// 1 / 0); unset: as the model opening the step asks (`segment::open`).
    pub evict_first: Option<bool>,
    /// Kernel flags (SegParams::flags), but bit 0 (`evict_first`) and bits 10-15 (the launch's in-flight
    /// cap, `flags_for`): bit 6 keeps RMSNorm weights out of the staging (`TURBOSPARK_SEG_NORM_STAGED=0`);
    /// bits 16-21 the pages a block may have in flight at a stage boundary (`TURBOSPARK_SEG_FLIGHT_EDGE`,
    /// default `EDGE_FLIGHT_PAGES`, 0: as in the rows); bit 22 ends the boundary as the grid barrier is
    /// passed, before the staging (`TURBOSPARK_SEG_EDGE_TO_BARRIER=1`, measurements).
    pub flags: u32,
    /// Dynamic shared memory a block may have (the device's opt-in less the trace kernels' static bytes;
    /// `CudaDevice` sets it): a launch's ring takes at most what its staged input leaves.
    pub smem_limit: usize,
    /// Pages a block may have in flight in the rows, 0 the whole ring (`TURBOSPARK_SEG_FLIGHT`; unset:
    /// `FLIGHT_BYTES` of the launch's pages).
    pub flight: Option<usize>,
    /// Launch with the cooperative attribute: the driver refuses a grid that cannot be resident at
    /// once instead of letting its grid barrier wait forever (`TURBOSPARK_SEG_COOP=0`: without).
    pub cooperative: bool,
    /// Stages per launch (<= MAX_STAGES) and the most output rows a queued GEMV may have
    /// (`TURBOSPARK_SEG_MAX` / `TURBOSPARK_SEG_MAX_ROWS`).
    pub max_stages: usize,
    pub max_rows: usize,
    /// Launch a lone queued GEMV as a segment too (`TURBOSPARK_SEG_SINGLE=1`).
    pub single: bool,
    /// Run the trace kernels and keep their stamps (`TURBOSPARK_SEG_TRACE=1`, segment_trace.rs).
    pub trace: bool,
    /// 12 consumers with registers capped at 88, so a block fits beside two gdn_rec blocks
    /// (`TURBOSPARK_SEG_REGCAP=1`, measurements).
    pub regcap: bool,
    /// Prefetch what `prefetch_after` names (`TURBOSPARK_SEG_PREFETCH=0`: not, for measurements).
    pub prefetch: bool,
    /// Take GDN gated norms into the staging (`defer_gated_norm`; `TURBOSPARK_SEG_GATED_NORM=0`: not).
    pub gated_norm: bool,
    /// Run segments with a stage whose input fits a lane's registers on the 8-consumer kernel that holds
    /// it there (`HELD_KERNELS`; `TURBOSPARK_SEG_XREG=0`: every segment on `base_kernel()`).
    pub held_inputs: bool,
}

/// The kernel one segment launches, and its warps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegKernel {
    pub name: &'static str,
    pub consumers: usize,
    pub producers: usize,
}

impl SegKernel {
    /// Threads of a block: the consumer and producer warps.
    pub(crate) fn threads(&self) -> u32 {
        ((self.consumers + self.producers) * 32) as u32
    }
}

impl Config {
    /// 12 consumer warps without held inputs: the fastest of the variants measured (see segment.cu);
    /// the `TURBOSPARK_SEG_*` switches (`debug_env.rs`) change them for measurements.
    pub fn from_env() -> Self {
        Self::from_switches(&crate::debug_env::get().seg)
    }

    /// The configuration `env` asks for (unset switches: the defaults).
    pub(crate) fn from_switches(env: &SegEnv) -> Self {
        let get = |v: Option<usize>, default: usize| v.unwrap_or(default);
        Config {
            consumers: if get(env.consumers, 12) == 8 { 8 } else { 12 },
            page_bytes: env.page.map(|b| (b / 16 * 16).clamp(1024, 10240)),
            evict_first: env.evict_first.map(|v| v == 1),
            flags: ((get(env.norm_staged, 1) == 0) as u32) << 6
                | (flight_pages(get(env.flight_edge, EDGE_FLIGHT_PAGES)) as u32) << 16
                | ((get(env.edge_to_barrier, 0) == 1) as u32) << 22,
            smem_limit: 227 * 1024 - 64,
            flight: env.flight,
            cooperative: get(env.coop, 1) != 0,
            max_stages: get(env.max, MAX_STAGES).clamp(1, MAX_STAGES),
            max_rows: get(env.max_rows, usize::MAX),
            single: get(env.single, 0) == 1,
            trace: get(env.trace, 0) == 1,
            regcap: get(env.regcap, 0) == 1,
            prefetch: get(env.prefetch, 1) != 0,
            gated_norm: get(env.gated_norm, 1) != 0,
            held_inputs: get(env.xreg, 1) != 0,
        }
    }

    /// The kernel of segments without a register-held input (the instantiations in segment.cu).
    pub fn base_kernel(&self) -> SegKernel {
        let name = match (self.consumers, self.trace, self.regcap) {
            (8, false, _) => "gemv_segment_c8p4",
            (8, true, _) => "gemv_segment_trace_c8p4",
            (_, false, false) => "gemv_segment_c12p4",
            (_, true, false) => "gemv_segment_trace_c12p4",
            (_, false, true) => "gemv_segment_r88_c12p4",
            (_, true, true) => "gemv_segment_trace_r88_c12p4",
        };
        SegKernel {
            name,
            consumers: self.consumers,
            producers: 4,
        }
    }

    fn held_kernel(&self, k: &HeldKernel) -> SegKernel {
        SegKernel {
            name: if self.trace { k.trace } else { k.name },
            consumers: 8,
            producers: 4,
        }
    }

    /// Every kernel segments may launch under this configuration, the base kernel first.
    pub fn kernels(&self) -> Vec<SegKernel> {
        let mut k = vec![self.base_kernel()];
        if self.holds_inputs() {
            k.extend(HELD_KERNELS.iter().map(|h| self.held_kernel(h)));
        }
        k
    }

    fn holds_inputs(&self) -> bool {
        self.held_inputs && self.consumers == 12 && !self.regcap
    }

    /// The kernel for `stages` on `ring`: of the HELD_KERNELS, the one whose held stages carry the most
    /// weight bytes (the ~160 registers a held input takes leave room for 8 consumer warps: 4B step
    /// 2.728 ms against 2.756 on 12 without, 9B 4.556 against 4.650); else the base kernel.
    pub(crate) fn kernel_for(&self, stages: &[Stage], ring: &Ring) -> SegKernel {
        if !self.holds_inputs() {
            return self.base_kernel();
        }
        let held_bytes = |k: &HeldKernel| -> usize {
            if ring.pages > k.max_pages {
                return 0;
            }
            stages
                .iter()
                .filter(|s| s.cols == k.width && s.wpr == 1 && ring.pieces(s.cols) == Some(1))
                .map(|s| s.rows * s.cols)
                .sum()
        };
        HELD_KERNELS
            .iter()
            .map(|k| (held_bytes(k), k))
            .filter(|&(b, _)| b > 0)
            .max_by_key(|&(b, _)| b)
            .map_or_else(|| self.base_kernel(), |(_, k)| self.held_kernel(k))
    }

    /// The most dynamic shared memory a block of `kernel` takes (its opt-in).
    pub fn max_smem_bytes(&self, kernel: &SegKernel) -> usize {
        PAGE_SIZES
            .iter()
            .chain(self.page_bytes.as_slice())
            .map(|&b| Ring::of(b).smem_bytes(kernel.consumers, MAX_IN))
            .max()
            .unwrap_or(0)
            .min(self.smem_limit)
    }

    /// The kernel flags of a launch on `ring`: `flags` and its in-flight cap in the rows (bits 10-15).
    pub(crate) fn flags_for(&self, ring: &Ring) -> u32 {
        let pages = self.flight.unwrap_or(FLIGHT_BYTES / ring.page_bytes);
        self.flags | (flight_pages(pages) as u32) << 10
    }

    /// The ring for `stages`, whose staged input takes `xs_floats`.
    pub(crate) fn ring(&self, stages: &[Stage], xs_floats: usize) -> Option<Ring> {
        let ring = match self.page_bytes {
            Some(b) => {
                let ring = Ring::of(b);
                stages
                    .iter()
                    .all(|s| ring.pieces(s.cols).is_some())
                    .then_some(ring)
            }
            None => Ring::for_stages(stages),
        };
        ring?.within(self.smem_limit, xs_floats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::segment::test_gemv as gemv;

    #[test]
    fn a_ring_keeps_the_pages_that_fit_beside_its_input() {
        let limit = 227 * 1024 - 64;
        let ring = |page_bytes, pages| Ring { page_bytes, pages };
        // The 4B's 5 KB pages beside the down projection's 9216 floats: 36 pages (180 KB), 32 beside 12288.
        assert_eq!(ring(5120, 44).within(limit, 9216), Some(ring(5120, 36)));
        assert_eq!(ring(5120, 44).within(limit, 12288), Some(ring(5120, 32)));
        assert_eq!(ring(8192, 28).within(limit, 12288), Some(ring(8192, 20)));
        // A ring that fits stays as it is; one with no room for 4 pages is none.
        assert_eq!(ring(5120, 32).within(limit, 9216), Some(ring(5120, 32)));
        assert_eq!(ring(8192, 20).within(40 * 1024, 4096), None);
        for (r, xs) in [(ring(5120, 36), 9216), (ring(8192, 20), 12288)] {
            assert!(r.smem_bytes(12, xs) <= limit);
        }
    }

    #[test]
    fn rows_split_into_the_fewest_equal_pieces_that_fit_a_page() {
        let r = Ring::of(5120);
        assert_eq!(
            (r.pages, r.page_bytes),
            (44, 5120),
            "224 KB before the launch's input is beside it"
        );
        // The 4B shape's input widths: hidden 2560, GDN value 4096, intermediate 9216.
        assert_eq!(r.pieces(2560), Some(1));
        assert_eq!(r.pieces(4096), Some(2));
        assert_eq!(r.pieces(9216), Some(4));
        assert_eq!(r.pieces(8), Some(1));
        // Pieces must be whole 16-byte vectors.
        assert_eq!(r.pieces(12), None);
        assert_eq!(Ring::of(8192).pages, 28);
        // As large as fits: the 4B's down projection (9216 floats of input) 36 pages, 32 beside 12288.
        let c = Config::from_env();
        if crate::debug_env::get().seg.ring_kb.is_none() {
            let rooms =
                [9216, 12288, 2 * 4096].map(|xs| c.ring(&[gemv(2560, 8)], xs).map(|r| r.pages));
            assert_eq!(rooms, [Some(36), Some(32), Some(36)]);
        }
        // The in-flight cap: whole rounds of the 4 producers, within the flags' 6 bits.
        assert_eq!(
            (flight_pages(9), flight_pages(3), flight_pages(99)),
            (8, 0, 60)
        );
        // In the rows ~80 KB: 16 pages of the 4B's 5 KB, 8 of the 9B's / 8B's 8 KB; the boundary's 4.
        let mut c = Config::from_env();
        c.flight = None;
        let caps = |c: &Config, b| {
            (
                c.flags_for(&Ring::of(b)) >> 10 & 63,
                c.flags_for(&Ring::of(b)) >> 16 & 63,
            )
        };
        if crate::debug_env::get().seg.flight_edge.is_none() {
            assert_eq!(
                (caps(&c, 5120), caps(&c, 8192), caps(&c, 4096)),
                ((16, 4), (8, 4), (20, 4))
            );
        }
        c.flight = Some(16);
        assert_eq!(caps(&c, 8192).0, 16);
        for k in c.kernels() {
            assert!(
                c.max_smem_bytes(&k) <= 227 * 1024,
                "every ring of {} must fit an H100/H200 block",
                k.name
            );
        }
    }

    #[test]
    fn segments_with_a_stage_one_warp_per_row_of_a_held_width_take_the_register_kernel() {
        let c = Config {
            held_inputs: true,
            consumers: 12,
            regcap: false,
            trace: false,
            ..Config::from_env()
        };
        let one_warp = |cols, rows| Stage {
            wpr: 1,
            ..gemv(cols, rows)
        };
        // 4B layer: gate_up and in_proj (2560 wide, one piece of a 5 KB page) qualify; out does not (wpr 4).
        let four_b = [
            gemv(4096, 2560),
            one_warp(2560, 18432),
            gemv(9216, 2560),
            one_warp(2560, 12352),
        ];
        let ring = Ring::for_stages(&four_b).unwrap();
        assert_eq!(c.kernel_for(&four_b, &ring).name, "gemv_segment_c8p4_x10");
        assert_eq!(c.kernel_for(&four_b, &ring).consumers, 8);
        // Rows of several warps do not, nor one-warp rows in pieces.
        let other = [gemv(2560, 12352), one_warp(4096, 18432)];
        assert_eq!(c.kernel_for(&other, &ring).name, "gemv_segment_c12p4");
        // 8B layer on 8 KB pages: 4096 wide in one piece.
        let eight_b = [one_warp(4096, 24576), gemv(12288, 4096)];
        let ring8 = Ring::for_stages(&eight_b).unwrap();
        assert_eq!(c.kernel_for(&eight_b, &ring8).name, "gemv_segment_c8p4_x16");
        // x16 keeps 32-bit page parities: a ring of more pages runs the base kernel; x10 has 64.
        let wide8 = Ring { pages: 36, ..ring8 };
        assert_eq!(c.kernel_for(&eight_b, &wide8).name, "gemv_segment_c12p4");
        let wide = Ring { pages: 36, ..ring };
        assert_eq!(c.kernel_for(&four_b, &wide).name, "gemv_segment_c8p4_x10");
        // Turned off: the base kernel.
        let off = Config {
            held_inputs: false,
            ..c
        };
        assert_eq!(off.kernel_for(&four_b, &ring).name, "gemv_segment_c12p4");
    }

    #[test]
    fn each_segment_takes_the_page_its_rows_fill() {
        // 4B-shaped layer: out 4096 -> 2560, gate_up 2560 -> 18432, down 9216 -> 2560, in_proj.
        let four_b = [
            gemv(4096, 2560),
            gemv(2560, 18432),
            gemv(9216, 2560),
            gemv(2560, 12352),
        ];
        assert_eq!(Ring::for_stages(&four_b).map(|r| r.page_bytes), Some(5120));
        // 8B-shaped: hidden 4096, intermediate 12288.
        let eight_b = [gemv(4096, 4096), gemv(4096, 24576), gemv(12288, 4096)];
        assert_eq!(Ring::for_stages(&eight_b).map(|r| r.page_bytes), Some(8192));
        // A row no page size divides into whole vectors: no segment.
        assert_eq!(Ring::for_stages(&[gemv(12, 4)]), None);
    }
}
