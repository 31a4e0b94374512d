//! CPU reference in f64.
use super::{MatmulDims, Transpose, matmul_dims};
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

const OP: &str = "matmul (reference)";

/// `op(a) op(b)` with the same shape rules as [`super::matmul`]: products summed in f64 from the
/// (already rounded) input values, the result rounded once to the inputs' dtype.
pub fn matmul(a: &HostTensor, b: &HostTensor, ta: Transpose, tb: Transpose) -> Result<HostTensor> {
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
