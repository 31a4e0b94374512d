//! Every bad input gets a typed error that says what was expected and what was given, and no launch.
//! GPU-side validation needs tensors on a device (SKIP without one); the CPU references validate too.
mod common;
use common::*;
use host::ops::elementwise::{self as ew, BinaryOp};
use host::ops::reduce::{self, Axis};
use host::ops::softmax;
use host::{DType, Error, HostTensor, Tensor};

#[test]
fn no_device_is_a_clear_error_not_a_panic() {
    match host::Gpu::new(0) {
        Ok(gpu) => println!("GPU present: {gpu:?}"),
        Err(e) => {
            assert!(matches!(e, Error::NoDevice { .. }), "{e}");
            assert!(e.to_string().contains("no CUDA device"), "{e}");
        }
    }
    // An ordinal far past any real machine's device count is NoDevice on every machine.
    assert!(matches!(host::Gpu::new(4096), Err(Error::NoDevice { .. })));
}

#[test]
fn host_tensor_rejects_length_mismatch() {
    let e = HostTensor::new(vec![0.0; 5], &[2, 3], DType::F32).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Length {
                expected: 6,
                got: 5,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn gpu_ops_reject_bad_inputs_before_launch() {
    let Some(gpu) = gpu_or_skip("gpu_ops_reject_bad_inputs_before_launch") else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        Tensor::from_f32(&gpu, &vec![1.0; shape.iter().product()], shape, dtype).unwrap()
    };
    // Shapes that do not broadcast: both shapes in the message.
    let e = ew::add(&t(&[2, 3], DType::F32), &t(&[4], DType::F32)).unwrap_err();
    assert!(
        matches!(e, Error::Broadcast { .. })
            && e.to_string().contains("[2, 3]")
            && e.to_string().contains("[4]"),
        "{e}"
    );
    // Dtype mismatch.
    let e = ew::mul(&t(&[3], DType::F32), &t(&[3], DType::F16)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::F16,
                ..
            }
        ),
        "{e}"
    );
    // Non-contiguous input where the kernel needs contiguity.
    let view = t(&[4, 5], DType::F32).transpose(0, 1).unwrap();
    for e in [
        softmax::softmax(&view).unwrap_err(),
        ew::gelu(&view).unwrap_err(),
        reduce::sum(&view, Axis::Last).unwrap_err(),
    ] {
        assert!(matches!(e, Error::NotContiguous { .. }), "{e}");
    }
    // Rank beyond what the strided kernels index.
    let e = ew::add(&t(&[1; 7], DType::F32), &t(&[1], DType::F32)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                given: 7,
                max: 6,
                ..
            }
        ),
        "{e}"
    );
    // Host/device length mismatch on copies.
    let mut d = t(&[4], DType::F32);
    assert!(matches!(
        d.copy_from_f32(&[1.0; 3]),
        Err(Error::Length {
            expected: 4,
            got: 3,
            ..
        })
    ));
    // Shape mismatch for ops without broadcasting.
    let e =
        softmax::softmax_backward(&t(&[2, 3], DType::F32), &t(&[3, 2], DType::F32)).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Undefined results on empty input are errors; empty outputs are a no-op.
    assert!(matches!(
        reduce::max(&t(&[3, 0], DType::F32), Axis::Last),
        Err(Error::Invalid { .. })
    ));
    let empty = ew::add(&t(&[0, 5], DType::F32), &t(&[5], DType::F32)).unwrap();
    assert_eq!(empty.shape(), &[0, 5]);
    assert_eq!(
        reduce::sum(&t(&[4, 0], DType::F32), Axis::Last)
            .unwrap()
            .to_vec()
            .unwrap(),
        vec![0.0; 4]
    );
    // Backward with the wrong gradient shape.
    let e = ew::binary_backward(
        BinaryOp::Add,
        &t(&[2, 3], DType::F32),
        &t(&[3], DType::F32),
        &t(&[3], DType::F32),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // The context is still healthy after all of that.
    assert_eq!(
        ew::add(&t(&[2], DType::F32), &t(&[2], DType::F32))
            .unwrap()
            .to_vec()
            .unwrap(),
        vec![2.0, 2.0]
    );
}

