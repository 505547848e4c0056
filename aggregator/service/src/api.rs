//! The JSON answers of the HTTP API that are not SDK wire types: one typed struct per answer,
//! serialized by the handlers and described by the OpenAPI document
//! ([`super::openapi`]), so the two cannot drift apart.
//!
//! The engine's own types (phases, round transitions, the model description) are described by
//! the schemas of this module's `*_schema` functions rather than derived: the engine crate is
//! IO-free and carries no OpenAPI dependency.

use std::collections::BTreeMap;

use ldpsyn::wire::CollectionConfig;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};

use ldpsyn_engine::{ModelDescription, Phase, Transition};

/// `GET /healthz`: the state is loaded, the API serves and the database answered. It does
/// not wait for models: after a restart finalized collections' models are refitted in the
/// background, and `models_pending` counts those not back yet.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` (a failing database is a 500 problem; a process still loading its state
    /// answers 503 `unavailable`).
    #[schema(example = "ok")]
    pub status: String,
    /// Finalized collections whose model is being refitted (their model routes answer 409
    /// `model-not-ready` until it is back), or whose refit failed.
    #[schema(example = 0)]
    pub models_pending: usize,
}

/// Where a collection is: its phase, round and counts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CollectionStatus {
    /// The protocol phase.
    #[schema(schema_with = phase_schema)]
    pub phase: Phase,
    /// Round (PrivIncr/auto phase 1) or batch (SamPrivSyn) now open; 0 otherwise.
    pub round: u32,
    /// Reports that close the open round; `null` when no quota applies.
    pub round_quota: Option<u64>,
    /// Reports accepted in the open round.
    pub round_accepted: u64,
    /// Reports (or vertical records) accepted in all.
    pub reports_accepted: u64,
    /// Attribute pairs `[a, b]` still measured (PrivIncr/auto phase 1).
    pub active_edges: Vec<[usize; 2]>,
    /// The model is built (the collection is finalized): `model` is `ready`.
    pub model_ready: bool,
    /// Where the model stands: `collecting` (not finalized), `building` (finalized, being
    /// fitted: poll until `ready`), `ready` or `failed` (`model_error` says why; `POST
    /// …/finalize` fits again).
    pub model: ModelStatus,
    /// Why the last fit failed, when `model` is `failed`.
    pub model_error: Option<String>,
    /// PrivIncr, NoIncremental and `auto`: every round the collection's state holds, closed,
    /// open or still to come, phase 2 last; a finalized collection lists only the rounds that
    /// ran. Empty for the other protocols (SamPrivSyn counts its batches in `round`).
    pub rounds: Vec<RoundStatus>,
}

/// Where a collection's model stands (`CollectionHandle::model_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelStatus {
    /// Not finalized: no final model yet.
    Collecting,
    /// Finalized; the model is being fitted (after a finalize, or refitted after a restart).
    Building,
    /// Finalized; the model is built.
    Ready,
    /// Finalized; the last fit failed (`POST …/finalize` fits again).
    Failed,
}

/// One round of a two-phase collection (PrivIncr, NoIncremental, `auto`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RoundStatus {
    /// Round index (the tasks' round).
    pub round: u32,
    /// What the round measures.
    pub kind: RoundKind,
    /// Closed, open (taking reports) or planned.
    pub state: RoundState,
    /// Reports accepted in the round.
    pub reports: u64,
    /// Pairs dropped when the round closed: pruned (PrivIncr) or not selected (`auto`'s
    /// screening round).
    pub pruned: u64,
}

/// What a round measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoundKind {
    /// Every attribute alone (`auto`'s round 0; PrivIncr's round 0 when the schema has
    /// numeric attributes with automatic bins).
    OneWays,
    /// The pairs still active, pruned at the round's close (PrivIncr phase 1).
    Pairs,
    /// `auto`'s screening round: every pair that could pay for its reports; phase 2's pairs
    /// are selected at its close.
    Screening,
    /// Phase 2: the factors planned at the end of phase 1; closes at finalize.
    Phase2,
}

