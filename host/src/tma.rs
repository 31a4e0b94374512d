//! Tensor maps for the TMA kernels (sm_90 build): the host half of `gpu::dev::tma`. A tensor map is
//! the driver's 128-byte description of a tensor in global memory and of the box one bulk copy moves
//! (`cuTensorMapEncodeTiled`); it is encoded here per launch, from the operand's address, dims and
//! strides, and passed to the kernel by value.
//!
//! The kind made here matches the kind the device library loads: a box 128 bytes wide (64 16-bit
//! elements, or 32 f32 for the f32 matmul), 128-byte swizzle (the layout the wgmma descriptors
//! read), zeros for coordinates outside the tensor.
use cudarc::driver::sys;
use gpu::params::TensorMapParam;

use crate::DType;
use crate::error::{Error, Result};

/// A rank-3 view `[batch][outer][inner]` at device address `ptr`: element `(b, o, i)` at
/// `ptr + size (b batch_stride + o outer_stride + i)`, `size` the element's bytes (2, or 4 for f32).
/// `batch` may be 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tensor3 {
    pub ptr: u64,
    pub inner: u64,
    pub outer: u64,
    pub batch: u64,
    /// Elements between consecutive rows (`outer` steps).
    pub outer_stride: u64,
    /// Elements between consecutive batch entries.
    pub batch_stride: u64,
}

/// Whether the copy engine can read `t` of 16-bit elements: a 16-byte aligned base, strides that
/// are multiples of 16 bytes (8 elements), every dim at least 1 and below 2^31 (coordinates are
/// signed 32-bit).
pub(crate) fn tma_readable(t: &Tensor3) -> bool {
    readable(t, 2)
}

/// [`tma_readable`] for f32 elements (strides multiples of 4 elements).
pub(crate) fn tma_readable_f32(t: &Tensor3) -> bool {
    readable(t, 4)
}

fn readable(t: &Tensor3, elem_bytes: u64) -> bool {
    let per_16 = 16 / elem_bytes;
    let dims_ok = [t.inner, t.outer, t.batch]
        .iter()
        .all(|&d| (1..1 << 31).contains(&d));
    dims_ok
        && t.ptr.is_multiple_of(16)
        && t.outer_stride.is_multiple_of(per_16)
        && t.batch_stride.is_multiple_of(per_16)
        && t.outer_stride >= t.inner
        && t.outer_stride < 1 << 38
        && t.batch_stride < 1 << 38
}

/// A rank-4 view `[batch][heads][outer][inner]` of 16-bit elements at device address `ptr`: element
/// `(b, h, o, i)` at `ptr + 2 (b batch_stride + h head_stride + o outer_stride + i)` (an attention
/// operand `[B, H, S, D]` with any strides, `[B, S, H, D]` memory included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tensor4 {
    pub ptr: u64,
    pub inner: u64,
    pub outer: u64,
    pub heads: u64,
    pub batch: u64,
    pub outer_stride: u64,
    pub head_stride: u64,
    pub batch_stride: u64,
}

/// [`tma_readable`] for a rank-4 view.
pub(crate) fn tma_readable4(t: &Tensor4) -> bool {
    let dims_ok = [t.inner, t.outer, t.heads, t.batch]
        .iter()
        .all(|&d| (1..1 << 31).contains(&d));
    dims_ok
        && t.ptr.is_multiple_of(16)
        && [t.outer_stride, t.head_stride, t.batch_stride]
            .iter()
            .all(|&s| s.is_multiple_of(8) && s > 0 && s < 1 << 38)
        && t.outer_stride >= t.inner
}

/// The tensor map of `t` with a box 128 bytes wide and `box_rows` tall, 128-byte swizzle. `op`
/// names the caller in errors.
pub(crate) fn sw128_map(
    op: &'static str,
    dtype: DType,
    t: &Tensor3,
    box_rows: u32,
) -> Result<TensorMapParam> {
    let size = dtype.size_bytes() as u64;
    if !readable(t, size) {
        return Err(unreadable(op, &format!("{t:?}"), box_rows));
    }
    encode(
        op,
        dtype,
        t.ptr,
        &[t.inner, t.outer, t.batch],
        &[size * t.outer_stride, size * t.batch_stride],
        box_rows,
        &format!("{t:?}"),
    )
}

