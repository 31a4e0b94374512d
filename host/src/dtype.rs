//! Element types of tensors. Device math is f32 for every dtype; f16/bf16 are storage formats.
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Elements in one 16-byte vector access (`ld.global.v4.b32`): 4 for f32, 8 for f16/bf16. The
    /// vector kernels need rows made of whole chunks.
    pub fn chunk_elems(self) -> usize {
        gpu::params::elementwise::VECTOR_BYTES / self.size_bytes()
    }

    /// The suffix of kernel entry points (`add_f32`, `softmax_bf16`).
    pub fn kernel_suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// Rounds an f32 to the nearest value representable in this dtype (round to nearest even).
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F32 => v,
            DType::F16 => half::f16::from_f32(v).to_f32(),
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
        }
    }

    /// Unit roundoff (half the gap between 1 and the next value), for tolerances.
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::F16 => 2f64.powi(-11),
            DType::BF16 => 2f64.powi(-8),
        }
    }

    /// Encodes f32 values as this dtype's little-endian bytes.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }

    /// Decodes this dtype's little-endian bytes to f32 (exact).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => bytes
                .as_chunks::<2>()
                .0
                .iter()
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::BF16 => bytes
                .as_chunks::<2>()
                .0
                .iter()
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel_suffix())
    }
}
