//! The tuning registry: every constant of the engine that a sweep chose (or that bounds a
//! resource), with one name, its value, the [`EngineOptions`] field and environment variable
//! that override it in benchmarks, and the committed sweep that chose it
//! (`benchmarks/sweeps/`). The benchmark binaries read their overrides from here
//! ([`EngineOptions::from_overrides`]), so a knob has the same name everywhere; a test checks
//! that each knob's sweep file exists and that its option is the field it names.

use crate::state::EngineOptions;

/// Why a knob has its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Chosen by the sweep over the suite's data sets.
    Swept,
    /// A bound on memory, time or report size, not a utility choice; the sweep shows what it
    /// costs.
    ResourceBound,
}

/// One tuning constant.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    /// The constant's name in the code.
    pub constant: &'static str,
    /// Its value (counts as `f64`).
    pub value: f64,
    /// The [`EngineOptions`] field that overrides it, if any.
    pub option: Option<&'static str>,
    /// The environment variable the benchmark binaries read into that option.
    pub env: Option<&'static str>,
    /// The sweep that chose it, a file of `benchmarks/sweeps/`.
    pub sweep: &'static str,
    /// Why it has its value.
    pub status: Status,
    /// Sets the option (`None` without one).
    set: Option<fn(&mut EngineOptions, f64)>,
}

