use super::reference as r;
use super::*;
use crate::HostTensor;

fn host(data: Vec<f32>, shape: &[usize]) -> HostTensor {
    HostTensor::new(data, shape, DType::F32).unwrap()
}

/// Whether a backward's main kernel is a general wgmma one (packed batches, windows, head dims
/// off the dense kernels, the softcap and ALiBi).
fn is_general(k: &FlashBwdKernels) -> bool {
    [
        "flash_wg_bwd_general_",
        "flash_wg_bwd_packed_",
        "flash_wg_bwd_scored_",
    ]
    .iter()
    .any(|p| k.main.starts_with(p))
}

#[test]
fn reference_matches_a_hand_computed_case() {
    // One head, 2 queries, 3 keys, head_dim 2, scale 1.
    // q0 = (1, 0), q1 = (0, 1); k = (1, 0), (0, 1), (1, 1); v = (1, 2), (3, 4), (5, 6).
    let q = host(vec![1., 0., 0., 1.], &[1, 1, 2, 2]);
    let k = host(vec![1., 0., 0., 1., 1., 1.], &[1, 1, 3, 2]);
    let v = host(vec![1., 2., 3., 4., 5., 6.], &[1, 1, 3, 2]);
    let p = AttentionParams {
        causal: Causal::No,
        scale: Some(1.0),
        ..Default::default()
    };
    let (o, lse) = r::forward(&q, &k, &v, &p).unwrap();
    // Row 0 scores (1, 0, 1): weights (e, 1, e) / (2e + 1).
    let e = std::f64::consts::E;
    let z = 2.0 * e + 1.0;
    let want0 = [(e * 1. + 3. + e * 5.) / z, (e * 2. + 4. + e * 6.) / z];
    // Row 1 scores (0, 1, 1): weights (1, e, e) / (2e + 1).
    let want1 = [(1. + e * 3. + e * 5.) / z, (2. + e * 4. + e * 6.) / z];
    let want = [want0[0], want0[1], want1[0], want1[1]];
    for (got, want) in o.data.iter().zip(want) {
        assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
    }
    for got in &lse.data {
        assert!((*got as f64 - z.ln()).abs() < 1e-6);
    }

    // Causal with seq_q = 2 < seq_k = 3 (bottom-right aligned): query 0 sees keys 0..=1,
    // query 1 sees all three.
    let p = AttentionParams {
        causal: Causal::Yes,
        scale: Some(1.0),
        ..Default::default()
    };
    let (o, lse) = r::forward(&q, &k, &v, &p).unwrap();
    let w0 = [e / (e + 1.), 1. / (e + 1.)];
    assert!((o.data[0] as f64 - (w0[0] * 1. + w0[1] * 3.)).abs() < 1e-6);
    assert!((o.data[1] as f64 - (w0[0] * 2. + w0[1] * 4.)).abs() < 1e-6);
    assert!((lse.data[0] as f64 - (e + 1.).ln()).abs() < 1e-6);
    assert!((o.data[2] as f64 - want1[0]).abs() < 1e-6);
}

#[test]
fn fully_masked_rows_are_zero_with_lse_minus_infinity() {
    // seq_q = 3 > seq_k = 1, causal: query i sees key 0 iff 0 <= i - 2, so rows 0 and 1 see nothing.
    let q = host(vec![0.5; 6], &[1, 1, 3, 2]);
    let k = host(vec![1.0, -1.0], &[1, 1, 1, 2]);
    let v = host(vec![2.0, 3.0], &[1, 1, 1, 2]);
    let p = AttentionParams {
        causal: Causal::Yes,
        scale: None,
        ..Default::default()
    };
    let b = r::forward_and_naive(&q, &k, &v, &p).unwrap();
    for out in [&b.exact_o, &b.naive_o] {
        assert_eq!(out.data, vec![0., 0., 0., 0., 2., 3.]);
    }
    for lse in [&b.exact_lse, &b.naive_lse] {
        assert_eq!(&lse.data[..2], &[f32::NEG_INFINITY; 2]);
        assert_eq!(lse.data[2], 0.0); // one key with score 0.5 - 0.5 = 0
    }
}

#[test]
fn naive_same_precision_rounds_like_the_dtype() {
    let q = HostTensor::new(vec![0.3, -0.7, 1.1, 0.2], &[1, 1, 2, 2], DType::BF16).unwrap();
    let k = HostTensor::new(vec![0.9, 0.1, -0.4, 0.8], &[1, 1, 2, 2], DType::BF16).unwrap();
    let v = HostTensor::new(vec![0.11, 0.22, 0.33, 0.44], &[1, 1, 2, 2], DType::BF16).unwrap();
    let p = AttentionParams::default();
    let (o, _) = r::naive_same_precision(&q, &k, &v, &p).unwrap();
    assert!(o.data.iter().all(|&x| DType::BF16.round(x) == x));
    let (exact, _) = r::forward(&q, &k, &v, &p).unwrap();
    let err = o
        .data
        .iter()
        .zip(&exact.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(err > 0.0 && err < 4e-3, "bf16 naive error {err}");
}

#[test]
fn shape_validation_names_the_problem() {
    let e = dims("t", &[2, 3, 4], &[2, 3, 4, 8], &[2, 3, 4, 8])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 4") && e.contains("[batch, seq, heads, head_dim]"),
        "{e}"
    );
    let e = dims("t", &[2, 3, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 8])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("batch, heads and head_dim") && e.contains("[2, 3, seq_k, 8]"),
        "{e}"
    );
    let e = dims("t", &[2, 3, 5, 8], &[2, 3, 7, 16], &[2, 3, 7, 16])
        .unwrap_err()
        .to_string();
    assert!(e.contains("head_dim"), "{e}");
    let e = dims("t", &[2, 3, 5, 8], &[2, 3, 7, 8], &[2, 3, 6, 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("v must have the shape of k"), "{e}");
    let e = dims("t", &[1, 1, (1 << 30) + 1, 8], &[1, 1, 1, 8], &[1, 1, 1, 8]).unwrap_err();
    assert!(matches!(e, Error::TooLarge { what: "seq_q", .. }), "{e}");
    assert!(dims("t", &[2, 3, 5, 8], &[2, 3, 7, 8], &[2, 3, 7, 8]).is_ok());
}

#[test]
fn grouped_dims_take_key_value_heads_that_divide_the_query_heads() {
    let d = dims_grouped("t", &[2, 8, 5, 64], &[2, 2, 7, 64], &[2, 2, 7, 64]).unwrap();
    assert_eq!((d.heads, d.kv_heads, d.seq_k), (8, 2, 7));
    let d = dims_grouped("t", &[2, 8, 5, 64], &[2, 8, 7, 64], &[2, 8, 7, 64]).unwrap();
    assert_eq!(d.kv_heads, 8);
    for kv_heads in [3, 0, 16] {
        let k = [2, kv_heads, 7, 64];
        let e = dims_grouped("t", &[2, 8, 5, 64], &k, &k)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dividing") && e.contains("a divisor of 8"),
            "{kv_heads}: {e}"
        );
    }
    // The multi-head rule (naive path, references) still wants equal counts.
    assert!(dims("t", &[2, 8, 5, 64], &[2, 2, 7, 64], &[2, 2, 7, 64]).is_err());
}

