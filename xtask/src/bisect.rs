//! `cargo xtask bisect [--model transformer|clifford] [--planted gelu|layernorm|flash] [--steps N]
//! [--seed S]`: incremental replacement on a model of `host::replace` (default: the transformer
//! block; `clifford`: the Clifford MLP). Trains with every op on its CPU reference, then with one op
//! kind of the model at a time (and cumulatively) on the GPU, prints the divergence per op and names
//! the first op whose GPU version makes the run diverge. `--planted` wraps one GPU op of the
//! transformer in a deliberate defect (built host-side, never shipped) to show that bisect finds it.
//!
//! Exit status: 0 when the verdict is as expected (no divergence without a planted bug; the planted
//! op named with one) and on a machine without a GPU ("no GPU: nothing to bisect"); 1 otherwise.
use host::replace::{BisectSettings, Device, Model, Planted, Report, bisect_on};

use crate::util::{Args, Flag, Spec};

pub const SPEC: Spec = Spec {
    task: "bisect",
    summary: "switch a model's ops to the GPU one at a time: per-op divergence table, first divergent op \
              (exit 0, nothing done, without a GPU)",
    positionals: &[],
    flags: &[
        Flag {
            name: "--model",
            value: Some("transformer|clifford"),
            help: "the model to train (default transformer)",
        },
        Flag {
            name: "--planted",
            value: Some("gelu|layernorm|flash"),
            help: "wrap one GPU op of the transformer in a deliberate defect",
        },
        Flag {
            name: "--steps",
            value: Some("N"),
            help: "training steps (default: the model's)",
        },
        Flag {
            name: "--seed",
            value: Some("S"),
            help: "the run's seed (default: the model's)",
        },
    ],
};

/// The parsed flags.
#[derive(Debug, PartialEq)]
pub struct Options {
    pub model: Model,
    pub planted: Option<Planted>,
    pub steps: usize,
    pub seed: u64,
}

/// The flags' values, checked (the command line itself was parsed against [`SPEC`]).
pub fn parse(args: &Args) -> Result<Options, String> {
    let model = match args.value("--model") {
        None => Model::default(),
        Some(name) => Model::parse(name).ok_or(format!(
            "unknown model `{name}`: use {}",
            Model::NAMES.join(" or ")
        ))?,
    };
    let defaults = BisectSettings::for_model(model);
    let planted = match args.value("--planted") {
        None => None,
        Some(name) => Some(Planted::parse(name).ok_or(format!(
            "unknown planted bug `{name}`: use {}",
            Planted::NAMES.join(", ")
        ))?),
    };
    if let Some(p) = planted
        && !model.kinds().contains(&p.kind())
    {
        return Err(format!(
            "the planted bug `{}` lives in {}, which the {} model does not use (planted bugs \
             exist for the transformer)",
            args.value("--planted").unwrap_or_default(),
            p.kind(),
            model.name()
        ));
    }
    let number = |flag: &str, default: u64| -> Result<u64, String> {
        match args.value(flag) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{flag} wants a non-negative integer, got `{v}`")),
        }
    };
    let steps = number("--steps", defaults.steps as u64)? as usize;
    if steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    Ok(Options {
        model,
        planted,
        steps,
        seed: number("--seed", defaults.seed)?,
    })
}

/// Whether the report says what it should: clean without a planted bug, the planted op named with one.
pub fn expected(report: &Report, planted: Option<Planted>) -> bool {
    report.culprit == planted.map(Planted::kind)
}

