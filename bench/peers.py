#!/usr/bin/env python3
"""Time what a user would pick instead of our kernels (PyTorch eager, torch.compile,
cuBLAS through torch, the SDPA backends), the way our Rust benches time ours.

Timing protocol (kept identical to the Rust benches so medians are comparable):
  * one untimed first call (for torch.compile this is where compilation happens,
    so compile time never lands in a sample),
  * `--warmup` untimed launches (default 10),
  * `--samples` timed samples (default 50); each sample is: synchronise the device,
    record a CUDA event on the current stream, make ONE call, record a second event,
    wait for it, and keep elapsed_time() in milliseconds.
  * Inputs are random (torch.randn after torch.manual_seed(--seed), printed) and
    rotated among enough copies that one pass over them is more than twice the L2
    (>= 50 MiB), so a sample never finds its inputs in L2. A set of inputs that is
    itself >= 256 MiB is used alone.

Because a sample starts right after a synchronisation, the host-side cost of the
call (Python dispatch, torch.compile guards) is inside the sample, exactly as the
launch cost of our Rust call is inside ours. `--hide-launch` instead queues a spin
kernel (torch.cuda._sleep) before the start event so only GPU time is measured;
the JSON's "timing" field says which protocol produced the numbers.

Usage:
  python3 bench/peers.py --out peers.json [--quick] [--only PREFIX[,PREFIX..]]
                         [--peer NAME[,NAME..]] [--samples N] [--warmup N]
                         [--seed S] [--hide-launch] [--list]

The output file is rewritten after every measurement, so a run cut short keeps
everything measured so far. Schema "rgk-bench-v1":
  {"schema", "device", "torch", ..., "results": [
     {"name", "peer", "samples_ms", "median_ms", "bytes", "flops", "error", "meta"}]}
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional

try:  # Keep the module importable (and --list usable) on machines without torch.
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - exercised only on GPU-less hosts
    torch = None
    F = None

SCHEMA = "rgk-bench-v1"
MIB = 1 << 20
GIB = 1 << 30
L2_FLOOR_BYTES = 50 * MIB          # H100 L2; the device's own figure is used if larger
ONE_COPY_BYTES = 256 * MIB         # an input set this big cannot stay in L2 anyway
DEFAULT_SEED = 1234
DEFAULT_WARMUP = 10
DEFAULT_SAMPLES = 50
QUICK_SAMPLES = 10
SLEEP_CYCLES = 2_000_000           # ~1 ms of spin at H100 clocks, covers host overhead
ERROR_MAX_CHARS = 2000
ELEM_SIZE = {"f32": 4, "f16": 2, "bf16": 2}
SDPA_BACKENDS = [                  # (peer name, torch.nn.attention.SDPBackend member)
    ("sdpa-flash", "FLASH_ATTENTION"),
    ("sdpa-cudnn", "CUDNN_ATTENTION"),
    ("sdpa-efficient", "EFFICIENT_ATTENTION"),
    ("sdpa-math", "MATH"),
]
ATTN_SHAPES = [(4, 8, 512, 64), (16, 16, 2048, 64), (16, 16, 2048, 128),
               (4, 16, 8192, 64), (4, 16, 8192, 128)]
ATTN_BWD_SHAPES = ATTN_SHAPES[1:]  # the training shapes (benches/benches/ops.rs attention_backward)
# The forward also at S 1k, 4k and 16k, D64 and D128 (benches/benches/ops.rs attention).
ATTN_FWD_SHAPES = ATTN_SHAPES + [(16, 16, 1024, 64), (16, 16, 1024, 128), (8, 16, 4096, 64),
                                 (8, 16, 4096, 128), (2, 16, 16384, 64), (2, 16, 16384, 128)]
SDPA_BWD_BACKENDS = SDPA_BACKENDS[:3]  # math materialises B H S^2 scores: tens of GiB here
# SDPA's flash backward adds dQ with atomics (arrival order) unless torch's deterministic mode is on,
# which switches it to its deterministic algorithm: the peer of our default (ordered) backward, where
# "sdpa-flash" is the peer of our nondeterministic mode.
FLASH_DETERMINISTIC = "sdpa-flash-det"


# --------------------------------------------------------------------------- cases

@dataclass
class Peer:
    """One alternative implementation. build() returns launch(input_set) -> any."""
    name: str
    build: Callable[[], Callable]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@dataclass
class Case:
    """One bench name: how to make one random input set, and the peers to time on it."""
    name: str
    bytes: Optional[int]
    flops: Optional[int]
    in_bytes: int                  # bytes of the inputs of one set, decides rotation
    make_set: Callable[[], tuple]  # inputs first, then any preallocated outputs
    peers: List[Peer]
    peak_memory: bool = False      # also report torch.cuda.max_memory_allocated of one call in meta
    samples: Optional[int] = None  # at most this many timed samples (slow cases), else --samples


def dtype_of(tag):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[tag]


def rand(shape, tag):
    return torch.randn(shape, device="cuda", dtype=dtype_of(tag))


def empty(shape, tag):
    return torch.empty(shape, device="cuda", dtype=dtype_of(tag))


def shape_str(shape):
    return "x".join(str(d) for d in shape)


def numel(shape):
    return math.prod(shape)


def eager(launch, peer="torch-eager"):
    return Peer(peer, build=lambda: launch)


def compiled(pure, n_inputs):
    """torch.compile (default mode) of `pure`, applied to the first n_inputs of a set.

    Dynamo is reset first: its cache is keyed by code object, so without a reset a
    second shape of the same op would recompile with dynamic shapes (a slower,
    different kernel from what a user with one fixed shape gets)."""
    def build():
        torch._dynamo.reset()
        fn = torch.compile(pure)
        return lambda s: fn(*s[:n_inputs])
    return Peer("torch-compile", build)


def copy_case(nbytes):
    n = nbytes // 4
    return Case(f"copy/f32/{nbytes}", bytes=2 * nbytes, flops=None, in_bytes=nbytes,
                make_set=lambda: (rand((n,), "f32"), empty((n,), "f32")),
                peers=[eager(lambda s: s[1].copy_(s[0]))])


def gemm_case(tag, m, n, k):
    es = ELEM_SIZE[tag]
    return Case(f"gemm/{tag}/{m}x{n}x{k}", bytes=(m * k + k * n + m * n) * es,
                flops=2 * m * n * k, in_bytes=(m * k + k * n) * es,
                make_set=lambda: (rand((m, k), tag), rand((k, n), tag), empty((m, n), tag)),
                peers=[eager(lambda s: torch.matmul(s[0], s[1], out=s[2]), "cublas-torch")])


def matmul_case(tag, m, n, k):
    """What a user calls for our matmul/<tag>/MxNxK (row-major C = A B): torch.matmul, eager (cuBLAS
    underneath). fp32 with TF32 off, as our f32 kernel is full fp32."""
    es = ELEM_SIZE[tag]
    return Case(f"matmul/{tag}/{m}x{n}x{k}", bytes=(m * k + k * n + m * n) * es,
                flops=2 * m * n * k, in_bytes=(m * k + k * n) * es,
                make_set=lambda: (rand((m, k), tag), rand((k, n), tag), empty((m, n), tag)),
                peers=[Peer("torch-eager", build=lambda: lambda s: torch.matmul(s[0], s[1], out=s[2]),
                            context=no_tf32 if tag == "f32" else contextlib.nullcontext)])


# (m, n, k) of the f16/bf16 matmul benches and their cuBLAS ceilings (benches/benches/ops.rs
# GEMM_SHAPES; the odd shape in f16 only).
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 1000)]


def matmul_cases(quick):
    shapes = [s for s in GEMM_SHAPES if not (quick and s[0] == 8192)]
    cases = [matmul_case(tag, *s) for s in shapes for tag in ("f16", "bf16")
             if tag == "f16" or s[0] % 8 == 0]
    return cases + [matmul_case("f32", 4096, 4096, 4096), matmul_tf32_case(4096, 4096, 4096),
                    matmul_tf32_case(4096, 4096, 4096, b_transposed=True)]


def matmul_tf32_case(m, n, k, b_transposed=False):
    """Our matmul/tf32 (Precision::Tf32) against torch.matmul at 'high' (cuBLAS TF32); with
    b_transposed, matmul/tf32_nt: B stored N x K and multiplied transposed (a linear layer's x W^T)."""
    b_shape = (n, k) if b_transposed else (k, n)
    op = (lambda s: torch.matmul(s[0], s[1].t(), out=s[2])) if b_transposed else \
        (lambda s: torch.matmul(s[0], s[1], out=s[2]))
    return Case(f"matmul/{'tf32_nt' if b_transposed else 'tf32'}/{m}x{n}x{k}",
                bytes=(m * k + k * n + m * n) * 4,
                flops=2 * m * n * k, in_bytes=(m * k + k * n) * 4,
                make_set=lambda: (rand((m, k), "f32"), rand(b_shape, "f32"), empty((m, n), "f32")),
                peers=[Peer("torch-eager-high", build=lambda: op,
                            context=lambda: matmul_precision("high"))])


def add_case(tag, shape):
    size = numel(shape) * ELEM_SIZE[tag]
    return Case(f"add/{tag}/{shape_str(shape)}", bytes=3 * size, flops=None, in_bytes=2 * size,
                make_set=lambda: (rand(shape, tag), rand(shape, tag), empty(shape, tag)),
                peers=[eager(lambda s: torch.add(s[0], s[1], out=s[2])),
                       compiled(lambda a, b: a + b, 2)])


def add_alloc_case(tag, shape):
    """The allocating call (ours: `ew::add`; PyTorch: `a + b` through its caching allocator)."""
    size = numel(shape) * ELEM_SIZE[tag]
    return Case(f"add_alloc/{tag}/{shape_str(shape)}", bytes=3 * size, flops=None, in_bytes=2 * size,
                make_set=lambda: (rand(shape, tag), rand(shape, tag)),
                peers=[eager(lambda s: torch.add(s[0], s[1]))])


def add_bcast_case(rows, cols):
    size, row = rows * cols * 4, cols * 4
    return Case(f"add_bcast/f32/{rows}x{cols}+{cols}", bytes=2 * size + row, flops=None,
                in_bytes=size + row,
                make_set=lambda: (rand((rows, cols), "f32"), rand((cols,), "f32"),
                                  empty((rows, cols), "f32")),
                peers=[eager(lambda s: torch.add(s[0], s[1], out=s[2])),
                       compiled(lambda a, b: a + b, 2)])


def gelu_case(shape):
    size = numel(shape) * 4
    return Case(f"gelu/f32/{shape_str(shape)}", bytes=2 * size, flops=None, in_bytes=size,
                make_set=lambda: (rand(shape, "f32"),),
                peers=[eager(lambda s: F.gelu(s[0])),
                       compiled(lambda x: F.gelu(x), 1)])


def reduce_lastdim_case(op, rows, cols):
    """sum/max over the last dim; amax is what a user wants for max values (x.max(-1)
    would also compute and write indices)."""
    eager_fns = {"sum": lambda s: torch.sum(s[0], dim=-1, out=s[1]),
                 "max": lambda s: torch.amax(s[0], dim=-1, out=s[1])}
    pure_fns = {"sum": lambda x: x.sum(-1), "max": lambda x: x.amax(-1)}
    size = rows * cols * 4
    return Case(f"{op}_lastdim/f32/{rows}x{cols}", bytes=size + rows * 4, flops=None,
                in_bytes=size,
                make_set=lambda: (rand((rows, cols), "f32"), empty((rows,), "f32")),
                peers=[eager(eager_fns[op]), compiled(pure_fns[op], 1)])


def sum_all_case(n):
    return Case(f"sum_all/f32/{n}", bytes=n * 4 + 4, flops=None, in_bytes=n * 4,
                make_set=lambda: (rand((n,), "f32"),),
                peers=[eager(lambda s: s[0].sum()), compiled(lambda x: x.sum(), 1)])


def softmax_case(tag, rows, cols):
    size = rows * cols * ELEM_SIZE[tag]
    return Case(f"softmax/{tag}/{rows}x{cols}", bytes=2 * size, flops=None, in_bytes=size,
                make_set=lambda: (rand((rows, cols), tag),),
                peers=[eager(lambda s: torch.softmax(s[0], dim=-1)),
                       compiled(lambda x: torch.softmax(x, dim=-1), 1)])


def softmax_backward_case(rows, cols):
    """dx = y * (dy - sum(dy * y)). Eager uses the aten kernel autograd itself calls;
    compile gets the same formula written out, as Inductor would see it in a backward."""
    size = rows * cols * 4

    def make():
        y = torch.softmax(rand((rows, cols), "f32"), dim=-1)  # a real softmax output
        return (y, rand((rows, cols), "f32"))

    def pure(y, dy):
        return y * (dy - (dy * y).sum(-1, keepdim=True))

    return Case(f"softmax_backward/f32/{rows}x{cols}", bytes=3 * size, flops=None,
                in_bytes=2 * size, make_set=make,
                peers=[eager(lambda s: torch.ops.aten._softmax_backward_data(
                           s[1], s[0], -1, s[0].dtype)),
                       compiled(pure, 2)])


def layernorm_case(rows, cols):
    """Affine layer norm (random weight and bias, eps 1e-5); weight and bias bytes
    are negligible and not counted."""
    size = rows * cols * 4

    def launch(s):
        return F.layer_norm(s[0], (cols,), s[1], s[2], 1e-5)

    return Case(f"layernorm/f32/{rows}x{cols}", bytes=2 * size, flops=None,
                in_bytes=size + 2 * cols * 4,
                make_set=lambda: (rand((rows, cols), "f32"), rand((cols,), "f32"),
                                  rand((cols,), "f32")),
                peers=[eager(launch),
                       compiled(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5), 3)])


