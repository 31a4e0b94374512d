//! The op families, one module each, every op in the same shape: parameters, validation (typed errors,
//! no launch), a CPU reference in `reference` (f64 accumulation), the typed launcher, tests.
//!
//! Empty tensors (a zero-sized dim) are a documented no-op: the op returns an empty output of the right
//! shape without launching anything, except where the result is undefined (max/mean over nothing),
//! which is an [`crate::Error::Invalid`].
pub mod attention;
pub mod clifford;
pub mod elementwise;
pub mod embedding;
pub mod layer_norm;
pub mod lrp;
pub mod matmul;
pub mod reduce;
pub mod softmax;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Both tensors on one GPU and of one dtype.
pub(crate) fn same_device_and_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if !a.gpu().same_device(b.gpu()) {
        return Err(Error::DeviceMismatch { op });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DType {
            op,
            expected: format!("{} (the first operand's dtype)", a.dtype()),
            got: b.dtype(),
        });
    }
    Ok(())
}

/// Equal shapes, for ops without broadcasting.
pub(crate) fn same_shape(
    op: &'static str,
    what: &str,
    expected: &[usize],
    got: &[usize],
) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::Shape {
            op,
            what: what.to_string(),
            expected: format!("{expected:?}"),
            got: got.to_vec(),
        })
    }
}

/// Whether the vectorised (16-byte) kernels may read/write these tensors' base addresses.
pub(crate) fn aligned16(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.device_ptr() % 16 == 0)
}