fn operand<'a>(name: &'static str, shape: &'a [usize], dtype: DType) -> Operand<'a> {
    Operand {
        name,
        shape,
        strides: &[],
        dtype,
        contiguous: true,
        aligned16: true,
    }
}

fn check(path: Path, ops: [Operand; 3]) -> Result<(Dims, f32)> {
    validate_operands("t", path, &ops, &AttentionParams::default())
}

#[test]
fn validation_rejects_each_bad_input_with_a_typed_error() {
    let (qs, ks) = ([2, 3, 5, 64], [2, 3, 7, 64]);
    let good = |dt| {
        [
            operand("q", &qs, dt),
            operand("k", &ks, dt),
            operand("v", &ks, dt),
        ]
    };
    let (d, scale) = check(Path::Flash, good(DType::F16)).unwrap();
    assert_eq!((d.seq_q, d.seq_k, scale), (5, 7, 0.125));
    assert!(check(Path::Flash, good(DType::BF16)).is_ok());
    assert!(check(Path::Naive, good(DType::F32)).is_ok());

    // dtype: f32 only on the naive path; mixed dtypes never.
    let e = check(Path::Flash, good(DType::F32)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::F32,
                ..
            }
        ),
        "{e}"
    );
    let mut mixed = good(DType::F16);
    mixed[2].dtype = DType::BF16;
    let e = check(Path::Naive, mixed).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::BF16,
                ..
            }
        ) && e.to_string().contains("for v"),
        "{e}"
    );

    // head dim: every multiple of 8 up to the widest tile runs; others say which are supported.
    for dh in (8..=FLASH_MAX_HEAD_DIM).step_by(8) {
        let (qs, ks) = ([2, 3, 5, dh], [2, 3, 7, dh]);
        let ops = [
            operand("q", &qs, DType::F16),
            operand("k", &ks, DType::F16),
            operand("v", &ks, DType::F16),
        ];
        assert!(check(Path::Flash, ops).is_ok(), "head_dim {dh}");
    }
    for dh in [4, 12, 100, FLASH_MAX_HEAD_DIM + 8] {
        let (qs, ks) = ([2, 3, 5, dh], [2, 3, 7, dh]);
        let bad = [
            operand("q", &qs, DType::F16),
            operand("k", &ks, DType::F16),
            operand("v", &ks, DType::F16),
        ];
        let e = check(Path::Flash, bad).unwrap_err().to_string();
        assert!(
            e.contains(&format!("head_dim {dh}")) && e.contains("multiples of 8"),
            "{e}"
        );
        assert_eq!(check(Path::Naive, bad).is_ok(), dh <= naive::MAX_HEAD_DIM);
    }
    let (q512, k512) = ([1, 1, 5, 512], [1, 1, 7, 512]);
    let big = [
        operand("q", &q512, DType::F32),
        operand("k", &k512, DType::F32),
        operand("v", &k512, DType::F32),
    ];
    assert!(
        check(Path::Naive, big)
            .unwrap_err()
            .to_string()
            .contains("1..=256")
    );

    // Strides: a [B, S, H, D] tensor viewed as [B, H, S, D] through transpose(1, 2) runs on the
    // flash path; the naive path wants contiguous operands.
    let with_strides = |strides: &'static [usize]| {
        let mut ops = good(DType::F16);
        ops[1].contiguous = false;
        ops[1].strides = strides;
        ops
    };
    assert!(check(Path::Flash, with_strides(&[1344, 64, 192, 1])).is_ok());
    let e = check(Path::Naive, with_strides(&[1344, 64, 192, 1])).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { what: "k", .. }), "{e}");
    // A slice of a fused [B, S, 3, H, D] QKV tensor: row stride 3 H D.
    assert!(check(Path::Flash, with_strides(&[4032, 64, 576, 1])).is_ok());
    for (strides, says) in [
        (&[1344, 448, 1, 7][..], "head_dim, is not contiguous"),
        (
            &[1344, 68, 196, 1][..],
            "heads stride 68 is not a nonzero multiple of 8",
        ),
        (
            &[1344, 0, 64, 1][..],
            "heads stride 0 is not a nonzero multiple of 8",
        ),
        (
            &[1 << 34, 1 << 33, 1 << 32, 1][..],
            "seq stride 4294967296 is not below 2^32",
        ),
    ] {
        let strides: &'static [usize] = Vec::leak(strides.to_vec());
        let e = check(Path::Flash, with_strides(strides)).unwrap_err();
        assert!(
            matches!(e, Error::Invalid { .. })
                && e.to_string().contains(says)
                && e.to_string().contains("k:"),
            "{strides:?}: {e}"
        );
    }

    // misaligned base (flash only).
    let mut odd = good(DType::F16);
    odd[0].aligned16 = false;
    assert!(
        check(Path::Flash, odd)
            .unwrap_err()
            .to_string()
            .contains("16-byte aligned")
    );
    assert!(check(Path::Naive, odd).is_ok());

    // rank and shape agreement.
    let q3 = [2, 3, 5];
    let e = check(
        Path::Flash,
        [
            operand("q", &q3, DType::F16),
            good(DType::F16)[1],
            good(DType::F16)[2],
        ],
    );
    assert!(matches!(e, Err(Error::Shape { .. })));
    let kh = [2, 4, 7, 64];
    let e = check(
        Path::Flash,
        [
            good(DType::F16)[0],
            operand("k", &kh, DType::F16),
            operand("v", &kh, DType::F16),
        ],
    );
    // 4 key/value heads do not divide q's 3: the FlashAttention path says what it takes.
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("a head count dividing q's")
    );

    // grid limits.
    let (qh, khh) = ([1, 70000, 5, 64], [1, 70000, 7, 64]);
    let e = check(
        Path::Flash,
        [
            operand("q", &qh, DType::F16),
            operand("k", &khh, DType::F16),
            operand("v", &khh, DType::F16),
        ],
    );
    assert!(matches!(e, Err(Error::TooLarge { what: "heads", .. })));
}

