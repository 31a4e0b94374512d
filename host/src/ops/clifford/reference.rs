//! CPU references in f64 for every Clifford op, with the GPU functions' signatures on [`HostTensor`]s,
//! and the f64 building blocks themselves in [`exact`] (finite-difference tests run on those).
//!
//! The fully connected product is computed here straight from the term table (`o_j[b,m] = sum over
//! terms (j, i, k, p) of ±sum_n x~_i y~_k [b,n] W_p[n,m]`), not through the GPU's pair-slot layout.
use super::{Algebra, GpMode, Normalize};
use crate::DType;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// f64 building blocks on `(C, B, N)` row-major buffers.
pub mod exact {
    use super::super::Algebra;
    use gpu::params::clifford::NORM_EPS;

    /// Sizes: algebra, batch rows B, features N.
    #[derive(Clone, Copy, Debug)]
    pub struct Shape {
        pub alg: Algebra,
        pub b: usize,
        pub n: usize,
    }
    impl Shape {
        pub fn len(&self) -> usize {
            self.alg.components() * self.b * self.n
        }
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
        fn at(&self, c: usize, b: usize, n: usize) -> usize {
            (c * self.b + b) * self.n + n
        }
        fn with_n(&self, n: usize) -> Shape {
            Shape { n, ..*self }
        }
    }

    fn sign(neg: bool) -> f64 {
        if neg { -1.0 } else { 1.0 }
    }

    /// Standard normal CDF and density.
    pub fn normal_cdf(t: f64) -> f64 {
        0.5 * libm::erfc(-t / std::f64::consts::SQRT_2)
    }
    pub fn normal_pdf(t: f64) -> f64 {
        (-0.5 * t * t).exp() / (2.0 * std::f64::consts::PI).sqrt()
    }

