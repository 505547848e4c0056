//! A seeded Bayesian-network population generator with planted dependencies.
//!
//! [`BayesNet::standard`] has twelve attributes, categorical and binned numeric:
//!
//! | # | attribute | kind | values | parent |
//! |---|---|---|---|---|
//! | 0 | age | numeric 18–90, 8 bins | 8 | — |
//! | 1 | sex | categorical | 2 | — (independent of everything) |
//! | 2 | education | categorical | 5 | — |
//! | 3 | income | numeric 0–200000, 8 bins | 8 | education |
//! | 4 | hours | numeric 10–80, 7 bins | 7 | age |
//! | 5 | marital | categorical | 4 | age |
//! | 6 | region | categorical | 5 | — |
//! | 7 | language | categorical | 4 | region |
//! | 8 | smoker | categorical | 2 | — |
//! | 9 | health | categorical | 3 | smoker |
//! | 10 | vehicle | categorical | 3 | income |
//! | 11 | commute | numeric 0–120, 6 bins | 6 | vehicle |
//!
//! Every child copies a deterministic function of its parent (`⌊v·k_child/k_parent⌋`,
//! monotone) with probability `strength`, else draws from its own base distribution
//! (weights ∝ 1/(1+i), rotated per attribute). The planted edges form a forest of seven
//! edges; at the default strengths every planted edge has Cramér's V ≥ 0.5 (tested).

use ldpsyn::schema::Schema;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

use super::Population;

/// One node of the network.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Attribute name.
    pub name: String,
    /// Domain size.
    pub k: usize,
    /// Parent attribute index.
    pub parent: Option<usize>,
    /// Probability of copying the parent's mapped value.
    pub strength: f64,
    /// Base distribution (length k, sums to 1).
    pub base: Vec<f64>,
    /// Numeric `(min, max)` for a binned numeric attribute; `None` for categorical.
    pub numeric: Option<(f64, f64)>,
    /// Labels of a categorical attribute.
    pub labels: Vec<String>,
}

/// A Bayesian network whose nodes are in topological order.
#[derive(Debug, Clone, PartialEq)]
pub struct BayesNet {
    nodes: Vec<Node>,
    /// A node that [`BayesNet::observed`] leaves out (the latent class of a dense network).
    hidden: Option<usize>,
}

/// The shape of a [`BayesNet::random`] network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependence {
    /// A random forest: most attributes copy one earlier attribute.
    Sparse,
    /// A hidden class that every attribute copies: every pair depends.
    Dense,
}

