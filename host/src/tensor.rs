//! Tensors: [`HostTensor`] (values in host memory) and [`Tensor`] (a device buffer + shape + strides +
//! dtype). A `Tensor` may be a strided view (see [`Tensor::transpose`]); ops state whether they accept
//! views or need contiguous memory, and reject the wrong kind with [`Error::NotContiguous`].
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr};
use gpu::params::RawSlice;

use crate::device::{Gpu, MemoryCounter};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Row-major (C order) strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

/// Number of elements of `shape` (1 for a scalar, 0 if any dim is 0); `None` on overflow.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// A tensor in host memory. Values are f32 holding exactly what `dtype` can represent (they are
/// rounded on construction), so host references see the same inputs as the GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl HostTensor {
    /// Wraps `data` (rounded to `dtype`) as a tensor of `shape`.
    pub fn new(data: Vec<f32>, shape: &[usize], dtype: DType) -> Result<Self> {
        let numel = checked_numel(shape).ok_or(Error::Invalid {
            op: "HostTensor::new",
            msg: format!("shape {shape:?} overflows usize"),
        })?;
        if data.len() != numel {
            return Err(Error::Length {
                what: "HostTensor::new (data vs shape)",
                expected: numel,
                got: data.len(),
            });
        }
        let data = if dtype == DType::F32 {
            data
        } else {
            data.into_iter().map(|v| dtype.round(v)).collect()
        };
        Ok(HostTensor {
            data,
            shape: shape.to_vec(),
            dtype,
        })
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// A device allocation counted in its handle's [`MemoryCounter`] while it lives.
struct DeviceBuf {
    slice: CudaSlice<u8>,
    memory: Arc<MemoryCounter>,
}

impl DeviceBuf {
    fn new(slice: CudaSlice<u8>, memory: &Arc<MemoryCounter>) -> DeviceBuf {
        memory.allocated(slice.len() as u64);
        DeviceBuf {
            slice,
            memory: memory.clone(),
        }
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        self.memory.freed(self.slice.len() as u64);
    }
}

impl std::ops::Deref for DeviceBuf {
    type Target = CudaSlice<u8>;
    fn deref(&self) -> &CudaSlice<u8> {
        &self.slice
    }
}

/// A tensor on the GPU.
#[derive(Clone)]
pub struct Tensor {
    gpu: Gpu,
    buf: Arc<DeviceBuf>,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    /// Offset of element (0, ..., 0) from the start of `buf`, in elements.
    offset: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, strides {:?})",
            self.shape, self.dtype, self.strides
        )
    }
}

impl Tensor {
    /// Allocates a contiguous tensor of zero bytes (0.0 in every float dtype), filled on the stream:
    /// no host copy and no host wait.
    pub fn zeros(gpu: &Gpu, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let t = Tensor::empty(gpu, shape, dtype)?;
        t.fill_bytes(0)?;
        Ok(t)
    }