    /// MV-GELU gate: every component times `Phi(x0)`.
    pub fn gate(s: Shape, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; s.len()];
        for b in 0..s.b {
            for n in 0..s.n {
                let g = normal_cdf(x[s.at(0, b, n)]);
                for c in 0..s.alg.components() {
                    out[s.at(c, b, n)] = x[s.at(c, b, n)] * g;
                }
            }
        }
        out
    }

    /// Gate backward.
    pub fn gate_bwd(s: Shape, x: &[f64], gt: &[f64]) -> Vec<f64> {
        let mut gx = vec![0.0; s.len()];
        for b in 0..s.b {
            for n in 0..s.n {
                let x0 = x[s.at(0, b, n)];
                let (cdf, pdf) = (normal_cdf(x0), normal_pdf(x0));
                let mut dot = 0.0;
                for c in 1..s.alg.components() {
                    dot += x[s.at(c, b, n)] * gt[s.at(c, b, n)];
                    gx[s.at(c, b, n)] = cdf * gt[s.at(c, b, n)];
                }
                gx[s.at(0, b, n)] = (cdf + x0 * pdf) * gt[s.at(0, b, n)] + pdf * dot;
            }
        }
        gx
    }

    /// Weighted product with per-feature weights `w (N, P)`.
    pub fn sgp(s: Shape, x: &[f64], y: &[f64], w: &[f64]) -> Vec<f64> {
        let p_count = s.alg.paths();
        let mut o = vec![0.0; s.len()];
        for b in 0..s.b {
            for n in 0..s.n {
                for t in s.alg.terms() {
                    let (j, i, k, p) = (t.j as usize, t.i as usize, t.k as usize, t.p as usize);
                    o[s.at(j, b, n)] +=
                        sign(t.neg) * w[n * p_count + p] * x[s.at(i, b, n)] * y[s.at(k, b, n)];
                }
            }
        }
        o
    }

    /// Backward of [`sgp`]: (grad x, grad y, grad w).
    pub fn sgp_bwd(
        s: Shape,
        x: &[f64],
        y: &[f64],
        w: &[f64],
        g: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let p_count = s.alg.paths();
        let (mut gx, mut gy, mut gw) = (
            vec![0.0; s.len()],
            vec![0.0; s.len()],
            vec![0.0; s.n * p_count],
        );
        for b in 0..s.b {
            for n in 0..s.n {
                for t in s.alg.terms() {
                    let (j, i, k, p) = (t.j as usize, t.i as usize, t.k as usize, t.p as usize);
                    let (xi, yk, gj, wp) = (
                        x[s.at(i, b, n)],
                        y[s.at(k, b, n)],
                        g[s.at(j, b, n)],
                        w[n * p_count + p],
                    );
                    let sg = sign(t.neg);
                    gx[s.at(i, b, n)] += sg * wp * yk * gj;
                    gy[s.at(k, b, n)] += sg * wp * xi * gj;
                    gw[n * p_count + p] += sg * xi * yk * gj;
                }
            }
        }
        (gx, gy, gw)
    }

    /// Fully connected product, `w (P, N, M)`: output `(C, B, M)`.
    pub fn fcgp(s: Shape, m: usize, x: &[f64], y: &[f64], w: &[f64]) -> Vec<f64> {
        let so = s.with_n(m);
        let mut o = vec![0.0; so.len()];
        for b in 0..s.b {
            for t in s.alg.terms() {
                let (j, i, k, p) = (t.j as usize, t.i as usize, t.k as usize, t.p as usize);
                for n in 0..s.n {
                    let v = sign(t.neg) * x[s.at(i, b, n)] * y[s.at(k, b, n)];
                    for mm in 0..m {
                        o[so.at(j, b, mm)] += v * w[(p * s.n + n) * m + mm];
                    }
                }
            }
        }
        o
    }

    /// Backward of [`fcgp`]: (grad x, grad y, grad w).
    pub fn fcgp_bwd(
        s: Shape,
        m: usize,
        x: &[f64],
        y: &[f64],
        w: &[f64],
        g: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let so = s.with_n(m);
        let (mut gx, mut gy, mut gw) = (vec![0.0; s.len()], vec![0.0; s.len()], vec![0.0; w.len()]);
        for b in 0..s.b {
            for t in s.alg.terms() {
                let (j, i, k, p) = (t.j as usize, t.i as usize, t.k as usize, t.p as usize);
                let sg = sign(t.neg);
                for n in 0..s.n {
                    let (xi, yk) = (x[s.at(i, b, n)], y[s.at(k, b, n)]);
                    let mut gpair = 0.0;
                    for mm in 0..m {
                        let gj = g[so.at(j, b, mm)];
                        gpair += gj * w[(p * s.n + n) * m + mm];
                        gw[(p * s.n + n) * m + mm] += sg * xi * yk * gj;
                    }
                    gx[s.at(i, b, n)] += sg * yk * gpair;
                    gy[s.at(k, b, n)] += sg * xi * gpair;
                }
            }
        }
        (gx, gy, gw)
    }

    /// Grade RMS norm: (normalised output, r `(G, B)`).
    pub fn norm(s: Shape, u: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let grades = s.alg.blade_grades();
        let mut r = vec![0.0; s.alg.grades() * s.b];
        for b in 0..s.b {
            for (c, &g) in grades.iter().enumerate() {
                for n in 0..s.n {
                    r[g as usize * s.b + b] += u[s.at(c, b, n)].powi(2);
                }
            }
        }
        for g in 0..s.alg.grades() {
            for b in 0..s.b {
                let v = &mut r[g * s.b + b];
                *v = (*v / s.n as f64 + NORM_EPS as f64).sqrt();
            }
        }
        let mut o = u.to_vec();
        for (c, &g) in grades.iter().enumerate() {
            for b in 0..s.b {
                for n in 0..s.n {
                    o[s.at(c, b, n)] /= r[g as usize * s.b + b];
                }
            }
        }
        (o, r)
    }

    /// Norm backward, the form of docs/math/clifford.md: `dot = r sum go·o`, `gu = go / r - o dot / (N r^2)`.
    pub fn norm_bwd(s: Shape, go: &[f64], o: &[f64], r: &[f64]) -> Vec<f64> {
        let grades = s.alg.blade_grades();
        let mut dot = vec![0.0; s.alg.grades() * s.b];
        for (c, &g) in grades.iter().enumerate() {
            for b in 0..s.b {
                for n in 0..s.n {
                    dot[g as usize * s.b + b] +=
                        r[g as usize * s.b + b] * go[s.at(c, b, n)] * o[s.at(c, b, n)];
                }
            }
        }
        let mut gu = vec![0.0; s.len()];
        for (c, &g) in grades.iter().enumerate() {
            for b in 0..s.b {
                let (rg, d) = (r[g as usize * s.b + b], dot[g as usize * s.b + b]);
                for n in 0..s.n {
                    let i = s.at(c, b, n);
                    gu[i] = go[i] / rg - o[i] * d / (s.n as f64 * rg * rg);
                }
            }
        }
        gu
    }

    /// Per-grade linear map plus bias: `y[c,b,m] = sum_n x[c,b,n] W[grade(c),n,m] + bias[m]`.
    pub fn linear(s: Shape, x: &[f64], w: &[f64], bias: &[f64]) -> Vec<f64> {
        let mut y = vec![0.0; s.len()];
        for (c, &g) in s.alg.blade_grades().iter().enumerate() {
            for b in 0..s.b {
                for m in 0..s.n {
                    let mut v = bias[m];
                    for n in 0..s.n {
                        v += x[s.at(c, b, n)] * w[(g as usize * s.n + n) * s.n + m];
                    }
                    y[s.at(c, b, m)] = v;
                }
            }
        }
        y
    }

    /// Backward of [`linear`]: (grad x, grad W, grad bias).
    pub fn linear_bwd(
        s: Shape,
        x: &[f64],
        w: &[f64],
        gy: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (mut gx, mut gw, mut gb) = (vec![0.0; s.len()], vec![0.0; w.len()], vec![0.0; s.n]);
        for (c, &g) in s.alg.blade_grades().iter().enumerate() {
            let g = g as usize;
            for b in 0..s.b {
                for m in 0..s.n {
                    let gv = gy[s.at(c, b, m)];
                    gb[m] += gv;
                    for n in 0..s.n {
                        gx[s.at(c, b, n)] += gv * w[(g * s.n + n) * s.n + m];
                        gw[(g * s.n + n) * s.n + m] += gv * x[s.at(c, b, n)];
                    }
                }
            }
        }
        (gx, gw, gb)
    }

    /// The product used by a fused op: per feature (`m == None`) or fully connected to `m` outputs.
    #[derive(Clone, Copy, Debug)]
    pub enum Mix {
        PerFeature,
        FullyConnected { out_features: usize },
    }

    /// `RMSNorm(GP(gelu(x), gelu(y)))`: (output, norms if normalised).
    pub fn fused(
        s: Shape,
        mix: Mix,
        x: &[f64],
        y: &[f64],
        w: &[f64],
        normalize: bool,
    ) -> (Vec<f64>, Option<Vec<f64>>) {
        let (xt, yt) = (gate(s, x), gate(s, y));
        let (u, so) = match mix {
            Mix::PerFeature => (sgp(s, &xt, &yt, w), s),
            Mix::FullyConnected { out_features } => {
                (fcgp(s, out_features, &xt, &yt, w), s.with_n(out_features))
            }
        };
        if normalize {
            let (o, r) = norm(so, &u);
            (o, Some(r))
        } else {
            (u, None)
        }
    }

    /// Backward of [`fused`] from its output and norms: (grad x, grad y, grad w).
    #[allow(clippy::too_many_arguments)]
    pub fn fused_bwd(
        s: Shape,
        mix: Mix,
        x: &[f64],
        y: &[f64],
        w: &[f64],
        out: &[f64],
        norms: Option<&[f64]>,
        go: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let so = match mix {
            Mix::PerFeature => s,
            Mix::FullyConnected { out_features } => s.with_n(out_features),
        };
        let gu = match norms {
            Some(r) => norm_bwd(so, go, out, r),
            None => go.to_vec(),
        };
        let (xt, yt) = (gate(s, x), gate(s, y));
        let (gxt, gyt, gw) = match mix {
            Mix::PerFeature => sgp_bwd(s, &xt, &yt, w, &gu),
            Mix::FullyConnected { out_features } => fcgp_bwd(s, out_features, &xt, &yt, w, &gu),
        };
        (gate_bwd(s, x, &gxt), gate_bwd(s, y, &gyt), gw)
    }
}

