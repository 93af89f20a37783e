//! L2 hand-off between consecutive GEMVs of a decode or verify pass.
//!
//! A batch-1 step is a chain of ~230 dependent kernels; the DRAM idles at each boundary (the last
//! blocks draining, the next grid launching and ramping up) and through the non-GEMV kernels (the GDN
//! recurrence, attention), while it is the only thing that limits a GEMV. So the forward pass names the
//! *next* GEMV's matrix before each GEMV ([`CudaDevice::warm_next`]) and that GEMV's blocks, as they
//! finish, hand its first bytes to the L2 prefetcher (`l2_prefetch_share` in `cu/common.cuh`): the next
//! kernel's first wave then reads from L2 what the boundary streamed.
//!
//! Invariant: a hint only moves data into a cache; results are the same bits with any policy (the
//! bench checks tokens and logits across policies). A hint is consumed by the next `ops::linear*` call
//! whatever path it takes, so it never reaches a later, unrelated GEMV.

use std::sync::Mutex;

use crate::weights::Mat;

/// How much of the next matrix a GEMV warms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2Prefetch {
    /// Bytes when the next kernel is the next GEMV (the boundary alone to hide).
    pub ahead: usize,
    /// Bytes when an attention or GDN core runs in between (it reads little DRAM for ~10-20 us).
    pub across_mixer: usize,
}

impl L2Prefetch {
    pub const OFF: L2Prefetch = L2Prefetch {
        ahead: 0,
        across_mixer: 0,
    };

    /// The policy from `TURBOSPARK_L2_PREFETCH=AHEAD_MB,ACROSS_MB` (`0,0` turns it off), else the
    /// default.
    pub fn from_env() -> L2Prefetch {
        let parsed = std::env::var("TURBOSPARK_L2_PREFETCH").ok().and_then(|v| {
            let (a, b) = v.split_once(',')?;
            let mb = |s: &str| {
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .map(|m| (m * 1048576.0) as usize)
            };
            Some(L2Prefetch {
                ahead: mb(a)?,
                across_mixer: mb(b)?,
            })
        });
        parsed.unwrap_or(L2Prefetch::DEFAULT)
    }

    /// Default amounts (to be replaced by the H200 measurement in tools/device/README.md).
    pub const DEFAULT: L2Prefetch = L2Prefetch {
        ahead: 8 << 20,
        across_mixer: 24 << 20,
    };
}

/// Up to two byte ranges (address, bytes; multiples of 16) a GEMV launch warms in L2 as it finishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct L2Next {
    pub ranges: [(u64, u64); 2],
}

impl L2Next {
    /// The first `budget` bytes the next GEMV over `w` reads: a prefix of the matrix, or for a SwiGLU
    /// [gate ; up] matrix (`halves`) a prefix of each half — its first blocks take gate row j and up row
    /// I + j together.
    fn of(w: &Mat, halves: bool, budget: usize) -> L2Next {
        Self::of_range(w.buf.ptr, w.bytes() as u64, halves, budget)
    }

    fn of_range(base: u64, total: u64, halves: bool, budget: usize) -> L2Next {
        let budget = (budget as u64).min(total) & !15;
        if budget == 0 {
            return L2Next::default();
        }
        if !halves {
            return L2Next {
                ranges: [(base, budget), (0, 0)],
            };
        }
        let half = (budget / 2) & !15;
        let up = (base + total / 2 + 15) & !15;
        L2Next {
            ranges: [(base, half), (up, half.min(base + total - up) & !15)],
        }
    }
}

/// The device's policy and the pending hint.
#[derive(Debug)]
pub(crate) struct L2Hints {
    policy: Mutex<L2Prefetch>,
    next: Mutex<L2Next>,
}

impl L2Hints {
    pub fn new(policy: L2Prefetch) -> L2Hints {
        L2Hints {
            policy: Mutex::new(policy),
            next: Mutex::new(L2Next::default()),
        }
    }

    pub fn policy(&self) -> L2Prefetch {
        self.policy.lock().map_or(L2Prefetch::OFF, |p| *p)
    }

    pub fn set_policy(&self, p: L2Prefetch) {
        if let Ok(mut g) = self.policy.lock() {
            *g = p;
        }
    }

    /// Names the matrix the GEMV after the next one reads (`across_mixer`: a mixer core runs between).
    pub fn warm_next(&self, w: &Mat, halves: bool, across_mixer: bool) {
        let p = self.policy();
        let budget = if across_mixer {
            p.across_mixer
        } else {
            p.ahead
        };
        if let Ok(mut g) = self.next.lock() {
            *g = L2Next::of(w, halves, budget);
        }
    }

    /// The pending hint, cleared.
    pub fn take(&self) -> L2Next {
        self.next
            .lock()
            .map_or(L2Next::default(), |mut g| std::mem::take(&mut *g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_clamped_aligned_and_split_for_swiglu() {
        let base = 0x10_0000u64;
        // A 5120-byte matrix.
        assert_eq!(
            L2Next::of_range(base, 5120, false, 1000).ranges,
            [(base, 992), (0, 0)]
        );
        assert_eq!(
            L2Next::of_range(base, 5120, false, 1 << 20).ranges,
            [(base, 5120), (0, 0)]
        );
        // [gate ; up]: a prefix of each half, the up half starting halfway.
        let n = L2Next::of_range(base, 5120, true, 1 << 20);
        assert_eq!(n.ranges, [(base, 2560), (base + 2560, 2560)]);
        assert_eq!(
            L2Next::of_range(base, 5120, true, 1000).ranges,
            [(base, 496), (base + 2560, 496)]
        );
        // Halves not on a 16-byte boundary: the up range starts at the next one.
        let n = L2Next::of_range(base, 5128, true, 1 << 20);
        assert_eq!(n.ranges, [(base, 2560), (base + 2576, 2544)]);
        assert_eq!(
            L2Next::of_range(base, 5120, true, 8).ranges,
            [(0, 0), (0, 0)]
        );
    }

    #[test]
    fn a_hint_is_taken_once_with_the_policy_budget() {
        let dev = crate::CudaDevice::emulated();
        let w = Mat {
            buf: crate::buf::DBuf::zeros(&dev, 64 * 40 * 2).expect("host buffer"),
            rows: 64,
            cols: 40,
            dtype: crate::weights::WDtype::Bf16,
            tensor_cores: false,
        };
        let hints = L2Hints::new(L2Prefetch {
            ahead: 1024,
            across_mixer: 4096,
        });
        hints.warm_next(&w, false, true);
        assert_eq!(hints.take().ranges[0], (w.buf.ptr, 4096));
        // Taken once: a later GEMV gets nothing.
        assert_eq!(hints.take(), L2Next::default());
        hints.warm_next(&w, false, false);
        assert_eq!(hints.take().ranges[0], (w.buf.ptr, 1024));
        hints.set_policy(L2Prefetch::OFF);
        hints.warm_next(&w, false, true);
        assert_eq!(hints.take(), L2Next::default());
    }
}