    /// Allocates a contiguous tensor whose contents are unspecified (0xFF bytes in poison mode).
    pub fn empty(gpu: &Gpu, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let numel = checked_numel(shape).ok_or(Error::Invalid {
            op: "Tensor::empty",
            msg: format!("shape {shape:?} overflows usize"),
        })?;
        let bytes = numel
            .checked_mul(dtype.size_bytes())
            .ok_or(Error::TooLarge {
                op: "Tensor::empty",
                what: "byte size",
                given: numel as u64,
                max: usize::MAX as u64,
            })?;
        // A zero-byte allocation is not a valid driver request; empty tensors get a token buffer.
        // SAFETY: the buffer is either poisoned below or written by the op that asked for it before
        // anything reads it (every kernel writes every output element: the poison tests check it).
        let alloc = || unsafe { gpu.stream().alloc::<u8>(bytes.max(16)) };
        let buf = match alloc() {
            // The pool keeps freed memory (see `Gpu::release_cached_memory`): give what is unused
            // back to the system and try once more before reporting the device full. No host wait
            // here: inside a dist group the stream may wait on a peer that waits on this thread.
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let _ = gpu.trim_pool();
                alloc()
            }
            other => other,
        }
        .map_err(|e| Error::driver(e, format!("allocating {bytes} bytes")))?;
        let t = Tensor {
            gpu: gpu.clone(),
            buf: Arc::new(DeviceBuf::new(buf, gpu.memory_counter())),
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        };
        if gpu.poison_outputs() {
            t.fill_bytes(0xFF)?;
        }
        Ok(t)
    }

    /// Copies `host` to a new device tensor.
    pub fn from_host(gpu: &Gpu, host: &HostTensor) -> Result<Tensor> {
        Self::from_f32(gpu, &host.data, &host.shape, host.dtype)
    }

    /// Copies f32 `values` (converted to `dtype`) to a new device tensor of `shape`.
    pub fn from_f32(gpu: &Gpu, values: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
        let mut t = Tensor::empty(gpu, shape, dtype)?;
        t.copy_from_f32(values)?;
        Ok(t)
    }

    /// Overwrites this (contiguous) tensor with `values`, which must have exactly `numel` elements.
    pub fn copy_from_f32(&mut self, values: &[f32]) -> Result<()> {
        if values.len() != self.numel() {
            return Err(Error::Length {
                what: "copy host -> device",
                expected: self.numel(),
                got: values.len(),
            });
        }
        self.require_contiguous("copy host -> device", "destination")?;
        let bytes = self.dtype.encode(values);
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the destination range [ptr, ptr + bytes) lies inside `buf` (contiguous, numel elements
        // from `offset`); the host slice outlives the copy because we synchronize before returning.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.device_ptr(),
                &bytes,
                self.gpu.stream().cu_stream(),
            )
            .map_err(|e| Error::driver(e, "copy host -> device"))?;
        }
        self.gpu.synchronize()
    }

    /// Copies the tensor back to the host (gathering a strided view into row-major order).
    pub fn to_host(&self) -> Result<HostTensor> {
        // Only the bytes the view spans: the rest of the allocation (a small tensor's token padding,
        // elements outside a view) may never have been written, and initcheck rightly flags copying it.
        let span = self.raw().len as usize;
        let mut bytes = vec![0u8; span * self.dtype.size_bytes()];
        if !bytes.is_empty() {
            // SAFETY: [device_ptr, device_ptr + span * size) lies inside `buf` (the view's elements);
            // the host buffer has exactly that length and outlives the copy (synchronized below).
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut bytes,
                    self.device_ptr(),
                    self.gpu.stream().cu_stream(),
                )
                .map_err(|e| Error::driver(e, "copy device -> host"))?;
            }
        }
        self.gpu.synchronize()?;
        let values = self.dtype.decode(&bytes);
        let numel = self.numel();
        let mut data = Vec::with_capacity(numel);
        let mut index = vec![0usize; self.shape.len()];
        for _ in 0..numel {
            let off: usize = index
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>();
            data.push(values[off]);
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(HostTensor {
            data,
            shape: self.shape.clone(),
            dtype: self.dtype,
        })
    }

    /// Convenience: the values as f32, row-major.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        Ok(self.to_host()?.data)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }
    pub fn is_contiguous(&self) -> bool {
        self.shape
            .iter()
            .zip(self.strides.iter().zip(contiguous_strides(&self.shape)))
            .all(|(&n, (&s, c))| n <= 1 || s == c)
    }

    /// A view with dims `d0` and `d1` swapped (no copy; generally not contiguous).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        let rank = self.shape.len();
        if d0 >= rank || d1 >= rank {
            return Err(Error::Invalid {
                op: "transpose",
                msg: format!("dims ({d0}, {d1}) out of range for rank {rank}"),
            });
        }
        let mut t = self.clone();
        t.shape.swap(d0, d1);
        t.strides.swap(d0, d1);
        Ok(t)
    }

    /// Entry `index` of dim `dim`, as a view of the other dims (no copy; generally not contiguous):
    /// one of Q, K and V of a fused `[batch, seq, 3, heads, head_dim]` projection
    /// (`qkv.select(2, 0)?.transpose(1, 2)?` is Q as `[batch, heads, seq, head_dim]`, which the
    /// FlashAttention paths take as it is).
    pub fn select(&self, dim: usize, index: usize) -> Result<Tensor> {
        if dim >= self.shape.len() || index >= self.shape[dim] {
            return Err(Error::Invalid {
                op: "select",
                msg: format!(
                    "index {index} of dim {dim} is out of range for shape {:?}",
                    self.shape
                ),
            });
        }
        let mut t = self.clone();
        t.offset = self.offset + index * self.strides[dim];
        t.shape.remove(dim);
        t.strides.remove(dim);
        Ok(t)
    }

    /// The same contiguous data with another shape of equal element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        self.require_contiguous("reshape", "input")?;
        let numel = checked_numel(shape).unwrap_or(usize::MAX);
        if numel != self.numel() {
            return Err(Error::Shape {
                op: "reshape",
                what: format!("new shape must hold {} elements", self.numel()),
                expected: format!("{:?} elements", self.numel()),
                got: shape.to_vec(),
            });
        }
        let mut t = self.clone();
        t.shape = shape.to_vec();
        t.strides = contiguous_strides(shape);
        Ok(t)
    }

    /// Entry `i` of dim 0 of a contiguous tensor, as a view of shape `shape[1..]` (no copy): the
    /// chunks of a ring-attention shard, one layer's slice of a stacked weight.
    pub fn index0(&self, i: usize) -> Result<Tensor> {
        self.require_contiguous("index0", "input")?;
        if self.shape.is_empty() || i >= self.shape[0] {
            return Err(Error::Invalid {
                op: "index0",
                msg: format!("index {i} out of range for shape {:?}", self.shape),
            });
        }
        let mut t = self.clone();
        t.shape = self.shape[1..].to_vec();
        t.strides = contiguous_strides(&t.shape);
        t.offset = self.offset + i * self.strides[0];
        Ok(t)
    }

    /// Rows `start..start + len` of dim 0 of a contiguous tensor, as a view (no copy).
    pub fn narrow(&self, start: usize, len: usize) -> Result<Tensor> {
        self.require_contiguous("narrow", "input")?;
        if self.shape.is_empty() || start.checked_add(len).is_none_or(|e| e > self.shape[0]) {
            return Err(Error::Invalid {
                op: "narrow",
                msg: format!(
                    "rows {start}..{start}+{len} out of range for shape {:?}",
                    self.shape
                ),
            });
        }
        let mut t = self.clone();
        t.shape[0] = len;
        t.offset = self.offset + start * self.strides[0];
        Ok(t)
    }

    /// Overwrites this contiguous tensor with `src` (same dtype and element count), device to device,
    /// queued on the stream.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        self.require_contiguous("copy_from", "destination")?;
        src.require_contiguous("copy_from", "source")?;
        if src.dtype != self.dtype {
            return Err(Error::DType {
                op: "copy_from",
                expected: format!("the destination's {}", self.dtype),
                got: src.dtype,
            });
        }
        if src.numel() != self.numel() {
            return Err(Error::Length {
                what: "copy_from (source vs destination)",
                expected: self.numel(),
                got: src.numel(),
            });
        }
        if !self.gpu.same_device(&src.gpu) {
            return Err(Error::DeviceMismatch { op: "copy_from" });
        }
        if self.numel() == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie inside their buffers (contiguous, numel elements from offset), which
        // the tensors keep alive; the copy is stream-ordered with the kernels.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                self.device_ptr(),
                src.device_ptr(),
                self.size_bytes(),
                self.gpu.stream().cu_stream(),
            )
            .map_err(|e| Error::driver(e, "copy device -> device"))
        }
    }

    /// A contiguous copy of a view (or the tensor itself if already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let host = self.to_host()?;
        Tensor::from_host(&self.gpu, &host)
    }

    /// Fills every byte of the tensor's buffer with `byte` (0xFF = NaN in every float dtype).
    pub fn fill_bytes(&self, byte: u8) -> Result<()> {
        // SAFETY: writes exactly the bytes of `buf`, which this tensor keeps alive; stream-ordered.
        unsafe {
            let (ptr, _sync) = self.buf.device_ptr(self.gpu.stream());
            cudarc::driver::result::memset_d8_async(
                ptr,
                byte,
                self.buf.len(),
                self.gpu.stream().cu_stream(),
            )
            .map_err(|e| Error::driver(e, "filling a buffer"))
        }
    }

    /// Device address of element (0, ..., 0).
    pub(crate) fn device_ptr(&self) -> u64 {
        let (base, _sync) = self.buf.device_ptr(self.gpu.stream());
        base + (self.offset * self.dtype.size_bytes()) as u64
    }

    /// The kernel-side view: pointer and the number of elements the view spans from it (one past its
    /// farthest element; `numel` for a contiguous tensor). Not the allocation size: small tensors get a
    /// 16-byte token allocation whose extra bytes are not elements. `checked` PTX bounds accesses by it.
    pub(crate) fn raw(&self) -> RawSlice {
        let span = if self.numel() == 0 {
            0
        } else {
            1 + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<usize>()
        };
        RawSlice {
            ptr: self.device_ptr(),
            len: span as u64,
        }
    }

    pub(crate) fn require_contiguous(&self, op: &'static str, what: &'static str) -> Result<()> {
        if self.is_contiguous() {
            Ok(())
        } else {
            Err(Error::NotContiguous {
                op,
                what,
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            })
        }
    }
}