/// The rank-4 tensor map of `t` (box `64 x box_rows x 1 x 1`, 128-byte swizzle): what the device's
/// `TensorMapRef<_, 4>` loads.
pub(crate) fn sw128_map4(
    op: &'static str,
    dtype: DType,
    t: &Tensor4,
    box_rows: u32,
) -> Result<TensorMapParam> {
    if dtype == DType::F32 {
        return Err(Error::Invalid {
            op,
            msg: "rank-4 tensor maps here hold 16-bit elements; got f32".into(),
        });
    }
    if !tma_readable4(t) {
        return Err(unreadable(op, &format!("{t:?}"), box_rows));
    }
    encode(
        op,
        dtype,
        t.ptr,
        &[t.inner, t.outer, t.heads, t.batch],
        &[2 * t.outer_stride, 2 * t.head_stride, 2 * t.batch_stride],
        box_rows,
        &format!("{t:?}"),
    )
}

fn unreadable(op: &'static str, what: &str, box_rows: u32) -> Error {
    Error::Invalid {
        op,
        msg: format!(
            "the copy engine cannot read this operand (it needs a 16-byte aligned base, nonzero \
             strides that are multiples of 8 elements and dims in 1..2^31): {what}, box rows \
             {box_rows}"
        ),
    }
}

/// `cuTensorMapEncodeTiled`: `dims` innermost first, `byte_strides` of every dim but the innermost,
/// a box 128 bytes wide, `box_rows` tall and 1 in every outer dim.
fn encode(
    op: &'static str,
    dtype: DType,
    ptr: u64,
    dims: &[u64],
    byte_strides: &[u64],
    box_rows: u32,
    what: &str,
) -> Result<TensorMapParam> {
    let rank = dims.len();
    assert!((3..=4).contains(&rank) && byte_strides.len() == rank - 1);
    let data_type = match dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    };
    if !(1..=256).contains(&box_rows) {
        return Err(unreadable(op, what, box_rows));
    }
    let boxes = [128 / dtype.size_bytes() as u32, box_rows, 1, 1];
    let element_strides = [1u32; 4];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: `dims` has `rank` entries, `byte_strides` rank - 1 (asserted), `boxes` and
    // `element_strides` at least `rank`; all live for the call; the driver only writes `map`.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            rank as u32,
            ptr as *mut core::ffi::c_void,
            dims.as_ptr(),
            byte_strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    status.result().map_err(|e| {
        Error::driver(
            e,
            format!("{op}: encoding a tensor map of {what} (box 128 bytes x {box_rows})"),
        )
    })?;
    Ok(TensorMapParam { opaque: map.opaque })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_parameter_holds_a_whole_driver_tensor_map() {
        assert_eq!(
            std::mem::size_of::<TensorMapParam>(),
            std::mem::size_of::<sys::CUtensorMap>()
        );
    }

    #[test]
    fn readable_tensors_need_aligned_base_strides_and_dims() {
        let t = Tensor3 {
            ptr: 1 << 20,
            inner: 72,
            outer: 136,
            batch: 1,
            outer_stride: 72,
            batch_stride: 72 * 136,
        };
        assert!(tma_readable(&t));
        assert!(!tma_readable(&Tensor3 {
            ptr: t.ptr + 2,
            ..t
        }));
        assert!(!tma_readable(&Tensor3 {
            outer_stride: 73,
            inner: 73,
            ..t
        }));
        assert!(!tma_readable(&Tensor3 {
            batch_stride: 12,
            ..t
        }));
        assert!(!tma_readable(&Tensor3 { inner: 0, ..t }));
        assert!(!tma_readable(&Tensor3 {
            outer: 1 << 31,
            ..t
        }));
        assert!(!tma_readable(&Tensor3 {
            outer_stride: 64,
            ..t
        }));
    }
}
