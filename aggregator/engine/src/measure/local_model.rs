//! A party's local model of its own attributes (LocMRF; VertiMRF, "Differentially Private
//! Vertical Federated Data Synthesis", §4.1 and Algorithm 2 line 1): what a party of an
//! `fo+locmrf` vertical collection uploads beside its GRR reports.
//!
//! The party is the curator of its own columns, so it measures marginals of its attributes
//! under central DP at a fraction of its budget ([`ldpsyn::wire::LocMrfBudget`]), with
//! the engine's central select–measure loop ([`crate::central`]: every 1-way, then marginals
//! chosen by the exponential mechanism by their expected contribution net of the noise they
//! add, measured with the discrete Gaussian mechanism, zCDP accounting converted exactly to
//! (ε, δ) by Canonne–Kamath–Steinke's Corollary 13). It releases the noisy marginals with
//! their noise, its attribute graph and its accounting: nothing else.
//!
//! [`LocalModel`] has no public constructor and no field that holds a record, a code or a
//! record id: a party's code gets one only from [`crate::central::measure_local_model`]. Its
//! fields cannot be set from outside:
//!
//! ```compile_fail
//! use ldpsyn_engine::measure::local_model::LocalModel;
//! // Raw values cannot be put in a local model: no constructor takes them, the fields are private.
//! let m = LocalModel { party: "bank".into(), measurements: vec![], graph: vec![] };
//! ```
//!
//! ```compile_fail
//! use ldpsyn_engine::measure::local_model::LocalMeasurement;
//! // Nor can a measurement be built from exact counts or a set of record ids.
//! let m = LocalMeasurement { attrs: vec![0], counts: vec![12.0, 30.0], sigma: 0.0 };
//! ```
//!
//! (It is `Deserialize` so that the server can read uploads; the server checks every upload
//! against the collection's config, [`LocalModel::check`]. That the noise was added is the
//! party's machine's doing, as in the paper: the server cannot tell noisy counts from exact
//! ones.)
//!
//! **In the global fit** ([`crate::pipeline`]) a measurement is a measurement: each noisy
//! marginal enters as an observation of the frequencies `counts / n̂` with per-cell variance
//! `σ² / n̂²` (n̂: the party's noisy record count, [`LocalModel::noisy_records`]), beside the
//! LDP tables, and the party's graph is part of the model graph.

use std::collections::BTreeSet;

use ldpsyn::wire::LocMrfBudget;
use serde::{Deserialize, Serialize};

use crate::graph::Edge;

/// Most measurements in one local model: a bound on uploads, above what the central loop
/// releases for a party of 64 attributes (its 64 1-ways and 16 rounds per attribute,
/// `crate::central::ROUNDS_PER_ATTRIBUTE`, 1,088).
pub const MAX_LOCAL_MEASUREMENTS: usize = 2048;

/// Most cells of one measured marginal of a local model: a bound on uploads, ten times the
/// central loop's clique cap (`crate::select::model_graph::MAX_CLIQUE_CELLS`, 100,000).
pub const MAX_LOCAL_CELLS: usize = 1_000_000;

/// One noisy marginal of a party's attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalMeasurement {
    /// Schema indices of the marginal's attributes (all the party's, distinct).
    attrs: Vec<usize>,
    /// Noisy counts, row-major in `attrs` order (the discrete Gaussian's output: integers,
    /// possibly negative).
    counts: Vec<f64>,
    /// Standard deviation of the noise on each count (> 0).
    sigma: f64,
}

impl LocalMeasurement {
    /// Schema indices of the attributes, in the order of the cells.
    pub fn attrs(&self) -> &[usize] {
        &self.attrs
    }

    /// Noisy counts, row-major in [`LocalMeasurement::attrs`] order.
    pub fn counts(&self) -> &[f64] {
        &self.counts
    }

    /// Standard deviation of the Gaussian noise on each count (counts).
    pub fn sigma(&self) -> f64 {
        self.sigma
    }
}

/// The privacy accounting of a local model: the budget it was measured under and the ρ of
/// zero-concentrated DP it spent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalPrivacy {
    /// ε of the (ε, δ)-DP guarantee (the party's `locmrf.epsilon`).
    pub epsilon: f64,
    /// δ of the guarantee (`locmrf.delta`).
    pub delta: f64,
    /// The zCDP ρ that implies (ε, δ) ([`crate::central::rho_for`]).
    pub rho: f64,
    /// ρ spent over every selection and measurement (≤ `rho`).
    pub rho_spent: f64,
}