/// Every tuning constant of the engine.
pub const KNOBS: &[Knob] = &[
    Knob {
        constant: "AUTO_PHASE1_SHARE",
        value: crate::protocols::auto::AUTO_PHASE1_SHARE,
        option: Some("auto_phase1_share"),
        env: Some("LDPSYN_AUTO_SHARE"),
        sweep: "auto-screening-share.md",
        status: Status::Swept,
        set: Some(|o, v| o.auto_phase1_share = Some(v)),
    },
    Knob {
        constant: "AUTO_ROUND0_SHARE",
        value: crate::protocols::auto::AUTO_ROUND0_SHARE,
        option: Some("auto_round0_share"),
        env: Some("LDPSYN_AUTO_ROUND0"),
        sweep: "auto-round0-share.md",
        status: Status::Swept,
        set: Some(|o, v| o.auto_round0_share = Some(v)),
    },
    Knob {
        constant: "AUTO_BLOCK_SCREENING_SHARE",
        value: crate::protocols::auto::AUTO_BLOCK_SCREENING_SHARE,
        option: Some("auto_block_share"),
        env: Some("LDPSYN_AUTO_BLOCK_SHARE"),
        sweep: "auto-block-share.md",
        status: Status::Swept,
        set: Some(|o, v| o.auto_block_share = Some(v)),
    },
    Knob {
        constant: "AUTO_BIN_NOISE_L1",
        value: crate::protocols::auto::AUTO_BIN_NOISE_L1,
        option: Some("auto_bin_noise_l1"),
        env: Some("LDPSYN_AUTO_BIN_NOISE"),
        sweep: "auto-bin-noise.md",
        status: Status::Swept,
        set: Some(|o, v| o.auto_bin_noise_l1 = Some(v)),
    },
    Knob {
        constant: "AUTO_POOL_SIGNIFICANCE",
        value: crate::protocols::auto::AUTO_POOL_SIGNIFICANCE,
        option: Some("auto_pool_significance"),
        env: Some("LDPSYN_AUTO_POOL_Z"),
        sweep: "model-graph-pooling.md",
        status: Status::Swept,
        set: Some(|o, v| o.auto_pool_significance = Some(v)),
    },
    Knob {
        constant: "MAX_SCREENING_FACTOR_CELLS",
        value: crate::protocols::auto::MAX_SCREENING_FACTOR_CELLS as f64,
        option: None,
        env: None,
        sweep: "auto-block-share.md",
        status: Status::ResourceBound,
        set: None,
    },
    Knob {
        // Vertical collections use `VERTICAL_GAIN_MARGIN`.
        constant: "DEVICE_GAIN_MARGIN",
        value: crate::protocols::DEVICE_GAIN_MARGIN,
        option: Some("gain_margin"),
        env: Some("LDPSYN_GAIN_MARGIN"),
        sweep: "gain-margin.md",
        status: Status::Swept,
        set: Some(|o, v| o.gain_margin = Some(v)),
    },
    Knob {
        constant: "VERTICAL_GAIN_MARGIN",
        value: crate::protocols::vertical::VERTICAL_GAIN_MARGIN,
        option: Some("gain_margin"),
        env: Some("LDPSYN_GAIN_MARGIN"),
        sweep: "gain-margin.md",
        status: Status::Swept,
        set: Some(|o, v| o.gain_margin = Some(v)),
    },
    Knob {
        // Encodings `fo` and `fo+locmrf`; `sampled+locmrf` uses the next.
        constant: "LOCAL_PRECISION_RATIO",
        value: crate::fit::observe::LOCAL_PRECISION_RATIO,
        option: Some("local_precision_ratio"),
        env: Some("LDPSYN_LOCAL_PRECISION_RATIO"),
        sweep: "local-precision-ratio.md",
        status: Status::Swept,
        set: Some(|o, v| o.local_precision_ratio = Some(v)),
    },
    Knob {
        constant: "SAMPLED_LOCAL_PRECISION_RATIO",
        value: crate::fit::observe::SAMPLED_LOCAL_PRECISION_RATIO,
        option: Some("local_precision_ratio"),
        env: Some("LDPSYN_LOCAL_PRECISION_RATIO"),
        sweep: "local-precision-ratio.md",
        status: Status::Swept,
        set: Some(|o, v| o.local_precision_ratio = Some(v)),
    },
    Knob {
        constant: "MAX_CLIQUE_CELLS",
        value: crate::select::model_graph::MAX_CLIQUE_CELLS as f64,
        option: Some("max_clique_cells"),
        env: Some("LDPSYN_MAX_CLIQUE_CELLS"),
        sweep: "clique-cap.md",
        status: Status::ResourceBound,
        set: Some(|o, v| o.max_clique_cells = Some(v as u64)),
    },
    Knob {
        constant: "SUB_BIN_ONE_WAY_SHARE",
        value: crate::domain::task::SUB_BIN_ONE_WAY_SHARE,
        option: Some("sub_bin_share"),
        env: Some("LDPSYN_SUB_BIN_SHARE"),
        sweep: "sub-bin-share.md",
        status: Status::Swept,
        set: Some(|o, v| o.sub_bin_share = Some(v)),
    },
    Knob {
        constant: "SAMPRIVSYN_ARRIVAL_STRATA",
        value: crate::protocols::samprivsyn::SAMPRIVSYN_ARRIVAL_STRATA as f64,
        option: Some("samprivsyn_strata"),
        env: Some("LDPSYN_SAMPRIVSYN_STRATA"),
        sweep: "samprivsyn-strata.md",
        status: Status::Swept,
        set: Some(|o, v| o.samprivsyn_strata = Some(v as u32)),
    },
    Knob {
        constant: "SUB_BINS",
        value: crate::domain::task::SUB_BINS as f64,
        option: Some("sub_bins"),
        env: Some("LDPSYN_SUB_BINS"),
        sweep: "sub-bin-share.md",
        status: Status::Swept,
        set: Some(|o, v| o.sub_bins = Some(v as usize)),
    },
    Knob {
        constant: "SMOOTHING_RELEASE_Z",
        value: crate::fit::smooth::SMOOTHING_RELEASE_Z,
        option: Some("smoothing_release_z"),
        env: Some("LDPSYN_SMOOTHING_Z"),
        sweep: "numeric-smoothing.md",
        status: Status::Swept,
        set: Some(|o, v| o.smoothing_release_z = Some(v)),
    },
    Knob {
        constant: "UNRESOLVED_BIN_Z",
        value: crate::domain::space::UNRESOLVED_BIN_Z,
        option: Some("unresolved_bin_z"),
        env: Some("LDPSYN_UNRESOLVED_BIN_Z"),
        sweep: "unresolved-bins.md",
        status: Status::Swept,
        set: Some(|o, v| o.unresolved_bin_z = Some(v)),
    },
    Knob {
        constant: "POINT_MASS_Z",
        value: crate::domain::space::POINT_MASS_Z,
        option: None,
        env: None,
        sweep: "point-masses.md",
        status: Status::Swept,
        set: None,
    },
    Knob {
        constant: "MIN_POINT_BIN_CELLS",
        value: crate::domain::space::MIN_POINT_BIN_CELLS as f64,
        option: None,
        env: None,
        sweep: "point-masses.md",
        status: Status::Swept,
        set: None,
    },
    Knob {
        constant: "PILOT_ITERS",
        value: crate::fit::observe::PILOT_ITERS as f64,
        option: None,
        env: None,
        sweep: "fit-weights.md",
        status: Status::Swept,
        set: None,
    },
    Knob {
        constant: "DEFAULT_MAX_BINS",
        value: ldpsyn::schema::DEFAULT_MAX_BINS as f64,
        option: None,
        env: None,
        sweep: "max-bins.md",
        status: Status::Swept,
        set: None,
    },
    Knob {
        constant: "CELL_MERGE_SIGMAS",
        value: crate::central::CELL_MERGE_SIGMAS,
        option: None,
        env: None,
        sweep: "central-cell-merge.md",
        status: Status::Swept,
        set: None,
    },
];

