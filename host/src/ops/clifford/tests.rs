//! CPU tests of the Clifford references against independent oracles: a bitmask geometric product,
//! glam's quaternion product, dot and cross, associativity, reversion norms, and central finite
//! differences in f64 for every gradient.
use super::reference::{LayerParams, exact};
use super::{Algebra, GpMode, Normalize, fc_groups_in};
use exact::{Mix, Shape};

const ALGS: [Algebra; 2] = [Algebra::Cl2, Algebra::Cl3];

/// Seeded uniform values in [-1, 1) (splitmix64), enough for these tests without an RNG dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// Blade bit masks in the library's order (bit 0 = e1, bit 1 = e2, bit 2 = e3).
fn blade_masks(alg: Algebra) -> &'static [u32] {
    match alg {
        Algebra::Cl2 => &[0b00, 0b01, 0b10, 0b11],
        Algebra::Cl3 => &[0b000, 0b001, 0b010, 0b100, 0b011, 0b101, 0b110, 0b111],
    }
}

/// Sign of the product of two basis blades in a Euclidean metric: (-1)^(swaps to sort the factors).
fn blade_sign(a: u32, b: u32) -> f64 {
    let (mut a, mut swaps) = (a >> 1, 0);
    while a != 0 {
        swaps += (a & b).count_ones();
        a >>= 1;
    }
    if swaps % 2 == 0 { 1.0 } else { -1.0 }
}

/// The geometric product from first principles (basis-blade bit masks), the independent oracle.
fn bitmask_product(alg: Algebra, x: &[f64], y: &[f64]) -> Vec<f64> {
    let masks = blade_masks(alg);
    let mut o = vec![0.0; masks.len()];
    for (i, &a) in masks.iter().enumerate() {
        for (k, &b) in masks.iter().enumerate() {
            let j = masks.iter().position(|&m| m == a ^ b).unwrap();
            o[j] += blade_sign(a, b) * x[i] * y[k];
        }
    }
    o
}

/// The library's product (reference, no gate) of single multivectors with all weights 1.
fn unit_product(alg: Algebra, x: &[f64], y: &[f64]) -> Vec<f64> {
    let s = Shape { alg, b: 1, n: 1 };
    exact::sgp(s, x, y, &vec![1.0; alg.paths()])
}

fn assert_close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

#[test]
fn term_tables_are_the_geometric_product_with_the_spec_paths() {
    let mut rng = Rng(1);
    for alg in ALGS {
        let c = alg.components();
        // Every (i, k) blade pair appears exactly once, on the right output, with the right grades.
        let mut seen = vec![false; c * c];
        for t in alg.terms() {
            let (i, j, k) = (t.i as usize, t.j as usize, t.k as usize);
            assert!(!seen[i * c + k], "{alg:?}: pair ({i},{k}) twice");
            seen[i * c + k] = true;
            let g = alg.blade_grades();
            assert_eq!(
                alg.path_table()[t.p as usize],
                [g[i], g[j], g[k]],
                "{alg:?}: term {t:?} has the wrong path"
            );
            let masks = blade_masks(alg);
            assert_eq!(
                masks[j],
                masks[i] ^ masks[k],
                "{alg:?}: term {t:?} lands on the wrong blade"
            );
            assert_eq!(
                t.neg,
                blade_sign(masks[i], masks[k]) < 0.0,
                "{alg:?}: term {t:?} has the wrong sign"
            );
        }
        assert!(seen.iter().all(|&s| s), "{alg:?}: missing pairs");
        for _ in 0..20 {
            let (x, y) = (rng.vec(c), rng.vec(c));
            assert_close(
                "product",
                &unit_product(alg, &x, &y),
                &bitmask_product(alg, &x, &y),
                1e-14,
            );
        }
    }
}

