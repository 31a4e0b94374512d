//! Matrix multiply `op(A) op(B)`, 2-D or batched 3-D, either operand transposed, any sizes, dispatched
//! by dtype and, for f32, by [`Precision`]:
//! - f32, [`Precision::Tf32x3`] / [`Precision::Tf32`], sm_90 build: `matmul_wg_tf32x3_*_f32` /
//!   `matmul_wg_tf32_*_f32` (`gpu/src/kernels/matmul/wg_tf32.rs`): `wgmma` m64n128k8 with tf32
//!   inputs, B written once as K-major tf32 parts (`matmul_wg_split_b_f32`; a TF32 product reads a
//!   B stored `N x K` in place), TMA copies of A's
//!   stored f32 tiles and of B's parts, A split in registers; sm_80 build: `matmul_tf32x3_*_f32` / `matmul_tf32_*_f32`
//!   (`gpu/src/kernels/matmul/tf32.rs`): `mma.m16n8k8`, a 3-stage `cp.async` pipeline. Both tile C
//!   in 128 x 128 and split along the depth (summed in a fixed order) when the output has too few
//!   tiles to fill the GPU. TF32 products at least 2048 deep whose 128 x 256 tiles take fewer waves
//!   of the GPU's SMs run `matmul_wg_tf32w_*_f32` on those tiles instead (`wgmma` m64n256k8; the
//!   rule is `gpu::params::matmul_wg_tf32::wide`);
//! - f32, [`Precision::Ieee`]: `matmul_simt_{nn,nt,tn,tt}_f32` (`gpu/src/kernels/matmul/simt.rs`):
//!   double-buffered shared-memory tiles, 8 x 16 register micro-tiles on CUDA cores, one fp32 fma a
//!   product;
//! - f16 / bf16: `matmul_tc_{nn,nt,tn,tt}_{f16,bf16}` (`gpu/src/kernels/matmul/tensor_core.rs`):
//!   256 x 128 x 64 tiles through a 3-stage `cp.async` pipeline, `ldmatrix` + `mma.m16n8k16` with f32
//!   accumulation, the result rounded once to the input dtype.
//!
//! All keep a fixed k order per element, so the same inputs give the same bits on every run.
//!
//! The crate-internal `gemm` is the same kernel on raw operands (offsets into larger buffers, leading
//! dims, `C += ...`, a bias row): the Clifford layers build their feature mixing on it. The
//! crate-internal `gemm_pairs` is the sm_90 kernels' body with an A built from two stored tiles
//! (`matmul_wg_pairs_*_f32`): the Clifford fc forward's pair terms, formed inside the product.
use gpu::params::matmul::MAX_GRID_YZ;
use gpu::params::matmul_f32v::{self as f32v, BM, BN};
use gpu::params::matmul_tc as tc;
use gpu::params::matmul_tf32 as tf;
use gpu::params::matmul_tma as tma;
use gpu::params::matmul_wg_tf32 as wg;
use gpu::params::{
    Matmul, MatmulTc, MatmulTf32, MatmulTma, RawSlice, RowAccess, SplitB, WG_PAIRS_PATH_BITS,
    WgPairs,
};

use crate::DType;
use crate::error::{Error, Result};
use crate::launch::{ByValue, launch_cfg, launch_cfg_large_smem};
use crate::ops::{aligned16, same_device_and_dtype};
use crate::tensor::Tensor;

/// Whether an operand enters the product as stored or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transpose {
    No,
    Yes,
}

/// How an f32 product is computed (f16/bf16 products always run on tensor cores with f32
/// accumulation). Errors against an f64 reference, measured on the shape grid of docs/math/matmul.md,
/// are tabulated in docs/PERF_NOTES.md.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// One fp32 fma a product on CUDA cores (IEEE single precision throughout).
    Ieee,
    /// "3xTF32": each operand split into two tf32 parts, `a b ~ a_lo b_hi + a_hi b_lo + a_hi b_hi`
    /// on tensor cores with f32 accumulation: fp32-class accuracy (docs/math/matmul.md). Operands
    /// whose rows are not 16-byte aligned (a leading dim or batch stride that is not a multiple of
    /// 4, or a view at an unaligned offset) run the [`Precision::Ieee`] kernel instead, which is at
    /// least as accurate.
    #[default]
    Tf32x3,
    /// One tf32 product (10-bit mantissas, as cuBLAS's TF32 mode and PyTorch's
    /// `float32_matmul_precision('high')`): about 1e-3 relative error. On sm_90 an operand stored
    /// k-contiguous (A as `M x K`, B as `N x K`, i.e. transposed) enters truncated to tf32 (the
    /// tensor core reads its f32 bits), the other orientation rounded (docs/math/matmul.md); a B
    /// past the copy engine's reach (a dim past 2^31) is rounded in either. The same alignment rule
    /// as [`Precision::Tf32x3`].
    Tf32,
}

/// Accumulation mode of [`gemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accumulate {
    /// `C = A B`
    Overwrite,
    /// `C += A B`
    Add,
}

/// One operand of [`gemm`]: its first element, leading dimension (elements between stored rows),
/// storage orientation and batch stride (0 broadcasts it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub raw: RawSlice,
    pub ld: u64,
    pub trans: Transpose,
    pub stride: u64,
}

/// `raw` advanced by `elems` f32 elements (the view of a sub-matrix starting there).
pub(crate) fn offset(raw: RawSlice, elems: u64) -> RawSlice {
    RawSlice {
        ptr: raw.ptr + elems * 4,
        len: raw.len.saturating_sub(elems),
    }
}

/// Sizes of one [`gemm`]: C is `m x n`, the inner dim `k`, `batch` products.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
}

/// The f32 kernel for a storage combination: entry name, threads a block and dynamic shared memory.
fn f32_kernel(ta: Transpose, tb: Transpose) -> (&'static str, u32, u32) {
    const NAMES: [&str; 4] = [
        "matmul_simt_nn_f32",
        "matmul_simt_nt_f32",
        "matmul_simt_tn_f32",
        "matmul_simt_tt_f32",
    ];
    let name = NAMES[2 * (ta == Transpose::Yes) as usize + (tb == Transpose::Yes) as usize];
    (name, f32v::CONFIG.threads(), f32v::CONFIG.smem_bytes())
}

/// `C (+)= op(A) op(B) (+ bias)` on raw operands. Callers guarantee that every addressed element lies
/// inside the given slices (the Clifford launchers derive all offsets from validated shapes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    gpu: &crate::Gpu,
    shape: GemmShape,
    a: Operand,
    b: Operand,
    c: Operand,
    bias: Option<RawSlice>,
    acc: Accumulate,
    precision: Precision,
) -> Result<()> {
    if tf32_operands(precision, &a, &b) {
        // The sm_90 build has only the wgmma kernels, which need tensor maps; a product the copy
        // engine cannot describe (an empty depth, a dim past 2^31) takes the IEEE kernel there.
        let hopper = gpu.ptx_arch() == "sm_90";
        let plan = if hopper {
            wg_tf32_plan(shape, &a, &b)?
        } else {
            None
        };
        if !hopper || plan.is_some() {
            return gemm_tf32(gpu, shape, a, (b, None), c, bias, acc, precision, plan);
        }
    }
    let (kernel, threads, smem) = f32_kernel(a.trans, b.trans);
    let Some((p, grid_y)) = gemm_params(shape, &a, &b, &c, acc)? else {
        return Ok(());
    };
    let GemmShape { n, batch, .. } = shape;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: ((n as u64).div_ceil(BN as u64) as u32, grid_y, batch as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    };
    let no_bias = RawSlice { ptr: 0, len: 0 };
    launch_cfg(
        gpu,
        kernel,
        cfg,
        &[
            &ByValue(a.raw),
            &ByValue(b.raw),
            &ByValue(bias.unwrap_or(no_bias)),
            &ByValue(c.raw),
            &ByValue(p),
        ],
    )
}

