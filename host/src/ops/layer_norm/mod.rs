//! Layer norm over the last dim: `y = (x - mean) / sqrt(var + eps) * gamma + beta` with the biased
//! variance (as PyTorch), gamma and beta of shape `[D]` and x's dtype, f32 math for every dtype. The
//! forward returns `mean` and `rstd = 1 / sqrt(var + eps)` per row (f32, shape `x.shape[..rank-1]`) for
//! the backward, which returns `dx`, `dgamma` and `dbeta`; dgamma/dbeta are reduced over rows in a fixed
//! order (per-block partial rows, then a fixed-order sum): the same bits on every run. The backward's
//! warp-per-row kernel (the default where it applies) has one partial row per resident block, so its
//! summation order follows the device's SM count and occupancy: the same bits on every run on one
//! device model, possibly different last bits on another.
//!
//! Rows up to `MAX_CACHED_COLS` (8192) are held in registers (one read of x, one write of y); longer
//! rows read x twice. Empty rows (`D = 0`) have no mean: an [`Error::Invalid`]. No rows: empty outputs
//! and zero dgamma/dbeta, nothing launched.
use cudarc::driver::LaunchConfig;
use gpu::params::layer_norm::{
    CACHE_PER_THREAD, DEFAULT_EPS, FINISH_BLOCK, FINISH_COLS, NARROW_MAX_COLS, WARP_MAX_COLS,
    block_for, chunks, narrow_block_for, pipe_smem_bytes, rows_per_chunk, warp_smem_bytes,
};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel_name;
use crate::launch::{
    ByValue, DEFAULT_MAX_DYNAMIC_SMEM, grid_blocks, launch, launch_cfg_large_smem,
    set_max_dynamic_smem,
};
use crate::ops::{aligned16, same_device_and_dtype, same_shape};
use crate::tensor::Tensor;

/// The kernel for rows of `cols` and its threads per row: the narrow kernel (4 elements a thread) up to
/// `NARROW_MAX_COLS`, else the 16-element one; threads enough to hold the row in registers, capped at
/// what the kernel can launch with (a smaller block only moves rows to the two-pass path). The choice
/// depends on the shape only, so results stay the same bits on every run.
fn kernel(
    gpu: &crate::Gpu,
    wide: &'static str,
    narrow: &'static str,
    cols: u64,
) -> Result<(&'static str, u32)> {
    let (name, threads) = if cols <= NARROW_MAX_COLS {
        (narrow, narrow_block_for(cols))
    } else {
        (wide, block_for(cols))
    };
    Ok((name, threads.min(gpu.max_block_pow2(name)?)))
}

/// (rows, cols) of a contiguous input over its last dim; cols must be > 0.
fn rows_cols(op: &'static str, x: &Tensor) -> Result<(u64, u64)> {
    x.require_contiguous(op, "x")?;
    let cols = *x.shape().last().ok_or(Error::Shape {
        op,
        what: "layer norm needs a last dim".into(),
        expected: "rank >= 1".into(),
        got: vec![],
    })?;
    let rows = x.shape()[..x.shape().len() - 1].iter().product::<usize>();
    if cols == 0 && rows > 0 {
        return Err(Error::Invalid {
            op,
            msg: format!("x has shape {:?}: rows of length 0 have no mean", x.shape()),
        });
    }
    Ok((rows as u64, cols as u64))
}

/// gamma (and beta): x's device and dtype, shape `[cols]`, contiguous.
fn check_param(op: &'static str, what: &'static str, x: &Tensor, p: &Tensor) -> Result<()> {
    same_device_and_dtype(op, x, p)?;
    same_shape(
        op,
        &format!("{what} must be [D], D = the last dim of x {:?}", x.shape()),
        &[*x.shape().last().unwrap_or(&0)],
        p.shape(),
    )?;
    p.require_contiguous(op, what)
}

/// Shape of the per-row statistics: x's shape without its last dim.
fn stats_shape(x: &Tensor) -> Vec<usize> {
    x.shape()[..x.shape().len().saturating_sub(1)].to_vec()
}

