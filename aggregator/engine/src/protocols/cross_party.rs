//! Cross-party 2-way marginals of a `sketch+locmrf` vertical collection from the parties'
//! sketch reports (VertiMRF §4.3 CarEst, Algorithm 4; §5.1's R-scores for GraphCom; §6.1's
//! binned attributes): what the server makes of the [`SketchUpload`]s beside the parties'
//! local models ([`crate::measure::local_model`]).
//!
//! Each party sketches its attributes after §6.1's equal-width binning
//! ([`crate::protocols::vertical::Vertical::sketch_cuts`]; it depends on the domain only).
//! For every pair of attributes held by different parties, [`cross_party_marginals`]
//! estimates the pair's binned table by inclusion–exclusion over the merged sketches
//! ([`crate::measure::sketch::estimate_marginal`], the 1/e-quantile combination) with n̂
//! pooled over every party's noisy count, and scores the pair against independence of its
//! own margins ([`crate::select::gain::pair_gain_from_cells`]). The model graph is the
//! parties' local graphs joined by the cross-party pairs with the best gains under the
//! clique cap (GraphCom, [`crate::select::model_graph::select_model_graph_from`]); the kept
//! pairs' tables become observations of the fit ([`cross_observations`]), in bins. §6.1's
//! histogram recovery (HisRec) is not a separate step: the fit's maximum-entropy model
//! matches the binned cross table and, within bins, the local models' fine 1-ways and
//! 2-ways, which is what HisRec's `Pr[X,Y]·Pr[A|X]·Pr[B|Y]` assumes and more (the local
//! 2-ways also shape the split where the graph links them).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::fit::pgm::Observation;
use crate::graph::{Edge, JunctionTree};
use crate::measure::local_model::LocalModel;
use crate::measure::sketch::{
    AttributeRef, Combine, Estimate, SketchReport, estimate_marginal, pooled_count,
};
use crate::protocols::vertical::Vertical;
use crate::select::gain::{PairGain, pair_gain_from_cells};

/// One party's sketch report (VertiMRF Algorithm 3 with n̂) over its attributes in party
/// order, each binned by [`Vertical::sketch_cuts`]. JSON: `{"party": "…", "report": {…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SketchUpload {
    /// The party's name.
    pub party: String,
    /// Its report ([`crate::measure::sketch::encode_party`]'s output).
    pub report: SketchReport,
}

/// A cross-party pair's binned table estimated from the sketches.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossMarginal {
    /// The pair `(a, b)`, `a < b`, schema indices.
    pub pair: Edge,
    /// Bin maps (cuts) of `a` and `b` (`[]`: unbinned), as [`Observation::bins`] takes them.
    pub bins: Vec<Vec<u32>>,
    /// Raw frequencies of the binned cells (row-major `a × b`; unclipped, may be negative).
    pub frequencies: Vec<f64>,
    /// Variance of each frequency (the sketch's per-cell variance over n̂²).
    pub variances: Vec<f64>,
    /// The pair's gain against independence of its own margins (GraphCom's R-score).
    pub gain: PairGain,
}

/// What the parties of a vertical collection upload besides their records, as
/// [`crate::Engine::finalize_vertical`] takes it: local models (LocMRF; every encoding but
/// `fo`) and sketch reports (`sketch+locmrf`), each at most one per party, in any order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartyUploads {
    /// The parties' local models.
    pub models: Vec<LocalModel>,
    /// The parties' sketch reports.
    pub sketches: Vec<SketchUpload>,
}

/// Checks one party's sketch report against the collection: a party of it, the party's
/// sketch parameters ([`Vertical::sketch_params`]) and one domain per attribute equal to its
/// bin count ([`Vertical::sketch_bin_count`]). Returns the party's index. Errors: what is
/// wrong, for a 4xx (the encoding is not `sketch+locmrf`, an unknown party, other
/// parameters or domains).
pub fn check_upload(v: &Vertical, upload: &SketchUpload) -> Result<usize, String> {
    if !v.encoding().is_sketch() {
        return Err(format!(
            "sketch reports are for encoding `sketch+locmrf`, not `{}`",
            v.encoding().name()
        ));
    }
    let p = v
        .party_index(&upload.party)
        .ok_or_else(|| format!("sketch report of unknown party `{}`", upload.party))?;
    let expected = v.sketch_params(p)?;
    if *upload.report.params() != expected {
        return Err(format!(
            "party `{}`: the report's sketch parameters are not the collection's",
            upload.party
        ));
    }
    let bins: Vec<u32> = v.parties()[p]
        .attributes
        .iter()
        .map(|&a| v.sketch_bin_count(a) as u32)
        .collect();
    if upload.report.domain_sizes() != bins {
        return Err(format!(
            "party `{}`: the report's domains {:?} are not its attributes' sketch bins {bins:?}",
            upload.party,
            upload.report.domain_sizes()
        ));
    }
    Ok(p)
}

