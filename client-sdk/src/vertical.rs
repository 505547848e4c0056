//! Vertical collections (VertiMRF): several parties hold different attributes of the same
//! people and upload one GRR report per attribute and record.
//!
//! - **Alignment**: parties agree on a secret [`RecordIdKey`] (the server never sees it) and
//!   derive each person's pseudonymous record id as HMAC-SHA256(key, customer id)
//!   ([`RecordIdKey::record_id`]). The server stores only ids: it learns which ids each party
//!   holds (the size of every intersection), nothing of the customer ids behind them.
//! - **Reports**: [`PartyRandomizer`] encodes a party's values with the collection's schema
//!   and randomizes each attribute with GRR at its own ε (VertiMRF §4.2, FO-based LocEnc,
//!   eq. 6). A person's ε towards a party is the sum over its attributes. Under encoding
//!   `sampled+locmrf` it randomizes one attribute per record, drawn uniformly and named in
//!   the record ([`PartyRecord::attribute`]), at that attribute's ε, which is then the
//!   person's ε for the party's reports ([`crate::wire::Party::report_epsilon`]).
//! - **Upload**: [`PartyUpload`] batches `(record id, codes)`; a party must resend the same
//!   codes for an id (keep them, e.g. in a journal): the server acknowledges an identical
//!   resend as a duplicate and refuses different codes for an id it holds (`409`), so
//!   re-randomizing cannot average the noise away.
//!
//! ```
//! use ldpsyn::vertical::RecordIdKey;
//! let key = RecordIdKey::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
//! let id = key.record_id("customer-42");
//! assert_eq!(id.len(), 64);
//! assert_eq!(id, key.record_id("customer-42"));
//! assert_ne!(id, key.record_id("customer-43"));
//! ```

use hmac::{Hmac, Mac};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::mechanism::{Grr, MechanismError};
use crate::schema::{RecordError, Value};
use crate::wire::{CollectionConfig, Party, Protocol};

/// Shortest record-id key: 32 bytes (the HMAC-SHA256 output size).
pub const MIN_KEY_BYTES: usize = 32;

/// Length of a record id: 64 lowercase hex digits (HMAC-SHA256).
pub const RECORD_ID_LEN: usize = 64;

/// Most records in one party upload request.
pub const MAX_RECORDS_PER_UPLOAD: usize = 10_000;

/// Errors of the vertical-collection helpers.
#[derive(Debug, thiserror::Error)]
pub enum VerticalError {
    /// The record-id key is shorter than [`MIN_KEY_BYTES`].
    #[error("record-id key must be at least {MIN_KEY_BYTES} bytes, got {0}")]
    KeyTooShort(usize),
    /// The collection is not vertical.
    #[error("collection protocol is `{0}`, not `vertical`")]
    NotVertical(&'static str),
    /// The collection has no party of this name.
    #[error("the collection has no party `{0}`")]
    UnknownParty(String),
    /// The collection's encoding (`sketch+locmrf`) takes no per-record reports.
    #[error(
        "encoding `sketch+locmrf` takes no per-record reports: each party uploads its local \
         model and one sketch report (`ldpsyn-aggregator party upload` makes both)"
    )]
    NoRecordReports,
    /// A party attribute is not in the schema.
    #[error("party attribute `{0}` is not in the schema")]
    UnknownAttribute(String),
    /// A record has a different number of values than the party has attributes.
    #[error("record has {found} values, the party holds {expected} attributes")]
    WrongArity {
        /// The party's attribute count.
        expected: usize,
        /// Values given.
        found: usize,
    },
    /// A value cannot be encoded (the source names the attribute).
    #[error("{source}")]
    Record {
        /// The attribute.
        attribute: String,
        /// Why.
        source: RecordError,
    },
    /// A mechanism could not be built.
    #[error(transparent)]
    Mechanism(#[from] MechanismError),
    /// A party budget cannot be split ([`split_party_budget`]).
    #[cfg(feature = "locmrf")]
    #[error(
        "cannot split epsilon {epsilon}, delta {delta} with a LocMRF share of {locmrf_share}: \
         need 0 < share < 1, 0 < delta < 1 and epsilon large enough for every part"
    )]
    Budget {
        /// The party's ε per person.
        epsilon: f64,
        /// Its δ.
        delta: f64,
        /// The share asked for the local model.
        locmrf_share: f64,
    },
}

/// The parties' shared secret for record ids. Never sent to the server.
#[derive(Clone)]
pub struct RecordIdKey(Vec<u8>);

impl std::fmt::Debug for RecordIdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordIdKey(<secret>)")
    }
}

