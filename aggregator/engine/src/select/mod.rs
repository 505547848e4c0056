//! Layer 4: which dependencies the model keeps: a pair's expected gain ([`gain`]), the model
//! graph within a clique cap ([`model_graph`]) and the conditionals of its junction tree
//! ([`structure`], PrivIncr Algorithm 2).

pub(crate) mod gain;

/// Weight of the 2-way marginal of `a` and `b` among `d` attributes when `targets` (indices)
/// are declared: 1, or, for a pair holding a target, `1 + P/T` with `T` such pairs and `P`
/// the others, so that the target pairs weigh, beyond their own share, as much as every
/// other pair together (the declared question, "the target given the rest", counts as much
/// as the rest of the table). A workload-weighted error as AIM's (McKenna, Mullins, Sheldon,
/// Miklau, "AIM: An Adaptive and Iterative Mechanism for Differentially Private Synthetic
/// Data", PVLDB 15(11), 2022, §4), with the weights set by the declaration, not tuned.
pub fn target_pair_weight(d: usize, targets: &[usize], a: usize, b: usize) -> f64 {
    if a == b || !(targets.contains(&a) || targets.contains(&b)) {
        return 1.0;
    }
    let t = targets.len().min(d);
    let pairs = d * d.saturating_sub(1) / 2;
    let free = (d - t) * (d - t).saturating_sub(1) / 2;
    let target_pairs = (pairs - free).max(1);
    1.0 + free as f64 / target_pairs as f64
}
pub(crate) mod model_graph;
pub mod structure;
