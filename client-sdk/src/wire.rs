//! Wire format v1: the JSON shapes exchanged between the SDK and the aggregator, and the
//! one list of problem types (RFC 9457) used by the server, the SDK's typed errors and the
//! WASM client's `code`.
//!
//! Report payloads (docs/design.md "Wire formats"):
//!
//! ```
//! use ldpsyn::wire::{Payload, OueBits};
//! assert_eq!(serde_json::to_string(&Payload::Grr(17)).unwrap(), r#"{"grr":17}"#);
//! assert_eq!(serde_json::to_string(&Payload::GrrPair([3, 5])).unwrap(), r#"{"grr_pair":[3,5]}"#);
//! // OUE: base64url without padding, ⌈k/8⌉ bytes, bit i in byte i/8, LSB first.
//! let p = Payload::Oue(OueBits(vec![0b0000_0101, 0b1]));
//! assert_eq!(serde_json::to_string(&p).unwrap(), r#"{"oue":"BQE"}"#);
//! ```
//!
//! A task and a report:
//!
//! ```
//! use ldpsyn::wire::{Task, Report};
//! let task: Task = serde_json::from_str(r#"{
//!   "collection_id": "c0ffee00-0000-4000-8000-000000000000", "round": 2, "factor": [0, 3],
//!   "mechanism": "oue", "epsilon": 4.0, "token": "opaque", "expires_at": 1790000000
//! }"#).unwrap();
//! let report: Report = serde_json::from_str(r#"{
//!   "id": "0b5a3c47-3cfd-4b5e-9a3a-7e2f3c1d2e10", "token": "opaque", "payload": {"grr": 17}
//! }"#).unwrap();
//! assert_eq!(task.factor, vec![0, 3]);
//! # let _ = report;
//! ```

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Epsilon;
use crate::mechanism::MechanismKind;
use crate::schema::Schema;

/// Version of this wire protocol; the HTTP paths carry it as `/v1/`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Most tasks one `GET …/task?count=n` may ask for.
pub const MAX_TASKS_PER_REQUEST: usize = 1000;

/// Default most reports in one upload (`POST …/reports`); servers may configure another.
pub const DEFAULT_MAX_REPORTS_PER_UPLOAD: usize = 1000;

/// Default largest request body a server takes, bytes (4 MiB); servers may configure another
/// and publish it as [`UploadLimits::max_body_bytes`].
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The server's limits on one upload, published in a collection's public view
/// (`GET /v1/collections/{id}`, key `upload_limits`) so that clients size their uploads to
/// fit. They are the server's, not the collection's: every collection of a server shares
/// them. A view without them (an older server) means [`UploadLimits::default`].
///
/// ```
/// use ldpsyn::wire::UploadLimits;
/// let l: UploadLimits = serde_json::from_str(
///     r#"{"max_body_bytes": 4194304, "max_reports_per_upload": 1000}"#).unwrap();
/// assert_eq!(l, UploadLimits::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadLimits {
    /// Largest request body the server reads, bytes: a larger one is answered
    /// `413 payload-too-large` (refused before it is read when its `Content-Length` says so).
    pub max_body_bytes: u64,
    /// Most reports in one `POST …/reports` (413 above). Party uploads have their own count
    /// limit, [`crate::vertical::MAX_RECORDS_PER_UPLOAD`]; `max_body_bytes` applies to both.
    pub max_reports_per_upload: u64,
}

impl Default for UploadLimits {
    /// [`DEFAULT_MAX_BODY_BYTES`] and [`DEFAULT_MAX_REPORTS_PER_UPLOAD`], a server's defaults.
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES as u64,
            max_reports_per_upload: DEFAULT_MAX_REPORTS_PER_UPLOAD as u64,
        }
    }
}

impl UploadLimits {
    /// The most bytes a client puts in one body: `max_body_bytes` less a margin of 1/64
    /// (64 KiB at the default 4 MiB). Clients measure their bodies exactly; the margin keeps
    /// them clear of the limit when something between client and server (a proxy, a server
    /// restarted with a slightly lower limit) takes a little less than advertised.
    pub fn body_budget(&self) -> usize {
        let max = usize::try_from(self.max_body_bytes).unwrap_or(usize::MAX);
        max - max / 64
    }