fn base(k: usize, rotate: usize) -> Vec<f64> {
    let w: Vec<f64> = (0..k)
        .map(|i| 1.0 / (1.0 + ((i + rotate) % k) as f64))
        .collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

impl BayesNet {
    /// The documented twelve-attribute network (module docs).
    pub fn standard() -> Self {
        let cat =
            |name: &str, labels: &[&str], parent: Option<usize>, strength: f64, rot: usize| Node {
                name: name.into(),
                k: labels.len(),
                parent,
                strength,
                base: base(labels.len(), rot),
                numeric: None,
                labels: labels.iter().map(|s| s.to_string()).collect(),
            };
        let num = |name: &str,
                   min: f64,
                   max: f64,
                   k: usize,
                   parent: Option<usize>,
                   strength: f64,
                   rot: usize| Node {
            name: name.into(),
            k,
            parent,
            strength,
            base: base(k, rot),
            numeric: Some((min, max)),
            labels: Vec::new(),
        };
        Self {
            nodes: vec![
                num("age", 18.0, 90.0, 8, None, 0.0, 2),
                cat("sex", &["female", "male"], None, 0.0, 1),
                cat(
                    "education",
                    &["none", "school", "college", "bachelor", "graduate"],
                    None,
                    0.0,
                    1,
                ),
                num("income", 0.0, 200_000.0, 8, Some(2), 0.8, 0),
                num("hours", 10.0, 80.0, 7, Some(0), 0.8, 3),
                cat(
                    "marital",
                    &["single", "married", "divorced", "widowed"],
                    Some(0),
                    0.85,
                    0,
                ),
                cat(
                    "region",
                    &["north", "south", "east", "west", "center"],
                    None,
                    0.0,
                    0,
                ),
                cat("language", &["en", "es", "fr", "other"], Some(6), 0.8, 0),
                cat("smoker", &["no", "yes"], None, 0.0, 0),
                cat("health", &["good", "fair", "poor"], Some(8), 0.8, 0),
                cat("vehicle", &["none", "car", "bike"], Some(3), 0.8, 1),
                num("commute", 0.0, 120.0, 6, Some(10), 0.8, 0),
            ],
            hidden: None,
        }
    }

    /// A seeded random network for property tests (8–40 attributes and more): `d` attributes
    /// of 2–6 values with skewed base distributions (weights `u³`, `u` uniform on
    /// (0.05, 1]), in one of two shapes.
    /// - [`Dependence::Sparse`]: each attribute copies a random earlier one with probability
    ///   0.8 (a random forest), at a strength uniform on [0.2, 0.8].
    /// - [`Dependence::Dense`]: a hidden attribute of 4 values (node 0, left out by
    ///   [`BayesNet::observed`]) is the parent of every other at a strength uniform on
    ///   [0.25, 0.65]: every pair of the `d` observed attributes depends, as in a latent-class
    ///   population (NLTCS's disability level is one).
    ///
    /// Errors: none; `d = 0` gives an empty network (dense: the hidden node only).
    pub fn random(d: usize, dependence: Dependence, seed: u64) -> Self {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let skewed = |k: usize, rng: &mut ChaCha12Rng| -> Vec<f64> {
            let w: Vec<f64> = (0..k)
                .map(|_| rng.random_range(0.05f64..=1.0).powi(3))
                .collect();
            let s: f64 = w.iter().sum();
            w.into_iter().map(|x| x / s).collect()
        };
        let node =
            |i: usize, k: usize, parent: Option<usize>, strength: f64, base: Vec<f64>| Node {
                name: format!("x{i}"),
                k,
                parent,
                strength,
                base,
                numeric: None,
                labels: (0..k).map(|v| format!("v{v}")).collect(),
            };
        let mut nodes = Vec::with_capacity(d + 1);
        match dependence {
            Dependence::Sparse => {
                for i in 0..d {
                    let k = rng.random_range(2..=6);
                    let parent = (i > 0 && rng.random_bool(0.8)).then(|| rng.random_range(0..i));
                    let strength = rng.random_range(0.2..=0.8);
                    let base = skewed(k, &mut rng);
                    nodes.push(node(i, k, parent, strength, base));
                }
            }
            Dependence::Dense => {
                nodes.push(node(0, 4, None, 0.0, vec![0.25; 4]));
                for i in 1..=d {
                    let k = rng.random_range(2..=6);
                    let strength = rng.random_range(0.25..=0.65);
                    let base = skewed(k, &mut rng);
                    nodes.push(node(i, k, Some(0), strength, base));
                }
            }
        }
        Self {
            nodes,
            hidden: matches!(dependence, Dependence::Dense).then_some(0),
        }
    }

    /// The observed attributes of a sampled population: all but the hidden node of a
    /// [`Dependence::Dense`] network (which [`BayesNet::sample`] keeps, so that an arrival
    /// order can follow it: [`Population::drifted`]).
    pub fn observed(&self, population: &Population) -> Population {
        let keep: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| Some(i) != self.hidden)
            .collect();
        population.columns(&keep)
    }

    /// The nodes, in topological (= attribute) order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Domain sizes.
    pub fn dims(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| n.k).collect()
    }

    /// The planted edges `(parent, child)` with `parent < child`.
    pub fn planted_edges(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.parent.map(|p| (p.min(i), p.max(i))))
            .collect();
        v.sort_unstable();
        v
    }

    /// The schema of the generated records (numeric attributes as integer bins).
    pub fn schema(&self) -> Schema {
        let attrs: Vec<serde_json::Value> = self
            .nodes
            .iter()
            .map(|n| match n.numeric {
                Some((min, max)) => serde_json::json!({
                    "name": n.name, "type": "numeric", "min": min, "max": max,
                    "bins": n.k, "integer": true}),
                None => {
                    serde_json::json!({"name": n.name, "type": "categorical", "labels": n.labels})
                }
            })
            .collect();
        // The generated JSON satisfies every schema rule (unique names, ≥ 2 values).
        serde_json::from_value(serde_json::json!({ "attributes": attrs }))
            .expect("the standard network's schema is valid")
    }

    /// `n` records by ancestral sampling from `seed`.
    pub fn sample(&self, n: usize, seed: u64) -> Population {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let d = self.nodes.len();
        let mut codes = vec![0u32; n * d];
        for r in 0..n {
            for (i, node) in self.nodes.iter().enumerate() {
                let v = match node.parent {
                    Some(p) if rng.random_bool(node.strength) => {
                        let pv = codes[r * d + p] as usize;
                        pv * node.k / self.nodes[p].k
                    }
                    _ => {
                        let u = rng.random::<f64>();
                        let mut acc = 0.0;
                        let mut out = node.k - 1;
                        for (j, &w) in node.base.iter().enumerate() {
                            acc += w;
                            if u < acc {
                                out = j;
                                break;
                            }
                        }
                        out
                    }
                };
                codes[r * d + i] = v as u32;
            }
        }
        Population {
            dims: self.dims(),
            codes,
        }
    }
}