def layernorm_bwd_case(rows, cols):
    """dx, dgamma, dbeta of an affine layer norm (eps 1e-5) from upstream dy, through autograd:
    the forward runs once in make(); each call is one backward (retain_graph keeps the saved
    mean/rstd, as our bench reuses the forward's). Bytes: read x and dy, write dx."""
    size = rows * cols * 4

    def make():
        x = rand((rows, cols), "f32").requires_grad_()
        w = rand((cols,), "f32").requires_grad_()
        b = rand((cols,), "f32").requires_grad_()
        y = F.layer_norm(x, (cols,), w, b, 1e-5)
        return (y, x, w, b, rand((rows, cols), "f32"))

    def launch(s):
        return torch.autograd.grad(s[0], (s[1], s[2], s[3]), s[4], retain_graph=True)

    def compiled_bwd():
        def build():
            torch._dynamo.reset()
            fwd = torch.compile(lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5))
            graphs = {}

            def run(s):
                key = id(s[1])
                if key not in graphs:  # one compiled forward per input set, then backward only
                    graphs[key] = fwd(s[1], s[2], s[3])
                return torch.autograd.grad(graphs[key], (s[1], s[2], s[3]), s[4],
                                           retain_graph=True)
            return run
        return Peer("torch-compile", build)

    return Case(f"layernorm_bwd/f32/{rows}x{cols}", bytes=3 * size, flops=None,
                in_bytes=2 * size, make_set=make, peers=[eager(launch), compiled_bwd()])