impl RecordIdKey {
    /// Wraps key bytes. Errors: [`VerticalError::KeyTooShort`] below [`MIN_KEY_BYTES`].
    pub fn new(bytes: Vec<u8>) -> Result<Self, VerticalError> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(VerticalError::KeyTooShort(bytes.len()));
        }
        Ok(Self(bytes))
    }

    /// The pseudonymous record id of `customer_id`: HMAC-SHA256(key, customer id) as 64
    /// lowercase hex digits. Every party holding the key derives the same id for the same
    /// customer; without the key the id reveals nothing of the customer id.
    pub fn record_id(&self, customer_id: &str) -> String {
        // HMAC accepts keys of any length: `new_from_slice` cannot fail for HMAC-SHA256.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(customer_id.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Steps of [`split_epsilon`]'s water-filling: fine enough that the split's objective is
/// within 0.1% of the continuous optimum on Adult's domains (a coarser grid moves ε in
/// visible steps).
const SPLIT_STEPS: usize = 2_000;

/// Splits a party's ε per person `total` over attributes of `domain_sizes` to minimize the
/// expected L1 error of their 1-way GRR estimates, `Σ_a k_a·√v_a(ε_a)` with
/// `v(ε) = (e^ε + k − 2)/(e^ε − 1)²` the small-frequency variance of GRR (Wang et al.,
/// USENIX Security 2017, §4.1; the common `√(2/(πn))` factor drops out). Each term is convex
/// and decreasing in ε, so greedy water-filling in `total/2000` steps reaches the optimum up
/// to one step. Large domains get more ε than small ones (an equal split leaves a 41-value
/// attribute far noisier than a binary one). The sum is `total` up to rounding.
/// Panics if `domain_sizes` is empty or `total` is not positive.
pub fn split_epsilon(total: f64, domain_sizes: &[usize]) -> Vec<f64> {
    assert!(
        !domain_sizes.is_empty() && total > 0.0,
        "split needs attributes and ε > 0"
    );
    let step = total / SPLIT_STEPS as f64;
    let cost = |k: usize, e: f64| {
        if e <= 0.0 {
            return f64::INFINITY;
        }
        let x = e.exp();
        k as f64 * ((x + k as f64 - 2.0) / (x - 1.0).powi(2)).sqrt()
    };
    let mut eps = vec![0.0; domain_sizes.len()];
    for _ in 0..SPLIT_STEPS {
        let best = (0..eps.len())
            .max_by(|&i, &j| {
                let gain = |a: usize| {
                    let k = domain_sizes[a];
                    let now = cost(k, eps[a]);
                    // From zero the cost is infinite: any ε first goes to an attribute without.
                    if now.is_infinite() {
                        f64::MAX
                    } else {
                        now - cost(k, eps[a] + step)
                    }
                };
                gain(i).total_cmp(&gain(j))
            })
            .unwrap_or(0);
        eps[best] += step;
    }
    eps
}

/// Default share of a party's ε per person that [`split_party_budget`] gives its local model
/// (LocMRF) when the collection's encoding is `fo+locmrf`; the rest goes to its GRR reports.
/// A default, not a constant of the method: VertiMRF §7.1 gives 40% of the total to LocMRF
/// and 40% to its sketches; with FO reports, which are far noisier per unit of ε than the
/// Gaussian mechanism on a party's whole table, the cross-party pairs need the larger share.
#[cfg(feature = "locmrf")]
pub const DEFAULT_LOCMRF_SHARE: f64 = 0.2;

/// Splits a party's budget per person, `epsilon` (and `delta` for its local model), between
/// its GRR reports and its local model (LocMRF): `locmrf_share · epsilon` with `delta` to the
/// model, the rest over the attributes of `domain_sizes` by [`split_epsilon`], each attribute
/// at least [`crate::MIN_COLLECTION_EPSILON`] (the water-filling rerun over the others). The parts
/// compose sequentially back to (`epsilon`, `delta`) ([`crate::wire::Party::composed_epsilon`]).
/// Returns the attributes' ε (in `domain_sizes` order) and the model's budget.
/// Errors: [`VerticalError::Budget`] unless `0 < locmrf_share < 1`, `epsilon` splits into
/// valid ε (every attribute at least the minimum) and `0 < delta < 1`, or if `domain_sizes`
/// is empty.
#[cfg(feature = "locmrf")]
pub fn split_party_budget(
    epsilon: f64,
    delta: f64,
    domain_sizes: &[usize],
    locmrf_share: f64,
) -> Result<(Vec<crate::Epsilon>, crate::wire::LocMrfBudget), VerticalError> {
    let bad = || VerticalError::Budget {
        epsilon,
        delta,
        locmrf_share,
    };
    let model = local_model_epsilon(epsilon, delta, locmrf_share)?;
    let reports = split_epsilon_floored(epsilon - model.get(), domain_sizes).ok_or_else(bad)?;
    Ok((
        reports,
        crate::wire::LocMrfBudget {
            epsilon: model,
            delta,
        },
    ))
}

/// [`split_epsilon`] of `total` over `domain_sizes` with every attribute at least
/// [`crate::MIN_COLLECTION_EPSILON`]: an attribute the split leaves below it is fixed there and
/// the rest split again (the bound is active at the optimum of this separable convex
/// problem). `None` when `total` cannot give every attribute the minimum.
#[cfg(feature = "locmrf")]
fn split_epsilon_floored(total: f64, domain_sizes: &[usize]) -> Option<Vec<crate::Epsilon>> {
    let floor = crate::MIN_COLLECTION_EPSILON;
    if domain_sizes.is_empty() || total < floor * domain_sizes.len() as f64 {
        return None;
    }
    let mut fixed = vec![false; domain_sizes.len()];
    let mut eps = vec![floor; domain_sizes.len()];
    loop {
        let free: Vec<usize> = (0..eps.len()).filter(|&i| !fixed[i]).collect();
        let left = total - floor * (eps.len() - free.len()) as f64;
        let k: Vec<usize> = free.iter().map(|&i| domain_sizes[i]).collect();
        let split = split_epsilon(left, &k);
        let mut moved = false;
        for (&i, e) in free.iter().zip(split) {
            if e < floor {
                fixed[i] = true;
                moved = true;
            } else {
                eps[i] = e;
            }
        }
        if !moved || fixed.iter().all(|&f| f) {
            break;
        }
    }
    eps.into_iter()
        .map(|e| crate::Epsilon::new(e).ok())
        .collect()
}

/// One party's name and its attributes' names with their domain sizes, in the party's
/// order: the input of [`split_collection_budget`].
#[cfg(feature = "locmrf")]
pub type PartyDomains = (String, Vec<(String, usize)>);

/// The parties of a vertical collection with every part of their budgets, derived from one
/// budget per person (`budget`) under `encoding` (VertiMRF Algorithm 2; the split of §7.1
/// with binning free, see [`DEFAULT_SKETCH_LOCMRF_SHARE`]):
/// - over parties equally: each party gets ε/P and δ/P of `budget` (P parties; a person's
///   releases to the parties compose sequentially back to the budget);
/// - within a party by the encoding's split: `fo` by [`split_epsilon`] over its attributes
///   (no δ spent); `fo+locmrf` by [`split_party_budget`]; `sampled+locmrf` by
///   [`sampled_party_budget`]; `sketch+locmrf` by [`sketch_party_budget`] with half the
///   party's δ to the local model and half to its sketch report.
///
/// `locmrf_share` of `budget` (absent: the encoding's default) goes to each local model.
/// Returns the parties and, under `sketch+locmrf`, the sketch reports' δ (the config's
/// `sketch.delta`). The composed ε per person ([`crate::wire::Party::composed_epsilon`]
/// summed over parties) is `budget.epsilon`; the composed δ is `budget.delta` (0 under `fo`).
/// Errors: [`VerticalError::Budget`] (naming the party's share) when `budget.delta` is not
/// in (0, 1), a part would be invalid or below [`crate::MIN_COLLECTION_EPSILON`], or no
/// party or a party without attributes is given.
#[cfg(feature = "locmrf")]
pub fn split_collection_budget(
    budget: &crate::wire::VerticalBudget,
    encoding: crate::wire::VerticalEncoding,
    parties: &[PartyDomains],
) -> Result<(Vec<Party>, Option<f64>), VerticalError> {
    use crate::wire::{PartyAttribute, VerticalEncoding as E};
    let count = parties.len().max(1) as f64;
    let (epsilon, delta) = (budget.epsilon.get() / count, budget.delta / count);
    let share = budget.locmrf_share.unwrap_or(match encoding {
        E::SketchLocmrf => DEFAULT_SKETCH_LOCMRF_SHARE,
        _ => DEFAULT_LOCMRF_SHARE,
    });
    let bad = || VerticalError::Budget {
        epsilon,
        delta,
        locmrf_share: share,
    };
    let valid_delta = budget.delta > 0.0 && budget.delta < 1.0;
    if !valid_delta || parties.is_empty() || parties.iter().any(|(_, a)| a.is_empty()) {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(parties.len());
    for (name, attributes) in parties {
        let k: Vec<usize> = attributes.iter().map(|(_, k)| *k).collect();
        let (reports, locmrf) = match encoding {
            E::Fo => (split_epsilon_floored(epsilon, &k).ok_or_else(bad)?, None),
            E::FoLocmrf => {
                let (r, m) = split_party_budget(epsilon, delta, &k, share)?;
                (r, Some(m))
            }
            E::SampledLocmrf => {
                let (r, m) = sampled_party_budget(epsilon, delta, k.len(), share)?;
                (r, Some(m))
            }
            E::SketchLocmrf => {
                let (r, m) = sketch_party_budget(epsilon, delta / 2.0, k.len(), share)?;
                (r, Some(m))
            }
        };
        out.push(Party {
            name: name.clone(),
            attributes: attributes
                .iter()
                .zip(reports)
                .map(|((name, _), epsilon)| PartyAttribute {
                    name: name.clone(),
                    epsilon,
                })
                .collect(),
            locmrf,
        });
    }
    Ok((out, encoding.is_sketch().then_some(delta / 2.0)))
}

/// Splits a party's budget per person, `epsilon` (and `delta` for its local model), for
/// encoding `sampled+locmrf`: `locmrf_share · epsilon` with `delta` to the local model, and
/// the rest, whole, to each of its `attributes` (a record reports one of them, drawn
/// independently of the data, so the reports' ε is that of one attribute:
/// [`crate::wire::Party::report_epsilon`]). Returns the attributes' ε and the model's
/// budget; they compose back to (`epsilon`, `delta`).
/// Errors: [`VerticalError::Budget`] unless `0 < locmrf_share < 1`, `0 < delta < 1` and
/// both parts are at least [`crate::MIN_COLLECTION_EPSILON`].
#[cfg(feature = "locmrf")]
pub fn sampled_party_budget(
    epsilon: f64,
    delta: f64,
    attributes: usize,
    locmrf_share: f64,
) -> Result<(Vec<crate::Epsilon>, crate::wire::LocMrfBudget), VerticalError> {
    let (model, each) = model_and_attribute_epsilon(epsilon, delta, locmrf_share, 1)?;
    Ok((
        vec![each; attributes],
        crate::wire::LocMrfBudget {
            epsilon: model,
            delta,
        },
    ))
}

/// Default share of a party's ε per person for its local model under `sketch+locmrf`
/// ([`sketch_party_budget`]): 0.5. VertiMRF §7.1 gives 40% to LocMRF, 40% to LocEnc (10% of
/// it to n̂) and 20% to binning; here binning costs nothing (§6.1's equal-width bins depend
/// on the domain only, and the value distributions within bins come from the local model's
/// own noisy 1-ways, post-processing), so its 20% is split evenly between the other two.
#[cfg(feature = "locmrf")]
pub const DEFAULT_SKETCH_LOCMRF_SHARE: f64 = 0.5;

/// Splits a party's budget per person, `epsilon` (and `delta` for its local model), for
/// encoding `sketch+locmrf`: `locmrf_share · epsilon` with `delta` to the local model, the
/// rest to its one sketch report, written as equal shares over its `attributes` (the
/// report's ε is their sum, [`crate::wire::Party::report_epsilon`]; the sketches of all
/// parties are accounted together, see [`crate::wire::VerticalEncoding::SketchLocmrf`]). Returns the attributes' ε and the model's budget; they compose
/// back to `epsilon` (the report's own δ is the collection's `sketch.delta`).
/// Errors: [`VerticalError::Budget`] unless `0 < locmrf_share < 1`, `0 < delta < 1` and
/// the model's ε and the report's are at least [`crate::MIN_COLLECTION_EPSILON`] (an
/// attribute's share may be below it).
#[cfg(feature = "locmrf")]
pub fn sketch_party_budget(
    epsilon: f64,
    delta: f64,
    attributes: usize,
    locmrf_share: f64,
) -> Result<(Vec<crate::Epsilon>, crate::wire::LocMrfBudget), VerticalError> {
    let (model, each) =
        model_and_attribute_epsilon(epsilon, delta, locmrf_share, attributes.max(1))?;
    Ok((
        vec![each; attributes],
        crate::wire::LocMrfBudget {
            epsilon: model,
            delta,
        },
    ))
}

/// The local model's ε ([`local_model_epsilon`]) and each attribute's report ε: the rest of
/// `epsilon` divided by `shares` (1: every attribute reports with all of it). Errors:
/// [`VerticalError::Budget`] as [`local_model_epsilon`], or when the model's ε or the rest
/// is below [`crate::MIN_COLLECTION_EPSILON`].
#[cfg(feature = "locmrf")]
fn model_and_attribute_epsilon(
    epsilon: f64,
    delta: f64,
    locmrf_share: f64,
    shares: usize,
) -> Result<(crate::Epsilon, crate::Epsilon), VerticalError> {
    let bad = || VerticalError::Budget {
        epsilon,
        delta,
        locmrf_share,
    };
    let model = local_model_epsilon(epsilon, delta, locmrf_share)?;
    let rest = epsilon - model.get();
    let each = rest / shares as f64;
    let floor = crate::MIN_COLLECTION_EPSILON;
    // The floor bounds what a mechanism spends: the model, and the reports' ε (an
    // attribute's share of one sketch report is bookkeeping, not a mechanism's ε).
    if model.get() < floor || rest < floor {
        return Err(bad());
    }
    Ok((model, crate::Epsilon::new(each).map_err(|_| bad())?))
}

/// The local model's ε, `locmrf_share · epsilon`, of a party's budget (`epsilon`, `delta`).
/// Errors: [`VerticalError::Budget`] unless `0 < locmrf_share < 1`, `0 < delta < 1` and the
/// model's ε is a valid ε.
#[cfg(feature = "locmrf")]
fn local_model_epsilon(
    epsilon: f64,
    delta: f64,
    locmrf_share: f64,
) -> Result<crate::Epsilon, VerticalError> {
    let bad = VerticalError::Budget {
        epsilon,
        delta,
        locmrf_share,
    };
    if !(locmrf_share > 0.0 && locmrf_share < 1.0 && delta > 0.0 && delta < 1.0) {
        return Err(bad);
    }
    crate::Epsilon::new(epsilon * locmrf_share).map_err(|_| bad)
}

/// Whether `id` has the form of a record id (64 lowercase hex digits).
pub fn is_record_id(id: &str) -> bool {
    id.len() == RECORD_ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// One record of a party upload: its id and the randomized codes of the party's attributes
/// (party order), or, under encoding `sampled+locmrf`, of the one attribute it reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartyRecord {
    /// Record id ([`RecordIdKey::record_id`]).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{64}$"))]
    pub id: String,
    /// Encoding `sampled+locmrf` only (absent otherwise): the party-order index of the one
    /// attribute this record reports, drawn uniformly by the party independently of the
    /// data (so it is sent in the clear).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribute: Option<u32>,
    /// GRR outputs, one per party attribute (party order), each below the attribute's
    /// domain size; under `sampled+locmrf` the one output of attribute `attribute`.
    pub codes: Vec<u32>,
}

/// Body of `POST /v1/collections/{id}/parties/{party}/records`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartyUpload {
    /// 1..=[`MAX_RECORDS_PER_UPLOAD`] records with distinct ids.
    pub records: Vec<PartyRecord>,
}

/// Answer to a party upload: how many records were new and how many were identical resends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartyUploadResult {
    /// Records stored by this request.
    pub accepted: u64,
    /// Records the server already held with the same codes.
    pub duplicate: u64,
}

