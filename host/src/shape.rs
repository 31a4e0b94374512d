//! Shape rules shared by ops: NumPy/PyTorch broadcasting and the right-aligned padded layouts the
//! strided kernels read.
use gpu::params::{Broadcast2, MAX_DIMS, ReduceTo};

use crate::error::{Error, Result};

/// The broadcast shape of `a` and `b`: dims are right-aligned; each pair must be equal or contain a 1.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < a.len() { a[a.len() - 1 - i] } else { 1 };
        let db = if i < b.len() { b[b.len() - 1 - i] } else { 1 };
        out[rank - 1 - i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::Broadcast {
                    a: a.to_vec(),
                    b: b.to_vec(),
                    dim: i,
                    da,
                    db,
                });
            }
        };
    }
    Ok(out)
}

/// Strides (in elements) with which an operand of `shape`/`strides` is read when broadcast to `out`:
/// right-aligned, 0 on broadcast dims.
pub fn broadcast_strides(shape: &[usize], strides: &[usize], out: &[usize]) -> Vec<usize> {
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|d| {
            if d < lead || shape[d - lead] == 1 && out[d] != 1 {
                0
            } else {
                strides[d - lead]
            }
        })
        .collect()
}

fn too_many_dims(op: &'static str, rank: usize) -> Error {
    Error::TooLarge {
        op,
        what: "tensor rank",
        given: rank as u64,
        max: MAX_DIMS as u64,
    }
}

/// Pads `v` on the left with `fill` to `MAX_DIMS` entries (the kernels' right-aligned layout).
fn pad(v: &[usize], fill: u64) -> [u64; MAX_DIMS] {
    let mut out = [fill; MAX_DIMS];
    let lead = MAX_DIMS - v.len();
    for (i, &x) in v.iter().enumerate() {
        out[lead + i] = x as u64;
    }
    out
}

/// Kernel parameters for `out = a (op) b` broadcast to `out_shape`.
pub fn broadcast2(
    op: &'static str,
    out_shape: &[usize],
    a: (&[usize], &[usize]),
    b: (&[usize], &[usize]),
) -> Result<Broadcast2> {
    if out_shape.len() > MAX_DIMS {
        return Err(too_many_dims(op, out_shape.len()));
    }
    Ok(Broadcast2 {
        numel: out_shape.iter().product::<usize>() as u64,
        shape: pad(out_shape, 1),
        a_strides: pad(&broadcast_strides(a.0, a.1, out_shape), 0),
        b_strides: pad(&broadcast_strides(b.0, b.1, out_shape), 0),
    })
}

/// Kernel parameters for summing a contiguous `grad` of `grad_shape` down to `operand_shape`.
pub fn reduce_to(
    op: &'static str,
    grad_shape: &[usize],
    operand_shape: &[usize],
) -> Result<ReduceTo> {
    if grad_shape.len() > MAX_DIMS {
        return Err(too_many_dims(op, grad_shape.len()));
    }
    let lead = grad_shape.len() - operand_shape.len();
    let kept: Vec<usize> = (0..grad_shape.len())
        .map(|d| if d < lead { 1 } else { operand_shape[d - lead] })
        .collect();
    let reduced: Vec<usize> = (0..grad_shape.len())
        .map(|d| {
            if kept[d] == grad_shape[d] {
                1
            } else {
                grad_shape[d]
            }
        })
        .collect();
    Ok(ReduceTo {
        out_numel: kept.iter().product::<usize>() as u64,
        red_numel: reduced.iter().product::<usize>() as u64,
        out_shape: pad(&kept, 1),
        red_shape: pad(&reduced, 1),
        grad_strides: pad(&crate::tensor::contiguous_strides(grad_shape), 0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy_rules() {
        assert_eq!(broadcast_shapes(&[2, 3], &[3]).unwrap(), vec![2, 3]);
        assert_eq!(
            broadcast_shapes(&[4, 1, 5], &[3, 1]).unwrap(),
            vec![4, 3, 5]
        );
        assert_eq!(broadcast_shapes(&[], &[7]).unwrap(), vec![7]);
        assert_eq!(broadcast_shapes(&[1], &[0]).unwrap(), vec![0]);
        let e = broadcast_shapes(&[2, 3], &[4]).unwrap_err().to_string();
        assert!(e.contains("[2, 3]") && e.contains("[4]"), "{e}");
    }

    #[test]
    fn broadcast_strides_are_zero_on_expanded_dims() {
        assert_eq!(broadcast_strides(&[3], &[1], &[2, 3]), vec![0, 1]);
        assert_eq!(broadcast_strides(&[2, 1], &[1, 1], &[2, 3]), vec![1, 0]);
    }

    #[test]
    fn reduce_to_params_split_kept_and_reduced_dims() {
        let p = reduce_to("t", &[4, 3, 5], &[3, 1]).unwrap();
        assert_eq!(p.out_numel, 3);
        assert_eq!(p.red_numel, 20);
        assert_eq!(&p.out_shape[3..], &[1, 3, 1]);
        assert_eq!(&p.red_shape[3..], &[4, 1, 5]);
    }
}