/// An override that could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{env}={value:?} is not a number (it overrides {constant})")]
pub struct OverrideError {
    /// The environment variable.
    pub env: &'static str,
    /// Its value.
    pub value: String,
    /// The constant it overrides.
    pub constant: &'static str,
}

impl EngineOptions {
    /// The default options with every knob of [`KNOBS`] whose environment variable `lookup`
    /// returns set to that value (benchmarks and sweeps: `lookup` is `std::env::var`).
    /// Errors: a value that is not a number (a count takes its integer part).
    pub fn from_overrides(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<EngineOptions, OverrideError> {
        let mut options = EngineOptions::default();
        let mut seen: Vec<&str> = Vec::new();
        for knob in KNOBS {
            let (Some(env), Some(set)) = (knob.env, knob.set) else {
                continue;
            };
            if seen.contains(&env) {
                continue;
            }
            seen.push(env);
            let Some(raw) = lookup(env) else { continue };
            let v: f64 = raw.trim().parse().map_err(|_| OverrideError {
                env,
                value: raw.clone(),
                constant: knob.constant,
            })?;
            set(&mut options, v);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Each knob cites a committed sweep.
    #[test]
    fn every_knob_has_its_sweep_file() {
        let sweeps = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks/sweeps");
        for k in KNOBS {
            assert!(
                sweeps.join(k.sweep).is_file(),
                "{} cites benchmarks/sweeps/{}, which does not exist",
                k.constant,
                k.sweep
            );
        }
    }

    /// An environment variable names one option, and setting it sets exactly the field the
    /// knob names (read back through serde), to the value given.
    #[test]
    fn overrides_set_the_field_they_name() {
        for k in KNOBS {
            let (Some(env), Some(option)) = (k.env, k.option) else {
                assert!(k.env.is_none() && k.option.is_none() && k.set.is_none());
                continue;
            };
            assert!(env.starts_with("LDPSYN_"), "{env}");
            let same_env: Vec<_> = KNOBS.iter().filter(|x| x.env == Some(env)).collect();
            assert!(same_env.iter().all(|x| x.option == Some(option)), "{env}");
            let options = EngineOptions::from_overrides(|v| (v == env).then(|| "3".into()))
                .expect("a number");
            let json = serde_json::to_value(&options).expect("serializes");
            let set: Vec<(&String, &serde_json::Value)> = json
                .as_object()
                .expect("an object")
                .iter()
                .filter(|(_, v)| !v.is_null())
                .collect();
            assert_eq!(set.len(), 1, "{env} set {set:?}");
            assert_eq!(set[0].0, option, "{env}");
            assert_eq!(set[0].1.as_f64(), Some(3.0), "{env}");
        }
    }

    #[test]
    fn a_malformed_override_names_its_variable() {
        let err = EngineOptions::from_overrides(|v| (v == "LDPSYN_AUTO_SHARE").then(|| "x".into()))
            .unwrap_err();
        assert_eq!(err.env, "LDPSYN_AUTO_SHARE");
        assert!(err.to_string().contains("AUTO_PHASE1_SHARE"));
        assert_eq!(
            EngineOptions::from_overrides(|_| None).unwrap(),
            EngineOptions::default()
        );
    }
}