def embedding_case(vocab, cols, n):
    """F.embedding gather of n rows from a [vocab, cols] table (int64 ids, as torch wants them).
    Bytes: n x cols read + n x cols written."""
    size = n * cols * 4

    def make():
        return (torch.randint(0, vocab, (n,), device="cuda"), rand((vocab, cols), "f32"))

    return Case(f"embedding/f32/V{vocab}_D{cols}_N{n}", bytes=2 * size, flops=None,
                in_bytes=vocab * cols * 4 + n * 8, make_set=make,
                peers=[eager(lambda s: F.embedding(s[0], s[1])),
                       compiled(lambda i, w: F.embedding(i, w), 2)])


def embedding_bwd_case(vocab, cols, n):
    """dW of an embedding lookup from dy ([n, cols]): aten's dense backward (what autograd runs for
    F.embedding; sort-based and deterministic on CUDA). Bytes: dy read + dW written."""
    def make():
        return (rand((n, cols), "f32"), torch.randint(0, vocab, (n,), device="cuda"))

    def bwd(dy, ids):
        return torch.ops.aten.embedding_dense_backward(dy, ids, vocab, -1, False)

    return Case(f"embedding_bwd/f32/V{vocab}_D{cols}_N{n}", bytes=(n + vocab) * cols * 4,
                flops=None, in_bytes=n * cols * 4 + n * 8, make_set=make,
                peers=[eager(lambda s: bwd(s[0], s[1])), compiled(bwd, 2)])


@contextlib.contextmanager
def no_tf32():
    """fp32 matmuls in fp32 (no TF32 tensor-core rounding), restoring the previous setting."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def sgemm_case(m, n, k):
    """fp32 SGEMM ceiling (TF32 off), for the FLOP/s of the relevance kernels."""
    return Case(f"sgemm/f32/{m}x{n}x{k}", bytes=(m * k + k * n + m * n) * 4,
                flops=2 * m * n * k, in_bytes=(m * k + k * n) * 4,
                make_set=lambda: (rand((m, k), "f32"), rand((k, n), "f32"), empty((m, n), "f32")),
                peers=[Peer("cublas-torch", build=lambda: lambda s: torch.matmul(s[0], s[1], out=s[2]),
                            context=no_tf32)])


LRP_LOWER, LRP_UPPER = -2.0, 2.0   # the tanh preset: mono, range [-2, 2]


def lrp_torch(x, w, b, rel):
    """Relevance propagation through y = W x + b (docs/math/lrp.md), vectorised over rows, written
    the way docs/math/lrp.md reads: positive/negative parts with clamp, P and N as matmuls, mono saturation,
    stabilisation, Pa/Na, then the redistribution as matmuls over W's parts. x [R,I], w [O,I], b [O],
    rel [R,O] -> [R,I]."""
    xp, xn = x.clamp(min=0), x.clamp(max=0)
    wp, wn = w.clamp(min=0), w.clamp(max=0)
    p = xp @ wp.T + xn @ wn.T                  # sum_i max(c_i, 0)
    n = -(xp @ wn.T + xn @ wp.T)               # sum_i max(-c_i, 0)
    pb, nb = b.clamp(min=0), (-b).clamp(min=0)
    t = p + pb - n - nb
    p = torch.where(t < LRP_LOWER, torch.zeros_like(p), p)
    n = torch.where(t > LRP_UPPER, torch.zeros_like(n), n)
    p = torch.where(p == 0, torch.ones_like(p), p)
    n = torch.where(n == 0, torch.ones_like(n), n)
    d = p + n + pb + nb
    pa = ((p + pb) / d) * (p / (p + pb))
    na = ((n + nb) / d) * (n / (n + nb))
    cp, cn = rel * pa / p, rel * na / n        # [R, O]
    # sum_j cp_j max(c,0) + cn_j max(-c,0), with max(c,0) = xp wp + xn wn, max(-c,0) = -(xp wn + xn wp)
    return xp * (cp @ wp) + xn * (cp @ wn) - xp * (cn @ wn) - xn * (cn @ wp)


def lrp_per_row(x, w, b, rel):
    """The reference implementation's launch pattern: one call per row."""
    return torch.cat([lrp_torch(x[r:r + 1], w, b, rel[r:r + 1]) for r in range(x.shape[0])])


def lrp_case(rows, ni, no):
    """FLOPs counted as 2 R I O per pass, two passes (the same count as the Rust bench)."""
    def make():
        return (rand((rows, ni), "f32"), rand((no, ni), "f32"), rand((no,), "f32"),
                rand((rows, no), "f32"))

    def peer(name, fn):
        return Peer(name, build=lambda: lambda s: fn(*s), context=no_tf32)

    return Case(f"lrp/f32/R{rows}_I{ni}_O{no}", bytes=None, flops=4 * rows * ni * no,
                in_bytes=(rows * ni + no * ni + no + rows * no) * 4, make_set=make,
                peers=[peer("torch-eager", lrp_torch), peer("torch-per-row", lrp_per_row)])


def sdpa_context(backend):
    """The context that forces SDPA backend `backend` (None: torch's own dispatch choice)."""
    def context():
        if backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(getattr(SDPBackend, backend))
    return context


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for the block (warn_only off: torch's kernels take
    their deterministic algorithm or raise), the previous setting restored after."""
    before, warn_only = (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


def sdpa_peer_context(name, backend):
    """The context of SDPA peer `name`: `backend` forced and, for FLASH_DETERMINISTIC (a backward
    peer only), torch's deterministic mode on."""
    forced = sdpa_context(backend)
    if name != FLASH_DETERMINISTIC:
        return forced

    @contextlib.contextmanager
    def context():
        with forced(), deterministic_algorithms():
            yield
    return context


def sdpa_peer(peer, backend, causal):
    """SDPA with one backend forced (backend None = torch's own dispatch choice)."""
    def build():
        return lambda s: F.scaled_dot_product_attention(s[0], s[1], s[2], is_causal=causal)

    return Peer(peer, build, sdpa_context(backend))


def attn_case(tag, b, h, s, d, causal):
    """Forward attention, layout [B,H,S,D] contiguous, softmax scale 1/sqrt(D).
    bytes = minimal traffic (read q,k,v, write o) so a roofline can place it."""
    tensor = b * h * s * d * ELEM_SIZE[tag]
    flops = 4 * b * h * s * s * d // (2 if causal else 1)
    mask = "causal" if causal else "full"
    peers = [sdpa_peer("torch-eager", None, causal)]
    peers += [sdpa_peer(name, backend, causal) for name, backend in SDPA_BACKENDS]
    return Case(f"attn_fwd/{tag}/B{b}H{h}S{s}D{d}/{mask}", bytes=4 * tensor, flops=flops,
                in_bytes=3 * tensor,
                make_set=lambda: tuple(rand((b, h, s, d), tag) for _ in range(3)),
                peers=peers)


DECODE_SHAPES = [(1, 4096), (1, 32768), (1, 131072), (8, 8192), (16, 32768), (64, 4096),
                 (64, 16384)]           # (B, S_k) of benches/benches/ops.rs attention_decode
DECODE_D256_SHAPES = [(8, 8192), (64, 8192)]  # its D256 rows (16 query heads on 8)


def decode_peer(peer, backend):
    """SDPA decoding with grouped K/V (enable_gqa), one backend forced (None = torch's choice)."""
    def build():
        return lambda s: F.scaled_dot_product_attention(s[0], s[1], s[2], enable_gqa=True)

    return Peer(peer, build, sdpa_context(backend))


