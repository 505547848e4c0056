//! Streaming synthesis: forward (ancestral) sampling through the conditionals in
//! junction-tree order (Algorithm 3 line 8 of PrivIncr): the root clique, then each clique's
//! new attributes given its separator. Rows stream in constant memory; the same model and
//! seed give the same rows (ChaCha12).

use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};

use crate::domain::sizes::Domain;
use crate::fit::joint::JointSource;
use crate::select::structure::Conditional;
use crate::synth::recovery::{Expansion, Recovery};
use crate::synth::samprivsyn::SamPrivSynModel;

/// A conditional with its estimated tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EstimatedConditional {
    /// Which conditional.
    pub conditional: Conditional,
    /// Domain sizes of its scope (`parents ++ targets`).
    pub scope_dims: Vec<usize>,
    /// The fitted joint over the scope (row-major, sums to 1).
    pub joint: Vec<f64>,
    /// `Pr(targets | parents)` (row-major over the scope; each parent block sums to 1).
    pub conditional_table: Vec<f64>,
}

impl EstimatedConditional {
    pub(crate) fn new(conditional: Conditional, domain: &Domain, source: &dyn JointSource) -> Self {
        let scope = conditional.scope();
        let scope_dims = domain.project(&scope);
        let joint = source.joint(&scope);
        let tc = domain.table_len(&conditional.targets);
        let pc = joint.len() / tc;
        // Marginal of the targets, for parent configurations with no mass.
        let mut tmarg = vec![0.0; tc];
        for (i, v) in joint.iter().enumerate() {
            tmarg[i % tc] += v;
        }
        let ts: f64 = tmarg.iter().sum();
        if ts > 0.0 {
            tmarg.iter_mut().for_each(|v| *v /= ts);
        } else {
            tmarg.iter_mut().for_each(|v| *v = 1.0 / tc as f64);
        }
        let mut cond = vec![0.0; joint.len()];
        for p in 0..pc {
            let block = &joint[p * tc..(p + 1) * tc];
            let s: f64 = block.iter().sum();
            for t in 0..tc {
                cond[p * tc + t] = if s > 0.0 { block[t] / s } else { tmarg[t] };
            }
        }
        Self {
            conditional,
            scope_dims,
            joint,
            conditional_table: cond,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    parents: Vec<usize>,
    parent_dims: Vec<usize>,
    targets: Vec<usize>,
    target_dims: Vec<usize>,
    /// Target cells `Π target_dims`: the length of one block of `cdf`.
    target_cells: usize,
    /// Cumulative `Pr(target cell | parent cell)`, blocks of `target_cells`.
    cdf: Vec<f64>,
}

pub(crate) fn compile(factors: &[EstimatedConditional]) -> Arc<Vec<Compiled>> {
    Arc::new(
        factors
            .iter()
            .map(|f| {
                let np = f.conditional.parents.len();
                let target_dims = f.scope_dims[np..].to_vec();
                let tc: usize = target_dims.iter().product();
                let mut cdf = f.conditional_table.clone();
                for block in cdf.chunks_mut(tc) {
                    let mut acc = 0.0;
                    for v in block.iter_mut() {
                        acc += *v;
                        *v = acc;
                    }
                }
                Compiled {
                    parents: f.conditional.parents.clone(),
                    parent_dims: f.scope_dims[..np].to_vec(),
                    targets: f.conditional.targets.clone(),
                    target_dims,
                    target_cells: tc,
                    cdf,
                }
            })
            .collect(),
    )
}

#[derive(Debug)]
pub(crate) enum SynthInner {
    Forward {
        factors: Arc<Vec<Compiled>>,
        rng: Box<ChaCha12Rng>,
    },
    /// SamPrivSyn's eq. 12 updating needs a whole table: built chunk by chunk
    /// ([`SAMPRIVSYN_CHUNK_ROWS`] rows each, its own seed), so memory stays bounded.
    Table {
        model: Arc<SamPrivSynModel>,
        seed: u64,
        chunk: u64,
        /// Rows not yet built into a chunk.
        left: u64,
        table: Vec<u32>,
        next: usize,
    },
}

/// Rows of one SamPrivSyn synthesis chunk (Algorithm 2 of SamPrivSyn on each): each chunk
/// matches the estimated 1- and 2-way distributions on its own, so their concatenation does
/// too; a download of any size holds one chunk (≈ 4·d bytes per row) at a time.
pub const SAMPRIVSYN_CHUNK_ROWS: u64 = 1 << 20;

/// Iterator of synthetic rows (codes, one per attribute); see [`Model::synthesize`](crate::synth::model::Model::synthesize).
#[derive(Debug)]
pub struct Synthesizer {
    pub(crate) inner: SynthInner,
    pub(crate) d: usize,
    pub(crate) remaining: u64,
    pub(crate) expand: Option<(Arc<Recovery>, Expansion, Box<ChaCha12Rng>)>,
}

impl Iterator for Synthesizer {
    type Item = Vec<u32>;

    fn next(&mut self) -> Option<Vec<u32>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let d = self.d;
        let mut row = self.next_working(d);
        if let Some((r, how, rng)) = &mut self.expand {
            for (a, c) in row.iter_mut().enumerate() {
                if r.within[a].is_some() {
                    *c = r.code(a, *c, *how, rng.random::<f64>());
                }
            }
        }
        Some(row)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let r = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (r, Some(r))
    }
}

impl Synthesizer {
    fn next_working(&mut self, d: usize) -> Vec<u32> {
        match &mut self.inner {
            SynthInner::Forward { factors, rng } => {
                let mut row = vec![0u32; d];
                for f in factors.iter() {
                    let mut p = 0usize;
                    for (&a, &k) in f.parents.iter().zip(&f.parent_dims) {
                        p = p * k + row[a] as usize;
                    }
                    let tc = f.target_cells;
                    let block = &f.cdf[p * tc..(p + 1) * tc];
                    let u = rng.random::<f64>() * block[tc - 1];
                    let mut t = block.partition_point(|&c| c <= u).min(tc - 1);
                    for (&a, &k) in f.targets.iter().zip(&f.target_dims).rev() {
                        row[a] = (t % k) as u32;
                        t /= k;
                    }
                }
                row
            }
            SynthInner::Table {
                model,
                seed,
                chunk,
                left,
                table,
                next,
            } => {
                if *next * d >= table.len() {
                    let rows = (*left).min(SAMPRIVSYN_CHUNK_ROWS);
                    // Chunk 0 keeps the seed itself: downloads within one chunk are as before.
                    let chunk_seed = seed.wrapping_add(chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    *table = model.synthesize_table(rows as usize, chunk_seed);
                    *left -= rows;
                    *chunk += 1;
                    *next = 0;
                }
                let row = table[*next * d..(*next + 1) * d].to_vec();
                *next += 1;
                row
            }
        }
    }
}
