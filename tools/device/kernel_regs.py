#!/usr/bin/env python3
"""Registers and spills per kernel of the CUDA module, on this CPU machine (no GPU): compiles the module's
sources with NVRTC to PTX for compute_90 and runs ptxas -v for sm_90, as the runtime's NVRTC does on the
device. Kernels whose register count decides their speed (segment.cu's held kernels: ~160 of 168 allowed,
spills cost 0.05-0.14 ms a step, runs 95-101) are checked here before a device run.

Setup (pinned; the device has NVRTC 13, these are 12.9: counts can differ by a few registers):
  pip download --no-deps -d /tmp/nvw nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86
  mkdir -p /tmp/nvw/x && for w in /tmp/nvw/*.whl; do python3 -m zipfile -e "$w" /tmp/nvw/x; done
  chmod +x /tmp/nvw/x/nvidia/cuda_nvcc/bin/ptxas
Usage: python3 tools/device/kernel_regs.py [KERNEL_NAME_PART]   (from the repository root; ~45 s)
KEEP_CUBIN=/tmp/m.cubin keeps the cubin; SASS: `pip download --no-deps nvidia-cuda-nvdisasm==13.5.37`, then
  nvdisasm -fun NAME -c /tmp/m.cubin (the wheel's nvidia/cu13/bin/nvdisasm).
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile

X = os.environ.get("NVW", "/tmp/nvw/x/nvidia")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The order nvrtc.rs concatenates them in.
ORDER = ["common.cuh", "linear.cu", "linear_mma.cu", "misc.cu", "attention.cu", "attention_tc.cu", "gdn.cu",
         "gdn_chunk.cu", "moe.cu", "segment_sync.cuh", "segment.cu"]


def main():
    nv = ctypes.CDLL(f"{X}/cuda_nvrtc/lib/libnvrtc.so.12")
    cu = os.path.join(ROOT, "crates/cuda/src/cu")
    src = "".join(f"// ---- {n}\n" + open(os.path.join(cu, n)).read() + "\n" for n in ORDER)
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"m.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17"]
    rc = nv.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        print(log.value.decode())
        sys.exit(1)
    nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetPTX(prog, ptx)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.ptx")
        open(p, "wb").write(ptx.value)
        out = subprocess.run([f"{X}/cuda_nvcc/bin/ptxas", "-arch=sm_90", "-v", p, "-o", os.path.join(d, "m.cubin")],
                             capture_output=True, text=True)
        sizes = text_sizes(os.path.join(d, "m.cubin")) if out.returncode == 0 else {}
        if out.returncode == 0 and os.environ.get("KEEP_CUBIN"):
            # For SASS listings: nvdisasm from the pinned nvidia-cuda-nvdisasm wheel reads it.
            shutil.copy(os.path.join(d, "m.cubin"), os.environ["KEEP_CUBIN"])
    part = sys.argv[1] if len(sys.argv) > 1 else ""
    name = None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            continue
        if name and part in name and ("registers" in line or "spill" in line):
            code = f", {sizes[name]} bytes of code" if "registers" in line and name in sizes else ""
            print(f"{name:40s} {line.split('info    :')[-1].strip()}{code}")
    if out.returncode:
        print(out.stderr[-2000:])
        sys.exit(1)


def text_sizes(cubin):
    """Bytes of SASS per kernel: the sizes of the cubin's .text.NAME sections (ELF64). A kernel that
    runs once per layer starts with a cold instruction cache, so its code size shows in its latency."""
    import struct
    b = open(cubin, "rb").read()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names_off = secs[shstrndx][4]
    out = {}
    for sec in secs:
        nm = b[names_off + sec[0]:b.index(b"\0", names_off + sec[0])].decode()
        if nm.startswith(".text."):
            out[nm[len(".text."):]] = sec[5]
    return out


if __name__ == "__main__":
    main()