def attn_decode_case(tag, b, sk, hq=32, hkv=8, d=128):
    """One query row a sequence against a dense [B, Hkv, S_k, D] cache, Hq = 4 Hkv (Llama-3).
    bytes = K and V read once plus Q and O (the decoding goal's measure)."""
    kv = 2 * b * hkv * sk * d * ELEM_SIZE[tag]
    qo = 2 * b * hq * d * ELEM_SIZE[tag]
    peers = [decode_peer("torch-eager", None)]
    peers += [decode_peer(name, backend) for name, backend in SDPA_BACKENDS]
    return Case(f"attn_decode/{tag}/B{b}Hq{hq}Hkv{hkv}Sk{sk}D{d}", bytes=kv + qo,
                flops=4 * b * hq * sk * d, in_bytes=kv + qo // 2,
                make_set=lambda: (rand((b, hq, 1, d), tag), rand((b, hkv, sk, d), tag),
                                  rand((b, hkv, sk, d), tag)),
                peers=peers)


def attn_gqa_case(tag, b, hq, hkv, s, d, causal, backward):
    """Grouped-query attention through SDPA's enable_gqa (benches/benches/ops.rs attention_gqa):
    forward, or forward + backward through autograd, one backend forced."""
    mask = "causal" if causal else "full"
    fwd = 4 * b * hq * s * s * d // (2 if causal else 1)
    q_bytes, kv_bytes = (b * h * s * d * ELEM_SIZE[tag] for h in (hq, hkv))

    def peer(name, backend):
        def build():
            def run(x):
                q, k, v, d_o = x
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                if backward:
                    return torch.autograd.grad(o, (q, k, v), d_o)
                return o
            return run
        return Peer(name, build, sdpa_context(backend))

    def make():
        q, k, v = (rand(shape, tag).requires_grad_(backward)
                   for shape in ((b, hq, s, d), (b, hkv, s, d), (b, hkv, s, d)))
        return q, k, v, rand((b, hq, s, d), tag)

    op = "fwdbwd" if backward else "fwd"
    return Case(f"attn_gqa/{tag}/B{b}Hq{hq}Hkv{hkv}S{s}D{d}/{mask}/{op}",
                bytes=(6 * q_bytes + 4 * kv_bytes) if backward else 2 * q_bytes + 2 * kv_bytes,
                flops=fwd * 7 // 2 if backward else fwd, in_bytes=2 * q_bytes + 2 * kv_bytes,
                make_set=make,
                peers=[peer(name, backend) for name, backend in SDPA_BACKENDS[:2]])


def sdpa_rows_peer(name, backend, causal, backward, rows_first):
    """SDPA on a set (Q, K, V, dO), one backend forced: with `rows_first` the set is [B, S, H, D] (or
    nested [B, j, H, D]) and goes in through its transpose(1, 2) view; forward, or forward + backward
    through autograd (gradients of Q, K, V)."""
    def build():
        def run(x):
            q, k, v, d_o = x
            if rows_first:
                q, k, v, d_o = (t.transpose(1, 2) for t in (q, k, v, d_o))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            if backward:
                return torch.autograd.grad(o, (x[0], x[1], x[2]), d_o)
            return o
        return run
    return Peer(name, build, sdpa_peer_context(name, backend))


def attn_pass_case(name, backward, sizes, make, peers):
    """An attention case `name/fwd` or, with `backward`, `name/fwdbwd` (benches/benches/ops.rs
    LazySets::bench_passes names its twin): `sizes` = (bytes of one Q-sized tensor, forward FLOPs);
    bytes 4 tensors (10 with the backward), FLOPs the forward's (3.5x with the backward)."""
    tensor, fwd = sizes
    op = "fwdbwd" if backward else "fwd"
    return Case(f"{name}/{op}", bytes=10 * tensor if backward else 4 * tensor,
                flops=fwd * 7 // 2 if backward else fwd, in_bytes=4 * tensor,
                make_set=make, peers=peers)


def sdpa_layout_case(family, tag, b, h, s, d, layout, causal, backward):
    """SDPA (flash and cuDNN backends) on Q, K, V, dO of shape [B, H, S, D]: contiguous ("bhsd",
    "dense"), or [B, S, H, D] memory through its transpose(1, 2) view ("bshd", "packed": the rows of
    a packed batch of equal lengths); forward, or forward + backward through autograd. Named
    `family/tag/B.H.S.D./layout/mask/op` as benches/benches/ops.rs names the bench it stands beside."""
    mask = "causal" if causal else "full"
    fwd = 4 * b * h * s * s * d // (2 if causal else 1)
    tensor = b * h * s * d * ELEM_SIZE[tag]
    rows_first = layout in ("bshd", "packed")

    def make():
        shape = (b, s, h, d) if rows_first else (b, h, s, d)
        q, k, v = (rand(shape, tag).requires_grad_(backward) for _ in range(3))
        return q, k, v, rand(shape, tag)

    backends = SDPA_BACKENDS[:2] + ([(FLASH_DETERMINISTIC, "FLASH_ATTENTION")] if backward else [])
    return attn_pass_case(f"{family}/{tag}/B{b}H{h}S{s}D{d}/{layout}/{mask}", backward,
                          (tensor, fwd), make,
                          [sdpa_rows_peer(name, backend, causal, backward, rows_first)
                           for name, backend in backends])


def attn_window_case(tag, b, h, s, d, left, right, causal, backward):
    """A sliding window (benches/benches/ops.rs attention_windows): query i sees keys
    i - left..=i + right (right 0 when causal). Peers: SDPA with the window as a boolean mask
    (the efficient and cuDNN backends take masks; the flash backend does not), and FlexAttention
    (torch.compile'd flex_attention with the window's block mask, which skips blocks outside it);
    forward, or forward + backward through autograd. FLOPs: the visible pairs' 4 D each (3.5x that
    with the backward)."""
    mask_name = "causal" if causal else "full"
    right = 0 if causal else right
    tensor = b * h * s * d * ELEM_SIZE[tag]
    visible = sum(min(s - 1, i + right) - max(0, i - left) + 1 for i in range(s))
    fwd = 4 * b * h * visible * d

    def allowed():
        i = torch.arange(s, device="cuda")[:, None]
        j = torch.arange(s, device="cuda")[None, :]
        return (j >= i - left) & (j <= i + right)

    def sdpa_peer(name, backend):
        def build():
            mask = allowed()

            def run(x):
                q, k, v, d_o = x
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                if backward:
                    return torch.autograd.grad(o, (q, k, v), d_o)
                return o
            return run
        return Peer(name, build, sdpa_context(backend))

    def flex_peer():
        def build():
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            torch._dynamo.reset()

            def window(b_, h_, i, j):
                return (j >= i - left) & (j <= i + right)
            block_mask = create_block_mask(window, None, None, s, s, device="cuda")
            flex = torch.compile(flex_attention)

            def run(x):
                q, k, v, d_o = x
                o = flex(q, k, v, block_mask=block_mask)
                if backward:
                    return torch.autograd.grad(o, (q, k, v), d_o)
                return o
            return run
        return Peer("flex-attention", build)

    def make():
        q, k, v = (rand((b, h, s, d), tag).requires_grad_(backward) for _ in range(3))
        return q, k, v, rand((b, h, s, d), tag)

    return attn_pass_case(f"attn_window/{tag}/B{b}H{h}S{s}D{d}/L{left}R{right}/{mask_name}",
                          backward, (tensor, fwd), make,
                          [sdpa_peer("sdpa-efficient", "EFFICIENT_ATTENTION"),
                           sdpa_peer("sdpa-cudnn", "CUDNN_ATTENTION"), flex_peer()])