use exact::{Mix, Shape};

/// Forward result on the host.
#[derive(Clone, Debug)]
pub struct Forward {
    pub out: HostTensor,
    pub norms: Option<HostTensor>,
}

/// Gradients on the host.
#[derive(Clone, Debug)]
pub struct Grads {
    pub grad_x: HostTensor,
    pub grad_y: HostTensor,
    pub grad_weight: HostTensor,
}

fn f64s(t: &HostTensor) -> Vec<f64> {
    t.data.iter().map(|&v| v as f64).collect()
}
fn host(v: &[f64], shape: &[usize]) -> Result<HostTensor> {
    HostTensor::new(v.iter().map(|&x| x as f32).collect(), shape, DType::F32)
}

fn shape_of(op: &'static str, x: &HostTensor, y: &HostTensor) -> Result<Shape> {
    let bad = || Error::Invalid {
        op,
        msg: format!(
            "x {:?} and y {:?} must both be (C, B, N) with C = 4 or 8",
            x.shape, y.shape
        ),
    };
    let [c, b, n] = *x.shape.as_slice() else {
        return Err(bad());
    };
    let alg = Algebra::from_components(c).ok_or_else(bad)?;
    if y.shape != x.shape {
        return Err(bad());
    }
    Ok(Shape { alg, b, n })
}