/// splitmix64 values in [-1, 1): seeded inputs without an RNG dependency.
fn values(seed: &mut u64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// The backward reference against central differences of the f64 forward, for every element of
/// Q, K and V: loss `L = sum(dO * O)`, step `h = 1e-6 max(1, |x|)`, checked
/// `|fd - grad| <= 1e-7 + 1e-6 |grad|` (f64: rounding noise ~1e-10, truncation ~1e-12). Shapes:
/// square and Sq != Sk both ways, both masks, a custom scale, and causal Sq > Sk where rows see no
/// key. The f64 forward is first pinned to the public [`reference::forward`].
#[test]
fn backward_reference_matches_central_differences() {
    let cases = [
        // (seq_q, seq_k, head_dim, causal, scale)
        (4, 4, 3, Causal::No, None),
        (4, 4, 3, Causal::Yes, None),
        (3, 5, 4, Causal::No, Some(0.7)),
        (3, 5, 4, Causal::Yes, None),
        (5, 3, 2, Causal::Yes, Some(1.3)), // rows 0 and 1 see no key
        (5, 2, 3, Causal::No, None),
        (1, 1, 5, Causal::Yes, None),
    ];
    let mut seed = 0x00A7_7E47_u64;
    let mut checked = 0;
    for (sq, sk, dh, causal, sc) in cases {
        let params = AttentionParams {
            causal,
            scale: sc,
            ..Default::default()
        };
        let scale = scale("t", &params, dh).unwrap() as f64;
        let (q, k, v) = (
            values(&mut seed, sq * dh),
            values(&mut seed, sk * dh),
            values(&mut seed, sk * dh),
        );
        let d_o = values(&mut seed, sq * dh);
        let head = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let x = r::HeadInputs {
                q,
                k,
                v,
                seq_q: sq,
                seq_k: sk,
                head_dim: dh,
                scale,
                causal: causal == Causal::Yes,
            };
            x.forward().iter().zip(&d_o).map(|(o, g)| o * g).sum()
        };
        // The f64 forward is the published reference forward.
        let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<_>>();
        let (ht, hk) = ([1, 1, sq, dh], [1, 1, sk, dh]);
        let (qt, kt, vt) = (
            host(f32s(&q), &ht),
            host(f32s(&k), &hk),
            host(f32s(&v), &hk),
        );
        let x = r::HeadInputs {
            q: &qt.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            k: &kt.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            v: &vt.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            seq_q: sq,
            seq_k: sk,
            head_dim: dh,
            scale,
            causal: causal == Causal::Yes,
        };
        let (o, _) = r::forward(&qt, &kt, &vt, &params).unwrap();
        for (a, b) in x.forward().iter().zip(&o.data) {
            assert!((a - *b as f64).abs() < 1e-6, "{a} vs {b}");
        }

        let g = r::HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            seq_q: sq,
            seq_k: sk,
            head_dim: dh,
            scale,
            causal: causal == Causal::Yes,
        }
        .backward(&d_o);
        for (which, grad) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
            for idx in 0..grad.len() {
                let (mut qp, mut kp, mut vp) = (q.clone(), k.clone(), v.clone());
                let (mut qm, mut km, mut vm) = (q.clone(), k.clone(), v.clone());
                let (xp, xm) = match which {
                    "dq" => (&mut qp[idx], &mut qm[idx]),
                    "dk" => (&mut kp[idx], &mut km[idx]),
                    _ => (&mut vp[idx], &mut vm[idx]),
                };
                let h = 1e-6 * xp.abs().max(1.0);
                *xp += h;
                *xm -= h;
                let fd = (head(&qp, &kp, &vp) - head(&qm, &km, &vm)) / (2.0 * h);
                let an = grad[idx];
                assert!(
                    an.is_finite() && (fd - an).abs() <= 1e-7 + 1e-6 * an.abs(),
                    "sq {sq} sk {sk} d {dh} {causal:?}: {which}[{idx}] backward {an:.9e}, \
                     central difference {fd:.9e}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 200, "{checked}");
}

/// The public [`reference::backward`] (what the GPU backward tests compare against) against central
/// differences of [`reference::forward_f64`] over every element of Q, K and V, with several heads
/// and batches (the reference splits heads over threads; a wrong head offset fails here) and fresh
/// inputs each run (seed printed, `RGK_SEED` replays). Loss `L = sum(dO * O)` of the perturbed head
/// only (the other heads do not depend on the element). The inputs are f32 values, exact in f64, so
/// both sides see the same point. Step `h = 1e-6 max(1, |x|)`: truncation `h^2 |L^(3)| / 6` ~1e-12,
/// f64 rounding noise `1e-16 |L| / h` ~1e-9 for `|L|` ~10; the backward's gradients are rounded to
/// f32 once (relative 6e-8). Checked `|fd - grad| <= 1e-7 + 1e-6 |grad|`.
#[test]
fn public_backward_reference_matches_central_differences_over_heads() {
    let mut seed = crate::testing::seed("public_backward_reference_matches_central_differences");
    let cases = [
        // (batch, heads, seq_q, seq_k, head_dim, causal)
        (2, 2, 5, 3, 4, Causal::Yes), // rows 0 and 1 see no key
        (2, 2, 3, 7, 4, Causal::No),
        (1, 3, 6, 6, 3, Causal::Yes),
        (2, 1, 4, 9, 5, Causal::Yes),
        (1, 2, 2, 3, 64, Causal::Yes), // the flash kernels' head dim
        (1, 1, 1, 1, 64, Causal::No),
    ];
    let mut checked = 0;
    for (b, h, sq, sk, dh, causal) in cases {
        let params = AttentionParams {
            causal,
            scale: None,
            ..Default::default()
        };
        let draw = |seed: &mut u64, n| -> Vec<f32> {
            values(seed, n)
                .into_iter()
                .map(|x| 2.0 * x as f32)
                .collect()
        };
        let (qs, ks) = ([b, h, sq, dh], [b, h, sk, dh]);
        let q = host(draw(&mut seed, b * h * sq * dh), &qs);
        let k = host(draw(&mut seed, b * h * sk * dh), &ks);
        let v = host(draw(&mut seed, b * h * sk * dh), &ks);
        let d_o = host(draw(&mut seed, b * h * sq * dh), &qs);
        let g = r::backward(&q, &k, &v, &d_o, &params).unwrap();
        let f64s = |t: &HostTensor| t.data.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let (q64, k64, v64, do64) = (f64s(&q), f64s(&k), f64s(&v), f64s(&d_o));
        let one_head = Dims {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            seq_q: sq,
            seq_k: sk,
            head_dim: dh,
        };
        // L of head `head` with its Q, K, V slices.
        let loss = |head: usize, q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let o = r::forward_f64(one_head, q, k, v, &params).unwrap();
            let d_o = &do64[head * sq * dh..(head + 1) * sq * dh];
            o.iter().zip(d_o).map(|(o, g)| o * g).sum()
        };
        for (which, grad, per) in [
            ("dq", &g.dq, sq * dh),
            ("dk", &g.dk, sk * dh),
            ("dv", &g.dv, sk * dh),
        ] {
            for (idx, &an) in grad.data.iter().enumerate() {
                let head = idx / per;
                let slice = |x: &[f64], n: usize| x[head * n..(head + 1) * n].to_vec();
                let (mut qp, mut kp, mut vp) = (
                    slice(&q64, sq * dh),
                    slice(&k64, sk * dh),
                    slice(&v64, sk * dh),
                );
                let (mut qm, mut km, mut vm) = (qp.clone(), kp.clone(), vp.clone());
                let at = idx % per;
                let (xp, xm) = match which {
                    "dq" => (&mut qp[at], &mut qm[at]),
                    "dk" => (&mut kp[at], &mut km[at]),
                    _ => (&mut vp[at], &mut vm[at]),
                };
                let step = 1e-6 * xp.abs().max(1.0);
                *xp += step;
                *xm -= step;
                let fd = (loss(head, &qp, &kp, &vp) - loss(head, &qm, &km, &vm)) / (2.0 * step);
                let an = an as f64;
                assert!(
                    an.is_finite() && (fd - an).abs() <= 1e-7 + 1e-6 * an.abs(),
                    "B{b} H{h} sq {sq} sk {sk} d {dh} {causal:?}: {which}[{idx}] (head {head}) \
                     backward {an:.9e}, central difference {fd:.9e}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn forward_f64_is_the_reference_forward_and_checks_lengths() {
    let mut seed = 0x0F64_u64;
    let (qs, ks) = ([2, 1, 3, 4], [2, 1, 5, 4]);
    let f = |s: &mut u64, n| values(s, n).into_iter().map(|v| v as f32).collect();
    let q = host(f(&mut seed, 24), &qs);
    let k = host(f(&mut seed, 40), &ks);
    let v = host(f(&mut seed, 40), &ks);
    let p = AttentionParams {
        causal: Causal::Yes,
        scale: Some(0.7),
        ..Default::default()
    };
    let d = dims("t", &qs, &ks, &ks).unwrap();
    let f64s = |t: &HostTensor| t.data.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let o64 = r::forward_f64(d, &f64s(&q), &f64s(&k), &f64s(&v), &p).unwrap();
    let (o, _) = r::forward(&q, &k, &v, &p).unwrap();
    assert_eq!(o64.len(), o.data.len());
    for (a, b) in o64.iter().zip(&o.data) {
        assert_eq!(*a as f32, *b);
    }
    let e = r::forward_f64(d, &f64s(&q)[1..], &f64s(&k), &f64s(&v), &p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Length {
                expected: 24,
                got: 23,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn backward_of_fully_masked_rows_is_zero_and_never_nan() {
    // Causal, seq_q = 4 > seq_k = 2: query i sees keys j <= i - 2, so rows 0 and 1 see nothing.
    let mut seed = 7u64;
    let f = |s: &mut u64, n| values(s, n).into_iter().map(|v| v as f32).collect();
    let q = host(f(&mut seed, 2 * 4 * 3), &[1, 2, 4, 3]);
    let k = host(f(&mut seed, 2 * 2 * 3), &[1, 2, 2, 3]);
    let v = host(f(&mut seed, 2 * 2 * 3), &[1, 2, 2, 3]);
    let d_o = host(f(&mut seed, 2 * 4 * 3), &[1, 2, 4, 3]);
    let p = AttentionParams {
        causal: Causal::Yes,
        scale: None,
        ..Default::default()
    };
    let g = r::backward(&q, &k, &v, &d_o, &p).unwrap();
    assert_eq!(g.dq.shape, vec![1, 2, 4, 3]);
    assert_eq!(
        (g.dk.shape.clone(), g.dv.shape.clone()),
        (vec![1, 2, 2, 3], vec![1, 2, 2, 3])
    );
    for t in [&g.dq, &g.dk, &g.dv] {
        assert!(t.data.iter().all(|x| x.is_finite()));
    }
    for head in 0..2 {
        // Rows 0 and 1: dQ = 0. Row 2 sees only key 0 (P = 1): dQ = 0 too (dS = 1 (dP - dP)).
        let rows = &g.dq.data[head * 12..head * 12 + 9];
        assert!(rows.iter().all(|&x| x == 0.0), "{rows:?}");
        // dV of key 1: only row 3 sees it.
        assert!(
            g.dv.data[head * 6 + 3..head * 6 + 6]
                .iter()
                .any(|&x| x != 0.0)
        );
    }
    // Every row masked (seq_k = 0 is allowed): all zero.
    let empty = host(vec![], &[1, 2, 0, 3]);
    let g = r::backward(&q, &empty, &empty, &d_o, &p).unwrap();
    assert!(g.dq.data.iter().all(|&x| x == 0.0) && g.dk.data.is_empty());
}

#[test]
fn backward_reference_hand_case_and_bad_input() {
    // One key: P = 1 for every query, so dV = sum of dO rows and dQ = dK = 0.
    let q = host(vec![0.3, -0.2, 0.9, 0.4], &[1, 1, 2, 2]);
    let k = host(vec![0.5, 0.1], &[1, 1, 1, 2]);
    let v = host(vec![2.0, -1.0], &[1, 1, 1, 2]);
    let d_o = host(vec![1.0, 2.0, 3.0, -4.0], &[1, 1, 2, 2]);
    let p = AttentionParams::default();
    let g = r::backward(&q, &k, &v, &d_o, &p).unwrap();
    assert_eq!(g.dv.data, vec![4.0, -2.0]);
    assert!(g.dq.data.iter().chain(&g.dk.data).all(|&x| x == 0.0));
    // d_o of the wrong shape, non-finite scale.
    let bad = host(vec![0.0; 6], &[1, 1, 3, 2]);
    let e = r::backward(&q, &k, &v, &bad, &p).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("d_o"),
        "{e}"
    );
    let p = AttentionParams {
        scale: Some(f32::INFINITY),
        ..Default::default()
    };
    assert!(r::backward(&q, &k, &v, &d_o, &p).is_err());
}

#[test]
fn backward_validation_checks_the_gradient_operand() {
    let (qs, other) = ([2, 3, 5, 64], [2, 3, 7, 64]);
    let q = operand("q", &qs, DType::F16);
    assert!(validate_grad_output("t", &q, &operand("d_o", &qs, DType::F16)).is_ok());
    let e = validate_grad_output("t", &q, &operand("d_o", &other, DType::F16)).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("d_o"),
        "{e}"
    );
    let e = validate_grad_output("t", &q, &operand("d_o", &qs, DType::BF16)).unwrap_err();
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
    let mut strided = operand("d_o", &qs, DType::F16);
    strided.contiguous = false;
    let e = validate_grad_output("t", &q, &strided).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { what: "d_o", .. }), "{e}");
}

#[test]
fn naive_backward_kernels_exist_for_every_dtype() {
    for dt in DType::ALL {
        for name in [
            kernel_name!("attention_naive_bwd_rows", dt),
            kernel_name!("attention_naive_bwd_keys", dt),
        ] {
            assert!(in_build(name, "sm_80") && in_build(name, "sm_90"), "{name}");
        }
    }
}

/// Whether kernel `name` is in the attention module of build `arch`.
fn in_build(name: &str, arch: &str) -> bool {
    let img = crate::modules::images(crate::Family::Attention);
    let build = if arch == "sm_90" { img.sm90 } else { img.sm80 };
    build.entries.contains(&name)
}

#[test]
fn scale_defaults_to_inverse_sqrt_head_dim_and_must_be_finite() {
    assert_eq!(scale("t", &AttentionParams::default(), 64).unwrap(), 0.125);
    let p = AttentionParams {
        scale: Some(f32::NAN),
        ..Default::default()
    };
    assert!(
        scale("t", &p, 64)
            .unwrap_err()
            .to_string()
            .contains("finite")
    );
}

#[test]
fn every_supported_head_dim_runs_on_the_narrowest_tile_that_holds_it() {
    let mut supported = 0;
    for dh in 0..=2 * FLASH_MAX_HEAD_DIM {
        assert_eq!(
            flash_head_dim_supported(dh),
            dh > 0 && dh % 8 == 0 && dh <= FLASH_MAX_HEAD_DIM,
            "{dh}"
        );
        if !flash_head_dim_supported(dh) {
            continue;
        }
        supported += 1;
        let tile = flash_tile_dim(dh);
        assert!(
            FLASH_TILE_DIMS.contains(&tile) && tile >= dh,
            "{dh} -> {tile}"
        );
        assert!(
            FLASH_TILE_DIMS.iter().all(|&t| t < dh || t >= tile),
            "{dh} -> {tile}: a narrower tile holds it"
        );
        // Every kernel lookup takes the tile: the warp-specialised forward and the wgmma backward
        // every one, the sm_80 build's forward and backward those up to FLASH_MAX_HEAD_DIM_SM80.
        assert!(flash_tma_config(tile).is_some());
        assert_eq!(
            flash_config(tile).is_some(),
            dh <= FLASH_MAX_HEAD_DIM_SM80,
            "{dh}"
        );
        for (arch, widest) in [
            ("sm_80", FLASH_MAX_HEAD_DIM_SM80),
            ("sm_90", FLASH_MAX_HEAD_DIM),
        ] {
            assert_eq!(
                flash_bwd_kernels(dh, DType::F16, arch, BwdNeeds::Dense).is_some(),
                dh <= widest,
                "{dh} {arch}"
            );
        }
    }
    assert_eq!(supported, FLASH_MAX_HEAD_DIM / 8);
}

#[test]
fn flash_kernels_exist_for_every_supported_head_dim_and_dtype() {
    // The mma.sync kernel in the sm_80 build only (tiles up to FLASH_MAX_HEAD_DIM_SM80); the
    // wgmma kernels in the sm_90 build only.
    for d in FLASH_TILE_DIMS
        .into_iter()
        .filter(|&d| d <= FLASH_MAX_HEAD_DIM_SM80)
    {
        assert!(flash_config(d).is_some());
        for dt in [DType::F16, DType::BF16] {
            let name = flash_kernel(d, dt).unwrap();
            assert!(
                in_build(name, "sm_80") && !in_build(name, "sm_90"),
                "{name}"
            );
        }
    }
    // The warp-specialised forward at every product width (32, 96 and 192 on the tile above).
    for d in FLASH_PRODUCT_DIMS {
        for dt in [DType::F16, DType::BF16] {
            let name = format!("flash_tma_fwd_d{d}_{dt}");
            assert!(
                in_build(&name, "sm_90") && !in_build(&name, "sm_80"),
                "{name}"
            );
            let bound = crate::modules::launch_bounds(&name, "sm_90");
            let threads = flash_tma_config(flash_tile_dim(d)).unwrap().tma_threads();
            assert_eq!(bound, Some((threads as u32, 1)), "{name}");
        }
        assert_eq!(flash_product_dim(d), d);
        assert_eq!(flash_product_dim(d - 8), d);
    }
    // The sm_90 build's other kernels: the warp-specialised one's config at every tile (its
    // kernels are the product widths' above), the one-warpgroup one at D = 64; each with the
    // launch bound the host launches it with.
    assert!(
        FLASH_TILE_DIMS
            .iter()
            .all(|d| FLASH_PRODUCT_DIMS.contains(d))
    );
    for d in FLASH_TILE_DIMS {
        let tma = flash_tma_config(d).unwrap();
        assert_eq!(tma.head_dim, d);
        for dt in [DType::F16, DType::BF16] {
            let wg4 = flash_wgmma_kernel(4, d, dt);
            assert_eq!(wg4.is_some(), d == 64, "variant 4 at D {d}");
            if let Some((cfg, name)) = wg4 {
                assert!(
                    in_build(name, "sm_90") && !in_build(name, "sm_80"),
                    "{name}"
                );
                let bound = crate::modules::launch_bounds(name, "sm_90");
                assert_eq!(
                    bound,
                    Some((cfg.threads() as u32, cfg.min_blocks)),
                    "{name}"
                );
            }
        }
    }
    // wgmma exists only in the sm_90a PTX.
    let img = crate::modules::images(crate::Family::Attention);
    assert!(!img.sm80.ptx.contains("wgmma"));
    assert!(img.sm90.ptx.contains(".target sm_90a"));
    for dt in DType::ALL {
        let name = kernel_name!("attention_naive", dt);
        assert!(in_build(name, "sm_80") && in_build(name, "sm_90"), "{name}");
    }
}

#[test]
fn flash_backward_validation_checks_o_lse_and_the_gradient() {
    let (qs, ks) = ([2, 3, 5, 64], [2, 3, 7, 64]);
    let ls = [2, 3, 5];
    let d = dims("t", &qs, &ks, &ks).unwrap();
    let good = || {
        [
            operand("q", &qs, DType::F16),
            operand("o", &qs, DType::F16),
            operand("lse", &ls, DType::F32),
            operand("d_o", &qs, DType::F16),
        ]
    };
    assert!(validate_backward_operands("t", &d, &good()).is_ok());

    // O and dO: q's shape, dtype, contiguity, and 16-byte aligned.
    let mut ops = good();
    ops[1].shape = &ks;
    let e = validate_backward_operands("t", &d, &ops).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("o (the forward's output O)"),
        "{e}"
    );
    let mut ops = good();
    ops[3].dtype = DType::BF16;
    let e = validate_backward_operands("t", &d, &ops).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::BF16,
                ..
            }
        ) && e.to_string().contains("d_o"),
        "{e}"
    );
    // O and dO may have any strides the kernels take (here [B, S, H, D] memory), not others.
    let mut ops = good();
    ops[1].contiguous = false;
    ops[1].strides = &[960, 64, 192, 1];
    assert!(validate_backward_operands("t", &d, &ops).is_ok());
    ops[1].strides = &[960, 320, 1, 5];
    let e = validate_backward_operands("t", &d, &ops).unwrap_err();
    assert!(
        matches!(e, Error::Invalid { .. }) && e.to_string().contains("o: strides"),
        "{e}"
    );
    let mut ops = good();
    ops[3].aligned16 = false;
    let e = validate_backward_operands("t", &d, &ops).unwrap_err();
    assert!(
        matches!(e, Error::Invalid { .. }) && e.to_string().contains("d_o must start at a 16-byte"),
        "{e}"
    );

    // LSE: [batch, heads, seq_q], f32, contiguous.
    let wrong = [2, 3, 7];
    let mut ops = good();
    ops[2].shape = &wrong;
    let e = validate_backward_operands("t", &d, &ops)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lse") && e.contains("[2, 3, 5]") && e.contains("[2, 3, 7]"),
        "{e}"
    );
    let mut ops = good();
    ops[2].dtype = DType::F16;
    let e = validate_backward_operands("t", &d, &ops).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                got: DType::F16,
                ..
            }
        ) && e.to_string().contains("f32 for lse"),
        "{e}"
    );
    let mut ops = good();
    ops[2].contiguous = false;
    let e = validate_backward_operands("t", &d, &ops).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { what: "lse", .. }), "{e}");
}

