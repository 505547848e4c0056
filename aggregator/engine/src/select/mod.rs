//! Layer 4: which dependencies the model keeps: a pair's expected gain ([`gain`]), the model
//! graph within a clique cap ([`model_graph`]) and the conditionals of its junction tree
//! ([`structure`], PrivIncr Algorithm 2).

pub(crate) mod gain;
pub(crate) mod model_graph;
pub mod structure;