/// A party's randomizer: its attributes' schema indices, encoders and GRRs, and whether a
/// record reports one attribute drawn at random (`sampled+locmrf`) or all of them.
#[derive(Debug, Clone)]
pub struct PartyRandomizer {
    party: Party,
    attributes: Vec<usize>,
    grrs: Vec<Grr>,
    config: CollectionConfig,
    sampled: bool,
}

impl PartyRandomizer {
    /// The randomizer of party `name` in the vertical collection `config` (under
    /// `sketch+locmrf` it binds the party but makes no record:
    /// [`PartyRandomizer::record_from_codes`] refuses).
    /// Errors: not vertical, unknown party or attribute, or an invalid mechanism.
    pub fn new(config: &CollectionConfig, name: &str) -> Result<Self, VerticalError> {
        let Protocol::Vertical(params) = &config.protocol else {
            return Err(VerticalError::NotVertical(config.protocol.name()));
        };
        let party = params
            .parties
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| VerticalError::UnknownParty(name.to_owned()))?
            .clone();
        let mut attributes = Vec::new();
        let mut grrs = Vec::new();
        for pa in &party.attributes {
            let a = config
                .schema
                .index_of(&pa.name)
                .ok_or_else(|| VerticalError::UnknownAttribute(pa.name.clone()))?;
            attributes.push(a);
            grrs.push(Grr::new(pa.epsilon, config.schema.domain_sizes()[a])?);
        }
        #[cfg(feature = "locmrf")]
        let sampled = params.encoding.is_sampled();
        #[cfg(not(feature = "locmrf"))]
        let sampled = false;
        Ok(Self {
            party,
            attributes,
            grrs,
            config: config.clone(),
            sampled,
        })
    }

    /// The collection's encoding.
    #[cfg(feature = "locmrf")]
    pub fn encoding(&self) -> crate::wire::VerticalEncoding {
        match &self.config.protocol {
            Protocol::Vertical(p) => p.encoding,
            // `new` accepts vertical configs only.
            _ => crate::wire::VerticalEncoding::Fo,
        }
    }

    /// Whether a record reports one attribute drawn at random (`sampled+locmrf`).
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// The party.
    pub fn party(&self) -> &Party {
        &self.party
    }

    /// The collection's schema.
    pub fn schema(&self) -> &crate::schema::Schema {
        &self.config.schema
    }

    /// The collection's public config.
    pub fn config(&self) -> &CollectionConfig {
        &self.config
    }

    /// Schema indices of the party's attributes (party order).
    pub fn attributes(&self) -> &[usize] {
        &self.attributes
    }

    /// The record `id` of the party's values (party order): each encoded with the schema,
    /// then randomized with its attribute's GRR (ε-LDP per attribute; Σ ε over the party's
    /// attributes per record), or under `sampled+locmrf` one attribute drawn uniformly and
    /// only its value randomized, at its ε (the record's ε; the draw does not depend on the
    /// values). `rng` must be a CSPRNG seeded from the OS outside tests and simulations. An
    /// invalid value of an attribute with `on_invalid: "randomize"` is replaced by a uniform
    /// code first, as on devices. Errors: wrong arity, or a value the schema cannot encode
    /// (every value is checked, whichever is drawn).
    pub fn record<R: Rng + ?Sized>(
        &self,
        id: String,
        values: &[Value],
        rng: &mut R,
    ) -> Result<PartyRecord, VerticalError> {
        if values.len() != self.attributes.len() {
            return Err(VerticalError::WrongArity {
                expected: self.attributes.len(),
                found: values.len(),
            });
        }
        let mut codes = Vec::with_capacity(values.len());
        for (&a, v) in self.attributes.iter().zip(values) {
            let attr = &self.config.schema.attributes()[a];
            codes.push(
                attr.encode_value_with(v, rng)
                    .map_err(|source| VerticalError::Record {
                        attribute: attr.name.clone(),
                        source,
                    })?,
            );
        }
        self.record_from_codes(id, &codes, rng)
    }

    /// As [`PartyRandomizer::record`] for values already encoded (schema codes, party
    /// order). Errors: [`VerticalError::NoRecordReports`] under `sketch+locmrf`, wrong
    /// arity, or a code outside its attribute's domain (every code is checked, whichever is
    /// drawn).
    pub fn record_from_codes<R: Rng + ?Sized>(
        &self,
        id: String,
        codes: &[u32],
        rng: &mut R,
    ) -> Result<PartyRecord, VerticalError> {
        #[cfg(feature = "locmrf")]
        if self.encoding().is_sketch() {
            return Err(VerticalError::NoRecordReports);
        }
        if codes.len() != self.attributes.len() {
            return Err(VerticalError::WrongArity {
                expected: self.attributes.len(),
                found: codes.len(),
            });
        }
        for (&c, grr) in codes.iter().zip(&self.grrs) {
            if c as usize >= grr.domain_size() {
                return Err(MechanismError::ValueOutOfDomain {
                    value: c as usize,
                    k: grr.domain_size(),
                }
                .into());
            }
        }
        if self.sampled {
            // Drawn before any randomization and from nothing but the RNG.
            let j = rng.random_range(0..codes.len());
            let y = self.grrs[j].randomize(codes[j] as usize, rng)? as u32;
            return Ok(PartyRecord {
                id,
                attribute: Some(j as u32),
                codes: vec![y],
            });
        }
        let codes = codes
            .iter()
            .zip(&self.grrs)
            .map(|(&c, grr)| Ok(grr.randomize(c as usize, rng)? as u32))
            .collect::<Result<_, VerticalError>>()?;
        Ok(PartyRecord {
            id,
            attribute: None,
            codes,
        })
    }
}