    /// The most reports a client puts in one upload: `max_reports_per_upload`, at least 1.
    pub fn reports_per_upload(&self) -> usize {
        usize::try_from(self.max_reports_per_upload)
            .unwrap_or(usize::MAX)
            .max(1)
    }
}

/// An OUE bitset: `⌈k/8⌉` bytes, bit i in byte i/8, least significant bit first.
/// Serialized as base64url without padding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OueBits(pub Vec<u8>);

impl Serialize for OueBits {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for OueBits {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.as_bytes())
            .map(OueBits)
            .map_err(|e| {
                serde::de::Error::custom(format!("OUE bits are not base64url without padding: {e}"))
            })
    }
}

/// A randomized report payload. Exactly one key, as in docs/design.md "Wire formats".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Payload {
    /// Row-major index in the factor's product domain.
    Grr(u64),
    /// The two randomized codes of a SamPrivSyn pair report.
    GrrPair([u64; 2]),
    /// The OUE bitset.
    Oue(OueBits),
}

impl Payload {
    /// The mechanism this payload belongs to.
    pub fn kind(&self) -> MechanismKind {
        match self {
            Payload::Grr(_) => MechanismKind::Grr,
            Payload::GrrPair(_) => MechanismKind::GrrPair,
            Payload::Oue(_) => MechanismKind::Oue,
        }
    }
}

fn default_omega() -> f64 {
    0.5
}
fn default_rounds() -> u32 {
    6
}
fn default_phi() -> f64 {
    0.3
}
fn default_alpha() -> f64 {
    0.05
}
fn default_sigma() -> u64 {
    4096
}
fn default_batch_size() -> u64 {
    2000
}

/// PrivIncr parameters (EDBT 2023), names as in docs/design.md "Wire formats".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrivIncrParams {
    /// Share of users that build the dependency graph (phase 1), in (0, 1); default 0.5.
    #[serde(default = "default_omega")]
    pub omega: f64,
    /// Phase-1 rounds T ≥ 1; default 6 (`noincremental` forces 1).
    #[serde(default = "default_rounds")]
    pub rounds: u32,
    /// Cramér's-V-like strength φ in τ = min(|Ω_i|−1, |Ω_j|−1)·φ²/2 (eq. 15); default 0.3.
    #[serde(default = "default_phi")]
    pub phi: f64,
    /// Failure probability α of the relaxed threshold ℓ = τ − ΔI(η) (Theorem 5.2); default 0.05.
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Clique domain size above which Algorithm 2 factorizes the clique; default 4096.
    #[serde(default = "default_sigma")]
    pub sigma: u64,
}

impl Default for PrivIncrParams {
    fn default() -> Self {
        Self {
            omega: default_omega(),
            rounds: default_rounds(),
            phi: default_phi(),
            alpha: default_alpha(),
            sigma: default_sigma(),
        }
    }
}

/// SamPrivSyn parameters (Sci China Inf Sci 2023).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SamPrivSynParams {
    /// Reports between re-weightings B ≥ 1; default 2000 (the paper finds 1000–5000 best).
    #[serde(default = "default_batch_size")]
    pub batch_size: u64,
}

impl Default for SamPrivSynParams {
    fn default() -> Self {
        Self {
            batch_size: default_batch_size(),
        }
    }
}

/// One attribute a party of a vertical collection reports, and the ε of its GRR report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartyAttribute {
    /// The attribute's name in the collection's schema.
    pub name: String,
    /// ε of the attribute's GRR report (VertiMRF §4.2, eq. 6).
    pub epsilon: Epsilon,
}

/// One party of a vertical collection: a data holder (a bank, a telecom) that uploads, per
/// record id, one GRR report per attribute it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Party {
    /// Name, used in upload paths: 1–64 of `a-z`, `0-9`, `-`, `_`.
    pub name: String,
    /// Its attributes, in the order of the codes of its uploads.
    pub attributes: Vec<PartyAttribute>,
    /// The party's central-DP budget for its local model of its own attributes (VertiMRF
    /// §4.1, LocMRF), when the collection's encoding is [`VerticalEncoding::FoLocmrf`] (at
    /// least one party), [`VerticalEncoding::SampledLocmrf`] or
    /// [`VerticalEncoding::SketchLocmrf`] (every party); absent otherwise.
    #[cfg(feature = "locmrf")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locmrf: Option<LocMrfBudget>,
}

