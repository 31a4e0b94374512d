//! Clifford-algebra layers on Cl(2,0) and Cl(3,0) (docs/math/clifford.md): the fused
//! `RMSNorm(GP(gelu(x), gelu(y)))` with per-feature weights (sgp) or fully connected weights (fcgp),
//! forward and backward, and the [`Layer`] (per-grade linear map + bias, then the fused op).
//!
//! Layout: multivector batches are contiguous f32 `(C, B, N)` (C = 4 in 2D, 8 in 3D; element
//! `(c, b, n)` at `c*B*N + b*N + n`); blade order 2D `[1, e1, e2, e12]`, 3D `[1, e1, e2, e3, e12, e13,
//! e23, e123]`; sgp weights `(N, P)`, fcgp weights `(P, N_in, N_out)`, P = 10 (2D) or 20 (3D).
//!
//! Saved state: the forward keeps only its (normalised) output and, with [`Normalize::Yes`], the grade
//! norms `r (G, B)`; the backward recomputes the gated inputs from raw x and y.
//!
//! Determinism: the grade norms are block reductions in a fixed order; weight and bias gradients are
//! per-chunk partials summed in chunk order (chunk size a function of B only); the fc variant's mixing is
//! the tiled matmul with a fixed k order. The same inputs give the same bits on every run.
//!
//! **Equivariance.** The per-grade linear map of [`Layer`] commutes with rotations, but its bias is
//! added to *every* component (the reference convention of the Python tools this library matches), so
//! a non-zero bias breaks O(n) equivariance. Initialise it to zero (the init of docs/math/clifford.md does) and keep it
//! there if equivariance matters.
use gpu::params::RawSlice;
use gpu::params::clifford::{
    BWD_BLOCK, CHUNK_SUM_WARPS, ELEM_BLOCK, FC_BWD_BLOCK, FC_PHASE_SPLIT_2D, FC_PHASE_SPLIT_3D,
    FWD_CACHE_2D, FWD_CACHE_3D, FWD_V2_MAX_BLOCK, FWD_V3_BLOCK, FWD_V3_MAX_N, GRADES_2D, GRADES_3D,
    MAX_PERM_BLOCKS, NUM_SLOTS_2D, NUM_SLOTS_3D, PATHS_2D, PATHS_3D, ROW_BLOCK, TERMS_2D, TERMS_3D,
    Term, chunks, fwd_block, fwd_max_cached, fwd_v2_block, fwd_v3_row_threads, pack_perm,
    rows_per_chunk, rows_per_chunk_v2,
};

use crate::error::{Error, Result};
use crate::launch::{ArgPush, ByValue, grid_blocks, launch, launch_cfg};
use crate::ops::matmul::{
    Accumulate, GemmShape, Operand, PairTerm, Precision, RowBlocks, Transpose, gemm,
    gemm_b_gathered, gemm_gathered, gemm_pairs, offset,
};
use crate::ops::same_device_and_dtype;
use crate::tensor::Tensor;
use crate::{DType, Gpu};

/// The algebra of a multivector batch, known from its component count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algebra {
    /// Cl(2,0): 4 components, 3 grades, 10 weight paths.
    Cl2,
    /// Cl(3,0): 8 components, 4 grades, 20 weight paths.
    Cl3,
}

impl Algebra {
    /// The algebra with `c` components, if any.
    pub fn from_components(c: usize) -> Option<Algebra> {
        match c {
            4 => Some(Algebra::Cl2),
            8 => Some(Algebra::Cl3),
            _ => None,
        }
    }
    /// Dimension of the vector space (2 or 3).
    pub fn dims(self) -> usize {
        match self {
            Algebra::Cl2 => 2,
            Algebra::Cl3 => 3,
        }
    }
    pub fn components(self) -> usize {
        1 << self.dims()
    }
    pub fn grades(self) -> usize {
        self.dims() + 1
    }
    /// Weight paths P.
    pub fn paths(self) -> usize {
        self.path_table().len()
    }
    /// The product terms (`o[j] += ±w[p] x[i] y[k]`), in the order of docs/math/clifford.md.
    pub fn terms(self) -> &'static [Term] {
        match self {
            Algebra::Cl2 => &TERMS_2D,
            Algebra::Cl3 => &TERMS_3D,
        }
    }
    /// Grade of each blade.
    pub fn blade_grades(self) -> &'static [u8] {
        match self {
            Algebra::Cl2 => &GRADES_2D,
            Algebra::Cl3 => &GRADES_3D,
        }
    }
    /// (grade of x, grade of output, grade of y) of each weight path.
    pub fn path_table(self) -> &'static [[u8; 3]] {
        match self {
            Algebra::Cl2 => &PATHS_2D,
            Algebra::Cl3 => &PATHS_3D,
        }
    }
    fn num_slots(self) -> usize {
        match self {
            Algebra::Cl2 => NUM_SLOTS_2D,
            Algebra::Cl3 => NUM_SLOTS_3D,
        }
    }
    /// The fc variant's two phases, as ranges of pair row blocks: the second begins at
    /// `params::clifford::fc_phase_split`, the boundary the `fc_pairs_bwd` kernels take.
    fn fc_phases(self) -> [(usize, usize); 2] {
        let split = match self {
            Algebra::Cl2 => FC_PHASE_SPLIT_2D,
            Algebra::Cl3 => FC_PHASE_SPLIT_3D,
        };
        [(0, split), (split, self.num_slots())]
    }
    fn fwd_cache(self) -> u32 {
        match self {
            Algebra::Cl2 => FWD_CACHE_2D,
            Algebra::Cl3 => FWD_CACHE_3D,
        }
    }
    /// First component and component count of grade `g` (blades of a grade are contiguous).
    pub fn grade_span(self, g: usize) -> (usize, usize) {
        let grades = self.blade_grades();
        let first = grades.iter().position(|&x| x as usize == g).unwrap_or(0);
        (first, grades.iter().filter(|&&x| x as usize == g).count())
    }
    /// The fc variant's groups, one per output grade in order: the grade's first component and
    /// component count, its paths (in path order), its first pair slot (the layout of
    /// `params::clifford::slot_layout`, where a grade's pair slots form one `(count * B, paths * N)`
    /// matrix) and its first path in the stacked weights ([`Algebra::fc_path_order`]).
    fn fc_groups(self) -> Vec<FcGroup> {
        let mut groups = Vec::new();
        let (mut slot, mut stacked) = (0, 0);
        for g in 0..self.grades() {
            let (j0, count) = self.grade_span(g);
            let paths: Vec<usize> = (0..self.paths())
                .filter(|&p| self.path_table()[p][1] as usize == g)
                .collect();
            let len = paths.len();
            groups.push(FcGroup {
                j0,
                count,
                paths,
                slot,
                stacked,
            });
            slot += count * len;
            stacked += len;
        }
        groups
    }
    /// The product's terms by output component, each component's in the order of x's component,
    /// for [`gemm_pairs`]: a geometric product has exactly one term a pair of x's and the output's
    /// components, so component j's list has C entries, entry i taking `x_i` (the unit tests hold
    /// the tables to that; `gemm_pairs` declines tables of any other shape).
    fn pair_terms(self) -> Vec<Vec<PairTerm>> {
        (0..self.components())
            .map(|j| {
                let mut terms: Vec<&Term> =
                    self.terms().iter().filter(|t| t.j as usize == j).collect();
                terms.sort_by_key(|t| t.i);
                terms
                    .into_iter()
                    .map(|t| PairTerm {
                        y: t.k as usize,
                        neg: t.neg,
                        path: t.p as usize,
                    })
                    .collect()
            })
            .collect()
    }
    /// The paths in the order the fc weights are stacked, grade by grade ([`Algebra::fc_groups`]).
    fn fc_path_order(self) -> Vec<usize> {
        self.fc_groups().into_iter().flat_map(|g| g.paths).collect()
    }
    fn kernel(self, op: Kernel) -> &'static str {
        use Algebra::*;
        use Kernel::*;
        match (self, op) {
            (Cl2, Fwd) => "sgp2d_fwd_f32",
            (Cl3, Fwd) => "sgp3d_fwd_f32",
            (Cl2, FwdV2) => "sgp2d_fwd_v2_f32",
            (Cl3, FwdV2) => "sgp3d_fwd_v2_f32",
            (Cl2, BwdV2) => "sgp2d_bwd_v2_f32",
            (Cl3, BwdV2) => "sgp3d_bwd_v2_f32",
            (Cl2, Dot) => "grade_dot2d_f32",
            (Cl3, Dot) => "grade_dot3d_f32",
            (Cl2, Norm) => "grade_norm2d_f32",
            (Cl3, Norm) => "grade_norm3d_f32",
            (Cl2, Pairs) => "fc_pairs2d_f32",
            (Cl3, Pairs) => "fc_pairs3d_f32",
            (Cl2, PairsBwd) => "fc_pairs_bwd2d_f32",
            (Cl3, PairsBwd) => "fc_pairs_bwd3d_f32",
            (Cl2, GateY) => "fc_gate_y2d_f32",
            (Cl3, GateY) => "fc_gate_y3d_f32",
        }
    }
}

