//! Matrix multiply `op(A) op(B)`, 2-D or batched 3-D, either operand transposed, any sizes, dispatched
//! by dtype:
//! - f32: `matmul_simt_{nn,nt,tn,tt}_f32` (`gpu/src/kernels/matmul/simt.rs`): double-buffered
//!   shared-memory tiles, 8 x 16 register micro-tiles on CUDA cores, full fp32 math (no TF32);
//! - f16 / bf16: `matmul_tc_{nn,nt,tn,tt}_{f16,bf16}` (`gpu/src/kernels/matmul/tensor_core.rs`):
//!   256 x 128 x 64 tiles through a 3-stage `cp.async` pipeline, `ldmatrix` + `mma.m16n8k16` with f32
//!   accumulation, the result rounded once to the input dtype.
//!
//! Both keep a fixed k order per element, so the same inputs give the same bits on every run.
//!
//! The crate-internal [`gemm`] is the same kernel on raw operands (offsets into larger buffers, leading
//! dims, `C += ...`, a bias row): the Clifford layers build their feature mixing on it.
use gpu::params::matmul::MAX_GRID_YZ;
use gpu::params::matmul_f32v::{self as f32v, BM, BN};
use gpu::params::matmul_tc as tc;
use gpu::params::{Matmul, MatmulTc, RawSlice, RowAccess};

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
pub(crate) fn gemm(
    gpu: &crate::Gpu,
    shape: GemmShape,
    a: Operand,
    b: Operand,
    c: Operand,
    bias: Option<RawSlice>,
    acc: Accumulate,
) -> Result<()> {
    const OP: &str = "matmul";
    let (kernel, threads, smem) = f32_kernel(a.trans, b.trans);
    let GemmShape { m, n, k, batch } = shape;
    if m == 0 || n == 0 || batch == 0 {
        return Ok(());
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
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (
            (n as u64).div_ceil(BN as u64) as u32,
            grid_y as u32,
            batch as u32,
        ),
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
    const NAMES: [&str; 8] = [
        "matmul_tc_nn_f16",
        "matmul_tc_nt_f16",
        "matmul_tc_tn_f16",
        "matmul_tc_tt_f16",
        "matmul_tc_nn_bf16",
        "matmul_tc_nt_bf16",
        "matmul_tc_tn_bf16",
        "matmul_tc_tt_bf16",
    ];
    let d = match dtype {
        DType::F16 => 0,
        DType::BF16 => 4,
        DType::F32 => return None,
    };
    Some(NAMES[d + 2 * (ta == Transpose::Yes) as usize + (tb == Transpose::Yes) as usize])
}

/// `op(a) op(b)`: a is `(M, K)` (or `(K, M)` with `ta = Yes`), b is `(K, N)` (or `(N, K)`), each
/// optionally with a leading batch dim; a 2-D operand is broadcast over the other's batch. Contiguous
/// operands of one dtype; the result has that dtype.
/// - f32: the tiled CUDA-core kernel, full fp32 math.
/// - f16 / bf16: the tensor-core kernels (`mma.sync`, f32 accumulation, one rounding to the dtype at
///   the end). Any sizes; operands whose rows are not 16-byte aligned (a leading dim that is not a
///   multiple of 8, or a view at an odd offset) take a slower element-wise load path.
///
/// Deterministic: the same inputs give the same bits on every run.
pub fn matmul(a: &Tensor, b: &Tensor, ta: Transpose, tb: Transpose) -> Result<Tensor> {
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
        f32_launch(a, b, ta, tb, &d, &out, None, Accumulate::Overwrite)?;
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
    f32_launch(a, b, ta, tb, &d, out, bias, acc)
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

/// CPU reference in f64.
pub mod reference {
    use super::{MatmulDims, Transpose, matmul_dims};
    use crate::error::{Error, Result};
    use crate::tensor::HostTensor;

    const OP: &str = "matmul (reference)";

    /// `op(a) op(b)` with the same shape rules as [`super::matmul`]: products summed in f64 from the
    /// (already rounded) input values, the result rounded once to the inputs' dtype.
    pub fn matmul(
        a: &HostTensor,
        b: &HostTensor,
        ta: Transpose,
        tb: Transpose,
    ) -> Result<HostTensor> {
        let d = dims(a, b, ta, tb)?;
        let mut out = Vec::with_capacity(d.batch.unwrap_or(1) * d.m * d.n);
        for z in 0..d.batch.unwrap_or(1) {
            for i in 0..d.m {
                out.extend(
                    row_f64(a, b, ta, tb, &d, z, i)
                        .into_iter()
                        .map(|v| v as f32),
                );
            }
        }
        HostTensor::new(out, &d.out_shape(), a.dtype)
    }

    /// Row `i` of product `z` of `op(a) op(b)` in f64, unrounded (for tests that check sampled rows
    /// of products too large to compute whole on the CPU).
    pub fn matmul_row(
        a: &HostTensor,
        b: &HostTensor,
        ta: Transpose,
        tb: Transpose,
        z: usize,
        i: usize,
    ) -> Result<Vec<f64>> {
        let d = dims(a, b, ta, tb)?;
        if z >= d.batch.unwrap_or(1) || i >= d.m {
            return Err(Error::Invalid {
                op: OP,
                msg: format!(
                    "row {i} of product {z}: the product is {} x {} x {}",
                    d.batch.unwrap_or(1),
                    d.m,
                    d.n
                ),
            });
        }
        Ok(row_f64(a, b, ta, tb, &d, z, i))
    }

    fn dims(a: &HostTensor, b: &HostTensor, ta: Transpose, tb: Transpose) -> Result<MatmulDims> {
        if a.dtype != b.dtype {
            return Err(Error::DType {
                op: OP,
                expected: format!("{} (the first operand's dtype)", a.dtype),
                got: b.dtype,
            });
        }
        matmul_dims(OP, &a.shape, &b.shape, ta, tb)
    }

    fn row_f64(
        a: &HostTensor,
        b: &HostTensor,
        ta: Transpose,
        tb: Transpose,
        d: &MatmulDims,
        z: usize,
        i: usize,
    ) -> Vec<f64> {
        let ((ar, ac), (br, bc)) = (d.a, d.b);
        let a0 = if d.a_batched { z * ar * ac } else { 0 };
        let b0 = if d.b_batched { z * br * bc } else { 0 };
        let a_at = |l: usize| match ta {
            Transpose::Yes => a.data[a0 + l * ac + i],
            Transpose::No => a.data[a0 + i * ac + l],
        } as f64;
        let mut row = vec![0.0f64; d.n];
        for l in 0..d.k {
            let av = a_at(l);
            for (j, r) in row.iter_mut().enumerate() {
                let bv = match tb {
                    Transpose::Yes => b.data[b0 + j * bc + l],
                    Transpose::No => b.data[b0 + l * bc + j],
                };
                *r += av * bv as f64;
            }
        }
        row
    }
}

#[cfg(test)]
mod tests {
    use super::Transpose::{No, Yes};
    use super::reference::matmul;
    use crate::{DType, HostTensor};

    fn t(data: &[f32], shape: &[usize]) -> HostTensor {
        HostTensor::new(data.to_vec(), shape, DType::F32).unwrap()
    }

    #[test]
    fn reference_products_and_transposes() {
        let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
        let b = t(&[7., 8., 9., 10., 11., 12.], &[3, 2]);
        assert_eq!(
            matmul(&a, &b, No, No).unwrap().data,
            vec![58., 64., 139., 154.]
        );
        // (a^T)^T b^T^T: transposed storage of the same matrices gives the same product.
        let at = t(&[1., 4., 2., 5., 3., 6.], &[3, 2]);
        let bt = t(&[7., 9., 11., 8., 10., 12.], &[2, 3]);
        assert_eq!(
            matmul(&at, &bt, Yes, Yes).unwrap().data,
            vec![58., 64., 139., 154.]
        );
        // Batched a with a broadcast b.
        let ab = t(
            &[1., 2., 3., 4., 5., 6., 1., 0., 0., 0., 1., 0.],
            &[2, 2, 3],
        );
        let out = matmul(&ab, &b, No, No).unwrap();
        assert_eq!(out.shape, vec![2, 2, 2]);
        assert_eq!(out.data, vec![58., 64., 139., 154., 7., 8., 9., 10.]);
        assert!(matmul(&a, &a, No, No).is_err());
    }

    #[test]
    fn shape_rules_name_both_shapes() {
        use super::matmul_dims;
        use crate::Error;
        let e = matmul_dims("matmul", &[4, 5], &[6, 7], No, No).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        assert!(msg.contains("[4, 5]") && msg.contains("[6, 7]"), "{msg}");
        // Transposes change which dim is inner: (5 x 4)^T . (6 x 5)^T = 4 x 6 works.
        let d = matmul_dims("matmul", &[5, 4], &[6, 5], Yes, Yes).unwrap();
        assert_eq!((d.m, d.n, d.k, d.batch), (4, 6, 5, None));
        assert!(matmul_dims("matmul", &[4], &[4, 4], No, No).is_err());
        assert!(matmul_dims("matmul", &[1, 2, 3, 4], &[4, 4], No, No).is_err());
        let e = matmul_dims("matmul", &[2, 3, 4], &[5, 4, 6], No, No).unwrap_err();
        assert!(
            e.to_string().contains("[2, 3, 4]") && e.to_string().contains("[5, 4, 6]"),
            "{e}"
        );
        // A 2-D operand broadcasts over the other's batch.
        let d = matmul_dims("matmul", &[3, 4], &[2, 4, 6], No, No).unwrap();
        assert_eq!(d.batch, Some(2));
        assert!(!d.a_batched && d.b_batched);
        assert_eq!(d.out_shape(), vec![2, 3, 6]);
        // The reference applies the same rules, and refuses mixed dtypes.
        let h = |s: &[usize], dt| HostTensor::new(vec![0.0; s.iter().product()], s, dt).unwrap();
        assert!(matches!(
            matmul(&h(&[4, 5], DType::F16), &h(&[6, 7], DType::F16), No, No),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            matmul(&h(&[4, 5], DType::F16), &h(&[5, 7], DType::BF16), No, No),
            Err(Error::DType { .. })
        ));
    }

    #[test]
    fn tensor_core_limits_and_access_paths() {
        use super::{MatmulDims, row_access, tc_kernel, tc_limits};
        use crate::Error;
        use gpu::params::RowAccess::{Chunks16, Elements};
        let d = |m, n, k, batch| MatmulDims {
            m,
            n,
            k,
            batch,
            a: (m, k),
            b: (k, n),
            a_batched: batch.is_some(),
            b_batched: batch.is_some(),
        };
        assert!(
            tc_limits(
                "matmul",
                &d(1, 1, 1, None),
                &gpu::params::matmul_tc::DEFAULT
            )
            .is_ok()
        );
        assert!(
            tc_limits(
                "matmul",
                &d(1 << 20, 1 << 20, 1 << 31, Some(65_535)),
                &gpu::params::matmul_tc::DEFAULT
            )
            .is_ok()
        );
        for bad in [
            d((1 << 31) + 1, 1, 1, None),
            d(1, 1, (1 << 31) + 1, None),
            d(1, 1, 1, Some(65_536)),
            d(1 << 31, 1 << 31, 1, None),
        ] {
            assert!(
                matches!(
                    tc_limits("matmul", &bad, &gpu::params::matmul_tc::DEFAULT),
                    Err(Error::TooLarge { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(row_access(true, 64, 64 * 32), Chunks16);
        assert_eq!(row_access(true, 64, 0), Chunks16);
        assert_eq!(row_access(true, 1000, 1000 * 4095), Chunks16);
        assert_eq!(row_access(true, 4097, 0), Elements);
        assert_eq!(row_access(false, 64, 0), Elements);
        assert_eq!(row_access(true, 8, 8 * 3 + 4), Elements);
        // Every 16-bit dtype and transpose combination has its own kernel in the matmul module, whose
        // launch bound allows the block the host launches; f32 has none.
        let mut all = std::collections::HashSet::new();
        for dt in [DType::F16, DType::BF16] {
            for (ta, tb) in [(No, No), (No, Yes), (Yes, No), (Yes, Yes)] {
                let name = tc_kernel(dt, ta, tb).unwrap();
                assert!(all.insert(name), "{name} twice");
                assert_eq!(crate::Family::of(name), Some(crate::Family::Matmul), "{name}");
                for arch in ["sm_80", "sm_90"] {
                    let bound = crate::modules::launch_bounds(name, arch).map(|b| b.0);
                    assert_eq!(bound, Some(gpu::params::matmul_tc::DEFAULT.threads()), "{name} {arch}");
                }
            }
        }
        assert!(tc_kernel(DType::F32, No, No).is_none());
    }

    #[test]
    fn f32_kernels_exist_with_the_launch_bound_the_host_launches_with() {
        let mut all = std::collections::HashSet::new();
        for (ta, tb) in [(No, No), (No, Yes), (Yes, No), (Yes, Yes)] {
            let (name, threads, smem) = super::f32_kernel(ta, tb);
            assert!(all.insert(name), "{name} twice");
            let cfg = gpu::params::matmul_f32v::CONFIG;
            assert_eq!((threads, smem), (cfg.threads(), cfg.smem_bytes()));
            assert_eq!(crate::Family::of(name), Some(crate::Family::Matmul), "{name}");
            for arch in ["sm_80", "sm_90"] {
                let bound = crate::modules::launch_bounds(name, arch).map(|b| b.0);
                assert_eq!(bound, Some(threads), "{name} {arch}");
            }
        }
    }

    #[test]
    fn tile_order_visits_every_tile_once() {
        use gpu::params::matmul_tc::{GROUP_M, tile_coords};
        for (tm, tn) in [(1u32, 1u32), (3, 5), (8, 1), (17, 3), (64, 32), (9, 9)] {
            let mut seen = vec![false; (tm * tn) as usize];
            for bid in 0..tm * tn {
                let (i, j) = tile_coords(bid, tm, tn);
                assert!(
                    i < tm && j < tn,
                    "bid {bid} -> ({i}, {j}) outside {tm} x {tn}"
                );
                let at = (i * tn + j) as usize;
                assert!(!seen[at], "tile ({i}, {j}) visited twice");
                seen[at] = true;
                // Consecutive blocks stay inside one group of GROUP_M tile rows.
                assert_eq!(i / GROUP_M, bid / (GROUP_M * tn));
            }
        }
    }

    #[test]
    fn reference_rows_match_the_full_product() {
        use super::reference::matmul_row;
        let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
        let b = t(&[7., 8., 9., 10., 11., 12.], &[3, 2]);
        assert_eq!(matmul_row(&a, &b, No, No, 0, 1).unwrap(), vec![139., 154.]);
        assert!(matmul_row(&a, &b, No, No, 0, 2).is_err());
        assert!(matmul_row(&a, &b, No, No, 1, 0).is_err());
    }
}