impl Party {
    /// ε of the party's reports about one person under encoding `fo`: the sum of its
    /// attributes' ε (sequential composition of independent GRR reports on one record).
    pub fn epsilon(&self) -> f64 {
        self.attributes.iter().map(|a| a.epsilon.get()).sum()
    }
}

#[cfg(feature = "locmrf")]
impl Party {
    /// ε of the party's reports about one person under `encoding`: the sum of its
    /// attributes' ε under `fo` and `fo+locmrf` ([`Party::epsilon`]); under `sampled+locmrf`
    /// the largest attribute ε, since one report carries one attribute drawn independently
    /// of the data (see [`VerticalEncoding::SampledLocmrf`]); under `sketch+locmrf` the sum
    /// of its attributes' ε, its share of the sketches of all parties (accounted together at
    /// the δ of [`SketchSettings::delta`]; see [`VerticalEncoding::SketchLocmrf`]).
    pub fn report_epsilon(&self, encoding: VerticalEncoding) -> f64 {
        match encoding {
            VerticalEncoding::Fo | VerticalEncoding::FoLocmrf | VerticalEncoding::SketchLocmrf => {
                self.epsilon()
            }
            VerticalEncoding::SampledLocmrf => self
                .attributes
                .iter()
                .map(|a| a.epsilon.get())
                .fold(0.0, f64::max),
        }
    }

    /// ε of everything the party releases about one person under `encoding`: its reports'
    /// ε ([`Party::report_epsilon`]) plus its local model's ε ([`Party::locmrf`]) by basic
    /// sequential composition; the δ is the local model's (0 without one), plus the sketch
    /// report's under `sketch+locmrf` ([`SketchSettings::delta`]).
    pub fn composed_epsilon(&self, encoding: VerticalEncoding) -> f64 {
        self.report_epsilon(encoding) + self.locmrf.as_ref().map_or(0.0, |b| b.epsilon.get())
    }
}

/// How the parties of a vertical collection encode their data (`"encoding"` of the config).
/// A create request without `encoding` gets [`VerticalEncoding::SampledLocmrf`] (the
/// [`Default`]: the most accurate encoding whose guarantee holds, `docs/results.md`); a stored config without it, written before the key was always stored, is
/// [`VerticalEncoding::Fo`].
#[cfg(feature = "locmrf")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum VerticalEncoding {
    /// Every attribute of every record reported with GRR (VertiMRF §4.2, FO-based LocEnc);
    /// the server estimates every marginal from those reports. The paper's baseline.
    #[serde(rename = "fo")]
    Fo,
    /// As `fo`, and each party also uploads a central-DP model of its own attributes (VertiMRF
    /// §4.1, LocMRF: noisy marginals with their variances and its attribute graph), measured
    /// within its [`Party::locmrf`] budget; the server adds those measurements to the fit.
    #[serde(rename = "fo+locmrf")]
    FoLocmrf,
    /// Each party reports, per record, ONE of its attributes drawn uniformly at random (on
    /// the party's side, independently of the data), with GRR at that attribute's ε (set to
    /// the party's whole report budget), and names the attribute in the report
    /// ([`crate::vertical::PartyRecord::attribute`]); every party uploads its local model
    /// as under `fo+locmrf`. The attribute's index does not depend on the record, so a
    /// report is ε_a-LDP for the party's row (the mixture over attributes of ε_a-LDP
    /// outputs, each tagged by its index, has likelihood ratio at most max_a e^{ε_a}).
    /// A cross-party pair is estimated from the records whose two parties drew its two
    /// attributes (VertiMRF §4.2's Kronecker inverse on ≈ n/(k_A·k_B) records, each at the
    /// parties' whole ε); pairs within a party are not estimable from the reports and come
    /// from the local models alone. The default.
    #[default]
    #[serde(rename = "sampled+locmrf")]
    SampledLocmrf,
    /// VertiMRF as published (§4.3, Algorithms 1, 3, 4): each party uploads its local model
    /// as under `fo+locmrf` and ONE sketch report, no per-record report. The aggregator
    /// learns, per party, its local model and, per attribute value (after §6's equal-width
    /// binning to at most [`SketchSettings::bins`] bins, which depends on the domain only),
    /// `t` DP Flajolet–Martin sketches of the set of record ids holding it, plus a noisy
    /// record count n̂; never a raw value, a record's codes or a set of ids. It estimates
    /// cross-party 2-way marginals (in bins) from the sketches by inclusion–exclusion
    /// (CarEst). Parties share the sketch key as they share the record-id key (the server
    /// checks that every report carries the same key fingerprint), so one person's hash is
    /// in every party's sketches: the sketches of all parties are accounted as one
    /// mechanism by the exact accountant of `ldpsyn_engine::measure::sketch_privacy` (not
    /// VertiMRF's Theorem 2, which misses the shared hash), at the parties' report ε summed
    /// less [`SketchSettings::count_share`] and their sketch δ summed; each party's n̂
    /// (discrete Laplace) spends the count share of its own report ε
    /// ([`Party::report_epsilon`]). Sound parameters need far more phantoms than the
    /// paper's, so the sketches carry little at populations below about t/δ.
    #[serde(rename = "sketch+locmrf")]
    SketchLocmrf,
}