/// Checks `uploads` against the collection: exactly one per party, each passing
/// [`check_upload`], all under one key. Errors: what is wrong, for a 4xx.
pub fn check_uploads(v: &Vertical, uploads: &[SketchUpload]) -> Result<(), String> {
    let mut seen = vec![false; v.parties().len()];
    let mut key: Option<&str> = None;
    for u in uploads {
        let p = check_upload(v, u)?;
        if std::mem::replace(&mut seen[p], true) {
            return Err(format!("two sketch reports of party `{}`", u.party));
        }
        match key {
            Some(k) if k != u.report.key_fingerprint() => {
                return Err("sketch reports were made under different keys".into());
            }
            _ => key = Some(u.report.key_fingerprint()),
        }
    }
    if let Some(p) = seen.iter().position(|s| !s) {
        return Err(format!(
            "party `{}` has not uploaded its sketch report",
            v.parties()[p].name
        ));
    }
    Ok(())
}

/// Every cross-party pair's binned table from the checked `uploads` (module docs), in pair
/// order, and the pooled n̂. Errors: the uploads fail [`check_uploads`], or CarEst refuses
/// them (as a message).
pub fn cross_party_marginals(
    v: &Vertical,
    uploads: &[SketchUpload],
) -> Result<(Vec<CrossMarginal>, Estimate), String> {
    check_uploads(v, uploads)?;
    let mut by_party: Vec<&SketchReport> = Vec::with_capacity(uploads.len());
    for party in v.parties() {
        let u = uploads
            .iter()
            .find(|u| u.party == party.name)
            .expect("checked: one per party");
        by_party.push(&u.report);
    }
    let count = pooled_count(&by_party).map_err(|e| e.to_string())?;
    // Schema attribute → (party, position in the party).
    let d: usize = v.parties().iter().map(|p| p.attributes.len()).sum();
    let mut owner = vec![(0usize, 0usize); d];
    for (p, party) in v.parties().iter().enumerate() {
        for (i, &a) in party.attributes.iter().enumerate() {
            owner[a] = (p, i);
        }
    }
    let mut out = Vec::new();
    for a in 0..d {
        for b in a + 1..d {
            let ((pa, ia), (pb, ib)) = (owner[a], owner[b]);
            if pa == pb {
                continue;
            }
            let refs = [
                AttributeRef {
                    report: by_party[pa],
                    attribute: ia,
                },
                AttributeRef {
                    report: by_party[pb],
                    attribute: ib,
                },
            ];
            let m =
                estimate_marginal(&refs, count, Combine::Quantile).map_err(|e| e.to_string())?;
            let (rows, cols) = (m.domain_sizes[0] as usize, m.domain_sizes[1] as usize);
            let frequencies = m.frequencies();
            let variances = m.frequency_variances();
            let gain = pair_gain_from_cells(
                &frequencies,
                &variances,
                rows,
                cols,
                ((a as u64) << 32) | b as u64,
            );
            out.push(CrossMarginal {
                pair: (a, b),
                bins: vec![v.sketch_cuts(a), v.sketch_cuts(b)],
                frequencies,
                variances,
                gain,
            });
        }
    }
    Ok((out, count))
}