def attn_scores_case(family, tag, b, h, s, d, causal, backward):
    """Score modifications (benches/benches/ops.rs attention_scores): FlexAttention (torch.compile'd;
    SDPA has neither) with the logit softcap `50 tanh(score / 50)` (`attn_softcap`) or ALiBi's
    bias `-slope[h] |i - j|` with the geometric slopes `2^(-8 (h + 1) / H)` (`attn_alibi`) as its
    score modification, forward or forward + backward through autograd."""
    mask = "causal" if causal else "full"
    tensor = b * h * s * d * ELEM_SIZE[tag]
    fwd = 4 * b * h * s * s * d // (2 if causal else 1)
    alibi = family == "attn_alibi"

    def flex_peer():
        def build():
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            torch._dynamo.reset()
            slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)],
                                  device="cuda", dtype=torch.float32)

            def capped(score, b_, h_, i, j):
                return 50.0 * torch.tanh(score / 50.0)

            def biased(score, b_, h_, i, j):
                return score - slopes[h_] * (i - j).abs()

            def causal_mask(b_, h_, i, j):
                return j <= i
            block_mask = (create_block_mask(causal_mask, None, None, s, s, device="cuda")
                          if causal else None)
            flex = torch.compile(flex_attention)
            mod = biased if alibi else capped

            def run(x):
                q, k, v, d_o = x
                o = flex(q, k, v, score_mod=mod, block_mask=block_mask)
                if backward:
                    return torch.autograd.grad(o, (q, k, v), d_o)
                return o
            return run
        return Peer("flex-attention", build)

    def make():
        q, k, v = (rand((b, h, s, d), tag).requires_grad_(backward) for _ in range(3))
        return q, k, v, rand((b, h, s, d), tag)

    mod_tag = "geometric" if alibi else "c50"
    return attn_pass_case(f"{family}/{tag}/B{b}H{h}S{s}D{d}/{mod_tag}/{mask}", backward,
                          (tensor, fwd), make, [flex_peer()])


# Sequence lengths of the mixed packed batch of benches/benches/ops.rs attention_varlen_mixed.
VARLEN_MIXED_LENS = [4096, 256, 1024, 3072, 512, 2048, 128, 3584, 768, 1536, 2560, 384, 1792, 3328,
                     640, 2816]


def attn_varlen_mixed_case(tag, h, d, causal, backward):
    """A packed batch of unequal lengths (VARLEN_MIXED_LENS) through SDPA on nested (jagged) tensors:
    [B, j, H, D] transposed to [B, H, j, D], one backend forced (a backend that does not take nested
    tensors reports an error); forward, or forward + backward through autograd."""
    mask = "causal" if causal else "full"
    lens = VARLEN_MIXED_LENS
    total = sum(lens)
    tensor = total * h * d * ELEM_SIZE[tag]
    fwd = sum(4 * h * s * s * d for s in lens) // (2 if causal else 1)

    def make():
        def nested(grad):
            return torch.nested.nested_tensor([rand((n, h, d), tag) for n in lens],
                                              layout=torch.jagged, requires_grad=grad)
        q = nested(backward)
        # dO shares Q's ragged structure (O's), which a separately made nested tensor would not.
        return q, nested(backward), nested(backward), torch.randn_like(q).detach()

    return attn_pass_case(f"attn_varlen_mixed/{tag}/N{len(lens)}H{h}D{d}/{mask}", backward,
                          (tensor, fwd), make,
                          [sdpa_rows_peer(name, backend, causal, backward, True)
                           for name, backend in SDPA_BACKENDS[:2]])


def sdpa_bwd_peer(peer, backend, causal, forward_too):
    """SDPA backward through autograd with one backend forced. Backward alone: the forward runs on
    a set's first call (untimed: every ATTN_BWD_SHAPES set is >= 256 MiB, so there is one set, and
    its first call is the untimed one) and each call is one backward (retain_graph keeps the saved
    output and log-sum-exp, as our bench reuses the forward's). forward_too: forward and backward
    in each call."""
    def build():
        graphs = {}

        def run(s):
            q, k, v, d_o = s
            if forward_too:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return torch.autograd.grad(o, (q, k, v), d_o)
            if id(q) not in graphs:
                graphs[id(q)] = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return torch.autograd.grad(graphs[id(q)], (q, k, v), d_o, retain_graph=True)
        return run

    return Peer(peer, build, sdpa_peer_context(peer, backend))


def attn_bwd_case(tag, b, h, s, d, causal, forward_too=False, peak_memory=False):
    """Attention backward (attn_bwd) or forward + backward (attn_fwdbwd), [B,H,S,D] contiguous,
    scale 1/sqrt(D). FLOPs 2.5x (3.5x) the forward's; bytes: the backward reads q, k, v, o, dO and
    writes dq, dk, dv (8 tensors), the forward adds 4."""
    tensor = b * h * s * d * ELEM_SIZE[tag]
    fwd = 4 * b * h * s * s * d // (2 if causal else 1)
    mask = "causal" if causal else "full"
    op = "attn_fwdbwd" if forward_too else "attn_bwd"

    def make():
        qkv = tuple(rand((b, h, s, d), tag).requires_grad_() for _ in range(3))
        return qkv + (rand((b, h, s, d), tag),)

    return Case(f"{op}/{tag}/B{b}H{h}S{s}D{d}/{mask}", bytes=(12 if forward_too else 8) * tensor,
                flops=fwd * (7 if forward_too else 5) // 2, in_bytes=4 * tensor, make_set=make,
                peers=[sdpa_bwd_peer(name, backend, causal, forward_too)
                       for name, backend in
                       SDPA_BWD_BACKENDS + [(FLASH_DETERMINISTIC, "FLASH_ATTENTION")]],
                peak_memory=peak_memory, samples=5 if peak_memory else None)


# ----------------------------------------------------------------- clifford layers
# The same formulas as host/src/ops/clifford.rs (docs/math/clifford.md), written term by term:
# (output j, x blade i, y blade k, weight path p, sign).
CLIFFORD_TERMS = {
    2: [(0, 0, 0, 0, 1), (0, 1, 1, 3, 1), (0, 2, 2, 3, 1), (0, 3, 3, 7, -1),
        (1, 0, 1, 1, 1), (1, 1, 0, 4, 1), (1, 2, 3, 5, -1), (1, 3, 2, 8, 1),
        (2, 0, 2, 1, 1), (2, 1, 3, 5, 1), (2, 2, 0, 4, 1), (2, 3, 1, 8, -1),
        (3, 0, 3, 2, 1), (3, 1, 2, 6, 1), (3, 2, 1, 6, -1), (3, 3, 0, 9, 1)],
    3: [(0, 0, 0, 0, 1), (0, 1, 1, 4, 1), (0, 2, 2, 4, 1), (0, 3, 3, 4, 1),
        (0, 4, 4, 10, -1), (0, 5, 5, 10, -1), (0, 6, 6, 10, -1), (0, 7, 7, 16, -1),
        (1, 0, 1, 1, 1), (1, 1, 0, 5, 1), (1, 2, 4, 6, -1), (1, 3, 5, 6, -1),
        (1, 4, 2, 11, 1), (1, 5, 3, 11, 1), (1, 6, 7, 12, -1), (1, 7, 6, 17, -1),
        (2, 0, 2, 1, 1), (2, 1, 4, 6, 1), (2, 2, 0, 5, 1), (2, 3, 6, 6, -1),
        (2, 4, 1, 11, -1), (2, 5, 7, 12, 1), (2, 6, 3, 11, 1), (2, 7, 5, 17, 1),
        (3, 0, 3, 1, 1), (3, 1, 5, 6, 1), (3, 2, 6, 6, 1), (3, 3, 0, 5, 1),
        (3, 4, 7, 12, -1), (3, 5, 1, 11, -1), (3, 6, 2, 11, -1), (3, 7, 4, 17, -1),
        (4, 0, 4, 2, 1), (4, 1, 2, 7, 1), (4, 2, 1, 7, -1), (4, 3, 7, 8, 1),
        (4, 4, 0, 13, 1), (4, 5, 6, 14, -1), (4, 6, 5, 14, 1), (4, 7, 3, 18, 1),
        (5, 0, 5, 2, 1), (5, 1, 3, 7, 1), (5, 3, 1, 7, -1), (5, 2, 7, 8, -1),
        (5, 4, 6, 14, 1), (5, 5, 0, 13, 1), (5, 6, 4, 14, -1), (5, 7, 2, 18, -1),
        (6, 0, 6, 2, 1), (6, 1, 7, 8, 1), (6, 2, 3, 7, 1), (6, 3, 2, 7, -1),
        (6, 4, 5, 14, -1), (6, 5, 4, 14, 1), (6, 6, 0, 13, 1), (6, 7, 1, 18, 1),
        (7, 0, 7, 3, 1), (7, 1, 6, 9, 1), (7, 2, 5, 9, -1), (7, 3, 4, 9, 1),
        (7, 4, 3, 15, 1), (7, 5, 2, 15, -1), (7, 6, 1, 15, 1), (7, 7, 0, 19, 1)],
}
CLIFFORD_GRADES = {2: [0, 1, 1, 2], 3: [0, 1, 1, 1, 2, 2, 2, 3]}
CLIFFORD_PATHS = {2: 10, 3: 20}
# The full B x N grid {1024, 4096, 8192} x {128, 512, 1024}, the same as benches/benches/ops.rs. Every
# shape is its own torch.compile graph (static shapes, as a user with one shape gets), so the peers'
# time is mostly compilation: split a run with --only (e.g. "sgp_", then "fcgp_", then "layer_") when one
# call must stay short; report.py merges several peers files.
CLIFFORD_SWEEP = [(b, n) for b in (1024, 4096, 8192) for n in (128, 512, 1024)]
# Timed samples (at most) of the fcgp and Layer cases: up to tens of ms a call at the large shapes.
CLIFFORD_FEW_SAMPLES = 20