#[cfg(feature = "locmrf")]
impl VerticalEncoding {
    /// The encoding of a stored config without `encoding`: [`VerticalEncoding::Fo`], which
    /// configs left out until the default became [`VerticalEncoding::SketchLocmrf`].
    pub fn when_absent() -> Self {
        VerticalEncoding::Fo
    }

    /// The encoding's name in configs (its serde name).
    pub fn name(&self) -> &'static str {
        match self {
            VerticalEncoding::Fo => "fo",
            VerticalEncoding::FoLocmrf => "fo+locmrf",
            VerticalEncoding::SampledLocmrf => "sampled+locmrf",
            VerticalEncoding::SketchLocmrf => "sketch+locmrf",
        }
    }

    /// Whether parties upload local models (LocMRF) under this encoding: required under
    /// `sampled+locmrf` and `sketch+locmrf` for every party, allowed under `fo+locmrf`.
    pub fn has_local_models(&self) -> bool {
        matches!(
            self,
            VerticalEncoding::FoLocmrf
                | VerticalEncoding::SampledLocmrf
                | VerticalEncoding::SketchLocmrf
        )
    }

    /// Whether every party must upload a local model (`sampled+locmrf`, `sketch+locmrf`:
    /// no report measures the pairs within a party).
    pub fn needs_every_local_model(&self) -> bool {
        matches!(
            self,
            VerticalEncoding::SampledLocmrf | VerticalEncoding::SketchLocmrf
        )
    }

    /// Whether parties upload sketch reports instead of per-record reports
    /// (`sketch+locmrf`).
    pub fn is_sketch(&self) -> bool {
        *self == VerticalEncoding::SketchLocmrf
    }

    /// Whether each record's report carries one sampled attribute (`sampled+locmrf`)
    /// rather than every attribute of the party.
    pub fn is_sampled(&self) -> bool {
        *self == VerticalEncoding::SampledLocmrf
    }
}

/// A party's central (ε, δ)-DP budget for its local model (LocMRF, VertiMRF §4.1): the
/// neighbouring tables differ by one person's row of the party's attributes.
#[cfg(feature = "locmrf")]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LocMrfBudget {
    /// ε of the guarantee.
    pub epsilon: Epsilon,
    /// δ of the guarantee, in (0, 1); 1/n or below is customary. The server refuses a config
    /// outside (0, 1).
    pub delta: f64,
}

/// Parameters of a vertical collection (VertiMRF): the parties and what each reports. Every
/// schema attribute belongs to exactly one party.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VerticalParams {
    /// The parties. A create request with a `budget` lists each party's attributes by name
    /// only (`{"name": "bank", "attributes": ["age", "income"]}`); the server fills in their
    /// ε and the local models' budgets.
    pub parties: Vec<Party>,
    /// How the parties encode their data. Always serialized; the server fills in
    /// `"sketch+locmrf"` when a create request leaves it out, and reads a stored config
    /// without it as `"fo"` ([`VerticalEncoding::when_absent`]).
    #[cfg(feature = "locmrf")]
    #[serde(default = "VerticalEncoding::when_absent")]
    pub encoding: VerticalEncoding,
    /// The one budget per person the parties' parts were derived from at creation
    /// ([`crate::vertical::split_collection_budget`]), when the create request gave one
    /// instead of every attribute's ε and every local model's budget; absent otherwise.
    #[cfg(feature = "locmrf")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<VerticalBudget>,
    /// The sketch reports' settings under encoding `sketch+locmrf` (absent: the defaults of
    /// [`SketchSettings`]); refused under any other encoding.
    #[cfg(feature = "locmrf")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<SketchSettings>,
}