/// Cramér's V of attributes `a`, `b` in a population.
pub fn cramers_v(pop: &Population, a: usize, b: usize) -> f64 {
    let (ka, kb) = (pop.dims()[a], pop.dims()[b]);
    let mut c = vec![0.0; ka * kb];
    for row in pop.rows() {
        c[row[a] as usize * kb + row[b] as usize] += 1.0;
    }
    let n = pop.len() as f64;
    let ra: Vec<f64> = (0..ka)
        .map(|i| c[i * kb..(i + 1) * kb].iter().sum())
        .collect();
    let rb: Vec<f64> = (0..kb)
        .map(|j| (0..ka).map(|i| c[i * kb + j]).sum())
        .collect();
    let mut chi = 0.0;
    for i in 0..ka {
        for j in 0..kb {
            let e = ra[i] * rb[j] / n;
            if e > 0.0 {
                chi += (c[i * kb + j] - e).powi(2) / e;
            }
        }
    }
    (chi / (n * (ka.min(kb) as f64 - 1.0))).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_edges_are_strong_and_others_weak() {
        let net = BayesNet::standard();
        let pop = net.sample(100_000, 5);
        assert_eq!(net.schema().domain_sizes(), net.dims());
        for (a, b) in net.planted_edges() {
            let v = cramers_v(&pop, a, b);
            assert!(v >= 0.5, "({a}, {b}): V = {v}");
        }
        // sex is independent of everything.
        for b in 0..12 {
            if b != 1 {
                assert!(cramers_v(&pop, 1, b) < 0.03);
            }
        }
        assert_eq!(net.sample(10, 9), net.sample(10, 9));
    }

    /// A dense network's observed attributes all depend on one another through the hidden
    /// class, a sparse one's only along its forest; both are seeded.
    #[test]
    fn random_networks_have_the_shape_asked_for() {
        let dense = BayesNet::random(10, Dependence::Dense, 3);
        let full = dense.sample(20_000, 4);
        let pop = dense.observed(&full);
        assert_eq!(pop.d(), 10);
        assert_eq!(pop.dims(), &dense.dims()[1..]);
        for a in 0..10 {
            for b in a + 1..10 {
                assert!(cramers_v(&pop, a, b) > 0.05, "({a}, {b})");
            }
        }
        let sparse = BayesNet::random(12, Dependence::Sparse, 3);
        let pop = sparse.sample(20_000, 4);
        assert_eq!(sparse.observed(&pop), pop);
        let planted = sparse.planted_edges();
        assert!(!planted.is_empty() && planted.len() < 12, "{planted:?}");
        // Attributes in different trees of the forest are independent.
        let tree = |mut a: usize| {
            while let Some(p) = sparse.nodes()[a].parent {
                a = p;
            }
            a
        };
        for a in 0..12 {
            for b in a + 1..12 {
                if tree(a) != tree(b) {
                    assert!(cramers_v(&pop, a, b) < 0.05, "({a}, {b})");
                }
            }
        }
        assert_eq!(BayesNet::random(12, Dependence::Sparse, 3), sparse);
    }
}
