//! The f32 matmul on Hopper tensor cores (sm_90 build only): `C (+)= op(A) op(B) (+ bias)` with
//! `wgmma` m64n128k8 tf32 products and f32 accumulation, in 3xTF32 (`matmul_wg_tf32x3_*_f32`) or
//! TF32 (`matmul_wg_tf32_*_f32`) precision, either operand transposed, any M, N, K, batched over
//! grid z or split along the depth (the split-K finish of `tf32.rs` sums the slices). Tiles and the
//! design notes: `params::matmul_wg_tf32`.
//!
//! Roles, per CTA (384 threads, one 128 x 128 tile of C):
//! ```text
//! warp 0, thread 0 (copies): per k-tile kt: wait empty[s], expect A's and B's bytes on full[s],
//!     TMA A's and B's stored k-tiles (f32, 128-byte swizzle) into stage s
//! warps 1..=3 (converters): per k-tile: wait full[s]; rewrite B's tile as K-major tf32 hi (and
//!     lo) tiles of stage s; fence to the async proxy; arrive on converted[s] and empty[s]
//! warpgroups 1, 2 (consumers, rows 64 (w - 1)..): per k-tile: wait full[s]; read and split the
//!     A fragments of the 4 k8 steps; wait converted[s]; 12 (3xTF32) or 4 (TF32) wgmma; wait for
//!     them; add the partial (3xTF32); release stage s
//! then each consumer writes its 64 x 128 rows of C (bias, old C) or of the split's workspace
//! ```
//! The copies run `STAGES` k-tiles ahead; a stage's converted tiles are rewritten only after the
//! stage's next copy was issued, which waited for both consumers to release it. The two consumers
//! share the tensor cores: one's adds and fragment reads overlap the other's products.
//!
//! Every C element is one thread's fixed sequence of products and adds over k (and, when split, the
//! finishing kernel's fixed slice order): the same bits on every run.
use crate::dev::mbarrier::{MBarrier, PipeState, Pipeline};
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v4, st_shared_v4};
use crate::dev::sync::{sync_threads, sync_warp};
use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, lane_id, thread_idx_x};
use crate::dev::tma::TensorMapRef;
use crate::dev::wgmma::{
    Accumulator, SwizzledTile, commit, fence, fence_proxy_async, mma_tf32_rs_n128,
    set_max_registers_dec, set_max_registers_inc,
};
use crate::params::MatmulTf32;
use crate::params::lrp::v5::{split_tf32_fast, tf32_rna_bits};
use crate::params::matmul_wg_tf32::*;
use crate::unroll;

/// A K-major f32 tile of 128 rows by 32 floats (`BK`): one 128-byte swizzle panel, addressed as 64
/// 16-bit columns (element (r, k) at `elem_addr(r, 2 k)`). A stored `M x K`, B stored `N x K`, and
/// B's converted hi and lo tiles.
type KTile = SwizzledTile<128, 64>;
/// An outer-contiguous f32 tile of 32 k rows by 128 floats (four 128-byte panels): A stored
/// `K x M`, B stored `K x N`.
type OTile = SwizzledTile<32, 256>;

/// Shared tile `(rows, 16-bit cols)` of an operand's stored k-tile: k-contiguous ([`KTile`]) or
/// outer-contiguous ([`OTile`]); the box height of its tensor map is `rows`.
const fn raw_tile(k_contig: bool) -> (usize, usize) {
    if k_contig { (128, 64) } else { (32, 256) }
}

/// Address of stored element (outer index `o`, depth `k`) of an operand's raw tile.
#[inline(always)]
fn raw_addr<const KC: bool, const R: usize, const C: usize>(
    t: SwizzledTile<R, C>,
    o: u32,
    k: u32,
) -> u32 {
    if KC {
        t.elem_addr(o, 2 * k)
    } else {
        t.elem_addr(k, 2 * o)
    }
}

