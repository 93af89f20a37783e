//! Device memory as raw byte buffers with their device address, plus the copy and launch helpers every
//! other module uses. All work goes to the device's one stream, in order, so no per-buffer events are
//! needed: a kernel that reads a buffer always runs after the work queued before it.
//!
//! Invariant: a `DBuf`'s address stays valid (and unchanged) for the buffer's lifetime; kernels and
//! captured graphs hold addresses only of buffers that outlive them (see `state.rs`).

use cudarc::driver::{result, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use crate::device::CudaDevice;
use crate::error::CudaError;

/// Where a buffer's bytes live (held only to keep the allocation alive; accessed through `ptr`).
#[allow(dead_code)]
enum Storage {
    Device(CudaSlice<u8>),
    /// Host memory of the emulated device (u64 words, so every buffer is 8-byte aligned).
    Host(Vec<u64>),
    /// Bytes of another buffer (`DBuf::prefix`), owned by it.
    Alias,
}

/// A device allocation of `bytes` bytes at address `ptr` (a host address on the emulated device).
pub struct DBuf {
    _storage: Storage,
    pub ptr: u64,
    pub bytes: usize,
}

impl DBuf {
    /// A zero-filled buffer (at least one byte, so every buffer has a distinct address).
    pub fn zeros(dev: &CudaDevice, bytes: usize) -> Result<Self, CudaError> {
        let Ok(gpu) = dev.gpu() else {
            let words = vec![0u64; bytes.max(1).div_ceil(8)];
            let ptr = words.as_ptr() as u64;
            return Ok(DBuf {
                _storage: Storage::Host(words),
                ptr,
                bytes,
            });
        };
        let slice = gpu
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(CudaError::driver(format!("allocating {bytes} bytes")))?;
        let ptr = {
            let (p, _sync) = slice.device_ptr(&gpu.stream);
            p
        };
        Ok(DBuf {
            _storage: Storage::Device(slice),
            ptr,
            bytes,
        })
    }

    /// `count` f32 zeros.
    pub fn f32s(dev: &CudaDevice, count: usize) -> Result<Self, CudaError> {
        Self::zeros(dev, count * 4)
    }

    /// A buffer holding a copy of `data`.
    pub fn from_host<T: Copy>(dev: &CudaDevice, data: &[T]) -> Result<Self, CudaError> {
        let bytes = std::mem::size_of_val(data);
        let buf = Self::zeros(dev, bytes)?;
        htod(dev, buf.ptr, data)?;
        Ok(buf)
    }

    /// A new buffer with the same contents (device to device).
    pub fn duplicate(&self, dev: &CudaDevice) -> Result<Self, CudaError> {
        let copy = Self::zeros(dev, self.bytes)?;
        dtod(dev, copy.ptr, self.ptr, self.bytes)?;
        Ok(copy)
    }

    /// The first `bytes` bytes (at most all of them) as a buffer that owns nothing: whoever holds it
    /// keeps `self` alive at least as long (CudaMtp's reduced LM head holds the target model).
    pub(crate) fn prefix(&self, bytes: usize) -> DBuf {
        DBuf {
            _storage: Storage::Alias,
            ptr: self.ptr,
            bytes: bytes.min(self.bytes),
        }
    }

    /// Address of f32 element `i`.
    pub fn f32_at(&self, i: usize) -> u64 {
        self.ptr + 4 * i as u64
    }
}

/// Makes the device's context current on this thread (raw driver calls need it; cudarc's own calls
/// do it themselves), so a model can be driven from any thread. No-op on the emulated device.
pub(crate) fn bind(dev: &CudaDevice) -> Result<(), CudaError> {
    match dev.gpu() {
        Ok(gpu) => gpu
            .ctx
            .bind_to_thread()
            .map_err(CudaError::driver("binding the context to this thread")),
        Err(_) => Ok(()),
    }
}

/// Host to device; returns once `data` may be reused (pageable copies are staged by the driver).
pub fn htod<T: Copy>(dev: &CudaDevice, dst: u64, data: &[T]) -> Result<(), CudaError> {
    if data.is_empty() {
        return Ok(());
    }
    crate::segment::flush(dev)?;
    let Ok(gpu) = dev.gpu() else {
        // SAFETY: on the emulated device `dst` is the host address of a live buffer of at least
        // `size_of_val(data)` bytes (callers' invariant), disjoint from `data`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr().cast::<u8>(),
                dst as *mut u8,
                std::mem::size_of_val(data),
            )
        };
        return Ok(());
    };
    bind(dev)?;
    // SAFETY: `dst` is the address of a live allocation at least `size_of_val(data)` bytes long
    // (callers pass buffers sized for the data); the stream belongs to the same context.
    unsafe { result::memcpy_htod_async(dst, data, gpu.stream.cu_stream()) }
        .map_err(CudaError::driver("copying to the device"))
}

