//! Decoding attention (`attention::decode_forward`) against the f64 reference of
//! `attention::model_features`: dense and paged caches, grouped-query heads, one and several query
//! rows (causal, bottom-right aligned per sequence), sliding windows (one side and both), sequences
//! of unequal length (an empty one included), keys split over CTAs and merged, the softcap and
//! ALiBi slopes (`[heads]` and one row a sequence), head dims 40 to 256 on and off the 64, 128
//! and 256 tiles. Poisoned
//! outputs, fresh random inputs (the seed is printed). The rule: `max |out - ref| <= ulp(dtype) (1 + max |ref|)` for O (one rounding of O, f32
//! arithmetic inside), `1e-3 (1 + |ref|)` for the LSE, and rows that see no key exactly O = 0,
//! LSE = -inf.
mod common;

use common::{attention_params, gpu_or_skip, read, rng, uniform};
use host::ops::attention::{
    AttentionParams, KvCache, Window, decode_forward, model_features as mf,
};
use host::{DType, HostTensor, Tensor};
use rand::Rng;

fn ulp(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.0 / 1024.0,
        DType::BF16 => 1.0 / 128.0,
        DType::F32 => 1.2e-7,
    }
}

/// Checks sequence `b`'s rows of the decode outputs (`o` `[B, Hq, Sq, D]`, `lse` `[B, Hq, Sq]`, read
/// back) against the reference for that sequence alone: its Q rows against its first `len` keys.
fn check_sequence(
    what: &str,
    (o, lse): (&[f32], &[f32]),
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    (b, len, p): (usize, usize, &AttentionParams),
    dtype: DType,
) {
    check_scored_sequence(what, (o, lse), (q, k, v), (b, len, p, None), dtype);
}

/// [`check_sequence`] with this sequence's ALiBi slopes (one a query head; the reference takes
/// `p`'s softcap and window, not its slopes tensor).
fn check_scored_sequence(
    what: &str,
    (o, lse): (&[f32], &[f32]),
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    (b, len, p, slopes): (usize, usize, &AttentionParams, Option<Vec<f32>>),
    dtype: DType,
) {
    let (hq, sq, d) = (q.shape[1], q.shape[2], q.shape[3]);
    let features = mf::ModelFeatures {
        window_left: p.window.left,
        window_right: p.window.right,
        softcap: p.softcap,
        alibi_slopes: slopes,
    };
    let p = &AttentionParams {
        alibi_slopes: None,
        ..*p
    };
    let (o_ref, lse_ref) = mf::forward(
        &take(q, b, sq),
        &take(k, b, len),
        &take(v, b, len),
        p,
        &features,
    )
    .unwrap();
    let scale_o = o_ref
        .data
        .iter()
        .fold(0f64, |m, &x| m.max((x as f64).abs()));
    let tol = ulp(dtype) * (1.0 + scale_o);
    for h in 0..hq {
        for i in 0..sq {
            let row = (b * hq + h) * sq + i;
            let rrow = h * sq + i;
            let (want_l, got_l) = (lse_ref.data[rrow], lse[row]);
            if want_l == f32::NEG_INFINITY {
                assert_eq!(
                    got_l,
                    f32::NEG_INFINITY,
                    "{what}: seq {b} head {h} row {i} LSE"
                );
                assert!(
                    o[row * d..(row + 1) * d].iter().all(|&x| x == 0.0),
                    "{what}: seq {b} head {h} row {i}: a row with no key must be 0"
                );
                continue;
            }
            assert!(
                (got_l as f64 - want_l as f64).abs() <= 1e-3 * (1.0 + (want_l as f64).abs()),
                "{what}: seq {b} head {h} row {i} LSE {got_l} vs {want_l}"
            );
            for c in 0..d {
                let (g, w) = (o[row * d + c] as f64, o_ref.data[rrow * d + c] as f64);
                assert!(
                    (g - w).abs() <= tol,
                    "{what}: seq {b} head {h} row {i} col {c}: {g} vs {w} (tol {tol:.2e})"
                );
            }
        }
    }
}