/// Where a round is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoundState {
    /// Ran and closed.
    Closed,
    /// Taking reports now.
    Open,
    /// To come.
    Planned,
}

/// A collection as served by `GET /v1/collections/{id}`, listed by `GET /v1/collections` and
/// answered on creation: its public config with its status.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CollectionView {
    /// The public config (id, schema, ε, target, protocol and its parameters).
    #[serde(flatten)]
    pub config: CollectionConfig,
    /// Where the collection is.
    pub status: CollectionStatus,
    /// This server's limits on one upload (`serve --max-body-bytes`,
    /// `--max-reports-per-upload`; the same for every collection): clients cut their
    /// uploads to fit them.
    pub upload_limits: ldpsyn::wire::UploadLimits,
    /// Vertical collections: each party's ε per person (its reports': the sum over its
    /// attributes, or one attribute's under `sampled+locmrf`; plus its local model's ε).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub party_epsilon: Option<BTreeMap<String, f64>>,
    /// Vertical collections: ε spent on one person over every party, the sum of
    /// `party_epsilon` (the aggregator joins the parties' reports by record id, so they
    /// compose; `epsilon` is only the largest party's share).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub composed_epsilon: Option<f64>,
    /// Vertical collections with local models (`fo+locmrf`, `sampled+locmrf`,
    /// `sketch+locmrf`): δ of the composed guarantee per person, the sum of the parties'
    /// `locmrf.delta` and, under `sketch+locmrf`, of their sketch reports' δ (absent under
    /// `fo`: the GRR reports are pure ε-LDP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub composed_delta: Option<f64>,
    /// Vertical collections, in the creation answer only: each party's upload token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub party_tokens: Option<BTreeMap<String, String>>,
}

/// `POST /v1/collections/{id}/close-round`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CloseRoundAnswer {
    /// What closing did, in order.
    #[schema(schema_with = transitions_schema)]
    pub transitions: Vec<Transition>,
    /// The collection's status afterwards.
    pub status: CollectionStatus,
}

/// `DELETE /v1/collections/{id}`: what was deleted.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeleteAnswer {
    /// The collection deleted.
    pub id: uuid::Uuid,
    /// Reports (vertical collections: party records) deleted with it.
    pub reports_deleted: u64,
}

/// `POST /v1/collections/{id}/finalize`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FinalizeAnswer {
    /// The collection's status (phase `finalized`).
    pub status: CollectionStatus,
    /// The model built.
    #[schema(schema_with = model_schema)]
    pub model: ModelDescription,
}

/// `POST /v1/collections/{id}/finalize` while the model is still being fitted (202): the
/// collection is finalized (no more reports) and the fit goes on; poll `model` (or the
/// collection's `status.model`) until it is built.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FinalizeAccepted {
    /// The collection's status (phase `finalized`, `model` `building`).
    pub status: CollectionStatus,
    /// Where the model answers once built (also the `Location` header); 409
    /// `model-not-ready` until then.
    pub model: String,
}

/// `GET /v1/collections/{id}/model[?provisional=true]`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelAnswer {
    /// Attribute names, in schema order (the model's attribute indices point here).
    pub attributes: Vec<String>,
    /// The model.
    #[schema(schema_with = model_schema)]
    pub model: ModelDescription,
    /// What the model can answer (`ldpsyn_engine::synth::fitness`): per attribute pair
    /// whether it was measured and whether the model carries it (`edge`, `path` or
    /// `independent`), per declared target its neighbours and the share of its entropy the
    /// model explains, and warnings written for people (`no-edges`, `target-independent`,
    /// `attribute-independent`, `fewer-people`).
    #[schema(value_type = Object)]
    pub fitness: ldpsyn_engine::FitnessReport,
    /// Which model answered and what it saw.
    #[serde(flatten)]
    pub fitted: FittedFrom,
}

