//! Greedy decode steps queued back to back (`families::Backend::greedy_chain`): the host queues step k + 1
//! before it reads step k's token, so the GPU never waits for the host's round trip (copy back, wake-up,
//! stop checks, launch: 0.02-0.045 ms a token on the H200's hosts).
//!
//! Algorithm. A chained step is the decode graph with two differences: its argmax kernel also writes the
//! step's token and position + 1 where the next step reads them (`argmax::launch_feeding`), and each GDN
//! layer reads S and the conv window from one buffer pair and leaves the new ones in the other
//! (`StepIo`: step j reads the state's own buffers when j is even, its alternates when odd). The argmax
//! kernel also stores the [token, refused] pair in mapped host memory, so nothing but an event separates two
//! steps (a copy queued between them held the next one back as the round trip did: 4B 421.6 against 421.9
//! tok/s; stored by the kernel 418.4 against 411.7 stepped, and within ~4 us of the graph replayed
//! back to back). After queuing step k + 1 the host waits only for step k's event.
//! When the caller stops at step k's token, step k + 1 may already have run: its KV row lies past the
//! position (unread) and its GDN outputs went to the other pair, so dropping it costs nothing but its time.
//!
//! Invariant: after a chain of n kept steps the state is bit for bit what n `forward` calls of one row
//! would leave (the same kernels on the same inputs; only where S lives alternates), at position
//! start + n, with S and the windows back in the state's own buffers (`settle_alternates` when n is odd).

use cudarc::driver::{sys, CudaEvent, CudaGraph, PinnedHostSlice};

use crate::buf::{bind, htod};
use crate::device::CudaDevice;
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

/// Where the argmax kernel of step j leaves its [token, refused] pair: slot j % 2 of 4 i32 of host memory
/// (pinned and mapped on a GPU, so the kernel's stores cross the bus themselves: a copy between the steps
/// would hold the next one back), with an event per slot on a GPU; on the emulated or simulated device
/// plain host memory, written as each step is queued.
pub(crate) struct ChainBufs {
    /// The two step graphs (`StepIo::MainToAlt`, `AltToMain`), each with its slot's address.
    graphs: Option<[CudaGraph; 2]>,
    pinned: Option<PinnedHostSlice<i32>>,
    /// The slots on the emulated or simulated device (kept alive: `slots` points into it).
    _host: Box<[i32; 4]>,
    /// The slots' address as the kernels see it.
    slots: u64,
    events: Option<[CudaEvent; 2]>,
}

impl ChainBufs {
    fn new(dev: &CudaDevice) -> Result<ChainBufs, CudaError> {
        let mut host = Box::new([0i32; 4]);
        let Ok(gpu) = dev.gpu() else {
            let slots = host.as_mut_ptr() as u64;
            return Ok(ChainBufs {
                graphs: None,
                pinned: None,
                _host: host,
                slots,
                events: None,
            });
        };
        bind(dev)?;
        // SAFETY: the slots are written by the kernels and read after their events completed.
        let mut pinned = unsafe {
            gpu.ctx
                .alloc_pinned_with_flags::<i32>(4, sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .map_err(CudaError::driver("allocating the chain's mapped slots"))?;
        let ptr = pinned
            .as_mut_ptr()
            .map_err(CudaError::driver("the chain's mapped slots"))?;
        let mut slots: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live page-locked allocation made with CU_MEMHOSTALLOC_DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut slots, ptr.cast(), 0) }
            .result()
            .map_err(CudaError::driver("mapping the chain's slots"))?;
        let event = || {
            gpu.ctx
                .new_event(None)
                .map_err(CudaError::driver("creating the chain's events"))
        };
        Ok(ChainBufs {
            graphs: None,
            pinned: Some(pinned),
            _host: host,
            slots,
            events: Some([event()?, event()?]),
        })
    }

    /// The device address of slot j % 2.
    pub(crate) fn slot(&self, j: usize) -> u64 {
        self.slots + (8 * (j % 2)) as u64
    }

    /// Step j's pair, once its step completed (a GPU's event waited for).
    fn read(&self, j: usize) -> Result<(u32, bool), CudaError> {
        let at = 2 * (j % 2);
        let pair = match (&self.pinned, &self.events) {
            (Some(pinned), Some(events)) => {
                events[j % 2]
                    .synchronize()
                    .map_err(CudaError::driver("waiting for a chained step"))?;
                let p = pinned
                    .as_ptr()
                    .map_err(CudaError::driver("the chain's mapped slots"))?;
                // SAFETY: 4 i32 live for `pinned`'s lifetime; the step's stores to mapped memory are
                // visible once its event completed (CUDA's rule for mapped host memory).
                unsafe { [p.add(at).read_volatile(), p.add(at + 1).read_volatile()] }
            }
            _ => {
                let p = self.slots as *const i32;
                // SAFETY: on the emulated or simulated device `slots` is the address of `host`'s 4 i32,
                // which the launches (run as they are made) wrote through it.
                unsafe { [p.add(at).read_volatile(), p.add(at + 1).read_volatile()] }
            }
        };
        Ok((pair[0] as u32, pair[1] != 0))
    }
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
        if state.chain.is_none() {
            let mut bufs = ChainBufs::new(dev)?;
            if self.graph_ok() {
                let a = self.capture(state, StepIo::MainToAlt, bufs.slot(0), false);
                let b = self.capture(state, StepIo::AltToMain, bufs.slot(1), false);
                // Capture failing leaves the steps to direct launches.
                if let (Ok(Some(a)), Ok(Some(b))) = (a, b) {
                    bufs.graphs = Some([a, b]);
                }
            }
            state.chain = Some(bufs);
        }
        htod(dev, state.one.ids.ptr, &[first as i32])?;
        htod(dev, state.one.start.ptr, &[start as i32])?;
        self.queue_step(state, 0)?;
        let mut queued = 1;
        let mut kept = 0;
        let outcome = loop {
            if queued < max_steps {
                // Step `queued` feeds on step `queued - 1`'s token, on the device.
                if let Err(e) = self.queue_step(state, queued) {
                    break Err(e);
                }
                queued += 1;
            }
            let pair = match &state.chain {
                Some(bufs) => bufs.read(kept),
                None => Err(CudaError::Unsupported {
                    what: "a chain without its buffers".into(),
                }),
            };
            let (token, refused) = match pair {
                Ok(pair) => pair,
                Err(e) => break Err(e),
            };
            kept += 1;
            if refused {
                break Err(CudaError::RefusedRow {
                    position: start + kept - 1,
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

    /// Queues chain step j: its graph or its launches, then (on a GPU) its slot's event.
    fn queue_step(&self, state: &mut CudaState, j: usize) -> Result<(), CudaError> {
        let Some(bufs) = &state.chain else {
            return Err(CudaError::Unsupported {
                what: "a chain without its buffers".into(),
            });
        };
        let slot = bufs.slot(j);
        match &bufs.graphs {
            Some(g) => g[j % 2]
                .launch()
                .map_err(CudaError::driver("launching a chained decode step"))?,
            None => self.decode_body(state, &mut None, step_io(j), slot, false)?,
        }
        if let Some(events) = state.chain.as_ref().and_then(|b| b.events.as_ref()) {
            let dev = &*self.dev;
            crate::segment::flush(dev)?;
            events[j % 2]
                .record(&dev.gpu()?.stream)
                .map_err(CudaError::driver("recording a chained step's event"))?;
        }
        Ok(())
    }
}