/// Sequence `b` of a `[B, H, S, D]` host tensor, its first `len` positions, as `[1, H, len, D]`.
fn take(x: &HostTensor, b: usize, len: usize) -> HostTensor {
    let [_, h, s, d] = *x.shape.as_slice() else {
        panic!("rank 4")
    };
    let mut out = Vec::with_capacity(h * len * d);
    for hh in 0..h {
        let at = ((b * h + hh) * s) * d;
        out.extend_from_slice(&x.data[at..at + len * d]);
    }
    HostTensor::new(out, &[1, h, len, d], x.dtype).unwrap()
}

#[test]
fn a_dense_cache_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("a_dense_cache_matches_the_reference") else {
        return;
    };
    let mut r = rng("decode dense");
    // (B, Hq, Hkv, Sq, Sk, D): one row against long keys (several splits), GQA groups of 4 and 8,
    // MQA, several query rows (two passes of the kernel's four rows), odd lengths.
    let cases = [
        (3, 8, 2, 1, 1000, 128),
        (2, 32, 8, 1, 4099, 128),
        (1, 8, 1, 3, 777, 64),
        (2, 3, 3, 5, 37, 64),
        (1, 4, 2, 7, 5, 128),
    ];
    for dtype in [DType::F16, DType::BF16] {
        for &(b, hq, hkv, sq, sk, d) in &cases {
            for causal in [false, true] {
                let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
                let k = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
                let v = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
                let up = |x: &HostTensor| Tensor::from_host(&gpu, x).unwrap();
                let (kd, vd) = (up(&k), up(&v));
                let (o, lse) = decode_forward(
                    &up(&q),
                    KvCache::Dense { k: &kd, v: &vd },
                    &attention_params(causal),
                )
                .unwrap();
                let (o, lse) = (read(&o), read(&lse));
                let what =
                    format!("{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} causal {causal}");
                for bi in 0..b {
                    check_sequence(
                        &what,
                        (&o, &lse),
                        (&q, &k, &v),
                        (bi, sk, &attention_params(causal)),
                        dtype,
                    );
                }
                println!("{what}: ok");
            }
        }
    }
}

/// Scatters dense `[B, Hkv, S, D]` keys into a `[pages, page, Hkv, D]` cache through a shuffled
/// block table (a spare page left NaN: a read of a page the table does not name shows).
fn paged(
    dense: &HostTensor,
    lens: &[usize],
    page: usize,
    max_pages: usize,
    order: &[usize],
) -> (HostTensor, Vec<u32>) {
    let [b, hkv, s, d] = *dense.shape.as_slice() else {
        panic!("rank 4")
    };
    let pages = order.len();
    let mut cache = vec![f32::NAN; pages * page * hkv * d];
    let mut table = vec![0u32; b * max_pages];
    let mut next = 0;
    for (bi, &len) in lens.iter().enumerate() {
        for pg in 0..len.div_ceil(page) {
            let p = order[next];
            next += 1;
            table[bi * max_pages + pg] = p as u32;
            for slot in 0..page.min(len - pg * page) {
                let j = pg * page + slot;
                for h in 0..hkv {
                    let src = ((bi * hkv + h) * s + j) * d;
                    let dst = ((p * page + slot) * hkv + h) * d;
                    cache[dst..dst + d].copy_from_slice(&dense.data[src..src + d]);
                }
            }
        }
        // Unused table entries are never read (nor validated): out of range on purpose.
        for pg in len.div_ceil(page)..max_pages {
            table[bi * max_pages + pg] = u32::MAX;
        }
    }
    (
        HostTensor::new(cache, &[pages, page, hkv, d], dense.dtype).unwrap(),
        table,
    )
}