/// `(y, mean, rstd)`; `eps` defaults to 1e-5 and must be finite and >= 0.
pub fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: Option<f32>,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "layer_norm";
    let eps = eps.unwrap_or(DEFAULT_EPS);
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Invalid {
            op: OP,
            msg: format!("eps must be finite and >= 0, got {eps}"),
        });
    }
    let (rows, cols) = rows_cols(OP, x)?;
    check_param(OP, "gamma", x, gamma)?;
    check_param(OP, "beta", x, beta)?;
    let gpu = x.gpu();
    let y = Tensor::empty(gpu, x.shape(), x.dtype())?;
    let mean = Tensor::empty(gpu, &stats_shape(x), DType::F32)?;
    let rstd = Tensor::empty(gpu, &stats_shape(x), DType::F32)?;
    if rows > 0 {
        // The 16-byte kernel for rows of whole chunks with aligned buffers that one block holds;
        // the scalar kernel (same math) otherwise.
        let vec_name = kernel_name!("layer_norm_vec", x.dtype());
        let max_threads = gpu.max_block_pow2(vec_name)?;
        let fewest = block_for(cols).min(max_threads);
        let vec_applies = cols % x.dtype().chunk_elems() as u64 == 0
            && cols <= fewest as u64 * CACHE_PER_THREAD as u64
            && aligned16(&[x, gamma, beta, &y]);
        let (name, threads) = if vec_applies {
            (vec_name, fewest)
        } else {
            let name = kernel_name!("layer_norm", x.dtype());
            (name, block_for(cols).min(gpu.max_block_pow2(name)?))
        };
        launch(
            gpu,
            name,
            grid_blocks(rows, 1),
            threads,
            &[
                &ByValue(x.raw()),
                &ByValue(gamma.raw()),
                &ByValue(beta.raw()),
                &ByValue(y.raw()),
                &ByValue(mean.raw()),
                &ByValue(rstd.raw()),
                &rows,
                &cols,
                &eps,
            ],
        )?;
    }
    Ok((y, mean, rstd))
}

/// The warp-per-row backward: one warp a row, 2 rows of x and dy per warp in `cp.async` stages (one in
/// flight), `WARP_WARPS` warps a block, a persistent grid of the blocks resident at once (one
/// dgamma/dbeta partial row each). Measured on an H100 (2026-11-26, the bundle of 624c403; 65536 x 1024): f32
/// 0.2924 ms (0.91 of copy) against the block-a-row kernels' 0.3132 and torch.compile's 0.3123; bf16
/// 0.1470 against 0.2164. Three stages, and 2 or 8 warps a block, measured no faster
/// (docs/PERF_NOTES.md, "Deleted kernels").
const WARP_WARPS: u32 = 4;

/// The warp-per-row backward's launch: `(kernel, threads, grid, dynamic shared memory bytes)` for
/// `rows` rows of `cols` in 16-byte aligned buffers of `dtype`, or `None` where the block-a-row kernels
/// run instead: rows of more than `WARP_MAX_COLS` elements or not whole 16-byte chunks, and devices
/// where a block does not fit. Public for the tests, which check which path a shape takes.
#[doc(hidden)]
pub fn warp_launch(
    gpu: &crate::Gpu,
    dtype: DType,
    (rows, cols): (u64, u64),
) -> Result<Option<(&'static str, u32, u32, u32)>> {
    let elems_per_chunk = dtype.chunk_elems() as u64;
    if !(rows > 0 && cols % elems_per_chunk == 0 && cols <= WARP_MAX_COLS) {
        return Ok(None);
    }
    let name = kernel_name!("layer_norm_backward_warp2", dtype);
    let threads = WARP_WARPS * 32;
    let smem = warp_smem_bytes(WARP_WARPS, 2, cols / elems_per_chunk, cols) as u32;
    if smem > DEFAULT_MAX_DYNAMIC_SMEM {
        // The opt-in may fail where the device has less shared memory (sm_80: 163 KiB a block).
        if set_max_dynamic_smem(gpu, name, smem).is_err() {
            return Ok(None);
        }
    }
    let per_sm = gpu
        .function(name)?
        .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
        .map_err(|e| Error::driver(e, format!("reading the occupancy of `{name}`")))?;
    if per_sm == 0 {
        return Ok(None);
    }
    let resident = per_sm as u64 * gpu.sm_count()?.max(1) as u64;
    // No block without a row: every warp of the grid but the last block's has rows.
    let grid = resident
        .min(rows.div_ceil(WARP_WARPS as u64))
        .min(i32::MAX as u64) as u32;
    Ok(Some((name, threads, grid, smem)))
}

