//! Elementwise ops: `add`, `sub`, `mul`, `div` with full NumPy/PyTorch broadcasting, scalar `affine`
//! (`alpha * x + beta`), exact GELU; and their backward passes. f32, f16 and bf16 (f32 math).
//!
//! Launch choice: same-shape contiguous operands with 16-byte aligned bases take the vectorised kernel
//! (`{op}_{dtype}`, 16-byte loads); anything else — broadcasting, strided views — the strided kernel
//! (`{op}_bcast_{dtype}`).
pub use gpu::params::BinaryOp;
use gpu::params::elementwise::{BINARY_CHUNKS_PER_THREAD, BLOCK, CHUNKS_PER_THREAD, VECTOR_BYTES};

use crate::error::{Error, Result};
use crate::launch::{ByValue, grid_blocks, launch};
use crate::ops::{aligned16, same_device_and_dtype, same_shape};
use crate::shape::{broadcast_shapes, broadcast2};
use crate::tensor::Tensor;
use crate::{DType, kernel_name};

fn binary_kernel(op: BinaryOp, dtype: DType, broadcast: bool) -> &'static str {
    match (op, broadcast) {
        (BinaryOp::Add, false) => kernel_name!("add", dtype),
        (BinaryOp::Sub, false) => kernel_name!("sub", dtype),
        (BinaryOp::Mul, false) => kernel_name!("mul", dtype),
        (BinaryOp::Div, false) => kernel_name!("div", dtype),
        (BinaryOp::Add, true) => kernel_name!("add_bcast", dtype),
        (BinaryOp::Sub, true) => kernel_name!("sub_bcast", dtype),
        (BinaryOp::Mul, true) => kernel_name!("mul_bcast", dtype),
        (BinaryOp::Div, true) => kernel_name!("div_bcast", dtype),
    }
}

/// Grid for a vectorised kernel over `numel` elements of `dtype`.
fn vector_grid(numel: usize, dtype: DType) -> u32 {
    let chunks = (numel * dtype.size_bytes() / VECTOR_BYTES).max(1) as u64;
    grid_blocks(chunks, (BLOCK * CHUNKS_PER_THREAD) as u64)
}

/// Which binary kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// The vectorised kernel when operands allow it, else the strided one.
    Auto,
    /// Always the strided (broadcasting) kernel: for tests that cover it on same-shape inputs, and as
    /// the deliberately slower variant that proves `xtask bench-compare` flags a regression.
    Strided,
}

/// `a (op) b` with broadcasting. Operands may be strided views.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary_on(op, a, b, KernelPath::Auto)
}

/// [`binary`] with the kernel choice made explicit.
pub fn binary_on(op: BinaryOp, a: &Tensor, b: &Tensor, path: KernelPath) -> Result<Tensor> {
    same_device_and_dtype("elementwise binary", a, b)?;
    let out_shape = broadcast_shapes(a.shape(), b.shape())?;
    let mut out = Tensor::empty(a.gpu(), &out_shape, a.dtype())?;
    binary_into_on(op, a, b, &mut out, path)?;
    Ok(out)
}

