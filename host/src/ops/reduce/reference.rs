//! CPU references: f64 accumulation.
use super::{Axis, Reduction, output_shape};
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

pub fn reduce(x: &HostTensor, r: Reduction, axis: Axis) -> Result<HostTensor> {
    let cols = match axis {
        Axis::Last => *x.shape.last().ok_or(Error::Invalid {
            op: "reduce (reference)",
            msg: "rank 0 input".into(),
        })?,
        Axis::All => x.numel(),
    };
    if cols == 0 && r != Reduction::Sum {
        return Err(Error::Invalid {
            op: "reduce (reference)",
            msg: "empty reduction".into(),
        });
    }
    let out_shape = output_shape(&x.shape, axis);
    let rows: usize = out_shape.iter().product();
    let data = (0..rows)
        .map(|i| {
            let row = &x.data[i * cols..(i + 1) * cols];
            let v = match r {
                Reduction::Sum => row.iter().map(|&v| v as f64).sum::<f64>(),
                Reduction::Mean => row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64,
                Reduction::Max => row.iter().fold(f64::NEG_INFINITY, |m, &v| {
                    if v.is_nan() || m.is_nan() {
                        f64::NAN
                    } else {
                        m.max(v as f64)
                    }
                }),
            };
            v as f32
        })
        .collect();
    HostTensor::new(data, &out_shape, x.dtype)
}

pub fn backward(
    grad: &HostTensor,
    r: Reduction,
    axis: Axis,
    input_shape: &[usize],
) -> Result<HostTensor> {
    let count = match axis {
        Axis::Last => input_shape.last().copied().unwrap_or(1),
        Axis::All => input_shape.iter().product(),
    };
    let scale = if r == Reduction::Mean {
        1.0 / count as f64
    } else {
        1.0
    };
    let numel: usize = input_shape.iter().product();
    let data = (0..numel)
        .map(|i| (grad.data[if axis == Axis::All { 0 } else { i / count }] as f64 * scale) as f32)
        .collect();
    HostTensor::new(data, input_shape, grad.dtype)
}
