//! CPU references in f64.
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// Forward on f64 rows of length `cols`: `(y, mean, rstd)`.
pub fn forward_f64(
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    cols: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut mean, mut rstd) = (Vec::with_capacity(x.len()), vec![], vec![]);
    for row in x.chunks(cols.max(1)) {
        let m = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / cols as f64;
        let rs = 1.0 / (var + eps).sqrt();
        y.extend(
            row.iter()
                .enumerate()
                .map(|(j, v)| (v - m) * rs * gamma[j] + beta[j]),
        );
        mean.push(m);
        rstd.push(rs);
    }
    (y, mean, rstd)
}

/// Backward on f64 rows: `(dx, dgamma, dbeta)`.
pub fn backward_f64(
    x: &[f64],
    gamma: &[f64],
    mean: &[f64],
    rstd: &[f64],
    dy: &[f64],
    cols: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dgamma, mut dbeta) = (
        Vec::with_capacity(x.len()),
        vec![0.0; cols],
        vec![0.0; cols],
    );
    for (r, (xr, gr)) in x
        .chunks(cols.max(1))
        .zip(dy.chunks(cols.max(1)))
        .enumerate()
    {
        let xh: Vec<f64> = xr.iter().map(|v| (v - mean[r]) * rstd[r]).collect();
        let g: Vec<f64> = gr.iter().zip(gamma).map(|(d, w)| d * w).collect();
        let mg = g.iter().sum::<f64>() / cols as f64;
        let mgx = g.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
        dx.extend((0..cols).map(|j| rstd[r] * (g[j] - mg - xh[j] * mgx)));
        for j in 0..cols {
            dgamma[j] += gr[j] * xh[j];
            dbeta[j] += gr[j];
        }
    }
    (dx, dgamma, dbeta)
}

fn cols(op: &'static str, x: &HostTensor, gamma: &HostTensor) -> Result<usize> {
    let c = *x.shape.last().ok_or(Error::Invalid {
        op,
        msg: "rank 0 input".into(),
    })?;
    if gamma.shape != [c] {
        return Err(Error::Shape {
            op,
            what: "gamma must be [D]".into(),
            expected: format!("[{c}]"),
            got: gamma.shape.clone(),
        });
    }
    Ok(c)
}

fn f64s(t: &HostTensor) -> Vec<f64> {
    t.data.iter().map(|&v| v as f64).collect()
}

/// `(y, mean, rstd)`; mean and rstd in f32 as the GPU op returns them.
pub fn layer_norm(
    x: &HostTensor,
    gamma: &HostTensor,
    beta: &HostTensor,
    eps: Option<f32>,
) -> Result<(HostTensor, HostTensor, HostTensor)> {
    const OP: &str = "layer_norm (reference)";
    let c = cols(OP, x, gamma)?;
    cols(OP, x, beta)?;
    let eps = eps.unwrap_or(gpu::params::layer_norm::DEFAULT_EPS) as f64;
    let (y, m, r) = forward_f64(&f64s(x), &f64s(gamma), &f64s(beta), c, eps);
    let stats = &x.shape[..x.shape.len() - 1];
    let f = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<_>>();
    Ok((
        HostTensor::new(f(y), &x.shape, x.dtype)?,
        HostTensor::new(f(m), stats, DType::F32)?,
        HostTensor::new(f(r), stats, DType::F32)?,
    ))
}

/// `(dx, dgamma, dbeta)` from the saved statistics.
pub fn layer_norm_backward(
    x: &HostTensor,
    gamma: &HostTensor,
    mean: &HostTensor,
    rstd: &HostTensor,
    dy: &HostTensor,
) -> Result<(HostTensor, HostTensor, HostTensor)> {
    const OP: &str = "layer_norm_backward (reference)";
    let c = cols(OP, x, gamma)?;
    if dy.shape != x.shape {
        return Err(Error::Shape {
            op: OP,
            what: "dy must have the shape of x".into(),
            expected: format!("{:?}", x.shape),
            got: dy.shape.clone(),
        });
    }
    let (dx, dg, db) = backward_f64(
        &f64s(x),
        &f64s(gamma),
        &f64s(mean),
        &f64s(rstd),
        &f64s(dy),
        c,
    );
    let f = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<_>>();
    Ok((
        HostTensor::new(f(dx), &x.shape, x.dtype)?,
        HostTensor::new(f(dg), &gamma.shape, x.dtype)?,
        HostTensor::new(f(db), &gamma.shape, x.dtype)?,
    ))
}
