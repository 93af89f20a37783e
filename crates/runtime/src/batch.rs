//! Continuous batching at the model seam: generations on several threads, each running the ordinary
//! decode loop (prefill chunks, its own drafter, block, tuner and judge) on its own session, meet at
//! `Backend::forward_batch`. The first thread to arrive while no step runs leads the step: it waits
//! until every generation in progress has brought its rows (or `gather` has passed), then runs all the
//! waiting rows — decode rows, verify blocks, prefill chunks — as one `forward_batch` of the model and
//! hands each thread its result. Generations join and leave between steps (a thread that starts or
//! ends one, `BatchHub::enter`).
//!
//! Invariant: a sequence's result is what the model gives it alone (the `forward_batch` contract: the
//! CPU engine keeps every row's bits whatever else is in the batch, `families/tests/batch.rs`), so what
//! a request generates never depends on what else runs; a sequence whose rows fail is told its own
//! error, the others in its step are re-run alone.
//!
//! Safety: a waiting thread's rows (token slice, state, wanted) are lent to the leader as raw pointers;
//! the thread stays blocked until its result is stored, which the leader does only after it has stopped
//! using them, so the borrows outlive every use.

use std::collections::HashMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use families::{Backend, BackendError, ForwardOut, SeqRows, Wanted};

/// Runs a step's work where the model's kernels belong (a front end's thread pool: `install`), from
/// the leader's thread.
pub type Install<'a> = &'a (dyn Fn(&mut (dyn FnMut() + Send)) + Sync);

/// How long a step's leader waits for generations that have not brought their rows yet (one busy
/// with host work, or blocked on a slow client) before running without them.
pub const GATHER: Duration = Duration::from_micros(500);

/// The meeting point of the generations sharing one model (one per model).
pub struct BatchHub<S> {
    step: Mutex<Step<S>>,
    arrived: Condvar,
    done: Condvar,
    /// Generations in progress (`enter` guards alive).
    active: AtomicUsize,
    gather: Duration,
}

struct Step<S> {
    waiting: Vec<Lent<S>>,
    results: HashMap<u64, Result<ForwardOut, BackendError>>,
    leading: bool,
    next_id: u64,
    stats: BatchStats,
}

/// What the steps of a [`BatchHub`] have run so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    pub steps: u64,
    /// Sequences over all steps (sequences / steps: the mean batch).
    pub sequences: u64,
    /// The most sequences one step ran.
    pub largest: usize,
}

/// One sequence's rows lent to the step's leader.
struct Lent<S> {
    id: u64,
    tokens: *const u32,
    len: usize,
    start: usize,
    state: *mut S,
    wanted: *const Wanted,
}

// SAFETY: the pointees belong to a thread blocked in `BatchHub::forward` until the leader has finished
// with them (module doc); `S: Send` lets the state be used from the leader's thread (or the pool thread
// it hands the step to) meanwhile, and a shared `&Lent` only reads the pointers.
unsafe impl<S: Send> Send for Lent<S> {}
unsafe impl<S: Send> Sync for Lent<S> {}

/// A generation in progress (`BatchHub::enter`); leaving drops it.
pub struct Entered<'a, S> {
    hub: &'a BatchHub<S>,
}

impl<S> Drop for Entered<'_, S> {
    fn drop(&mut self) {
        self.hub.active.fetch_sub(1, Ordering::SeqCst);
        // A leader waiting for this generation's rows need not wait any longer.
        self.hub.arrived.notify_all();
    }
}

impl<S: Send> Default for BatchHub<S> {
    fn default() -> Self {
        Self::new(GATHER)
    }
}

impl<S: Send> BatchHub<S> {
    pub fn new(gather: Duration) -> Self {
        BatchHub {
            step: Mutex::new(Step {
                waiting: Vec::new(),
                results: HashMap::new(),
                leading: false,
                next_id: 0,
                stats: BatchStats::default(),
            }),
            arrived: Condvar::new(),
            done: Condvar::new(),
            active: AtomicUsize::new(0),
            gather,
        }
    }

