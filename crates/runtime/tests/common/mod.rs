//! Shared helpers for the decode-loop tests: fixture models, a byte detokenizer over their ids, and an
//! oracle drafter that proposes the target's own future tokens with a controlled error rate.
#![allow(dead_code)]

use std::sync::Arc;

use drafters::{Chooser, Drafter};
use families::{BackendError, Tap, Transformer};
use runtime::ByteDetokenizer;

pub fn fixture(name: &str) -> (model_io::Checkpoint, Arc<Transformer>) {
    let dir = testdata::fixture(name);
    let ck = model_io::Checkpoint::open(&dir).unwrap();
    let m = Arc::new(families::load(&ck).unwrap());
    (ck, m)
}

/// Each id decodes to two bytes of printable ASCII; ids ≡ 7 (mod 16) decode to "é" so stop strings can
/// split inside a multi-byte character's neighbourhood.
pub fn detok(vocab: u32) -> ByteDetokenizer {
    ByteDetokenizer::new((0..vocab).map(|id| {
        let piece: Vec<u8> = if id % 16 == 7 {
            "é".as_bytes().to_vec()
        } else {
            vec![b'a' + (id % 26) as u8, b'a' + (id / 26 % 26) as u8]
        };
        (id, piece)
    }))
}

pub fn prompt(model: &Transformer, len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            (i.wrapping_mul(2654435761)
                .wrapping_add(salt.wrapping_mul(40503)))
                % model.vocab as u32
        })
        .collect()
}

/// Proposes `future[history.len() - prompt_len ..]` (the sequential run's own continuation), corrupting each
/// proposal with probability `error_rate` (a deterministic hash, so runs repeat).
pub struct Oracle {
    pub full: Vec<u32>,
    pub error_rate: f64,
    pub vocab: u32,
    pub calls: usize,
}

impl Drafter for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn taps(&self) -> Vec<Tap> {
        Vec::new()
    }
    fn reset(&mut self) {}
    fn position(&self) -> usize {
        usize::MAX
    }
    fn rewind(&mut self, _position: usize) -> Result<(), BackendError> {
        Ok(())
    }
    fn observe(
        &mut self,
        _taps: &[Vec<f32>],
        _n: usize,
        _next: &[u32],
    ) -> Result<(), BackendError> {
        Ok(())
    }
    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        _c: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        self.calls += 1;
        let mut out = Vec::new();
        for i in 0..k {
            let at = history.len() + i;
            let Some(&truth) = self.full.get(at) else {
                break;
            };
            let h = (at as u64 * 0x9E37_79B9 + self.calls as u64 * 0x85EB_CA6B) % 1000;
            let wrong = (h as f64) < self.error_rate * 1000.0;
            out.push(if wrong {
                (truth + 1 + (h as u32 % 5)) % self.vocab
            } else {
                truth
            });
        }
        Ok(out)
    }
}

/// The `Backend` methods a test wrapper of the CPU engine (a struct with `inner: &Transformer`) passes
/// through unchanged; the wrapper writes `forward` (and any method it changes) itself.
#[macro_export]
macro_rules! delegate_to_inner {
    () => {
        fn context(&self) -> usize {
            families::Backend::context(self.inner)
        }
        fn vocab(&self) -> usize {
            families::Backend::vocab(self.inner)
        }
        fn new_state(&self) -> Result<families::State, families::BackendError> {
            families::Backend::new_state(self.inner)
        }
        fn reserve(
            &self,
            state: &mut families::State,
            positions: usize,
        ) -> Result<(), families::BackendError> {
            families::Backend::reserve(self.inner, state, positions)
        }
        fn begin_tape(&self, state: &mut families::State) -> Result<(), families::BackendError> {
            families::Backend::begin_tape(self.inner, state)
        }
        fn rollback_retaining(
            &self,
            state: &mut families::State,
            keep: usize,
        ) -> Result<bool, families::BackendError> {
            families::Backend::rollback_retaining(self.inner, state, keep)
        }
    };
}