/// A party's local model (module docs): its noisy marginals, its attribute graph and its
/// accounting. JSON: the body of `POST /v1/collections/{id}/parties/{party}/model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalModel {
    /// The party's name.
    party: String,
    /// Noisy marginals in release order (every 1-way of the party first).
    measurements: Vec<LocalMeasurement>,
    /// The party's attribute graph: pairs `(a, b)`, `a < b`, of schema indices, chordal,
    /// every measured set complete in it.
    graph: Vec<Edge>,
    /// The accounting.
    privacy: LocalPrivacy,
}

impl LocalModel {
    /// A local model from the central loop's released marginals `(attrs, counts, sigma)`
    /// (schema indices), the party's `graph` and its accounting. Crate-private: only
    /// [`crate::central::measure_local_model`] builds one.
    pub(crate) fn from_measured(
        party: String,
        measurements: Vec<(Vec<usize>, Vec<f64>, f64)>,
        graph: Vec<Edge>,
        privacy: LocalPrivacy,
    ) -> Self {
        Self {
            party,
            measurements: measurements
                .into_iter()
                .map(|(attrs, counts, sigma)| LocalMeasurement {
                    attrs,
                    counts,
                    sigma,
                })
                .collect(),
            graph,
            privacy,
        }
    }

    /// The party's name.
    pub fn party(&self) -> &str {
        &self.party
    }

    /// The noisy marginals, in release order.
    pub fn measurements(&self) -> &[LocalMeasurement] {
        &self.measurements
    }

    /// The party's attribute graph (pairs of schema indices, `a < b`).
    pub fn graph(&self) -> &[Edge] {
        &self.graph
    }

    /// The privacy accounting.
    pub fn privacy(&self) -> &LocalPrivacy {
        &self.privacy
    }

    /// The party's noisy record count: the precision-weighted mean of its measurements'
    /// totals (a marginal of `c` cells at noise σ has a total of variance `c σ²`); at least 1.
    /// A function of the noisy measurements only.
    pub fn noisy_records(&self) -> f64 {
        let (num, den) = self.measurements.iter().fold((0.0, 0.0), |(n, d), m| {
            let var = m.counts.len() as f64 * m.sigma * m.sigma;
            (n + m.counts.iter().sum::<f64>() / var, d + 1.0 / var)
        });
        if den > 0.0 { (num / den).max(1.0) } else { 1.0 }
    }

