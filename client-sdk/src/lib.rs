//! # ldpsyn — the client SDK
//!
//! Collects one person's record under local differential privacy (LDP): the record is
//! encoded with a [`schema::Schema`], randomized on the device by a [`mechanism`] (GRR, OUE
//! or the SamPrivSyn pair report) and sent as a [`wire::Report`]. The
//! [`ledger`] records the ε spent before anything leaves the device. The aggregator uses
//! the same [`mechanism`] types to validate, accumulate and estimate, so both sides agree on
//! p, q and encodings.
//!
//! ```
//! use ldpsyn::{Epsilon, schema::Schema, factor::Factor, mechanism::{Mechanism, MechanismKind}};
//! use rand::SeedableRng;
//!
//! let schema: Schema = serde_json::from_str(r#"{"attributes": [
//!   {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 10},
//!   {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]}]}"#).unwrap();
//! let record = schema.record().set("age", 42).set("smoker", "no").build().unwrap();
//! // The server asked for the pair (age, smoker) with GRR at ε = 1.
//! let factor = Factor::new(vec![0, 1], &schema.domain_sizes(), 1 << 20).unwrap();
//! let codes: Vec<u32> = factor.attributes().iter().map(|&a| record.codes()[a]).collect();
//! let m = Mechanism::new(MechanismKind::Grr, Epsilon::new(1.0).unwrap(), factor.dims()).unwrap();
//! let mut rng = rand::rngs::StdRng::seed_from_u64(7); // tests: seeded; apps: from the OS
//! let payload = m.randomize(&codes, &mut rng).unwrap();
//! m.validate(&payload).unwrap();
//! ```
#![warn(missing_docs)]

mod epsilon;
pub mod factor;
pub mod ledger;
pub mod mechanism;
#[cfg(feature = "openapi")]
mod openapi;
pub mod schema;
pub mod submission;
pub mod upload;
pub mod vertical;
pub mod wire;

#[cfg(feature = "http")]
pub mod client;

pub use epsilon::{Epsilon, EpsilonError, MAX_EPSILON, MIN_COLLECTION_EPSILON};
