//! What a model can answer, for the analyst: per attribute pair whether it was measured and
//! whether the model carries it (an edge, a path, or independence), per declared target how
//! much of it the model explains, and warnings written for a person. Computed from the
//! private model alone (post-processing: no budget).

use serde::{Deserialize, Serialize};

use crate::graph::Edge;
use crate::numeric::info::mutual_information;
use crate::synth::model::Model;

/// Largest joint (cells) of a target and its neighbours whose entropy is computed.
const MAX_TARGET_JOINT_CELLS: usize = 1 << 22;

/// How the model carries one attribute pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Carried {
    /// An edge of the model's graph: the pair's own dependence is fitted.
    Edge,
    /// No edge, but a path of edges joins them: their dependence is what the path implies.
    Path,
    /// Different components of the graph: the synthetic data has them independent.
    Independent,
}

/// One attribute pair of the fitness report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairFitness {
    /// Attribute indices, `a < b`.
    pub a: usize,
    /// Second attribute.
    pub b: usize,
    /// How the model carries the pair.
    pub carried: Carried,
    /// Reports of the tables that measured the pair (every round; 0: never measured).
    pub reports: u64,
    /// Cells of the finest table that measured it (its resolution; 0: never measured).
    pub cells: u64,
}

/// A declared target and what the model says of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetFitness {
    /// Attribute index.
    pub attribute: usize,
    /// Its name.
    pub name: String,
    /// Its neighbours in the model graph (names): given them, the model makes it
    /// independent of every other attribute.
    pub neighbours: Vec<String>,
    /// Entropy of its marginal under the model, nats (in the model's working bins).
    pub entropy: f64,
    /// Its entropy given its neighbours under the model, nats (`None`: their joint exceeds
    /// 2^22 cells).
    pub conditional_entropy: Option<f64>,
    /// `1 − conditional/marginal entropy`: the share of its uncertainty the model explains
    /// from the other attributes (0 without neighbours).
    pub explained: Option<f64>,
}

/// One warning of the fitness report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitnessWarning {
    /// Stable kind: `no-edges`, `target-independent`, `attribute-independent`,
    /// `fewer-people`.
    pub kind: String,
    /// For a person: what the synthetic data cannot answer, and why.
    pub message: String,
}

/// The fitness report of a model ([`fitness`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitnessReport {
    /// Every attribute pair, `(0, 1), (0, 2), …`.
    pub pairs: Vec<PairFitness>,
    /// Every declared target.
    pub targets: Vec<TargetFitness>,
    /// What the data cannot answer; empty when nothing is to be said.
    pub warnings: Vec<FitnessWarning>,
}

/// How many people a collection planned for and how many it had: the model is warned about
/// when it was finalized with fewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct People {
    /// Reports the model was fitted from.
    pub reports: u64,
    /// The collection's `target_users`.
    pub planned: u64,
}

fn entropy(p: &[f64]) -> f64 {
    let total: f64 = p.iter().map(|x| x.max(0.0)).sum();
    if total <= 0.0 {
        return 0.0;
    }
    p.iter()
        .map(|&x| x.max(0.0) / total)
        .filter(|&x| x > 0.0)
        .map(|x| -x * x.ln())
        .sum()
}