/// [`gemm`] over `shape.batch` products in which product `z` multiplies B's batch entry
/// `b_entry_of[z]` (entries `b.stride` apart) by A's and C's entry `z`: products that share a B
/// (the Clifford layers' per-grade weights, one product per component) in one launch of the sm_90
/// tensor-core kernels, whose B split pass then writes each distinct entry once. Elsewhere (other
/// builds, [`Precision::Ieee`], unaligned rows, more than [`MatmulTf32::MAX_GATHERED`] products)
/// it runs one [`gemm`] a product, with the same result.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_gathered(
    gpu: &crate::Gpu,
    shape: GemmShape,
    a: Operand,
    b: Operand,
    b_entry_of: &[u8],
    c: Operand,
    bias: Option<RawSlice>,
    acc: Accumulate,
    precision: Precision,
) -> Result<()> {
    debug_assert_eq!(b_entry_of.len(), shape.batch);
    let entries = b_entry_of
        .iter()
        .map(|&e| e as usize + 1)
        .max()
        .unwrap_or(0);
    if shape.batch > 1
        && shape.batch <= MatmulTf32::MAX_GATHERED
        && entries <= MatmulTf32::MAX_GATHERED
        && tf32_operands(precision, &a, &b)
        && gpu.ptx_arch() == "sm_90"
        && let Some(mut plan) = wg_tf32_plan(shape, &a, &b)?
    {
        plan.b_batch = entries;
        plan.b_entry_of = Some(pack_table(4, b_entry_of.iter().map(|&e| e as u64)));
        return gemm_tf32(
            gpu,
            shape,
            a,
            (b, None),
            c,
            bias,
            acc,
            precision,
            Some(plan),
        );
    }
    let at = |o: Operand, entry: usize| Operand {
        raw: offset(o.raw, entry as u64 * o.stride),
        stride: 0,
        ..o
    };
    for (z, &e) in b_entry_of.iter().enumerate() {
        let one = GemmShape { batch: 1, ..shape };
        gemm(
            gpu,
            one,
            at(a, z),
            at(b, e as usize),
            at(c, z),
            bias,
            acc,
            precision,
        )?;
    }
    Ok(())
}

/// B of a product whose stored rows (B's rows, or its columns when it is transposed) come from
/// equal blocks of one allocation, in the order `blocks` names them: stored row `r` is row
/// `r % rows` of block `blocks[r / rows]`, block `i` starting `i * stride` floats after the
/// operand's base. The Clifford fc products' B is the `(N, M)` weight blocks of their paths.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowBlocks<'a> {
    pub rows: usize,
    pub stride: u64,
    pub blocks: &'a [usize],
}

/// A [`RowBlocks`] in the split pass's form: `SplitB::{block_rows, block_of, block_stride}`.
#[derive(Clone, Copy, Debug)]
struct SplitGather {
    rows: u32,
    of: u64,
    stride: u64,
}

impl RowBlocks<'_> {
    /// The split pass's form, or `None` past its reach: no rows or rows past u32, more than
    /// `SPLIT_GATHER_MAX` blocks, a block index of `2^SPLIT_GATHER_BITS` or more.
    fn split_form(&self) -> Option<SplitGather> {
        let bits = gpu::params::SPLIT_GATHER_BITS;
        if self.blocks.len() > gpu::params::SPLIT_GATHER_MAX
            || self.blocks.iter().any(|&i| i >= 1 << bits)
        {
            return None;
        }
        Some(SplitGather {
            rows: u32::try_from(self.rows).ok().filter(|&r| r > 0)?,
            of: pack_table(bits, self.blocks.iter().map(|&i| i as u64)),
            stride: self.stride,
        })
    }
}

/// [`gemm`] of a single product (`shape.batch` 1) whose B is gathered from row blocks
/// (`b` the operand at block 0's place with the blocks' leading dim and orientation, `gather` the
/// blocks). The sm_90 tensor-core kernels read B through its tf32 parts, which the split pass
/// writes from the blocks in one launch, so the stacked B is never stored. Returns `Ok(false)`,
/// having launched nothing, where the product would take another kernel (other builds,
/// [`Precision::Ieee`], operands whose rows or blocks are not 16-byte aligned: the rule of
/// [`gemm`], so a gathered B runs the kernel its stacked copy would) or the gather does not fit the
/// split pass: the caller stacks B and calls [`gemm`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_b_gathered(
    gpu: &crate::Gpu,
    shape: GemmShape,
    a: Operand,
    (b, gather): (Operand, RowBlocks),
    c: Operand,
    bias: Option<RawSlice>,
    acc: Accumulate,
    precision: Precision,
) -> Result<bool> {
    let stored_rows = if b.trans == Transpose::No {
        shape.k
    } else {
        shape.n
    };
    // A caller's mistake, checked in release builds too: stored rows past the blocks would read
    // wrong blocks.
    let shaped =
        shape.batch == 1 && b.stride == 0 && gather.rows * gather.blocks.len() == stored_rows;
    debug_assert!(
        shaped,
        "a gathered B: one product, its stored rows the blocks' rows"
    );
    if !shaped
        || gpu.ptx_arch() != "sm_90"
        || !tf32_operands(precision, &a, &b)
        || !gather.stride.is_multiple_of(4)
    {
        return Ok(false);
    }
    let Some(split) = gather.split_form() else {
        return Ok(false);
    };
    let Some(plan) = wg_tf32_plan(shape, &a, &b)? else {
        return Ok(false);
    };
    gemm_tf32(
        gpu,
        shape,
        a,
        (b, Some(split)),
        c,
        bias,
        acc,
        precision,
        Some(plan),
    )?;
    Ok(true)
}

/// One term of an output component of [`gemm_pairs`]: the component of `ys` it multiplies, its
/// sign and its weight path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PairTerm {
    pub y: usize,
    pub neg: bool,
    pub path: usize,
}