fn mix_of(op: &'static str, s: Shape, w: &HostTensor, fc: bool) -> Result<Mix> {
    let p = s.alg.paths();
    match (fc, w.shape.as_slice()) {
        (false, [n, pp]) if *n == s.n && *pp == p => Ok(Mix::PerFeature),
        (true, [pp, n, m]) if *pp == p && *n == s.n => Ok(Mix::FullyConnected { out_features: *m }),
        _ => Err(Error::Invalid {
            op,
            msg: format!(
                "weight shape {:?} does not fit {:?} (N = {}, P = {p})",
                w.shape,
                if fc { "(P, N, M)" } else { "(N, P)" },
                s.n
            ),
        }),
    }
}

fn forward(
    op: &'static str,
    x: &HostTensor,
    y: &HostTensor,
    w: &HostTensor,
    normalize: Normalize,
    fc: bool,
) -> Result<Forward> {
    let s = shape_of(op, x, y)?;
    let mix = mix_of(op, s, w, fc)?;
    let m = match mix {
        Mix::PerFeature => s.n,
        Mix::FullyConnected { out_features } => out_features,
    };
    let (o, r) = exact::fused(
        s,
        mix,
        &f64s(x),
        &f64s(y),
        &f64s(w),
        normalize == Normalize::Yes,
    );
    Ok(Forward {
        out: host(&o, &[s.alg.components(), s.b, m])?,
        norms: r.map(|r| host(&r, &[s.alg.grades(), s.b])).transpose()?,
    })
}

fn backward(
    op: &'static str,
    x: &HostTensor,
    y: &HostTensor,
    w: &HostTensor,
    fwd: &Forward,
    go: &HostTensor,
    fc: bool,
) -> Result<Grads> {
    let s = shape_of(op, x, y)?;
    let mix = mix_of(op, s, w, fc)?;
    let norms = fwd.norms.as_ref().map(f64s);
    let (gx, gy, gw) = exact::fused_bwd(
        s,
        mix,
        &f64s(x),
        &f64s(y),
        &f64s(w),
        &f64s(&fwd.out),
        norms.as_deref(),
        &f64s(go),
    );
    Ok(Grads {
        grad_x: host(&gx, &x.shape)?,
        grad_y: host(&gy, &x.shape)?,
        grad_weight: host(&gw, &w.shape)?,
    })
}

pub fn sgp_forward(
    x: &HostTensor,
    y: &HostTensor,
    w: &HostTensor,
    normalize: Normalize,
) -> Result<Forward> {
    forward("sgp_forward (reference)", x, y, w, normalize, false)
}
pub fn sgp_backward(
    x: &HostTensor,
    y: &HostTensor,
    w: &HostTensor,
    fwd: &Forward,
    go: &HostTensor,
) -> Result<Grads> {
    backward("sgp_backward (reference)", x, y, w, fwd, go, false)
}
pub fn fcgp_forward(
    x: &HostTensor,
    y: &HostTensor,
    w: &HostTensor,
    normalize: Normalize,
) -> Result<Forward> {
    forward("fcgp_forward (reference)", x, y, w, normalize, true)
}
pub fn fcgp_backward(
    x: &HostTensor,
    y: &HostTensor,
    w: &HostTensor,
    fwd: &Forward,
    go: &HostTensor,
) -> Result<Grads> {
    backward("fcgp_backward (reference)", x, y, w, fwd, go, true)
}

/// Layer parameters on the host.
#[derive(Clone, Debug)]
pub struct LayerParams {
    pub algebra: Algebra,
    pub mode: GpMode,
    pub normalize: Normalize,
    pub linear_weight: HostTensor,
    pub linear_bias: HostTensor,
    pub gp_weight: HostTensor,
}

/// Layer gradients on the host.
#[derive(Clone, Debug)]
pub struct LayerGrads {
    pub grad_x: HostTensor,
    pub grad_linear_weight: HostTensor,
    pub grad_linear_bias: HostTensor,
    pub grad_gp_weight: HostTensor,
}

/// Seeded normal samples (splitmix64 + Box-Muller): the init needs no RNG dependency.
struct Normal(u64);
impl Normal {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn sample(&mut self, std: f64) -> f32 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    fn tensor(&mut self, shape: &[usize], std: f64) -> Result<HostTensor> {
        let n = shape.iter().product();
        HostTensor::new(
            (0..n).map(|_| self.sample(std)).collect(),
            shape,
            DType::F32,
        )
    }
}

