//! Layer 3: reports become measurements: tables of sufficient statistics and their unbiased
//! estimates under one variance model ([`tables`], [`variance`]), the collection's 1-ways
//! ([`one_way`]), cell partitions for the Gaussian mechanism ([`partition`]), rounds as
//! strata of the population ([`drift`]) and VertiMRF's party sketches ([`sketch`]; the
//! cross-party tables the server estimates from them are
//! [`crate::protocols::cross_party`]'s, which needs the vertical protocol's bins).

pub(crate) mod drift;
pub mod local_model;
pub(crate) mod measurement;
pub(crate) mod one_way;
pub(crate) mod partition;
pub mod sketch;
pub mod sketch_privacy;
pub mod tables;
pub(crate) mod variance;