/// `(dx, dgamma, dbeta)` from the forward's inputs, its saved `mean` and `rstd` (f32), and `dy`.
pub fn layer_norm_backward(
    x: &Tensor,
    gamma: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "layer_norm_backward";
    let (rows, cols) = rows_cols(OP, x)?;
    check_param(OP, "gamma", x, gamma)?;
    same_device_and_dtype(OP, x, dy)?;
    same_shape(OP, "dy must have the shape of x", x.shape(), dy.shape())?;
    dy.require_contiguous(OP, "dy")?;
    for (what, s) in [("mean", mean), ("rstd", rstd)] {
        if !s.gpu().same_device(x.gpu()) {
            return Err(Error::DeviceMismatch { op: OP });
        }
        if s.dtype() != DType::F32 {
            return Err(Error::DType {
                op: OP,
                expected: format!("f32 for {what} (as the forward returns it)"),
                got: s.dtype(),
            });
        }
        same_shape(
            OP,
            &format!("{what} must have x's shape without its last dim"),
            &stats_shape(x),
            s.shape(),
        )?;
        s.require_contiguous(OP, what)?;
    }
    let gpu = x.gpu();
    let dx = Tensor::empty(gpu, x.shape(), x.dtype())?;
    if rows == 0 {
        let zeros = vec![0.0; cols as usize];
        return Ok((
            dx,
            Tensor::from_f32(gpu, &zeros, gamma.shape(), x.dtype())?,
            Tensor::from_f32(gpu, &zeros, gamma.shape(), x.dtype())?,
        ));
    }
    let dgamma = Tensor::empty(gpu, gamma.shape(), x.dtype())?;
    let dbeta = Tensor::empty(gpu, gamma.shape(), x.dtype())?;
    let warp = if aligned16(&[x, gamma, dy, &dx]) {
        warp_launch(gpu, x.dtype(), (rows, cols))?
    } else {
        None
    };
    if let Some((name, threads, grid, smem)) = warp {
        let partials = Tensor::empty(gpu, &[2 * grid as usize * cols as usize], DType::F32)?;
        launch_cfg_large_smem(
            gpu,
            name,
            LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: smem,
            },
            &[
                &ByValue(x.raw()),
                &ByValue(gamma.raw()),
                &ByValue(mean.raw()),
                &ByValue(rstd.raw()),
                &ByValue(dy.raw()),
                &ByValue(dx.raw()),
                &ByValue(partials.raw()),
                &rows,
                &cols,
            ],
        )?;
        param_grads(gpu, &partials, &dgamma, &dbeta, grid as u64, cols)?;
        return Ok((dx, dgamma, dbeta));
    }
    let (chunks, per_chunk) = (chunks(rows), rows_per_chunk(rows));
    let partials = Tensor::empty(gpu, &[2 * chunks as usize * cols as usize], DType::F32)?;
    // Rows of whole 16-byte chunks (at most PIPE_MAX_BLOCK of them) with aligned buffers take the
    // cp.async-pipelined kernel, one chunk a thread; the register kernels take the rest.
    let elems_per_chunk = x.dtype().chunk_elems() as u64;
    let row_chunks = cols / elems_per_chunk;
    let pipe_name = kernel_name!("layer_norm_backward_pipe", x.dtype());
    let pipe_threads =
        (row_chunks.max(32).next_power_of_two() as u32).min(gpu.max_block_pow2(pipe_name)?);
    let pipelined = cols % elems_per_chunk == 0
        && row_chunks <= pipe_threads as u64
        && aligned16(&[x, gamma, dy, &dx]);
    let (name, threads, smem) = if pipelined {
        (pipe_name, pipe_threads, pipe_smem_bytes(pipe_threads))
    } else {
        let (name, threads) = kernel(
            gpu,
            kernel_name!("layer_norm_backward", x.dtype()),
            kernel_name!("layer_norm_backward_narrow", x.dtype()),
            cols,
        )?;
        (name, threads, 0)
    };
    launch_cfg_large_smem(
        gpu,
        name,
        LaunchConfig {
            // chunks <= MAX_CHUNKS (2048): no cast loss.
            grid_dim: (chunks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        },
        &[
            &ByValue(x.raw()),
            &ByValue(gamma.raw()),
            &ByValue(mean.raw()),
            &ByValue(rstd.raw()),
            &ByValue(dy.raw()),
            &ByValue(dx.raw()),
            &ByValue(partials.raw()),
            &rows,
            &cols,
            &per_chunk,
        ],
    )?;
    param_grads(gpu, &partials, &dgamma, &dbeta, chunks, cols)?;
    Ok((dx, dgamma, dbeta))
}

/// dgamma and dbeta from `[2][chunks][cols]` partial rows, added in chunk order.
fn param_grads(
    gpu: &crate::Gpu,
    partials: &Tensor,
    dgamma: &Tensor,
    dbeta: &Tensor,
    chunks: u64,
    cols: u64,
) -> Result<()> {
    launch(
        gpu,
        kernel_name!("layer_norm_param_grads", dgamma.dtype()),
        grid_blocks(cols, FINISH_COLS as u64),
        FINISH_BLOCK,
        &[
            &ByValue(partials.raw()),
            &ByValue(dgamma.raw()),
            &ByValue(dbeta.raw()),
            &chunks,
            &cols,
        ],
    )
}

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod reference;

#[cfg(test)]
mod tests;