/// `out = a (op) b` into an existing tensor (no allocation; PyTorch's `torch.add(a, b, out=out)`):
/// `out` must be contiguous, of the broadcast shape of `a` and `b`, and of their dtype. `out` must
/// not overlap `a` or `b` unless it is exactly one of them (elementwise, each element is read
/// before it is written by the same thread).
///
/// ```no_run
/// # fn main() -> host::Result<()> {
/// use host::ops::elementwise::{binary_into, BinaryOp};
/// let gpu = host::Gpu::new(0)?;
/// let a = host::Tensor::from_host(&gpu, &host::HostTensor::new(vec![1.0, 2.0], &[2], host::DType::F32)?)?;
/// let b = host::Tensor::from_host(&gpu, &host::HostTensor::new(vec![10.0], &[1], host::DType::F32)?)?;
/// let mut out = host::Tensor::empty(&gpu, &[2], host::DType::F32)?;
/// binary_into(BinaryOp::Add, &a, &b, &mut out)?; // out = [11, 12]
/// # Ok(()) }
/// ```
pub fn binary_into(op: BinaryOp, a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<()> {
    binary_into_on(op, a, b, out, KernelPath::Auto)
}

/// [`binary_into`] with the kernel choice made explicit.
pub fn binary_into_on(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    out: &mut Tensor,
    path: KernelPath,
) -> Result<()> {
    const OP: &str = "elementwise binary";
    same_device_and_dtype(OP, a, b)?;
    same_device_and_dtype(OP, a, out)?;
    let out_shape = broadcast_shapes(a.shape(), b.shape())?;
    if out.shape() != out_shape.as_slice() {
        return Err(Error::Shape {
            op: OP,
            what: "out".into(),
            expected: format!("{out_shape:?} (the broadcast shape of the operands)"),
            got: out.shape().to_vec(),
        });
    }
    if !out.is_contiguous() {
        return Err(Error::NotContiguous {
            op: OP,
            what: "out",
            shape: out.shape().to_vec(),
            strides: out.strides().to_vec(),
        });
    }
    let params = broadcast2(
        OP,
        &out_shape,
        (a.shape(), a.strides()),
        (b.shape(), b.strides()),
    )?;
    if out.numel() == 0 {
        return Ok(());
    }
    let out = &*out;
    let auto = path == KernelPath::Auto;
    let fast = auto
        && a.shape() == b.shape()
        && a.is_contiguous()
        && b.is_contiguous()
        && aligned16(&[a, b, out]);
    if auto && !fast && try_rows(op, a, b, out)? {
        return Ok(());
    }
    let name = binary_kernel(op, a.dtype(), !fast);
    if fast {
        let chunk_count = (out.numel() * out.dtype().size_bytes() / VECTOR_BYTES).max(1) as u64;
        launch(
            a.gpu(),
            name,
            grid_blocks(chunk_count, (BLOCK * BINARY_CHUNKS_PER_THREAD) as u64),
            BLOCK,
            &[&ByValue(a.raw()), &ByValue(b.raw()), &ByValue(out.raw())],
        )?;
    } else {
        let grid = grid_blocks(params.numel, BLOCK as u64);
        launch(
            a.gpu(),
            name,
            grid,
            BLOCK,
            &[
                &ByValue(a.raw()),
                &ByValue(b.raw()),
                &ByValue(out.raw()),
                &ByValue(params),
            ],
        )?;
    }
    Ok(())
}

/// The row-broadcast kernel (`[R, C] (op) [C]`, either order) when it applies: one operand has the
/// output's shape, the other's shape is a trailing part of it (after dropping leading 1s), both are
/// contiguous with 16-byte aligned bases, the row is whole 16-byte chunks and the output has fewer than
/// 2^31 chunks. Returns whether it launched (false: the general strided kernel must run).
fn try_rows(op: BinaryOp, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<bool> {
    let is_row_of = |row: &Tensor, full: &Tensor| {
        let trimmed: &[usize] = {
            let s = row.shape();
            let lead = s.iter().take_while(|&&d| d == 1).count();
            &s[lead..]
        };
        full.shape() == out.shape()
            && trimmed.len() < full.shape().len()
            && full.shape().ends_with(trimmed)
    };
    let (full, row, row_first) = if is_row_of(b, a) {
        (a, b, 0u32)
    } else if is_row_of(a, b) {
        (b, a, 1u32)
    } else {
        return Ok(false);
    };
    let per_chunk = a.dtype().chunk_elems();
    let chunks = out.numel() / per_chunk;
    if !(full.is_contiguous() && row.is_contiguous())
        || row.numel() % per_chunk != 0
        || chunks >= 1 << 31
        || !aligned16(&[full, row, out])
    {
        return Ok(false);
    }
    let name = match op {
        BinaryOp::Add => kernel_name!("add_rows", a.dtype()),
        BinaryOp::Sub => kernel_name!("sub_rows", a.dtype()),
        BinaryOp::Mul => kernel_name!("mul_rows", a.dtype()),
        BinaryOp::Div => kernel_name!("div_rows", a.dtype()),
    };
    launch(
        a.gpu(),
        name,
        vector_grid(out.numel(), out.dtype()),
        BLOCK,
        &[
            &ByValue(full.raw()),
            &ByValue(row.raw()),
            &ByValue(out.raw()),
            &((row.numel() / per_chunk) as u32),
            &row_first,
        ],
    )?;
    Ok(true)
}

pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Add, a, b)
}
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Sub, a, b)
}
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Mul, a, b)
}
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(BinaryOp::Div, a, b)
}