def grade_slices(dims):
    grades = CLIFFORD_GRADES[dims]
    return [(grades.index(g), len(grades) - grades[::-1].index(g)) for g in range(dims + 1)]


def mv_gelu(x):
    return x * (0.5 * (1.0 + torch.erf(x[0:1] * 0.7071067811865476)))


def grade_rms_norm(o, dims):
    """Per batch row and grade: r = sqrt(mean_n sum_{c in G} o_c^2 + 1e-6); o / r."""
    parts = []
    for a, b in grade_slices(dims):
        g = o[a:b]
        r = torch.sqrt((g * g).sum(0, keepdim=True).mean(-1, keepdim=True) + 1e-6)
        parts.append(g / r)
    return torch.cat(parts, 0)


def sgp_product(x, y, w, dims):
    """x, y (C, B, N), w (N, P): per-feature weighted geometric product."""
    outs = [None] * (1 << dims)
    for j, i, k, p, sign in CLIFFORD_TERMS[dims]:
        t = w[:, p] * x[i] * y[k]
        outs[j] = t * sign if outs[j] is None else (outs[j] + t if sign > 0 else outs[j] - t)
    return torch.stack(outs, 0)


def fcgp_product(x, y, w, dims):
    """w (P, N, M): pair terms sharing a weight and an output are summed, then mixed by a matmul."""
    pairs = {}
    for j, i, k, p, sign in CLIFFORD_TERMS[dims]:
        t = x[i] * y[k] * sign
        pairs[(j, p)] = t if (j, p) not in pairs else pairs[(j, p)] + t
    outs = [None] * (1 << dims)
    for (j, p), t in pairs.items():
        v = t @ w[p]
        outs[j] = v if outs[j] is None else outs[j] + v
    return torch.stack(outs, 0)


def clifford_fused(x, y, w, dims, fc=False):
    gx, gy = mv_gelu(x), mv_gelu(y)
    o = fcgp_product(gx, gy, w, dims) if fc else sgp_product(gx, gy, w, dims)
    return grade_rms_norm(o, dims)


def clifford_layer(x, lw, bias, w, dims, fc=False):
    """Per-grade linear map + bias (added to every component), then the fused sgp (or fcgp) op."""
    grades = CLIFFORD_GRADES[dims]
    y = torch.stack([x[c] @ lw[grades[c]] for c in range(len(grades))], 0) + bias
    return clifford_fused(x, y, w, dims, fc=fc)


