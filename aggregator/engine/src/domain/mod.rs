//! Layer 2: what a collection's attributes are: schema codes and working bins ([`space`]),
//! the working domain's sizes ([`sizes`]), tasks ([`task`]),
//! the key of a table ([`key`]) and a factor with its bin maps ([`binned`]).

pub(crate) mod binned;
pub(crate) mod key;
pub(crate) mod sizes;
pub mod space;
pub(crate) mod task;

pub use binned::BinnedFactor;
pub use sizes::Domain;