#[test]
fn flash_backward_kernels_exist_in_both_builds_with_their_launch_bounds() {
    for d in FLASH_TILE_DIMS {
        // The sm_80 build's mma.sync kernel up to FLASH_MAX_HEAD_DIM_SM80; the wgmma kernel at
        // every tile; each with an f32-adding form.
        let cfg = gpu::params::attention::flash_bwd_config(d);
        assert_eq!(cfg.is_some(), d <= FLASH_MAX_HEAD_DIM_SM80, "{d}");
        let wg = gpu::params::attention::flash_wg_bwd_config(d).unwrap();
        assert_eq!(wg.head_dim, d);
        for dt in [DType::F16, DType::BF16] {
            if cfg.is_none() {
                assert!(flash_bwd_kernels(d, dt, "sm_80", BwdNeeds::Dense).is_none());
            }
            let archs: &[&str] = if cfg.is_some() {
                &["sm_80", "sm_90"]
            } else {
                &["sm_90"]
            };
            for &arch in archs {
                let k = flash_bwd_kernels(d, dt, arch, BwdNeeds::Dense).unwrap();
                assert!(in_build(k.main_add, arch), "{} {arch}", k.main_add);
                for name in [k.pre, k.main, k.convert] {
                    assert!(in_build(name, arch), "{name} {arch}");
                }
                let (bounds, block_k, smem) = if arch == "sm_90" {
                    assert!(k.main.starts_with("flash_wg_bwd_"), "{}", k.main);
                    ((wg.threads() as u32, 1), wg.block_k, wg.smem_bytes())
                } else {
                    let cfg = cfg.unwrap();
                    (
                        (cfg.threads() as u32, cfg.min_blocks),
                        cfg.block_k,
                        cfg.smem_bytes(),
                    )
                };
                assert_eq!(
                    crate::modules::launch_bounds(k.main, arch),
                    Some(bounds),
                    "{} {arch}",
                    k.main
                );
                assert_eq!(
                    (k.threads, k.block_k, k.smem_bytes as usize),
                    (bounds.0, block_k, smem)
                );
            }
        }
        // The wgmma kernels exist only in the sm_90 build.
        assert!(!in_build(&format!("flash_wg_bwd_d{d}_f16"), "sm_80"));
        // Packed batches: the wgmma kernels' packed forms (their own D = 64 config), sm_90 only.
        // A softcap or ALiBi: the scored kernels at every tile, on their own config (the head dim
        // split at 128 and 256), without an f32-adding form.
        // A packed batch with no window: the packed kernels at 64 and 128 (the general walk's
        // config, its column tests and window folded away), the general ones at 256.
        let walks = [
            (BwdNeeds::GeneralWalk, "flash_wg_bwd_general_"),
            (
                BwdNeeds::Packed,
                if d == 256 {
                    "flash_wg_bwd_general_"
                } else {
                    "flash_wg_bwd_packed_"
                },
            ),
            (BwdNeeds::Scores, "flash_wg_bwd_scored_"),
        ];
        for dt in [DType::F16, DType::BF16] {
            for (needs, prefix) in walks {
                let packed = gpu::params::attention::flash_wg_bwd_config_of(
                    d,
                    true,
                    needs == BwdNeeds::Scores,
                )
                .unwrap();
                assert_eq!(
                    packed.split_head,
                    d == 256 || (d == 128 && needs == BwdNeeds::Scores),
                    "{d} {needs:?}"
                );
                assert!(flash_bwd_kernels(d, dt, "sm_80", needs).is_none());
                let k = flash_bwd_kernels(d, dt, "sm_90", needs).unwrap();
                assert!(
                    k.main.starts_with(prefix) && in_build(k.main, "sm_90"),
                    "{k:?}"
                );
                if needs == BwdNeeds::Scores {
                    assert!(is_general(&k) && k.main_add.is_empty(), "{k:?}");
                } else {
                    assert!(
                        is_general(&k) && in_build(k.main_add, "sm_90"),
                        "{}",
                        k.main_add
                    );
                }
                assert_eq!(
                    crate::modules::launch_bounds(k.main, "sm_90"),
                    Some((packed.threads() as u32, 1)),
                    "{}",
                    k.main
                );
                assert_eq!(
                    (k.block_k, k.block_q, k.smem_bytes as usize),
                    (packed.block_k, packed.block_q, packed.smem_bytes())
                );
            }
        }
    }
    assert!(flash_bwd_kernels(64, DType::F32, "sm_90", BwdNeeds::Dense).is_none());
    // The member grid (grouped-query heads under the causal mask): the dense D = 128 kernels'
    // config, sm_90 only; none elsewhere.
    for dt in [DType::F16, DType::BF16] {
        let k = flash_bwd_kernels(128, dt, "sm_90", BwdNeeds::Dense).unwrap();
        assert_eq!(k.members, format!("flash_wg_bwd_members_d128_{dt}"));
        assert!(in_build(k.members, "sm_90") && !in_build(k.members, "sm_80"));
        assert_eq!(
            crate::modules::launch_bounds(k.members, "sm_90"),
            Some((k.threads, 1))
        );
        for (d, arch, needs) in [
            (64, "sm_90", BwdNeeds::Dense),
            (256, "sm_90", BwdNeeds::Dense),
            (96, "sm_90", BwdNeeds::Dense),
            (128, "sm_90", BwdNeeds::GeneralWalk),
            (128, "sm_90", BwdNeeds::Scores),
            (128, "sm_80", BwdNeeds::Dense),
        ] {
            let k = flash_bwd_kernels(d, dt, arch, needs).unwrap();
            assert!(k.members.is_empty(), "{k:?}");
        }
    }
    // Head dims 32, 96 and 192 on sm_90: dense kernels of their own on the tile above (products
    // over their columns), with no f32-adding form (`flash_backward_run` takes the general kernels
    // there); on sm_80 the tile's kernel (up to its largest head dim).
    for (d, tile) in [(32, 64), (96, 128), (192, 256)] {
        let cfg = gpu::params::attention::flash_wg_bwd_config(d).unwrap();
        assert_eq!((cfg.cols, cfg.head_dim), (d, tile));
        let sm80 = tile <= FLASH_MAX_HEAD_DIM_SM80;
        let k = flash_bwd_kernels(d, DType::F16, "sm_80", BwdNeeds::Dense);
        assert_eq!(
            k.map(|k| k.main.to_string()),
            sm80.then(|| format!("flash_bwd_d{tile}_f16"))
        );
        for dt in [DType::F16, DType::BF16] {
            let k = flash_bwd_kernels(d, dt, "sm_90", BwdNeeds::Dense).unwrap();
            assert_eq!(k.main, format!("flash_wg_bwd_d{d}_{dt}"));
            assert!(!is_general(&k) && k.main_add.is_empty() && in_build(k.main, "sm_90"));
            assert!(!in_build(k.main, "sm_80"));
            assert_eq!(
                crate::modules::launch_bounds(k.main, "sm_90"),
                Some((cfg.threads() as u32, 1))
            );
            assert_eq!(
                (k.block_k, k.block_q, k.smem_bytes as usize),
                (cfg.block_k, cfg.block_q, cfg.smem_bytes())
            );
            for needs in [BwdNeeds::GeneralWalk, BwdNeeds::DenseAdding] {
                let k = flash_bwd_kernels(d, dt, "sm_90", needs).unwrap();
                assert_eq!(k.main, format!("flash_wg_bwd_general_d{tile}_{dt}"));
                assert!(is_general(&k) && in_build(k.main_add, "sm_90"));
            }
            // The sm_80 build's adding kernel is its tile's.
            let k = flash_bwd_kernels(d, dt, "sm_80", BwdNeeds::DenseAdding);
            let want = sm80.then(|| format!("flash_bwd_add_d{tile}_{dt}"));
            assert_eq!(k.map(|k| k.main_add.to_string()), want);
        }
    }
    // Other head dims off the tiles: the narrowest tile that holds them; on sm_90 its general
    // kernels.
    for (d, tile) in [(8, 64), (40, 64), (72, 128), (88, 128), (120, 128)] {
        let k = flash_bwd_kernels(d, DType::F16, "sm_80", BwdNeeds::Dense).unwrap();
        assert_eq!(k.main, format!("flash_bwd_d{tile}_f16"));
        assert!(!is_general(&k));
        let k = flash_bwd_kernels(d, DType::BF16, "sm_90", BwdNeeds::Dense).unwrap();
        assert_eq!(k.main, format!("flash_wg_bwd_general_d{tile}_bf16"));
        assert_eq!(k.main_add, format!("flash_wg_bwd_general_add_d{tile}_bf16"));
        assert!(is_general(&k) && in_build(k.main, "sm_90") && in_build(k.main_add, "sm_90"));
    }
    for d in [136, 184, 200, 248] {
        assert!(flash_bwd_kernels(d, DType::F16, "sm_80", BwdNeeds::Dense).is_none());
        let k = flash_bwd_kernels(d, DType::F16, "sm_90", BwdNeeds::Dense).unwrap();
        assert_eq!(k.main, "flash_wg_bwd_general_d256_f16");
        assert_eq!(k.main_add, "flash_wg_bwd_general_add_d256_f16");
        assert!(is_general(&k) && in_build(k.main, "sm_90") && in_build(k.main_add, "sm_90"));
    }
    // A softcap or ALiBi off the tiles: the scored kernel of the narrowest tile that holds it.
    for (d, tile) in [(40, 64), (96, 128), (200, 256)] {
        let k = flash_bwd_kernels(d, DType::BF16, "sm_90", BwdNeeds::Scores).unwrap();
        assert_eq!(k.main, format!("flash_wg_bwd_scored_d{tile}_bf16"));
        assert!(is_general(&k) && k.main_add.is_empty());
    }
    for d in [0, 12, 100, 252, FLASH_MAX_HEAD_DIM + 8] {
        assert!(
            flash_bwd_kernels(d, DType::F16, "sm_90", BwdNeeds::Dense).is_none(),
            "{d}"
        );
    }
}