@contextlib.contextmanager
def matmul_precision(mode):
    """torch.set_float32_matmul_precision(mode) while building and timing a peer, then restored."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(mode)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def clifford_layer_case(kind, dims, b, n, backward, tf32):
    """fcgp, layer (per-feature GP) or layerfc (fully connected GP): forward, or forward then the
    backward for every input and parameter from a fixed upstream gradient. f32 rows: peers at
    'highest' (fp32 matmuls, our default 3xTF32); tf32 rows: peers at 'high' (TF32, our Tf32)."""
    c, paths = 1 << dims, CLIFFORD_PATHS[dims]
    size = c * b * n * 4
    fc = kind in ("fcgp", "layerfc")

    def make():
        x = rand((c, b, n), "f32")
        if kind == "fcgp":
            ins = [x, rand((c, b, n), "f32"), rand((paths, n, n), "f32") / math.sqrt(n)]
        else:
            gp = rand((paths, n, n), "f32") / math.sqrt(n) if fc else rand((n, paths), "f32")
            ins = [x, rand((dims + 1, n, n), "f32") / math.sqrt(n * (dims + 1)),
                   torch.zeros((n,), device="cuda"), gp]
        if backward:
            ins = [t.requires_grad_() for t in ins] + [rand((c, b, n), "f32")]
        return tuple(ins)

    def fwd(*ins):
        if kind == "fcgp":
            return clifford_fused(*ins, dims, fc=True)
        return clifford_layer(*ins, dims, fc=fc)

    n_in = 3 if kind == "fcgp" else 4

    def launcher(fn):
        if not backward:
            return lambda s: fn(*s)
        return lambda s: torch.autograd.grad(fn(*s[:n_in]), s[:n_in], s[n_in])

    def peer(name, compile_it, mode):
        def build():
            if not compile_it:
                return launcher(fwd)
            torch._dynamo.reset()
            return launcher(torch.compile(fwd))
        return Peer(name, build, context=lambda: matmul_precision(mode))

    mode = "high" if tf32 else "highest"
    suffix = "-high" if tf32 else ""
    # Static shapes, as a user with one shape gets. (Dynamic-shape compilation, one graph for every B
    # and N, was measured 2.0x-2.5x slower than static at B4096 N512, docs/PERF_NOTES.md, so it is
    # no peer.) Compiling costs 2-25 s a shape and graph: choose shapes with --only.
    compiled = [peer("torch-compile" + suffix, True, mode)]
    slots = clifford_slots(dims) if fc else 0
    flops = 2 * slots * b * n * n + (0 if kind == "fcgp" else 2 * c * b * n * n)
    return Case(f"{kind}_{'fwdbwd' if backward else 'fwd'}/{'tf32' if tf32 else 'f32'}/{dims}d_B{b}_N{n}",
                bytes=None, flops=flops * (3 if backward else 1), in_bytes=(3 if backward else 2) * size,
                make_set=make, peak_memory=True, samples=CLIFFORD_FEW_SAMPLES,
                peers=[peer("torch-eager" + suffix, False, mode)] + compiled)


def clifford_peer(name, fn, compile_it):
    def build():
        if not compile_it:
            return fn
        torch._dynamo.reset()
        return torch.compile(fn)
    return Peer(name, build)


def sgp_fwd_case(dims, b, n):
    c = 1 << dims
    size = c * b * n * 4

    def make():
        return (rand((c, b, n), "f32"), rand((c, b, n), "f32"), rand((n, CLIFFORD_PATHS[dims]), "f32"))

    def fwd(x, y, w):
        return clifford_fused(x, y, w, dims)

    return Case(f"sgp_fwd/f32/{dims}d_B{b}_N{n}", bytes=3 * size, flops=None, in_bytes=2 * size,
                make_set=make, peak_memory=True,
                peers=[eager(lambda s: fwd(*s)),
                       compiled(fwd, 3)])


def sgp_fwdbwd_case(dims, b, n):
    """Forward, then backward for grad_x, grad_y and grad_weight from a fixed upstream gradient."""
    c = 1 << dims
    size = c * b * n * 4

    def make():
        return (rand((c, b, n), "f32").requires_grad_(), rand((c, b, n), "f32").requires_grad_(),
                rand((n, CLIFFORD_PATHS[dims]), "f32").requires_grad_(), rand((c, b, n), "f32"))

    def step(fn):
        def run(s):
            x, y, w, go = s
            return torch.autograd.grad(fn(x, y, w), (x, y, w), go)
        return run

    def fwd(x, y, w):
        return clifford_fused(x, y, w, dims)

    return Case(f"sgp_fwdbwd/f32/{dims}d_B{b}_N{n}", bytes=9 * size, flops=None, in_bytes=3 * size,
                make_set=make, peak_memory=True,
                peers=[Peer("torch-eager", lambda: step(fwd)),
                       Peer("torch-compile", lambda: (torch._dynamo.reset(), step(torch.compile(fwd)))[1])])


def clifford_slots(dims):
    return len({(j, p) for j, _, _, p, _ in CLIFFORD_TERMS[dims]})


def clifford_cases(quick):
    """sgp forward (headline shape), then sgp forward+backward over the sweep, then fcgp, the Layer
    with per-feature GP ("layer") and with fully connected GP ("layerfc"), forward, then
    forward+backward, f32 ('highest' peers) and tf32 ('high' peers), over the sweep with fewer
    samples: sgp first, so a run cut short keeps the sgp results. Eager and compiled at every shape
    (compiling fcgp and the Layer took 1.4 s (2D) and 5-6 s (3D) a shape on an H200; the sgp
    forward+backward 4-5 s (2D) and 18-21 s (3D)). Select with --only, e.g. "fcgp_fwdbwd/f32"."""
    sweep = [(4096, 512)] if quick else CLIFFORD_SWEEP
    cases = [sgp_fwd_case(dims, 4096, 512) for dims in (2, 3)]
    cases += [sgp_fwdbwd_case(dims, b, n) for dims in (2, 3) for b, n in sweep]
    for tf32 in (False, True):
        # Forwards first: they compile and run in a fraction of a forward+backward's time, so a
        # run cut short at its limit still has them.
        for backward in (False, True):
            for kind in ("fcgp", "layer", "layerfc"):
                for dims in (2, 3):
                    for b, n in sweep:
                        cases.append(clifford_layer_case(kind, dims, b, n, backward, tf32))
    return cases


def build_cases(quick):
    """Every bench, in run order (cheap ceilings first so they survive a time-out)."""
    if quick:
        return [copy_case(GIB), gemm_case("f16", 8192, 8192, 8192),
                add_case("f32", (8192, 8192)), add_bcast_case(8192, 8192),
                gelu_case((8192, 8192)), reduce_lastdim_case("sum", 8192, 8192),
                sum_all_case(67108864), reduce_lastdim_case("max", 8192, 8192),
                softmax_case("f32", 8192, 8192), softmax_backward_case(8192, 8192),
                layernorm_case(65536, 1024), attn_case("f16", 4, 8, 512, 64, False),
                sgemm_case(4096, 4096, 4096), lrp_case(64, 4096, 4096)] \
            + matmul_cases(True) + clifford_cases(True)
    cases = [copy_case(GIB)]
    cases += [gemm_case(tag, *s) for s in GEMM_SHAPES for tag in ("f16", "bf16")
              if tag == "f16" or s[0] % 8 == 0]
    cases += matmul_cases(False)
    cases += [add_case("f32", (8192, 8192)), add_alloc_case("f32", (8192, 8192))]
    cases += [add_case(tag, (16384, 8192)) for tag in ("f16", "bf16")]
    cases += [add_alloc_case(tag, (16384, 8192)) for tag in ("f16", "bf16")]
    cases += [add_bcast_case(8192, 8192), gelu_case((8192, 8192))]
    cases += [reduce_lastdim_case("sum", 8192, 8192), sum_all_case(67108864),
              reduce_lastdim_case("max", 8192, 8192)]
    cases += [softmax_case(tag, 8192, 8192) for tag in ("f32", "f16", "bf16")]
    cases += [softmax_case("f32", 65536, 1024), softmax_case("f32", 16384, 4096),
              softmax_backward_case(8192, 8192)]
    cases += [layernorm_case(87381, 768), layernorm_case(16384, 4096),
              layernorm_case(65536, 1024), layernorm_bwd_case(65536, 1024),
              embedding_case(50257, 768, 87381), embedding_case(50257, 4096, 16384),
              embedding_case(50257, 1024, 65536), embedding_bwd_case(50257, 1024, 65536)]
    cases += [sgemm_case(4096, 4096, 4096), lrp_case(64, 4096, 4096), lrp_case(1024, 4096, 4096)]
    cases += [attn_case(tag, b, h, s, d, causal)
              for tag in ("f16", "bf16") for (b, h, s, d) in ATTN_FWD_SHAPES
              for causal in (False, True)]
    cases += [attn_decode_case(tag, b, sk) for tag in ("f16", "bf16") for (b, sk) in DECODE_SHAPES]
    # Gemma-2 9B's decoding shape: 16 query heads on 8, D256.
    cases += [attn_decode_case("f16", b, sk, 16, 8, 256) for (b, sk) in DECODE_D256_SHAPES]
    cases += [attn_gqa_case("f16", 2, 32, hkv, 4096, 128, causal, backward)
              for hkv in (8, 32) for causal in (False, True) for backward in (False, True)]
    cases += [attn_varlen_mixed_case("f16", 16, 128, causal, backward)
              for causal in (False, True) for backward in (False, True)]
    # attention_varlen: the dense SDPA call of equal FLOPs beside the packed batch of equal lengths.
    cases += [sdpa_layout_case("attn_varlen", "f16", 8, 16, 2048, 128, layout, causal, backward)
              for layout in ("dense", "packed") for causal in (False, True)
              for backward in (False, True)]
    cases += [sdpa_layout_case("attn_layout", "f16", 2, 32, 4096, 128, layout, causal, backward)
              for layout in ("bhsd", "bshd") for causal in (False, True)
              for backward in (False, True)]
    cases += [attn_scores_case(family, "f16", 4, 16, 4096, d, causal, backward)
              for (family, d) in (("attn_softcap", 64), ("attn_softcap", 128), ("attn_softcap", 256),
                                  ("attn_alibi", 64), ("attn_alibi", 128))
              for causal in (False, True) for backward in (False, True)]
    cases += [attn_window_case("f16", 2, 16, 8192, 128, left, right, causal, backward)
              for (left, right, causal) in ((1024, 0, True), (512, 512, False))
              for backward in (False, True)]
    cases += [sdpa_layout_case("attn_hdim", "f16", 4, 16, 4096, d, "bhsd", causal, backward)
              for d in (32, 64, 96, 128, 192, 256) for causal in (False, True)
              for backward in (False, True)]
    cases += [attn_bwd_case(tag, b, h, s, d, causal)
              for tag in ("f16", "bf16") for (b, h, s, d) in ATTN_BWD_SHAPES
              for causal in (False, True)]
    cases += [attn_bwd_case(tag, b, h, s, d, causal, forward_too=True)
              for tag in ("f16", "bf16") for (b, h, s, d) in ATTN_BWD_SHAPES
              for causal in (False, True)]
    # The long sequence of benches/benches/ops.rs attention_backward_long, with peak memory.
    cases += [attn_bwd_case("f16", 1, 16, 32768, 128, causal, peak_memory=True)
              for causal in (False, True)]
    cases += clifford_cases(False)
    return cases


def select(cases, only, peers):
    """Keep cases whose name starts with one of `only`, and peers named in `peers`."""
    prefixes = [p for p in (only or "").split(",") if p]
    wanted = set(p for p in (peers or "").split(",") if p)
    kept = []
    for case in cases:
        if prefixes and not any(case.name.startswith(p) for p in prefixes):
            continue
        if wanted:
            case.peers = [p for p in case.peers if p.name in wanted]
        if case.peers:
            kept.append(case)
    return kept


# ------------------------------------------------------------------------ timing

def copies_needed(in_bytes, l2_bytes):
    """How many input sets to rotate so that one pass over them exceeds 2x L2."""
    if in_bytes >= ONE_COPY_BYTES:
        return 1
    return 2 * l2_bytes // max(in_bytes, 1) + 1


def time_samples(launch, sets, warmup, samples, sleep_cycles):
    """First call, warm-up, then timed samples; returns (samples_ms, first_call_s)."""
    t0 = time.perf_counter()
    launch(sets[0])
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    for i in range(warmup):
        launch(sets[(1 + i) % len(sets)])
    stream = torch.cuda.current_stream()
    times = []
    for i in range(samples):
        s = sets[(1 + warmup + i) % len(sets)]
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)  # GPU busy while the host queues the call
        start.record(stream)
        launch(s)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times, first_call_s


def describe_error(exc, caught_warnings):
    """Exception text plus any warnings (SDPA explains refusals only through them)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    notes = [str(w.message).strip() for w in caught_warnings]
    if notes:
        text += " | warnings: " + " | ".join(dict.fromkeys(notes))
    return text[:ERROR_MAX_CHARS]


