//! Benchmark support: a criterion [`Measurement`] that times with CUDA events recorded on the stream the
//! kernels run on, input rotation against L2 hits, and the `rgk-bench-v1` JSON our report merges with the
//! PyTorch peers (bench/report.py).
use std::path::Path;
use std::sync::Arc;

use criterion::Throughput;
use criterion::measurement::{Measurement, ValueFormatter};
use cudarc::driver::{CudaEvent, CudaStream};

/// GPU time between two CUDA events on `stream`, in nanoseconds. Criterion calls `start`, runs the
/// routine `iters` times (launches queue back to back, so launch latency is hidden), then `end`, which
/// waits for the end event. Events are on the ops' own stream, so they bracket exactly its kernels.
pub struct GpuTime {
    pub stream: Arc<CudaStream>,
}

impl Measurement for GpuTime {
    type Intermediate = CudaEvent;
    type Value = f64;

    fn start(&self) -> CudaEvent {
        self.stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .expect("recording a CUDA event")
    }
    fn end(&self, start: CudaEvent) -> f64 {
        let end = self
            .stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .expect("recording a CUDA event");
        end.synchronize()
            .expect("waiting for the end event (a kernel may have faulted)");
        start.elapsed_ms(&end).expect("event timing") as f64 * 1e6
    }
    fn add(&self, a: &f64, b: &f64) -> f64 {
        a + b
    }
    fn zero(&self) -> f64 {
        0.0
    }
    fn to_f64(&self, v: &f64) -> f64 {
        *v
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &GpuTimeFormatter
    }
}

/// Formats nanoseconds; `Throughput::Bytes` as GB/s, `Throughput::Elements` as TFLOP/s (we count FLOPs
/// as elements).
struct GpuTimeFormatter;

impl ValueFormatter for GpuTimeFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = if typical < 1e3 {
            (1.0, "ns")
        } else if typical < 1e6 {
            (1e3, "us")
        } else {
            (1e6, "ms")
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let (per_iter, scale, unit) = match *t {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => (b as f64, 1e9, "GB/s"),
            Throughput::Elements(f) => (f as f64, 1e12, "TFLOP/s"),
            Throughput::Bits(b) => (b as f64 / 8.0, 1e9, "GB/s"),
        };
        values
            .iter_mut()
            .for_each(|ns| *ns = per_iter / (*ns * 1e-9) / scale);
        unit
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

/// How many copies of a `set_bytes` input set to rotate through so that repeated launches read from
/// device memory, not L2: at least twice the L2 size in total (1 copy for sets that big already).
pub fn rotation_copies(set_bytes: usize, l2_bytes: usize) -> usize {
    (2 * l2_bytes).div_ceil(set_bytes.max(1)).clamp(1, 64)
}

/// One bench as the report knows it.
#[derive(Clone, Debug)]
pub struct BenchSpec {
    /// `op/dtype/shape`, the same name the peers use.
    pub name: String,
    pub bytes: Option<u64>,
    pub flops: Option<u64>,
    /// Device bytes one call allocated at its high point above what was held before it (outputs, saved
    /// state, workspaces), from the host's allocation counter (`host::Gpu::memory_stats`); written as
    /// `meta.peak_memory_above_inputs_bytes`, the key bench/peers.py uses for PyTorch's.
    pub peak_memory_bytes: Option<u64>,
}

impl BenchSpec {
    /// Criterion group and id for this name: group = the op, id = the rest.
    pub fn criterion_ids(&self) -> (String, String) {
        match self.name.split_once('/') {
            Some((g, id)) => (g.to_string(), id.to_string()),
            None => (self.name.clone(), "default".to_string()),
        }
    }
    pub fn throughput(&self) -> Option<Throughput> {
        self.flops
            .map(Throughput::Elements)
            .or(self.bytes.map(Throughput::Bytes))
    }
}

/// Criterion's directory-name sanitising (report.rs `make_filename_safe`), to find its sample files.
fn criterion_dir_name(s: &str) -> String {
    s.chars()
        .map(|c| if "?\"/\\*<>:|^".contains(c) { '_' } else { c })
        .collect()
}

/// Per-sample milliseconds per iteration of one bench, from criterion's `new/sample.json`.
pub fn read_samples(criterion_home: &Path, spec: &BenchSpec) -> Result<Vec<f64>, String> {
    let (g, id) = spec.criterion_ids();
    let file = criterion_home
        .join(criterion_dir_name(&g))
        .join(criterion_dir_name(&id))
        .join("new")
        .join("sample.json");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let (iters, times) = (v["iters"].as_array(), v["times"].as_array());
    let (Some(iters), Some(times)) = (iters, times) else {
        return Err(format!("{}: no iters/times", file.display()));
    };
    Ok(iters
        .iter()
        .zip(times)
        .filter_map(|(i, t)| Some(t.as_f64()? / i.as_f64()? / 1e6))
        .collect())
}

/// Writes our results in the `rgk-bench-v1` schema.
pub fn write_json(
    path: &Path,
    device: &str,
    results: &[(BenchSpec, Vec<f64>)],
) -> Result<(), String> {
    let median = |xs: &[f64]| {
        let mut s = xs.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        if s.is_empty() {
            f64::NAN
        } else if s.len() % 2 == 1 {
            s[s.len() / 2]
        } else {
            (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
        }
    };
    let results: Vec<serde_json::Value> = results
        .iter()
        .map(|(spec, samples)| {
            serde_json::json!({
                "name": spec.name, "peer": "ours", "samples_ms": samples, "median_ms": median(samples),
                "bytes": spec.bytes, "flops": spec.flops, "error": serde_json::Value::Null,
                "meta": match spec.peak_memory_bytes {
                    Some(b) => serde_json::json!({ "peak_memory_above_inputs_bytes": b }),
                    None => serde_json::json!({}),
                },
            })
        })
        .collect();
    let doc = serde_json::json!({ "schema": "rgk-bench-v1", "device": device, "timing": "cuda-events", "results": results });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    std::fs::write(
        path,
        serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_covers_twice_the_l2() {
        assert_eq!(rotation_copies(8 << 20, 50 << 20), 13);
        assert_eq!(rotation_copies(256 << 20, 50 << 20), 1);
    }

    #[test]
    fn criterion_ids_split_the_op_from_the_rest() {
        let s = BenchSpec {
            name: "softmax/f32/8192x8192".into(),
            bytes: Some(1),
            flops: None,
            peak_memory_bytes: None,
        };
        assert_eq!(
            s.criterion_ids(),
            ("softmax".into(), "f32/8192x8192".into())
        );
        assert_eq!(criterion_dir_name("f32/8192x8192"), "f32_8192x8192");
    }
}