/// One privacy budget per person for a vertical collection (VertiMRF Algorithm 2, §7.1):
/// what one person's data may cost over every party together. The server splits it at
/// creation ([`crate::vertical::split_collection_budget`]): equally over the parties, then
/// within a party between its local model and its reports by the encoding's split.
#[cfg(feature = "locmrf")]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VerticalBudget {
    /// ε per person over every party (the parties' releases compose sequentially).
    pub epsilon: Epsilon,
    /// δ per person over every party, in (0, 1). Absent in a create request: 1/`target_users`
    /// (VertiMRF §7.1's δ = 1/n), at most 1e-3.
    pub delta: f64,
    /// Share of each party's ε for its local model, in (0, 1). Absent: the encoding's default
    /// ([`crate::vertical::DEFAULT_SKETCH_LOCMRF_SHARE`] under `sketch+locmrf`,
    /// [`crate::vertical::DEFAULT_LOCMRF_SHARE`] under `fo+locmrf` and `sampled+locmrf`;
    /// unused under `fo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locmrf_share: Option<f64>,
}

/// Settings of the sketch reports of a `sketch+locmrf` collection (VertiMRF §4.3, §6, §7.1),
/// the same for every party (sketches of one repetition merge across parties only if `t`
/// and γ agree).
#[cfg(feature = "locmrf")]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SketchSettings {
    /// δ of each party's share of the sketches (summed over parties for the sketches of all
    /// parties, which are accounted together), in (0, 1). Absent: the party's
    /// `locmrf.delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// `t`, sketches per attribute value (default 2000, the paper's §7.1).
    #[serde(default = "default_repetitions")]
    pub repetitions: u32,
    /// Most bins per attribute for the sketches (§6.1's equal-width `b`; default 4, the
    /// paper's); an attribute of at most this many values is sketched unbinned.
    #[serde(default = "default_sketch_bins")]
    pub bins: u32,
    /// Share of the report's ε for the noisy count n̂ (default 0.1, §7.1), in (0, 1).
    #[serde(default = "default_count_share")]
    pub count_share: f64,
}

#[cfg(feature = "locmrf")]
impl Default for SketchSettings {
    fn default() -> Self {
        Self {
            delta: None,
            repetitions: default_repetitions(),
            bins: default_sketch_bins(),
            count_share: default_count_share(),
        }
    }
}

#[cfg(feature = "locmrf")]
fn default_repetitions() -> u32 {
    2000
}

#[cfg(feature = "locmrf")]
fn default_sketch_bins() -> u32 {
    4
}

#[cfg(feature = "locmrf")]
fn default_count_share() -> f64 {
    0.1
}

/// A collection protocol and its parameters. JSON: `{"protocol": "privincr", "omega": 0.5, …}`
/// flattened into the collection config. Unknown keys are ignored here so that clients keep
/// working when the server adds fields; the server checks its own create requests strictly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Protocol {
    /// PrivIncr: incremental graph construction with pruning, then clique measurement.
    Privincr(PrivIncrParams),
    /// PrivIncr with a single phase-1 round (T = 1).
    Noincremental(PrivIncrParams),
    /// SamPrivSyn: MI-weighted pair sampling, pair reports of two GRRs at ε/2.
    Samprivsyn(SamPrivSynParams),
    /// Each user reports one attribute; synthesis from the product of 1-way marginals.
    Independence {},
    /// The project's recommended default: the engine chooses factors and mechanisms.
    Auto(PrivIncrParams),
    /// Several parties hold different attributes of the same people and upload per-record
    /// GRR reports joined by a pseudonymous record id (VertiMRF; [`crate::vertical`]).
    Vertical(VerticalParams),
}

impl Protocol {
    /// The protocol's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Protocol::Privincr(_) => "privincr",
            Protocol::Noincremental(_) => "noincremental",
            Protocol::Samprivsyn(_) => "samprivsyn",
            Protocol::Independence {} => "independence",
            Protocol::Auto(_) => "auto",
            Protocol::Vertical(_) => "vertical",
        }
    }
}

