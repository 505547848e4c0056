//! # ldpsyn-aggregator
#![warn(missing_docs)]
