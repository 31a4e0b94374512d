//! Softmax over the last dim, forward and backward. Stable (`exp(x - max)`), rows of any length: up to
//! `MAX_CACHED_COLS` a row is held in registers (one read, one write), longer rows take two passes.
//! A row that is all -inf yields NaN (as in PyTorch); NaN inputs propagate.
use gpu::params::softmax::{CACHE_PER_THREAD, block_for};

use crate::error::{Error, Result};
use crate::kernel_name;
use crate::launch::{ByValue, grid_blocks, launch};
use crate::ops::{aligned16, same_device_and_dtype, same_shape};
use crate::tensor::Tensor;

/// Threads per row: enough to hold the row in registers (`block_for`), capped at what the kernel can
/// launch with on this device. A smaller block only moves long rows to the two-pass path (the kernel
/// picks the path from its block size), so the cap never changes results.
fn block(gpu: &crate::Gpu, name: &'static str, cols: u64) -> Result<u32> {
    Ok(block_for(cols).min(gpu.max_block_pow2(name)?))
}

/// (rows, cols) of a contiguous tensor viewed as a matrix over its last dim.
fn rows_cols(op: &'static str, x: &Tensor) -> Result<(u64, u64)> {
    x.require_contiguous(op, "input")?;
    let cols = *x.shape().last().ok_or(Error::Shape {
        op,
        what: "softmax needs a last dim".into(),
        expected: "rank >= 1".into(),
        got: vec![],
    })?;
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    Ok((rows as u64, cols as u64))
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "softmax";
    let (rows, cols) = rows_cols(OP, x)?;
    let y = Tensor::empty(x.gpu(), x.shape(), x.dtype())?;
    if y.numel() > 0 {
        // The 16-byte path needs whole chunks per row, aligned bases and the row in one block's
        // registers; anything else takes the scalar kernel (same math, same results up to rounding of
        // the block reduction order, which both fix per row length).
        let vec_name = kernel_name!("softmax_vec", x.dtype());
        let vec_block = block(x.gpu(), vec_name, cols)?;
        let (name, threads) = if cols % x.dtype().chunk_elems() as u64 == 0
            && cols <= vec_block as u64 * CACHE_PER_THREAD as u64
            && aligned16(&[x, &y])
        {
            (vec_name, vec_block)
        } else {
            let name = kernel_name!("softmax", x.dtype());
            (name, block(x.gpu(), name, cols)?)
        };
        launch(
            x.gpu(),
            name,
            grid_blocks(rows, 1),
            threads,
            &[&ByValue(x.raw()), &ByValue(y.raw()), &rows, &cols],
        )?;
    }
    Ok(y)
}

/// `dx = y * (dy - sum(y * dy))` per row, from the forward output `y` and upstream `dy`.
pub fn softmax_backward(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    const OP: &str = "softmax_backward";
    same_device_and_dtype(OP, y, dy)?;
    same_shape(OP, "dy must have the shape of y", y.shape(), dy.shape())?;
    dy.require_contiguous(OP, "dy")?;
    let (rows, cols) = rows_cols(OP, y)?;
    let dx = Tensor::empty(y.gpu(), y.shape(), y.dtype())?;
    if dx.numel() > 0 {
        launch(
            y.gpu(),
            kernel_name!("softmax_backward", y.dtype()),
            grid_blocks(rows, 1),
            block(y.gpu(), kernel_name!("softmax_backward", y.dtype()), cols)?,
            &[
                &ByValue(y.raw()),
                &ByValue(dy.raw()),
                &ByValue(dx.raw()),
                &rows,
                &cols,
            ],
        )?;
    }
    Ok(dx)
}

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod reference;

#[cfg(test)]
mod tests;