/// The Clifford fc forward's feature mixing as one launch of `matmul_wg_pairs_*` (sm_90 build):
/// for every output component `j` of `out (C, B, M)`,
/// `out[j] = sum_t ±(x[t] * ys[y_t]) W[path_t]` over `terms[j]` (term `t` multiplies x's
/// component `t`; `*` elementwise over (b, n)), with `x` and `ys` `(C, B, N)` and the weights
/// `W (P, N, M)`, all f32 and contiguous; `make_ys` writes `ys` once the product is known to apply.
/// The kernel forms each pair term in registers from x's and ys's tiles in shared memory, so no
/// pair buffer is written; W's tf32 parts are written first, all paths in one split pass (`2 P N M` floats for
/// 3xTF32). Returns `Ok(false)`, having launched nothing, where it does not apply: other builds,
/// [`Precision::Ieee`], bases not 16-byte aligned, N not a multiple of 4, more than 8 components
/// or 32 paths, or a term table that is not C terms a component; the caller then takes the pair
/// buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_pairs(
    gpu: &crate::Gpu,
    (x, make_ys): (RawSlice, impl FnOnce() -> Result<Tensor>),
    (c, b, n): (usize, usize, usize),
    (weight, paths, m): (RawSlice, usize, usize),
    terms: &[Vec<PairTerm>],
    out: RawSlice,
    precision: Precision,
) -> Result<bool> {
    const OP: &str = "clifford fc forward";
    let tables_fit = c <= 8
        && terms.len() == c
        && terms
            .iter()
            .all(|j| j.len() == c && j.iter().all(|t| t.y < c && t.path < paths))
        && paths <= 1 << WG_PAIRS_PATH_BITS;
    if !tables_fit
        || gpu.ptx_arch() != "sm_90"
        || precision == Precision::Ieee
        || b == 0
        || n == 0
        || m == 0
        || !x.ptr.is_multiple_of(16)
        || !out.ptr.is_multiple_of(16)
    {
        return Ok(false);
    }
    let k_tiles = (n as u64).div_ceil(wg::BK as u64);
    let depth = c as u64 * k_tiles * wg::BK as u64;
    let view = |ptr: u64| crate::tma::Tensor3 {
        ptr,
        inner: n as u64,
        outer: b as u64,
        batch: c as u64,
        outer_stride: n as u64,
        batch_stride: (b * n) as u64,
    };
    if !crate::tma::tma_readable_f32(&view(x.ptr))
        || u32::try_from(b).is_err()
        || u32::try_from(m).is_err()
        || depth > u32::MAX as u64
        || m.div_ceil(32) as u64 > MAX_GRID_YZ
    {
        return Ok(false);
    }
    let tiles = wg::tiles(b as u64, m as u64, c as u64, wg::BN);
    if tiles > wg::MAX_TILES {
        return Err(Error::TooLarge {
            op: OP,
            what: "output tiles (B / 128 x M / 128 x components)",
            given: tiles,
            max: wg::MAX_TILES,
        });
    }
    let ys = make_ys()?;
    let map_x = crate::tma::sw128_map(OP, DType::F32, &view(x.ptr), wg::BM)?;
    let map_ys = crate::tma::sw128_map(OP, DType::F32, &view(ys.raw().ptr), wg::BM)?;
    // W as the products' B: the paths' `(N, M)` blocks as a batch of `K x N` matrices.
    let shape = GemmShape {
        m: b,
        n: m,
        k: n,
        batch: paths,
    };
    let w = Operand {
        raw: weight,
        ld: m as u64,
        trans: Transpose::No,
        stride: (n * m) as u64,
    };
    let tf32 = precision == Precision::Tf32;
    // Freed after the launch below is queued: the stream orders the kernel's reads first.
    let (_parts, map_hi, map_lo) = wg_tf32_parts(
        gpu,
        shape,
        (&w, None),
        paths,
        if tf32 { 1 } else { 3 },
        wg::BN,
    )?;
    let (mut k_neg, mut path_of) = ([0u32; 8], [0u64; 8]);
    for (j, comp) in terms.iter().enumerate() {
        k_neg[j] = pack_table(4, comp.iter().map(|t| t.y as u64 | (t.neg as u64) << 3)) as u32;
        path_of[j] = pack_table(WG_PAIRS_PATH_BITS, comp.iter().map(|t| t.path as u64));
    }
    let mm = Matmul {
        m: b as u32,
        n: m as u32,
        k: depth as u32,
        trans_a: 0,
        trans_b: 0,
        accumulate: 0,
        lda: 0,
        ldb: 0,
        ldc: m as u64,
        stride_a: 0,
        stride_b: 0,
        stride_c: (b * m) as u64,
    };
    let p = WgPairs {
        mm: MatmulTf32 {
            mm,
            splits: 1,
            k_per_split: depth as u32,
            b_gathered: 0,
            batch: c as u32,
            b_entry_of: 0,
        },
        k_tiles: k_tiles as u32,
        _pad: 0,
        k_neg,
        paths: path_of,
    };
    let sms = gpu.sm_count()?.max(1) as u64;
    launch_cfg_large_smem(
        gpu,
        WG_PAIRS_NAMES[tf32 as usize],
        cudarc::driver::LaunchConfig {
            grid_dim: (tiles.min(sms) as u32, 1, 1),
            block_dim: (wg::THREADS, 1, 1),
            shared_mem_bytes: wg::SMEM_BYTES,
        },
        &[
            &ByValue(map_x),
            &ByValue(map_ys),
            &ByValue(map_hi),
            &ByValue(map_lo),
            &ByValue(out),
            &ByValue(p),
        ],
    )?;
    Ok(true)
}

/// The launch parameters of one [`gemm`] and its row-tile count (grid y; both f32 kernels tile C in
/// 128 rows), or `None` for an empty product; sizes past the kernels' u32 indices or the grid's
/// limits are errors.
fn gemm_params(
    shape: GemmShape,
    a: &Operand,
    b: &Operand,
    c: &Operand,
    acc: Accumulate,
) -> Result<Option<(Matmul, u32)>> {
    const OP: &str = "matmul";
    const { assert!(BM == tf::BM) };
    let GemmShape { m, n, k, batch } = shape;
    if m == 0 || n == 0 || batch == 0 {
        return Ok(None);
    }
    let u32_of = |what: &'static str, v: usize| {
        u32::try_from(v).map_err(|_| Error::TooLarge {
            op: OP,
            what,
            given: v as u64,
            max: u32::MAX as u64,
        })
    };
    let (mu, nu, ku) = (u32_of("M", m)?, u32_of("N", n)?, u32_of("K", k)?);
    let grid_y = (m as u64).div_ceil(BM as u64);
    if grid_y > MAX_GRID_YZ || batch as u64 > MAX_GRID_YZ {
        return Err(Error::TooLarge {
            op: OP,
            what: "row tiles (M / 128) or batch",
            given: grid_y.max(batch as u64),
            max: MAX_GRID_YZ,
        });
    }
    let p = Matmul {
        m: mu,
        n: nu,
        k: ku,
        trans_a: (a.trans == Transpose::Yes) as u32,
        trans_b: (b.trans == Transpose::Yes) as u32,
        accumulate: (acc == Accumulate::Add) as u32,
        lda: a.ld,
        ldb: b.ld,
        ldc: c.ld,
        stride_a: a.stride,
        stride_b: b.stride,
        stride_c: c.stride,
    };
    Ok(Some((p, grid_y as u32)))
}

/// Whether the tensor-core f32 kernel can copy this operand's rows by 16-byte `cp.async`: an aligned
/// first element, leading dim and batch stride multiples of 4 floats.
fn tf32_rows(o: &Operand) -> bool {
    o.raw.ptr.is_multiple_of(16) && o.ld.is_multiple_of(4) && o.stride.is_multiple_of(4)
}