/// One output grade of the fc variant ([`Algebra::fc_groups`]), or a range of its components
/// ([`FcGroup::within`]).
#[derive(Clone)]
struct FcGroup {
    j0: usize,
    count: usize,
    paths: Vec<usize>,
    slot: usize,
    /// Its weights are rows `stacked * N ..` of the stacked `(P * N, M)` weights.
    stacked: usize,
}

impl FcGroup {
    /// The components of this group whose pair row blocks lie in `lo..hi` (each component's
    /// `paths` row blocks are consecutive), as a group of their own; `None` if there are none. The
    /// fc forward's phases ([`Algebra::fc_phases`]) end on component boundaries.
    fn within(&self, (lo, hi): (usize, usize)) -> Option<FcGroup> {
        let pg = self.paths.len();
        let (start, end) = (self.slot, self.slot + self.count * pg);
        let (s, e) = (lo.max(start), hi.min(end));
        if s >= e {
            return None;
        }
        debug_assert!((s - start).is_multiple_of(pg) && (e - start).is_multiple_of(pg));
        Some(FcGroup {
            j0: self.j0 + (s - start) / pg,
            count: (e - s) / pg,
            paths: self.paths.clone(),
            slot: s,
            stacked: self.stacked,
        })
    }
    /// Its pair matrix `(count * B, paths * N)` in the pair buffer (or the pair-term gradients in
    /// its place), as a product operand; `pairs` holds the buffer from row block `lo` on.
    fn pairs(
        &self,
        (pairs, lo): (&Tensor, usize),
        (b, n): (usize, usize),
        trans: Transpose,
    ) -> Operand {
        Operand {
            raw: offset(pairs.raw(), ((self.slot - lo) * b * n) as u64),
            ld: (self.paths.len() * n) as u64,
            trans,
            stride: 0,
        }
    }
    /// Its weights `(paths * N, M)` in stacked weights (or their gradient).
    fn weights(&self, stacked: &Tensor, (n, m): (usize, usize), trans: Transpose) -> Operand {
        Operand {
            raw: offset(stacked.raw(), (self.stacked * n * m) as u64),
            ld: m as u64,
            trans,
            stride: 0,
        }
    }
    /// Its output rows `(count * B, M)` of a `(C, B, M)` tensor (the output, or its gradient).
    fn rows(&self, t: &Tensor, (b, m): (usize, usize)) -> Operand {
        Operand {
            raw: offset(t.raw(), (self.j0 * b * m) as u64),
            ld: m as u64,
            trans: Transpose::No,
            stride: 0,
        }
    }
}

#[derive(Clone, Copy)]
enum Kernel {
    Fwd,
    FwdV2,
    BwdV2,
    Dot,
    Norm,
    Pairs,
    PairsBwd,
    GateY,
}

/// Whether the fused op ends with the grade-wise RMS norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Normalize {
    No,
    Yes,
}

/// What a forward returns and its backward needs: the output and, when normalised, the grade norms
/// `r (G, B)`; from [`Layer::forward`] also the linear map's output `y (C, B, N)`, which its backward
/// reads instead of recomputing a matrix product (`None` elsewhere, or to have it recomputed).
#[derive(Clone, Debug)]
pub struct Forward {
    pub out: Tensor,
    pub norms: Option<Tensor>,
    pub linear_out: Option<Tensor>,
}

/// Gradients of the fused op.
#[derive(Clone, Debug)]
pub struct Grads {
    pub grad_x: Tensor,
    pub grad_y: Tensor,
    pub grad_weight: Tensor,
}

/// Sizes of one multivector batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub algebra: Algebra,
    pub batch: usize,
    pub features: usize,
}

fn f32_only(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() == DType::F32 {
        Ok(())
    } else {
        Err(Error::DType {
            op,
            expected: "f32".into(),
            got: t.dtype(),
        })
    }
}

/// A contiguous f32 `(C, B, N)` multivector batch with C = 4 or 8.
pub fn check_multivectors(op: &'static str, what: &'static str, x: &Tensor) -> Result<Dims> {
    f32_only(op, x)?;
    let [c, b, n] = *x.shape() else {
        return Err(Error::Shape {
            op,
            what: format!("{what} must be a (C, B, N) multivector batch"),
            expected: "rank 3: (components, batch, features)".into(),
            got: x.shape().to_vec(),
        });
    };
    let algebra = Algebra::from_components(c).ok_or_else(|| Error::Shape {
        op,
        what: format!("wrong component count {c} in {what}"),
        expected: "4 components (Cl(2,0)) or 8 (Cl(3,0)) in dim 0".into(),
        got: x.shape().to_vec(),
    })?;
    x.require_contiguous(op, what)?;
    Ok(Dims {
        algebra,
        batch: b,
        features: n,
    })
}

/// x and y of the fused op: same algebra, same B; `same_n` also requires the same N.
fn check_pair(op: &'static str, x: &Tensor, y: &Tensor) -> Result<Dims> {
    same_device_and_dtype(op, x, y)?;
    let dx = check_multivectors(op, "x", x)?;
    let dy = check_multivectors(op, "y", y)?;
    let mismatch = |what: &str, a: usize, b: usize| Error::Shape {
        op,
        what: format!("mismatched {what} between x and y"),
        expected: format!("y with {what} {a} (as x {:?})", x.shape()),
        got: vec![b],
    };
    if dx.algebra != dy.algebra {
        return Err(mismatch(
            "component count C",
            dx.algebra.components(),
            dy.algebra.components(),
        ));
    }
    if dx.batch != dy.batch {
        return Err(mismatch("batch B", dx.batch, dy.batch));
    }
    if dx.features != dy.features {
        return Err(mismatch("features N", dx.features, dy.features));
    }
    Ok(dx)
}

/// A contiguous f32 tensor of exactly `expected` shape, `name` describing it (e.g. "(N, P)").
fn check_param(
    op: &'static str,
    what: &'static str,
    t: &Tensor,
    expected: &[usize],
    name: &str,
) -> Result<()> {
    f32_only(op, t)?;
    if t.shape() != expected {
        return Err(Error::Shape {
            op,
            what: format!("wrong {what} shape (batch and features must match x)"),
            expected: format!("{name} = {expected:?}"),
            got: t.shape().to_vec(),
        });
    }
    t.require_contiguous(op, what)
}

/// The saved forward state matching `d`: output `(C, B, n_out)` and, if any, norms `(G, B)`.
fn check_saved(
    op: &'static str,
    d: Dims,
    n_out: usize,
    fwd: &Forward,
    grad_out: &Tensor,
) -> Result<()> {
    let shape = [d.algebra.components(), d.batch, n_out];
    check_param(op, "saved output", &fwd.out, &shape, "(C, B, N_out)")?;
    check_param(op, "grad_out", grad_out, &shape, "(C, B, N_out)")?;
    if let Some(r) = &fwd.norms {
        check_param(
            op,
            "saved norms",
            r,
            &[d.algebra.grades(), d.batch],
            "(G, B)",
        )?;
    }
    Ok(())
}

