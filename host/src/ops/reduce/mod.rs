//! Reductions: sum, mean and max over the last dim or over all elements; backward for sum and mean.
//! Deterministic: summation order depends only on the shape (no float atomics), so the same input gives
//! the same bits on every run. f32 accumulation in a fixed tree; f16/bf16 outputs are rounded once.
use gpu::params::reduce::{BLOCK, MAX_PARTIALS, MIN_ELEMS_PER_BLOCK};

use crate::error::{Error, Result};
use crate::launch::{ByValue, grid_blocks, launch};
use crate::ops::elementwise::expand;
use crate::tensor::Tensor;
use crate::{DType, kernel_name};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    Sum,
    Mean,
    /// NaN-propagating maximum.
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Over the last dim: output shape is the input's without its last dim.
    Last,
    /// Over every element: output shape is `[]` (a scalar).
    All,
}

fn rows_kernel(r: Reduction, d: DType) -> &'static str {
    match r {
        Reduction::Sum => kernel_name!("sum_rows", d),
        Reduction::Mean => kernel_name!("mean_rows", d),
        Reduction::Max => kernel_name!("max_rows", d),
    }
}

fn stage_kernels(r: Reduction, d: DType) -> (&'static str, &'static str) {
    match r {
        Reduction::Sum => (
            kernel_name!("sum_partials", d),
            kernel_name!("sum_finish", d),
        ),
        Reduction::Mean => (
            kernel_name!("mean_partials", d),
            kernel_name!("mean_finish", d),
        ),
        Reduction::Max => (
            kernel_name!("max_partials", d),
            kernel_name!("max_finish", d),
        ),
    }
}

/// Output shape of reducing `shape` along `axis`.
pub fn output_shape(shape: &[usize], axis: Axis) -> Vec<usize> {
    match axis {
        Axis::Last => shape[..shape.len().saturating_sub(1)].to_vec(),
        Axis::All => vec![],
    }
}

/// Number of first-stage blocks of a full reduction of `numel` elements (a function of `numel` alone,
/// which is what makes the result reproducible).
pub fn partial_blocks(numel: u64) -> u32 {
    numel
        .div_ceil(MIN_ELEMS_PER_BLOCK)
        .clamp(1, MAX_PARTIALS as u64) as u32
}

/// Reduces contiguous `x` along `axis`.
pub fn reduce(x: &Tensor, r: Reduction, axis: Axis) -> Result<Tensor> {
    const OP: &str = "reduce";
    x.require_contiguous(OP, "input")?;
    let (rows, cols) = match axis {
        Axis::Last => {
            let cols = *x.shape().last().ok_or(Error::Shape {
                op: OP,
                what: "reducing the last dim needs rank >= 1".into(),
                expected: "rank >= 1".into(),
                got: vec![],
            })?;
            (
                x.shape()[..x.shape().len() - 1].iter().product::<usize>(),
                cols,
            )
        }
        Axis::All => (1, x.numel()),
    };
    if cols == 0 && r != Reduction::Sum {
        return Err(Error::Invalid {
            op: OP,
            msg: format!(
                "{r:?} over an empty dimension is undefined (input shape {:?})",
                x.shape()
            ),
        });
    }
    let out = Tensor::empty(x.gpu(), &output_shape(x.shape(), axis), x.dtype())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    match axis {
        Axis::Last => {
            let grid = grid_blocks(rows as u64, 1);
            launch(
                x.gpu(),
                rows_kernel(r, x.dtype()),
                grid,
                BLOCK,
                &[
                    &ByValue(x.raw()),
                    &ByValue(out.raw()),
                    &(rows as u64),
                    &(cols as u64),
                ],
            )?;
        }
        Axis::All => {
            let blocks = partial_blocks(cols as u64);
            let partials = Tensor::empty(x.gpu(), &[blocks as usize], DType::F32)?;
            let (stage1, stage2) = stage_kernels(r, x.dtype());
            launch(
                x.gpu(),
                stage1,
                blocks,
                BLOCK,
                &[&ByValue(x.raw()), &ByValue(partials.raw())],
            )?;
            launch(
                x.gpu(),
                stage2,
                1,
                BLOCK,
                &[
                    &ByValue(partials.raw()),
                    &ByValue(out.raw()),
                    &(cols as u64),
                ],
            )?;
        }
    }
    Ok(out)
}

pub fn sum(x: &Tensor, axis: Axis) -> Result<Tensor> {
    reduce(x, Reduction::Sum, axis)
}
pub fn mean(x: &Tensor, axis: Axis) -> Result<Tensor> {
    reduce(x, Reduction::Mean, axis)
}
pub fn max(x: &Tensor, axis: Axis) -> Result<Tensor> {
    reduce(x, Reduction::Max, axis)
}

/// Gradient of `sum`/`mean` of an input of `input_shape`: the upstream gradient expanded back over the
/// reduced elements (divided by their count for the mean). Max has no backward here.
pub fn backward(grad: &Tensor, r: Reduction, axis: Axis, input_shape: &[usize]) -> Result<Tensor> {
    const OP: &str = "reduce backward";
    let expected = output_shape(input_shape, axis);
    crate::ops::same_shape(
        OP,
        "grad must have the reduction's output shape",
        &expected,
        grad.shape(),
    )?;
    let count = match axis {
        Axis::Last => input_shape.last().copied().unwrap_or(1),
        Axis::All => input_shape.iter().product(),
    };
    let scale = match r {
        Reduction::Sum => 1.0,
        Reduction::Mean => 1.0 / count.max(1) as f32,
        Reduction::Max => {
            return Err(Error::Invalid {
                op: OP,
                msg: "max has no backward in this library".into(),
            });
        }
    };
    // Put the reduced dim back as size 1 so broadcasting expands it.
    let g = match axis {
        Axis::Last => grad.reshape(&[grad.shape(), &[1]].concat())?,
        Axis::All => grad.clone(),
    };
    expand(&g, input_shape, scale)
}

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod reference;

#[cfg(test)]
mod tests;