/// A party's connection to a vertical collection: its config, its randomizer and its upload
/// token. Uploads are retried on 5xx, 408, 429 and connection errors with identical bytes (safe:
/// the server counts a record id once per party).
#[cfg(feature = "http")]
pub struct PartyClient {
    http: reqwest::Client,
    options: crate::client::ClientOptions,
    url: String,
    token: String,
    randomizer: PartyRandomizer,
    upload_limits: crate::wire::UploadLimits,
}

#[cfg(feature = "http")]
impl std::fmt::Debug for PartyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartyClient")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "http")]
impl PartyClient {
    /// Fetches the public config of `collection` from `base_url` and binds party `party`
    /// with its upload `token`. The party's ε per person (its reports' ε: Σ over its
    /// attributes, or one attribute's under `sampled+locmrf`) is bounded by
    /// `options.max_epsilon` and by the collection's declared `epsilon` (a config asking a
    /// party for more than the collection declares is not trusted); with a local model
    /// the bound applies to the composed ε, reports and model together
    /// ([`crate::wire::Party::composed_epsilon`]).
    /// Errors: [`crate::client::ClientError::EpsilonTooLarge`] when the party's ε is above
    /// either; [`crate::client::ClientError::InvalidTask`] for a device collection or an
    /// unknown party; HTTP failures as the device client.
    pub async fn connect(
        base_url: &str,
        collection: uuid::Uuid,
        party: &str,
        token: &str,
        options: crate::client::ClientOptions,
    ) -> Result<Self, crate::client::ClientError> {
        use crate::client::ClientError;
        let http = reqwest::Client::builder()
            .timeout(options.request_timeout)
            .build()
            .map_err(|e| ClientError::Protocol(format!("cannot build HTTP client: {e}")))?;
        let base = base_url.trim_end_matches('/');
        let url = format!("{base}/v1/collections/{collection}");
        let (config, upload_limits) = crate::client::fetch_config(&http, &options, &url).await?;
        let randomizer = PartyRandomizer::new(&config, party)
            .map_err(|e| ClientError::InvalidTask(e.to_string()))?;
        let epsilon = randomizer.party().composed_epsilon(randomizer.encoding());
        let max = options.max_epsilon.get().min(config.epsilon.get());
        if epsilon > max * (1.0 + 1e-12) {
            return Err(ClientError::EpsilonTooLarge {
                requested: epsilon,
                max,
            });
        }
        Ok(Self {
            http,
            options,
            url: format!("{url}/parties/{party}/records"),
            token: token.to_owned(),
            randomizer,
            upload_limits,
        })
    }

