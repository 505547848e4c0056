//! Layer 2: what a collection's attributes are: schema codes and working bins ([`space`]),
//! tasks ([`task`]) and the key of a table ([`key`]).

pub mod key;
pub mod space;
pub mod task;