fn list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => format!("`{one}`"),
        [rest @ .., last] => format!(
            "{} and `{last}`",
            rest.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The fitness report of `model` over attributes `names` (schema order) with declared
/// `targets` (indices); `people` for a final model (a provisional one is partial by
/// design). Panics if `names` does not have one name per attribute.
pub fn fitness(
    model: &Model,
    names: &[String],
    targets: &[usize],
    people: Option<People>,
) -> FitnessReport {
    let d = model.dims().len();
    assert_eq!(names.len(), d, "one name per attribute");
    let edges: Vec<Edge> = model.graph_edges();
    // Connected components of the graph (union–find).
    let mut root: Vec<usize> = (0..d).collect();
    fn find(root: &mut [usize], mut x: usize) -> usize {
        while root[x] != x {
            root[x] = root[root[x]];
            x = root[x];
        }
        x
    }
    for &(a, b) in &edges {
        let (ra, rb) = (find(&mut root, a), find(&mut root, b));
        root[ra] = rb;
    }
    let schema_dims = model.schema_dims().to_vec();
    let rounds = model.rounds();
    let mut pairs = Vec::with_capacity(d * d.saturating_sub(1) / 2);
    for a in 0..d {
        for b in a + 1..d {
            let carried = if edges.contains(&(a, b)) {
                Carried::Edge
            } else if find(&mut root, a) == find(&mut root, b) {
                Carried::Path
            } else {
                Carried::Independent
            };
            let (mut reports, mut cells) = (0u64, 0u64);
            for f in rounds.iter().flat_map(|r| &r.factors) {
                let (Some(i), Some(j)) = (
                    f.factor.iter().position(|&x| x == a),
                    f.factor.iter().position(|&x| x == b),
                ) else {
                    continue;
                };
                let size = |k: usize, attr: usize| match f.bins.get(k) {
                    Some(cuts) if !cuts.is_empty() => cuts.len() as u64 + 1,
                    _ => schema_dims[attr] as u64,
                };
                reports += f.reports;
                cells = cells.max(size(i, a) * size(j, b));
            }
            pairs.push(PairFitness {
                a,
                b,
                carried,
                reports,
                cells,
            });
        }
    }
    let neighbours = |t: usize| -> Vec<usize> {
        let mut n: Vec<usize> = edges
            .iter()
            .filter_map(|&(a, b)| {
                if a == t {
                    Some(b)
                } else if b == t {
                    Some(a)
                } else {
                    None
                }
            })
            .collect();
        n.sort_unstable();
        n
    };
    let mut warnings = Vec::new();
    if edges.is_empty() && d > 1 {
        warnings.push(FitnessWarning {
            kind: "no-edges".into(),
            message: "the model has no edges: every column of the synthetic data is independent \
                      of every other, so it keeps each column's distribution but no \
                      relationship between columns"
                .into(),
        });
    }
    let mut target_reports = Vec::new();
    for &t in targets {
        let near = neighbours(t);
        let marginal = model
            .working_marginal(&[t])
            .map(|(_, p)| p)
            .unwrap_or_default();
        let h = entropy(&marginal);
        let mut attrs = vec![t];
        attrs.extend(&near);
        let cells: usize = attrs
            .iter()
            .map(|&a| model.dims()[a])
            .try_fold(1usize, |acc, k| acc.checked_mul(k))
            .unwrap_or(usize::MAX);
        let conditional = if near.is_empty() {
            Some(h)
        } else if cells <= MAX_TARGET_JOINT_CELLS {
            model.working_marginal(&attrs).ok().map(|(_, joint)| {
                // H(T | N) = H(T) − I(T; N); T is the first (slowest) axis, in working bins.
                let k = model.dims()[t];
                (h - mutual_information(&joint, k, joint.len() / k.max(1))).max(0.0)
            })
        } else {
            None
        };
        let explained = conditional.map(|c| if h > 0.0 { 1.0 - c / h } else { 0.0 });
        if near.is_empty() {
            warnings.push(FitnessWarning {
                kind: "target-independent".into(),
                message: format!(
                    "target `{}` has no edge in the model: the synthetic data has it \
                     independent of every other column, so a model trained on it to predict \
                     `{}` will not beat chance",
                    names[t], names[t]
                ),
            });
        }
        target_reports.push(TargetFitness {
            attribute: t,
            name: names[t].clone(),
            neighbours: near.iter().map(|&n| names[n].clone()).collect(),
            entropy: h,
            conditional_entropy: conditional,
            explained,
        });
    }
    if !edges.is_empty() {
        let alone: Vec<&str> = (0..d)
            .filter(|a| !targets.contains(a) && neighbours(*a).is_empty())
            .map(|a| names[a].as_str())
            .collect();
        if !alone.is_empty() {
            warnings.push(FitnessWarning {
                kind: "attribute-independent".into(),
                message: format!(
                    "{} {} no edge: the synthetic data has {} independent of every other \
                     column (its own distribution is kept)",
                    list(&alone),
                    if alone.len() == 1 { "has" } else { "have" },
                    if alone.len() == 1 { "it" } else { "each" },
                ),
            });
        }
    }
    if let Some(p) = people
        && p.reports < p.planned
    {
        warnings.push(FitnessWarning {
            kind: "fewer-people".into(),
            message: format!(
                "finalized with {} reports, {:.0}% of the {} people the collection was planned \
                 for: its rounds were sized for {}, so the rounds that came later measured \
                 fewer people or none, and the model has fewer edges than the design aimed at",
                p.reports,
                100.0 * p.reports as f64 / p.planned.max(1) as f64,
                p.planned,
                p.planned
            ),
        });
    }
    FitnessReport {
        pairs,
        targets: target_reports,
        warnings,
    }
}