fn u64s(d: Dims) -> (u64, u64) {
    (d.batch as u64, d.features as u64)
}

const NONE: RawSlice = RawSlice { ptr: 0, len: 0 };

/// The grade RMS norm of `u (C, B, n)` into `out`, norms into `r (G, B)`.
fn grade_norm(
    gpu: &Gpu,
    alg: Algebra,
    u: &Tensor,
    out: &Tensor,
    r: &Tensor,
    rows: u64,
    n: u64,
) -> Result<()> {
    launch(
        gpu,
        alg.kernel(Kernel::Norm),
        grid_blocks(rows, 1),
        ROW_BLOCK,
        &[
            &ByValue(u.raw()),
            &ByValue(out.raw()),
            &ByValue(r.raw()),
            &rows,
            &n,
        ],
    )
}

/// Fixed-order sum over the leading dim of `partials (chunks, len)` into `out (len)`: the warp tree
/// of `chunk_sum_tree_f32` (`CHUNK_SUM_WARPS` loads in flight per output; the order depends on
/// `chunks` and `len` only).
fn chunk_sum(gpu: &Gpu, partials: &Tensor, out: &Tensor, chunks: u64, len: u64) -> Result<()> {
    launch(
        gpu,
        "chunk_sum_tree_f32",
        grid_blocks(len, 32),
        CHUNK_SUM_WARPS * 32,
        &[&ByValue(partials.raw()), &ByValue(out.raw()), &chunks, &len],
    )
}

/// Column sums of the row-major `(rows, cols)` view of `x` into `out (cols)`, deterministic.
fn col_sum(gpu: &Gpu, x: &Tensor, out: &Tensor, rows: u64, cols: u64) -> Result<()> {
    let (rpc, nchunks) = (rows_per_chunk(rows), chunks(rows));
    let partials = Tensor::empty(gpu, &[nchunks as usize, cols as usize], DType::F32)?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (cols.div_ceil(ELEM_BLOCK as u64) as u32, nchunks as u32, 1),
        block_dim: (ELEM_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_cfg(
        gpu,
        "col_sum_partials_f32",
        cfg,
        &[
            &ByValue(x.raw()),
            &ByValue(partials.raw()),
            &rows,
            &cols,
            &rpc,
        ],
    )?;
    chunk_sum(gpu, &partials, out, nchunks, cols)
}

/// Checks that a grid dim fits the driver's 2^31 - 1 (x) limit.
fn grid_x(op: &'static str, work: u64, per_block: u64) -> Result<u32> {
    u32::try_from(work.div_ceil(per_block).max(1)).map_err(|_| Error::TooLarge {
        op,
        what: "feature blocks",
        given: work,
        max: i32::MAX as u64,
    })
}

/// Peak DRAM bandwidth above which the forward runs V3Prefetch (2D) and V2 (3D) rather than V2 and
/// Cached (between the H100's 3.35 and the H200's 4.8 TB/s, the two cards measured).
const FWD_V3_MIN_DRAM_BYTES_PER_S: f64 = 4.0e12;

/// The forward kernels: each is what [`sgp_forward`] runs on some card (see there); the selector
/// [`sgp_forward_variant`] lets the tests run every one of them on every shape.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FwdVariant {
    /// One block per row, `FWD_CACHE` features a thread in registers.
    Cached,
    /// `sgp{2,3}d_fwd_v2`: one thread a feature, weights in registers across rows, persistent grid,
    /// FMA product over pair slots, next row prefetched. Rows of more than `FWD_V2_MAX_BLOCK`
    /// features, and tensors of 2^31 elements or more, fall back to `Cached`.
    V2,
    /// `sgp2d_fwd_v3p`, 2D only: 4 features a thread (16-byte accesses), several rows a 256-thread
    /// block, one barrier a row group, the next row group prefetched before the barrier. Cl(3,0),
    /// `N % 4 != 0`, `N > FWD_V3_MAX_N` or bases not 16-byte aligned fall back to `V2`.
    V3Prefetch,
}

/// Fused forward `RMSNorm(GP(gelu(x), gelu(y)))` with per-feature weights `(N, P)`.
pub fn sgp_forward(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    normalize: Normalize,
) -> Result<Forward> {
    // The best kernel depends on the card's bandwidth (B4096 N512, each pair measured in one run):
    // - H200 (4.8 TB/s peak): 2D V3Prefetch 0.0314 ms (0.75 of copy) vs V2 0.0378 (2026-11-26, 051d71b); 3D V2
    //   0.0589 (0.81) vs Cached 0.0730.
    // - H100 (3.35 TB/s): 2D V2 0.0399 (0.84) vs V3Prefetch 0.0416 (0.80); 3D Cached 0.0831 (0.80)
    //   vs V2 0.0847 (0.79) (2026-11-26, 67ba96f, H100).
    // The kernel that keeps more bytes in flight a SM wins once the memory outruns the lighter one.
    // V3Prefetch is 2D only: for 3D it runs V2.
    let fast_dram = x.gpu().peak_dram_bytes_per_s() > FWD_V3_MIN_DRAM_BYTES_PER_S;
    let three_d = x.shape().first() == Some(&Algebra::Cl3.components());
    let variant = match (fast_dram, three_d) {
        (true, _) => FwdVariant::V3Prefetch,
        (false, false) => FwdVariant::V2,
        (false, true) => FwdVariant::Cached,
    };
    sgp_forward_variant(x, y, weight, normalize, variant)
}