pub fn run(args: &Args) -> Result<(), String> {
    let a = parse(args)?;
    let gpu = match host::Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(e @ host::Error::NoDevice { .. }) => {
            println!("no GPU: nothing to bisect ({e})");
            return Ok(());
        }
        Err(e) => return Err(e.to_string()),
    };
    println!("device: {}", gpu.name());
    println!("model: {}", a.model.name());
    if let Some(p) = a.planted {
        println!("planted bug: {p:?} in the GPU path of {}", p.kind());
    }
    let settings = BisectSettings {
        steps: a.steps,
        seed: a.seed,
        ..BisectSettings::for_model(a.model)
    };
    let report = bisect_on(&Device::Gpu(gpu), a.planted, &settings).map_err(|e| e.to_string())?;
    println!("{report}");
    match (expected(&report, a.planted), a.planted) {
        (true, _) => Ok(()),
        (false, None) => Err("the GPU run diverges from the reference (see the verdict)".into()),
        (false, Some(p)) => Err(format!(
            "the planted bug in {} was not named (verdict: {:?})",
            p.kind(),
            report.culprit
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line as `cargo xtask bisect` reads it: the shared parser, then the values' checks.
    fn parse_line(v: &[&str]) -> Result<Options, String> {
        let args: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        parse(&crate::util::parse_args(&SPEC, &args)?)
    }

    fn run_line(v: &[&str]) -> Result<(), String> {
        let args: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        run(&crate::util::parse_args(&SPEC, &args)?)
    }

    #[test]
    fn parses_flags_and_rejects_bad_ones() {
        let a = parse_line(&["--planted", "gelu", "--steps", "4"]).unwrap();
        assert_eq!(a.planted, Some(Planted::GeluOffByOne));
        assert_eq!(a.steps, 4);
        assert_eq!(parse_line(&[]).unwrap().planted, None);
        assert_eq!(
            parse_line(&["--planted", "layernorm"]).unwrap().planted,
            Some(Planted::LayerNormEps)
        );
        assert_eq!(
            parse_line(&["--planted", "flash"]).unwrap().planted,
            Some(Planted::FlashAttentionNotCausal)
        );
        assert!(
            parse_line(&["--model", "clifford", "--planted", "flash"])
                .unwrap_err()
                .contains("flash attention")
        );
        for name in Planted::NAMES {
            assert!(Planted::parse(name).is_some(), "{name}");
        }
        assert!(parse_line(&["--planted", "nope"]).is_err());
        assert!(parse_line(&["--planted"]).is_err());
        assert!(parse_line(&["--steps", "0"]).is_err());
        assert!(parse_line(&["--frobnicate"]).is_err());
        // Models: transformer by default, clifford by name; planted bugs only where they live.
        assert_eq!(parse_line(&[]).unwrap().model.name(), "transformer");
        let a = parse_line(&["--model", "clifford", "--steps", "2"]).unwrap();
        assert_eq!((a.model.name(), a.steps, a.planted), ("clifford", 2, None));
        assert_eq!(
            parse_line(&["--model", "transformer", "--planted", "gelu"])
                .unwrap()
                .planted,
            Some(Planted::GeluOffByOne)
        );
        assert!(parse_line(&["--model", "resnet"]).is_err());
        assert!(parse_line(&["--model"]).is_err());
        let e = parse_line(&["--model", "clifford", "--planted", "layernorm"]).unwrap_err();
        assert!(e.contains("transformer"), "{e}");
    }

    #[test]
    fn verdicts_are_judged_against_the_planted_bug() {
        use host::replace::OpKind;
        let fake = |kind| {
            bisect_on(
                &Device::Fake { kind, rel: 1e-2 },
                None,
                &BisectSettings::default(),
            )
            .unwrap()
        };
        let gelu = fake(OpKind::Gelu);
        assert!(expected(&gelu, Some(Planted::GeluOffByOne)));
        assert!(!expected(&gelu, None));
        assert!(!expected(
            &fake(OpKind::Matmul),
            Some(Planted::GeluOffByOne)
        ));
    }

    #[test]
    fn clifford_verdicts_name_the_perturbed_kind() {
        use host::replace::OpKind;
        let settings = BisectSettings::for_model(Model::parse("clifford").unwrap());
        let r = bisect_on(
            &Device::Fake {
                kind: OpKind::CliffordFcLayer,
                rel: 1e-2,
            },
            None,
            &settings,
        )
        .unwrap();
        assert_eq!(r.culprit, Some(OpKind::CliffordFcLayer));
        assert!(!expected(&r, None));
        let clean = bisect_on(
            &Device::Fake {
                kind: OpKind::Gelu,
                rel: 1e-2,
            },
            None,
            &settings,
        )
        .unwrap();
        assert!(expected(&clean, None), "{clean}");
    }

    #[test]
    fn without_a_gpu_bisect_is_a_clean_no_op() {
        if host::Gpu::new(0).is_err() {
            assert_eq!(run_line(&["--planted", "gelu"]), Ok(()));
            assert_eq!(run_line(&["--model", "clifford"]), Ok(()));
        }
    }
}