    /// Checks an upload against the collection's party `name`, holding the schema attributes
    /// `attributes` with the LocMRF budget `budget`: the model names that party, which has a
    /// budget; its accounting states that budget, its ρ is the one that implies it
    /// ([`crate::numeric::zcdp::rho_for`]) and it spends at most that; it has
    /// 1..=[`MAX_LOCAL_MEASUREMENTS`] measurements, each over distinct attributes of the
    /// party with one finite count per cell (at most [`MAX_LOCAL_CELLS`]) and a finite σ > 0,
    /// and every 1-way of the party; its graph's pairs are of the party's attributes, `a < b`,
    /// distinct, and make every measured set complete. Errors: what is wrong, for a 4xx.
    pub fn check(
        &self,
        name: &str,
        attributes: &[usize],
        budget: Option<LocMrfBudget>,
        schema_dims: &[usize],
    ) -> Result<(), String> {
        if self.party != name {
            return Err(format!(
                "the model names party `{}`, uploaded for party `{name}`",
                self.party
            ));
        }
        let budget =
            budget.ok_or_else(|| format!("party `{name}` has no `locmrf` budget in the config"))?;
        let pr = &self.privacy;
        let same = |x: f64, y: f64| (x - y).abs() <= 1e-9 * y.abs().max(1e-300);
        if !same(pr.epsilon, budget.epsilon.get()) || !same(pr.delta, budget.delta) {
            return Err(format!(
                "the model states (ε, δ) = ({}, {}); the config gives party `{name}` ({}, {})",
                pr.epsilon, pr.delta, budget.epsilon, budget.delta
            ));
        }
        let rho = crate::numeric::zcdp::rho_for(budget.epsilon.get(), budget.delta)
            .ok_or_else(|| format!("party `{name}`: invalid budget"))?;
        if !(pr.rho.is_finite() && pr.rho_spent.is_finite() && same(pr.rho, rho))
            || pr.rho_spent > rho * (1.0 + 1e-9)
            || pr.rho_spent <= 0.0
        {
            return Err(format!(
                "the model's ρ {} / spent {} do not match its budget's ρ {rho}",
                pr.rho, pr.rho_spent
            ));
        }
        if self.measurements.is_empty() || self.measurements.len() > MAX_LOCAL_MEASUREMENTS {
            return Err(format!(
                "a local model has 1..={MAX_LOCAL_MEASUREMENTS} measurements (got {})",
                self.measurements.len()
            ));
        }
        let mine: BTreeSet<usize> = attributes.iter().copied().collect();
        let mut one_ways = BTreeSet::new();
        for (i, m) in self.measurements.iter().enumerate() {
            let distinct: BTreeSet<usize> = m.attrs.iter().copied().collect();
            if m.attrs.is_empty() || distinct.len() != m.attrs.len() || !distinct.is_subset(&mine) {
                return Err(format!(
                    "measurement {i}: `attrs` must be distinct attributes of party `{name}`"
                ));
            }
            let cells = m
                .attrs
                .iter()
                .try_fold(1usize, |acc, &a| acc.checked_mul(schema_dims[a]))
                .filter(|&c| c <= MAX_LOCAL_CELLS);
            if cells != Some(m.counts.len()) || m.counts.iter().any(|c| !c.is_finite()) {
                return Err(format!(
                    "measurement {i}: `counts` must hold one finite count per cell of its \
                     attributes (at most {MAX_LOCAL_CELLS})"
                ));
            }
            if !(m.sigma.is_finite() && m.sigma > 0.0) {
                return Err(format!("measurement {i}: `sigma` must be finite and > 0"));
            }
            if let [a] = m.attrs[..] {
                one_ways.insert(a);
            }
        }
        if one_ways != mine {
            return Err(format!(
                "a local model measures every 1-way of party `{name}`"
            ));
        }
        let edges: BTreeSet<Edge> = self.graph.iter().copied().collect();
        if edges.len() != self.graph.len()
            || edges
                .iter()
                .any(|&(a, b)| a >= b || !mine.contains(&a) || !mine.contains(&b))
        {
            return Err(format!(
                "`graph` must be distinct pairs (a, b), a < b, of party `{name}`'s attributes"
            ));
        }
        for (i, m) in self.measurements.iter().enumerate() {
            for (j, &a) in m.attrs.iter().enumerate() {
                for &b in &m.attrs[j + 1..] {
                    if !edges.contains(&(a.min(b), a.max(b))) {
                        return Err(format!(
                            "measurement {i}: its attributes must be complete in `graph`"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::central::{LocalModelError, measure_local_model};
    use crate::protocols::vertical::Vertical;
    use ldpsyn::schema::Schema;
    use ldpsyn::wire::{Protocol, VerticalParams};
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    fn schema() -> Schema {
        serde_json::from_str(
            r#"{"attributes": [
              {"name": "a", "type": "categorical", "labels": ["0", "1", "2"]},
              {"name": "b", "type": "categorical", "labels": ["0", "1"]},
              {"name": "c", "type": "categorical", "labels": ["0", "1", "2", "3"]},
              {"name": "d", "type": "categorical", "labels": ["0", "1"]}]}"#,
        )
        .unwrap()
    }

    fn vertical(with_budget: bool) -> Vertical {
        let locmrf = if with_budget {
            r#", "locmrf": {"epsilon": 1.0, "delta": 1e-6}"#
        } else {
            ""
        };
        let p: Protocol = serde_json::from_str(&format!(
            r#"{{"protocol": "vertical", "encoding": "fo+locmrf", "parties": [
              {{"name": "bank", "attributes": [{{"name": "c", "epsilon": 1}}, {{"name": "a", "epsilon": 1}}, {{"name": "b", "epsilon": 1}}]{locmrf}}},
              {{"name": "shop", "attributes": [{{"name": "d", "epsilon": 1}}], "locmrf": {{"epsilon": 0.5, "delta": 1e-6}}}}]}}"#
        ))
        .unwrap();
        let Protocol::Vertical(params): Protocol = p else {
            unreachable!()
        };
        let _: &VerticalParams = &params;
        Vertical::new(&params, &schema()).unwrap()
    }

    /// Bank's rows (party order c, a, b): c depends on a.
    fn bank_codes(n: usize, rng: &mut ChaCha12Rng) -> Vec<u32> {
        use rand::Rng;
        let mut out = Vec::with_capacity(3 * n);
        for _ in 0..n {
            let a = rng.random_range(0..3u32);
            let c = if rng.random_bool(0.8) { a } else { 3 };
            out.extend([c, a, rng.random_range(0..2u32)]);
        }
        out
    }

    /// The model maps the party's columns to schema indices, spends exactly its ρ, measures
    /// every 1-way, passes its own check, and survives JSON.
    #[test]
    fn measured_model_is_in_schema_terms_and_checks() {
        let v = vertical(true);
        let dims = schema().domain_sizes();
        let mut rng = ChaCha12Rng::seed_from_u64(4);
        let codes = bank_codes(5000, &mut rng);
        let m = measure_local_model(&v.parties()[0], &dims, &codes, 3, &mut rng).unwrap();
        assert_eq!(m.party(), "bank");
        let ones: Vec<usize> = m.measurements()[..3].iter().map(|x| x.attrs()[0]).collect();
        assert_eq!(ones, vec![2, 0, 1]);
        assert!(
            m.measurements()
                .iter()
                .all(|x| x.attrs().iter().all(|a| *a <= 2))
        );
        // The accounting: all of ρ spent, and ρ-zCDP implies the budget's (ε, δ) exactly.
        assert!((m.privacy().rho_spent - m.privacy().rho).abs() < 1e-9 * m.privacy().rho);
        let pr = m.privacy();
        assert_eq!((pr.epsilon, pr.delta), (1.0, 1e-6));
        let implied = crate::numeric::zcdp::delta_for(pr.rho, pr.epsilon);
        assert!(implied <= 1e-6 && implied > 0.99e-6, "{implied}");
        assert!(
            m.graph().contains(&(0, 2)),
            "the dependent pair: {:?}",
            m.graph()
        );
        assert!((m.noisy_records() - 5000.0).abs() < 200.0);
        let bank = &v.parties()[0];
        let check = |m: &LocalModel| m.check(&bank.name, &bank.attributes, bank.locmrf, &dims);
        check(&m).unwrap();
        let back: LocalModel = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        // The check refuses another party, a changed budget, a foreign attribute, a missing
        // graph edge, a wrong cell count and a zero σ.
        let shop = &v.parties()[1];
        assert!(
            back.check(&shop.name, &shop.attributes, shop.locmrf, &dims)
                .is_err()
        );
        let mut bad = m.clone();
        bad.privacy.epsilon = 2.0;
        assert!(check(&bad).is_err());
        let mut bad = m.clone();
        bad.measurements[0].attrs = vec![3];
        assert!(check(&bad).is_err());
        let mut bad = m.clone();
        bad.graph.clear();
        assert!(bad.measurements.len() == 3 || check(&bad).is_err());
        let mut bad = m.clone();
        bad.measurements[1].counts.pop();
        assert!(check(&bad).is_err());
        let mut bad = m.clone();
        bad.measurements[2].sigma = 0.0;
        assert!(check(&bad).is_err());
        assert!(matches!(
            measure_local_model(&vertical(false).parties()[0], &dims, &codes, 3, &mut rng),
            Err(LocalModelError::NoBudget(_))
        ));
    }

    /// The Gaussian measurements are unbiased: over repeated measurements of one table the
    /// mean noisy 1-way count of every cell is within 4 standard errors of the exact count,
    /// and the noise's spread matches the stated σ within 10% (1-ways only: the whole budget
    /// on them, no selection rounds).
    #[test]
    fn gaussian_measurements_are_unbiased_with_their_stated_sigma() {
        let v = vertical(true);
        let dims = schema().domain_sizes();
        let mut rng = ChaCha12Rng::seed_from_u64(11);
        let codes = bank_codes(2000, &mut rng);
        // Exact 1-way of attribute a (schema 0, the party's column 1).
        let mut exact = [0.0f64; 3];
        for row in codes.chunks_exact(3) {
            exact[row[1] as usize] += 1.0;
        }
        let trials = 300;
        let (mut sum, mut sq) = ([0.0f64; 3], [0.0f64; 3]);
        let mut sigma = 0.0;
        for _ in 0..trials {
            let m = measure_local_model(&v.parties()[0], &dims, &codes, 1, &mut rng).unwrap();
            let one = m.measurements().iter().find(|x| x.attrs() == [0]).unwrap();
            sigma = one.sigma();
            for (c, &y) in one.counts().iter().enumerate() {
                sum[c] += y - exact[c];
                sq[c] += (y - exact[c]).powi(2);
            }
        }
        let t = trials as f64;
        for c in 0..3 {
            let mean = sum[c] / t;
            let sd = (sq[c] / t - mean * mean).sqrt();
            assert!(
                mean.abs() < 4.0 * sigma / t.sqrt(),
                "cell {c}: bias {mean}, σ {sigma}"
            );
            assert!(
                (sd / sigma - 1.0).abs() < 0.1,
                "cell {c}: sd {sd} vs σ {sigma}"
            );
        }
    }
}