impl LayerParams {
    /// The init of docs/math/clifford.md for `n` features: `gp_weight ~ N(0, 1/(dims+1))`, `linear_weight` std
    /// `1/sqrt(N (dims+1))` (`1/sqrt(N)` fully connected), bias 0.
    pub fn init(
        algebra: Algebra,
        n: usize,
        mode: GpMode,
        normalize: Normalize,
        seed: u64,
    ) -> Result<LayerParams> {
        let mut rng = Normal(seed);
        let (g, p, d1) = (
            algebra.grades(),
            algebra.paths(),
            algebra.dims() as f64 + 1.0,
        );
        let lin_std = match mode {
            GpMode::PerFeature => 1.0 / (n as f64 * d1).sqrt(),
            GpMode::FullyConnected => 1.0 / (n as f64).sqrt(),
        };
        let gp_shape = match mode {
            GpMode::PerFeature => vec![n, p],
            GpMode::FullyConnected => vec![p, n, n],
        };
        Ok(LayerParams {
            algebra,
            mode,
            normalize,
            linear_weight: rng.tensor(&[g, n, n], lin_std)?,
            linear_bias: HostTensor::new(vec![0.0; n], &[n], DType::F32)?,
            gp_weight: rng.tensor(&gp_shape, 1.0 / d1.sqrt())?,
        })
    }

    fn shape(&self, x: &HostTensor) -> Result<Shape> {
        let ok = x.shape.len() == 3
            && x.shape[0] == self.algebra.components()
            && x.shape[2] == self.linear_bias.numel();
        if !ok {
            return Err(Error::Invalid {
                op: "Layer (reference)",
                msg: format!(
                    "x {:?} does not fit the layer ({} components, {} features)",
                    x.shape,
                    self.algebra.components(),
                    self.linear_bias.numel()
                ),
            });
        }
        // The parameters must fit N too (the f64 kernels index them without checks).
        let (g, p, n) = (self.algebra.grades(), self.algebra.paths(), x.shape[2]);
        let gp_shape = match self.mode {
            GpMode::PerFeature => vec![n, p],
            GpMode::FullyConnected => vec![p, n, n],
        };
        for (what, t, want) in [
            ("linear_weight", &self.linear_weight, vec![g, n, n]),
            ("gp_weight", &self.gp_weight, gp_shape),
        ] {
            if t.shape != want {
                return Err(Error::Invalid {
                    op: "Layer (reference)",
                    msg: format!(
                        "{what} {:?} does not fit the layer (expected {want:?})",
                        t.shape
                    ),
                });
            }
        }
        Ok(Shape {
            alg: self.algebra,
            b: x.shape[1],
            n,
        })
    }

    fn mix(&self, n: usize) -> Mix {
        match self.mode {
            GpMode::PerFeature => Mix::PerFeature,
            GpMode::FullyConnected => Mix::FullyConnected { out_features: n },
        }
    }

    pub fn forward(&self, x: &HostTensor) -> Result<Forward> {
        let s = self.shape(x)?;
        let xv = f64s(x);
        let y = exact::linear(s, &xv, &f64s(&self.linear_weight), &f64s(&self.linear_bias));
        let (o, r) = exact::fused(
            s,
            self.mix(s.n),
            &xv,
            &y,
            &f64s(&self.gp_weight),
            self.normalize == Normalize::Yes,
        );
        Ok(Forward {
            out: host(&o, &x.shape)?,
            norms: r.map(|r| host(&r, &[s.alg.grades(), s.b])).transpose()?,
        })
    }

    pub fn backward(&self, x: &HostTensor, fwd: &Forward, go: &HostTensor) -> Result<LayerGrads> {
        let s = self.shape(x)?;
        let (xv, lw) = (f64s(x), f64s(&self.linear_weight));
        let y = exact::linear(s, &xv, &lw, &f64s(&self.linear_bias));
        let norms = fwd.norms.as_ref().map(f64s);
        let (gx, gy, gw) = exact::fused_bwd(
            s,
            self.mix(s.n),
            &xv,
            &y,
            &f64s(&self.gp_weight),
            &f64s(&fwd.out),
            norms.as_deref(),
            &f64s(go),
        );
        let (gx_lin, glw, gb) = exact::linear_bwd(s, &xv, &lw, &gy);
        let gx: Vec<f64> = gx.iter().zip(&gx_lin).map(|(a, b)| a + b).collect();
        Ok(LayerGrads {
            grad_x: host(&gx, &x.shape)?,
            grad_linear_weight: host(&glw, &self.linear_weight.shape)?,
            grad_linear_bias: host(&gb, &self.linear_bias.shape)?,
            grad_gp_weight: host(&gw, &self.gp_weight.shape)?,
        })
    }
}