/// Device to host, waiting for the copy (and everything queued before it).
pub fn dtoh<T: Copy>(dev: &CudaDevice, out: &mut [T], src: u64) -> Result<(), CudaError> {
    if out.is_empty() {
        return Ok(());
    }
    crate::segment::flush(dev)?;
    let Ok(gpu) = dev.gpu() else {
        // SAFETY: as in `htod`, with the roles swapped.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src as *const u8,
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        return Ok(());
    };
    bind(dev)?;
    let bytes = std::mem::size_of_val(out);
    if bytes >= STAGED_DTOH_BYTES {
        if let Ok(mut staging) = gpu.staging.lock() {
            if staging.as_ref().is_none_or(|s| s.len() < bytes) {
                *staging = None;
                // SAFETY: the bytes are written by the copy below before they are read. Flags 0:
                // cached (write-combined memory would make the host's read back slow).
                *staging = Some(
                    unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(
                        CudaError::driver(format!("allocating {bytes} pinned bytes")),
                    )?,
                );
            }
            if let Some(pinned) = staging.as_mut() {
                let dst = pinned
                    .as_mut_slice()
                    .map_err(CudaError::driver("waiting for the pinned staging buffer"))?;
                // SAFETY: `src` addresses at least `bytes` live bytes (callers' invariant); the
                // staging buffer holds at least `bytes` and stays locked until the copy completed.
                unsafe {
                    result::memcpy_dtoh_async(&mut dst[..bytes], src, gpu.stream.cu_stream())
                }
                .map_err(CudaError::driver("copying to the host"))?;
                dev.synchronize()?;
                // SAFETY: both ranges hold `bytes` bytes and do not overlap (device-owned staging).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        dst.as_ptr(),
                        out.as_mut_ptr().cast::<u8>(),
                        bytes,
                    )
                };
                return Ok(());
            }
        }
    }
    // SAFETY: `src` addresses at least `size_of_val(out)` live bytes (callers' invariant); the host
    // slice stays borrowed until the synchronize below has completed the copy.
    unsafe { result::memcpy_dtoh_async(out, src, gpu.stream.cu_stream()) }
        .map_err(CudaError::driver("copying to the host"))?;
    dev.synchronize()
}

/// Device-to-host copies from this size go through the device's pinned staging buffer: a logits row
/// (608 KB) took 0.079 ms into pageable memory on the H200, ~8 GB/s.
const STAGED_DTOH_BYTES: usize = 64 * 1024;

/// Device to device, `bytes` bytes, queued on the stream.
pub(crate) fn dtod(dev: &CudaDevice, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
    if bytes == 0 {
        return Ok(());
    }
    crate::segment::flush(dev)?;
    let Ok(gpu) = dev.gpu() else {
        // SAFETY: both ranges lie inside live host buffers (callers' invariant); `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        return Ok(());
    };
    bind(dev)?;
    // SAFETY: both ranges lie inside live allocations (callers' invariant) and do not overlap.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, gpu.stream.cu_stream()) }
        .map_err(CudaError::driver("copying on the device"))
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device address.
    P(u64),
    I(i32),
    L(i64),
    U(u64),
    F(f32),
}

/// Launches kernel `name` with a 1-D block of `block` threads over `grid`.
pub fn launch(
    dev: &CudaDevice,
    name: &str,
    grid: (u32, u32, u32),
    block: u32,
    args: &[Arg],
) -> Result<(), CudaError> {
    launch_smem(dev, name, grid, block, 0, args)
}