/// `decode_forward` of `q` against dense `[B, Hkv, S, D]` keys and values scattered into a paged
/// cache (pages of `page` keys, in reverse order), sequence `b` holding its first `lens[b]` keys.
fn decode_paged(
    gpu: &host::Gpu,
    [q, k, v]: [&HostTensor; 3],
    lens: &[usize],
    page: usize,
    p: &AttentionParams,
) -> (Tensor, Tensor) {
    let max_pages = lens.iter().max().unwrap().div_ceil(page);
    let needed: usize = lens.iter().map(|l| l.div_ceil(page)).sum();
    let order: Vec<usize> = (0..needed).rev().collect();
    let (kc, table) = paged(k, lens, page, max_pages, &order);
    let (vc, _) = paged(v, lens, page, max_pages, &order);
    let up = |x: &HostTensor| Tensor::from_host(gpu, x).unwrap();
    let (kd, vd) = (up(&kc), up(&vc));
    let seq_lens: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    let cache = KvCache::Paged {
        k: &kd,
        v: &vd,
        block_table: &table,
        max_pages,
        seq_lens: &seq_lens,
    };
    decode_forward(&up(q), cache, p).unwrap()
}

#[test]
fn a_paged_cache_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("a_paged_cache_matches_the_reference") else {
        return;
    };
    let mut r = rng("decode paged");
    let (hq, hkv, d, page) = (32, 8, 128, 16);
    let lens = [1usize, 50, 333, 0, 1031];
    let (b, s) = (lens.len(), *lens.iter().max().unwrap());
    let max_pages = s.div_ceil(page) + 1;
    for dtype in [DType::F16, DType::BF16] {
        for (sq, causal) in [(1, false), (1, true), (4, true)] {
            let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
            let k = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let v = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let needed: usize = lens.iter().map(|l| l.div_ceil(page)).sum();
            let mut order: Vec<usize> = (0..needed + 1).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, r.random_range(0..=i));
            }
            let (kc, table) = paged(&k, &lens, page, max_pages, &order);
            let (vc, _) = paged(&v, &lens, page, max_pages, &order);
            let up = |x: &HostTensor| Tensor::from_host(&gpu, x).unwrap();
            let (kd, vd) = (up(&kc), up(&vc));
            let seq_lens: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
            let (o, lse) = decode_forward(
                &up(&q),
                KvCache::Paged {
                    k: &kd,
                    v: &vd,
                    block_table: &table,
                    max_pages,
                    seq_lens: &seq_lens,
                },
                &attention_params(causal),
            )
            .unwrap();
            let (o, lse) = (read(&o), read(&lse));
            let what = format!("paged {dtype} Sq{sq} causal {causal}");
            for (bi, &len) in lens.iter().enumerate() {
                check_sequence(
                    &what,
                    (&o, &lse),
                    (&q, &k, &v),
                    (bi, len, &attention_params(causal)),
                    dtype,
                );
            }
            println!("{what}: ok");
        }
    }
}

/// Sliding windows: the splits cover each sequence's keys from its first row's first visible one
/// (per sequence: unequal lengths of a paged cache, and a dense cache longer than the window).
#[test]
fn windowed_decoding_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("windowed_decoding_matches_the_reference") else {
        return;
    };
    let mut r = rng("decode windows");
    let (hq, hkv, d, page) = (8, 2, 128, 16);
    let windows = [
        (1, Some(100), None, true),
        (4, Some(7), Some(3), false),
        (4, Some(300), Some(0), false),
        (1, Some(0), None, true),
        (3, None, Some(2), false),
    ];
    for dtype in [DType::F16, DType::BF16] {
        for (sq, left, right, causal) in windows {
            let p = AttentionParams {
                window: Window { left, right },
                ..attention_params(causal)
            };
            let what = format!("{dtype} Sq{sq} window ({left:?}, {right:?}) causal {causal}");
            // Dense: two sequences of 5000 keys.
            let (b, s) = (2, 5000);
            let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
            let k = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let v = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let up = |x: &HostTensor| Tensor::from_host(&gpu, x).unwrap();
            let (kd, vd) = (up(&k), up(&v));
            let (o, lse) = decode_forward(&up(&q), KvCache::Dense { k: &kd, v: &vd }, &p).unwrap();
            let (o, lse) = (read(&o), read(&lse));
            for bi in 0..b {
                check_sequence(
                    &format!("dense {what}"),
                    (&o, &lse),
                    (&q, &k, &v),
                    (bi, s, &p),
                    dtype,
                );
            }
            // Paged: unequal lengths, an empty one included.
            let lens = [1usize, 50, 333, 0, 1031];
            let (b, s) = (lens.len(), *lens.iter().max().unwrap());
            let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
            let k = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let v = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let (o, lse) = decode_paged(&gpu, [&q, &k, &v], &lens, page, &p);
            let (o, lse) = (read(&o), read(&lse));
            for (bi, &len) in lens.iter().enumerate() {
                check_sequence(
                    &format!("paged {what}"),
                    (&o, &lse),
                    (&q, &k, &v),
                    (bi, len, &p),
                    dtype,
                );
            }
            println!("{what}: ok");
        }
    }
}

