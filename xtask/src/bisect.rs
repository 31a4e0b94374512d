//! `cargo xtask bisect [--model transformer|clifford] [--planted gelu|layernorm] [--steps N]
//! [--seed S]`: incremental replacement on a model of `host::replace` (default: the transformer
//! block; `clifford`: the Clifford MLP). Trains with every op on its CPU reference, then with one op
//! kind of the model at a time (and cumulatively) on the GPU, prints the divergence per op and names
//! the first op whose GPU version makes the run diverge. `--planted` wraps one GPU op of the
//! transformer in a deliberate defect (built host-side, never shipped) to show that bisect finds it.
//!
//! Exit status: 0 when the verdict is as expected (no divergence without a planted bug; the planted
//! op named with one) and on a machine without a GPU ("no GPU: nothing to bisect"); 1 otherwise.
use host::replace::{BisectSettings, Device, Model, Planted, Report, bisect_on};

use crate::util::flag_value;

/// The parsed flags.
#[derive(Debug, PartialEq)]
pub struct Args {
    pub model: Model,
    pub planted: Option<Planted>,
    pub steps: usize,
    pub seed: u64,
}

pub fn parse(args: &[String]) -> Result<Args, String> {
    let known = ["--model", "--planted", "--steps", "--seed"];
    for (i, a) in args.iter().enumerate() {
        let is_value = i > 0 && known.contains(&args[i - 1].as_str());
        if !is_value && !known.contains(&a.as_str()) {
            return Err(format!(
                "unknown argument `{a}`; usage: cargo xtask bisect [--model transformer|clifford] \
                 [--planted gelu|layernorm] [--steps N] [--seed S]"
            ));
        }
    }
    let model = match flag_value(args, "--model") {
        None if args.iter().any(|a| a == "--model") => {
            return Err("--model needs a value: transformer or clifford".into());
        }
        None => Model::default(),
        Some(name) => Model::parse(&name).ok_or(format!(
            "unknown model `{name}`: use {}",
            Model::NAMES.join(" or ")
        ))?,
    };
    let defaults = BisectSettings::for_model(model);
    let planted = match flag_value(args, "--planted") {
        None if args.iter().any(|a| a == "--planted") => {
            return Err("--planted needs a value: gelu or layernorm".into());
        }
        None => None,
        Some(name) => Some(Planted::parse(&name).ok_or(format!(
            "unknown planted bug `{name}`: use gelu or layernorm"
        ))?),
    };
    if let Some(p) = planted
        && !model.kinds().contains(&p.kind())
    {
        return Err(format!(
            "the planted bug `{}` lives in {}, which the {} model does not use (planted bugs \
             exist for the transformer)",
            flag_value(args, "--planted").unwrap_or_default(),
            p.kind(),
            model.name()
        ));
    }
    let number = |flag: &str, default: u64| -> Result<u64, String> {
        match flag_value(args, flag) {
            None if args.iter().any(|a| a == flag) => Err(format!("{flag} needs a value")),
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
    Ok(Args {
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

pub fn run(args: &[String]) -> Result<(), String> {
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

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_flags_and_rejects_bad_ones() {
        let a = parse(&s(&["--planted", "gelu", "--steps", "4"])).unwrap();
        assert_eq!(a.planted, Some(Planted::GeluOffByOne));
        assert_eq!(a.steps, 4);
        assert_eq!(parse(&[]).unwrap().planted, None);
        assert_eq!(
            parse(&s(&["--planted", "layernorm"])).unwrap().planted,
            Some(Planted::LayerNormEps)
        );
        assert!(parse(&s(&["--planted", "nope"])).is_err());
        assert!(parse(&s(&["--planted"])).is_err());
        assert!(parse(&s(&["--steps", "0"])).is_err());
        assert!(parse(&s(&["--frobnicate"])).is_err());
        // Models: transformer by default, clifford by name; planted bugs only where they live.
        assert_eq!(parse(&[]).unwrap().model.name(), "transformer");
        let a = parse(&s(&["--model", "clifford", "--steps", "2"])).unwrap();
        assert_eq!((a.model.name(), a.steps, a.planted), ("clifford", 2, None));
        assert_eq!(
            parse(&s(&["--model", "transformer", "--planted", "gelu"]))
                .unwrap()
                .planted,
            Some(Planted::GeluOffByOne)
        );
        assert!(parse(&s(&["--model", "resnet"])).is_err());
        assert!(parse(&s(&["--model"])).is_err());
        let e = parse(&s(&["--model", "clifford", "--planted", "layernorm"])).unwrap_err();
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
            assert_eq!(run(&s(&["--planted", "gelu"])), Ok(()));
            assert_eq!(run(&s(&["--model", "clifford"])), Ok(()));
        }
    }
}
