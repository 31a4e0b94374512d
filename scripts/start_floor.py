#!/usr/bin/env python3
"""What any CUDA program pays before its first kernel, to read `cargo xtask coldstart` against:
the driver's own start (dlopen libcuda, cuInit, retain and bind the primary context: what `Gpu::new`
does) and PyTorch's start (import, the CUDA context and a first tensor, then its first softmax). Each
in a fresh process, `CUDA_CACHE_DISABLE=1`, printed one line per process.

  python3 scripts/start_floor.py [REPS]
"""
import os, subprocess, sys

DRIVER = r'''
import ctypes, time
t0 = time.perf_counter(); cuda = ctypes.CDLL("libcuda.so.1"); t1 = time.perf_counter()
assert cuda.cuInit(0) == 0; t2 = time.perf_counter()
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0; t3 = time.perf_counter()
print(f"driver: dlopen {t1-t0:.4f} s, cuInit {t2-t1:.4f} s, primary context {t3-t2:.4f} s, total {t3-t0:.4f} s")
'''

TORCH = r'''
import time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
x = torch.randn(4096, 1024, device="cuda"); torch.cuda.synchronize(); t2 = time.perf_counter()
y = torch.softmax(x, -1); torch.cuda.synchronize(); t3 = time.perf_counter()
print(f"torch: import {t1-t0:.3f} s, context + first tensor {t2-t1:.3f} s, first softmax {t3-t2:.3f} s")
'''

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
env = dict(os.environ, CUDA_CACHE_DISABLE="1")
for code in (DRIVER, TORCH):
    for _ in range(reps):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr.strip().splitlines()[-1])