/// Which model a results answer comes from: the final one, or a provisional refit while the
/// collection collects (`provisional=true` before finalize).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FittedFrom {
    /// `true`: refitted from the reports accepted so far while the collection collects; it
    /// changes as reports arrive. `false`: the final model, built at finalize.
    pub provisional: bool,
    /// Reports the model was fitted from (a vertical collection: party records), as the
    /// status's `reports_accepted` counts them.
    pub reports: u64,
    /// A provisional model only: when its fit finished, Unix time in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fitted_at: Option<i64>,
}

/// `GET /v1/collections/{id}/marginals?attrs=…`: a marginal of the fitted model.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MarginalsAnswer {
    /// The attributes, as requested.
    pub attributes: Vec<String>,
    /// Per attribute, the label of each code (numeric: the bin's midpoint).
    pub labels: Vec<Vec<String>>,
    /// Per attribute, its domain size.
    pub dims: Vec<usize>,
    /// Frequencies, row-major in `attributes` order, non-negative, sum 1; length = the
    /// product of `dims`.
    pub frequencies: Vec<f64>,
    /// Standard errors of `frequencies`: from the tables where some table measured all the
    /// attributes at full resolution, else from a parametric bootstrap of the fit (the
    /// estimate's error under the model's graph); `null` where neither applies (the model
    /// links them through a pair measured only in bins; a vertical collection's unmeasured
    /// marginal; more than 65,536 cells).
    pub std_errors: Option<Vec<f64>>,
    /// Which model answered and what it saw.
    #[serde(flatten)]
    pub fitted: FittedFrom,
}

/// The body of `POST /v1/collections/{id}/parties/{party}/model`: a party's local model
/// (`ldpsyn_engine::measure::local_model::LocalModel`, made by `ldpsyn-aggregator party
/// upload`). Noisy marginals of the party's attributes, its attribute graph and its privacy
/// accounting; nothing per record.
// Documentation only: the handler parses the engine's type strictly and checks it against the
// collection's config (`LocalModel::check`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LocalModelUpload {
    /// The party's name (the path's).
    pub party: String,
    /// Noisy marginals in release order, every 1-way of the party among them.
    pub measurements: Vec<LocalMeasurementUpload>,
    /// The party's attribute graph: pairs `[a, b]` of schema indices, `a < b`, every
    /// measured set complete in it.
    pub graph: Vec<Vec<usize>>,
    /// The accounting: the config's `locmrf` budget and the zCDP ρ spent.
    pub privacy: LocalPrivacyUpload,
}

/// One noisy marginal of a [`LocalModelUpload`].
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LocalMeasurementUpload {
    /// Schema indices of the marginal's attributes (the party's, distinct).
    pub attrs: Vec<usize>,
    /// Noisy counts, row-major in `attrs` order, one per cell.
    pub counts: Vec<f64>,
    /// Standard deviation of the Gaussian noise on each count, > 0.
    pub sigma: f64,
}

/// The accounting of a [`LocalModelUpload`].
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LocalPrivacyUpload {
    /// ε of the (ε, δ)-DP guarantee: the config's `locmrf.epsilon` for the party.
    pub epsilon: f64,
    /// δ: the config's `locmrf.delta`.
    pub delta: f64,
    /// The zCDP ρ that implies (ε, δ) (Canonne–Kamath–Steinke, Corollary 13).
    pub rho: f64,
    /// ρ spent, ≤ `rho`.
    pub rho_spent: f64,
}

/// The answer to a local model upload.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PartyModelAnswer {
    /// The party.
    pub party: String,
    /// `true` when this request stored the model, `false` for an identical resend.
    pub stored: bool,
    /// Measurements in the model.
    pub measurements: usize,
}