    /// Marks a generation in progress until the guard drops: leaders wait for its rows.
    pub fn enter(&self) -> Entered<'_, S> {
        self.active.fetch_add(1, Ordering::SeqCst);
        Entered { hub: self }
    }

    /// The model seam through this hub; steps run on the leader's thread.
    pub fn backend<'a, B: Backend<State = S> + Sync>(&'a self, model: &'a B) -> Batched<'a, B> {
        Batched {
            model,
            hub: self,
            install: None,
        }
    }

    /// [`BatchHub::backend`] whose steps run through `install` (the front end's kernel pool, so that
    /// the generations' own threads wait outside it).
    pub fn backend_in<'a, B: Backend<State = S> + Sync>(
        &'a self,
        model: &'a B,
        install: Install<'a>,
    ) -> Batched<'a, B> {
        Batched {
            model,
            hub: self,
            install: Some(install),
        }
    }

    /// What the steps have run so far.
    pub fn stats(&self) -> BatchStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, Step<S>> {
        // A panic while holding the lock leaves the step's bookkeeping consistent (every mutation is
        // a single push / insert / take), so a poisoned lock is still usable.
        self.step.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `batch` in the next step with whatever other threads bring; returns its results in order.
    fn forward<B: Backend<State = S> + Sync>(
        &self,
        model: &B,
        install: Option<Install<'_>>,
        batch: &mut [SeqRows<'_, S>],
    ) -> Result<Vec<ForwardOut>, BackendError> {
        let mut g = self.lock();
        let ids: Vec<u64> = batch
            .iter_mut()
            .map(|s| {
                let id = g.next_id;
                g.next_id += 1;
                g.waiting.push(Lent {
                    id,
                    tokens: s.tokens.as_ptr(),
                    len: s.tokens.len(),
                    start: s.start,
                    state: &mut *s.state,
                    wanted: s.wanted,
                });
                id
            })
            .collect();
        self.arrived.notify_all();
        loop {
            if ids.iter().all(|id| g.results.contains_key(id)) {
                return ids
                    .iter()
                    .map(|id| g.results.remove(id).expect("checked above"))
                    .collect();
            }
            if g.leading {
                g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Lead a step: wait for the generations still away, then run every waiting sequence.
            g.leading = true;
            let t0 = Instant::now();
            while g.waiting.len() < self.active.load(Ordering::SeqCst) {
                let Some(left) = self.gather.checked_sub(t0.elapsed()) else {
                    break;
                };
                g = self
                    .arrived
                    .wait_timeout(g, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            let lent = std::mem::take(&mut g.waiting);
            g.stats.steps += 1;
            g.stats.sequences += lent.len() as u64;
            g.stats.largest = g.stats.largest.max(lent.len());
            drop(g);
            let run = catch_unwind(AssertUnwindSafe(|| match install {
                None => run_step(model, &lent),
                Some(install) => {
                    let mut results = Vec::new();
                    install(&mut || results = run_step(model, &lent));
                    results
                }
            }));
            g = self.lock();
            g.leading = false;
            let panicked = match run {
                Ok(results) => {
                    for (l, r) in lent.iter().zip(results) {
                        g.results.insert(l.id, r);
                    }
                    None
                }
                Err(payload) => {
                    for l in &lent {
                        let e = BackendError::Device("the model panicked in a batched step".into());
                        g.results.insert(l.id, Err(e));
                    }
                    Some(payload)
                }
            };
            self.done.notify_all();
            if let Some(payload) = panicked {
                drop(g);
                resume_unwind(payload);
            }
        }
    }
}

/// One step over the lent sequences: one `forward_batch`; when it fails and several sequences ran,
/// each again alone, so that each gets its own result or error.
fn run_step<B: Backend>(
    model: &B,
    lent: &[Lent<B::State>],
) -> Vec<Result<ForwardOut, BackendError>> {
    // SAFETY: module doc — each pointee is alive and used by no one else until its result is stored.
    let rows = |l: &Lent<B::State>| unsafe {
        SeqRows {
            tokens: std::slice::from_raw_parts(l.tokens, l.len),
            start: l.start,
            state: &mut *l.state,
            wanted: &*l.wanted,
        }
    };
    let mut batch: Vec<SeqRows<'_, B::State>> = lent.iter().map(rows).collect();
    match model.forward_batch(&mut batch) {
        Ok(outs) if outs.len() == lent.len() => outs.into_iter().map(Ok).collect(),
        Ok(outs) => {
            let why = format!(
                "the backend's batched forward returned {} outputs for {} sequences",
                outs.len(),
                lent.len()
            );
            lent.iter()
                .map(|_| Err(BackendError::Device(why.clone().into())))
                .collect()
        }
        Err(e) if lent.len() == 1 => vec![Err(e)],
        Err(_) => {
            drop(batch);
            lent.iter()
                .map(|l| {
                    let mut one = [rows(l)];
                    model.forward_batch(&mut one).map(|mut v| v.remove(0))
                })
                .collect()
        }
    }
}

/// A model whose forwards meet other threads' in steps of its [`BatchHub`]; every other call goes
/// straight to the model (they touch only the caller's own state).
pub struct Batched<'a, B: Backend> {
    model: &'a B,
    hub: &'a BatchHub<B::State>,
    install: Option<Install<'a>>,
}

impl<B: Backend + Sync> Backend for Batched<'_, B>
where
    B::State: Send,
{
    type State = B::State;

    fn context(&self) -> usize {
        self.model.context()
    }

    fn vocab(&self) -> usize {
        self.model.vocab()
    }

    fn new_state(&self) -> Result<Self::State, BackendError> {
        self.model.new_state()
    }

    fn reserve(&self, state: &mut Self::State, positions: usize) -> Result<(), BackendError> {
        self.model.reserve(state, positions)
    }

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut Self::State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        let mut one = [SeqRows {
            tokens,
            start,
            state,
            wanted,
        }];
        self.forward_batch(&mut one).map(|mut v| v.remove(0))
    }

    fn forward_batch(
        &self,
        batch: &mut [SeqRows<'_, Self::State>],
    ) -> Result<Vec<ForwardOut>, BackendError> {
        self.hub.forward(self.model, self.install, batch)
    }

    fn begin_tape(&self, state: &mut Self::State) -> Result<(), BackendError> {
        self.model.begin_tape(state)
    }

    fn rollback_retaining(
        &self,
        state: &mut Self::State,
        keep: usize,
    ) -> Result<bool, BackendError> {
        self.model.rollback_retaining(state, keep)
    }

    fn last_logits(&self, state: &mut Self::State) -> Result<Option<Vec<f32>>, BackendError> {
        self.model.last_logits(state)
    }

    fn one_time_work(&self) -> u64 {
        self.model.one_time_work()
    }

    fn prefill_chunk(&self) -> usize {
        self.model.prefill_chunk()
    }
}