/// The tf32 parts of `v`: (round-to-nearest hi, lo) for 3xTF32, (hi, unused) for TF32.
#[inline(always)]
fn parts<const PASSES: u32>(v: u32) -> (u32, u32) {
    if PASSES == 3 {
        split_tf32_fast(f32::from_bits(v))
    } else {
        (tf32_rna_bits(v), 0)
    }
}

/// Converter thread `ct` (of `32 * CONVERTER_WARPS`): rewrites B's raw k-tile as the K-major tf32
/// tiles `hi` (and `lo` for 3xTF32), 16-byte chunk (row n, k chunk c) by chunk, two chunks a step
/// (both read before either is written, so their reads are in flight together). A warp's 32 chunks
/// are 4 whole rows (k-contiguous raw tile: 128 contiguous bytes a row in and out) or 32 rows at
/// one k chunk (outer-contiguous: each of the 4 reads is one 128-byte raw row; the writes of 8
/// lanes land on 8 swizzle positions): no bank conflicts either way.
#[inline(always)]
fn convert<const B_KC: bool, const PASSES: u32, const R: usize, const C: usize>(
    raw: SwizzledTile<R, C>,
    hi: KTile,
    lo: KTile,
    ct: u32,
) {
    const CHUNKS: u32 = BN * BK / 4;
    const STEP: u32 = 32 * CONVERTER_WARPS;
    let place = |task: u32| {
        if B_KC {
            (task / 8, task % 8)
        } else {
            (task % BN, task / BN)
        }
    };
    let read = |task: u32| {
        let (n, c) = place(task);
        // SAFETY: n < BN, 4 c + 3 < BK: inside the raw tile, which has landed (full barrier).
        if B_KC {
            unsafe { ld_shared_v4(raw_addr::<true, R, C>(raw, n, 4 * c)) }
        } else {
            let at = |i: u32| unsafe { u32::ld_shared(raw_addr::<false, R, C>(raw, n, 4 * c + i)) };
            [at(0), at(1), at(2), at(3)]
        }
    };
    let write = |task: u32, v: [u32; 4]| {
        let (n, c) = place(task);
        let mut h = [0u32; 4];
        let mut l = [0u32; 4];
        unroll!(i in [0, 1, 2, 3] {
            (h[i], l[i]) = parts::<PASSES>(v[i]);
        });
        // SAFETY: chunk (n, c) of the stage's converted tiles, one writer each; their previous
        // readers (the consumers' wgmma) released the stage before this round's copy was issued.
        unsafe {
            st_shared_v4(hi.chunk_addr(n, c), h);
            if PASSES == 3 {
                st_shared_v4(lo.chunk_addr(n, c), l);
            }
        }
    };
    let mut task = ct;
    while task < CHUNKS {
        let second = task + STEP < CHUNKS;
        let v0 = read(task);
        let v1 = if second { read(task + STEP) } else { [0; 4] };
        write(task, v0);
        if second {
            write(task + STEP, v1);
        }
        task += 2 * STEP;
    }
}

/// A consumer thread's A fragments of the 4 k8 steps of a raw A tile (rows `r0`, `r0 + 8`, depths
/// `8 s + q`, `+ 4`), split: `(hi, lo)` for 3xTF32, `(hi, _)` for TF32.
#[inline(always)]
fn a_fragments<const A_KC: bool, const PASSES: u32, const R: usize, const C: usize>(
    ta: SwizzledTile<R, C>,
    r0: u32,
    q: u32,
) -> ([[u32; 4]; 4], [[u32; 4]; 4]) {
    let mut hi = [[0u32; 4]; 4];
    let mut lo = [[0u32; 4]; 4];
    unroll!(s in [0, 1, 2, 3] {
        let k = 8 * s as u32 + q;
        // SAFETY: r0 + 8 < BM and k + 4 < BK: inside the tile, which has landed (full barrier).
        let at = |r: u32, k: u32| unsafe { u32::ld_shared(raw_addr::<A_KC, R, C>(ta, r, k)) };
        let v = [at(r0, k), at(r0 + 8, k), at(r0, k + 4), at(r0 + 8, k + 4)];
        unroll!(e in [0, 1, 2, 3] {
            (hi[s][e], lo[s][e]) = parts::<PASSES>(v[e]);
        });
    });
    (hi, lo)
}

