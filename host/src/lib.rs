//! # host: Rust-native GPU kernels, the library users call
//!
//! Kernels are written in Rust (the `gpu` crate), compiled to PTX by rustc's own NVPTX backend, embedded
//! here at build time and launched through `cudarc` (the CUDA driver is loaded at run time). Every op:
//! validates its inputs and returns a typed [`Error`] before any launch, has a CPU reference with f64
//! accumulation in its `reference` module, and runs on one stream per [`Gpu`].
//!
//! ```no_run
//! use host::{DType, Gpu, Tensor, ops::{elementwise, softmax}};
//! # fn main() -> host::Result<()> {
//! let gpu = Gpu::new(0)?; // Err(Error::NoDevice { .. }) on a machine without a GPU
//! let x = Tensor::from_f32(&gpu, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32)?;
//! let bias = Tensor::from_f32(&gpu, &[0.5, 0.5, 0.5], &[3], DType::F32)?;
//! let y = elementwise::add(&x, &bias)?;             // broadcasting [2,3] + [3]
//! let p = softmax::softmax(&y)?;                     // over the last dim
//! assert_eq!(p.shape(), &[2, 3]);
//! # Ok(()) }
//! ```
//!
//! Without a GPU the CPU references still work:
//! ```
//! use host::{DType, HostTensor, ops::softmax};
//! let x = HostTensor::new(vec![1.0, 2.0, 3.0], &[1, 3], DType::F32).unwrap();
//! let p = softmax::reference::softmax(&x).unwrap();
//! assert!((p.data.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! ```
pub mod device;
pub mod dist;
pub mod dtype;
pub mod error;
pub mod launch;
pub mod modules;
pub mod ops;
pub mod replace;
pub mod shape;
pub mod tensor;
#[doc(hidden)]
pub mod testing;
mod tma;

pub use device::{Build, Gpu, MemoryStats, ModuleLoad, driver_present};
pub use dtype::DType;
pub use error::{Error, Result};
pub use modules::Family;
pub use tensor::{HostTensor, Tensor};