/// The body of `POST /v1/collections/{id}/parties/{party}/sketch`: a party's sketch report
/// (`ldpsyn_engine::protocols::cross_party::SketchUpload`, made by `ldpsyn-aggregator party
/// upload` under encoding `sketch+locmrf`; VertiMRF Algorithm 3 with n̂). Per value of each
/// of the party's attributes (in sketch bins), `t` DP Flajolet–Martin sketches of the set of
/// record ids holding it, and a noisy record count; no value, code or id.
// Documentation only: the handler parses the engine's type strictly and checks it against the
// collection's config (`check_upload`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SketchReportUpload {
    /// The party's name (the path's).
    pub party: String,
    /// The report.
    pub report: SketchReportBody,
}

/// The report of a [`SketchReportUpload`].
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SketchReportBody {
    /// The sketch parameters, as the collection's config gives them for the party: γ, `t`
    /// (`repetitions`), ε′ of one sketch (`sketch_epsilon`) and ε of n̂ (`count_epsilon`).
    pub params: SketchParamsBody,
    /// 16 lowercase hex digits identifying the parties' shared sketch key (an HMAC of a
    /// constant; the key itself never leaves the parties).
    pub key_fingerprint: String,
    /// Sketch bins of each of the party's attributes, in party order.
    pub domain_sizes: Vec<u32>,
    /// Base64 of `t·Σ domain_sizes` bytes: attribute-major, then value, then repetition.
    pub sketches: String,
    /// n̂: the party's record count plus discrete Laplace noise.
    pub noisy_count: i64,
}

/// The parameters of a [`SketchReportBody`].
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SketchParamsBody {
    /// γ of the sketches' geometric levels.
    pub gamma: f64,
    /// `t`, sketches per value.
    pub repetitions: u32,
    /// ε′ of one sketch (Algorithm 1).
    pub sketch_epsilon: f64,
    /// ε of the noisy count n̂.
    pub count_epsilon: f64,
}

/// The answer to a sketch report upload.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PartySketchAnswer {
    /// The party.
    pub party: String,
    /// `true` when this request stored the report, `false` for an identical resend.
    pub stored: bool,
    /// The report's noisy record count n̂.
    pub noisy_count: i64,
    /// Sketches in the report (`t` per value of each attribute's bins).
    pub sketches: usize,
}

/// `{party name: upload token}` of a vertical collection.
pub type PartyTokens = BTreeMap<String, String>;

/// The body of `POST /v1/collections`: the public config without `version`. Only the chosen
/// protocol's parameters are accepted; an unknown key is a 400.
// Documentation only: the handler parses the body strictly (`super::http::parse_create`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreateCollection {
    /// Optional: the collection's id, a UUID the client chooses so that a retried create is
    /// safe (the same request again answers `200` with the stored collection; another config
    /// under a stored id is `409`). Absent: the server picks one.
    pub id: Option<uuid::Uuid>,
    /// Optional: the attributes the data is for (label columns), by name. `auto` weighs
    /// their pairs with every other attribute as much as all other pairs together when it
    /// plans what to measure and which pairs the model keeps; the model's fitness report
    /// says how much of each target it explains.
    pub target: Option<Vec<String>>,
    /// Optional: a name for people (lists, the dashboard), 1 to 100 characters on one line.
    #[schema(example = "Adult census, spring 2026")]
    pub name: Option<String>,
    /// Optional: what the collection is for, 1 to 2,000 characters.
    pub description: Option<String>,
    /// The schema every record follows.
    pub schema: ldpsyn::schema::Schema,
    /// ε of every report, 0.01..=20 (vertical collections: optional, default the largest
    /// party total; left out when the request gives a `budget`).
    #[schema(value_type = Option<f64>, minimum = 0.01, maximum = 20.0)]
    pub epsilon: Option<f64>,
    /// Number of users N the collection aims at, ≥ 1.
    #[schema(minimum = 1)]
    pub target_users: u64,
    /// Optional, default `true` (device collections; a vertical one takes only `false`):
    /// finalize by itself once `target_users` reports are accepted.
    pub auto_finalize_at_target: Option<bool>,
    /// Optional, default `refuse` (device collections; a vertical one takes only `accept`):
    /// what happens to reports past `target_users`.
    pub past_target: Option<ldpsyn::wire::PastTarget>,
    /// Optional, 0..=36500: days the raw reports are kept after finalize (tables and model
    /// are kept); absent: until the collection is deleted.
    #[schema(minimum = 0, maximum = 36500)]
    pub retain_reports_days: Option<u32>,
    /// The protocol (`protocol` key) and its parameters.
    #[serde(flatten)]
    pub protocol: ldpsyn::wire::Protocol,
}