/// The kernel body: `PASSES` 3 (3xTF32) or 1 (TF32); A stored `K x M` unless `A_KC` (`M x K`), B
/// stored `K x N` unless `B_KC` (`N x K`). Grid (N tiles, M tiles, batch or slices).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn matmul_wg_tf32<
    const PASSES: u32,
    const A_KC: bool,
    const B_KC: bool,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
>(
    map_a: TensorMapRef<AR, 3, 4>,
    map_b: TensorMapRef<BR, 3, 4>,
    bias: Slice<f32>,
    c: SliceMut<f32>,
    ws: SliceMut<f32>,
    p: MatmulTf32,
) {
    const { assert!(PASSES == 1 || PASSES == 3) };
    type Stage<const AR: usize, const AC: usize, const BR: usize, const BC: usize> =
        (SwizzledTile<AR, AC>, SwizzledTile<BR, BC>);
    const {
        assert!(
            Pipeline::<Stage<AR, AC, BR, BC>, { STAGES as usize }>::BYTES
                <= PIPELINE_BYTES as usize
        )
    };
    let base = dynamic_base();
    let pipe = Pipeline::<Stage<AR, AC, BR, BC>, { STAGES as usize }>::at(base);
    let converted = |s: u32| {
        let at = base + PIPELINE_BYTES + s * CONVERTED_BYTES;
        (KTile::at(at), KTile::at(at + TILE_BYTES))
    };
    let converted_bar =
        |s: u32| MBarrier::at(base + PIPELINE_BYTES + STAGES * CONVERTED_BYTES + 8 * s);
    let tid = thread_idx_x();
    if tid == 0 {
        // SAFETY: one thread, before the barrier below and any other use.
        unsafe {
            pipe.init(2 + CONVERTER_WARPS);
            for s in 0..STAGES {
                converted_bar(s).init(CONVERTER_WARPS);
            }
        }
        crate::dev::mbarrier::fence_init();
        map_a.prefetch();
        map_b.prefetch();
    }
    sync_threads();

    let mm = p.mm;
    let (n0, m0) = (block_idx_x() * BN, block_idx_y() * BM);
    let (z, split) = if p.splits > 1 {
        (0u32, block_idx_z())
    } else {
        (block_idx_z(), 0)
    };
    let k_begin = split * p.k_per_split;
    let k_end = {
        let e = k_begin as u64 + p.k_per_split as u64;
        if e < mm.k as u64 { e as u32 } else { mm.k }
    };
    let k_tiles = if k_end > k_begin {
        (k_end - k_begin).div_ceil(BK)
    } else {
        0
    };

    if tid < 128 {
        set_max_registers_dec::<PRODUCER_REGS>();
        if tid == 0 {
            let za = if mm.stride_a != 0 { z as i32 } else { 0 };
            let zb = if mm.stride_b != 0 { z as i32 } else { 0 };
            let mut at = PipeState::START;
            let mut kt = 0;
            while kt < k_tiles {
                let k0 = (k_begin + kt * BK) as i32;
                // SAFETY: the one copying thread; the two loads fill the stage's two tiles, exactly
                // the bytes announced; the maps' boxes are the tiles' (their types).
                unsafe {
                    let ((ta, tb), full) = pipe.producer_acquire(at);
                    if A_KC {
                        map_a.load(ta, k0, m0 as i32, za, full);
                    } else {
                        map_a.load(ta, m0 as i32, k0, za, full);
                    }
                    if B_KC {
                        map_b.load(tb, k0, n0 as i32, zb, full);
                    } else {
                        map_b.load(tb, n0 as i32, k0, zb, full);
                    }
                }
                at = at.next();
                kt += 1;
            }
        } else if tid >= 32 {
            let ct = tid - 32;
            let mut at = PipeState::START;
            let mut kt = 0;
            while kt < k_tiles {
                let (_, tb) = pipe.consumer_wait(at);
                let (hi, lo) = converted(at.stage);
                convert::<B_KC, PASSES, BR, BC>(tb, hi, lo, ct);
                fence_proxy_async();
                sync_warp(u32::MAX);
                if lane_id() == 0 {
                    // SAFETY: one arrival a converter warp on each barrier, after the whole warp
                    // read its raw chunks and fenced its writes (the warp barrier above).
                    unsafe {
                        converted_bar(at.stage).arrive();
                        pipe.consumer_release(at);
                    }
                }
                at = at.next();
                kt += 1;
            }
        }
    } else {
        set_max_registers_inc::<CONSUMER_REGS>();
        let wg = tid / 128 - 1;
        let elected = tid % 128 == 0;
        let (lane, w) = (lane_id(), (tid % 128) / 32);
        let (g, q) = (lane / 4, lane % 4);
        let r0 = 64 * wg + 16 * w + g;
        let mut acc = [0f32; 64];
        // 3xTF32's k-tile partial: each chain starts with scale-d = 0, so its old values are never
        // read (zeroed once here, outside any wgmma pipeline stage).
        let mut part = [0f32; 64];
        let mut at = PipeState::START;
        let mut kt = 0;
        // One k-tile: the products of stage `at` from fragments ($h, $l); while they run, the
        // next k-tile's fragments load (after the last k-tile, its own stage is read again and
        // not used, so every path defines them by loads); then the wait, the partial's add and the
        // stage's release. Evaluates to (next fragments, whether there is a next k-tile).
        macro_rules! k_tile {
            ($h:ident, $l:ident) => {{
                converted_bar(at.stage).wait(at.phase);
                let (hi, lo) = converted(at.stage);
                fence();
                if PASSES == 3 {
                    unroll!(s in [0, 1, 2, 3] {
                        let s = s as u32;
                        // SAFETY: the whole warpgroup, on converted tiles fenced by their writers
                        // before the `converted` barrier; they stay until this warpgroup releases
                        // the stage after the wait below. The small terms first: they are lost
                        // least to the chain's truncation.
                        unsafe {
                            mma_tf32_rs_n128(&mut part, &$l[s as usize], hi.desc_k_major(0, s), (s > 0) as u32);
                            mma_tf32_rs_n128(&mut part, &$h[s as usize], lo.desc_k_major(0, s), 1);
                            mma_tf32_rs_n128(&mut part, &$h[s as usize], hi.desc_k_major(0, s), 1);
                        }
                    });
                } else {
                    unroll!(s in [0, 1, 2, 3] {
                        let s = s as u32;
                        // SAFETY: as above.
                        unsafe { mma_tf32_rs_n128(&mut acc, &$h[s as usize], hi.desc_k_major(0, s), 1) };
                    });
                }
                commit();
                let next = at.next();
                let more = kt + 1 < k_tiles;
                let tn = if more {
                    pipe.consumer_wait(next).0
                } else {
                    pipe.stage(at.stage).0
                };
                let (nh, nl) = a_fragments::<A_KC, PASSES, AR, AC>(tn, r0, q);
                if PASSES == 3 {
                    part.wait::<0>();
                    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                        unroll!(e in [0, 1, 2, 3] {
                            acc[4 * i + e] += part[4 * i + e];
                        });
                    });
                } else {
                    acc.wait::<0>();
                }
                if elected {
                    // SAFETY: one thread a consumer; the wait above retired this stage's wgmma.
                    unsafe { pipe.consumer_release(at) };
                }
                at = next;
                kt += 1;
                (nh, nl, more)
            }};
        }
        if k_tiles > 0 {
            let (ta, _) = pipe.consumer_wait(at);
            let (mut ah, mut al) = a_fragments::<A_KC, PASSES, AR, AC>(ta, r0, q);
            // Two k-tiles a pass with their own fragment variables: the set that loads while a
            // k-tile's products run is never the set they read, not even through the loop's copy
            // (ptxas may give a loop-carried copy its source's registers, and then serializes the
            // wgmma whose operands are redefined in flight).
            loop {
                let (bh, bl, more) = k_tile!(ah, al);
                if !more {
                    break;
                }
                let (ch, cl, more) = k_tile!(bh, bl);
                if !more {
                    break;
                }
                (ah, al) = (ch, cl);
            }
        }

        // Epilogue: acc[4 j + 2 h + e] is row r0 + 8 h, column 8 j + 2 q + e of this tile.
        let has_bias = bias.len > 0;
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            unroll!(h in [0, 1] {
                let row = m0 + r0 + 8 * h as u32;
                unroll!(e in [0, 1] {
                    let col = n0 + 8 * j as u32 + 2 * q + e as u32;
                    if row < mm.m && col < mm.n {
                        let v = acc[4 * j + 2 * h + e];
                        if p.splits > 1 {
                            let at = (split as u64 * mm.m as u64 + row as u64) * mm.n as u64
                                + col as u64;
                            ws.set(at, v);
                        } else {
                            let at = z as u64 * mm.stride_c + row as u64 * mm.ldc + col as u64;
                            let mut v = v;
                            if has_bias {
                                v += bias.get(col as u64);
                            }
                            if mm.accumulate != 0 {
                                v += c.get(at);
                            }
                            c.set(at, v);
                        }
                    }
                });
            });
        });
    }
}