#[test]
fn bad_caches_are_named_errors() {
    let Some(gpu) = gpu_or_skip("bad_caches_are_named_errors") else {
        return;
    };
    let t = |shape: &[usize]| Tensor::empty(&gpu, shape, DType::F16).unwrap();
    let q = t(&[2, 6, 1, 128]);
    let p = attention_params(false);
    let err = |kv: KvCache<'_>| decode_forward(&q, kv, &p).unwrap_err().to_string();
    let k4 = t(&[2, 4, 10, 128]);
    assert!(
        err(KvCache::Dense { k: &k4, v: &k4 }).contains("Hkv"),
        "GQA"
    );
    let k64 = t(&[2, 2, 10, 64]);
    assert!(
        err(KvCache::Dense { k: &k64, v: &k64 }).contains("128"),
        "head dim"
    );
    let cache = t(&[3, 16, 2, 128]);
    let e = err(KvCache::Paged {
        k: &cache,
        v: &cache,
        block_table: &[0, 1, 2, 7],
        max_pages: 2,
        seq_lens: &[20, 30],
    });
    assert!(e.contains("page 7"), "{e}");
    let e = err(KvCache::Paged {
        k: &cache,
        v: &cache,
        block_table: &[0, 1, 2, 0],
        max_pages: 2,
        seq_lens: &[20, 40],
    });
    assert!(e.contains("40 keys"), "{e}");
    for d in [100, 264] {
        let qd = t(&[2, 6, 1, d]);
        let kd = t(&[2, 2, 10, d]);
        let e = decode_forward(&qd, KvCache::Dense { k: &kd, v: &kd }, &p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("head_dim {d}")) && e.contains("256"),
            "{e}"
        );
    }
    let k2 = t(&[2, 2, 10, 128]);
    let dense = || KvCache::Dense { k: &k2, v: &k2 };
    let capped = AttentionParams {
        softcap: Some(-1.0),
        ..attention_params(true)
    };
    let e = decode_forward(&q, dense(), &capped)
        .unwrap_err()
        .to_string();
    assert!(e.contains("softcap must be finite and positive"), "{e}");
    let slopes = Tensor::zeros(&gpu, &[5], DType::F32).unwrap();
    let sloped = AttentionParams {
        alibi_slopes: Some(&slopes),
        ..attention_params(true)
    };
    let e = decode_forward(&q, dense(), &sloped)
        .unwrap_err()
        .to_string();
    assert!(e.contains("alibi_slopes must be [heads] = [6]"), "{e}");
}