/// The public configuration of a collection, as served by `GET /v1/collections/{id}`.
///
/// ```
/// use ldpsyn::wire::{CollectionConfig, Protocol};
/// let c: CollectionConfig = serde_json::from_str(r#"{
///   "version": 1, "id": "c0ffee00-0000-4000-8000-000000000000",
///   "schema": {"attributes": [{"name": "sex", "type": "categorical", "labels": ["F", "M"]},
///                             {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]}]},
///   "epsilon": 4.0, "target_users": 100000, "protocol": "privincr", "rounds": 6
/// }"#).unwrap();
/// assert!(matches!(c.protocol, Protocol::Privincr(ref p) if p.rounds == 6 && p.omega == 0.5));
/// // Stored before the lifecycle options: no finalize at the target, reports past it taken.
/// assert!(!c.auto_finalize_at_target);
/// assert_eq!(c.past_target, ldpsyn::wire::PastTarget::Accept);
/// assert_eq!(c.retain_reports_days, None);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionConfig {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Collection id.
    pub id: Uuid,
    /// A name for people (operators' lists, the dashboard), at most
    /// [`MAX_COLLECTION_NAME_CHARS`] characters; not part of the protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the collection is for, for people, at most
    /// [`MAX_COLLECTION_DESCRIPTION_CHARS`] characters; not part of the protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The schema every record follows.
    pub schema: Schema,
    /// ε of every report.
    pub epsilon: Epsilon,
    /// Number of users N the collection aims at.
    pub target_users: u64,
    /// Protocol and parameters.
    #[serde(flatten)]
    pub protocol: Protocol,
    /// Finalize the collection by itself once `target_users` reports are accepted (the
    /// finalize of `POST …/finalize`, run by the commit that reaches the target). A create
    /// request without it gets `true` (device collections; vertical ones are finalized by
    /// hand); a config stored before this option reads `false`, so those collections behave
    /// as before.
    #[serde(default)]
    pub auto_finalize_at_target: bool,
    /// What happens to reports that arrive once `target_users` are accepted. A create request
    /// without it gets [`PastTarget::Refuse`] (device collections); a config stored before
    /// this option reads [`PastTarget::Accept`], as such collections took them.
    #[serde(default = "PastTarget::before_the_option")]
    pub past_target: PastTarget,
    /// Days the raw reports (and a vertical collection's party records) are kept after the
    /// collection is finalized; then the server deletes them, keeping the tables (sufficient
    /// statistics), the model and the counts. Absent: kept until the collection is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_reports_days: Option<u32>,
    /// The attributes the data is collected to predict (label columns), by name: `auto`
    /// weighs their pairs with every other attribute as much as all other pairs together
    /// when it chooses what to measure and which pairs enter the model, and the model's
    /// fitness report says how much of each target the model explains. Empty: every pair
    /// weighs the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target: Vec<String>,
}

/// What a collection does with reports that arrive once its `target_users` are accepted
/// ([`CollectionConfig::past_target`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum PastTarget {
    /// Refuse them (`409 collection-target-reached`); the collection counts exactly
    /// `target_users` reports, whether or not it is finalized yet.
    Refuse,
    /// Take them while the collection is open. With
    /// [`CollectionConfig::auto_finalize_at_target`] the collection is finalized at the
    /// target anyway, so later reports are refused `collection-finalized`; without it they
    /// are accepted until an operator finalizes.
    Accept,
}

impl PastTarget {
    /// The value of a config stored before the option existed: [`PastTarget::Accept`].
    pub fn before_the_option() -> Self {
        PastTarget::Accept
    }
}

/// Most days of [`CollectionConfig::retain_reports_days`] (100 years).
pub const MAX_RETAIN_REPORTS_DAYS: u32 = 36_500;

/// Most characters of a collection's [`CollectionConfig::name`].
pub const MAX_COLLECTION_NAME_CHARS: usize = 100;

/// Most characters of a collection's [`CollectionConfig::description`].
pub const MAX_COLLECTION_DESCRIPTION_CHARS: usize = 2000;