/// The pair buffer's layout (`params::clifford::slot_layout`) is what the fc launchers assume: per
/// output grade one `(count * B, paths * N)` matrix starting at the grade's first slot, rows
/// (component, b), columns (path, n); and the kernels' index of (slot, b, n) covers the buffer
/// exactly once. The same holds for each phase of the forward and backward ([`Algebra::fc_phases`]): its
/// buffer is filled once, and its groups ([`FcGroup::within`]) read the right terms.
#[test]
fn fc_pair_layout_is_one_matrix_per_output_grade() {
    for alg in ALGS {
        let (slots, layout): (&[u8], &[[u32; 3]; 44]) = match alg {
            Algebra::Cl2 => (
                &gpu::params::clifford::SLOTS_2D,
                &gpu::params::clifford::SLOT_LAYOUT_2D,
            ),
            Algebra::Cl3 => (
                &gpu::params::clifford::SLOTS_3D,
                &gpu::params::clifford::SLOT_LAYOUT_3D,
            ),
        };
        let groups = alg.fc_groups();
        assert_eq!(
            groups.iter().map(|g| g.paths.len()).sum::<usize>(),
            alg.paths()
        );
        let (mut next, mut stacked) = (0, 0);
        for g in &groups {
            assert_eq!(g.slot, next, "{alg:?}: grades' matrices are consecutive");
            next += g.count * g.paths.len();
            // A grade's stacked weights follow the earlier grades' and hold its paths in order.
            assert_eq!(
                g.stacked, stacked,
                "{alg:?}: stacked weights are consecutive"
            );
            assert_eq!(
                alg.fc_path_order()[stacked..stacked + g.paths.len()],
                g.paths[..],
                "{alg:?}"
            );
            stacked += g.paths.len();
        }
        assert_eq!(next, alg.num_slots());
        let mut order = alg.fc_path_order();
        order.sort_unstable();
        assert_eq!(
            order,
            (0..alg.paths()).collect::<Vec<_>>(),
            "{alg:?}: a permutation"
        );
        for (t, &slot) in alg.terms().iter().zip(slots) {
            let g = &groups[alg.blade_grades()[t.j as usize] as usize];
            let path = g.paths.iter().position(|&p| p == t.p as usize).unwrap();
            let want = [
                (g.slot + (t.j as usize - g.j0) * g.paths.len()) as u32,
                path as u32,
                g.paths.len() as u32,
            ];
            assert_eq!(layout[slot as usize], want, "{alg:?} term {t:?}");
        }
        let (b, n) = (3u64, 5u64);
        let mut seen = vec![false; alg.num_slots() * (b * n) as usize];
        for (s, &[row_block, path, paths]) in layout.iter().enumerate().take(alg.num_slots()) {
            for bb in 0..b {
                for f in 0..n {
                    let at = row_block as u64 * b * n + (bb * paths as u64 + path as u64) * n + f;
                    assert!(
                        !seen[at as usize],
                        "{alg:?} slot {s}: index {at} taken twice"
                    );
                    seen[at as usize] = true;
                }
            }
        }
        assert!(seen.iter().all(|&x| x));
        // The forward's two phases: the split is a component boundary, no boundary leaves a
        // smaller larger phase, and the phases' groups cover every component's row blocks once.
        let [(lo0, split), (lo1, hi1)] = alg.fc_phases();
        assert_eq!((lo0, lo1, hi1), (0, split, alg.num_slots()), "{alg:?}");
        let boundaries: Vec<usize> = groups
            .iter()
            .flat_map(|g| (0..=g.count).map(move |j| g.slot + j * g.paths.len()))
            .filter(|&b| b > 0 && b < alg.num_slots())
            .collect();
        assert!(boundaries.contains(&split), "{alg:?}: split {split}");
        let larger = |b: usize| b.max(alg.num_slots() - b);
        assert!(
            boundaries.iter().all(|&b| larger(b) >= larger(split)),
            "{alg:?}: split {split}"
        );
        let mut covered = vec![0u32; alg.num_slots()];
        for range in alg.fc_phases() {
            for (i, g) in fc_groups_in(&groups, range) {
                assert_eq!(g.stacked, groups[i].stacked, "{alg:?}: group {i}");
                let whole = groups.iter().find(|w| w.stacked == g.stacked).unwrap();
                assert!(g.j0 >= whole.j0 && g.j0 + g.count <= whole.j0 + whole.count);
                assert_eq!(g.slot, whole.slot + (g.j0 - whole.j0) * g.paths.len());
                assert!(range.0 <= g.slot && g.slot + g.count * g.paths.len() <= range.1);
                for c in &mut covered[g.slot..g.slot + g.count * g.paths.len()] {
                    *c += 1;
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "{alg:?}: {covered:?}");
        // Each phase's buffer as `fc_pairs` writes it (the slots whose component starts in the
        // range, shifted down by `lo` row blocks) is filled once, and each phase group's operand
        // (rows (component, b), columns (path, n) from row block `slot - lo`) reads those writes.
        for (lo, hi) in [(0, split), (split, alg.num_slots())] {
            let mut written = vec![None; (hi - lo) * (b * n) as usize];
            for (s, &[row_block, path, paths]) in layout.iter().enumerate().take(alg.num_slots()) {
                if !(lo..hi).contains(&(row_block as usize)) {
                    continue;
                }
                for bb in 0..b {
                    for f in 0..n {
                        let at = (row_block as u64 - lo as u64) * b * n
                            + (bb * paths as u64 + path as u64) * n
                            + f;
                        assert!(
                            written[at as usize].is_none(),
                            "{alg:?} slot {s}: {at} twice"
                        );
                        written[at as usize] = Some((s, bb, f));
                    }
                }
            }
            assert!(
                written.iter().all(|w| w.is_some()),
                "{alg:?}: phase {lo}..{hi}"
            );
            for g in groups.iter().filter_map(|g| g.within((lo, hi))) {
                let pg = g.paths.len() as u64;
                for jj in 0..g.count as u64 {
                    for (pi, &p) in g.paths.iter().enumerate() {
                        for bb in 0..b {
                            for f in 0..n {
                                let at = (g.slot - lo) as u64 * b * n
                                    + (jj * b + bb) * pg * n
                                    + pi as u64 * n
                                    + f;
                                let (s, wb, wf) = written[at as usize].unwrap();
                                let t = alg
                                    .terms()
                                    .iter()
                                    .zip(slots)
                                    .find(|&(_, &sl)| sl as usize == s)
                                    .unwrap()
                                    .0;
                                assert_eq!(
                                    (t.j as usize, t.p as usize, wb, wf),
                                    (g.j0 + jj as usize, p, bb, f),
                                    "{alg:?} phase {lo}..{hi}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The even subalgebra of Cl(3,0) is the quaternions. Worked out with the blade products of this
/// library's basis: e23 e13 = e12, e13 e12 = e23, e12 e23 = e13, and each squares to -1, so
/// `i = e23, j = e13, k = e12` satisfies `ij = k, jk = i, ki = j, i^2 = j^2 = k^2 = -1`:
/// `a + b e12 + c e13 + d e23  <->  Quat::from_xyzw(d, c, b, a)` (x = i, y = j, z = k, w = scalar).
#[test]
fn even_subalgebra_of_cl3_is_glam_quaternion_product() {
    let to_quat =
        |m: &[f64]| glam::Quat::from_xyzw(m[6] as f32, m[5] as f32, m[4] as f32, m[0] as f32);
    let mut rng = Rng(2);
    for _ in 0..50 {
        let mut a = [0.0; 8];
        let mut b = [0.0; 8];
        for idx in [0, 4, 5, 6] {
            a[idx] = rng.next();
            b[idx] = rng.next();
        }
        let p = unit_product(Algebra::Cl3, &a, &b);
        for odd in [1, 2, 3, 7] {
            assert!(p[odd].abs() < 1e-15, "even * even has an odd part: {p:?}");
        }
        let want = to_quat(&a) * to_quat(&b);
        let got = to_quat(&p);
        for (g, w) in got.to_array().iter().zip(want.to_array()) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs glam {want:?}");
        }
    }
}

/// u v = u·v + u∧v; with e12, e13, e23 the wedge's components are (cross.z, -cross.y, cross.x).
#[test]
fn vector_product_is_glam_dot_plus_wedge() {
    let mut rng = Rng(3);
    for _ in 0..50 {
        let (u, v) = (rng.vec(3), rng.vec(3));
        let mv = |w: &[f64]| [0.0, w[0], w[1], w[2], 0.0, 0.0, 0.0, 0.0];
        let p = unit_product(Algebra::Cl3, &mv(&u), &mv(&v));
        let (gu, gv) = (
            glam::Vec3::new(u[0] as f32, u[1] as f32, u[2] as f32),
            glam::Vec3::new(v[0] as f32, v[1] as f32, v[2] as f32),
        );
        let (dot, cross) = (gu.dot(gv) as f64, gu.cross(gv));
        let want = [
            dot,
            0.0,
            0.0,
            0.0,
            cross.z as f64,
            -cross.y as f64,
            cross.x as f64,
            0.0,
        ];
        for (g, w) in p.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{p:?} vs {want:?}");
        }
        // 2D: u v = u·v + (u1 v2 - u2 v1) e12.
        let p2 = unit_product(
            Algebra::Cl2,
            &[0.0, u[0], u[1], 0.0],
            &[0.0, v[0], v[1], 0.0],
        );
        let want2 = [
            u[0] * v[0] + u[1] * v[1],
            0.0,
            0.0,
            u[0] * v[1] - u[1] * v[0],
        ];
        assert_close("2D vector product", &p2, &want2, 1e-14);
    }
}

#[test]
fn unweighted_product_is_associative() {
    let mut rng = Rng(4);
    for alg in ALGS {
        for _ in 0..50 {
            let (a, b, c) = (
                rng.vec(alg.components()),
                rng.vec(alg.components()),
                rng.vec(alg.components()),
            );
            let left = unit_product(alg, &unit_product(alg, &a, &b), &c);
            let right = unit_product(alg, &a, &unit_product(alg, &b, &c));
            assert_close(&format!("{alg:?} (ab)c vs a(bc)"), &left, &right, 1e-12);
        }
    }
}

/// Reversion flips grades 2 and 3; `a rev(a)` has scalar part |a|^2 for vectors and rotors, and a
/// unit rotor times its reverse is exactly 1.
#[test]
fn times_reverse_gives_squared_norm_for_vectors_and_rotors() {
    let mut rng = Rng(5);
    for alg in ALGS {
        let rev = |a: &[f64]| -> Vec<f64> {
            a.iter()
                .zip(alg.blade_grades())
                .map(|(v, &g)| if g >= 2 { -v } else { *v })
                .collect()
        };
        for _ in 0..30 {
            let mut v = vec![0.0; alg.components()];
            let mut r = vec![0.0; alg.components()];
            for (c, &g) in alg.blade_grades().iter().enumerate() {
                if g == 1 {
                    v[c] = rng.next();
                }
                if g % 2 == 0 {
                    r[c] = rng.next();
                }
            }
            for a in [&v, &r] {
                let p = unit_product(alg, a, &rev(a));
                let norm2: f64 = a.iter().map(|x| x * x).sum();
                assert!(
                    (p[0] - norm2).abs() < 1e-12,
                    "{alg:?}: scalar {} vs |a|^2 {norm2}",
                    p[0]
                );
            }
            // Rotor: exp of a bivector, normalised; R rev(R) = 1 in every component.
            let len = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            let unit: Vec<f64> = r.iter().map(|x| x / len).collect();
            let p = unit_product(alg, &unit, &rev(&unit));
            let mut one = vec![0.0; alg.components()];
            one[0] = 1.0;
            assert_close("R rev(R)", &p, &one, 1e-12);
        }
    }
}

/// Central differences of `loss(params) = sum(go * f(params))` against an analytic gradient.
fn check_fd(what: &str, analytic: &[f64], params: &[f64], loss: impl Fn(&[f64]) -> f64) {
    let h = 1e-6;
    let scale = analytic.iter().fold(1e-3f64, |m, g| m.max(g.abs()));
    for i in 0..params.len() {
        let (mut p, mut m) = (params.to_vec(), params.to_vec());
        p[i] += h;
        m[i] -= h;
        let fd = (loss(&p) - loss(&m)) / (2.0 * h);
        assert!(
            (fd - analytic[i]).abs() <= 1e-6 * scale + 1e-7 * fd.abs(),
            "{what}[{i}]: analytic {} vs fd {fd}",
            analytic[i]
        );
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn fused_gradients_match_finite_differences() {
    let mut rng = Rng(6);
    for alg in ALGS {
        for normalize in [false, true] {
            for mix in [Mix::PerFeature, Mix::FullyConnected { out_features: 3 }] {
                let s = Shape { alg, b: 3, n: 4 };
                let (m, wlen) = match mix {
                    Mix::PerFeature => (s.n, s.n * alg.paths()),
                    Mix::FullyConnected { out_features } => {
                        (out_features, alg.paths() * s.n * out_features)
                    }
                };
                let (x, y, w) = (rng.vec(s.len()), rng.vec(s.len()), rng.vec(wlen));
                let go = rng.vec(alg.components() * s.b * m);
                let (out, r) = exact::fused(s, mix, &x, &y, &w, normalize);
                let (gx, gy, gw) = exact::fused_bwd(s, mix, &x, &y, &w, &out, r.as_deref(), &go);
                let case = format!("{alg:?} {mix:?} normalize={normalize}");
                check_fd(&format!("{case} grad_x"), &gx, &x, |v| {
                    dot(&go, &exact::fused(s, mix, v, &y, &w, normalize).0)
                });
                check_fd(&format!("{case} grad_y"), &gy, &y, |v| {
                    dot(&go, &exact::fused(s, mix, &x, v, &w, normalize).0)
                });
                check_fd(&format!("{case} grad_w"), &gw, &w, |v| {
                    dot(&go, &exact::fused(s, mix, &x, &y, v, normalize).0)
                });
            }
        }
    }
}

#[test]
fn layer_gradients_match_finite_differences() {
    let to64 = |t: &crate::HostTensor| t.data.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let mut rng = Rng(7);
    for alg in ALGS {
        for mode in [GpMode::PerFeature, GpMode::FullyConnected] {
            for normalize in [Normalize::No, Normalize::Yes] {
                let (b, n) = (2, 3);
                let s = Shape { alg, b, n };
                let p = LayerParams::init(alg, n, mode, normalize, 11).unwrap();
                let (lw, gw) = (to64(&p.linear_weight), to64(&p.gp_weight));
                let bias = rng.vec(n); // non-zero, so the bias path is exercised
                let x = rng.vec(s.len());
                let go = rng.vec(s.len());
                let mix = match mode {
                    GpMode::PerFeature => Mix::PerFeature,
                    GpMode::FullyConnected => Mix::FullyConnected { out_features: n },
                };
                let nz = normalize == Normalize::Yes;
                // Analytic, through the public host-tensor path.
                let mut params = p.clone();
                params.linear_bias = crate::HostTensor::new(
                    bias.iter().map(|&v| v as f32).collect(),
                    &[n],
                    crate::DType::F32,
                )
                .unwrap();
                let xt = crate::HostTensor::new(
                    x.iter().map(|&v| v as f32).collect(),
                    &[alg.components(), b, n],
                    crate::DType::F32,
                )
                .unwrap();
                let x = to64(&xt); // what the layer actually sees
                let bias = to64(&params.linear_bias);
                let fwd = params.forward(&xt).unwrap();
                let got = crate::HostTensor::new(
                    go.iter().map(|&v| v as f32).collect(),
                    &xt.shape,
                    crate::DType::F32,
                )
                .unwrap();
                let go = to64(&got);
                let g = params.backward(&xt, &fwd, &got).unwrap();
                // The host path rounds to f32 at the end; compare with loose f32 tolerance, and the f64
                // core with tight tolerance below.
                let f = |x: &[f64], lw: &[f64], bias: &[f64], gw: &[f64]| {
                    let y = exact::linear(s, x, lw, bias);
                    dot(&go, &exact::fused(s, mix, x, &y, gw, nz).0)
                };
                let y = exact::linear(s, &x, &lw, &bias);
                let (out, r) = exact::fused(s, mix, &x, &y, &gw, nz);
                let (gx, gy, ggw) = exact::fused_bwd(s, mix, &x, &y, &gw, &out, r.as_deref(), &go);
                let (gx_lin, glw, gb) = exact::linear_bwd(s, &x, &lw, &gy);
                let gx: Vec<f64> = gx.iter().zip(&gx_lin).map(|(a, b)| a + b).collect();
                let case = format!("{alg:?} {mode:?} {normalize:?}");
                check_fd(&format!("{case} grad_x"), &gx, &x, |v| {
                    f(v, &lw, &bias, &gw)
                });
                check_fd(&format!("{case} grad_linear_weight"), &glw, &lw, |v| {
                    f(&x, v, &bias, &gw)
                });
                check_fd(&format!("{case} grad_bias"), &gb, &bias, |v| {
                    f(&x, &lw, v, &gw)
                });
                check_fd(&format!("{case} grad_gp_weight"), &ggw, &gw, |v| {
                    f(&x, &lw, &bias, v)
                });
                for (name, host, want) in [
                    ("grad_x", &g.grad_x, &gx),
                    ("grad_linear_weight", &g.grad_linear_weight, &glw),
                    ("grad_linear_bias", &g.grad_linear_bias, &gb),
                    ("grad_gp_weight", &g.grad_gp_weight, &ggw),
                ] {
                    assert_close(&format!("{case} host {name}"), &to64(host), want, 1e-5);
                }
            }
        }
    }
}

#[test]
fn norm_backward_spec_form_matches_finite_differences() {
    let mut rng = Rng(8);
    for alg in ALGS {
        let s = Shape { alg, b: 2, n: 5 };
        let (u, go) = (rng.vec(s.len()), rng.vec(s.len()));
        let (o, r) = exact::norm(s, &u);
        let gu = exact::norm_bwd(s, &go, &o, &r);
        check_fd(&format!("{alg:?} norm"), &gu, &u, |v| {
            dot(&go, &exact::norm(s, v).0)
        });
        // Normalised grades have mean square 1 - eps/r^2 over features.
        for g in 0..alg.grades() {
            for b in 0..s.b {
                let rg = r[g * s.b + b];
                assert!(rg > 0.0);
            }
        }
    }
}

#[test]
fn gate_is_exact_gelu_on_the_scalar_part() {
    let s = Shape {
        alg: Algebra::Cl2,
        b: 1,
        n: 1,
    };
    for t in [-3.0, -0.5, 0.0, 0.7, 2.5] {
        let g = exact::gate(s, &[t, 1.0, 2.0, 3.0]);
        let gelu = 0.5 * t * (1.0 + libm::erf(t / std::f64::consts::SQRT_2));
        assert!((g[0] - gelu).abs() < 1e-15);
        assert!((g[3] - 3.0 * exact::normal_cdf(t)).abs() < 1e-15);
    }
}

#[test]
fn layer_init_has_the_spec_scales() {
    for (alg, mode) in [
        (Algebra::Cl2, GpMode::PerFeature),
        (Algebra::Cl3, GpMode::FullyConnected),
    ] {
        let n = 64;
        let p = LayerParams::init(alg, n, mode, Normalize::Yes, 42).unwrap();
        let std = |t: &crate::HostTensor| {
            (t.data.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / t.numel() as f64).sqrt()
        };
        let d1 = alg.dims() as f64 + 1.0;
        let want_lin = match mode {
            GpMode::PerFeature => 1.0 / (n as f64 * d1).sqrt(),
            GpMode::FullyConnected => 1.0 / (n as f64).sqrt(),
        };
        assert!(
            (std(&p.linear_weight) / want_lin - 1.0).abs() < 0.05,
            "linear std {}",
            std(&p.linear_weight)
        );
        assert!(
            (std(&p.gp_weight) * d1.sqrt() - 1.0).abs() < 0.05,
            "gp std {}",
            std(&p.gp_weight)
        );
        assert!(p.linear_bias.data.iter().all(|&v| v == 0.0));
        assert_eq!(p.linear_weight.shape, vec![alg.grades(), n, n]);
    }
}

#[test]
fn weight_gradient_chunks_depend_on_batch_size_only() {
    use gpu::params::clifford::{chunks, rows_per_chunk};
    assert_eq!((rows_per_chunk(1), chunks(1)), (32, 1));
    assert_eq!((rows_per_chunk(0), chunks(0)), (32, 1));
    assert_eq!(chunks(4096), 128);
    let huge = 1u64 << 33;
    assert!(chunks(huge) <= gpu::params::matmul::MAX_GRID_YZ);
    assert!(chunks(huge) * rows_per_chunk(huge) >= huge);
}

#[test]
fn pair_terms_take_each_pair_of_components_once() {
    for alg in [Algebra::Cl2, Algebra::Cl3] {
        let c = alg.components();
        let by_j = alg.pair_terms();
        assert_eq!(by_j.len(), c, "{alg:?}");
        for (j, comp) in by_j.iter().enumerate() {
            let mut ys: Vec<usize> = comp.iter().map(|t| t.y).collect();
            ys.sort_unstable();
            assert_eq!(ys, (0..c).collect::<Vec<_>>(), "{alg:?} component {j}");
            for (i, t) in comp.iter().enumerate() {
                let listed = alg.terms().iter().any(|u| {
                    (
                        u.j as usize,
                        u.i as usize,
                        u.k as usize,
                        u.p as usize,
                        u.neg,
                    ) == (j, i, t.y, t.path, t.neg)
                });
                assert!(
                    listed,
                    "{alg:?} j {j} i {i}: {t:?} is not a term of the product"
                );
            }
        }
    }
}

/// The fc backward's pair-term gradient products split a group's paths only where its tf32 weight
/// parts outweigh the product's output (2D grade 1 at B1024 and 512 or more features), and only
/// into products that keep the GPU as full, taking the count whose parts and split-K workspace
/// hold the fewest bytes.
#[test]
fn pair_grad_products_split_paths_only_where_the_weights_outweigh_the_batch() {
    use super::pair_grad_paths_per_product as per;
    use crate::ops::matmul::Precision::{Ieee, Tf32, Tf32x3};
    // 2D grade 1 in one phase: 4 paths, one component's B rows. N1024: 2 + 2 paths, 128 tiles
    // each and unsplit, parts 16 MiB against 32 (one path a product would run as many CTAs, 64
    // tiles x 2 slices, but hold 8 MiB of parts and 8 of workspace). N512: 3 paths run 96 tiles,
    // 2 hold 4 MiB of parts and 8 of workspace, 1 runs 64 CTAs: one product.
    assert_eq!(per(4, 1024, (1024, 1024), Tf32x3), 2);
    assert_eq!(per(4, 1024, (512, 512), Tf32x3), 4);
    // Grades 0 and 2 (3 paths) at N1024: 2 + 1, parts of 2 paths (16 MiB) and then parts of 1
    // with a 2-slice workspace (8 + 8), against 24 MiB of parts; 1 a product holds as much with
    // three launches.
    assert_eq!(per(3, 1024, (1024, 1024), Tf32x3), 2);
    for (rows, n) in [
        (1024, 128),
        (4096, 512),
        (8192, 512),
        (4096, 1024),
        (8192, 1024),
    ] {
        assert_eq!(per(4, rows, (n, n), Tf32x3), 4, "B{rows} N{n}");
    }
    // Empty products (an empty batch, no features): one, nothing to size.
    assert_eq!(per(4, 0, (512, 512), Tf32x3), 4);
    assert_eq!(per(4, 1024, (0, 512), Tf32x3), 4);
    assert_eq!(per(4, 1024, (512, 0), Tf32x3), 4);
    assert_eq!(per(0, 1024, (1024, 1024), Tf32x3), 0);
    // No split pass, no parts: one product.
    assert_eq!(per(4, 16, (1024, 1024), Ieee), 4);
    // Always within 1..=paths.
    for paths in 1..=6 {
        for (rows, n, m) in [
            (0, 8, 8),
            (1, 8, 8),
            (40, 100, 126),
            (700, 36, 12),
            (1024, 1024, 8),
            (64, 8, 0),
        ] {
            for p in [Tf32x3, Tf32] {
                let c = per(paths, rows, (n, m), p);
                assert!((1..=paths).contains(&c), "{paths} {rows} {n} {m}: {c}");
            }
        }
    }
}