/// Whether a product in `precision` runs on the tensor-core f32 kernels: a tf32 precision and both
/// operands' rows copyable ([`tf32_rows`]); otherwise the [`Precision::Ieee`] kernel runs it.
fn tf32_operands(precision: Precision, a: &Operand, b: &Operand) -> bool {
    precision != Precision::Ieee && tf32_rows(a) && tf32_rows(b)
}

/// Small indices packed `bits` apart into one u64, entry `z` at bit `bits * z` (the kernels' gather
/// tables: `MatmulTf32::b_entry_of`, `SplitB::block_of`); the caller bounds the count and values.
fn pack_table(bits: u32, entries: impl IntoIterator<Item = u64>) -> u64 {
    entries
        .into_iter()
        .enumerate()
        .fold(0, |t, (z, e)| t | e << (bits as usize * z))
}

/// [`gemm`] on the tensor-core f32 kernels (operands passed [`tf32_rows`]): the Hopper kernels
/// when there is a [`WgPlan`] (B's tf32 parts are written first, its stored rows gathered from row
/// blocks where `gather` says: see [`gemm_b_gathered`]; TF32 reads a B stored `N x K` as it is:
/// [`wg_tf32_parts`]), the `mma.sync` ones (sm_80 build, no gather) otherwise; split along the depth per
/// `params::matmul_tf32::split_k` for a single product, with the partials in a workspace that
/// `matmul_splitk_finish_f32` sums in slice order.
#[allow(clippy::too_many_arguments)]
fn gemm_tf32(
    gpu: &crate::Gpu,
    shape: GemmShape,
    a: Operand,
    (b, gather): (Operand, Option<SplitGather>),
    c: Operand,
    bias: Option<RawSlice>,
    acc: Accumulate,
    precision: Precision,
    plan: Option<WgPlan>,
) -> Result<()> {
    debug_assert!(plan.is_some() || gather.is_none());
    const NAMES: [&str; 8] = [
        "matmul_tf32x3_nn_f32",
        "matmul_tf32x3_nt_f32",
        "matmul_tf32x3_tn_f32",
        "matmul_tf32x3_tt_f32",
        "matmul_tf32_nn_f32",
        "matmul_tf32_nt_f32",
        "matmul_tf32_tn_f32",
        "matmul_tf32_tt_f32",
    ];
    let Some((mm, grid_y)) = gemm_params(shape, &a, &b, &c, acc)? else {
        return Ok(());
    };
    let GemmShape { m, n, k, batch } = shape;
    let b_entry_of = plan.and_then(|p| p.b_entry_of);
    let (splits, k_per_split) = if batch == 1 && b_entry_of.is_none() {
        tf::split_k(m as u64, n as u64, k as u64)
    } else {
        (1, mm.k)
    };
    let p = MatmulTf32 {
        mm,
        splits,
        k_per_split,
        b_gathered: b_entry_of.is_some() as u32,
        batch: batch as u32,
        b_entry_of: b_entry_of.unwrap_or(0),
    };
    let none = RawSlice { ptr: 0, len: 0 };
    let bias = bias.unwrap_or(none);
    let workspace = if splits > 1 {
        Some(crate::Tensor::empty(
            gpu,
            &[splits as usize * m * n],
            crate::DType::F32,
        )?)
    } else {
        None
    };
    let ws = workspace.as_ref().map_or(none, |t| t.raw());
    let grid_dim = (
        (n as u64).div_ceil(tf::BN as u64) as u32,
        grid_y,
        if splits > 1 { splits } else { batch as u32 },
    );
    if let Some(plan) = plan {
        const { assert!(wg::BM == tf::BM && wg::BN == tf::BN) };
        let tf32 = precision == Precision::Tf32;
        let passes = if tf32 { 1 } else { 3 };
        let sms = gpu.sm_count()?.max(1) as u64;
        let entries = grid_dim.2 as u64;
        // (A wide launch is never split: enough wide tiles to fill the GPU leave `split_k` at 1.)
        let wide = tf32 && splits == 1 && wg::wide(m as u64, n as u64, k as u64, entries, sms);
        let bn = if wide { wg::BN_WIDE } else { wg::BN };
        // Freed after the launch below is queued: the stream orders the kernel's reads first.
        let (_parts, map_hi, map_lo) =
            wg_tf32_parts(gpu, shape, (&b, gather), plan.b_batch, passes, bn)?;
        // Persistent: at most one CTA an SM walks the tiles (`wg::tiles`).
        let tiles = wg::tiles(m as u64, n as u64, entries, bn);
        if tiles > wg::MAX_TILES {
            return Err(Error::TooLarge {
                op: "matmul",
                what: "output tiles (M / 128 x N / 128 x batch or depth slices)",
                given: tiles,
                max: wg::MAX_TILES,
            });
        }
        let a_t = (a.trans == Transpose::Yes) as usize;
        let (name, smem) = if wide {
            (WG_WIDE_NAMES[a_t], wg::SMEM_BYTES_WIDE)
        } else {
            (WG_NAMES[2 * tf32 as usize + a_t], wg::SMEM_BYTES)
        };
        launch_cfg_large_smem(
            gpu,
            name,
            cudarc::driver::LaunchConfig {
                grid_dim: (tiles.min(sms) as u32, 1, 1),
                block_dim: (wg::THREADS, 1, 1),
                shared_mem_bytes: smem,
            },
            &[
                &ByValue(plan.map_a),
                &ByValue(map_hi),
                &ByValue(map_lo),
                &ByValue(bias),
                &ByValue(c.raw),
                &ByValue(ws),
                &ByValue(p),
            ],
        )?;
    } else {
        let index = 4 * (precision == Precision::Tf32) as usize
            + 2 * (a.trans == Transpose::Yes) as usize
            + (b.trans == Transpose::Yes) as usize;
        launch_cfg_large_smem(
            gpu,
            NAMES[index],
            cudarc::driver::LaunchConfig {
                grid_dim,
                block_dim: (tf::THREADS, 1, 1),
                shared_mem_bytes: tf::SMEM_BYTES,
            },
            &[
                &ByValue(a.raw),
                &ByValue(b.raw),
                &ByValue(bias),
                &ByValue(c.raw),
                &ByValue(ws),
                &ByValue(p),
            ],
        )?;
    }
    if splits > 1 {
        // A thread a chunk of four elements (`matmul_splitk_finish_f32`).
        let chunks = ((m * n) as u64).div_ceil(4);
        let blocks = chunks
            .div_ceil(tf::FINISH_THREADS as u64)
            .min(8 * tf::TARGET_BLOCKS) as u32;
        launch_cfg(
            gpu,
            "matmul_splitk_finish_f32",
            cudarc::driver::LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (tf::FINISH_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            &[&ByValue(bias), &ByValue(c.raw), &ByValue(ws), &ByValue(p)],
        )?;
    }
    Ok(())
}

/// The Hopper f32 kernels (`matmul_wg_*`, sm_90 build): [3xTF32, TF32] x [A stored `M x K`,
/// A stored `K x M`].
const WG_NAMES: [&str; 4] = [
    "matmul_wg_tf32x3_n_f32",
    "matmul_wg_tf32x3_t_f32",
    "matmul_wg_tf32_n_f32",
    "matmul_wg_tf32_t_f32",
];

/// The Hopper TF32 kernels on 128 x 256 tiles (`params::matmul_wg_tf32::wide`): A stored `M x K`,
/// A stored `K x M`.
const WG_WIDE_NAMES: [&str; 2] = ["matmul_wg_tf32w_n_f32", "matmul_wg_tf32w_t_f32"];

/// The Hopper pair-term products ([`gemm_pairs`]): 3xTF32, TF32.
const WG_PAIRS_NAMES: [&str; 2] = ["matmul_wg_pairs_tf32x3_f32", "matmul_wg_pairs_tf32_f32"];

/// A product the Hopper f32 kernels take: A's tensor map and the geometry of B's tf32 parts.
#[derive(Clone, Copy)]
struct WgPlan {
    map_a: gpu::params::TensorMapParam,
    /// Batch entries of B (1 when B is broadcast).
    b_batch: usize,
    /// B's entry of each product, 4 bits a product ([`gemm_gathered`]); `None`: entry `z` (or the
    /// broadcast one).
    b_entry_of: Option<u64>,
}

/// The [`WgPlan`] of a product, when it is not empty, the copy engine can read the stored A (16-byte
/// aligned base, leading dim and batch stride: always so for operands that passed [`tf32_rows`],
/// unless a dim is past 2^31) and B's split pass fits its grid (N below 2^21); `None` otherwise. A
/// stored A is `[batch][rows][cols]` with its leading dim as row stride, a box of `BM` rows of 32 k
/// when k-contiguous, `BK` rows of 32 m otherwise; batch stride 0 broadcasts it.
fn wg_tf32_plan(shape: GemmShape, a: &Operand, b: &Operand) -> Result<Option<WgPlan>> {
    const OP: &str = "matmul";
    let GemmShape { m, n, k, batch } = shape;
    if m == 0 || n == 0 || k == 0 || batch == 0 || n.div_ceil(32) as u64 > MAX_GRID_YZ {
        return Ok(None);
    }
    let (rows, cols, box_rows) = if a.trans == Transpose::No {
        (m, k, wg::BM)
    } else {
        (k, m, wg::BK)
    };
    let va = crate::tma::Tensor3 {
        ptr: a.raw.ptr,
        inner: cols as u64,
        outer: rows as u64,
        batch: if a.stride != 0 { batch as u64 } else { 1 },
        outer_stride: a.ld,
        batch_stride: if a.stride != 0 {
            a.stride
        } else {
            a.ld * rows as u64
        },
    };
    // K is one of A's dims, so this also keeps B's parts (rows of K) inside the copy engine's range.
    if !crate::tma::tma_readable_f32(&va) {
        return Ok(None);
    }
    Ok(Some(WgPlan {
        map_a: crate::tma::sw128_map(OP, DType::F32, &va, box_rows)?,
        b_batch: if b.stride != 0 { batch } else { 1 },
        b_entry_of: None,
    }))
}

/// Writes B's tf32 parts (`matmul_wg_split_b_f32`; `b_batch` entries of B, [`WgPlan::b_batch`];
/// B's stored rows gathered from row blocks where `gather` says: [`gemm_b_gathered`]) into a fresh
/// buffer, rows [`wg::parts_pitch`] floats apart, and returns it with the tensor maps of its `hi`
/// and `lo` planes (TF32: `hi` twice), boxes of `bn` rows (the kernel's tile columns). A TF32
/// product whose B is stored `N x K` in one piece (k contiguous, the layout the kernels read)
/// writes no parts: both maps are B's own, and the tensor core reads B's stored
/// f32 bits truncated to tf32, as it reads an A stored `M x K`. That saves the split pass, a read
/// and a write of all of B.
fn wg_tf32_parts(
    gpu: &crate::Gpu,
    shape: GemmShape,
    (b, gather): (&Operand, Option<SplitGather>),
    b_batch: usize,
    passes: u32,
    bn: u32,
) -> Result<(
    Option<Tensor>,
    gpu::params::TensorMapParam,
    gpu::params::TensorMapParam,
)> {
    const OP: &str = "matmul";
    let GemmShape { n, k, .. } = shape;
    let pitch = wg::parts_pitch(k as u64);
    if passes == 1 && gather.is_none() && b.trans == Transpose::Yes {
        let stored = crate::tma::Tensor3 {
            ptr: b.raw.ptr,
            inner: k as u64,
            outer: n as u64,
            batch: b_batch as u64,
            outer_stride: b.ld,
            batch_stride: if b.stride != 0 {
                b.stride
            } else {
                b.ld * n as u64
            },
        };
        // A broadcast B (stride 0) under a gather (`b_entry_of`, `b_batch` > 1) has no stride to
        // step the map's batch by: its entries come from the split pass, every one a copy of B.
        // Otherwise readable for operands that passed `tf32_rows` (a stored B's leading dim is at
        // least k), unless a dim is past 2^31 or a stride past the copy engine's range.
        if (b.stride != 0 || b_batch == 1) && crate::tma::tma_readable_f32(&stored) {
            let map = crate::tma::sw128_map(OP, DType::F32, &stored, bn)?;
            return Ok((None, map, map));
        }
    }
    let plane = b_batch as u64 * n as u64 * pitch;
    let planes = if passes == 3 { 2 } else { 1 };
    let parts = Tensor::empty(gpu, &[planes * plane as usize], DType::F32)?;
    let (block_rows, block_of, block_stride) =
        gather.map_or((0, 0, 0), |g| (g.rows, g.of, g.stride));
    let p = SplitB {
        k: k as u32,
        n: n as u32,
        batch: b_batch as u32,
        k_contig: (b.trans == Transpose::Yes) as u32,
        passes,
        block_rows,
        ld: b.ld,
        stride: b.stride,
        pitch,
        block_of,
        block_stride,
    };
    launch_cfg(
        gpu,
        "matmul_wg_split_b_f32",
        cudarc::driver::LaunchConfig {
            grid_dim: (k.div_ceil(32) as u32, n.div_ceil(32) as u32, b_batch as u32),
            block_dim: (wg::SPLIT_THREADS, 1, 1),
            shared_mem_bytes: wg::SPLIT_SMEM_BYTES,
        },
        &[&ByValue(b.raw), &ByValue(parts.raw()), &ByValue(p)],
    )?;
    let view = |ptr: u64| crate::tma::Tensor3 {
        ptr,
        inner: k as u64,
        outer: n as u64,
        batch: b_batch as u64,
        outer_stride: pitch,
        batch_stride: n as u64 * pitch,
    };
    let base = parts.raw().ptr;
    let hi = crate::tma::sw128_map(OP, DType::F32, &view(base), bn)?;
    let lo = if passes == 3 {
        crate::tma::sw128_map(OP, DType::F32, &view(base + 4 * plane), bn)?
    } else {
        hi
    };
    Ok((Some(parts), hi, lo))
}

/// Sizes of `op(a) op(b)` under the shape rules of [`matmul`]: C is `m x n` (times `batch` when
/// either operand is 3-D), the inner dim `k`; `a` and `b` are the stored (rows, cols) of each operand
/// and whether it carries the batch (a 2-D operand is broadcast over the other's batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: Option<usize>,
    pub a: (usize, usize),
    pub b: (usize, usize),
    pub a_batched: bool,
    pub b_batched: bool,
}