/// The schema of [`Phase`]: its wire names.
pub fn phase_schema() -> Schema {
    let names = [
        Phase::GraphConstruction,
        Phase::CliqueMeasurement,
        Phase::PairSampling,
        Phase::OneWay,
        Phase::Finalized,
    ]
    .map(|p| json!(p).as_str().unwrap_or_default().to_owned());
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(names))
        .description(Some(
            "graph_construction and clique_measurement (PrivIncr, auto), pair_sampling \
             (SamPrivSyn), one_way (independence, vertical), finalized",
        ))
        .into()
}

fn edge_list() -> ArrayBuilder {
    ArrayBuilder::new().items(
        ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
            )
            .min_items(Some(2))
            .max_items(Some(2)),
    )
}

fn transition(name: &str, description: &str, fields: &[(&str, RefOr<Schema>)]) -> ObjectBuilder {
    let mut o = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "transition",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([name])),
        )
        .required("transition")
        .description(Some(description));
    for (k, s) in fields {
        o = o.property(*k, s.clone()).required(*k);
    }
    o
}

/// The schema of a list of round [`Transition`]s (tagged by `transition`).
pub fn transitions_schema() -> ArrayBuilder {
    let count = || -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0))
            .into()
    };
    let pruned = || -> RefOr<Schema> { edge_list().into() };
    ArrayBuilder::new().items(
        OneOfBuilder::new()
            .item(transition(
                "round_closed",
                "A phase-1 round closed; `pruned` edges dropped; the next round is open.",
                &[("round", count()), ("pruned", pruned())],
            ))
            .item(transition(
                "entered_clique_measurement",
                "Phase 1 is over; phase 2 measures `factors` planned factors.",
                &[("pruned", pruned()), ("factors", count())],
            ))
            .item(transition(
                "reweighted",
                "SamPrivSyn weights recomputed; batch `batch` is open.",
                &[("batch", count())],
            ))
            .item(transition(
                "nothing",
                "Nothing to close in this phase.",
                &[],
            )),
    )
}