/// The scored kernels (a softcap, ALiBi slopes, both) and head dims off the tiles, dense and
/// paged, against the f64 reference per sequence.
#[test]
fn scores_and_narrow_head_dims_match_the_reference() {
    let Some(gpu) = gpu_or_skip("scores_and_narrow_head_dims_match_the_reference") else {
        return;
    };
    let mut r = rng("decode scores");
    // (Hq, Hkv, Sq, sequence lengths (equal: a dense cache), D, softcap, slopes (None, or one row
    // a sequence), window left, causal)
    type Case = (
        usize,
        usize,
        usize,
        &'static [usize],
        usize,
        Option<f32>,
        Option<bool>,
        Option<usize>,
        bool,
    );
    #[rustfmt::skip]
    let cases: [Case; 11] = [
        (32, 8, 1, &[4099, 4099], 128, Some(50.0), None, None, true),
        (8, 2, 4, &[1, 50, 333, 0, 1031], 128, None, Some(true), None, true),
        (4, 4, 3, &[777], 64, Some(5.0), Some(false), Some(100), false),
        (8, 2, 1, &[17, 2000, 640], 96, None, None, None, true),
        (6, 3, 5, &[300, 300, 300], 40, Some(20.0), Some(false), None, true),
        (4, 1, 2, &[2000, 2000], 80, None, None, None, false),
        (16, 4, 1, &[5000, 129], 120, Some(30.0), Some(true), Some(1000), true),
        // The 256 tile (16-lane groups): Gemma-2's head dim, cap and local window, plain, and
        // head dims off it.
        (16, 8, 1, &[4099, 4099], 256, Some(50.0), None, Some(4096), true),
        (4, 2, 6, &[3000, 77, 0, 1024], 256, None, None, None, true),
        (8, 8, 1, &[700, 700], 200, None, Some(false), None, false),
        (6, 2, 3, &[1500, 31, 900], 136, Some(10.0), Some(true), None, true),
    ];
    let page = 16;
    for dtype in [DType::F16, DType::BF16] {
        for (hq, hkv, sq, lens, d, cap, per_seq, left, causal) in cases {
            let (b, s) = (lens.len(), *lens.iter().max().unwrap());
            let dense = lens.iter().all(|&l| l == s);
            let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
            let k = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            let v = uniform(&mut r, &[b, hkv, s, d], -1.0, 1.0, dtype);
            // ALiBi's geometric slopes, each scaled by a random factor in [0.5, 2).
            let rows = if per_seq == Some(true) { b } else { 1 };
            let slope_rows: Vec<f32> = (0..rows * hq)
                .map(|i| {
                    2f32.powf(-8.0 * ((i % hq) + 1) as f32 / hq as f32) * r.random_range(0.5..2.0)
                })
                .collect();
            let shape: &[usize] = if rows == b { &[b, hq] } else { &[hq] };
            let slopes = Tensor::from_f32(&gpu, &slope_rows, shape, DType::F32).unwrap();
            let p = AttentionParams {
                softcap: cap,
                alibi_slopes: per_seq.map(|_| &slopes),
                window: Window { left, right: None },
                ..attention_params(causal)
            };
            let up = |x: &HostTensor| Tensor::from_host(&gpu, x).unwrap();
            let (o, lse) = if dense {
                let (kd, vd) = (up(&k), up(&v));
                decode_forward(&up(&q), KvCache::Dense { k: &kd, v: &vd }, &p).unwrap()
            } else {
                decode_paged(&gpu, [&q, &k, &v], lens, page, &p)
            };
            let (o, lse) = (read(&o), read(&lse));
            let what = format!(
                "{dtype} Hq{hq} Hkv{hkv} Sq{sq} lens {lens:?} D{d} cap {cap:?} slopes per sequence \
                 {per_seq:?} window left {left:?} causal {causal}"
            );
            for (bi, &len) in lens.iter().enumerate() {
                let row = if rows == b { bi } else { 0 };
                let seq_slopes = per_seq.map(|_| slope_rows[row * hq..(row + 1) * hq].to_vec());
                check_scored_sequence(
                    &what,
                    (&o, &lse),
                    (&q, &k, &v),
                    (bi, len, &p, seq_slopes),
                    dtype,
                );
            }
            println!("{what}: ok");
        }
    }
}