/// [`sgp_forward`] through a chosen kernel: same contract and results to f32 rounding.
#[doc(hidden)]
pub fn sgp_forward_variant(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    normalize: Normalize,
    variant: FwdVariant,
) -> Result<Forward> {
    const OP: &str = "clifford sgp_forward";
    let d = check_pair(OP, x, y)?;
    same_device_and_dtype(OP, x, weight)?;
    check_param(
        OP,
        "weight",
        weight,
        &[d.features, d.algebra.paths()],
        "(N, P)",
    )?;
    let (alg, gpu) = (d.algebra, x.gpu());
    let out = Tensor::empty(gpu, x.shape(), DType::F32)?;
    let norms = match normalize {
        Normalize::Yes => Some(Tensor::empty(gpu, &[alg.grades(), d.batch], DType::F32)?),
        Normalize::No => None,
    };
    if out.numel() == 0 {
        return Ok(Forward {
            out,
            norms,
            linear_out: None,
        });
    }
    let (rows, n) = u64s(d);
    // v2 and v3 address with 32-bit offsets: the whole tensor under 2^31 elements; rows are at most
    // 2^31 - 1 so `row + grid` cannot wrap.
    let small = (out.numel() as u64) < (1u64 << 31);
    let aligned = [x, y, &out].iter().all(|t| t.raw().ptr.is_multiple_of(16));
    let v3 = variant == FwdVariant::V3Prefetch;
    let v2 = variant != FwdVariant::Cached;
    // The persistent-grid forwards (v3, else v2) where they apply: kernel, block, and the units of
    // work the grid shares out (v3: row groups of `FWD_V3_BLOCK / fwd_v3_row_threads(n)` rows; v2:
    // rows). Both take the same arguments and no dynamic shared memory.
    let persistent = match v3 {
        true if alg == Algebra::Cl2
            && n.is_multiple_of(4)
            && n <= FWD_V3_MAX_N
            && small
            && aligned =>
        {
            let rows_per_block = (FWD_V3_BLOCK / fwd_v3_row_threads(n)) as u64;
            Some((
                "sgp2d_fwd_v3p_f32",
                FWD_V3_BLOCK,
                rows.div_ceil(rows_per_block),
            ))
        }
        _ if v2 && n <= FWD_V2_MAX_BLOCK as u64 && small => {
            Some((alg.kernel(Kernel::FwdV2), fwd_v2_block(n), rows))
        }
        _ => None,
    };
    if let Some((name, block, units)) = persistent {
        let r_raw = norms.as_ref().map_or(NONE, |r| r.raw());
        launch_cfg(
            gpu,
            name,
            cudarc::driver::LaunchConfig {
                grid_dim: (persistent_grid(gpu, name, block, units)?, 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                &ByValue(x.raw()),
                &ByValue(y.raw()),
                &ByValue(weight.raw()),
                &ByValue(out.raw()),
                &ByValue(r_raw),
                &rows,
                &n,
                &u32::from(norms.is_some()),
            ],
        )?;
        return Ok(Forward {
            out,
            norms,
            linear_out: None,
        });
    }
    let cache = alg.fwd_cache();
    let fused = n <= fwd_max_cached(cache);
    // Rows longer than the register cache: un-normalised product, then the norm as its own pass.
    let unnormalised = if fused || norms.is_none() {
        None
    } else {
        Some(Tensor::empty(gpu, x.shape(), DType::F32)?)
    };
    let target = unnormalised.as_ref().unwrap_or(&out);
    let flag = u32::from(fused && norms.is_some());
    let r_raw = if flag == 1 {
        norms.as_ref().map_or(NONE, |r| r.raw())
    } else {
        NONE
    };
    launch(
        gpu,
        alg.kernel(Kernel::Fwd),
        grid_blocks(rows, 1),
        fwd_block(n.min(fwd_max_cached(cache)), cache),
        &[
            &ByValue(x.raw()),
            &ByValue(y.raw()),
            &ByValue(weight.raw()),
            &ByValue(target.raw()),
            &ByValue(r_raw),
            &rows,
            &n,
            &flag,
        ],
    )?;
    if let (Some(u), Some(r)) = (&unnormalised, &norms) {
        grade_norm(gpu, alg, u, &out, r, rows, n)?;
    }
    Ok(Forward {
        out,
        norms,
        linear_out: None,
    })
}

/// Blocks for a row-persistent kernel: as many `block`-thread blocks of `name` as are resident at once
/// on the device (the driver's occupancy for its register use; these kernels take no dynamic shared
/// memory), but no more than `rows`, and evened out so every block gets the same number of rows, or
/// one fewer.
fn persistent_grid(gpu: &Gpu, name: &'static str, block: u32, rows: u64) -> Result<u32> {
    let per_sm = gpu
        .function(name)?
        .occupancy_max_active_blocks_per_multiprocessor(block, 0, None)
        .map_err(|e| Error::driver(e, format!("reading the occupancy of `{name}`")))?;
    let resident = (per_sm.max(1) as u64) * gpu.sm_count()?.max(1) as u64;
    let rows = rows.max(1);
    let per_block = rows.div_ceil(resident);
    Ok(rows.div_ceil(per_block).min(i32::MAX as u64) as u32)
}

/// Norm-backward grade dot products `S (G, B)`.
fn grade_dots(
    gpu: &Gpu,
    alg: Algebra,
    go: &Tensor,
    o: &Tensor,
    rows: u64,
    n: u64,
) -> Result<Tensor> {
    let s = Tensor::empty(gpu, &[alg.grades(), rows as usize], DType::F32)?;
    launch(
        gpu,
        alg.kernel(Kernel::Dot),
        grid_blocks(rows, 1),
        ROW_BLOCK,
        &[
            &ByValue(go.raw()),
            &ByValue(o.raw()),
            &ByValue(s.raw()),
            &ByValue(NONE),
            &ByValue(NONE),
            &rows,
            &n,
        ],
    )?;
    Ok(s)
}

/// Backward of [`sgp_forward`]: grad_x, grad_y `(C, B, N)` and grad_weight `(N, P)`.
pub fn sgp_backward(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    fwd: &Forward,
    grad_out: &Tensor,
) -> Result<Grads> {
    const OP: &str = "clifford sgp_backward";
    let d = check_pair(OP, x, y)?;
    same_device_and_dtype(OP, x, weight)?;
    same_device_and_dtype(OP, x, grad_out)?;
    check_param(
        OP,
        "weight",
        weight,
        &[d.features, d.algebra.paths()],
        "(N, P)",
    )?;
    check_saved(OP, d, d.features, fwd, grad_out)?;
    let (alg, gpu) = (d.algebra, x.gpu());
    let grad_x = Tensor::empty(gpu, x.shape(), DType::F32)?;
    let grad_y = Tensor::empty(gpu, x.shape(), DType::F32)?;
    let grad_weight = Tensor::empty(gpu, weight.shape(), DType::F32)?;
    let (rows, n) = u64s(d);
    if n == 0 {
        return Ok(Grads {
            grad_x,
            grad_y,
            grad_weight,
        });
    }
    let s = match &fwd.norms {
        Some(_) => Some(grade_dots(gpu, alg, grad_out, &fwd.out, rows, n)?),
        None => None,
    };
    // The weight gradient in partial rows of `rpc` batch rows each (more chunks at small shapes, to
    // fill the chip), then summed by `chunk_sum_tree` (8 warps per 32 outputs). Measured against one
    // thread a feature over `rows_per_chunk(B)` rows summed by `chunk_sum` on an H200 (fwd+bwd, same
    // run): 3D B1024 N128 0.0355 vs 0.0712 ms, B4096 N512 0.2574 vs 0.3189, B8192 N1024 0.9426 vs
    // 1.0598; 2D likewise.
    let rpc = rows_per_chunk_v2(rows, n);
    let nchunks = rows.div_ceil(rpc).max(1);
    let bwd_kernel = alg.kernel(Kernel::BwdV2);
    let p = alg.paths() as u64;
    let partials = Tensor::empty(
        gpu,
        &[nchunks as usize, d.features, alg.paths()],
        DType::F32,
    )?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (grid_x(OP, n, BWD_BLOCK as u64)?, nchunks as u32, 1),
        block_dim: (BWD_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let normalize = u32::from(fwd.norms.is_some());
    let raw_or_none = |t: &Option<Tensor>| t.as_ref().map_or(NONE, |t| t.raw());
    launch_cfg(
        gpu,
        bwd_kernel,
        cfg,
        &[
            &ByValue(x.raw()),
            &ByValue(y.raw()),
            &ByValue(weight.raw()),
            &ByValue(grad_out.raw()),
            &ByValue(fwd.out.raw()),
            &ByValue(raw_or_none(&fwd.norms)),
            &ByValue(raw_or_none(&s)),
            &ByValue(grad_x.raw()),
            &ByValue(grad_y.raw()),
            &ByValue(partials.raw()),
            &rows,
            &n,
            &rpc,
            &normalize,
        ],
    )?;
    chunk_sum(gpu, &partials, &grad_weight, nchunks, n * p)?;
    Ok(Grads {
        grad_x,
        grad_y,
        grad_weight,
    })
}

/// Gated pair terms of the fc variant for the slots (row blocks) `lo..hi` of the pair buffer, in a
/// buffer of their own: `(hi - lo) * B * N` floats in the layout of `params::clifford::slot_layout`
/// (per output grade one `(count * B, paths * N)` matrix), shifted down by `lo` row blocks. The
/// whole buffer is `0..num_slots`. `lo` and `hi` are component boundaries (the kernel keeps a slot
/// by its component's first row block).
fn fc_pairs(
    gpu: &Gpu,
    alg: Algebra,
    (x, y): (&Tensor, &Tensor),
    d: Dims,
    (lo, hi): (usize, usize),
) -> Result<Tensor> {
    debug_assert!(
        [lo, hi].iter().all(|&r| r == alg.num_slots()
            || alg.fc_groups().iter().any(|g| r >= g.slot
                && r < g.slot + g.count * g.paths.len()
                && (r - g.slot).is_multiple_of(g.paths.len()))),
        "row blocks {lo}..{hi} must be component boundaries"
    );
    let pairs = Tensor::empty(gpu, &[hi - lo, d.batch, d.features], DType::F32)?;
    let (bn, n) = ((d.batch * d.features) as u64, d.features as u64);
    if bn > 0 {
        launch_elementwise(
            gpu,
            alg.kernel(Kernel::Pairs),
            bn,
            &[
                &ByValue(x.raw()),
                &ByValue(y.raw()),
                &ByValue(pairs.raw()),
                &bn,
                &n,
                &(lo as u64),
                &(hi as u64),
            ],
        )?;
    }
    Ok(pairs)
}

/// A launch of the fc variant's elementwise kernels (`fc_pairs{2,3}d`, `fc_gate_y{2,3}d`): blocks
/// of `ELEM_BLOCK` threads, grid-stride over the `bn` = B N elements.
fn launch_elementwise(gpu: &Gpu, name: &'static str, bn: u64, args: &[&dyn ArgPush]) -> Result<()> {
    launch(
        gpu,
        name,
        grid_blocks(bn, ELEM_BLOCK as u64),
        ELEM_BLOCK,
        args,
    )
}

/// The fc weights `(P, N, M)` with the paths reordered grade by grade ([`Algebra::fc_groups`]), so
/// that a grade's weights are one `(paths * N, M)` matrix.
fn fc_stack_weights(gpu: &Gpu, alg: Algebra, weight: &Tensor) -> Result<Tensor> {
    let stacked = Tensor::empty(gpu, weight.shape(), DType::F32)?;
    permute_blocks(gpu, weight, &stacked, &alg.fc_path_order())?;
    Ok(stacked)
}

/// The inverse of [`fc_stack_weights`] on a gradient: block `i` of `stacked` to path `p`'s block.
fn fc_unstack_weights(gpu: &Gpu, alg: Algebra, stacked: &Tensor, weight: &Tensor) -> Result<()> {
    let mut inverse = vec![0; alg.paths()];
    for (i, p) in alg.fc_path_order().into_iter().enumerate() {
        inverse[p] = i;
    }
    permute_blocks(gpu, stacked, weight, &inverse)
}

/// Block `i` of `dst` = block `perm[i]` of `src`, both `(perm.len(), len)` contiguous (callers pass
/// validated weight shapes and a permutation of the paths), in one launch.
fn permute_blocks(gpu: &Gpu, src: &Tensor, dst: &Tensor, perm: &[usize]) -> Result<()> {
    let len = (dst.numel() / perm.len().max(1)) as u64;
    if len == 0 {
        return Ok(());
    }
    let [lo, hi] = pack_perm(perm).ok_or(Error::TooLarge {
        op: "clifford fc weights",
        what: "weight paths",
        given: perm.len() as u64,
        max: MAX_PERM_BLOCKS as u64,
    })?;
    let work = if len.is_multiple_of(4) { len / 4 } else { len };
    launch_cfg(
        gpu,
        "fc_permute_blocks_f32",
        cudarc::driver::LaunchConfig {
            // A few blocks a path: 10-20 paths of up to a million chunks fill the GPU.
            grid_dim: (
                grid_blocks(work, ELEM_BLOCK as u64).min(64),
                perm.len() as u32,
                1,
            ),
            block_dim: (ELEM_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        &[&ByValue(src.raw()), &ByValue(dst.raw()), &len, &lo, &hi],
    )
}

/// `u (C, B, M)` of `groups`: per output grade one matrix product of its pair matrix
/// `(count * B, paths * N)` with its weights `(paths * N, M)`, the grade's paths' `(N, M)` blocks of
/// `weight (P, N, M)` one after the other ([`fc_weight_product`]); `pairs` holds the pair buffer
/// from row block `lo` on.
#[allow(clippy::too_many_arguments)]
fn fc_mix(
    gpu: &Gpu,
    alg: Algebra,
    groups: &[FcGroup],
    (pairs, lo): (&Tensor, usize),
    (weight, stacked): (&Tensor, &mut Option<Tensor>),
    u: &Tensor,
    d: Dims,
    m: usize,
    precision: Precision,
) -> Result<()> {
    let (b, n) = (d.batch, d.features);
    for grp in groups {
        let shape = GemmShape {
            m: grp.count * b,
            n: m,
            k: grp.paths.len() * n,
            batch: 1,
        };
        let a = grp.pairs((pairs, lo), (b, n), Transpose::No);
        let c = grp.rows(u, (b, m));
        let w = (grp, weight, &mut *stacked, Transpose::No);
        fc_weight_product(gpu, alg, shape, a, w, c, (n, m), precision)?;
    }
    Ok(())
}

/// One product `c = a op(W_g)` of a group's weights `W_g (paths * N, M)`: the sm_90 tensor-core
/// kernels gather W_g's row blocks from `weight (P, N, M)` where they lie ([`gemm_b_gathered`]: the
/// split pass reads them), so no stacked copy is held; elsewhere the weights are stacked once into
/// `stacked` ([`fc_stack_weights`]), kept for the group products after this one.
#[allow(clippy::too_many_arguments)]
fn fc_weight_product(
    gpu: &Gpu,
    alg: Algebra,
    shape: GemmShape,
    a: Operand,
    (grp, weight, stacked, trans): (&FcGroup, &Tensor, &mut Option<Tensor>, Transpose),
    c: Operand,
    (n, m): (usize, usize),
    precision: Precision,
) -> Result<()> {
    let (acc, bias) = (Accumulate::Overwrite, None);
    let b = Operand {
        raw: weight.raw(),
        ld: m as u64,
        trans,
        stride: 0,
    };
    let gather = RowBlocks {
        rows: n,
        stride: (n * m) as u64,
        blocks: &grp.paths,
    };
    if gemm_b_gathered(gpu, shape, a, (b, gather), c, bias, acc, precision)? {
        return Ok(());
    }
    let stacked = match stacked {
        Some(s) => s,
        None => stacked.insert(fc_stack_weights(gpu, alg, weight)?),
    };
    let w = grp.weights(stacked, (n, m), trans);
    gemm(gpu, shape, a, w, c, bias, acc, precision)
}

/// Fused forward with fully connected weights `(P, N_in, N_out)`: output `(C, B, N_out)`. The
/// feature mixing runs at [`Precision::default()`]; [`fcgp_forward_with`] chooses.
pub fn fcgp_forward(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    normalize: Normalize,
) -> Result<Forward> {
    fcgp_forward_with(x, y, weight, normalize, Precision::default())
}

/// [`fcgp_forward`] with the precision of its matrix products.
pub fn fcgp_forward_with(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    normalize: Normalize,
    precision: Precision,
) -> Result<Forward> {
    const OP: &str = "clifford fcgp_forward";
    let d = check_pair(OP, x, y)?;
    same_device_and_dtype(OP, x, weight)?;
    let (alg, gpu) = (d.algebra, x.gpu());
    let m = fc_out_features(OP, weight, d)?;
    let shape = [alg.components(), d.batch, m];
    let out = Tensor::empty(gpu, &shape, DType::F32)?;
    let norms = match normalize {
        Normalize::Yes => Some(Tensor::empty(gpu, &[alg.grades(), d.batch], DType::F32)?),
        Normalize::No => None,
    };
    if out.numel() == 0 {
        return Ok(Forward {
            out,
            norms,
            linear_out: None,
        });
    }
    if !fc_mix_from_inputs(gpu, alg, (x, y), d, (weight, m), &out, precision)? {
        fc_mix_in_phases(gpu, alg, (x, y), d, (weight, m), &out, precision)?;
    }
    if let Some(r) = &norms {
        // In place: each thread rewrites only the elements it read, after the block's reduction, so
        // no second (C, B, N_out) buffer is held.
        grade_norm(gpu, alg, &out, &out, r, d.batch as u64, m as u64)?;
    }
    Ok(Forward {
        out,
        norms,
        linear_out: None,
    })
}

/// The most input and output features of an fc forward whose mixing builds its pair terms itself
/// ([`fc_mix_from_inputs`]). At N = N_out = 128 that forward took 23% to 64% less GPU time than
/// the pair buffer's (2D and 3D, B 1024 to 8192); at 512 and 1024 features, where the products
/// are bound by the tensor cores, 2% to 54% more (it does 16 products of depth N a row in 2D
/// against 14, 64 against 44 in 3D, with a two-stage ring): docs/PERF_NOTES.md, "The fc
/// forward's pair terms built in the product".
const FC_PAIR_PRODUCT_MAX_FEATURES: usize = 128;

/// The fc forward's feature mixing without a pair buffer ([`gemm_pairs`]: its product builds the
/// pair terms from x and from y scaled by both gates, `fc_gate_y`), at up to
/// [`FC_PAIR_PRODUCT_MAX_FEATURES`] features in and out and where W's tf32 parts (`2 P N M`
/// floats) take no more memory than twice x (`2 C B N`), i.e. `P M <= C B`; ys takes one x more.
/// Returns `Ok(false)` where it does not apply (see [`gemm_pairs`]), having launched nothing.
fn fc_mix_from_inputs(
    gpu: &Gpu,
    alg: Algebra,
    (x, y): (&Tensor, &Tensor),
    d: Dims,
    (weight, m): (&Tensor, usize),
    out: &Tensor,
    precision: Precision,
) -> Result<bool> {
    let (c, b, n) = (alg.components(), d.batch, d.features);
    if n.max(m) > FC_PAIR_PRODUCT_MAX_FEATURES || alg.paths() * m > c * b {
        return Ok(false);
    }
    let make_ys = || {
        let ys = Tensor::empty(gpu, &[c, b, n], DType::F32)?;
        let bn = (b * n) as u64;
        launch_elementwise(
            gpu,
            alg.kernel(Kernel::GateY),
            bn,
            &[
                &ByValue(x.raw()),
                &ByValue(y.raw()),
                &ByValue(ys.raw()),
                &bn,
            ],
        )?;
        Ok(ys)
    };
    gemm_pairs(
        gpu,
        (x.raw(), make_ys),
        (c, b, n),
        (weight.raw(), alg.paths(), m),
        &alg.pair_terms(),
        out.raw(),
        precision,
    )
}

/// The fc forward's feature mixing through the pair buffer, in two phases
/// ([`Algebra::fc_phases`]): each phase's pairs are written, mixed and freed before the next,
/// so a forward holds about half the buffer (its backward takes the same phases). The cost:
/// each phase reads x and y and computes the gates again, and in 2D grade 1's product runs as two
/// (one a phase), each with its own split pass over the grade's weights (docs/PERF_NOTES.md, "The
/// fc forward in two phases"). Weights stacked for the products (builds without the gather) are
/// freed on return, before the norm.
fn fc_mix_in_phases(
    gpu: &Gpu,
    alg: Algebra,
    (x, y): (&Tensor, &Tensor),
    d: Dims,
    (weight, m): (&Tensor, usize),
    out: &Tensor,
    precision: Precision,
) -> Result<()> {
    let mut stacked = None;
    let groups = alg.fc_groups();
    for range in alg.fc_phases() {
        let phase: Vec<FcGroup> = groups.iter().filter_map(|g| g.within(range)).collect();
        let pairs = fc_pairs(gpu, alg, (x, y), d, range)?;
        fc_mix(
            gpu,
            alg,
            &phase,
            (&pairs, range.0),
            (weight, &mut stacked),
            out,
            d,
            m,
            precision,
        )?;
    }
    Ok(())
}

/// N_out of an fc weight `(P, N_in, N_out)` that matches `d`.
fn fc_out_features(op: &'static str, weight: &Tensor, d: Dims) -> Result<usize> {
    let m = match *weight.shape() {
        [_, _, m] => m,
        _ => 0,
    };
    check_param(
        op,
        "weight",
        weight,
        &[d.algebra.paths(), d.features, m],
        "(P, N_in, N_out)",
    )?;
    Ok(m)
}

/// Backward of [`fcgp_forward`]: grad_x, grad_y `(C, B, N_in)`, grad_weight `(P, N_in, N_out)`, at
/// [`Precision::default()`] ([`fcgp_backward_with`] chooses).
pub fn fcgp_backward(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    fwd: &Forward,
    grad_out: &Tensor,
) -> Result<Grads> {
    fcgp_backward_with(x, y, weight, fwd, grad_out, Precision::default())
}

/// [`fcgp_backward`] with the precision of its matrix products.
pub fn fcgp_backward_with(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    fwd: &Forward,
    grad_out: &Tensor,
    precision: Precision,
) -> Result<Grads> {
    const OP: &str = "clifford fcgp_backward";
    let d = check_pair(OP, x, y)?;
    same_device_and_dtype(OP, x, weight)?;
    same_device_and_dtype(OP, x, grad_out)?;
    let m = fc_out_features(OP, weight, d)?;
    check_saved(OP, d, m, fwd, grad_out)?;
    let (alg, gpu) = (d.algebra, x.gpu());
    if weight.numel() == 0 && x.numel() == 0 {
        return Ok(Grads {
            grad_x: Tensor::empty(gpu, x.shape(), DType::F32)?,
            grad_y: Tensor::empty(gpu, x.shape(), DType::F32)?,
            grad_weight: Tensor::empty(gpu, weight.shape(), DType::F32)?,
        });
    }
    let gu = fc_norm_grad(alg, fwd, grad_out, (d.batch, m))?;
    // The pair buffer (`slots * B * N`: 3.5x the input in 2D, 5.5x in 3D) is the largest buffer,
    // so it is never held whole, and no pair term is held beside the input gradients (only half a
    // buffer of pair-term gradients is): the backward makes two passes, each in the forward's two
    // phases ([`Algebra::fc_phases`]). The first writes a
    // phase's pairs, reads them for its groups' weight gradients and frees them. The second
    // writes a phase's pair-term gradients (a product that needs no pairs, only a buffer of their
    // shape) and adds what they give to grad x and grad y, allocated only now. The gate's backward
    // is linear, so the phases' shares sum.
    let grad_weight = fc_weight_grads(alg, (x, y), d, (&gu, m), weight.shape(), precision)?;
    let (grad_x, grad_y) = fc_input_grads(alg, (x, y), d, (&gu, m), weight, precision)?;
    Ok(Grads {
        grad_x,
        grad_y,
        grad_weight,
    })
}

/// The gradient of the fc forward's output before its norm (`gu (C, B, M)`): `grad_out` itself
/// when the forward did not normalise, otherwise the norm's backward from the saved output and
/// norms.
fn fc_norm_grad(
    alg: Algebra,
    fwd: &Forward,
    grad_out: &Tensor,
    (b, m): (usize, usize),
) -> Result<Tensor> {
    let Some(r) = &fwd.norms else {
        return Ok(grad_out.clone());
    };
    let gpu = grad_out.gpu();
    let gu = Tensor::empty(gpu, grad_out.shape(), DType::F32)?;
    let (rows, mm) = (b as u64, m as u64);
    launch(
        gpu,
        alg.kernel(Kernel::Dot),
        grid_blocks(rows, 1),
        ROW_BLOCK,
        &[
            &ByValue(grad_out.raw()),
            &ByValue(fwd.out.raw()),
            &ByValue(NONE),
            &ByValue(r.raw()),
            &ByValue(gu.raw()),
            &rows,
            &mm,
        ],
    )?;
    Ok(gu)
}

/// The groups of the fc variant ([`Algebra::fc_groups`]) with components in phase `range`, each
/// restricted to them ([`FcGroup::within`]), with its index among all groups.
fn fc_groups_in(groups: &[FcGroup], range: (usize, usize)) -> Vec<(usize, FcGroup)> {
    groups
        .iter()
        .enumerate()
        .filter_map(|(i, g)| Some((i, g.within(range)?)))
        .collect()
}

/// The fc backward's first pass: the weight gradient `(P, N, M)` from each phase's pair terms,
/// written and freed phase by phase ([`fcgp_backward_with`]).
fn fc_weight_grads(
    alg: Algebra,
    (x, y): (&Tensor, &Tensor),
    d: Dims,
    (gu, m): (&Tensor, usize),
    weight_shape: &[usize],
    precision: Precision,
) -> Result<Tensor> {
    let (gpu, b, n) = (x.gpu(), d.batch, d.features);
    let groups = alg.fc_groups();
    let grad_stacked = Tensor::empty(gpu, weight_shape, DType::F32)?;
    // A group split between the phases (2D grade 1) sums its weight gradient over both: its
    // components are the product's depth.
    let mut begun = vec![false; groups.len()];
    for range in alg.fc_phases() {
        let pairs = fc_pairs(gpu, alg, (x, y), d, range)?;
        for (i, grp) in fc_groups_in(&groups, range) {
            // dW_g (paths*N, M) (+)= pairs_g^T (paths*N, count*B) @ gu_g (count*B, M)
            let acc = if begun[i] {
                Accumulate::Add
            } else {
                Accumulate::Overwrite
            };
            begun[i] = true;
            gemm(
                gpu,
                GemmShape {
                    m: grp.paths.len() * n,
                    n: m,
                    k: grp.count * b,
                    batch: 1,
                },
                grp.pairs((&pairs, range.0), (b, n), Transpose::Yes),
                grp.rows(gu, (b, m)),
                grp.weights(&grad_stacked, (n, m), Transpose::No),
                None,
                acc,
                precision,
            )?;
        }
    }
    let grad_weight = Tensor::empty(gpu, weight_shape, DType::F32)?;
    fc_unstack_weights(gpu, alg, &grad_stacked, &grad_weight)?;
    Ok(grad_weight)
}

/// How many of a group's `paths` one pair-term gradient product of the fc backward's second pass
/// takes (its columns, `paths * N` wide, split by paths): all of them, unless the group's tf32
/// weight parts (the sm_90 split pass writes `planes * paths * N * M` floats for the product) take
/// at least the product's output (`rows * paths * N`). Then, among the counts whose products (the
/// last takes `paths % c`) still run as many CTAs as the whole product (output tiles times depth
/// slices, up to the split rule's target), the one whose largest product holds the fewest bytes
/// of parts and split-K workspace; ties go to more paths (fewer launches). At 2D B1024 N1024 that
/// is 2 of grade 1's 4 paths (32 -> 16 MiB, 128 tiles each); at N512 every count below 4 runs
/// fewer CTAs or holds a workspace as large as the parts it saves: 3 + 1 paths (6 MiB against 8,
/// but 96 and 64 CTAs) made the forward+backward slower by about a tenth (docs/PERF_NOTES.md,
/// "Split products in turn (measured, deleted); the fc backward's path chunks").
fn pair_grad_paths_per_product(
    paths: usize,
    rows: usize,
    (n, m): (usize, usize),
    precision: Precision,
) -> usize {
    use gpu::params::{matmul_tf32 as tf, matmul_wg_tf32 as wg};
    let planes = match precision {
        Precision::Tf32x3 => 2,
        Precision::Tf32 => 1,
        Precision::Ieee => return paths,
    };
    let parts = |c: usize| planes * c * n * m;
    // An empty product (no paths, rows, columns or depth) launches nothing, and `split_k` needs
    // tiles.
    if paths == 0 || rows == 0 || n == 0 || m == 0 || parts(paths) < rows * paths * n {
        return paths;
    }
    // (CTAs, floats held beside the output) of a product of `c` paths.
    let product = |c: usize| {
        let cols = (c * n) as u64;
        let (splits, _) = tf::split_k(rows as u64, cols, m as u64);
        let workspace = if splits > 1 {
            splits as usize * rows * c * n
        } else {
            0
        };
        // The persistent walk's tiles: output tiles times depth slices.
        let walk = wg::tiles(rows as u64, cols, splits as u64, wg::BN);
        (walk.min(tf::TARGET_BLOCKS), parts(c) + workspace)
    };
    let whole = product(paths).0;
    (1..=paths)
        .filter_map(|c| {
            let (ctas, held) = product(c);
            let (last_ctas, last_held) = match paths % c {
                0 => (ctas, held),
                r => product(r),
            };
            (ctas >= whole && last_ctas >= whole)
                .then_some((held.max(last_held), std::cmp::Reverse(c)))
        })
        .min()
        .map_or(paths, |(_, std::cmp::Reverse(c))| c)
}

/// The fc backward's second pass: grad x and grad y, phase by phase from a buffer of the phase's
/// pair-term gradients `gu_g W_g^T`, which `fc_pairs_bwd` turns into the phase's share of both
/// ([`fcgp_backward_with`]).
fn fc_input_grads(
    alg: Algebra,
    (x, y): (&Tensor, &Tensor),
    d: Dims,
    (gu, m): (&Tensor, usize),
    weight: &Tensor,
    precision: Precision,
) -> Result<(Tensor, Tensor)> {
    let (gpu, b, n) = (x.gpu(), d.batch, d.features);
    let groups = alg.fc_groups();
    let grad_x = Tensor::empty(gpu, x.shape(), DType::F32)?;
    let grad_y = Tensor::empty(gpu, x.shape(), DType::F32)?;
    let mut stacked = None;
    for (phase, range) in alg.fc_phases().into_iter().enumerate() {
        // Every row block of the phase is written by its groups' products below.
        let gpairs = Tensor::empty(gpu, &[range.1 - range.0, b, n], DType::F32)?;
        for (_, grp) in fc_groups_in(&groups, range) {
            // d pairs_g (count*B, paths*N) = gu_g (count*B, M) @ W_g^T, `per` paths (column
            // blocks of d pairs_g) a product.
            let rows = grp.count * b;
            let per = if gpu.ptx_arch() == "sm_90" {
                pair_grad_paths_per_product(grp.paths.len(), rows, (n, m), precision)
            } else {
                grp.paths.len()
            };
            let a = grp.rows(gu, (b, m));
            let c_all = grp.pairs((&gpairs, range.0), (b, n), Transpose::No);
            for p0 in (0..grp.paths.len()).step_by(per.max(1)) {
                let p1 = (p0 + per).min(grp.paths.len());
                let part = FcGroup {
                    paths: grp.paths[p0..p1].to_vec(),
                    stacked: grp.stacked + p0,
                    ..grp.clone()
                };
                let shape = GemmShape {
                    m: rows,
                    n: (p1 - p0) * n,
                    k: m,
                    batch: 1,
                };
                let c = Operand {
                    raw: offset(c_all.raw, (p0 * n) as u64),
                    ..c_all
                };
                let w = (&part, weight, &mut stacked, Transpose::Yes);
                fc_weight_product(gpu, alg, shape, a, w, c, (n, m), precision)?;
            }
        }
        let bn = (b * n) as u64;
        if bn > 0 {
            launch(
                gpu,
                alg.kernel(Kernel::PairsBwd),
                grid_blocks(bn, FC_BWD_BLOCK as u64),
                FC_BWD_BLOCK,
                &[
                    &ByValue(x.raw()),
                    &ByValue(y.raw()),
                    &ByValue(gpairs.raw()),
                    &ByValue(grad_x.raw()),
                    &ByValue(grad_y.raw()),
                    &bn,
                    &(n as u64),
                    &(phase as u32),
                ],
            )?;
        }
    }
    Ok((grad_x, grad_y))
}

/// How the layer's geometric product mixes features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpMode {
    /// sgp: one weight vector per feature, `gp_weight (N, P)`.
    PerFeature,
    /// fcgp: `gp_weight (P, N, N)`.
    FullyConnected,
}

/// The full block: `y = per-grade linear(x) + bias`, then `RMSNorm(GP(gelu(x), gelu(y)))`; no
/// residual. The bias is added to every component (see the module docs: it breaks equivariance when
/// non-zero).
#[derive(Clone, Debug)]
pub struct Layer {
    pub algebra: Algebra,
    pub mode: GpMode,
    pub normalize: Normalize,
    /// `(G, N, N)`: `y[c, b, m] = sum_n x[c, b, n] W[grade(c), n, m] + bias[m]`.
    pub linear_weight: Tensor,
    /// `(N)`.
    pub linear_bias: Tensor,
    /// `(N, P)` per feature or `(P, N, N)` fully connected.
    pub gp_weight: Tensor,
    /// Precision of the linear map's and the fc mixing's matrix products, forward and backward.
    pub precision: Precision,
}

/// Gradients of [`Layer`].
#[derive(Clone, Debug)]
pub struct LayerGrads {
    pub grad_x: Tensor,
    pub grad_linear_weight: Tensor,
    pub grad_linear_bias: Tensor,
    pub grad_gp_weight: Tensor,
}

impl Layer {
    /// Uploads host parameters (e.g. from [`reference::LayerParams::init`]).
    pub fn from_host(gpu: &Gpu, p: &reference::LayerParams) -> Result<Layer> {
        let layer = Layer {
            algebra: p.algebra,
            mode: p.mode,
            normalize: p.normalize,
            linear_weight: Tensor::from_host(gpu, &p.linear_weight)?,
            linear_bias: Tensor::from_host(gpu, &p.linear_bias)?,
            gp_weight: Tensor::from_host(gpu, &p.gp_weight)?,
            precision: Precision::default(),
        };
        layer.check("clifford Layer", p.linear_bias.numel())?;
        Ok(layer)
    }

    /// The same layer with its matrix products at `precision`.
    pub fn with_precision(mut self, precision: Precision) -> Layer {
        self.precision = precision;
        self
    }

    fn check(&self, op: &'static str, n: usize) -> Result<()> {
        let (g, pp) = (self.algebra.grades(), self.algebra.paths());
        check_param(
            op,
            "linear_weight",
            &self.linear_weight,
            &[g, n, n],
            "(G, N, N)",
        )?;
        check_param(op, "linear_bias", &self.linear_bias, &[n], "(N)")?;
        match self.mode {
            GpMode::PerFeature => check_param(op, "gp_weight", &self.gp_weight, &[n, pp], "(N, P)"),
            GpMode::FullyConnected => {
                check_param(op, "gp_weight", &self.gp_weight, &[pp, n, n], "(P, N, N)")
            }
        }
    }

    fn check_input(&self, op: &'static str, x: &Tensor) -> Result<Dims> {
        let d = check_multivectors(op, "x", x)?;
        same_device_and_dtype(op, x, &self.linear_weight)?;
        if d.algebra != self.algebra {
            return Err(Error::Shape {
                op,
                what: "wrong component count for this layer's algebra".into(),
                expected: format!("{} components in dim 0", self.algebra.components()),
                got: x.shape().to_vec(),
            });
        }
        self.check(op, d.features)?;
        Ok(d)
    }

    /// The per-grade linear map plus bias: one product per component, each with its grade's
    /// weight (one launch where the kernels gather B by grade).
    fn linear(&self, x: &Tensor, d: Dims) -> Result<Tensor> {
        let gpu = x.gpu();
        let y = Tensor::empty(gpu, x.shape(), DType::F32)?;
        let (b, n) = (d.batch, d.features);
        let slab = |raw, trans| Operand {
            raw,
            ld: n as u64,
            trans,
            stride: (b * n) as u64,
        };
        gemm_gathered(
            gpu,
            self.per_component(b, n),
            slab(x.raw(), Transpose::No),
            self.weight_by_grade(n, Transpose::No),
            self.algebra.blade_grades(),
            slab(y.raw(), Transpose::No),
            Some(self.linear_bias.raw()),
            Accumulate::Overwrite,
            self.precision,
        )?;
        Ok(y)
    }

    /// The linear map's products, one per component: `(B, N) x (N, N)`.
    fn per_component(&self, b: usize, n: usize) -> GemmShape {
        GemmShape {
            m: b,
            n,
            k: n,
            batch: self.algebra.components(),
        }
    }

    /// `linear_weight` as the B operand whose batch entries are the grades.
    fn weight_by_grade(&self, n: usize, trans: Transpose) -> Operand {
        Operand {
            raw: self.linear_weight.raw(),
            ld: n as u64,
            trans,
            stride: (n * n) as u64,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Forward> {
        const OP: &str = "clifford Layer::forward";
        let d = self.check_input(OP, x)?;
        let y = self.linear(x, d)?;
        let mut f = match self.mode {
            GpMode::PerFeature => sgp_forward(x, &y, &self.gp_weight, self.normalize)?,
            GpMode::FullyConnected => {
                fcgp_forward_with(x, &y, &self.gp_weight, self.normalize, self.precision)?
            }
        };
        f.linear_out = Some(y);
        Ok(f)
    }

    /// Backward from the forward's saved state; the linear output is `fwd.linear_out`, or recomputed
    /// from x when that is `None`.
    pub fn backward(&self, x: &Tensor, fwd: &Forward, grad_out: &Tensor) -> Result<LayerGrads> {
        const OP: &str = "clifford Layer::backward";
        let d = self.check_input(OP, x)?;
        let gpu = x.gpu();
        let recomputed;
        let y = match &fwd.linear_out {
            Some(y) => {
                same_device_and_dtype(OP, x, y)?;
                if y.shape() != x.shape() {
                    return Err(Error::Shape {
                        op: OP,
                        what: "fwd.linear_out must have the input's shape (C, B, N)".into(),
                        expected: format!("{:?}", x.shape()),
                        got: y.shape().to_vec(),
                    });
                }
                y
            }
            None => {
                recomputed = self.linear(x, d)?;
                &recomputed
            }
        };
        let g = match self.mode {
            GpMode::PerFeature => sgp_backward(x, y, &self.gp_weight, fwd, grad_out)?,
            GpMode::FullyConnected => {
                fcgp_backward_with(x, y, &self.gp_weight, fwd, grad_out, self.precision)?
            }
        };
        let (b, n) = (d.batch, d.features);
        let grad_lw = Tensor::empty(gpu, self.linear_weight.shape(), DType::F32)?;
        let grad_bias = Tensor::empty(gpu, &[n], DType::F32)?;
        let slab = |raw| Operand {
            raw,
            ld: n as u64,
            trans: Transpose::No,
            stride: (b * n) as u64,
        };
        // grad_x (component c) += gy_c (B, N) @ W_grade(c)^T
        gemm_gathered(
            gpu,
            self.per_component(b, n),
            slab(g.grad_y.raw()),
            self.weight_by_grade(n, Transpose::Yes),
            self.algebra.blade_grades(),
            slab(g.grad_x.raw()),
            None,
            Accumulate::Add,
            self.precision,
        )?;
        for gr in 0..self.algebra.grades() {
            let (j0, count) = self.algebra.grade_span(gr);
            let gy = Operand {
                raw: offset(g.grad_y.raw(), (j0 * b * n) as u64),
                ld: n as u64,
                trans: Transpose::No,
                stride: 0,
            };
            // grad W_g (N, N) = x_slab^T @ gy: the grade's components are one (count * B) depth.
            gemm(
                gpu,
                GemmShape {
                    m: n,
                    n,
                    k: count * b,
                    batch: 1,
                },
                Operand {
                    raw: offset(x.raw(), (j0 * b * n) as u64),
                    ld: n as u64,
                    trans: Transpose::Yes,
                    stride: 0,
                },
                gy,
                Operand {
                    raw: offset(grad_lw.raw(), (gr * n * n) as u64),
                    ld: n as u64,
                    trans: Transpose::No,
                    stride: 0,
                },
                None,
                Accumulate::Overwrite,
                self.precision,
            )?;
        }
        if n > 0 {
            col_sum(
                gpu,
                &g.grad_y,
                &grad_bias,
                (self.algebra.components() * b) as u64,
                n as u64,
            )?;
        }
        Ok(LayerGrads {
            grad_x: g.grad_x,
            grad_linear_weight: grad_lw,
            grad_linear_bias: grad_bias,
            grad_gp_weight: g.grad_weight,
        })
    }
}

pub mod reference;

#[cfg(test)]
mod tests;