#[test]
fn driver_errors_explain_common_codes() {
    for code in [700u32, 716, 719] {
        let m = host::error::meaning(code);
        assert!(m.contains("cargo xtask sanitize"), "{code}: {m}");
    }
}

#[test]
fn layer_norm_and_embedding_reject_bad_inputs_before_launch() {
    use host::ops::embedding::{self as emb, DeviceIds};
    use host::ops::layer_norm as ln;
    // CPU references validate too (run without a GPU).
    let h = |shape: &[usize]| {
        HostTensor::new(vec![1.0; shape.iter().product()], shape, DType::F32).unwrap()
    };
    assert!(matches!(
        ln::reference::layer_norm(&h(&[2, 3]), &h(&[4]), &h(&[3]), None),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        emb::reference::embedding(&h(&[4, 2]), &[4]),
        Err(Error::IdOutOfRange { .. })
    ));
    let Some(gpu) = gpu_or_skip("layer_norm_and_embedding_reject_bad_inputs_before_launch") else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        Tensor::from_f32(&gpu, &vec![1.0; shape.iter().product()], shape, dtype).unwrap()
    };
    let x = t(&[4, 6], DType::F32);
    let (g, b) = (t(&[6], DType::F32), t(&[6], DType::F32));
    // gamma/beta of the wrong length or rank: both shapes in the message.
    for (gg, bb) in [
        (t(&[5], DType::F32), b.clone()),
        (g.clone(), t(&[1, 6], DType::F32)),
    ] {
        let e = ln::layer_norm(&x, &gg, &bb, None).unwrap_err();
        assert!(
            matches!(e, Error::Shape { .. }) && e.to_string().contains("[4, 6]"),
            "{e}"
        );
    }
    // Wrong dtypes: gamma not x's dtype; saved statistics not f32.
    let e = ln::layer_norm(&x, &t(&[6], DType::F16), &b, None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::F16,
                ..
            }
        ),
        "{e}"
    );
    let (_, mean, rstd) = ln::layer_norm(&x, &g, &b, None).unwrap();
    let e = ln::layer_norm_backward(&x, &g, &t(&[4], DType::BF16), &rstd, &x).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
    // dy / statistics of the wrong shape.
    let e = ln::layer_norm_backward(&x, &g, &mean, &rstd, &t(&[6, 4], DType::F32)).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let e = ln::layer_norm_backward(&x, &g, &t(&[3], DType::F32), &rstd, &x).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Non-contiguous x; rows of length 0; a negative or NaN eps.
    let view = t(&[6, 4], DType::F32).transpose(0, 1).unwrap();
    assert!(matches!(
        ln::layer_norm(&view, &g, &b, None),
        Err(Error::NotContiguous { .. })
    ));
    let z = t(&[3, 0], DType::F32);
    assert!(matches!(
        ln::layer_norm(&z, &t(&[0], DType::F32), &t(&[0], DType::F32), None),
        Err(Error::Invalid { .. })
    ));
    for eps in [-1.0, f32::NAN] {
        assert!(matches!(
            ln::layer_norm(&x, &g, &b, Some(eps)),
            Err(Error::Invalid { .. })
        ));
    }

    // Embedding: table not [V, D], not contiguous; dy not [N, D]; ids out of range (host and device).
    let table = t(&[5, 3], DType::F16);
    assert!(matches!(
        emb::embedding(&t(&[15], DType::F16), &[0u32]),
        Err(Error::Shape { .. })
    ));
    let tview = t(&[3, 5], DType::F16).transpose(0, 1).unwrap();
    assert!(matches!(
        emb::embedding(&tview, &[0u32]),
        Err(Error::NotContiguous { .. })
    ));
    let e = emb::embedding_backward(&[0u32, 1], &t(&[3, 3], DType::F16), 5).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("[3, 3]"),
        "{e}"
    );
    let e = emb::embedding(&table, &[0u32, 5]).unwrap_err();
    assert!(e.to_string().contains("ids[1] = 5"), "{e}");
    let dev = DeviceIds::from_slice(&gpu, &[7u32]).unwrap();
    assert!(matches!(
        emb::embedding(&table, &dev),
        Err(Error::IdOutOfRange { .. })
    ));
    // The context is still healthy.
    assert_eq!(
        emb::embedding(&table, &[4u32]).unwrap().to_vec().unwrap(),
        vec![1.0; 3]
    );
}

