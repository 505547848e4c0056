//! # ldpsyn-aggregator
//!
//! The `ldpsyn-aggregator` binary's commands, thin over the crates by role under
//! `aggregator/`:
//!
//! - [`engine`]: the estimation engine (the `ldpsyn-engine` crate: pure, no IO);
//! - [`service`]: the HTTP service and its storage (`ldpsyn-service`: what `serve` runs);
//! - [`sim`], [`eval`], [`infer`]: the in-process simulator, the utility evaluation and schema
//!   inference (`ldpsyn-sim`, which the service does not depend on).
//!
//! The commands here: [`demo`], [`admin`] (`collections`), [`devices`], [`party`] and
//! [`synthesize`], over one client of the admin API ([`api_client`]). The crates are re-exported under their old module names, so
//! `ldpsyn_aggregator::service::Server` and `ldpsyn_aggregator::sim::Simulation` still name
//! the same items.
#![warn(missing_docs)]

pub mod admin;
pub mod api_client;
pub mod demo;
pub mod devices;
pub use ldpsyn_engine as engine;
pub use ldpsyn_service as service;
pub use ldpsyn_sim as sim;
pub use ldpsyn_sim::{eval, infer};
pub mod party;
pub mod synthesize;
