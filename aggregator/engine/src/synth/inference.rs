//! Exact marginals of a model by variable elimination over its conditionals.

use crate::EngineError;
use crate::domain::sizes::Domain;
use crate::numeric::index::projection_map;
use crate::synth::sampler::EstimatedConditional;

/// A potential table over sorted variables, row-major (a product of conditionals during
/// elimination; not the factor a device reports, `ldpsyn::factor`).
#[derive(Debug, Clone)]
struct Potential {
    vars: Vec<usize>,
    dims: Vec<usize>,
    values: Vec<f64>,
}

impl Potential {
    fn from_scope(scope: &[usize], scope_dims: &[usize], values: &[f64]) -> Self {
        let mut order: Vec<usize> = (0..scope.len()).collect();
        order.sort_by_key(|&i| scope[i]);
        let vars: Vec<usize> = order.iter().map(|&i| scope[i]).collect();
        let dims: Vec<usize> = order.iter().map(|&i| scope_dims[i]).collect();
        let map = projection_map(scope, scope_dims, &vars);
        let mut out = vec![0.0; values.len()];
        for (i, &t) in map.iter().enumerate() {
            out[t] = values[i];
        }
        Self {
            vars,
            dims,
            values: out,
        }
    }

    fn strides_in(&self, vars: &[usize]) -> Vec<usize> {
        // Stride of each of `vars` in this factor (0 if absent).
        vars.iter()
            .map(|v| match self.vars.iter().position(|x| x == v) {
                Some(i) => self.dims[i + 1..].iter().product(),
                None => 0,
            })
            .collect()
    }

    fn product(&self, other: &Potential, dims_of: &[usize]) -> Potential {
        let mut vars: Vec<usize> = self.vars.iter().chain(&other.vars).copied().collect();
        vars.sort_unstable();
        vars.dedup();
        let dims: Vec<usize> = vars.iter().map(|&v| dims_of[v]).collect();
        let cells: usize = dims.iter().product();
        let (sa, sb) = (self.strides_in(&vars), other.strides_in(&vars));
        let mut values = Vec::with_capacity(cells);
        let mut codes = vec![0usize; vars.len()];
        let (mut ia, mut ib) = (0usize, 0usize);
        for _ in 0..cells {
            values.push(self.values[ia] * other.values[ib]);
            for i in (0..codes.len()).rev() {
                codes[i] += 1;
                ia += sa[i];
                ib += sb[i];
                if codes[i] < dims[i] {
                    break;
                }
                ia -= sa[i] * dims[i];
                ib -= sb[i] * dims[i];
                codes[i] = 0;
            }
        }
        Potential { vars, dims, values }
    }

    fn sum_out(&self, v: usize) -> Potential {
        let keep: Vec<usize> = self.vars.iter().copied().filter(|&x| x != v).collect();
        let map = projection_map(&self.vars, &self.dims, &keep);
        let dims: Vec<usize> = keep
            .iter()
            .map(|k| self.dims[self.vars.iter().position(|x| x == k).expect("kept var")])
            .collect();
        let mut values = vec![0.0; dims.iter().product()];
        for (i, &t) in map.iter().enumerate() {
            values[t] += self.values[i];
        }
        Potential {
            vars: keep,
            dims,
            values,
        }
    }
}

/// Most cells of a table built while eliminating variables for a marginal query (2^24 f64,
/// 128 MiB). The answer's own size is bounded separately; this bounds the way to it, whose
/// tables can be far larger than the answer when the query's attributes are linked through
/// wide parts of the model.
pub const MAX_ELIMINATION_CELLS: usize = 1 << 24;

