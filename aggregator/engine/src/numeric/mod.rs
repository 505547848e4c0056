//! Layer 0: maths with no notion of a collection: information measures, index maps over
//! row-major product domains, and the zCDP → (ε, δ) conversion.

pub(crate) mod index;
pub mod info;
pub(crate) mod stats;
pub(crate) mod zcdp;
