//! # ldpsyn-aggregator
//!
//! The server side of ldpsyn: the HTTP [`service`] and its storage, the `demo` job, the
//! in-process simulator [`sim`] and the utility evaluation [`eval`], over the estimation
//! engine [`engine`] (the `ldpsyn-engine` crate, re-exported: pure, no IO).
//!
//! ```
//! use ldpsyn::Epsilon;
//! use ldpsyn::protocol::{PrivIncrParams, Protocol};
//! use ldpsyn_aggregator::engine::{Engine, EngineOptions};
//! use ldpsyn_aggregator::sim::{BayesNet, Simulation};
//!
//! let net = BayesNet::standard();
//! let population = net.sample(20_000, 1);
//! let engine = Engine::from_parts(
//!     net.dims(),
//!     Epsilon::new(4.0).unwrap(),
//!     20_000,
//!     Protocol::Auto(PrivIncrParams::default()),
//!     EngineOptions::default(),
//! )
//! .unwrap();
//! let run = Simulation::new(&engine, &population).seed(7).run().unwrap();
//! let rows: Vec<Vec<u32>> = run.model.synthesize(10, 42).collect();
//! assert_eq!(rows.len(), 10);
//! ```
#![warn(missing_docs)]

pub mod admin;
pub mod demo;
pub mod devices;
pub use ldpsyn_engine as engine;
pub mod eval;
pub mod infer;
pub mod party;
pub mod service;
pub mod sim;
pub mod synthesize;
