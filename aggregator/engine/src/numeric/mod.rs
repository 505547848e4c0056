//! Layer 0: maths with no notion of a collection: information measures and index maps over
//! row-major product domains.

pub mod index;
pub mod info;
pub mod stats;