/// Checks for the contiguous unary kernels (GELU, affine): contiguous, 16-byte aligned base.
fn unary_input(op: &'static str, x: &Tensor) -> Result<()> {
    x.require_contiguous(op, "input")?;
    if !aligned16(&[x]) {
        return Err(Error::Invalid {
            op,
            msg: "input base address is not 16-byte aligned (a sliced view); call .contiguous()"
                .into(),
        });
    }
    Ok(())
}

/// `x` converted to `dtype` (f32 <-> f16/bf16; the same dtype returns a contiguous copy's handle).
/// Half to f32 is exact; f32 to half rounds to nearest even. NaN and Inf stay NaN and Inf.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return x.contiguous();
    }
    let x = x.contiguous()?;
    let name = match (x.dtype(), dtype) {
        (DType::F16, DType::F32) => "widen_f16",
        (DType::BF16, DType::F32) => "widen_bf16",
        (DType::F32, DType::F16) => "narrow_f16",
        (DType::F32, DType::BF16) => "narrow_bf16",
        // Half to the other half: through f32 (exact widening, one rounding).
        (_, to) => return cast(&cast(&x, DType::F32)?, to),
    };
    let out = Tensor::empty(x.gpu(), x.shape(), dtype)?;
    if out.numel() > 0 {
        launch(
            x.gpu(),
            name,
            grid_blocks(out.numel() as u64, BLOCK as u64),
            BLOCK,
            &[&ByValue(x.raw()), &ByValue(out.raw())],
        )?;
    }
    Ok(out)
}

/// `alpha * x + beta` (scalar ops: scale, add a scalar). Contiguous input.
pub fn affine(x: &Tensor, alpha: f32, beta: f32) -> Result<Tensor> {
    const OP: &str = "affine";
    unary_input(OP, x)?;
    let out = Tensor::empty(x.gpu(), x.shape(), x.dtype())?;
    if out.numel() > 0 {
        let grid = vector_grid(out.numel(), out.dtype());
        launch(
            x.gpu(),
            kernel_name!("affine", x.dtype()),
            grid,
            BLOCK,
            &[&ByValue(x.raw()), &ByValue(out.raw()), &alpha, &beta],
        )?;
    }
    Ok(out)
}

/// Exact GELU, `x * Phi(x)` with the normal CDF through erfc. Contiguous input.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "gelu";
    unary_input(OP, x)?;
    let out = Tensor::empty(x.gpu(), x.shape(), x.dtype())?;
    if out.numel() > 0 {
        let grid = vector_grid(out.numel(), out.dtype());
        launch(
            x.gpu(),
            kernel_name!("gelu", x.dtype()),
            grid,
            BLOCK,
            &[&ByValue(x.raw()), &ByValue(out.raw())],
        )?;
    }
    Ok(out)
}

/// `dx = dy * (Phi(x) + x phi(x))`.
pub fn gelu_backward(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    const OP: &str = "gelu_backward";
    same_device_and_dtype(OP, x, dy)?;
    same_shape(OP, "dy must have the shape of x", x.shape(), dy.shape())?;
    unary_input(OP, x)?;
    unary_input(OP, dy)?;
    let dx = Tensor::empty(x.gpu(), x.shape(), x.dtype())?;
    if dx.numel() > 0 {
        let grid = vector_grid(dx.numel(), dx.dtype());
        launch(
            x.gpu(),
            kernel_name!("gelu_backward", x.dtype()),
            grid,
            BLOCK,
            &[&ByValue(x.raw()), &ByValue(dy.raw()), &ByValue(dx.raw())],
        )?;
    }
    Ok(dx)
}