    /// The party's randomizer.
    pub fn randomizer(&self) -> &PartyRandomizer {
        &self.randomizer
    }

    /// The server's upload limits, as published with the collection's config.
    pub fn upload_limits(&self) -> &crate::wire::UploadLimits {
        &self.upload_limits
    }

    /// Uploads `records` (any number, distinct ids) in as many requests as the server's
    /// limits need: at most [`MAX_RECORDS_PER_UPLOAD`] records and the published body budget
    /// ([`crate::wire::UploadLimits::body_budget`]) per request, in order. Returns the
    /// sums of the requests' answers.
    ///
    /// Errors: [`crate::client::ClientError::ReportTooLarge`] when a record cannot fit any
    /// request (checked before anything is sent);
    /// [`crate::client::ClientError::Problem`] for a refusal (e.g. `record-id-conflict`,
    /// `collection-finalized`, `unauthorized`); `Unavailable` after every retry. After an
    /// error the requests before it are stored: resending all `records` is safe (the server
    /// counts identical records as `duplicate`).
    pub async fn upload(
        &self,
        records: &[PartyRecord],
    ) -> Result<PartyUploadResult, crate::client::ClientError> {
        use crate::client::ClientError;
        use crate::upload::{Envelope, Piece, split_json};
        let pieces = split_json(
            records,
            Envelope::PARTY_RECORDS,
            MAX_RECORDS_PER_UPLOAD,
            self.upload_limits.body_budget(),
        )
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut bodies = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece {
                Piece::Body { body, .. } => bodies.push(body),
                Piece::TooLarge { bytes, .. } => {
                    return Err(ClientError::ReportTooLarge {
                        bytes: bytes as u64,
                        max_body_bytes: self.upload_limits.max_body_bytes,
                    });
                }
            }
        }
        let mut total = PartyUploadResult {
            accepted: 0,
            duplicate: 0,
        };
        for body in bodies {
            // Serialized once: every retry sends identical bytes.
            let r: PartyUploadResult = crate::client::send_json(&self.http, &self.options, |h| {
                h.post(&self.url)
                    .bearer_auth(&self.token)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
            total.accepted += r.accepted;
            total.duplicate += r.duplicate;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn config() -> CollectionConfig {
        serde_json::from_str(
            r#"{"version": 1, "id": "c0ffee00-0000-4000-8000-000000000000",
            "schema": {"attributes": [
              {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 4},
              {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
              {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]}]},
            "epsilon": 3.0, "target_users": 10, "protocol": "vertical",
            "parties": [
              {"name": "bank", "attributes": [{"name": "age", "epsilon": 1.0},
                                              {"name": "sex", "epsilon": 2.0}]},
              {"name": "telco", "attributes": [{"name": "plan", "epsilon": 3.0}]}]}"#,
        )
        .unwrap()
    }

    /// Two parties with the key derive one id per customer; the id is the documented HMAC
    /// (RFC 4231 test case 2 pins the construction), and a short key is refused.
    #[test]
    fn record_ids_align_and_match_hmac_sha256() {
        assert!(matches!(
            RecordIdKey::new(vec![1; 31]),
            Err(VerticalError::KeyTooShort(31))
        ));
        let a = RecordIdKey::new(vec![7; 32]).unwrap();
        let b = RecordIdKey::new(vec![7; 32]).unwrap();
        let other = RecordIdKey::new(vec![8; 32]).unwrap();
        assert_eq!(a.record_id("c1"), b.record_id("c1"));
        assert_ne!(a.record_id("c1"), other.record_id("c1"));
        assert!(is_record_id(&a.record_id("c1")));
        assert!(!is_record_id("C1"));
        assert!(!is_record_id(&"A".repeat(64)));
        // RFC 4231 §4.3 (key "Jefe"), through the same HMAC construction.
        let rfc = RecordIdKey(b"Jefe".to_vec());
        assert_eq!(
            rfc.record_id("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(format!("{a:?}").contains("secret"));
    }

    /// The split gives the model its share with the whole δ, the reports the rest by
    /// `split_epsilon` (no attribute below the collection minimum), and composes back to the
    /// party's total; bad shares and δ, and a total too small for the minimum, are refused.
    #[cfg(feature = "locmrf")]
    #[test]
    fn party_budget_splits_and_composes_back() {
        use crate::wire::{Party, PartyAttribute};
        let (reports, model) =
            split_party_budget(1.6, 1e-6, &[2, 9, 41], DEFAULT_LOCMRF_SHARE).unwrap();
        assert!((model.epsilon.get() - 0.32).abs() < 1e-12 && model.delta == 1e-6);
        let fo: Vec<f64> = split_epsilon(1.28, &[2, 9, 41]);
        for (r, f) in reports.iter().zip(&fo) {
            assert_eq!(r.get(), *f);
        }
        let party = Party {
            name: "bank".into(),
            attributes: reports
                .iter()
                .map(|&epsilon| PartyAttribute {
                    name: "x".into(),
                    epsilon,
                })
                .collect(),
            locmrf: Some(model),
        };
        assert!(
            (party.composed_epsilon(crate::wire::VerticalEncoding::FoLocmrf) - 1.6).abs() < 1e-9
        );
        for (share, delta) in [(0.0, 1e-6), (1.0, 1e-6), (0.2, 0.0), (0.2, 1.0)] {
            assert!(matches!(
                split_party_budget(1.6, delta, &[2], share),
                Err(VerticalError::Budget { .. })
            ));
        }
        // At a small total the water-filling leaves binary attributes below 0.01: they get
        // the minimum, the large domains the rest, the sum is kept.
        let k = [2, 2, 5, 41, 16];
        assert!(
            split_epsilon(0.2, &k)
                .iter()
                .any(|&e| e < crate::MIN_COLLECTION_EPSILON)
        );
        let (reports, _) = split_party_budget(0.25, 1e-6, &k, 0.2).unwrap();
        assert!(
            reports
                .iter()
                .all(|e| e.get() >= crate::MIN_COLLECTION_EPSILON)
        );
        let sum: f64 = reports.iter().map(|e| e.get()).sum();
        assert!((sum - 0.2).abs() < 1e-9, "{sum}");
        assert!(reports[3].get() > reports[0].get());
        assert!(matches!(
            split_party_budget(0.04, 1e-6, &k, 0.2),
            Err(VerticalError::Budget { .. })
        ));
    }

    /// `sampled+locmrf`: the model gets its share with δ, every attribute the whole rest
    /// (one is reported per record), and the party composes back to its total under that
    /// encoding (under `fo` the same ε per attribute would add up); bad shares, δ, and parts
    /// below the collection minimum are refused.
    #[cfg(feature = "locmrf")]
    #[test]
    fn sampled_budget_gives_every_attribute_the_whole_report_epsilon() {
        use crate::wire::{Party, PartyAttribute, VerticalEncoding};
        let (reports, model) = sampled_party_budget(1.6, 1e-6, 3, 0.2).unwrap();
        assert!((model.epsilon.get() - 0.32).abs() < 1e-12 && model.delta == 1e-6);
        assert_eq!(reports.len(), 3);
        assert!(reports.iter().all(|e| (e.get() - 1.28).abs() < 1e-12));
        let party = Party {
            name: "bank".into(),
            attributes: reports
                .iter()
                .map(|&epsilon| PartyAttribute {
                    name: "x".into(),
                    epsilon,
                })
                .collect(),
            locmrf: Some(model),
        };
        assert!((party.composed_epsilon(VerticalEncoding::SampledLocmrf) - 1.6).abs() < 1e-9);
        assert!((party.composed_epsilon(VerticalEncoding::FoLocmrf) - 4.16).abs() < 1e-9);
        for (eps, share, delta) in [
            (1.6, 0.0, 1e-6),
            (1.6, 1.0, 1e-6),
            (1.6, 0.2, 0.0),
            (1.6, 0.2, 1.0),
            (0.02, 0.2, 1e-6),
        ] {
            assert!(matches!(
                sampled_party_budget(eps, delta, 2, share),
                Err(VerticalError::Budget { .. })
            ));
        }
    }

    /// Each attribute is randomized by its own GRR at its own ε: at the true code with
    /// probability p = e^ε/(e^ε + k − 1) (α = 1e-6 normal bound), codes in range.
    #[test]
    fn party_reports_follow_each_attributes_grr() {
        let c = config();
        let bank = PartyRandomizer::new(&c, "bank").unwrap();
        assert_eq!(bank.attributes(), &[0, 1]);
        assert_eq!(bank.party().epsilon(), 3.0);
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
        let n = 40_000;
        let mut kept = [0u32; 2];
        assert!(!bank.sampled());
        for _ in 0..n {
            let r = bank
                .record("x".into(), &[Value::from(60), Value::from("M")], &mut rng)
                .unwrap();
            assert_eq!(r.attribute, None);
            let codes = r.codes;
            assert!(codes[0] < 4 && codes[1] < 2);
            kept[0] += u32::from(codes[0] == 2);
            kept[1] += u32::from(codes[1] == 1);
        }
        for (i, (eps, k)) in [(1.0f64, 4.0), (2.0f64, 2.0)].into_iter().enumerate() {
            let p = eps.exp() / (eps.exp() + k - 1.0);
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            let got = f64::from(kept[i]) / n as f64;
            assert!((got - p).abs() < 5.0 * sd, "attribute {i}: {got} vs {p}");
        }
    }

    /// The split spends the whole budget, gives every attribute some ε, more to larger
    /// domains, and beats the equal split on its objective.
    #[test]
    fn epsilon_split_favours_large_domains_and_beats_equal() {
        let dims = [2usize, 5, 16, 41];
        let split = split_epsilon(4.0, &dims);
        assert!((split.iter().sum::<f64>() - 4.0).abs() < 1e-9);
        assert!(split.iter().all(|&e| e > 0.0));
        assert!(split.windows(2).all(|w| w[0] < w[1]), "{split:?}");
        let cost = |e: &[f64]| -> f64 {
            dims.iter()
                .zip(e)
                .map(|(&k, &e)| {
                    k as f64 * ((e.exp() + k as f64 - 2.0) / (e.exp() - 1.0).powi(2)).sqrt()
                })
                .sum()
        };
        assert!(
            cost(&split) < cost(&[1.0; 4]) * 0.95,
            "{} vs {}",
            cost(&split),
            cost(&[1.0; 4])
        );
        assert!((split_epsilon(2.0, &[3])[0] - 2.0).abs() < 1e-9);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let c = config();
        assert!(matches!(
            PartyRandomizer::new(&c, "shop"),
            Err(VerticalError::UnknownParty(_))
        ));
        let telco = PartyRandomizer::new(&c, "telco").unwrap();
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(1);
        assert!(matches!(
            telco.record("x".into(), &[], &mut rng),
            Err(VerticalError::WrongArity { .. })
        ));
        assert!(matches!(
            telco.record("x".into(), &[Value::from("z")], &mut rng),
            Err(VerticalError::Record { .. })
        ));
        // Under `sampled+locmrf` every value is checked, not only the one drawn.
        let bank = PartyRandomizer::new(&sampled_config(), "bank").unwrap();
        for _ in 0..20 {
            assert!(matches!(
                bank.record_from_codes("x".into(), &[0, 2], &mut rng),
                Err(VerticalError::Mechanism(_))
            ));
            assert!(matches!(
                bank.record("x".into(), &[Value::from(60), Value::from("X")], &mut rng),
                Err(VerticalError::Record { .. })
            ));
        }
    }

    /// The config of [`config`] under encoding `sampled+locmrf`: each bank attribute at the
    /// bank's whole report ε 1.5, a local model for each party.
    fn sampled_config() -> CollectionConfig {
        serde_json::from_str(
            r#"{"version": 1, "id": "c0ffee00-0000-4000-8000-000000000000",
            "schema": {"attributes": [
              {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 4},
              {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
              {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]}]},
            "epsilon": 2.0, "target_users": 10, "protocol": "vertical",
            "encoding": "sampled+locmrf",
            "parties": [
              {"name": "bank", "attributes": [{"name": "age", "epsilon": 1.5},
                                              {"name": "sex", "epsilon": 1.5}],
               "locmrf": {"epsilon": 0.5, "delta": 1e-6}},
              {"name": "telco", "attributes": [{"name": "plan", "epsilon": 1.5}],
               "locmrf": {"epsilon": 0.5, "delta": 1e-6}}]}"#,
        )
        .unwrap()
    }

    /// Encoding `sketch+locmrf` by its config name: a party's report ε is its attributes'
    /// sum (the ε of its one sketch report) plus its model's, the sketch settings default to
    /// §7.1's (t = 2000, 4 bins, 10% of the report's ε to n̂, δ from the model), and the
    /// per-record randomizer refuses the collection (no per-record report exists);
    /// `sketch_party_budget` splits a party's ε back to its total.
    #[test]
    fn sketch_encoding_config_and_budget() {
        use crate::wire::{SketchSettings, VerticalEncoding};
        let mut c = sampled_config();
        let Protocol::Vertical(p) = &mut c.protocol else {
            unreachable!()
        };
        p.encoding = serde_json::from_value(serde_json::json!("sketch+locmrf")).unwrap();
        assert_eq!(p.encoding, VerticalEncoding::SketchLocmrf);
        assert_eq!(serde_json::json!(p.encoding), p.encoding.name());
        assert!(p.encoding.has_local_models() && p.encoding.needs_every_local_model());
        assert_eq!(p.parties[0].report_epsilon(p.encoding), 3.0);
        assert_eq!(p.parties[0].composed_epsilon(p.encoding), 3.5);
        let p2: crate::wire::VerticalParams = serde_json::from_value(serde_json::json!({
            "parties": [], "encoding": "sketch+locmrf", "sketch": {"bins": 8}}))
        .unwrap();
        let s = p2.sketch.unwrap();
        assert_eq!((s.bins, s.repetitions, s.delta), (8, 2000, None));
        assert_eq!(s.count_share, SketchSettings::default().count_share);
        let r = PartyRandomizer::new(&c, "bank").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert!(matches!(
            r.record_from_codes("a".repeat(64), &[0, 0], &mut rng),
            Err(VerticalError::NoRecordReports)
        ));
        let (eps, model) = sketch_party_budget(0.8, 1e-6, 4, DEFAULT_SKETCH_LOCMRF_SHARE).unwrap();
        assert_eq!(eps.len(), 4);
        let total: f64 = eps.iter().map(|e| e.get()).sum::<f64>() + model.epsilon.get();
        assert!((total - 0.8).abs() < 1e-12 && (model.epsilon.get() - 0.4).abs() < 1e-12);
        assert!(sketch_party_budget(0.8, 1e-6, 4, 1.0).is_err());
        // The floor bounds the report's ε, not an attribute's share of it: party ε 0.1 over
        // 8 attributes gives shares of 0.00625 and a report of 0.05.
        let (eps, _) = sketch_party_budget(0.1, 1e-6, 8, 0.5).unwrap();
        assert!((eps[0].get() - 0.00625).abs() < 1e-15);
        assert!(sketch_party_budget(0.015, 1e-6, 8, 0.5).is_err());
    }

    /// One budget per person splits over the parties and back: under every encoding the
    /// parties' composed ε sums to the budget's ε and their δ (models plus sketch reports) to
    /// at most its δ (exactly, with local models); each party gets an equal share; a budget
    /// too small for some part is refused. A stored config without `encoding` reads as `fo`
    /// while the default (a create request's) is `sampled+locmrf`.
    #[test]
    fn one_budget_splits_over_parties_and_composes_back() {
        use crate::wire::{VerticalBudget, VerticalEncoding as E, VerticalParams};
        let parties: Vec<PartyDomains> = vec![
            ("bank".into(), vec![("age".into(), 10), ("sex".into(), 2)]),
            ("telco".into(), vec![("plan".into(), 3)]),
        ];
        let budget = VerticalBudget {
            epsilon: crate::Epsilon::new(1.6).unwrap(),
            delta: 1e-5,
            locmrf_share: None,
        };
        for encoding in [E::Fo, E::FoLocmrf, E::SampledLocmrf, E::SketchLocmrf] {
            let (split, sketch_delta) =
                split_collection_budget(&budget, encoding, &parties).unwrap();
            assert_eq!(split.len(), 2);
            let mut delta = 0.0;
            for (party, (name, attrs)) in split.iter().zip(&parties) {
                assert_eq!(&party.name, name);
                let names: Vec<&str> = party.attributes.iter().map(|a| a.name.as_str()).collect();
                assert_eq!(
                    names,
                    attrs.iter().map(|a| a.0.as_str()).collect::<Vec<_>>()
                );
                assert!(
                    (party.composed_epsilon(encoding) - 0.8).abs() < 1e-12,
                    "{encoding:?}"
                );
                assert_eq!(party.locmrf.is_some(), encoding.has_local_models());
                delta += party.locmrf.map_or(0.0, |b| b.delta) + sketch_delta.unwrap_or(0.0);
            }
            assert_eq!(sketch_delta.is_some(), encoding.is_sketch());
            let want = if encoding == E::Fo { 0.0 } else { 1e-5 };
            assert!((delta - want).abs() < 1e-18, "{encoding:?}: {delta}");
        }
        // The default share of the sketch encoding: half of each party's 0.8 to its model.
        let (split, _) = split_collection_budget(&budget, E::SketchLocmrf, &parties).unwrap();
        assert!((split[0].locmrf.unwrap().epsilon.get() - 0.4).abs() < 1e-12);
        let shared = VerticalBudget {
            locmrf_share: Some(0.25),
            ..budget
        };
        let (split, _) = split_collection_budget(&shared, E::SketchLocmrf, &parties).unwrap();
        assert!((split[1].locmrf.unwrap().epsilon.get() - 0.2).abs() < 1e-12);
        // Too small: `fo` cannot give each of bank's 2 attributes 0.01 from 0.015.
        let tiny = VerticalBudget {
            epsilon: crate::Epsilon::new(0.03).unwrap(),
            ..budget
        };
        assert!(matches!(
            split_collection_budget(&tiny, E::Fo, &parties),
            Err(VerticalError::Budget { .. })
        ));
        assert!(split_collection_budget(&budget, E::Fo, &[]).is_err());
        let bad_delta = VerticalBudget {
            delta: 1.0,
            ..budget
        };
        assert!(split_collection_budget(&bad_delta, E::SketchLocmrf, &parties).is_err());
        // Stored before `encoding` was always written: `fo`; written now: always present.
        let stored: VerticalParams =
            serde_json::from_value(serde_json::json!({"parties": []})).unwrap();
        assert_eq!(stored.encoding, E::Fo);
        assert_eq!(E::default(), E::SampledLocmrf);
        assert_eq!(serde_json::json!(stored)["encoding"], "fo");
    }

    /// Under `sampled+locmrf` a record names one attribute drawn uniformly and carries its
    /// GRR output at the attribute's ε: the outputs `(j, y)` fit `GRR_j(y | x_j)/m` (χ² at
    /// α = 1e-6, fixed seed), and the same statistic rejects the `fo` split (each attribute
    /// at ε/m), so the test has power. The party's ε is the attribute's, not the sum.
    #[test]
    fn sampled_reports_draw_one_attribute_uniformly() {
        use crate::mechanism::tests::{assert_fit_and_power, pearson};
        use crate::wire::VerticalEncoding;
        let c = sampled_config();
        let bank = PartyRandomizer::new(&c, "bank").unwrap();
        assert!(bank.sampled());
        assert_eq!(bank.encoding(), VerticalEncoding::SampledLocmrf);
        assert_eq!(bank.party().report_epsilon(bank.encoding()), 1.5);
        assert_eq!(bank.party().composed_epsilon(bank.encoding()), 2.0);
        assert_eq!(bank.party().report_epsilon(VerticalEncoding::Fo), 3.0);
        for e in [
            VerticalEncoding::Fo,
            VerticalEncoding::FoLocmrf,
            VerticalEncoding::SampledLocmrf,
        ] {
            assert_eq!(serde_json::json!(e), e.name());
        }
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(11);
        let n = 30_000;
        // Outputs (j, y) at j·4 + y: age's 4 codes, then sex's 2.
        let mut counts = vec![0u64; 6];
        for _ in 0..n {
            let r = bank
                .record("x".into(), &[Value::from(60), Value::from("M")], &mut rng)
                .unwrap();
            let j = r.attribute.expect("sampled records name their attribute");
            assert_eq!(r.codes.len(), 1);
            counts[[0, 4][j as usize] + r.codes[0] as usize] += 1;
        }
        let theory = |e: f64| -> Vec<f64> {
            let mut out = Vec::new();
            for (k, v) in [(4usize, 2usize), (2, 1)] {
                let p = e.exp() / (e.exp() + k as f64 - 1.0);
                let q = (1.0 - p) / (k - 1) as f64;
                out.extend((0..k).map(|y| if y == v { p / 2.0 } else { q / 2.0 }));
            }
            out
        };
        assert_fit_and_power(
            "sampled party report",
            pearson(&counts, &theory(1.5)),
            pearson(&counts, &theory(0.75)),
        );
    }
}