impl MatmulDims {
    /// Shape of the product: `[batch, m, n]` or `[m, n]`.
    pub fn out_shape(&self) -> Vec<usize> {
        match self.batch {
            Some(bt) => vec![bt, self.m, self.n],
            None => vec![self.m, self.n],
        }
    }
}

/// The shape rules shared by the GPU op and the CPU reference: each operand of rank 2 or 3, inner
/// dims equal, batch sizes equal when both are batched. Errors name both shapes.
pub fn matmul_dims(
    op: &'static str,
    a: &[usize],
    b: &[usize],
    ta: Transpose,
    tb: Transpose,
) -> Result<MatmulDims> {
    let split = |what: &'static str, s: &[usize]| match *s {
        [r, c] => Ok((None, r, c)),
        [bt, r, c] => Ok((Some(bt), r, c)),
        _ => Err(Error::Shape {
            op,
            what: format!("{what} must be a matrix (rank 2) or a batch of matrices (rank 3)"),
            expected: "rank 2 or 3".into(),
            got: s.to_vec(),
        }),
    };
    let (ab, ar, ac) = split("a", a)?;
    let (bb, br, bc) = split("b", b)?;
    let (m, ka) = if ta == Transpose::Yes {
        (ac, ar)
    } else {
        (ar, ac)
    };
    let (kb, n) = if tb == Transpose::Yes {
        (bc, br)
    } else {
        (br, bc)
    };
    if ka != kb {
        return Err(Error::Shape {
            op,
            what: format!(
                "inner dims differ: a {a:?} (transpose {ta:?}) is {m} x {ka}, b {b:?} (transpose \
                 {tb:?}) is {kb} x {n}"
            ),
            expected: format!("op(b) with {ka} rows"),
            got: b.to_vec(),
        });
    }
    let batch = match (ab, bb) {
        (Some(x), Some(y)) if x != y => {
            return Err(Error::Shape {
                op,
                what: format!("batch sizes differ: a {a:?} has batch {x}"),
                expected: format!("b with batch {x}"),
                got: b.to_vec(),
            });
        }
        (Some(x), _) | (None, Some(x)) => Some(x),
        (None, None) => None,
    };
    Ok(MatmulDims {
        m,
        n,
        k: ka,
        batch,
        a: (ar, ac),
        b: (br, bc),
        a_batched: ab.is_some(),
        b_batched: bb.is_some(),
    })
}