/// What the server asks one person to report. `GET /v1/collections/{id}/task` answers one
/// `Task` object; `GET …/task?count=n` (n ≤ [`MAX_TASKS_PER_REQUEST`]) a JSON array of n
/// independently drawn tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Task {
    /// The collection.
    pub collection_id: Uuid,
    /// Round (PrivIncr) or batch (SamPrivSyn) the task belongs to.
    pub round: u32,
    /// The factor, as attribute indices into the schema, in report order.
    pub factor: Vec<usize>,
    /// The mechanism to randomize with.
    pub mechanism: MechanismKind,
    /// Bin maps, one per factor attribute in factor order, as interior cut points
    /// ([`crate::factor::bin_count`]; `[]` for an attribute reported at full resolution); absent
    /// when no attribute is binned. The device maps its codes to bins, then randomizes over the
    /// product of the bin counts (docs/design.md "Tasks with bin maps").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
    /// ε of the report.
    pub epsilon: Epsilon,
    /// Opaque signed token binding all of the above; the report carries it back.
    pub token: String,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
}

/// One person's randomized report, as posted in `POST /v1/collections/{id}/reports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Report {
    /// Random UUID v4, chosen on the device; retries reuse it.
    pub id: Uuid,
    /// The task token this report answers.
    pub token: String,
    /// The randomized payload.
    pub payload: Payload,
}

/// Outcome of one report of an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ReportStatus {
    /// Validated and durably committed.
    Accepted,
    /// A report with this id was committed before; it counts once.
    Duplicate,
    /// Refused; see the problem.
    Rejected,
}

/// The answer for one report of an upload (the 200 body is an array of these).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportAnswer {
    /// The report id.
    pub id: Uuid,
    /// What happened.
    pub status: ReportStatus,
    /// Why it was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

macro_rules! problem_types {
    ($( $(#[$doc:meta])* $variant:ident = $slug:literal, $status:literal, $title:literal; )*) => {
        /// The one list of problem types (RFC 9457 `type`), shared by server, SDK and WASM.
        /// Each serializes as `urn:ldpsyn:problem:<slug>`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ProblemType {
            $( $(#[$doc])* $variant, )*
        }

        impl ProblemType {
            /// Every problem type.
            pub const ALL: &'static [ProblemType] = &[$(ProblemType::$variant),*];

            /// The short name, e.g. `invalid-token` (the WASM client's `code`).
            pub fn slug(self) -> &'static str {
                match self { $(ProblemType::$variant => $slug,)* }
            }

            /// The HTTP status the server answers with.
            pub fn status(self) -> u16 {
                match self { $(ProblemType::$variant => $status,)* }
            }

            /// A short human-readable summary.
            pub fn title(self) -> &'static str {
                match self { $(ProblemType::$variant => $title,)* }
            }
        }
    };
}

problem_types! {
    /// The body is not valid JSON of the expected shape.
    MalformedRequest = "malformed-request", 400, "Malformed request";
    /// A query or body parameter has an invalid value.
    InvalidParameter = "invalid-parameter", 400, "Invalid parameter";
    /// The schema is invalid.
    InvalidSchema = "invalid-schema", 400, "Invalid schema";
    /// A record does not fit the schema (client side).
    InvalidRecord = "invalid-record", 400, "Invalid record";
    /// The payload does not match the task's mechanism or domain.
    InvalidPayload = "invalid-payload", 400, "Invalid report payload";
    /// The token is malformed, forged, or signed for another collection.
    InvalidToken = "invalid-token", 400, "Invalid task token";
    /// The token has expired.
    TokenExpired = "token-expired", 400, "Task token expired";
    /// The token already answered another report.
    TokenReused = "token-reused", 409, "Task token already used";
    /// Missing or wrong admin credentials.
    Unauthorized = "unauthorized", 401, "Unauthorized";
    /// No such collection.
    UnknownCollection = "unknown-collection", 404, "Unknown collection";
    /// No such resource.
    NotFound = "not-found", 404, "Not found";
    /// The path exists but not with this method (the `Allow` header lists the ones it has).
    MethodNotAllowed = "method-not-allowed", 405, "Method not allowed";
    /// The collection is finalized and takes no more tasks or reports.
    CollectionFinalized = "collection-finalized", 409, "Collection finalized";
    /// The collection has the `target_users` reports it asked for and refuses more (created
    /// with `past_target: refuse`, the default); it hands out no more tasks either.
    CollectionTargetReached = "collection-target-reached", 409, "Collection target reached";
    /// The model is not built yet (finalize first).
    ModelNotReady = "model-not-ready", 409, "Model not ready";
    /// The request conflicts with the collection's state.
    Conflict = "conflict", 409, "Conflict";
    /// An operator asked to close the open round (or batch) before any report arrived in it;
    /// closing it would decide from no data. Rounds close by themselves at their quota;
    /// `?force=true` closes it anyway.
    RoundEmpty = "round-empty", 409, "Round has no reports";
    /// A vertical collection's party already uploaded this record id with other codes.
    RecordIdConflict = "record-id-conflict", 409, "Record id already holds other codes";
    /// The body is too large, or the batch has too many reports.
    PayloadTooLarge = "payload-too-large", 413, "Payload too large";
    /// Too many requests from this client, or too many of its requests at once; retry later.
    RateLimited = "rate-limited", 429, "Too many requests";
    /// The request's body arrived slower than the server's minimum rate and was cut; send it
    /// again (RFC 9110 §15.5.9).
    RequestTimeout = "request-timeout", 408, "Request body too slow";
    /// The server or a config asks for more ε than the app accepts (client side).
    EpsilonTooLarge = "epsilon-too-large", 400, "Epsilon above the accepted maximum";
    /// The device budget for this collection is spent (client side).
    BudgetExhausted = "budget-exhausted", 403, "Privacy budget exhausted";
    /// The device has no budget ledger that outlives the page (client side, WASM: a browser
    /// with `localStorage` blocked, or without the Web Locks API); nothing was sent or spent.
    LedgerUnavailable = "ledger-unavailable", 500, "Budget ledger unavailable";
    /// An internal error; details are logged, not returned.
    Internal = "internal", 500, "Internal error";
    /// The server is overloaded or shutting down; retry later.
    Unavailable = "unavailable", 503, "Service unavailable";
    /// The collection is stored but this server could not load it (its stored config or
    /// state is unreadable); the other collections are served. An operator must repair it.
    CollectionUnavailable = "collection-unavailable", 503, "Collection unavailable";
}

/// Prefix of every problem type URI.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:ldpsyn:problem:";

impl ProblemType {
    /// The full type URI, `urn:ldpsyn:problem:<slug>`.
    pub fn uri(self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.slug())
    }

    /// Parses a full URI or a bare slug.
    pub fn parse(s: &str) -> Option<Self> {
        let slug = s.strip_prefix(PROBLEM_TYPE_PREFIX).unwrap_or(s);
        Self::ALL.iter().copied().find(|t| t.slug() == slug)
    }
}