/// The CPU same-precision naive backward: f32 is the exact backward; in f16 each gradient is a
/// value of the dtype, close to (but not equal to) the exact one.
#[test]
fn naive_same_precision_backward_rounds_like_the_dtype() {
    let mut seed = 7u64;
    let mk = |seed: &mut u64, shape: &[usize], dtype| {
        let n = shape.iter().product();
        let v: Vec<f32> = values(seed, n).into_iter().map(|x| x as f32).collect();
        HostTensor::new(v, shape, dtype).unwrap()
    };
    for causal in [Causal::No, Causal::Yes] {
        let p = AttentionParams {
            causal,
            scale: None,
            ..Default::default()
        };
        for dtype in [DType::F32, DType::F16] {
            let q = mk(&mut seed, &[1, 2, 9, 8], dtype);
            let k = mk(&mut seed, &[1, 2, 6, 8], dtype);
            let v = mk(&mut seed, &[1, 2, 6, 8], dtype);
            let g = mk(&mut seed, &[1, 2, 9, 8], dtype);
            let both = r::backward_and_naive(&q, &k, &v, &g, &p).unwrap();
            let exact = r::backward(&q, &k, &v, &g, &p).unwrap();
            for (n, e, x) in [
                (&both.naive.dq, &both.exact.dq, &exact.dq),
                (&both.naive.dk, &both.exact.dk, &exact.dk),
                (&both.naive.dv, &both.exact.dv, &exact.dv),
            ] {
                assert_eq!(e.data, x.data);
                assert_eq!(n.dtype, dtype);
                let err = n
                    .data
                    .iter()
                    .zip(&e.data)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                if dtype == DType::F32 {
                    assert!(err < 1e-5, "{causal:?}: f32 naive differs by {err}");
                } else {
                    assert!(n.data.iter().all(|&x| DType::F16.round(x) == x));
                    assert!(err > 0.0 && err < 2e-2, "{causal:?}: f16 naive error {err}");
                }
            }
        }
    }
}

