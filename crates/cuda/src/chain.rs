//! Greedy decode steps queued back to back (`families::Backend::greedy_chain`): the host queues step k + 1
//! before it reads step k's token, so the GPU never waits for the host's round trip (copy back, wake-up,
//! stop checks, launch: 0.02-0.045 ms a token on the H200's hosts, runs 156 / 158).
//!
//! Algorithm. A chained step is the decode graph with two differences: its argmax kernel also writes the
//! step's token and position + 1 where the next step reads them (`argmax::launch_feeding`), and each GDN
//! layer reads S and the conv window from one buffer pair and leaves the new ones in the other
//! (`StepIo`: step j reads the state's own buffers when j is even, its alternates when odd). After queuing
//! step k + 1 the host waits only for step k's 8-byte [token, refused] copy (pinned, one event per step).
//! When the caller stops at step k's token, step k + 1 may already have run: its KV row lies past the
//! position (unread) and its GDN outputs went to the other pair, so dropping it costs nothing but its time.
//!
//! Invariant: after a chain of n kept steps the state is bit for bit what n `forward` calls of one row
//! would leave (the same kernels on the same inputs; only where S lives alternates), at position
//! start + n, with S and the windows back in the state's own buffers (`settle_alternates` when n is odd).

use cudarc::driver::{result, CudaEvent, CudaGraph, PinnedHostSlice};

use crate::buf::{bind, htod};
use crate::error::CudaError;
use crate::model::CudaModel;
use crate::state::{check_signature, CudaState, StepIo};

/// The step io of a chain's step j.
fn step_io(j: usize) -> StepIo {
    if j.is_multiple_of(2) {
        StepIo::MainToAlt
    } else {
        StepIo::AltToMain
    }
}

/// Where step j's [token, refused] pair is read back: pinned slots and their events on a GPU; on the
/// emulated device (whose launches complete as they are made) copied as each step is queued.
enum Readback {
    Gpu {
        pinned: PinnedHostSlice<i32>,
        events: [CudaEvent; 2],
    },
    Host([[i32; 2]; 2]),
}