#[test]
fn matmul_rejects_bad_inputs_before_launch() {
    use host::ops::matmul::{self, Transpose::No, Transpose::Yes, reference};
    // CPU side (runs without a GPU): the reference applies the same shape rules as the GPU op.
    let h = |shape: &[usize], dtype| {
        HostTensor::new(vec![1.0; shape.iter().product()], shape, dtype).unwrap()
    };
    let e =
        reference::matmul(&h(&[4, 5], DType::F16), &h(&[6, 7], DType::F16), No, No).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. })
            && e.to_string().contains("[4, 5]")
            && e.to_string().contains("[6, 7]"),
        "{e}"
    );
    let e =
        reference::matmul(&h(&[4, 5], DType::F16), &h(&[5, 7], DType::BF16), No, No).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        reference::matmul(&h(&[20], DType::BF16), &h(&[4, 5], DType::BF16), No, No),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        reference::matmul(
            &h(&[2, 4, 5], DType::F16),
            &h(&[3, 5, 6], DType::F16),
            No,
            No
        ),
        Err(Error::Shape { .. })
    ));
    // A transpose flag changes which dims must agree: (5 x 4)^T (5 x 6) is fine, (4 x 5)^T is not.
    assert!(reference::matmul(&h(&[5, 4], DType::F16), &h(&[5, 6], DType::F16), Yes, No).is_ok());
    assert!(reference::matmul(&h(&[4, 5], DType::F16), &h(&[5, 6], DType::F16), Yes, No).is_err());

    let Some(gpu) = gpu_or_skip("matmul_rejects_bad_inputs_before_launch") else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        Tensor::from_f32(&gpu, &vec![1.0; shape.iter().product()], shape, dtype).unwrap()
    };
    // Dtype mismatch between A and B.
    let e = matmul::matmul(&t(&[4, 5], DType::F16), &t(&[5, 6], DType::BF16), No, No).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
    // Inner-dim mismatch: both shapes in the message.
    let e =
        matmul::matmul(&t(&[4, 5], DType::BF16), &t(&[6, 7], DType::BF16), No, Yes).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. })
            && e.to_string().contains("[4, 5]")
            && e.to_string().contains("[6, 7]"),
        "{e}"
    );
    // Wrong rank, batch mismatch.
    for (a, b) in [
        (t(&[20], DType::F16), t(&[4, 5], DType::F16)),
        (t(&[1, 2, 4, 5], DType::F16), t(&[5, 6], DType::F16)),
        (t(&[2, 4, 5], DType::F16), t(&[3, 5, 6], DType::F16)),
    ] {
        let e = matmul::matmul(&a, &b, No, No).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
    }
    // Non-contiguous input (a transposed view): use the transpose flag instead.
    let view = t(&[5, 4], DType::F16).transpose(0, 1).unwrap();
    let e = matmul::matmul(&view, &t(&[5, 6], DType::F16), No, No).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { .. }), "{e}");
    // The context is still healthy, and a product of width 0 is an empty result, not a launch.
    let ok = matmul::matmul(&t(&[2, 3], DType::BF16), &t(&[3, 2], DType::BF16), No, No).unwrap();
    assert_eq!(ok.to_vec().unwrap(), vec![3.0; 4]);
    let empty = matmul::matmul(&t(&[2, 3], DType::F16), &t(&[3, 0], DType::F16), No, No).unwrap();
    assert_eq!(empty.shape(), &[2, 0]);
}