impl std::fmt::Display for ProblemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.slug())
    }
}

impl Serialize for ProblemType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.uri())
    }
}

impl<'de> Deserialize<'de> for ProblemType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown problem type `{s}`")))
    }
}

/// An RFC 9457 problem document (`application/problem+json`).
///
/// ```
/// use ldpsyn::wire::{Problem, ProblemType};
/// let p = Problem::new(ProblemType::TokenExpired, "token expired at 1790000000");
/// assert_eq!(serde_json::to_value(&p).unwrap(), serde_json::json!({
///   "type": "urn:ldpsyn:problem:token-expired", "title": "Task token expired",
///   "status": 400, "detail": "token expired at 1790000000"}));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// The problem type.
    #[serde(rename = "type")]
    pub problem_type: ProblemType,
    /// Short summary of the type.
    pub title: String,
    /// HTTP status.
    pub status: u16,
    /// What went wrong in this occurrence.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Problem {
    /// A problem of `problem_type` with its title and status and the given detail.
    pub fn new(problem_type: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            problem_type,
            title: problem_type.title().to_owned(),
            status: problem_type.status(),
            detail: detail.into(),
        }
    }

    /// The problem of a non-2xx answer of HTTP `status` whose body is `body`: the problem
    /// document it holds, else (a proxy's page, an empty body) an `internal` problem for a
    /// 5xx or `malformed-request` otherwise, with the status and the body as its detail.
    pub fn of_answer(status: u16, body: &str) -> Self {
        // `from_str`, as the WASM client parses every answer: one parser in its binary.
        serde_json::from_str(body).unwrap_or_else(|_| {
            Problem::new(
                if status >= 500 {
                    ProblemType::Internal
                } else {
                    ProblemType::MalformedRequest
                },
                format!("HTTP {status}: {body}"),
            )
        })
    }
}

/// Media type of problem documents.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";