def free_memory():
    try:
        torch.cuda.synchronize()
    except Exception:  # a sticky CUDA error; nothing left to free
        pass
    torch.cuda.empty_cache()


def result(case, peer, samples_ms=None, error=None, meta=None):
    samples_ms = samples_ms or []
    return {"name": case.name, "peer": peer, "samples_ms": samples_ms,
            "median_ms": statistics.median(samples_ms) if samples_ms else None,
            "bytes": case.bytes, "flops": case.flops, "error": error, "meta": meta or {}}


def measure_peer(case, peer, sets, args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with peer.context():
                launch = peer.build()
                n_samples = min(args.samples, case.samples or args.samples)
                samples, first_s = time_samples(launch, sets, min(args.warmup, n_samples), n_samples,
                                                SLEEP_CYCLES if args.hide_launch else 0)
            meta = {"copies": len(sets), "first_call_s": round(first_s, 3)}
            if case.peak_memory:
                meta.update(peak_memory(launch, sets[0]))
            return result(case, peer.name, samples, meta=meta)
        except Exception as exc:  # one failure must never lose the rest of the run
            err = describe_error(exc, caught)
    free_memory()
    return result(case, peer.name, error=err, meta={"copies": len(sets)})


def peak_memory(launch, inputs):
    """Device memory of one call, after the timed samples, on the first input set.

    peak_memory_above_inputs_bytes = max_memory_allocated() (peak since reset_peak_memory_stats(),
    taken right before the call) - memory_allocated() before the call. What was live before is the
    inputs (every rotated set) and nothing else of this case; the call's outputs are still held when
    the peak is read. So it is what the call needs at its high point: outputs, tensors saved for
    backward, temporaries. Sizes as PyTorch's caching allocator counts them (blocks rounded to 512
    bytes; its reserved-but-free cache is not counted). peak_memory_bytes is the raw peak, inputs
    included. Our bench writes the same key from its allocation counter (Gpu::memory_stats)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = launch(inputs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return {"peak_memory_bytes": peak, "peak_memory_above_inputs_bytes": peak - before}


def progress_line(index, total, entry):
    head = f"[{index}/{total}] {entry['name']} {entry['peer']}:"
    if entry["error"]:
        return f"{head} ERROR {entry['error'][:300]}"
    ms = entry["median_ms"]
    parts = [f"median {ms:.4f} ms", f"copies {entry['meta']['copies']}"]
    if entry["bytes"]:
        parts.append(f"{entry['bytes'] / ms / 1e6:.1f} GB/s")
    if entry["flops"]:
        parts.append(f"{entry['flops'] / ms / 1e9:.1f} TFLOP/s")
    if entry["meta"].get("first_call_s", 0) > 1:
        parts.append(f"first call {entry['meta']['first_call_s']:.1f} s")
    return f"{head} " + ", ".join(parts)


def run_case(case, args, l2_bytes, on_result):
    """Make the rotated input sets once, then time every peer on them."""
    torch.manual_seed(args.seed)  # every case reproducible on its own
    n = copies_needed(case.in_bytes, l2_bytes)
    try:
        sets = [case.make_set() for _ in range(n)]
    except Exception as exc:
        free_memory()
        for peer in case.peers:
            on_result(result(case, peer.name, error="input allocation: " + describe_error(exc, [])))
        return
    for peer in case.peers:
        on_result(measure_peer(case, peer, sets, args))
    del sets
    torch._dynamo.reset()  # drop compiled graphs before the next case
    free_memory()


# --------------------------------------------------------------------------- main

def write_json(path, doc):
    """Atomic rewrite, so a kill mid-write never leaves a truncated file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def l2_size():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return max(L2_FLOOR_BYTES, getattr(props, "L2_cache_size", 0) or 0)


def header(args, l2_bytes):
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {"schema": SCHEMA, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
            "seed": args.seed, "warmup": args.warmup, "samples": args.samples,
            "l2_bytes": l2_bytes, "quick": args.quick,
            "timing": ("cuda-events, sync, spin-kernel before start event (GPU time only)"
                       if args.hide_launch else
                       "cuda-events, sync before each sample (host call cost included)"),
            "results": []}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="peers.json", help="JSON output, rewritten after each result")
    p.add_argument("--quick", action="store_true", help="one shape per op, fewer samples")
    p.add_argument("--only", help="comma-separated bench-name prefixes to run")
    p.add_argument("--peer", help="comma-separated peer names to run (e.g. torch-eager)")
    p.add_argument("--samples", type=int, help=f"timed samples (default {DEFAULT_SAMPLES}, "
                                               f"{QUICK_SAMPLES} with --quick)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--hide-launch", action="store_true",
                   help="queue a spin kernel before each start event: GPU time only")
    p.add_argument("--list", action="store_true", help="print benches and peers, run nothing")
    args = p.parse_args(argv)
    if args.samples is None:
        args.samples = QUICK_SAMPLES if args.quick else DEFAULT_SAMPLES
    return args


def main(argv=None):
    args = parse_args(argv)
    cases = select(build_cases(args.quick), args.only, args.peer)
    if args.list:
        for case in cases:
            print(case.name, " ".join(p.name for p in case.peers))
        return 0
    if torch is None or not torch.cuda.is_available():
        sys.exit("peers.py needs PyTorch with a CUDA device")
    l2_bytes = l2_size()
    doc = header(args, l2_bytes)
    total = sum(len(c.peers) for c in cases)
    print(f"device {doc['device']}, torch {doc['torch']}, seed {args.seed}, "
          f"{len(cases)} benches / {total} measurements, samples {args.samples}, "
          f"warmup {args.warmup}, L2 {l2_bytes / MIB:.0f} MiB, timing: {doc['timing']}",
          flush=True)

    def on_result(entry):
        doc["results"].append(entry)
        write_json(args.out, doc)
        print(progress_line(len(doc["results"]), total, entry), flush=True)

    write_json(args.out, doc)
    t0 = time.perf_counter()
    for case in cases:
        run_case(case, args, l2_bytes, on_result)
    failed = sum(1 for r in doc["results"] if r["error"])
    print(f"done: {len(doc['results'])} results ({failed} errors) in "
          f"{time.perf_counter() - t0:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