/// The size limits of the tensor-core kernels: M, N, K up to [`tc::MAX_DIM`] (row and column
/// indices are u32 inside the kernel; element offsets are u64, so there is no limit on element
/// counts), at most [`tc::MAX_TILES`] output tiles (grid x) and [`tc::MAX_BATCH`] products (grid z).
fn tc_limits(op: &'static str, d: &MatmulDims, cfg: &tc::Config) -> Result<()> {
    for (what, given) in [("M", d.m), ("N", d.n), ("K", d.k)] {
        if given as u64 > tc::MAX_DIM {
            return Err(Error::TooLarge {
                op,
                what,
                given: given as u64,
                max: tc::MAX_DIM,
            });
        }
    }
    let tiles = cfg.tiles(d.m as u64, d.n as u64);
    if tiles > tc::MAX_TILES {
        return Err(Error::TooLarge {
            op,
            what: "output tiles (ceil(M / BM) * ceil(N / BN))",
            given: tiles,
            max: tc::MAX_TILES,
        });
    }
    let batch = d.batch.unwrap_or(1) as u64;
    if batch > tc::MAX_BATCH {
        return Err(Error::TooLarge {
            op,
            what: "batch",
            given: batch,
            max: tc::MAX_BATCH,
        });
    }
    Ok(())
}

/// How the tensor-core kernel reads (or writes) an operand: 16-byte chunks when every stored row
/// starts 16-byte aligned (aligned base, leading dim and batch stride multiples of 8 elements),
/// else element by element.
fn row_access(base_aligned16: bool, ld: u64, stride: u64) -> RowAccess {
    if base_aligned16 && ld.is_multiple_of(8) && stride.is_multiple_of(8) {
        RowAccess::Chunks16
    } else {
        RowAccess::Elements
    }
}

/// The tensor-core entry point for a 16-bit dtype and storage combination (`None` for f32).
fn tc_kernel(dtype: DType, ta: Transpose, tb: Transpose) -> Option<&'static str> {
    entry_of(
        [
            "matmul_tc_nn_f16",
            "matmul_tc_nt_f16",
            "matmul_tc_tn_f16",
            "matmul_tc_tt_f16",
            "matmul_tc_nn_bf16",
            "matmul_tc_nt_bf16",
            "matmul_tc_tn_bf16",
            "matmul_tc_tt_bf16",
        ],
        dtype,
        ta,
        tb,
    )
}

/// The entry of a 16-bit kernel family listed as `{nn,nt,tn,tt}_f16` then `{nn,nt,tn,tt}_bf16`
/// for a dtype and storage combination (`None` for f32).
fn entry_of(
    names: [&'static str; 8],
    dtype: DType,
    ta: Transpose,
    tb: Transpose,
) -> Option<&'static str> {
    let d = match dtype {
        DType::F16 => 0,
        DType::BF16 => 4,
        DType::F32 => return None,
    };
    Some(names[d + 2 * (ta == Transpose::Yes) as usize + (tb == Transpose::Yes) as usize])
}

/// `op(a) op(b)`: a is `(M, K)` (or `(K, M)` with `ta = Yes`), b is `(K, N)` (or `(N, K)`), each
/// optionally with a leading batch dim; a 2-D operand is broadcast over the other's batch. Contiguous
/// operands of one dtype; the result has that dtype.
/// - f32: [`Precision::default()`] (3xTF32 on tensor cores, fp32-class accuracy; see
///   [`matmul_with`] to choose).
/// - f16 / bf16: tensor cores with f32 accumulation and one rounding to the dtype at the end. On
///   compute capability 9.0 (H100, H200) with the default build, products whose rows (A's, B's and
///   C's) are all 16-byte aligned run the Hopper kernel (TMA copies, an mbarrier pipeline,
///   `wgmma`); every other product runs the `mma.sync` kernel: any sizes; operands whose rows are
///   not 16-byte aligned (a leading dim that is not a multiple of 8, or a view at an odd offset)
///   take a slower element-wise load path there. [`matmul_kernel`] says which one a call takes.
///
/// Deterministic: the same inputs give the same bits on every run.
pub fn matmul(a: &Tensor, b: &Tensor, ta: Transpose, tb: Transpose) -> Result<Tensor> {
    matmul_with(a, b, ta, tb, Precision::default())
}

