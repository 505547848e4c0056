//! Layer 2: what a collection's attributes are: schema codes and working bins ([`space`]),
//! the working domain's sizes and cliques of attributes ([`sizes`]), tasks ([`task`]) and
//! the key of a table ([`key`]).

pub(crate) mod key;
pub(crate) mod sizes;
pub mod space;
pub(crate) mod task;

pub use sizes::{Clique, Domain};
