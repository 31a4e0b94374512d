//! CPU references in f64.
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

fn check(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= vocab) {
        None => Ok(()),
        Some(p) => Err(Error::IdOutOfRange {
            op,
            count: ids.iter().filter(|&&id| id as usize >= vocab).count() as u64,
            vocab,
            position: p,
            id: ids[p],
        }),
    }
}

pub fn embedding(table: &HostTensor, ids: &[u32]) -> Result<HostTensor> {
    const OP: &str = "embedding (reference)";
    let [vocab, cols] = table.shape[..] else {
        return Err(Error::Shape {
            op: OP,
            what: "table must be [V, D]".into(),
            expected: "rank 2".into(),
            got: table.shape.clone(),
        });
    };
    check(OP, ids, vocab)?;
    let mut out = Vec::with_capacity(ids.len() * cols);
    for &id in ids {
        out.extend_from_slice(&table.data[id as usize * cols..(id as usize + 1) * cols]);
    }
    HostTensor::new(out, &[ids.len(), cols], table.dtype)
}

pub fn embedding_backward(ids: &[u32], dy: &HostTensor, vocab: usize) -> Result<HostTensor> {
    const OP: &str = "embedding_backward (reference)";
    if dy.shape.len() != 2 || dy.shape[0] != ids.len() {
        return Err(Error::Shape {
            op: OP,
            what: "dy must be [N, D]".into(),
            expected: format!("[{}, D]", ids.len()),
            got: dy.shape.clone(),
        });
    }
    check(OP, ids, vocab)?;
    let cols = dy.shape[1];
    let mut dw = vec![0.0f64; vocab * cols];
    for (n, &id) in ids.iter().enumerate() {
        for j in 0..cols {
            dw[id as usize * cols + j] += dy.data[n * cols + j] as f64;
        }
    }
    HostTensor::new(
        dw.into_iter().map(|v| v as f32).collect(),
        &[vocab, cols],
        dy.dtype,
    )
}