/// [`matmul`] with the f32 [`Precision`] chosen (ignored for f16/bf16).
///
/// ```no_run
/// use host::ops::matmul::{Precision, Transpose, matmul_with};
/// use host::{DType, Gpu, Tensor};
/// let gpu = Gpu::new(0)?;
/// let a = Tensor::from_f32(&gpu, &[1.0; 6], &[2, 3], DType::F32)?;
/// let b = Tensor::from_f32(&gpu, &[0.5; 6], &[3, 2], DType::F32)?;
/// let c = matmul_with(&a, &b, Transpose::No, Transpose::No, Precision::Ieee)?;
/// assert_eq!(c.to_vec()?, vec![1.5; 4]);
/// # Ok::<(), host::Error>(())
/// ```
pub fn matmul_with(
    a: &Tensor,
    b: &Tensor,
    ta: Transpose,
    tb: Transpose,
    precision: Precision,
) -> Result<Tensor> {
    const OP: &str = "matmul";
    same_device_and_dtype(OP, a, b)?;
    let d = matmul_dims(OP, a.shape(), b.shape(), ta, tb)?;
    a.require_contiguous(OP, "a")?;
    b.require_contiguous(OP, "b")?;
    if a.dtype() != DType::F32 {
        tc_limits(OP, &d, &tc::DEFAULT)?;
    }
    let out = Tensor::empty(a.gpu(), &d.out_shape(), a.dtype())?;
    if a.dtype() == DType::F32 {
        f32_launch(
            a,
            b,
            ta,
            tb,
            &d,
            &out,
            None,
            Accumulate::Overwrite,
            precision,
        )?;
        return Ok(out);
    }
    if tma_launch(a, b, &d, ta, tb, &out)? {
        return Ok(out);
    }
    let name = tc_kernel(a.dtype(), ta, tb).expect("16-bit dtype: f32 returned above");
    tc_launch(a, b, &d, &out, name, &tc::DEFAULT)?;
    Ok(out)
}

/// `out (+)= op(a) op(b) (+ bias)` for f32 operands of shape `d`; `out` has `d.out_shape()`, `bias`
/// (if any) `d.n` elements.
#[allow(clippy::too_many_arguments)]
fn f32_launch(
    a: &Tensor,
    b: &Tensor,
    ta: Transpose,
    tb: Transpose,
    d: &MatmulDims,
    out: &Tensor,
    bias: Option<RawSlice>,
    acc: Accumulate,
    precision: Precision,
) -> Result<()> {
    let stride = |batched: bool, (r, c): (usize, usize)| if batched { (r * c) as u64 } else { 0 };
    let (sa, sb) = (stride(d.a_batched, d.a), stride(d.b_batched, d.b));
    let shape = GemmShape {
        m: d.m,
        n: d.n,
        k: d.k,
        batch: d.batch.unwrap_or(1),
    };
    let operand = |t: &Tensor, ld: usize, tr: Transpose, stride: u64| Operand {
        raw: t.raw(),
        ld: ld as u64,
        trans: tr,
        stride,
    };
    gemm(
        a.gpu(),
        shape,
        operand(a, d.a.1, ta, sa),
        operand(b, d.b.1, tb, sb),
        Operand {
            raw: out.raw(),
            ld: d.n as u64,
            trans: Transpose::No,
            stride: (d.m * d.n) as u64,
        },
        bias,
        acc,
        precision,
    )
}

/// `out (+)= op(a) op(b) (+ bias)` for f32 operands into an existing output (as `torch.addmm`, with
/// `accumulate` adding to `out` instead of overwriting it): the bias-row and accumulate paths the
/// Clifford layers build on. `out` is contiguous with the product's shape, `bias` (if any) has `n`
/// elements; all f32.
#[allow(clippy::too_many_arguments)]
pub fn matmul_f32_into(
    a: &Tensor,
    b: &Tensor,
    ta: Transpose,
    tb: Transpose,
    bias: Option<&Tensor>,
    out: &Tensor,
    accumulate: bool,
    precision: Precision,
) -> Result<()> {
    const OP: &str = "matmul_f32_into";
    same_device_and_dtype(OP, a, b)?;
    same_device_and_dtype(OP, a, out)?;
    if a.dtype() != DType::F32 {
        return Err(Error::Invalid {
            op: OP,
            msg: format!("f32 operands only, got {}", a.dtype()),
        });
    }
    let d = matmul_dims(OP, a.shape(), b.shape(), ta, tb)?;
    a.require_contiguous(OP, "a")?;
    b.require_contiguous(OP, "b")?;
    out.require_contiguous(OP, "out")?;
    if out.shape() != d.out_shape().as_slice() {
        return Err(Error::Shape {
            op: OP,
            what: "out must have the product's shape".into(),
            expected: format!("{:?}", d.out_shape()),
            got: out.shape().to_vec(),
        });
    }
    let bias = match bias {
        None => None,
        Some(t) => {
            same_device_and_dtype(OP, a, t)?;
            t.require_contiguous(OP, "bias")?;
            if t.shape() != [d.n] {
                return Err(Error::Shape {
                    op: OP,
                    what: "bias must be one row of n elements".into(),
                    expected: format!("[{}]", d.n),
                    got: t.shape().to_vec(),
                });
            }
            Some(t.raw())
        }
    };
    let acc = if accumulate {
        Accumulate::Add
    } else {
        Accumulate::Overwrite
    };
    f32_launch(a, b, ta, tb, &d, out, bias, acc, precision)
}

/// Launches tensor-core entry `name` (of configuration `cfg`) for `out = op(a) op(b)`; `d` passed
/// `tc_limits` for `cfg`, `out` has `d.out_shape()` and the operands' dtype.
fn tc_launch(
    a: &Tensor,
    b: &Tensor,
    d: &MatmulDims,
    out: &Tensor,
    name: &'static str,
    cfg: &tc::Config,
) -> Result<()> {
    let batch = d.batch.unwrap_or(1);
    if d.m == 0 || d.n == 0 || batch == 0 {
        return Ok(());
    }
    let stride = |batched: bool, (r, c): (usize, usize)| if batched { (r * c) as u64 } else { 0 };
    let (sa, sb) = (stride(d.a_batched, d.a), stride(d.b_batched, d.b));
    // Every value below was bounded by `tc_limits` (M, N, K <= 2^31, tiles < 2^31, batch <= 65535).
    let (lda, ldb, ldc) = (d.a.1 as u64, d.b.1 as u64, d.n as u64);
    let stride_c = (d.m * d.n) as u64;
    let p = MatmulTc {
        m: d.m as u32,
        n: d.n as u32,
        k: d.k as u32,
        a_access: row_access(aligned16(&[a]), lda, sa),
        b_access: row_access(aligned16(&[b]), ldb, sb),
        c_access: row_access(aligned16(&[out]), ldc, stride_c),
        lda,
        ldb,
        ldc,
        stride_a: sa,
        stride_b: sb,
        stride_c,
    };
    let launch = cudarc::driver::LaunchConfig {
        grid_dim: (cfg.tiles(d.m as u64, d.n as u64) as u32, 1, batch as u32),
        block_dim: (cfg.threads(), 1, 1),
        shared_mem_bytes: cfg.smem_bytes(),
    };
    launch_cfg_large_smem(
        a.gpu(),
        name,
        launch,
        &[
            &ByValue(a.raw()),
            &ByValue(b.raw()),
            &ByValue(out.raw()),
            &ByValue(p),
        ],
    )
}

