//! Typed errors. Every error says what was expected and what was given; a driver error keeps its CUDA
//! name and number and adds what it usually means.
use crate::dtype::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver library, no device, or a device too old for the shipped PTX.
    #[error("no CUDA device: {reason}")]
    NoDevice { reason: String },

    /// A CUDA driver call failed.
    #[error("CUDA driver error {name} ({code}) in {during}: {meaning}")]
    Driver {
        name: String,
        code: u32,
        during: String,
        meaning: String,
    },

    /// Shapes that do not broadcast against each other.
    #[error(
        "shapes {a:?} and {b:?} do not broadcast: dim {dim} (from the right) is {da} vs {db}; sizes must match or one must be 1"
    )]
    Broadcast {
        a: Vec<usize>,
        b: Vec<usize>,
        dim: usize,
        da: usize,
        db: usize,
    },

    /// A shape that is wrong for the op.
    #[error("{op}: {what}: expected {expected}, got {got:?}")]
    Shape {
        op: &'static str,
        what: String,
        expected: String,
        got: Vec<usize>,
    },

    /// Operands of different dtypes, or a dtype the op does not support.
    #[error("{op}: dtype mismatch: expected {expected}, got {got}")]
    DType {
        op: &'static str,
        expected: String,
        got: DType,
    },

    /// A strided view passed where the kernel needs contiguous memory.
    #[error(
        "{op}: {what} must be contiguous (shape {shape:?}, strides {strides:?}); call .contiguous() first"
    )]
    NotContiguous {
        op: &'static str,
        what: &'static str,
        shape: Vec<usize>,
        strides: Vec<usize>,
    },

    /// A size the kernel cannot index (grid limits, 64-bit element counts, rank).
    #[error("{op}: {what} is {given}, but the kernel supports at most {max}")]
    TooLarge {
        op: &'static str,
        what: &'static str,
        given: u64,
        max: u64,
    },

    /// Host and device lengths differ on a copy, or data length does not match the shape.
    #[error("{what}: length mismatch: expected {expected} elements, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },

    /// An argument out of its documented range.
    #[error("{op}: invalid argument: {msg}")]
    Invalid { op: &'static str, msg: String },

    /// Non-finite values (NaN or +-inf) where the op needs finite ones (e.g. layer weights).
    #[error(
        "{op}: {what} holds {count} non-finite value(s) (NaN or inf); weights and biases must be finite"
    )]
    NonFinite {
        op: &'static str,
        what: &'static str,
        count: u64,
    },

    /// Embedding ids at or past the vocabulary size (found before any gather reads the table).
    #[error(
        "{op}: {count} id(s) out of range for a vocabulary of {vocab}; the first is ids[{position}] = {id}"
    )]
    IdOutOfRange {
        op: &'static str,
        count: u64,
        vocab: usize,
        position: usize,
        id: u32,
    },

    /// The NCCL library (multi-GPU, [`crate::dist`]) could not be loaded.
    #[error("NCCL unavailable: {reason}")]
    NcclUnavailable { reason: String },

    /// A multi-GPU group failed: which rank saw it and why (an NCCL error, a timeout, or another
    /// rank's failure, named).
    #[error("dist rank {rank} of {world}: {what}")]
    Dist {
        rank: usize,
        world: usize,
        what: String,
    },

    /// Tensors from different devices/contexts.
    #[error("{op}: tensors live on different GPUs")]
    DeviceMismatch { op: &'static str },
}

impl Error {
    pub(crate) fn driver(e: cudarc::driver::DriverError, during: impl Into<String>) -> Self {
        let code = e.0 as u32;
        let name = e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("CUDA_ERROR_{code}"));
        Error::Driver {
            name,
            code,
            during: during.into(),
            meaning: meaning(code).to_string(),
        }
    }
}

/// What a driver error number usually means for a kernel library user.
pub fn meaning(code: u32) -> &'static str {
    match code {
        1 => "an invalid value reached the driver (launch configuration or argument)",
        2 => "out of device memory",
        3 | 4 => "the driver is not initialised or is shutting down",
        100 => "no CUDA-capable device is visible",
        200 | 209 | 218 | 222 => {
            "the PTX could not be loaded for this device (arch or PTX version too new for the driver)"
        }
        500 => "a kernel name was not found in the loaded PTX",
        700 => {
            "illegal memory address in a kernel: an out-of-bounds access; run `cargo xtask sanitize` (memcheck) to find it. The context is now unusable: create a new Gpu"
        }
        701 => "too many resources requested for launch (registers or shared memory per block)",
        715 => {
            "illegal instruction in a kernel: a device-side check (bounds check or assert) failed and trapped; the context must be recreated; run `cargo xtask sanitize` to locate it"
        }
        716 => {
            "misaligned address in a kernel (a vector or cp.async access not aligned to its size); run `cargo xtask sanitize` (memcheck). The context is now unusable"
        }
        719 => {
            "launch failure (the kernel faulted or trapped: often a device-side check); run `cargo xtask sanitize`. The context must be recreated"
        }
        _ => "see the CUDA driver API documentation for this code",
    }
}