/// The dQ orders of the wgmma backward, simulated on the CPU for every CTA of a head: each CTA
/// walks exactly the query blocks that see its keys, once; each block's turns are 0..count, one
/// per CTA that meets it (so the counter reaches every turn: no CTA waits forever in a complete
/// grid); and the CTA a CTA waits for meets the block no later in its own walk (rotated: strictly
/// earlier once there are at least as many query blocks as key blocks), so CTAs that run in step
/// never wait, and in the ascending order CTA j waits only for CTAs below it.
#[test]
fn dq_orders_walk_every_visible_block_once_and_take_turns_in_step_order() {
    use gpu::params::attention::{
        DQ_ORDERED, DQ_ROTATED, DqWalk, dq_block_at, dq_late_release_fits, dq_turn_at,
    };
    let mut cases = 0;
    for (bq, bk) in [(64u32, 128u32), (128, 128)] {
        for sq in [1u32, 17, 64, 97, 128, 200, 1025, 2048, 4096] {
            for sk in [1u32, 17, 97, 128, 200, 1025, 2048, 8192] {
                for causal in [false, true] {
                    let w = DqWalk {
                        n_qblocks: sq.div_ceil(bq),
                        n_kblocks: sk.div_ceil(bk),
                        block_q: bq,
                        block_k: bk,
                        causal,
                        diag: sk as i32 - sq as i32,
                        band: Band {
                            left: i32::MAX,
                            right: if causal { 0 } else { i32::MAX },
                        },
                    };
                    // Which key blocks meet query block i, from the mask itself.
                    let meets = |i: u32, j: u32| {
                        !causal || {
                            let last_query = ((i + 1) * bq).min(sq) as i64 - 1;
                            (j * bk) as i64 <= last_query + w.diag as i64
                        }
                    };
                    for order in [DQ_ORDERED, DQ_ORDERED | DQ_ROTATED] {
                        // (turn, step, j) of every CTA meeting each block.
                        let mut at: Vec<Vec<(u32, u32, u32)>> = vec![vec![]; w.n_qblocks as usize];
                        for j in 0..w.n_kblocks {
                            let first = w.first_qblock(j);
                            let mut seen = vec![false; w.n_qblocks as usize];
                            for step in 0..w.n_qblocks - first {
                                let i = dq_block_at(&w, j, step, order);
                                assert!(
                                    !seen[i as usize],
                                    "{w:?} order {order}: j {j} walks {i} twice"
                                );
                                seen[i as usize] = true;
                                at[i as usize].push((dq_turn_at(&w, j, i, order), step, j));
                            }
                            for i in 0..w.n_qblocks {
                                assert_eq!(
                                    seen[i as usize],
                                    meets(i, j),
                                    "{w:?} order {order}: j {j}, block {i}"
                                );
                            }
                        }
                        for (i, mut v) in at.into_iter().enumerate() {
                            v.sort();
                            for (t, pair) in v.iter().enumerate() {
                                assert_eq!(
                                    pair.0, t as u32,
                                    "{w:?} order {order}: block {i} turns {v:?}"
                                );
                            }
                            for p in v.windows(2) {
                                let ((_, s0, j0), (_, s1, j1)) = (p[0], p[1]);
                                if order == DQ_ORDERED {
                                    assert!(j0 < j1 && s0 == s1, "{w:?}: block {i} {v:?}");
                                } else {
                                    assert!(s0 <= s1, "{w:?}: block {i} {v:?}");
                                    if dq_late_release_fits(&w) {
                                        assert!(s0 < s1, "{w:?}: block {i} {v:?}");
                                    }
                                    // Causal: a CTA waits for the next key block's only, which
                                    // the reversed grid starts before it.
                                    if causal {
                                        assert_eq!(j0, j1 + 1, "{w:?}: block {i} {v:?}");
                                    }
                                }
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, 2 * 9 * 8 * 2 * 2);
}

/// The ascending dQ order under sliding windows (the only order a window takes): each key block
/// walks exactly the query blocks whose rows meet its keys inside the band (block extents, so a
/// last block's padding rows and keys may add a walk whose entries the mask clears), once; each
/// block's turns are 0..count; and a CTA waits only for CTAs of lower key blocks.
#[test]
fn dq_ascending_order_under_windows_walks_every_block_in_the_band_once() {
    use gpu::params::attention::{DQ_ORDERED, DqWalk, dq_block_at, dq_turn_at};
    let mut cases = 0;
    for (bq, bk) in [(64u32, 128u32), (128, 128)] {
        for sq in [1u32, 97, 128, 1025, 2048] {
            for sk in [1u32, 97, 200, 1025, 4096] {
                for causal in [false, true] {
                    for left in [None, Some(0), Some(1), Some(63), Some(200), Some(1000)] {
                        for right in [None, Some(0), Some(5), Some(130)] {
                            let band = Band {
                                left: left.unwrap_or(i32::MAX),
                                right: if causal { 0 } else { right.unwrap_or(i32::MAX) },
                            };
                            let w = DqWalk {
                                n_qblocks: sq.div_ceil(bq),
                                n_kblocks: sk.div_ceil(bk),
                                block_q: bq,
                                block_k: bk,
                                causal,
                                diag: sk as i32 - sq as i32,
                                band,
                            };
                            // Key - query offsets of the two blocks against the band.
                            let meets = |i: u32, j: u32| {
                                let (q0, q1) = ((i * bq) as i64, ((i + 1) * bq) as i64 - 1);
                                let (k0, k1) = ((j * bk) as i64, ((j + 1) * bk) as i64 - 1);
                                let diag = w.diag as i64;
                                k0 - q1 <= diag + band.right as i64
                                    && k1 - q0 >= diag - band.left as i64
                            };
                            let mut at: Vec<Vec<(u32, u32)>> = vec![vec![]; w.n_qblocks as usize];
                            for j in 0..w.n_kblocks {
                                let steps = w.end_qblock(j).saturating_sub(w.first_qblock(j));
                                let mut seen = vec![false; w.n_qblocks as usize];
                                for step in 0..steps {
                                    let i = dq_block_at(&w, j, step, DQ_ORDERED);
                                    assert!(!seen[i as usize], "{w:?}: j {j} walks {i} twice");
                                    seen[i as usize] = true;
                                    at[i as usize].push((dq_turn_at(&w, j, i, DQ_ORDERED), j));
                                }
                                for i in 0..w.n_qblocks {
                                    assert_eq!(
                                        seen[i as usize],
                                        meets(i, j),
                                        "{w:?}: j {j}, block {i}"
                                    );
                                }
                            }
                            for (i, mut v) in at.into_iter().enumerate() {
                                v.sort();
                                for (t, &(turn, _)) in v.iter().enumerate() {
                                    assert_eq!(turn, t as u32, "{w:?}: block {i} turns {v:?}");
                                }
                                for p in v.windows(2) {
                                    assert!(p[0].1 < p[1].1, "{w:?}: block {i} {v:?}");
                                }
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 2 * 5 * 5 * 2 * 6 * 4);
}