/// The Hopper entry point (TMA + wgmma, sm_90 build) for a 16-bit dtype and storage combination.
fn tma_kernel(dtype: DType, ta: Transpose, tb: Transpose) -> Option<&'static str> {
    entry_of(
        [
            "matmul_tma_nn_f16",
            "matmul_tma_nt_f16",
            "matmul_tma_tn_f16",
            "matmul_tma_tt_f16",
            "matmul_tma_nn_bf16",
            "matmul_tma_nt_bf16",
            "matmul_tma_tn_bf16",
            "matmul_tma_tt_bf16",
        ],
        dtype,
        ta,
        tb,
    )
}

/// The stored operands of a product of shape `d` as rank-3 tensors for the copy engine (A, B, then
/// C at `c_ptr`), and the box heights of the Hopper kernel's tiles for them: a K-major tile is `BM`
/// (A) or `BN` (B) rows of 64 k, an MN-major one `BK` rows of 64 m or n a box; C's staging tiles are
/// 64 rows of 64 columns a box.
fn tma_operands(
    a: &Tensor,
    b: &Tensor,
    d: &MatmulDims,
    ta: Transpose,
    tb: Transpose,
    c_ptr: u64,
) -> [(crate::tma::Tensor3, u32); 3] {
    let batch = d.batch.unwrap_or(1) as u64;
    let view = |ptr: u64, (rows, cols): (usize, usize), batched: bool| crate::tma::Tensor3 {
        ptr,
        inner: cols as u64,
        outer: rows as u64,
        batch: if batched { batch } else { 1 },
        outer_stride: cols as u64,
        batch_stride: (rows * cols) as u64,
    };
    let a_rows = if ta == Transpose::Yes {
        tma::BK
    } else {
        tma::BM
    };
    let b_rows = if tb == Transpose::Yes {
        tma::BN
    } else {
        tma::BK
    };
    [
        (view(a.raw().ptr, d.a, d.a_batched), a_rows),
        (view(b.raw().ptr, d.b, d.b_batched), b_rows),
        (view(c_ptr, (d.m, d.n), true), 64),
    ]
}

/// The copy engine's views of A, B and C (see [`tma_operands`]) when `op(a) op(b)` of shape `d`
/// (16-bit operands, the output at `c_ptr`) takes the Hopper kernel: the device runs the sm_90
/// build and the copy engine can read and write all three matrices (16-byte aligned bases and rows,
/// so N a multiple of 8; no empty dim); `None` otherwise.
fn tma_plan(
    a: &Tensor,
    b: &Tensor,
    d: &MatmulDims,
    ta: Transpose,
    tb: Transpose,
    c_ptr: u64,
) -> Option<[(crate::tma::Tensor3, u32); 3]> {
    let tiles = tma::tiles(d.m as u64, d.n as u64) * d.batch.unwrap_or(1) as u64;
    let shape_ok = a.gpu().ptx_arch() == "sm_90"
        && d.m > 0
        && d.k > 0
        && tiles <= tma::MAX_TILES
        && [d.m, d.n, d.k].iter().all(|&x| x as u64 <= tma::MAX_DIM);
    let operands = tma_operands(a, b, d, ta, tb, c_ptr);
    let readable = operands.iter().all(|(t, _)| crate::tma::tma_readable(t));
    (shape_ok && readable).then_some(operands)
}

/// The kernel [`matmul`] launches for these operands (f16/bf16 only; an error for f32, whose kernel
/// depends on the [`Precision`], or for operands [`matmul`] refuses): `matmul_tma_*` (Hopper: TMA and
/// wgmma) on the sm_90 build when every row is 16-byte aligned (N too), `matmul_tc_*`
/// (`mma.sync`) otherwise. For reading a profile, or checking that a shape takes the fast path.
/// (A fresh output is 256-byte aligned, so only N decides for C.)
///
/// ```no_run
/// use host::ops::matmul::{Transpose, matmul_kernel};
/// use host::{DType, Gpu, Tensor};
/// let gpu = Gpu::new(0)?;
/// let a = Tensor::empty(&gpu, &[4096, 4096], DType::F16)?;
/// // "matmul_tma_nn_f16" on an H100 or H200, "matmul_tc_nn_f16" elsewhere.
/// println!("{}", matmul_kernel(&a, &a, Transpose::No, Transpose::No)?);
/// # Ok::<(), host::Error>(())
/// ```
pub fn matmul_kernel(a: &Tensor, b: &Tensor, ta: Transpose, tb: Transpose) -> Result<&'static str> {
    const OP: &str = "matmul_kernel";
    same_device_and_dtype(OP, a, b)?;
    let d = matmul_dims(OP, a.shape(), b.shape(), ta, tb)?;
    let (Some(hopper), Some(portable)) =
        (tma_kernel(a.dtype(), ta, tb), tc_kernel(a.dtype(), ta, tb))
    else {
        return Err(Error::Invalid {
            op: OP,
            msg: "f16/bf16 operands only (f32 products pick their kernel by precision); got f32"
                .into(),
        });
    };
    tc_limits(OP, &d, &tc::DEFAULT)?;
    Ok(if tma_plan(a, b, &d, ta, tb, 256).is_some() {
        hopper
    } else {
        portable
    })
}

/// Runs `out = op(a) op(b)` on the Hopper kernel (`matmul_tma_*`) when the device runs the sm_90
/// build and [`tma_plan`] finds it eligible; returns whether it ran. `d` passed `tc_limits`.
fn tma_launch(
    a: &Tensor,
    b: &Tensor,
    d: &MatmulDims,
    ta: Transpose,
    tb: Transpose,
    out: &Tensor,
) -> Result<bool> {
    const OP: &str = "matmul";
    let batch = d.batch.unwrap_or(1) as u64;
    let Some(name) = tma_kernel(a.dtype(), ta, tb) else {
        return Ok(false);
    };
    let Some(operands) = tma_plan(a, b, d, ta, tb, out.raw().ptr) else {
        return Ok(false);
    };
    let tiles = tma::tiles(d.m as u64, d.n as u64) * batch;
    let [(a_view, a_rows), (b_view, b_rows), (c_view, c_rows)] = operands;
    let map_a = crate::tma::sw128_map(OP, a.dtype(), &a_view, a_rows)?;
    let map_b = crate::tma::sw128_map(OP, a.dtype(), &b_view, b_rows)?;
    let map_c = crate::tma::sw128_map(OP, a.dtype(), &c_view, c_rows)?;
    let (tiles_m, tiles_n) = (
        d.m.div_ceil(tma::BM as usize),
        d.n.div_ceil(tma::BN as usize),
    );
    let p = MatmulTma {
        m: d.m as u32,
        n: d.n as u32,
        k: d.k as u32,
        batch: batch as u32,
        tiles_m: tiles_m as u32,
        tiles_n: tiles_n as u32,
        a_batched: d.a_batched as u32,
        b_batched: d.b_batched as u32,
    };
    let sms = a.gpu().sm_count()?.max(1) as u64;
    let launch = cudarc::driver::LaunchConfig {
        grid_dim: (tiles.min(sms) as u32, 1, 1),
        block_dim: (tma::THREADS, 1, 1),
        shared_mem_bytes: tma::SMEM_BYTES,
    };
    launch_cfg_large_smem(
        a.gpu(),
        name,
        launch,
        &[
            &ByValue(map_a),
            &ByValue(map_b),
            &ByValue(map_c),
            &ByValue(p),
        ],
    )?;
    Ok(true)
}

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod reference;

#[cfg(test)]
mod tests;