macro_rules! wg_tf32_entry_points {
    ($($name:ident, $passes:literal, $a_kc:literal, $b_kc:literal;)*) => {$(
        // One CTA per SM with a register cap at entry, which `setmaxnreg` needs.
        crate::launch_bounds!($name, THREADS, 1);
        crate::tensor_map_params!($name, 0, 1);
        /// `C (+)= op(A) op(B) (+ bias)` for one precision and storage combination (module doc):
        /// `a_map`, `b_map` are f32 tensor maps of the stored A and B (`host::ops::matmul`), grid
        /// (ceil(N / BN), ceil(M / BM), batch or `splits`), `THREADS` threads, `SMEM_BYTES` of
        /// dynamic shared memory. `ws` holds `splits * M * N` floats when split.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            _a_map: crate::params::TensorMapParam,
            _b_map: crate::params::TensorMapParam,
            bias: Slice<f32>,
            c: SliceMut<f32>,
            ws: SliceMut<f32>,
            p: MatmulTf32,
        ) {
            let map_a = crate::tensor_map_param!($name, 0, raw_tile($a_kc).0, 3, 4);
            let map_b = crate::tensor_map_param!($name, 1, raw_tile($b_kc).0, 3, 4);
            unsafe {
                matmul_wg_tf32::<$passes, $a_kc, $b_kc, { raw_tile($a_kc).0 }, { raw_tile($a_kc).1 }, { raw_tile($b_kc).0 }, { raw_tile($b_kc).1 }>(
                    map_a, map_b, bias, c, ws, p,
                )
            }
        }
    )*};
}

// `nn`: A stored M x K (k-contiguous), B stored K x N; `t` marks an operand stored transposed.
wg_tf32_entry_points! {
    matmul_wg_tf32x3_nn_f32, 3, true, false;
    matmul_wg_tf32x3_nt_f32, 3, true, true;
    matmul_wg_tf32x3_tn_f32, 3, false, false;
    matmul_wg_tf32x3_tt_f32, 3, false, true;
    matmul_wg_tf32_nn_f32, 1, true, false;
    matmul_wg_tf32_nt_f32, 1, true, true;
    matmul_wg_tf32_tn_f32, 1, false, false;
    matmul_wg_tf32_tt_f32, 1, false, true;
}
