//! Tiled f32 matrix multiply `op(A) op(B)`, 2-D or batched 3-D, either operand transposed, any sizes.
//! One kernel (`matmul_f32`, see `gpu/src/kernels/matmul.rs`): 128 x 128 output tiles, 8 x 8 register
//! micro-tiles, fixed k order per element, so the same inputs give the same bits on every run. Full
//! fp32 math (no TF32).
//!
//! The crate-internal [`gemm`] is the same kernel on raw operands (offsets into larger buffers, leading
//! dims, `C += ...`, a bias row): the Clifford layers build their feature mixing on it.
use gpu::params::matmul::{BM, BN, MAX_GRID_YZ, THREADS};
use gpu::params::{Matmul, RawSlice};

use crate::DType;
use crate::error::{Error, Result};
use crate::launch::{ByValue, launch_cfg};
use crate::ops::same_device_and_dtype;
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
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let no_bias = RawSlice { ptr: 0, len: 0 };
    launch_cfg(
        gpu,
        "matmul_f32",
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

/// (batch, rows, cols) of a rank-2 or rank-3 operand (batch 1 for rank 2).
fn batch_rows_cols(what: &'static str, t: &Tensor) -> Result<(Option<usize>, usize, usize)> {
    match *t.shape() {
        [r, c] => Ok((None, r, c)),
        [b, r, c] => Ok((Some(b), r, c)),
        _ => Err(Error::Shape {
            op: "matmul",
            what: format!("{what} must be a matrix (rank 2) or a batch of matrices (rank 3)"),
            expected: "rank 2 or 3".into(),
            got: t.shape().to_vec(),
        }),
    }
}

/// `op(a) op(b)`: a is `(M, K)` (or `(K, M)` with `ta = Yes`), b is `(K, N)` (or `(N, K)`), each
/// optionally with a leading batch dim; a 2-D operand is broadcast over the other's batch. f32,
/// contiguous.
pub fn matmul(a: &Tensor, b: &Tensor, ta: Transpose, tb: Transpose) -> Result<Tensor> {
    const OP: &str = "matmul";
    same_device_and_dtype(OP, a, b)?;
    if a.dtype() != DType::F32 {
        return Err(Error::DType {
            op: OP,
            expected: "f32".into(),
            got: a.dtype(),
        });
    }
    a.require_contiguous(OP, "a")?;
    b.require_contiguous(OP, "b")?;
    let (ab, ar, ac) = batch_rows_cols("a", a)?;
    let (bb, br, bc) = batch_rows_cols("b", b)?;
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
            op: OP,
            what: format!("inner dims differ: op(a) is {m} x {ka}"),
            expected: format!("op(b) with {ka} rows"),
            got: b.shape().to_vec(),
        });
    }
    let batch = match (ab, bb) {
        (Some(x), Some(y)) if x != y => {
            return Err(Error::Shape {
                op: OP,
                what: "batch sizes differ".into(),
                expected: format!("b with batch {x}"),
                got: b.shape().to_vec(),
            });
        }
        (Some(x), _) | (None, Some(x)) => Some(x),
        (None, None) => None,
    };
    let shape: Vec<usize> = match batch {
        Some(bt) => vec![bt, m, n],
        None => vec![m, n],
    };
    let out = Tensor::empty(a.gpu(), &shape, DType::F32)?;
    let operand = |t: &Tensor, batched: bool, r: usize, c: usize, tr: Transpose| Operand {
        raw: t.raw(),
        ld: c as u64,
        trans: tr,
        stride: if batched { (r * c) as u64 } else { 0 },
    };
    gemm(
        a.gpu(),
        GemmShape {
            m,
            n,
            k: ka,
            batch: batch.unwrap_or(1),
        },
        operand(a, ab.is_some(), ar, ac, ta),
        operand(b, bb.is_some(), br, bc, tb),
        Operand {
            raw: out.raw(),
            ld: n as u64,
            trans: Transpose::No,
            stride: (m * n) as u64,
        },
        None,
        Accumulate::Overwrite,
    )?;
    Ok(out)
}

/// CPU reference in f64.
pub mod reference {
    use super::Transpose;
    use crate::error::{Error, Result};
    use crate::tensor::HostTensor;

    /// `op(a) op(b)` with the same shape rules as [`super::matmul`].
    pub fn matmul(
        a: &HostTensor,
        b: &HostTensor,
        ta: Transpose,
        tb: Transpose,
    ) -> Result<HostTensor> {
        let split = |t: &HostTensor| match *t.shape.as_slice() {
            [r, c] => Ok((None, r, c)),
            [bt, r, c] => Ok((Some(bt), r, c)),
            _ => Err(Error::Invalid {
                op: "matmul (reference)",
                msg: format!("rank {} operand", t.shape.len()),
            }),
        };
        let ((ab, ar, ac), (bb, br, bc)) = (split(a)?, split(b)?);
        let (m, k) = if ta == Transpose::Yes {
            (ac, ar)
        } else {
            (ar, ac)
        };
        let (kb, n) = if tb == Transpose::Yes {
            (bc, br)
        } else {
            (br, bc)
        };
        let batch = ab.or(bb);
        if k != kb || matches!((ab, bb), (Some(x), Some(y)) if x != y) {
            return Err(Error::Invalid {
                op: "matmul (reference)",
                msg: format!("shapes {:?} and {:?} do not multiply", a.shape, b.shape),
            });
        }
        let nb = batch.unwrap_or(1);
        let mut out = Vec::with_capacity(nb * m * n);
        for z in 0..nb {
            let a0 = if ab.is_some() { z * ar * ac } else { 0 };
            let b0 = if bb.is_some() { z * br * bc } else { 0 };
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0f64;
                    for l in 0..k {
                        let av = if ta == Transpose::Yes {
                            a.data[a0 + l * ac + i]
                        } else {
                            a.data[a0 + i * ac + l]
                        };
                        let bv = if tb == Transpose::Yes {
                            b.data[b0 + j * bc + l]
                        } else {
                            b.data[b0 + l * bc + j]
                        };
                        s += av as f64 * bv as f64;
                    }
                    out.push(s as f32);
                }
            }
        }
        let shape: Vec<usize> = match batch {
            Some(bt) => vec![bt, m, n],
            None => vec![m, n],
        };
        HostTensor::new(out, &shape, a.dtype)
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
}