/// Exact marginal of `query` by variable elimination over the ancestors of `query`.
/// Errors: a table of more than `max_cells` cells would be built (nothing that large is
/// allocated).
pub(crate) fn infer(
    domain: &Domain,
    factors: &[EstimatedConditional],
    query: &[usize],
    max_cells: usize,
) -> Result<Vec<f64>, EngineError> {
    let dims = domain.sizes();
    // The variables a product of factors spans.
    let union = |fs: &mut dyn Iterator<Item = &Potential>| {
        let mut vars: Vec<usize> = fs.flat_map(|f| f.vars.iter().copied()).collect();
        vars.sort_unstable();
        vars.dedup();
        vars
    };
    let too_large = |vars: Vec<usize>| {
        let cells = domain.checked_cells(&vars);
        match cells {
            Some(c) if c <= max_cells => Ok(()),
            _ => Err(EngineError::BadAttributes(format!(
                "answering this marginal under the model needs an intermediate table of {} \
                 cells, above the bound of {max_cells}; ask for fewer attributes at a time, or \
                 for attributes the model links more directly",
                cells.map_or_else(|| "more than 2^64".to_owned(), |c| c.to_string())
            ))),
        }
    };
    let mut needed: Vec<bool> = vec![false; dims.len()];
    query.iter().for_each(|&a| needed[a] = true);
    let mut used = Vec::new();
    for f in factors.iter().rev() {
        if f.conditional.targets.iter().any(|&t| needed[t]) {
            f.conditional.parents.iter().for_each(|&p| needed[p] = true);
            f.conditional.targets.iter().for_each(|&t| needed[t] = true);
            used.push(Potential::from_scope(
                &f.conditional.scope(),
                &f.scope_dims,
                &f.conditional_table,
            ));
        }
    }
    let mut eliminate: Vec<usize> = (0..dims.len())
        .filter(|&a| needed[a] && !query.contains(&a))
        .collect();
    while !eliminate.is_empty() {
        // Greedy: the variable whose combined factor is smallest.
        let (pos, _) = eliminate
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let vars = union(&mut used.iter().filter(|f| f.vars.contains(&v)));
                (i, vars.iter().map(|&x| dims[x] as f64).product::<f64>())
            })
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .expect("non-empty");
        let v = eliminate.remove(pos);
        let (with, without): (Vec<Potential>, Vec<Potential>) =
            used.into_iter().partition(|f| f.vars.contains(&v));
        used = without;
        // The product of `with` spans the union of their variables: checked before building.
        too_large(union(&mut with.iter()))?;
        if let Some(first) = with.first() {
            let prod = with[1..]
                .iter()
                .fold(first.clone(), |acc, f| acc.product(f, dims));
            used.push(prod.sum_out(v));
        }
    }
    let unit = Potential {
        vars: Vec::new(),
        dims: Vec::new(),
        values: vec![1.0],
    };
    too_large(union(&mut used.iter()))?;
    let joint = used.iter().fold(unit, |acc, f| acc.product(f, dims));
    // Reorder to the query order.
    let map = projection_map(&joint.vars, &joint.dims, query);
    let mut out = vec![0.0; joint.values.len()];
    for (i, &t) in map.iter().enumerate() {
        out[t] += joint.values[i];
    }
    let s: f64 = out.iter().sum();
    if s > 0.0 {
        out.iter_mut().for_each(|v| *v /= s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{EstimatedConditional, infer};
    use crate::select::structure::Conditional;

    /// A → H → B with H of 50 values: the marginal of (A, B) has 4 cells, but eliminating H
    /// builds a table over (A, H, B) of 200. Under a bound of 100 the query is refused
    /// before that table exists; under 200 it is answered, and correctly.
    #[test]
    fn elimination_refuses_an_intermediate_table_above_the_bound() {
        let dims = [2, 50, 2];
        let factor = |targets: Vec<usize>, parents: Vec<usize>, table: Vec<f64>| {
            let conditional = Conditional { targets, parents };
            let scope_dims = conditional.scope().iter().map(|&a| dims[a]).collect();
            EstimatedConditional {
                conditional,
                scope_dims,
                joint: Vec::new(),
                conditional_table: table,
            }
        };
        // Pr(A) = (0.3, 0.7); H is uniform over the codes of A's parity; B is H's parity, so
        // B copies A.
        let pa = factor(vec![0], vec![], vec![0.3, 0.7]);
        let ph = factor(
            vec![1],
            vec![0],
            (0..100)
                .map(|i| {
                    if (i % 50) % 2 == i / 50 {
                        1.0 / 25.0
                    } else {
                        0.0
                    }
                })
                .collect(),
        );
        let pb = factor(
            vec![2],
            vec![1],
            (0..100)
                .map(|i| if (i / 2) % 2 == i % 2 { 1.0 } else { 0.0 })
                .collect(),
        );
        let factors = [pa, ph, pb];
        let e = infer(&dims.into(), &factors, &[0, 2], 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("200 cells") && e.contains("bound of 100"), "{e}");
        let m = infer(&dims.into(), &factors, &[0, 2], 200).unwrap();
        let want = [0.3, 0.0, 0.0, 0.7];
        assert!(
            m.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{m:?}"
        );
    }
}