/// The schema of a [`ModelDescription`]: its fields, with the engine's nested records (edge
/// states, junction tree, conditionals, gains) as objects.
pub fn model_schema() -> ObjectBuilder {
    let object = || ObjectBuilder::new().schema_type(Type::Object);
    let nullable = |s: RefOr<Schema>| -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(s)
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .into()
    };
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("protocol", ObjectBuilder::new().schema_type(Type::String))
        .required("protocol")
        .property(
            "domain_sizes",
            ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::Integer)),
        )
        .required("domain_sizes")
        .property(
            "edges",
            ArrayBuilder::new().items(object()).description(Some(
                "Every pair evaluated in phase 1: MI, thresholds, round pruned.",
            )),
        )
        .required("edges")
        .property(
            "structure",
            nullable(
                object()
                    .description(Some(
                        "Dependency graph, junction tree and conditionals (graphical models).",
                    ))
                    .into(),
            ),
        )
        .required("structure")
        .property(
            "pair_weights",
            nullable(
                ArrayBuilder::new()
                    .items(ArrayBuilder::new().min_items(Some(3)).max_items(Some(3)))
                    .description(Some("SamPrivSyn: pairs `[a, b, MI weight]`."))
                    .into(),
            ),
        )
        .required("pair_weights")
        .property(
            "model_graph",
            ArrayBuilder::new().items(object()).description(Some(
                "Every measured candidate pair of the model graph with its expected gain.",
            )),
        )
        .required("model_graph")
        .property(
            "rounds",
            ArrayBuilder::new().items(object()).description(Some(
                "Per round (SamPrivSyn: batch): its reports and every table it filled \
                 (factor, mechanism, bin maps, reports, a pair's selection score).",
            )),
        )
        .required("rounds")
        .property(
            "working_bins",
            ArrayBuilder::new()
                .items(
                    ArrayBuilder::new().items(
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(1)),
                    ),
                )
                .description(Some(
                    "Per attribute, the cuts of the working bins the model was fitted in over \
                     its schema codes (`[]`: every code a bin); for `bins: \"auto\"` \
                     attributes, with the point masses `auto`'s or PrivIncr's round 0 found \
                     as bins of their own.",
                )),
        )
        .required("working_bins")
        .property(
            "drift",
            object().description(Some(
                "Present for a model of several rounds: each round's share of the reports \
                 (`round_weights`), per attribute the heterogeneity of the rounds' 1-way \
                 marginals (Cochran's `q`, `df`, `p_value`, between-round variance `tau2`, \
                 `largest_shift`), and `population_changed`: the rounds measured different \
                 populations beyond noise, and every table was moved to the population's \
                 post-stratified estimate (rounds as strata). An attribute differs beyond \
                 noise when its `p_value` times the number of attributes is at most `level`.",
            )),
        )
        .property(
            "residuals",
            object().description(Some(
                "The fit checked against its measurements: `tables_checked` (tables whose \
                 factor lies in one clique; cells expected to hold fewer than 5 reports are \
                 pooled into one), `beyond_noise` (standardized residual beyond noise after a \
                 Bonferroni correction), `mean_ratio` (sum of squared standardized residuals \
                 over their degrees of freedom; about 1 when the model agrees with its \
                 measurements) and the `worst` tables.",
            )),
        )
        .property(
            "composed_epsilon",
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .description(Some(
                    "Vertical collections only: ε spent on one person over every party (the \
                     sum of the attributes' ε; the parties' reports are joined by record id).",
                )),
        )
        .description(Some(
            "The model built at finalization, or (`provisional: true`) refitted from the \
             reports so far.",
        ))
}

/// A `$ref` to the component schema `name`.
pub(crate) fn schema_ref(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

/// `GET /v1/collections/{id}/task`: one task without `count`, an array of tasks with it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TaskAnswer {
    /// Without `count`.
    One(ldpsyn::wire::Task),
    /// With `count`: that many independently drawn tasks.
    Many(Vec<ldpsyn::wire::Task>),
}

/// A file as bytes (the body of a Parquet download), in the OpenAPI document: a string of
/// format `binary`.
#[derive(Debug, Clone, Copy)]
pub struct BinaryFile;

impl utoipa::PartialSchema for BinaryFile {
    fn schema() -> utoipa::openapi::RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::schema::SchemaFormat::KnownFormat(
                utoipa::openapi::schema::KnownFormat::Binary,
            )))
            .into()
    }
}

impl ToSchema for BinaryFile {}

/// The `format` of a synthetic download (query parameter).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SyntheticFormat {
    /// CSV with a header row (the default).
    Csv,
    /// One JSON object per line.
    Ndjson,
    /// Apache Parquet: integer numeric attributes as Int64, other numeric ones as Float64,
    /// categorical ones as dictionary-encoded strings; "missing" is null.
    Parquet,
}

/// The `numeric` mode of a synthetic download (query parameter).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SyntheticNumeric {
    /// By the sub-bin estimate (the default).
    Recover,
    /// Uniformly within the model's bin.
    Uniform,
    /// At the bin's middle.
    Midpoint,
}
