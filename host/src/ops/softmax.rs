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

/// CPU references in f64.
pub mod reference {
    use crate::error::{Error, Result};
    use crate::tensor::HostTensor;

    fn cols(x: &HostTensor) -> Result<usize> {
        x.shape.last().copied().ok_or(Error::Invalid {
            op: "softmax (reference)",
            msg: "rank 0 input".into(),
        })
    }

    pub fn softmax(x: &HostTensor) -> Result<HostTensor> {
        let c = cols(x)?;
        let mut out = Vec::with_capacity(x.numel());
        for row in x.data.chunks(c.max(1)) {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            out.extend(e.iter().map(|v| (v / s) as f32));
        }
        HostTensor::new(out, &x.shape, x.dtype)
    }

    pub fn softmax_backward(y: &HostTensor, dy: &HostTensor) -> Result<HostTensor> {
        if y.shape != dy.shape {
            return Err(Error::Shape {
                op: "softmax_backward (reference)",
                what: "dy must have the shape of y".into(),
                expected: format!("{:?}", y.shape),
                got: dy.shape.clone(),
            });
        }
        let c = cols(y)?;
        let mut out = Vec::with_capacity(y.numel());
        for (yr, gr) in y.data.chunks(c.max(1)).zip(dy.data.chunks(c.max(1))) {
            let dot: f64 = yr.iter().zip(gr).map(|(&a, &b)| a as f64 * b as f64).sum();
            out.extend(
                yr.iter()
                    .zip(gr)
                    .map(|(&a, &b)| (a as f64 * (b as f64 - dot)) as f32),
            );
        }
        HostTensor::new(out, &y.shape, y.dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::reference as r;
    use crate::{DType, HostTensor};

    #[test]
    fn rows_sum_to_one_and_shift_invariance_holds() {
        let x =
            HostTensor::new(vec![1., 2., 3., 1001., 1002., 1003.], &[2, 3], DType::F32).unwrap();
        let y = r::softmax(&x).unwrap();
        for row in y.data.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        // softmax(x + c) == softmax(x), and no overflow at 1000.
        for k in 0..3 {
            assert!((y.data[k] - y.data[k + 3]).abs() < 1e-7);
        }
        // Closed form: softmax([1,2,3])[2] = 1 / (1 + e^-1 + e^-2).
        let want = 1.0 / (1.0 + (-1f64).exp() + (-2f64).exp());
        assert!((y.data[2] as f64 - want).abs() < 1e-7);
    }

    #[test]
    fn length_one_rows_are_one() {
        let x = HostTensor::new(vec![-5., 0., 7.], &[3, 1], DType::F32).unwrap();
        assert_eq!(r::softmax(&x).unwrap().data, vec![1., 1., 1.]);
    }

    #[test]
    fn backward_matches_finite_differences() {
        let x = [0.3f64, -1.2, 2.0, 0.5];
        let g = [0.7f64, -0.1, 0.4, 1.3];
        let loss = |x: &[f64]| {
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
            x.iter()
                .zip(&g)
                .map(|(v, gi)| (v - m).exp() / s * gi)
                .sum::<f64>()
        };
        let xt =
            HostTensor::new(x.iter().map(|&v| v as f32).collect(), &[1, 4], DType::F32).unwrap();
        let y = r::softmax(&xt).unwrap();
        let gt =
            HostTensor::new(g.iter().map(|&v| v as f32).collect(), &[1, 4], DType::F32).unwrap();
        let dx = r::softmax_backward(&y, &gt).unwrap();
        for i in 0..4 {
            let (mut xp, mut xm) = (x, x);
            xp[i] += 1e-6;
            xm[i] -= 1e-6;
            let fd = (loss(&xp) - loss(&xm)) / 2e-6;
            assert!(
                (dx.data[i] as f64 - fd).abs() < 1e-5,
                "i={i}: {} vs {fd}",
                dx.data[i]
            );
        }
    }
}