impl CudaModel {
    /// See `families::Backend::greedy_chain` (and the module doc). `Ok(None)`: nothing ran (a tape is
    /// recording, chaining is off, or no step is asked for).
    pub fn greedy_chain(
        &self,
        first: u32,
        start: usize,
        state: &mut CudaState,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, CudaError> {
        check_signature(state, &self.signature)?;
        if max_steps == 0 || state.tape.is_some() || !self.opts.chain || self.opts.gemv_max_rows < 1
        {
            return Ok(None);
        }
        let end = start.saturating_add(max_steps);
        if end > self.context || end > state.capacity {
            return Err(CudaError::CapacityExceeded {
                start,
                n: max_steps,
                capacity: state.capacity.min(self.context),
            });
        }
        if first as usize >= self.vocab {
            return Err(families::ModelError::TokenOutOfRange {
                token: first,
                index: 0,
                vocab: self.vocab,
            }
            .into());
        }
        state.ensure_alternates()?;
        let dev = &*self.dev;
        let mut rb = match dev.gpu() {
            Ok(gpu) => {
                bind(dev)?;
                // SAFETY: written only by the copies below before it is read, after their events.
                let pinned = unsafe { gpu.ctx.alloc_pinned_with_flags::<i32>(4, 0) }
                    .map_err(CudaError::driver("allocating the chain's pinned readback"))?;
                let event = || {
                    gpu.ctx
                        .new_event(None)
                        .map_err(CudaError::driver("creating the chain's events"))
                };
                Readback::Gpu {
                    pinned,
                    events: [event()?, event()?],
                }
            }
            Err(_) => Readback::Host([[0; 2]; 2]),
        };
        if self.graph_ok() && state.chain_graphs.is_none() {
            state.chain_graphs = self.capture_chain(state)?;
        }
        htod(dev, state.one.ids.ptr, &[first as i32])?;
        htod(dev, state.one.start.ptr, &[start as i32])?;
        self.queue_step(state, &mut rb, 0)?;
        let mut queued = 1;
        let mut kept = 0;
        let outcome = loop {
            if queued < max_steps {
                // Step `queued` feeds on step `queued - 1`'s token, on the device.
                if let Err(e) = self.queue_step(state, &mut rb, queued) {
                    break Err(e);
                }
                queued += 1;
            }
            let (token, refused) = match self.read_step(&mut rb, kept) {
                Ok(pair) => pair,
                Err(e) => break Err(e),
            };
            kept += 1;
            if refused {
                break Err(CudaError::Unsupported {
                    what: format!(
                        "greedy decoding at position {}: the logits hold a NaN or +inf, or nothing above -inf",
                        start + kept - 1
                    ),
                });
            }
            if !on_token(token) || kept == max_steps {
                break Ok(());
            }
        };
        // Steps past `kept` ran into the other buffer pair: wait for them, keep the state where step
        // `kept` would read it.
        dev.synchronize()?;
        if kept % 2 == 1 {
            state.settle_alternates()?;
        }
        state.position = start + kept;
        outcome.map(|()| Some(kept))
    }

    /// Queues chain step j (its graph, or its launches) and the copy of its [token, refused] pair.
    fn queue_step(
        &self,
        state: &mut CudaState,
        rb: &mut Readback,
        j: usize,
    ) -> Result<(), CudaError> {
        let io = step_io(j);
        match &state.chain_graphs {
            Some(graphs) => graphs[j % 2]
                .launch()
                .map_err(CudaError::driver("launching a chained decode step"))?,
            None => self.decode_body(state, &mut None, io)?,
        }
        let dev = &*self.dev;
        if let Readback::Host(pairs) = rb {
            crate::buf::dtoh(dev, &mut pairs[j % 2], state.one.argmax.ptr)?;
        }
        if let Readback::Gpu { pinned, events } = rb {
            crate::segment::flush(dev)?;
            let gpu = dev.gpu()?;
            let slot = pinned
                .as_mut_slice()
                .map_err(CudaError::driver("the chain's pinned readback"))?;
            // SAFETY: slot j % 2 is not read until this copy's event completed, and not written again
            // before it was read (step j + 2's copy is queued after step j's pair was read).
            unsafe {
                result::memcpy_dtoh_async(
                    &mut slot[2 * (j % 2)..2 * (j % 2) + 2],
                    state.one.argmax.ptr,
                    gpu.stream.cu_stream(),
                )
            }
            .map_err(CudaError::driver("copying a chained step's token"))?;
            events[j % 2]
                .record(&gpu.stream)
                .map_err(CudaError::driver("recording a chained step's event"))?;
        }
        Ok(())
    }

    /// Waits for chain step j's pair: (token, refused).
    fn read_step(&self, rb: &mut Readback, j: usize) -> Result<(u32, bool), CudaError> {
        let pair = match rb {
            Readback::Gpu { pinned, events } => {
                events[j % 2]
                    .synchronize()
                    .map_err(CudaError::driver("waiting for a chained step"))?;
                let slot = pinned
                    .as_slice()
                    .map_err(CudaError::driver("the chain's pinned readback"))?;
                [slot[2 * (j % 2)], slot[2 * (j % 2) + 1]]
            }
            Readback::Host(pairs) => pairs[j % 2],
        };
        Ok((pair[0] as u32, pair[1] != 0))
    }

    /// The chain's two step graphs, or None when capture fails (its steps then launch directly).
    fn capture_chain(&self, state: &mut CudaState) -> Result<Option<[CudaGraph; 2]>, CudaError> {
        let a = self.capture(state, StepIo::MainToAlt);
        let b = self.capture(state, StepIo::AltToMain);
        Ok(match (a, b) {
            (Ok(Some(a)), Ok(Some(b))) => Some([a, b]),
            _ => None,
        })
    }
}
