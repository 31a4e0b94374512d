//! CPU references in f64.
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
