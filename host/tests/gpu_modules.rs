//! Kernel modules load per op family, on first use, once: a fresh handle has none loaded, a softmax
//! call loads the reduce/softmax module and nothing else, concurrent first calls from several threads
//! load it once, and every family loads on this device in the form the library carries for it. The
//! device memory pool keeps freed memory until asked to release it.
mod common;
use common::*;
use host::ops::softmax;
use host::{DType, Family, Gpu, Tensor};

#[test]
fn a_family_loads_on_its_first_call_and_only_it() {
    let Some(_) = gpu_or_skip("a_family_loads_on_its_first_call_and_only_it") else {
        return;
    };
    let gpu = Gpu::new(0).unwrap();
    assert!(
        gpu.loaded_modules().is_empty(),
        "Gpu::new loaded {:?}",
        gpu.loaded_modules()
    );
    let x = Tensor::from_f32(&gpu, &[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32).unwrap();
    assert!(gpu.loaded_modules().is_empty(), "an upload loaded a module");
    let y = softmax::softmax(&x).unwrap().to_vec().unwrap();
    let want = [0.268_941_43, 0.731_058_6];
    for (got, want) in y.iter().zip(want.iter().chain(want.iter())) {
        assert!((got - want).abs() < 1e-6, "softmax {y:?}");
    }
    let loaded: Vec<Family> = gpu.loaded_modules().iter().map(|m| m.family).collect();
    assert_eq!(loaded, [Family::ReduceSoftmax]);
    println!("{gpu:?}");
}

#[test]
fn concurrent_first_calls_load_the_module_once() {
    let Some(_) = gpu_or_skip("concurrent_first_calls_load_the_module_once") else {
        return;
    };
    let gpu = Gpu::new(0).unwrap();
    let x = Tensor::from_f32(&gpu, &[0.5; 64], &[8, 8], DType::F32).unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let y = softmax::softmax(&x).unwrap().to_vec().unwrap();
                assert!(y.iter().all(|&v| (v - 0.125).abs() < 1e-6), "{y:?}");
            });
        }
    });
    let loads = gpu.loaded_modules();
    assert_eq!(loads.len(), 1, "{loads:?}");
    assert_eq!(loads[0].family, Family::ReduceSoftmax);
}

#[test]
fn every_family_loads_in_the_form_the_library_carries() {
    let Some(_) = gpu_or_skip("every_family_loads_in_the_form_the_library_carries") else {
        return;
    };
    let gpu = Gpu::new(0).unwrap();
    let (major, _) = gpu.compute_capability();
    for family in Family::ALL {
        let m = gpu.load_family(family).unwrap();
        let img = host::modules::images(family);
        let build = if gpu.ptx_arch() == "sm_90" {
            img.sm90
        } else {
            img.sm80
        };
        // Machine code where the library carries it for this device (and the environment does not
        // ask for PTX), else the PTX.
        let cubin_expected = build.cubin.is_some()
            && (gpu.ptx_arch() == "sm_90" || major == 8)
            && std::env::var("RGK_MODULE_FORMAT").as_deref() != Ok("ptx");
        println!(
            "{}: {} ({} bytes, {:.3} s)",
            family.name(),
            m.image,
            m.bytes,
            m.load_time.as_secs_f64()
        );
        assert_eq!(
            m.image.starts_with("cubin"),
            cubin_expected && m.cubin_refused.is_none(),
            "{m:?}"
        );
        assert_eq!(
            gpu.load_family(family).unwrap(),
            m,
            "a second load of {} changed it",
            family.name()
        );
    }
    assert_eq!(gpu.loaded_modules().len(), Family::ALL.len());
}

/// The device's pool keeps a dropped tensor's memory across synchronisations (so the next step's
/// tensors reuse it), and `release_cached_memory` gives it back. Free memory is read from the driver;
/// the 1 GiB margins leave room for the other tests of this binary.
#[test]
fn freed_memory_stays_in_the_pool_until_released() {
    let Some(_) = gpu_or_skip("freed_memory_stays_in_the_pool_until_released") else {
        return;
    };
    const GIB: usize = 1 << 30;
    let gpu = Gpu::new(0).unwrap();
    let free = || gpu.context().mem_get_info().unwrap().0;
    gpu.release_cached_memory().unwrap();
    let before = free();
    let big = Tensor::empty(&gpu, &[GIB], DType::F32).unwrap();
    big.fill_bytes(1).unwrap();
    drop(big);
    gpu.synchronize().unwrap();
    let kept = free();
    assert!(
        kept + 3 * GIB < before,
        "after dropping 4 GiB and synchronising the pool should still hold it: free {before} -> {kept}"
    );
    gpu.release_cached_memory().unwrap();
    let after = free();
    assert!(
        after + GIB > before,
        "release_cached_memory should return the 4 GiB: free {before} -> {kept} -> {after}"
    );
    println!("free bytes: {before} before, {kept} after the drop, {after} after the release");
}