/// [`launch`] with `shared` bytes of dynamic shared memory (at most 48 KiB without an opt-in attribute).
pub(crate) fn launch_smem(
    dev: &CudaDevice,
    name: &str,
    grid: (u32, u32, u32),
    block: u32,
    shared: u32,
    args: &[Arg],
) -> Result<(), CudaError> {
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        return Ok(());
    }
    // Queued GEMVs run first (segment.rs): the stream's order is the order operations were issued.
    crate::segment::flush(dev)?;
    if let Some(sim) = dev.sim() {
        return sim.launch(name, grid, block, shared, args);
    }
    let func = dev.kernel(name)?;
    if dev.pdl() {
        match launch_programmatic(dev, func, grid, block, shared, args) {
            Ok(()) => return Ok(()),
            // Not available here (driver, capture): plain launches from now on, reported by pdl_failure.
            Err(e) => dev.disable_pdl(format!("launching {name}: {e}")),
        }
    }
    let mut b = dev.gpu()?.stream.launch_builder(func);
    for a in args {
        match a {
            Arg::P(p) | Arg::U(p) => b.arg(p),
            Arg::I(i) => b.arg(i),
            Arg::L(l) => b.arg(l),
            Arg::F(f) => b.arg(f),
        };
    }
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    };
    // SAFETY: the argument list matches the kernel's C signature (each launcher in ops.rs mirrors its
    // kernel), and every address points into a live buffer sized for the shapes passed with it.
    unsafe { b.launch(cfg) }.map_err(CudaError::driver(format!("launching {name}")))?;
    Ok(())
}

/// Argument values in 8-byte slots, as cuLaunchKernel's kernelParams point to them (little-endian, so a
/// 4-byte parameter reads the low half of its slot).
pub(crate) fn arg_slots(args: &[Arg]) -> Vec<u64> {
    args.iter()
        .map(|a| match *a {
            Arg::P(p) | Arg::U(p) => p,
            Arg::I(i) => i as u32 as u64,
            Arg::L(l) => l as u64,
            Arg::F(f) => f.to_bits() as u64,
        })
        .collect()
}

/// cuLaunchKernelEx with programmatic stream serialization: the kernel may start before the previous
/// kernel in the stream has finished; it waits for it with griddepcontrol.wait (PDL_WAIT in
/// common.cuh). Inside stream capture this becomes a programmatic edge of the graph.
fn launch_programmatic(
    dev: &CudaDevice,
    func: &cudarc::driver::CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    shared: u32,
    args: &[Arg],
) -> Result<(), String> {
    let mut slots = arg_slots(args);
    let mut params: Vec<*mut std::ffi::c_void> =
        slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
    launch_ex(dev, func, grid, block, shared, &mut params, true, false)
}

/// cuLaunchKernelEx of `func` with kernel parameters `params` (one pointer per parameter, each to a
/// value of the parameter's size), with programmatic stream serialization when `programmatic`.
#[allow(clippy::too_many_arguments)]
fn launch_ex(
    dev: &CudaDevice,
    func: &cudarc::driver::CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    shared: u32,
    params: &mut [*mut std::ffi::c_void],
    programmatic: bool,
    cooperative: bool,
) -> Result<(), String> {
    use cudarc::driver::sys;
    let gpu = dev.gpu().map_err(|e| e.to_string())?;
    bind(dev).map_err(|e| e.to_string())?;
    // SAFETY: CUlaunchAttribute is a plain C struct/union; all-zero is a valid (empty) value.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    if programmatic {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if cooperative {
        // The driver refuses the launch unless every block can be resident at once (grid barriers).
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[n].value.cooperative = 1;
        n += 1;
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: gpu.stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: n as u32,
    };
    // SAFETY: `params` points to one live value per kernel parameter, in the kernel's order and of at
    // least its size (ops.rs / segment.rs mirror each kernel's signature); `cfg` and `attr` outlive the
    // call; every address argument is a live device buffer (callers' invariant, as for `launch`).
    let rc = unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            func.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    match rc {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// Launches kernel `name`, whose one parameter is a struct, with the struct's bytes `param` (8-byte
/// words, so its pointers are aligned), programmatically when the device launches so; `cooperative`:
/// all blocks resident at once or no launch.
pub(crate) fn launch_struct(
    dev: &CudaDevice,
    name: &str,
    grid: u32,
    block: u32,
    shared: u32,
    param: &[u64],
    cooperative: bool,
) -> Result<(), CudaError> {
    let mut words = param.to_vec();
    let mut params = [words.as_mut_ptr().cast::<std::ffi::c_void>()];
    if let Some(sim) = dev.sim() {
        return sim.launch_params(name, (grid, 1, 1), block, shared, &mut params);
    }
    let func = dev.kernel(name)?;
    launch_ex(
        dev,
        func,
        (grid, 1, 1),
        block,
        shared,
        &mut params,
        dev.pdl(),
        cooperative,
    )
    .map_err(|reason| CudaError::Unsupported {
        what: format!("launching {name}: {reason}"),
    })
}

/// Blocks for an element-wise kernel over `count` items (grid-stride loops cover the rest).
pub fn elementwise_grid(count: usize) -> (u32, u32, u32) {
    ((count.div_ceil(256)).clamp(1, 65_535) as u32, 1, 1)
}