/// The observations of the cross-party tables whose pair is in `edges` (the fit observes
/// only kept pairs, as [`crate::protocols::CollectionProtocol::fit_table`] keeps LDP
/// tables), each in its bins; `tree` must hold every kept pair in a clique.
pub fn cross_observations(
    cross: &[CrossMarginal],
    edges: &BTreeSet<Edge>,
    tree: &JunctionTree,
) -> Vec<Observation> {
    cross
        .iter()
        .filter(|c| edges.contains(&c.pair))
        .filter(|c| {
            tree.cliques
                .iter()
                .any(|q| q.contains(&c.pair.0) && q.contains(&c.pair.1))
        })
        .map(|c| Observation {
            attrs: vec![c.pair.0, c.pair.1],
            values: c.frequencies.clone(),
            variances: c.variances.clone(),
            bins: if c.bins.iter().all(Vec::is_empty) {
                Vec::new()
            } else {
                c.bins.clone()
            },
            groups: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::sketch::{SketchKey, SketchParams, encode_party};
    use ldpsyn::Epsilon;
    use ldpsyn::schema::Schema;
    use ldpsyn::wire::{
        LocMrfBudget, Party, PartyAttribute, SketchSettings, VerticalEncoding, VerticalParams,
    };
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    /// Parties `x` (a: 3 values, b: 2) and `y` (c: 6 values, sketched in 3 bins).
    fn vertical() -> Vertical {
        let schema: Schema = serde_json::from_value(serde_json::json!({"attributes": [
            {"name": "a", "type": "categorical", "labels": ["0", "1", "2"]},
            {"name": "b", "type": "categorical", "labels": ["0", "1"]},
            {"name": "c", "type": "categorical", "labels": ["0", "1", "2", "3", "4", "5"]}]}))
        .unwrap();
        let party = |name: &str, attrs: &[&str]| Party {
            name: name.into(),
            attributes: attrs
                .iter()
                .map(|a| PartyAttribute {
                    name: (*a).into(),
                    epsilon: Epsilon::new(1.0).unwrap(),
                })
                .collect(),
            locmrf: Some(LocMrfBudget {
                epsilon: Epsilon::new(1.0).unwrap(),
                delta: 1e-6,
            }),
        };
        let params = VerticalParams {
            parties: vec![party("x", &["a", "b"]), party("y", &["c"])],
            encoding: VerticalEncoding::SketchLocmrf,
            sketch: Some(SketchSettings {
                repetitions: 64,
                bins: 3,
                ..SketchSettings::default()
            }),
            budget: None,
        };
        Vertical::new(&params, &schema).unwrap()
    }

    fn upload(
        v: &Vertical,
        p: usize,
        params: &SketchParams,
        sizes: &[u32],
        key: &SketchKey,
    ) -> SketchUpload {
        let mut rng = ChaCha12Rng::seed_from_u64(p as u64);
        let rows: Vec<(String, Vec<u32>)> = (0..200u32)
            .map(|i| (format!("id{i}"), sizes.iter().map(|&u| i % u).collect()))
            .collect();
        SketchUpload {
            party: v.parties()[p].name.clone(),
            report: encode_party(
                params,
                key,
                sizes,
                rows.iter().map(|(i, c)| (i, c)),
                &mut rng,
            )
            .unwrap(),
        }
    }

    /// Uploads that fit give one binned table per cross-party pair (a–c and b–c, not a–b),
    /// c in 3 bins; a missing or repeated party, another party's parameters, unbinned
    /// domains, another key or another encoding are refused with a message.
    #[test]
    fn uploads_are_checked_and_give_the_cross_party_pairs() {
        let v = vertical();
        let key = SketchKey::new(vec![7; 32]).unwrap();
        let (px, py) = (v.sketch_params(0).unwrap(), v.sketch_params(1).unwrap());
        let x = upload(&v, 0, &px, &[3, 2], &key);
        let y = upload(&v, 1, &py, &[3], &key);
        let (cross, n) = cross_party_marginals(&v, &[y.clone(), x.clone()]).unwrap();
        let pairs: Vec<Edge> = cross.iter().map(|c| c.pair).collect();
        assert_eq!(pairs, vec![(0, 2), (1, 2)]);
        assert_eq!(cross[0].bins, vec![vec![], vec![2, 4]]);
        assert_eq!(
            (cross[0].frequencies.len(), cross[1].variances.len()),
            (9, 6)
        );
        assert!((n.value - 200.0).abs() < 50.0, "{n:?}");
        let refused = |uploads: &[SketchUpload], needle: &str| {
            let e = check_uploads(&v, uploads).unwrap_err();
            assert!(e.contains(needle), "{e}");
        };
        refused(std::slice::from_ref(&x), "has not uploaded");
        refused(&[x.clone(), x.clone(), y.clone()], "two sketch reports");
        refused(
            &[upload(&v, 0, &py, &[3, 2], &key), y.clone()],
            "parameters are not the collection's",
        );
        refused(&[x.clone(), upload(&v, 1, &py, &[6], &key)], "sketch bins");
        let other = SketchKey::new(vec![8; 32]).unwrap();
        refused(
            &[x.clone(), upload(&v, 1, &py, &[3], &other)],
            "different keys",
        );
        let mut renamed = y.clone();
        renamed.party = "z".into();
        refused(&[x, renamed], "unknown party");
    }
}
