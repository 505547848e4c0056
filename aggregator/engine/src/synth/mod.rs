//! Layer 6: the released model: marginals with standard errors ([`model`]; of unmeasured
//! marginals from the bootstrap's replicates, [`bootstrap`]), what it was
//! built from ([`description`]), what it can answer ([`fitness`]), within-bin recovery of numeric attributes ([`recovery`]),
//! streaming synthesis ([`sampler`]) and SamPrivSyn's own generator ([`samprivsyn`]).

pub mod bootstrap;
pub mod description;
pub mod fitness;
pub mod inference;
pub mod model;
pub mod recovery;
pub mod sampler;
pub mod samprivsyn;
