//! CPU references: f64 math, results rounded to the inputs' dtype.
use super::BinaryOp;
use crate::error::{Error, Result};
use crate::shape::{broadcast_shapes, broadcast_strides};
use crate::tensor::{HostTensor, contiguous_strides};

fn apply(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
    }
}

/// For each output index of `out_shape`, the offsets of the broadcast operands.
fn broadcast_offsets(out_shape: &[usize], a: &[usize], b: &[usize]) -> Vec<(usize, usize)> {
    let sa = broadcast_strides(a, &contiguous_strides(a), out_shape);
    let sb = broadcast_strides(b, &contiguous_strides(b), out_shape);
    let numel: usize = out_shape.iter().product();
    let mut idx = vec![0usize; out_shape.len()];
    let mut offs = Vec::with_capacity(numel);
    for _ in 0..numel {
        offs.push((
            idx.iter().zip(&sa).map(|(i, s)| i * s).sum(),
            idx.iter().zip(&sb).map(|(i, s)| i * s).sum(),
        ));
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    offs
}

fn dtype_check(op: &'static str, a: &HostTensor, b: &HostTensor) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(Error::DType {
            op,
            expected: a.dtype.to_string(),
            got: b.dtype,
        });
    }
    Ok(())
}

pub fn binary(op: BinaryOp, a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
    dtype_check("elementwise binary (reference)", a, b)?;
    let out_shape = broadcast_shapes(&a.shape, &b.shape)?;
    let data = broadcast_offsets(&out_shape, &a.shape, &b.shape)
        .into_iter()
        .map(|(ia, ib)| apply(op, a.data[ia] as f64, b.data[ib] as f64) as f32)
        .collect();
    HostTensor::new(data, &out_shape, a.dtype)
}

/// Sums `full` (of `out_shape`) down to `shape`, times `sign`.
fn sum_to(full: &[f64], out_shape: &[usize], shape: &[usize], sign: f64) -> Vec<f64> {
    let mut acc = vec![0.0f64; shape.iter().product()];
    for (k, (i, _)) in broadcast_offsets(out_shape, shape, shape)
        .into_iter()
        .enumerate()
    {
        acc[i] += full[k];
    }
    acc.iter().map(|v| sign * v).collect()
}

pub fn binary_backward(
    op: BinaryOp,
    a: &HostTensor,
    b: &HostTensor,
    grad: &HostTensor,
) -> Result<(HostTensor, HostTensor)> {
    dtype_check("elementwise binary backward (reference)", a, b)?;
    let out_shape = broadcast_shapes(&a.shape, &b.shape)?;
    if grad.shape != out_shape {
        return Err(Error::Shape {
            op: "elementwise binary backward (reference)",
            what: "grad must have the broadcast output shape".into(),
            expected: format!("{out_shape:?}"),
            got: grad.shape.clone(),
        });
    }
    let offs = broadcast_offsets(&out_shape, &a.shape, &b.shape);
    let (mut ga, mut gb) = (
        Vec::with_capacity(offs.len()),
        Vec::with_capacity(offs.len()),
    );
    for (k, &(ia, ib)) in offs.iter().enumerate() {
        let (x, y, g) = (a.data[ia] as f64, b.data[ib] as f64, grad.data[k] as f64);
        let (da, db) = match op {
            BinaryOp::Add => (g, g),
            BinaryOp::Sub => (g, -g),
            BinaryOp::Mul => (g * y, g * x),
            BinaryOp::Div => (g / y, -g * x / (y * y)),
        };
        ga.push(da);
        gb.push(db);
    }
    let ga = sum_to(&ga, &out_shape, &a.shape, 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let gb = sum_to(&gb, &out_shape, &b.shape, 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    Ok((
        HostTensor::new(ga, &a.shape, a.dtype)?,
        HostTensor::new(gb, &b.shape, b.dtype)?,
    ))
}

/// `alpha * sum of grad over the dims broadcast from operand_shape` (the gradient of a broadcast
/// operand), summed in f64.
pub fn reduce_to(grad: &HostTensor, operand_shape: &[usize], alpha: f32) -> Result<HostTensor> {
    if broadcast_shapes(operand_shape, &grad.shape)? != grad.shape {
        return Err(Error::Shape {
            op: "reduce_to (reference)",
            what: format!("operand shape {operand_shape:?} must broadcast to the gradient's shape"),
            expected: format!("{:?}", grad.shape),
            got: operand_shape.to_vec(),
        });
    }
    let full: Vec<f64> = grad.data.iter().map(|&v| v as f64).collect();
    let out = sum_to(&full, &grad.shape, operand_shape, alpha as f64);
    HostTensor::new(
        out.into_iter().map(|v| v as f32).collect(),
        operand_shape,
        grad.dtype,
    )
}

/// `alpha * x` broadcast to `shape` (the gradient of a reduction, expanded back).
pub fn expand(x: &HostTensor, shape: &[usize], alpha: f32) -> Result<HostTensor> {
    if broadcast_shapes(&x.shape, shape)? != shape {
        return Err(Error::Shape {
            op: "expand (reference)",
            what: format!("{:?} must broadcast to the target shape", x.shape),
            expected: format!("{shape:?}"),
            got: x.shape.clone(),
        });
    }
    let data = broadcast_offsets(shape, &x.shape, &x.shape)
        .into_iter()
        .map(|(i, _)| (alpha as f64 * x.data[i] as f64) as f32)
        .collect();
    HostTensor::new(data, shape, x.dtype)
}

/// Standard normal CDF in f64 (libm's erf, independent of the device's erfc approximation).
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

pub fn gelu(x: &HostTensor) -> Result<HostTensor> {
    let data = x
        .data
        .iter()
        .map(|&v| (v as f64 * normal_cdf(v as f64)) as f32)
        .collect();
    HostTensor::new(data, &x.shape, x.dtype)
}

pub fn gelu_backward(x: &HostTensor, dy: &HostTensor) -> Result<HostTensor> {
    if x.shape != dy.shape {
        return Err(Error::Shape {
            op: "gelu_backward (reference)",
            what: "dy must have the shape of x".into(),
            expected: format!("{:?}", x.shape),
            got: dy.shape.clone(),
        });
    }
    let pdf = |t: f64| (-0.5 * t * t).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let data = x.data.iter().zip(&dy.data).map(|(&v, &g)| {
        let v = v as f64;
        (g as f64 * (normal_cdf(v) + v * pdf(v))) as f32
    });
    HostTensor::new(data.collect(), &x.shape, x.dtype)
}

pub fn affine(x: &HostTensor, alpha: f32, beta: f32) -> Result<HostTensor> {
    let data = x
        .data
        .iter()
        .map(|&v| (alpha as f64 * v as f64 + beta as f64) as f32)
        .collect();
    HostTensor::new(data, &x.shape, x.dtype)
}