/// `alpha * sum of grad over the dims broadcast from operand_shape` (the gradient of a broadcast operand).
pub fn reduce_to(grad: &Tensor, operand_shape: &[usize], alpha: f32) -> Result<Tensor> {
    const OP: &str = "reduce_to";
    grad.require_contiguous(OP, "grad")?;
    if broadcast_shapes(operand_shape, grad.shape())? != grad.shape() {
        return Err(Error::Shape {
            op: OP,
            what: format!("operand shape {operand_shape:?} must broadcast to the gradient's shape"),
            expected: format!("{:?}", grad.shape()),
            got: operand_shape.to_vec(),
        });
    }
    let params = crate::shape::reduce_to(OP, grad.shape(), operand_shape)?;
    let out = Tensor::empty(grad.gpu(), operand_shape, grad.dtype())?;
    if out.numel() > 0 {
        let grid = grid_blocks(params.out_numel, BLOCK as u64);
        launch(
            grad.gpu(),
            kernel_name!("reduce_to", grad.dtype()),
            grid,
            BLOCK,
            &[
                &ByValue(grad.raw()),
                &ByValue(out.raw()),
                &ByValue(params),
                &alpha,
            ],
        )?;
    }
    Ok(out)
}

/// `alpha * x` broadcast to `shape` (the gradient of a reduction, expanded back).
pub fn expand(x: &Tensor, shape: &[usize], alpha: f32) -> Result<Tensor> {
    const OP: &str = "expand";
    if broadcast_shapes(x.shape(), shape)? != shape {
        return Err(Error::Shape {
            op: OP,
            what: format!("{:?} must broadcast to the target shape", x.shape()),
            expected: format!("{shape:?}"),
            got: x.shape().to_vec(),
        });
    }
    let params = broadcast2(
        OP,
        shape,
        (x.shape(), x.strides()),
        (x.shape(), x.strides()),
    )?;
    let out = Tensor::empty(x.gpu(), shape, x.dtype())?;
    if out.numel() > 0 {
        let grid = grid_blocks(params.numel, BLOCK as u64);
        launch(
            x.gpu(),
            kernel_name!("expand", x.dtype()),
            grid,
            BLOCK,
            &[
                &ByValue(x.raw()),
                &ByValue(out.raw()),
                &ByValue(params),
                &alpha,
            ],
        )?;
    }
    Ok(out)
}

/// Gradients of `a (op) b` with respect to `a` and `b`, given the upstream gradient `grad` of the
/// broadcast output's shape; each is summed back to its operand's shape.
pub fn binary_backward(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    grad: &Tensor,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "elementwise binary backward";
    same_device_and_dtype(OP, a, b)?;
    same_device_and_dtype(OP, a, grad)?;
    let out_shape = broadcast_shapes(a.shape(), b.shape())?;
    same_shape(
        OP,
        "grad must have the broadcast output shape",
        &out_shape,
        grad.shape(),
    )?;
    let grad = grad.contiguous()?;
    if a.dtype() != DType::F32 && matches!(op, BinaryOp::Mul | BinaryOp::Div) {
        // The per-element terms (g*b, g*a, -(g/b)(a/b)) rounded to half storage before the broadcast
        // sum lose ~3 half ulps each; summed over thousands of broadcast positions with cancellation
        // that reached 2% of the result (measured: dDiv/db f16, [2,4099,5] against a scalar). So the
        // terms and the sum stay in f32 and only the two results are rounded.
        let (ga, gb) = binary_backward(
            op,
            &cast(a, DType::F32)?,
            &cast(b, DType::F32)?,
            &cast(&grad, DType::F32)?,
        )?;
        return Ok((cast(&ga, a.dtype())?, cast(&gb, a.dtype())?));
    }
    let (ga_full, gb_full, gb_sign) = match op {
        BinaryOp::Add => (grad.clone(), grad.clone(), 1.0),
        BinaryOp::Sub => (grad.clone(), grad.clone(), -1.0),
        BinaryOp::Mul => (mul(&grad, b)?, mul(&grad, a)?, 1.0),
        // d(a/b)/db = -a/b^2 = -(g/b)(a/b)
        BinaryOp::Div => {
            let g_over_b = div(&grad, b)?;
            let a_over_b = div(a, b)?;
            let gb = mul(&g_over_b, &a_over_b)?;
            (g_over_b, gb, -1.0)
        }
    };
    Ok((
        reduce_to(&ga_full, a.shape(), 1.0)?,
        reduce_to(&gb_full, b.shape(), gb_sign)?,
    ))
}

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod reference;

#[cfg(test)]
mod tests;
