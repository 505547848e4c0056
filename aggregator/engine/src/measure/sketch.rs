//! DP Flajolet–Martin sketches of record-id sets: VertiMRF's sketch-based LocEnc (party side)
//! and CarEst (server side). Source: "VertiMRF: Differentially Private Vertical Federated Data
//! Synthesis" (Zhao, Li, Ren, Ding, Yang, Li; KDD 2024 as issue 37 cites it: the stored text,
//! `vertimrf.txt`, names no venue), §2.2, §4.3, Algorithms 1, 3 and 4, Theorems 2–3,
//! Appendix A.3.
//!
//! **Roles.** A party ([`encode_party`]) turns its records (record id + the codes of its
//! attributes) into a [`SketchReport`]: for every value of every attribute, `t` DP sketches
//! of the set of ids holding that value, plus a noisy record count n̂. The server
//! ([`estimate_marginal`], [`estimate_intersection`]) merges sketches of several parties and
//! estimates cross-party marginals by inclusion–exclusion. Both sides share [`SketchParams`]
//! (γ, t, ε′, n̂'s ε), so they cannot disagree about the phantom count or the floor.
//! Vertical collections of encoding `sketch+locmrf` use it: the simulator's parties encode,
//! the engine's [`crate::protocols::cross_party`] estimates the cross-party tables.
//!
//! **Keys.** The parties share a secret [`SketchKey`] that the server never sees, as they
//! share the record-id key ([`ldpsyn::vertical::RecordIdKey`]). It is not `Serialize`. The
//! hash of id `x` in repetition `h` is the `h`-th 64-bit word of ChaCha12 keyed by
//! HMAC-SHA256(key, 0x01 ‖ x): one PRF evaluation per id gives all `t` repetitions. Under the
//! PRF assumption this is `t` independent keyed hashes, as Algorithm 3 line 1's `t` keys (one
//! key per repetition, shared by all of a party's attributes and by all parties, so sketches of
//! the same repetition merge). The report carries a fingerprint of the key (HMAC of a
//! constant) so the server can refuse to merge sketches made under different keys.
//!
//! **Guarantee.** Not Theorem 2: in one repetition a person's one hash value enters every
//! sketch of its values, over all parties (they share the key), which Theorem 2's
//! composition of independent sketches does not count. [`crate::measure::sketch_privacy`]
//! computes the exact privacy loss of one repetition of all of a person's sketches,
//! composes it over `t`, and calibrates ε′ ([`SketchParams::for_budget`]); n̂ adds its own
//! ε (pure, discrete Laplace).
//!
//! **Readings of the paper** (where it is ambiguous or mistyped; each choice is defensible
//! from the paper's own text):
//! - Algorithm 1 line 1 prints `k_p = ⌈1/e^(ε′−1)⌉`; §2.2 and Lemma 4 require
//!   `k ≥ 1/(e^ε′ − 1)` phantoms, and the authors' code uses `⌈1/(e^ε′ − 1)⌉`: we use that.
//! - Geometric(γ/(1+γ)) has support {1, 2, …} (`P(Y > m) = (1+γ)^−m`), as the authors' code.
//! - Combining the `t` repetitions: §2.2 says "the 1/e-th quantile of all the maxima";
//!   Algorithm 4 line 7 says "HarmonicMean" (the authors' code computes HyperLogLog's
//!   harmonic mean of `(1+γ)^−α`). [`Combine`] offers both. The default,
//!   [`Combine::Quantile`], reads the 1/e-th order statistic through the exact CDF of a
//!   maximum of geometrics, `P(α ≤ m) = (1 − (1+γ)^−m)^K`, so its estimate of `K` is not
//!   off by up to a factor 1+γ as the literal `(1+γ)^q` is ([`Combine::RawQuantile`]).
//! - n̂ (10% of LocEnc's ε in §7.1; Theorem 3 says "Laplacian noise"): the discrete Laplace
//!   (geometric) mechanism, the integer Laplace, so no floating-point noise is released.
//! - Algorithm 4 line 9 clips counts at 0. [`SketchMarginal`] keeps the raw (unclipped)
//!   counts with a variance per cell for the fit and offers the clipped frequencies apart.
//! - Variances: Theorem 3 bounds the error with unspecified constants (`C = O(·)`), which is
//!   no variance. Each cell's variance is estimated from its `t` repetitions (delta method
//!   on the chosen statistic) plus n̂'s variance.
//! - Algorithm 1's output is stored as a `u8`: γ ≥ [`MIN_GAMMA`] keeps `P(α > 255)` below
//!   `10^15·1.25^−255 < 10^−9` for any set of up to 10^15 ids and phantoms; a larger value
//!   saturates at 255 (post-processing).
//!
//! ```
//! use ldpsyn_engine::measure::sketch::{
//!     AttributeRef, Combine, SketchKey, SketchParams, encode_party, estimate_marginal,
//!     pooled_count,
//! };
//! use rand::SeedableRng;
//!
//! // Simulation only: production parties use `StdRng::from_os_rng()`.
//! let mut rng = rand::rngs::StdRng::seed_from_u64(7);
//! let key = SketchKey::new(vec![42; 32]).unwrap();
//! // γ = 1, t = 256 repetitions, ε′ = 0.5 per sketch, ε = 1 for the noisy count.
//! let params = SketchParams::new(1.0, 256, 0.5, 1.0).unwrap();
//! // 600 people; party A holds a binary attribute, party B a ternary one.
//! let ids: Vec<String> = (0..600).map(|i| format!("id-{i}")).collect();
//! let a = encode_party(&params, &key, &[2], ids.iter().map(|id| (id, [u32::from(id.len() % 2 == 0)])), &mut rng).unwrap();
//! let b = encode_party(&params, &key, &[3], ids.iter().enumerate().map(|(i, id)| (id, [(i % 3) as u32])), &mut rng).unwrap();
//! let n = pooled_count(&[&a, &b]).unwrap();
//! let m = estimate_marginal(
//!     &[AttributeRef { report: &a, attribute: 0 }, AttributeRef { report: &b, attribute: 0 }],
//!     n,
//!     Combine::Quantile,
//! )
//! .unwrap();
//! assert_eq!(m.counts.len(), 6);
//! assert!((m.clipped_frequencies().iter().sum::<f64>() - 1.0).abs() < 1e-9);
//! ```

use std::collections::HashSet;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use rand::{CryptoRng, Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::sketch_privacy::{calibrate_sketch_epsilon, sketches_epsilon};

/// Shortest [`SketchKey`]: 32 bytes (the HMAC-SHA256 output size).
pub const MIN_KEY_BYTES: usize = 32;
/// Smallest γ: keeps a sketch within a `u8` (see the module docs).
pub const MIN_GAMMA: f64 = 0.25;
/// Largest γ: beyond it a sketch resolves cardinalities only to a factor 5.
pub const MAX_GAMMA: f64 = 4.0;
/// γ of the authors' code (the paper does not state one); the estimator's cost in variance
/// hardly depends on γ because [`Combine::Quantile`] reads the exact discrete CDF.
pub const DEFAULT_GAMMA: f64 = 1.0;
/// Share of LocEnc's ε given to the noisy count n̂ (VertiMRF §7.1: 10% of the 40%).
pub const DEFAULT_COUNT_SHARE: f64 = 0.1;
/// Most repetitions `t` (the paper uses 2000 and 8000).
pub const MAX_REPETITIONS: u32 = 100_000;
/// Most cells of one estimated marginal.
pub const MAX_MARGINAL_CELLS: usize = 1 << 22;
/// Largest Algorithm 1 floor `α_min`: a floor near 255 leaves no room in a `u8`.
const MAX_ALPHA_MIN: u32 = 128;
/// Length of a key fingerprint: 16 lowercase hex digits.
const FINGERPRINT_LEN: usize = 16;
/// Domain separation of the keyed hash: ids vs the key fingerprint.
const ID_TAG: u8 = 0x01;
const FINGERPRINT_TAG: &[u8] = b"\x00ldpsyn sketch key fingerprint";
const DERIVE_TAG: &[u8] = b"\x00ldpsyn sketch key of collection ";

/// Errors of the sketch module.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SketchError {
    /// The sketch key is shorter than [`MIN_KEY_BYTES`].
    #[error("sketch key must be at least {MIN_KEY_BYTES} bytes, got {0}")]
    KeyTooShort(usize),
    /// γ is outside [[`MIN_GAMMA`], [`MAX_GAMMA`]].
    #[error("γ must be in [{MIN_GAMMA}, {MAX_GAMMA}], got {0}")]
    Gamma(f64),
    /// `t` is 0 or above [`MAX_REPETITIONS`].
    #[error("repetitions must be in 1..={MAX_REPETITIONS}, got {0}")]
    Repetitions(u32),
    /// An ε is not finite and positive.
    #[error("ε must be finite and > 0, got {0}")]
    Epsilon(f64),
    /// δ is not in (0, 1).
    #[error("δ must be in (0, 1), got {0}")]
    Delta(f64),
    /// The share of ε for n̂ is not in (0, 1).
    #[error("the count's share of ε must be in (0, 1), got {0}")]
    CountShare(f64),
    /// ε′ is so small that Algorithm 1's floor α_min leaves no room in a `u8`.
    #[error("ε′ = {0} is too small for γ = {1}: the sketch floor α_min exceeds {MAX_ALPHA_MIN}")]
    FloorTooHigh(f64, f64),
    /// No attributes, or an attribute with an empty domain.
    #[error("a party needs attributes, each with a domain of at least one value")]
    Domain,
    /// A record has a different number of codes than the party has attributes.
    #[error("record has {found} codes, the party holds {expected} attributes")]
    WrongArity {
        /// The party's attribute count.
        expected: usize,
        /// Codes given.
        found: usize,
    },
    /// A code is outside its attribute's domain.
    #[error("code {code} of attribute {attribute} is outside its domain of {size} values")]
    CodeOutOfDomain {
        /// Attribute index (party order).
        attribute: usize,
        /// The code.
        code: u32,
        /// The domain size.
        size: u32,
    },
    /// Two records have the same id (the count n̂ would count one person twice).
    #[error("duplicate record id")]
    DuplicateId,
    /// A report does not decode or its shape does not fit its parameters.
    #[error("malformed sketch report: {0}")]
    Malformed(String),
    /// Reports to merge differ in parameters or key.
    #[error("sketches made with different parameters or keys cannot be merged")]
    Mismatch,
    /// No ε′ the sketch's `u8` floor allows makes the sketches meet the budget once their
    /// shared hash is counted ([`crate::measure::sketch_privacy`]).
    #[error(
        "no sketch parameters keep (ε = {epsilon}, δ = {delta}) for {sketches} sketches per \
         person sharing a hash over {repetitions} repetitions (the smallest ε′ still spends \
         ε = {smallest}); use fewer repetitions, a larger budget, or another encoding"
    )]
    Unachievable {
        /// The sketches' ε budget.
        epsilon: f64,
        /// Its δ.
        delta: f64,
        /// Sketches one person's hash enters per repetition.
        sketches: usize,
        /// Repetitions `t`.
        repetitions: u32,
        /// ε spent at the smallest ε′ allowed.
        smallest: f64,
    },
    /// A marginal names no attribute, an attribute a report does not hold, a value outside a
    /// domain, or too many cells.
    #[error("bad marginal request: {0}")]
    BadRequest(String),
}

/// The parties' shared secret for the sketches' keyed hash. Never sent to the server: it is
/// neither `Serialize` nor printed by `Debug`.
#[derive(Clone)]
pub struct SketchKey(Vec<u8>);

impl std::fmt::Debug for SketchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SketchKey(<secret>)")
    }
}

impl SketchKey {
    /// Wraps key bytes. Errors: [`SketchError::KeyTooShort`] below [`MIN_KEY_BYTES`].
    pub fn new(bytes: Vec<u8>) -> Result<Self, SketchError> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(SketchError::KeyTooShort(bytes.len()));
        }
        Ok(Self(bytes))
    }

    /// A fresh random key (32 bytes) from a CSPRNG, for one party to generate and share with
    /// the others (the paper's parties agree on keys by a key exchange, §4.3).
    pub fn generate<R: Rng + CryptoRng + ?Sized>(rng: &mut R) -> Self {
        let mut bytes = vec![0u8; MIN_KEY_BYTES];
        rng.fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// The sketch key of one collection derived from a secret the parties share (at least
    /// [`MIN_KEY_BYTES`] bytes, e.g. their record-id key file): HMAC-SHA256 under `secret`
    /// of a constant and `context` (the collection id), so one shared file gives every
    /// collection its own key, and sketches of two collections never merge. Errors:
    /// [`SketchError::KeyTooShort`].
    pub fn derive(secret: &[u8], context: &[u8]) -> Result<Self, SketchError> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(SketchError::KeyTooShort(secret.len()));
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key");
        mac.update(DERIVE_TAG);
        mac.update(context);
        Ok(Self(mac.finalize().into_bytes().to_vec()))
    }

    /// 16 hex digits identifying the key without revealing it (HMAC of a constant): the
    /// server compares reports' fingerprints before merging their sketches.
    pub fn fingerprint(&self) -> String {
        let mut mac = self.mac();
        mac.update(FINGERPRINT_TAG);
        mac.finalize().into_bytes()[..FINGERPRINT_LEN / 2]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length: `new_from_slice` cannot fail for HMAC-SHA256.
        Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key")
    }
}

/// The hash stream of one id: word `h` is the id's hash in repetition `h`.
fn id_stream(keyed: &Hmac<Sha256>, id: &[u8]) -> ([u8; 32], ChaCha12Rng) {
    let mut mac = keyed.clone();
    mac.update(&[ID_TAG]);
    mac.update(id);
    let digest: [u8; 32] = mac.finalize().into_bytes().into();
    (digest, ChaCha12Rng::from_seed(digest))
}

/// Fills `words` with words `h0, h0 + 1, …` of `stream` (bulk: one `fill_bytes`, as
/// `next_u64` would read them: little-endian pairs of 32-bit words).
fn read_words(stream: &mut ChaCha12Rng, bytes: &mut [u8], words: &mut [u64]) {
    stream.fill_bytes(bytes);
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().expect("chunks of 8"));
    }
}

/// Parameters shared by parties and server: γ, the repetitions `t`, ε′ of each sketch and ε
/// of the noisy count. Built only through checks ([`SketchParams::new`],
/// [`SketchParams::for_budget`], or deserialization, which runs the same checks).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawParams")]
pub struct SketchParams {
    gamma: f64,
    repetitions: u32,
    sketch_epsilon: f64,
    count_epsilon: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParams {
    gamma: f64,
    repetitions: u32,
    sketch_epsilon: f64,
    count_epsilon: f64,
}

impl TryFrom<RawParams> for SketchParams {
    type Error = SketchError;
    fn try_from(raw: RawParams) -> Result<Self, SketchError> {
        Self::new(
            raw.gamma,
            raw.repetitions,
            raw.sketch_epsilon,
            raw.count_epsilon,
        )
    }
}

fn check_epsilon(epsilon: f64) -> Result<(), SketchError> {
    if epsilon.is_finite() && epsilon > 0.0 {
        Ok(())
    } else {
        Err(SketchError::Epsilon(epsilon))
    }
}

fn check_delta(delta: f64) -> Result<(), SketchError> {
    if delta > 0.0 && delta < 1.0 {
        Ok(())
    } else {
        Err(SketchError::Delta(delta))
    }
}

fn check_repetitions(t: u32) -> Result<(), SketchError> {
    if (1..=MAX_REPETITIONS).contains(&t) {
        Ok(())
    } else {
        Err(SketchError::Repetitions(t))
    }
}

impl SketchParams {
    /// Checked parameters: γ in [[`MIN_GAMMA`], [`MAX_GAMMA`]], `repetitions` (t) in
    /// 1..=[`MAX_REPETITIONS`], `sketch_epsilon` (ε′ of one Algorithm 1 sketch) and
    /// `count_epsilon` (ε of n̂) finite and positive, and a floor α_min ≤ 128.
    pub fn new(
        gamma: f64,
        repetitions: u32,
        sketch_epsilon: f64,
        count_epsilon: f64,
    ) -> Result<Self, SketchError> {
        if !(MIN_GAMMA..=MAX_GAMMA).contains(&gamma) {
            return Err(SketchError::Gamma(gamma));
        }
        check_repetitions(repetitions)?;
        check_epsilon(sketch_epsilon)?;
        check_epsilon(count_epsilon)?;
        let params = Self {
            gamma,
            repetitions,
            sketch_epsilon,
            count_epsilon,
        };
        if params.alpha_min_u32() > MAX_ALPHA_MIN {
            return Err(SketchError::FloorTooHigh(sketch_epsilon, gamma));
        }
        Ok(params)
    }

    /// The parameters that spend a sketch budget (`epsilon`, `delta`) soundly: ε′ from
    /// [`calibrate_sketch_epsilon`] for `repetitions` rounds of `sketches` sketches sharing
    /// each round's hash (every attribute of every party whose sketches merge, as one
    /// person's id enters all of them), and `count_epsilon` for this party's n̂.
    /// Errors as [`SketchParams::new`] and [`calibrate_sketch_epsilon`].
    pub fn for_budget(
        epsilon: f64,
        delta: f64,
        sketches: usize,
        repetitions: u32,
        gamma: f64,
        count_epsilon: f64,
    ) -> Result<Self, SketchError> {
        check_epsilon(epsilon)?;
        check_delta(delta)?;
        let sketch = calibrate_sketch_epsilon(epsilon, delta, sketches, repetitions, gamma)?;
        Self::new(gamma, repetitions, sketch, count_epsilon)
    }

    /// γ: the hashed values are Geometric(γ/(1+γ)).
    pub fn gamma(&self) -> f64 {
        self.gamma
    }

    /// `t`: sketches per attribute value.
    pub fn repetitions(&self) -> u32 {
        self.repetitions
    }

    /// ε′ of one sketch (Algorithm 1).
    pub fn sketch_epsilon(&self) -> f64 {
        self.sketch_epsilon
    }

    /// ε of the noisy count n̂ (discrete Laplace).
    pub fn count_epsilon(&self) -> f64 {
        self.count_epsilon
    }

    /// `k_p = ⌈1/(e^ε′ − 1)⌉`, the phantom elements of each sketch (Algorithm 1 line 1; see
    /// the module docs for the printed typo).
    pub fn phantoms(&self) -> u64 {
        // ε′ ≤ f64::MAX keeps 1/expm1 finite and ≥ 0; the cast saturates for tiny ε′.
        (1.0 / self.sketch_epsilon.exp_m1()).ceil() as u64
    }

    /// `α_min = ⌈log_{1+γ} 1/(1 − e^−ε′)⌉`, the floor of every sketch (Algorithm 1 line 1).
    pub fn alpha_min(&self) -> u8 {
        // new() refuses floors above MAX_ALPHA_MIN < 256.
        self.alpha_min_u32() as u8
    }

    fn alpha_min_u32(&self) -> u32 {
        let floor = (-(-(-self.sketch_epsilon).exp_m1()).ln() / self.ln_base()).ceil();
        if floor.is_finite() {
            floor.max(0.0).min(f64::from(u32::MAX)) as u32
        } else {
            u32::MAX
        }
    }

    fn ln_base(&self) -> f64 {
        self.gamma.ln_1p()
    }

    /// Variance of n̂'s discrete Laplace noise, `2q/(1 − q)²` with `q = e^−ε`.
    pub fn count_variance(&self) -> f64 {
        let q = (-self.count_epsilon).exp();
        2.0 * q / (1.0 - q).powi(2)
    }

    /// The (ε, δ) of the sketches of one person (`sketches` of them per repetition, sharing
    /// its hash: every attribute of every party that shares the key), from the exact
    /// accountant [`sketches_epsilon`], plus n̂'s ε (sequential composition). Errors:
    /// [`SketchError::Delta`], [`SketchError::Domain`] (no sketches), and
    /// [`SketchError::Unachievable`] when no ε reaches `delta`.
    pub fn guarantee(&self, sketches: usize, delta: f64) -> Result<(f64, f64), SketchError> {
        let eps = sketches_epsilon(self, sketches, delta)?;
        if !eps.is_finite() {
            return Err(SketchError::Unachievable {
                epsilon: eps,
                delta,
                sketches,
                repetitions: self.repetitions,
                smallest: eps,
            });
        }
        Ok((eps + self.count_epsilon, delta))
    }
}

/// Geometric(γ/(1+γ)) on {1, 2, …} from a uniform word: `⌈−ln u / ln(1+γ)⌉` with
/// `u ∈ (0, 1]`, so `P(Y > m) = (1+γ)^−m`. Decreasing in `w`: the max of `Y` over a set is
/// `Y` of the smallest word.
fn geometric_from_word(w: u64, ln_base: f64) -> u32 {
    let u = ((w >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    let y = (-u.ln() / ln_base).ceil();
    (y as u32).max(1)
}

/// The maximum of `k` i.i.d. Geometric(γ/(1+γ)) draws (Algorithm 1 line 2) in one draw, by
/// inverting `P(max ≤ m) = (1 − (1+γ)^−m)^k`; 0 when `k = 0`.
fn phantom_max<R: Rng + ?Sized>(k: u64, ln_base: f64, rng: &mut R) -> u32 {
    if k == 0 {
        return 0;
    }
    let u: f64 = rng.random(); // [0, 1)
    // x = 1 − u^{1/k} ∈ (0, 1]; the max is the smallest m with (1+γ)^−m ≤ x.
    let x = -(u.ln() / k as f64).exp_m1();
    let m = (-x.ln() / ln_base).ceil();
    (m.min(f64::from(u32::MAX)) as u32).max(1)
}

/// Algorithm 1's output from the set's part: `max(α_X, α_p, α_min)`, saturated to a `u8`.
fn finish_sketch<R: Rng + ?Sized>(params: &SketchParams, set_max: u32, rng: &mut R) -> u8 {
    let phantoms = phantom_max(params.phantoms(), params.ln_base(), rng);
    let alpha = set_max.max(phantoms).max(u32::from(params.alpha_min()));
    alpha.min(255) as u8
}

/// Algorithm 1 (DPFM): the ε′-DP Flajolet–Martin sketch of the set `ids` (duplicates count
/// once) under repetition `repetition`'s keyed hash: `max(α_X, α_p, α_min)` with α_X the
/// largest hashed geometric of the set (0 if empty), α_p the largest of `k_p` phantom
/// geometrics drawn from `rng`, α_min the floor ([`SketchParams::phantoms`],
/// [`SketchParams::alpha_min`]). Equals the sketch [`encode_party`] makes for the same set
/// and repetition (phantoms aside). Errors: [`SketchError::Repetitions`] if `repetition` is
/// not below `t`.
pub fn dpfm<I, R>(
    params: &SketchParams,
    key: &SketchKey,
    repetition: u32,
    ids: I,
    rng: &mut R,
) -> Result<u8, SketchError>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
    R: Rng + CryptoRng + ?Sized,
{
    if repetition >= params.repetitions {
        return Err(SketchError::Repetitions(repetition));
    }
    let keyed = key.mac();
    let mut min_word: Option<u64> = None;
    for id in ids {
        let (_, mut stream) = id_stream(&keyed, id.as_ref());
        // Word h of the stream: ChaCha's word position counts 32-bit words.
        stream.set_word_pos(2 * u128::from(repetition));
        let mut w = [0u64];
        read_words(&mut stream, &mut [0u8; 8], &mut w);
        let w = w[0];
        min_word = Some(min_word.map_or(w, |m| m.min(w)));
    }
    let set_max = min_word.map_or(0, |w| geometric_from_word(w, params.ln_base()));
    Ok(finish_sketch(params, set_max, rng))
}

/// A party's upload (Algorithm 3's output plus n̂): for every attribute value, `t` DP sketches
/// of the set of ids holding it, and the noisy record count. Its only constructor is the DP
/// encoder [`encode_party`]; the server's way in is deserialization, which checks shapes
/// (it cannot tell who ran the encoder: no wire format can). Fields are private; read them
/// with the accessors.
///
/// Raw values or id sets cannot become a report:
///
/// ```compile_fail
/// use ldpsyn_engine::measure::sketch::{SketchParams, SketchReport};
/// let params = SketchParams::new(1.0, 1, 1.0, 1.0).unwrap();
/// // Private fields: no struct literal, so no report of raw codes or ids.
/// let forged = SketchReport {
///     params,
///     key_fingerprint: String::new(),
///     domain_sizes: vec![2],
///     sketches: vec![0, 1],
///     noisy_count: 2,
/// };
/// ```
///
/// ```compile_fail
/// use ldpsyn_engine::measure::sketch::SketchReport;
/// // No constructor besides the encoder.
/// let forged = SketchReport::new(vec![2], vec![0u8, 1]);
/// ```
///
/// JSON: `{"params": {…}, "key_fingerprint": "…", "domain_sizes": [u_1, …],
/// "sketches": "<base64 of t·Σu bytes, attribute-major, then value, then repetition>",
/// "noisy_count": n̂}`.
#[derive(Debug, Clone, PartialEq)]
pub struct SketchReport {
    params: SketchParams,
    key_fingerprint: String,
    domain_sizes: Vec<u32>,
    /// Layout `[attribute][value][repetition]`, length `t·Σ_j u_j`.
    sketches: Vec<u8>,
    noisy_count: i64,
}

#[derive(Serialize)]
struct WireOut<'a> {
    params: &'a SketchParams,
    key_fingerprint: &'a str,
    domain_sizes: &'a [u32],
    sketches: String,
    noisy_count: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireIn {
    params: SketchParams,
    key_fingerprint: String,
    domain_sizes: Vec<u32>,
    sketches: String,
    noisy_count: i64,
}

impl Serialize for SketchReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireOut {
            params: &self.params,
            key_fingerprint: &self.key_fingerprint,
            domain_sizes: &self.domain_sizes,
            sketches: BASE64.encode(&self.sketches),
            noisy_count: self.noisy_count,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SketchReport {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireIn::deserialize(deserializer)?;
        Self::from_wire(wire).map_err(serde::de::Error::custom)
    }
}

/// `t·Σu`, the sketch count of a report, or `None` on overflow.
fn sketch_len(params: &SketchParams, domain_sizes: &[u32]) -> Option<usize> {
    let values = domain_sizes
        .iter()
        .try_fold(0usize, |acc, &u| acc.checked_add(u as usize))?;
    values.checked_mul(params.repetitions as usize)
}

impl SketchReport {
    fn from_wire(wire: WireIn) -> Result<Self, SketchError> {
        let malformed = |m: &str| SketchError::Malformed(m.to_owned());
        if wire.key_fingerprint.len() != FINGERPRINT_LEN
            || !wire
                .key_fingerprint
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(malformed("key_fingerprint is not 16 lowercase hex digits"));
        }
        if wire.domain_sizes.is_empty() || wire.domain_sizes.contains(&0) {
            return Err(SketchError::Domain);
        }
        let expected = sketch_len(&wire.params, &wire.domain_sizes)
            .ok_or_else(|| malformed("too many sketches"))?;
        // Check the encoded length before decoding: no allocation from a lying header.
        if wire.sketches.len() != expected.div_ceil(3) * 4 {
            return Err(malformed("sketches do not have t·Σu values"));
        }
        let sketches = BASE64
            .decode(wire.sketches.as_bytes())
            .map_err(|e| SketchError::Malformed(format!("sketches: {e}")))?;
        if sketches.len() != expected {
            return Err(malformed("sketches do not have t·Σu values"));
        }
        // Algorithm 1 never outputs below its floor.
        let floor = wire.params.alpha_min();
        if sketches.iter().any(|&a| a < floor) {
            return Err(malformed("a sketch is below the floor α_min"));
        }
        Ok(Self {
            params: wire.params,
            key_fingerprint: wire.key_fingerprint,
            domain_sizes: wire.domain_sizes,
            sketches,
            noisy_count: wire.noisy_count,
        })
    }

    /// The parameters the sketches were made with.
    pub fn params(&self) -> &SketchParams {
        &self.params
    }

    /// The fingerprint of the key ([`SketchKey::fingerprint`]).
    pub fn key_fingerprint(&self) -> &str {
        &self.key_fingerprint
    }

    /// Domain size of each of the party's attributes (party order).
    pub fn domain_sizes(&self) -> &[u32] {
        &self.domain_sizes
    }

    /// The `t` sketches (one per repetition) of the ids with `value` on `attribute`; `None`
    /// outside the report.
    pub fn sketches(&self, attribute: usize, value: u32) -> Option<&[u8]> {
        let size = *self.domain_sizes.get(attribute)?;
        if value >= size {
            return None;
        }
        let t = self.params.repetitions as usize;
        let slot = self.domain_sizes[..attribute]
            .iter()
            .map(|&u| u as usize)
            .sum::<usize>()
            + value as usize;
        Some(&self.sketches[slot * t..(slot + 1) * t])
    }

    /// Number of sketches in the report: `t·Σ_j u_j` (one byte each).
    pub fn sketch_count(&self) -> usize {
        self.sketches.len()
    }

    /// n̂: the party's record count plus discrete Laplace noise of ε =
    /// [`SketchParams::count_epsilon`] (may be negative for tiny parties).
    pub fn noisy_count(&self) -> i64 {
        self.noisy_count
    }
}

/// Discrete Laplace (two-sided geometric) noise: `P(z) ∝ e^−ε|z|`, sensitivity 1, pure ε-DP
/// (Ghosh, Roughgarden, Sundararajan, STOC 2009). The difference of two Geometric(1 − e^−ε)
/// draws on {0, 1, …}.
fn discrete_laplace<R: Rng + ?Sized>(epsilon: f64, rng: &mut R) -> i64 {
    let mut draw = || {
        // u ∈ (0, 1]; ⌊ln u / ln q⌋ with ln q = −ε.
        let u = 1.0 - rng.random::<f64>();
        (-u.ln() / epsilon).floor().min(1e15) as i64
    };
    draw() - draw()
}

/// Sketch-based LocEnc (Algorithm 3) with n̂: the party's [`SketchReport`]. `records` yields
/// `(record id, codes)`, codes in party attribute order, below `domain_sizes`. All `t`
/// repetitions use the shared `key` (one keyed hash per repetition, the same for all of the
/// party's attributes); phantoms and n̂'s noise come from `rng`, which must be a CSPRNG
/// (`StdRng::from_os_rng()` in production; a seeded `StdRng` only in tests and simulations).
///
/// Cost: one HMAC per record and `t` ChaCha12 words per record, then `d·t` minimum updates;
/// memory `8·t·Σu` bytes. Errors: [`SketchError::Domain`], [`SketchError::WrongArity`],
/// [`SketchError::CodeOutOfDomain`], [`SketchError::DuplicateId`].
pub fn encode_party<I, Id, C, R>(
    params: &SketchParams,
    key: &SketchKey,
    domain_sizes: &[u32],
    records: I,
    rng: &mut R,
) -> Result<SketchReport, SketchError>
where
    I: IntoIterator<Item = (Id, C)>,
    Id: AsRef<[u8]>,
    C: AsRef<[u32]>,
    R: Rng + CryptoRng + ?Sized,
{
    let keyed = key.mac();
    let mut bytes = vec![0u8; 8 * params.repetitions as usize];
    let hash = |id: &[u8], words: &mut [u64]| {
        let (digest, mut stream) = id_stream(&keyed, id);
        read_words(&mut stream, &mut bytes, words);
        digest
    };
    encode_with(params, key.fingerprint(), domain_sizes, records, hash, rng)
}

/// [`encode_party`] over any hash: `hash(id, words)` fills the id's `t` words and returns
/// its 32-byte digest (for duplicate detection). Tests simulate with a fast non-keyed hash.
fn encode_with<I, Id, C, R, H>(
    params: &SketchParams,
    key_fingerprint: String,
    domain_sizes: &[u32],
    records: I,
    mut hash: H,
    rng: &mut R,
) -> Result<SketchReport, SketchError>
where
    I: IntoIterator<Item = (Id, C)>,
    Id: AsRef<[u8]>,
    C: AsRef<[u32]>,
    R: Rng + ?Sized,
    H: FnMut(&[u8], &mut [u64]) -> [u8; 32],
{
    if domain_sizes.is_empty() || domain_sizes.contains(&0) {
        return Err(SketchError::Domain);
    }
    let t = params.repetitions as usize;
    let total = sketch_len(params, domain_sizes)
        .ok_or_else(|| SketchError::Malformed("too many sketches".into()))?;
    let offsets: Vec<usize> = domain_sizes
        .iter()
        .scan(0usize, |acc, &u| {
            let start = *acc;
            *acc += u as usize;
            Some(start)
        })
        .collect();
    // Smallest hash word per (attribute, value, repetition): the max of the geometrics.
    let mut min_words = vec![u64::MAX; total];
    let mut held = vec![false; total / t];
    let mut words = vec![0u64; t];
    let mut seen: HashSet<[u8; 32]> = HashSet::new();
    let mut count: i64 = 0;
    for (id, codes) in records {
        let codes = codes.as_ref();
        if codes.len() != domain_sizes.len() {
            return Err(SketchError::WrongArity {
                expected: domain_sizes.len(),
                found: codes.len(),
            });
        }
        for (attribute, (&code, &size)) in codes.iter().zip(domain_sizes).enumerate() {
            if code >= size {
                return Err(SketchError::CodeOutOfDomain {
                    attribute,
                    code,
                    size,
                });
            }
        }
        let digest = hash(id.as_ref(), &mut words);
        if !seen.insert(digest) {
            return Err(SketchError::DuplicateId);
        }
        for (&code, &offset) in codes.iter().zip(&offsets) {
            let slot = offset + code as usize;
            held[slot] = true;
            for (m, &w) in min_words[slot * t..(slot + 1) * t].iter_mut().zip(&words) {
                *m = (*m).min(w);
            }
        }
        count += 1;
    }
    let ln_base = params.ln_base();
    let sketches = min_words
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let set_max = if held[i / t] {
                geometric_from_word(w, ln_base)
            } else {
                0
            };
            finish_sketch(params, set_max, rng)
        })
        .collect();
    let noisy_count = count + discrete_laplace(params.count_epsilon, rng);
    Ok(SketchReport {
        params: *params,
        key_fingerprint,
        domain_sizes: domain_sizes.to_vec(),
        sketches,
        noisy_count,
    })
}

/// An estimate with its variance (same unit: counts, or counts²).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The estimate.
    pub value: f64,
    /// Its estimated variance.
    pub variance: f64,
}

/// How the `t` repetitions' maxima become one cardinality (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Combine {
    /// The 1/e-th quantile (§2.2, after Smith et al. 2020) read through the exact CDF:
    /// at the level `m` nearest the empirical 1/e-th quantile,
    /// `K̂ = ln F̂(m) / ln(1 − (1+γ)^−m)` (with the `O(1/t)` bias of `ln F̂` removed).
    /// Variance by the delta method: `(1 − F̂)/(t·F̂·ln²(1 − (1+γ)^−m))`.
    #[default]
    Quantile,
    /// The literal `(1+γ)^q`, `q` the empirical 1/e-th quantile: off by up to a factor 1+γ
    /// for a fixed `K` (α is an integer). Variance as [`Combine::Quantile`].
    RawQuantile,
    /// Algorithm 4 line 7 as the authors' code computes it (HyperLogLog):
    /// `K̂ = c·t / Σ_h (1+γ)^−α_h` with `c = γ/((1+γ)·ln(1+γ))` (0.7213 at γ = 1).
    /// Variance by the delta method on the sample variance of `(1+γ)^−α`.
    HarmonicMean,
}

/// The cardinality of everything merged into `maxima` (one merged sketch per repetition),
/// phantoms included: see [`Combine`]. `maxima` must be non-empty (one value per
/// repetition); values below α_min are read as α_min (no merged sketch is below it).
pub fn estimate_union(params: &SketchParams, maxima: &[u8], combine: Combine) -> Estimate {
    union_with_floor(params, params.alpha_min(), maxima, combine)
}

/// [`estimate_union`] for sketches merged from reports of several ε′: the floor is the
/// largest of their α_min (γ is common).
fn union_with_floor(params: &SketchParams, floor: u8, maxima: &[u8], combine: Combine) -> Estimate {
    let t = maxima.len() as f64;
    let ln_b = params.ln_base();
    match combine {
        Combine::HarmonicMean => {
            let xs: Vec<f64> = maxima
                .iter()
                .map(|&a| (-f64::from(a.max(floor)) * ln_b).exp())
                .collect();
            let mean = xs.iter().sum::<f64>() / t;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (t - 1.0).max(1.0);
            let c = params.gamma / ((1.0 + params.gamma) * ln_b);
            Estimate {
                value: c / mean,
                variance: c * c * var / (t * mean.powi(4)),
            }
        }
        Combine::Quantile | Combine::RawQuantile => {
            let mut hist = [0u32; 256];
            for &a in maxima {
                hist[usize::from(a.max(floor))] += 1;
            }
            let mut cdf = [0f64; 256];
            let mut acc = 0u32;
            for (m, &h) in hist.iter().enumerate() {
                acc += h;
                cdf[m] = f64::from(acc) / t;
            }
            let target = (-1f64).exp();
            // q: smallest level whose empirical CDF reaches 1/e (exists: cdf[255] = 1).
            let q = cdf.iter().position(|&f| f >= target).unwrap_or(255);
            // ln F(m) = K·ln(1 − b^−m): read K off the level nearest ln F = −1, clamping F̂
            // inside (0, 1) by half an observation.
            let lo = 1.0 / (2.0 * t);
            let read = |m: usize| {
                let f = cdf[m].clamp(lo, 1.0 - lo);
                let c = (-(-(m as f64) * ln_b).exp()).ln_1p();
                (f, c)
            };
            let mut candidates = vec![read(q)];
            if q > usize::from(floor).max(1) {
                candidates.push(read(q - 1));
            }
            let (f, c) = candidates
                .into_iter()
                .min_by(|a, b| (a.0.ln() + 1.0).abs().total_cmp(&(b.0.ln() + 1.0).abs()))
                .expect("one candidate at least");
            let variance = (1.0 - f) / (t * f * c * c);
            let value = if combine == Combine::RawQuantile {
                (q as f64 * ln_b).exp()
            } else {
                // E[ln F̂] ≈ ln F − (1 − F)/(2tF): add it back.
                (f.ln() + (1.0 - f) / (2.0 * t * f)) / c
            };
            Estimate { value, variance }
        }
    }
}

/// One attribute of one party's report, for the server's estimates.
#[derive(Debug, Clone, Copy)]
pub struct AttributeRef<'a> {
    /// The party's report.
    pub report: &'a SketchReport,
    /// The attribute's index in the report (party order).
    pub attribute: usize,
}

/// The server's n̂ from the parties' noisy counts (all count the same aligned records):
/// their inverse-variance weighted mean. Errors: [`SketchError::BadRequest`] without reports.
pub fn pooled_count(reports: &[&SketchReport]) -> Result<Estimate, SketchError> {
    if reports.is_empty() {
        return Err(SketchError::BadRequest("no reports".into()));
    }
    let weights: Vec<f64> = reports
        .iter()
        .map(|r| 1.0 / r.params.count_variance())
        .collect();
    let total: f64 = weights.iter().sum();
    let value = reports
        .iter()
        .zip(&weights)
        .map(|(r, w)| r.noisy_count as f64 * w)
        .sum::<f64>()
        / total;
    Ok(Estimate {
        value,
        variance: 1.0 / total,
    })
}

/// A cross-party marginal from sketches (Algorithm 4): cells row-major over the attributes
/// in request order (the last attribute fastest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SketchMarginal {
    /// Domain size of each requested attribute.
    pub domain_sizes: Vec<u32>,
    /// Raw count estimates `n̂ − (K̂ − phantoms)`, length `Π u`: not clipped (may be
    /// negative) and not forced to sum to n̂, so the fit sees unbiased measurements.
    pub counts: Vec<f64>,
    /// Estimated variance of each count (repetitions' delta method + n̂'s variance).
    pub count_variances: Vec<f64>,
    /// The n̂ used.
    pub total: Estimate,
}

impl SketchMarginal {
    /// Raw frequencies `counts / n̂` (length `Π u`; may be negative, sum near 1).
    pub fn frequencies(&self) -> Vec<f64> {
        let n = self.total.value.max(1.0);
        self.counts.iter().map(|c| c / n).collect()
    }

    /// Variances of [`SketchMarginal::frequencies`]: `count_variances / n̂²` (n̂'s own
    /// relative error, below 10^−3 for n above a few thousand, is ignored).
    pub fn frequency_variances(&self) -> Vec<f64> {
        let n2 = self.total.value.max(1.0).powi(2);
        self.count_variances.iter().map(|v| v / n2).collect()
    }

    /// Algorithm 4 line 9 (`max(·, 0)`) then normalized to sum 1 (uniform if every count is
    /// clipped): for display, not for the fit.
    pub fn clipped_frequencies(&self) -> Vec<f64> {
        let clipped: Vec<f64> = self.counts.iter().map(|c| c.max(0.0)).collect();
        let sum: f64 = clipped.iter().sum();
        if sum > 0.0 {
            clipped.iter().map(|c| c / sum).collect()
        } else {
            vec![1.0 / clipped.len() as f64; clipped.len()]
        }
    }
}

/// Per attribute: for each value and repetition, the merged sketch of the complement
/// (the max over the attribute's other values, Algorithm 4 line 4's inner max).
fn complement_sketches(attr: &AttributeRef<'_>) -> Vec<Vec<u8>> {
    let u = attr.report.domain_sizes[attr.attribute];
    let t = attr.report.params.repetitions as usize;
    let rows: Vec<&[u8]> = (0..u)
        .map(|v| attr.report.sketches(attr.attribute, v).expect("v < u"))
        .collect();
    // Top two per repetition: the complement of v is the top unless v holds it.
    let mut out = vec![vec![0u8; t]; u as usize];
    for h in 0..t {
        let (mut best, mut best_v, mut second) = (0u8, usize::MAX, 0u8);
        for (v, row) in rows.iter().enumerate() {
            let a = row[h];
            if best_v == usize::MAX || a > best {
                second = best;
                best = a;
                best_v = v;
            } else if a > second {
                second = a;
            }
        }
        for (v, o) in out.iter_mut().enumerate() {
            o[h] = if v == best_v { second } else { best };
        }
    }
    out
}

fn check_request(attributes: &[AttributeRef<'_>]) -> Result<(), SketchError> {
    let first = attributes
        .first()
        .ok_or_else(|| SketchError::BadRequest("no attributes".into()))?;
    for a in attributes {
        // Merging needs the same hash (key, γ, t); ε′ may differ (a party's ε′ depends on its
        // attribute count): each sketch brings its own phantoms and floor.
        let (p, q) = (&a.report.params, &first.report.params);
        if p.gamma != q.gamma
            || p.repetitions != q.repetitions
            || a.report.key_fingerprint != first.report.key_fingerprint
        {
            return Err(SketchError::Mismatch);
        }
        if a.attribute >= a.report.domain_sizes.len() {
            return Err(SketchError::BadRequest(format!(
                "attribute {} not in a report of {} attributes",
                a.attribute,
                a.report.domain_sizes.len()
            )));
        }
    }
    Ok(())
}

/// One attribute's part of a cell: the merged complement sketches of the cell's value, the
/// number of sketches merged (`u − 1`) and their report's parameters.
struct Complement<'a> {
    rows: &'a [u8],
    merged: u64,
    params: &'a SketchParams,
}

/// One cell: `n̂ − (K̂ − Σ_i (u_i − 1)·k_p,i)` from the complement sketches of its values.
fn cell_estimate(parts: &[Complement<'_>], count: Estimate, combine: Combine) -> Estimate {
    let parts: Vec<&Complement<'_>> = parts.iter().filter(|p| p.merged > 0).collect();
    let Some(first) = parts.first() else {
        // Every attribute has one value: the cell is everyone.
        return count;
    };
    let t = first.params.repetitions as usize;
    let maxima: Vec<u8> = (0..t)
        .map(|h| parts.iter().map(|c| c.rows[h]).max().unwrap_or(0))
        .collect();
    let floor = parts
        .iter()
        .map(|c| c.params.alpha_min())
        .max()
        .unwrap_or(0);
    let union = union_with_floor(first.params, floor, &maxima, combine);
    // Σ_i (u_i − 1)·k_p phantom elements were merged in (Algorithm 4 line 8).
    let phantoms: f64 = parts
        .iter()
        .map(|c| c.merged as f64 * c.params.phantoms() as f64)
        .sum();
    Estimate {
        value: count.value - (union.value - phantoms),
        variance: union.variance + count.variance,
    }
}

/// Sketch-based CarEst (Algorithm 4): the marginal of `attributes` (any parties, merged
/// repetition by repetition) with counts from `count` (n̂, e.g. [`pooled_count`]). All
/// reports must share the key, γ and `t` (ε′ may differ between parties). Errors: [`SketchError::Mismatch`],
/// [`SketchError::BadRequest`] (no attributes, an index outside a report, more than
/// [`MAX_MARGINAL_CELLS`] cells).
pub fn estimate_marginal(
    attributes: &[AttributeRef<'_>],
    count: Estimate,
    combine: Combine,
) -> Result<SketchMarginal, SketchError> {
    check_request(attributes)?;
    let sizes: Vec<u32> = attributes
        .iter()
        .map(|a| a.report.domain_sizes[a.attribute])
        .collect();
    let cells = sizes
        .iter()
        .try_fold(1usize, |acc, &u| acc.checked_mul(u as usize))
        .filter(|&c| c <= MAX_MARGINAL_CELLS)
        .ok_or_else(|| SketchError::BadRequest("too many cells".into()))?;
    let complements: Vec<Vec<Vec<u8>>> = attributes.iter().map(complement_sketches).collect();
    let mut counts = Vec::with_capacity(cells);
    let mut count_variances = Vec::with_capacity(cells);
    let mut values = vec![0usize; sizes.len()];
    for _ in 0..cells {
        let parts: Vec<Complement<'_>> = values
            .iter()
            .zip(&complements)
            .zip(attributes)
            .map(|((&v, c), a)| Complement {
                rows: &c[v],
                merged: u64::from(a.report.domain_sizes[a.attribute]) - 1,
                params: &a.report.params,
            })
            .collect();
        let e = cell_estimate(&parts, count, combine);
        counts.push(e.value);
        count_variances.push(e.variance);
        // Next cell, last attribute fastest.
        for i in (0..values.len()).rev() {
            values[i] += 1;
            if values[i] < sizes[i] as usize {
                break;
            }
            values[i] = 0;
        }
    }
    Ok(SketchMarginal {
        domain_sizes: sizes,
        counts,
        count_variances,
        total: count,
    })
}

/// Sketch-based CarEst for one cell: the size of `∩_i {ids with attribute_i = value_i}` by
/// inclusion–exclusion over merged sketches. Errors as [`estimate_marginal`], and
/// [`SketchError::BadRequest`] for a value outside its domain.
pub fn estimate_intersection(
    sets: &[(AttributeRef<'_>, u32)],
    count: Estimate,
    combine: Combine,
) -> Result<Estimate, SketchError> {
    let attributes: Vec<AttributeRef<'_>> = sets.iter().map(|(a, _)| *a).collect();
    check_request(&attributes)?;
    let mut complements = Vec::with_capacity(sets.len());
    for (a, v) in sets {
        let u = a.report.domain_sizes[a.attribute];
        if *v >= u {
            return Err(SketchError::BadRequest(format!(
                "value {v} outside a domain of {u}"
            )));
        }
        complements.push(complement_sketches(a).swap_remove(*v as usize));
    }
    let parts: Vec<Complement<'_>> = sets
        .iter()
        .zip(&complements)
        .map(|((a, _), rows)| Complement {
            rows,
            merged: u64::from(a.report.domain_sizes[a.attribute]) - 1,
            params: &a.report.params,
        })
        .collect();
    Ok(cell_estimate(&parts, count, combine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;

    /// χ² quantile at upper tail `z` standard deviations (Wilson–Hilferty).
    fn chi2_critical(df: f64, z: f64) -> f64 {
        let a = 2.0 / (9.0 * df);
        df * (1.0 - a + z * a.sqrt()).powi(3)
    }

    /// z of the upper 1e-6 tail of the standard normal.
    const Z_1E6: f64 = 4.753;

    /// `ln P(max(K geometrics, α_min) = m)` for Algorithm 1's output, exact.
    fn ln_pmf(params: &SketchParams, k: f64, m: u32) -> f64 {
        let ln_b = params.ln_base();
        let floor = u32::from(params.alpha_min());
        if m < floor {
            return f64::NEG_INFINITY;
        }
        let ln_cdf = |m: u32| (-(-(f64::from(m)) * ln_b).exp()).ln_1p();
        let here = k * ln_cdf(m);
        if m == floor {
            return here;
        }
        // F(m)^K − F(m−1)^K = F(m)^K·(1 − e^{K(ln F(m−1) − ln F(m))}), without cancellation.
        here + (-(k * (ln_cdf(m - 1) - ln_cdf(m))).exp_m1()).ln()
    }

    #[test]
    fn budget_parameters_keep_their_guarantee() {
        // A sketch budget of 0.576 at δ = 1/45222 for 8 sketches per person, t = 2000: the
        // calibrated ε′ keeps it by the exact accountant, and n̂ adds its own ε.
        let delta = 1.0 / 45222.0;
        let p = SketchParams::for_budget(0.576, delta, 8, 2000, 1.0, 0.064).unwrap();
        assert!((p.count_epsilon() - 0.064).abs() < 1e-15);
        let (eps, d) = p.guarantee(8, delta).unwrap();
        assert!(eps <= 0.64 + 1e-12 && eps > 0.064 && d == delta, "{eps}");
        // Theorem 2's ε′ for the same budget, 0.576/(4√(2000·8·ln 45222)), is not private.
        let paper = SketchParams::new(1.0, 2000, 3.477_110_547_904_711_6e-4, 0.064).unwrap();
        assert!(paper.guarantee(8, delta).unwrap().0 > 50.0);
        assert_eq!(p.guarantee(0, 0.1), Err(SketchError::Domain));
        assert_eq!(p.guarantee(2, 1.0), Err(SketchError::Delta(1.0)));
        // Algorithm 1 line 1 at ε′ = 0.3, γ = 1: k_p = ⌈1/(e^0.3 − 1)⌉ = ⌈2.858⌉ = 3,
        // α_min = ⌈log₂ 1/(1 − e^−0.3)⌉ = ⌈1.948⌉ = 2.
        let p = SketchParams::new(1.0, 1, 0.3, 1.0).unwrap();
        assert_eq!((p.phantoms(), p.alpha_min()), (3, 2));
        assert!(SketchParams::new(0.1, 10, 1.0, 1.0).is_err());
        assert!(SketchParams::new(1.0, 0, 1.0, 1.0).is_err());
        assert!(SketchParams::new(1.0, 10, 0.0, 1.0).is_err());
        assert!(SketchParams::new(0.25, 10, 1e-30, 1.0).is_err());
    }

    #[test]
    fn dpfm_worst_case_ratio_is_within_epsilon() {
        // Lemma 4 / Algorithm 1: a set of k vs k + 1 ids (phantoms and floor included), the
        // exact output distributions, every output level.
        for &gamma in &[0.25, 1.0, 4.0] {
            for &eps in &[0.05, 0.3, 1.0, 2.0] {
                let p = SketchParams::new(gamma, 1, eps, 1.0).unwrap();
                let kp = p.phantoms() as f64;
                for &k in &[0.0, 1.0, 10.0, 1000.0] {
                    let mut worst = 0f64;
                    for m in u32::from(p.alpha_min())..=255 {
                        let (a, b) = (ln_pmf(&p, k + kp, m), ln_pmf(&p, k + kp + 1.0, m));
                        if a < -600.0 && b < -600.0 {
                            continue;
                        }
                        worst = worst.max((a - b).abs());
                    }
                    assert!(worst <= eps + 1e-9, "γ {gamma} ε′ {eps} k {k}: {worst}");
                }
            }
        }
    }

    #[test]
    fn dpfm_output_distribution_matches_algorithm_1() {
        // χ² goodness of fit of Algorithm 1's output for a set of 4 ids, a fresh key per
        // draw, against P(out ≤ m) = (1 − (1+γ)^−m)^(4 + k_p) for m ≥ α_min.
        let mut rng = StdRng::seed_from_u64(20240825);
        let ids: Vec<String> = (0..4).map(|i| format!("record-{i}")).collect();
        for &(gamma, eps) in &[(1.0, 0.3), (0.5, 0.8)] {
            let p = SketchParams::new(gamma, 3, eps, 1.0).unwrap();
            let k = 4.0 + p.phantoms() as f64;
            let draws = 20_000usize;
            let mut counts = [0usize; 256];
            for _ in 0..draws {
                let key = SketchKey::generate(&mut rng);
                let a = dpfm(&p, &key, 2, &ids, &mut rng).unwrap();
                counts[usize::from(a)] += 1;
            }
            let floor = usize::from(p.alpha_min());
            assert_eq!(counts[..floor].iter().sum::<usize>(), 0);
            // Bins from the floor up, the tail pooled once expected counts fall below 20.
            let (mut chi2, mut df, mut tail_obs, mut tail_p) = (0.0, 0usize, 0usize, 1.0);
            for m in floor..256 {
                let pm = ln_pmf(&p, k, m as u32).exp();
                if pm * draws as f64 >= 20.0 && tail_p - pm >= 20.0 / draws as f64 {
                    let e = pm * draws as f64;
                    chi2 += (counts[m] as f64 - e).powi(2) / e;
                    df += 1;
                    tail_p -= pm;
                } else {
                    tail_obs = counts[m..].iter().sum();
                    break;
                }
            }
            let e = tail_p * draws as f64;
            chi2 += (tail_obs as f64 - e).powi(2) / e;
            let critical = chi2_critical(df as f64, Z_1E6);
            assert!(df >= 4, "too few bins: {df}");
            assert!(
                chi2 < critical,
                "γ {gamma} ε′ {eps}: χ² {chi2} ≥ {critical} on {df} df"
            );
        }
    }

    /// SplitMix64 (Steele et al. 2014): a fast stand-in for the keyed hash in simulations
    /// (debug-build ChaCha would make the runs below take minutes; the keyed hash itself is
    /// checked by the χ² and pinned-vector tests).
    fn splitmix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Two parties over `n` ids: A (2 values: parity), B (3 values: id < 300, < 800, rest),
    /// sketched under one simulated key; the truth and each combiner's (count, variance) table.
    fn two_party_table(
        params: &SketchParams,
        n: usize,
        rng: &mut StdRng,
        combine: &[Combine],
    ) -> (Vec<f64>, Vec<Vec<(f64, f64)>>) {
        let seed: u64 = rng.random();
        let hash = |id: &[u8], words: &mut [u64]| {
            let x = splitmix(seed ^ u64::from_le_bytes(id.try_into().unwrap()));
            for (h, w) in words.iter_mut().enumerate() {
                *w = splitmix(x ^ splitmix(h as u64));
            }
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(id);
            digest
        };
        let a_of = |i: usize| (i % 2) as u32;
        let b_of = |i: usize| u32::from(i >= 300) + u32::from(i >= 800);
        let records = |f: &dyn Fn(usize) -> u32| -> Vec<([u8; 8], [u32; 1])> {
            (0..n).map(|i| ((i as u64).to_le_bytes(), [f(i)])).collect()
        };
        let fp = "0123456789abcdef".to_owned();
        let a = encode_with(params, fp.clone(), &[2], records(&a_of), hash, rng).unwrap();
        let b = encode_with(params, fp, &[3], records(&b_of), hash, rng).unwrap();
        let mut truth = vec![0.0; 6];
        for i in 0..n {
            truth[(a_of(i) * 3 + b_of(i)) as usize] += 1.0;
        }
        let count = pooled_count(&[&a, &b]).unwrap();
        let attrs = [
            AttributeRef {
                report: &a,
                attribute: 0,
            },
            AttributeRef {
                report: &b,
                attribute: 0,
            },
        ];
        let tables = combine
            .iter()
            .map(|&c| {
                let m = estimate_marginal(&attrs, count, c).unwrap();
                m.counts.into_iter().zip(m.count_variances).collect()
            })
            .collect();
        (truth, tables)
    }

    #[test]
    fn carest_is_unbiased_within_its_stated_error_and_sharpens_with_t() {
        // 1200 people, cells of 150–250; ε′ = 0.5 (k_p = 2), n̂ at ε = 1. Per t, 150 runs with
        // fresh keys: every cell's mean error within 5 standard errors (a false alarm below
        // 1e-6 per cell); the stated variances within a factor 2 of the runs' variance; the
        // pooled RMSE at t = 256 below 0.7× that at t = 64 (theory: 0.5×).
        let runs = 150;
        let combines = [Combine::Quantile, Combine::HarmonicMean];
        let mut rng = StdRng::seed_from_u64(37);
        let mut rmse = Vec::new();
        for &t in &[64u32, 256] {
            let params = SketchParams::new(1.0, t, 0.5, 1.0).unwrap();
            let mut errors = vec![vec![Vec::new(); 6]; combines.len()];
            let mut stated = vec![vec![0.0; 6]; combines.len()];
            for _ in 0..runs {
                let (truth, tables) = two_party_table(&params, 1200, &mut rng, &combines);
                for (c, table) in tables.iter().enumerate() {
                    for (cell, &(est, var)) in table.iter().enumerate() {
                        errors[c][cell].push(est - truth[cell]);
                        stated[c][cell] += var / runs as f64;
                    }
                }
            }
            for (c, combine) in combines.iter().enumerate() {
                let mut sq = 0.0;
                for cell in 0..6 {
                    let e = &errors[c][cell];
                    let mean = e.iter().sum::<f64>() / runs as f64;
                    let var = e.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (runs - 1) as f64;
                    let se = (var / runs as f64).sqrt();
                    assert!(
                        mean.abs() < 5.0 * se,
                        "{combine:?} t {t} cell {cell}: bias {mean} vs SE {se}"
                    );
                    let ratio = stated[c][cell] / var;
                    assert!(
                        (0.5..2.0).contains(&ratio),
                        "{combine:?} t {t} cell {cell}: stated/empirical variance {ratio}"
                    );
                    sq += e.iter().map(|x| x * x).sum::<f64>();
                }
                if c == 0 {
                    rmse.push((sq / (6 * runs) as f64).sqrt());
                }
            }
        }
        eprintln!("pooled RMSE of the quantile combiner at t = 64, 256: {rmse:?}");
        assert!(rmse[1] < 0.7 * rmse[0], "RMSE {rmse:?}");
    }

    #[test]
    fn parties_with_different_epsilon_merge_and_intersections_match_marginals() {
        // The real keyed hash end to end; party B at another ε′ (as a party with fewer
        // attributes gets): every cell within 5 stated standard deviations of the truth.
        let mut rng = StdRng::seed_from_u64(3);
        let params = SketchParams::new(1.0, 128, 0.5, 1.0).unwrap();
        let params_b = SketchParams::new(1.0, 128, 0.8, 0.5).unwrap();
        let key = SketchKey::generate(&mut rng);
        let ids: Vec<String> = (0..600).map(|i| i.to_string()).collect();
        let a = encode_party(
            &params,
            &key,
            &[2, 3],
            ids.iter()
                .enumerate()
                .map(|(i, id)| (id, [(i % 2) as u32, (i % 3) as u32])),
            &mut rng,
        )
        .unwrap();
        let b = encode_party(
            &params_b,
            &key,
            &[4],
            ids.iter().enumerate().map(|(i, id)| (id, [(i % 4) as u32])),
            &mut rng,
        )
        .unwrap();
        let n = pooled_count(&[&a, &b]).unwrap();
        let x = AttributeRef {
            report: &a,
            attribute: 1,
        };
        let y = AttributeRef {
            report: &b,
            attribute: 0,
        };
        let m = estimate_marginal(&[x, y], n, Combine::Quantile).unwrap();
        assert_eq!(m.counts.len(), 12);
        for (cell, (c, v)) in m.counts.iter().zip(&m.count_variances).enumerate() {
            let truth = (0..600)
                .filter(|i| i % 3 == cell / 4 && i % 4 == cell % 4)
                .count();
            assert!(
                (c - truth as f64).abs() < 5.0 * v.sqrt(),
                "cell {cell}: {c} vs {truth} (sd {})",
                v.sqrt()
            );
        }
        let cell = estimate_intersection(&[(x, 2), (y, 1)], n, Combine::Quantile).unwrap();
        assert_eq!(cell.value, m.counts[2 * 4 + 1]);
        assert_eq!(cell.variance, m.count_variances[2 * 4 + 1]);
        assert!(estimate_intersection(&[(x, 3)], n, Combine::Quantile).is_err());
        let other = SketchKey::generate(&mut rng);
        let c = encode_party(&params, &other, &[2], [("0", [0u32])], &mut rng).unwrap();
        let z = AttributeRef {
            report: &c,
            attribute: 0,
        };
        assert_eq!(
            estimate_marginal(&[x, z], n, Combine::Quantile),
            Err(SketchError::Mismatch)
        );
        let half = SketchParams::new(0.5, 128, 0.5, 1.0).unwrap();
        let d = encode_party(&half, &key, &[2], [("0", [0u32])], &mut rng).unwrap();
        let w = AttributeRef {
            report: &d,
            attribute: 0,
        };
        assert_eq!(
            estimate_marginal(&[x, w], n, Combine::Quantile),
            Err(SketchError::Mismatch)
        );
    }

    #[test]
    fn encoder_refuses_bad_records() {
        let mut rng = StdRng::seed_from_u64(1);
        let p = SketchParams::new(1.0, 4, 1.0, 1.0).unwrap();
        let key = SketchKey::new(vec![1; 32]).unwrap();
        let enc = |recs: Vec<(&str, Vec<u32>)>, rng: &mut StdRng| {
            encode_party(&p, &key, &[2, 3], recs, rng).map(|_| ())
        };
        assert_eq!(
            enc(vec![("a", vec![0])], &mut rng),
            Err(SketchError::WrongArity {
                expected: 2,
                found: 1
            })
        );
        assert_eq!(
            enc(vec![("a", vec![0, 3])], &mut rng),
            Err(SketchError::CodeOutOfDomain {
                attribute: 1,
                code: 3,
                size: 3
            })
        );
        assert_eq!(
            enc(vec![("a", vec![0, 1]), ("a", vec![1, 1])], &mut rng),
            Err(SketchError::DuplicateId)
        );
        assert!(encode_party(&p, &key, &[], Vec::<(&str, Vec<u32>)>::new(), &mut rng).is_err());
        assert_eq!(
            SketchKey::new(vec![0; 31]).err(),
            Some(SketchError::KeyTooShort(31))
        );
        assert_eq!(format!("{key:?}"), "SketchKey(<secret>)");
    }

    #[test]
    fn report_round_trips_through_json_and_refuses_malformed_ones() {
        let mut rng = StdRng::seed_from_u64(2);
        let p = SketchParams::new(1.0, 5, 0.3, 1.0).unwrap();
        let key = SketchKey::new(vec![9; 32]).unwrap();
        let report = encode_party(
            &p,
            &key,
            &[2, 3],
            (0..50u32).map(|i| (i.to_le_bytes(), [i % 2, i % 3])),
            &mut rng,
        )
        .unwrap();
        let json = serde_json::to_value(&report).unwrap();
        let back: SketchReport = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, report);
        assert_eq!(report.sketches(1, 2).unwrap().len(), 5);
        assert!(report.sketches(1, 3).is_none() && report.sketches(2, 0).is_none());
        let bad = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut j = json.clone();
            f(&mut j);
            serde_json::from_value::<SketchReport>(j).is_err()
        };
        // Too few sketches, a value below α_min (= 2), a bad fingerprint, an unknown field,
        // an invalid parameter, an empty domain.
        assert!(bad(&|j| j["sketches"] = BASE64.encode([2u8; 24]).into()));
        assert!(bad(&|j| j["sketches"] = BASE64.encode([1u8; 25]).into()));
        assert!(!bad(&|j| j["sketches"] = BASE64.encode([2u8; 25]).into()));
        assert!(bad(&|j| j["key_fingerprint"] = "XYZ".into()));
        assert!(bad(&|j| j["raw_ids"] = serde_json::json!(["a"])));
        assert!(bad(&|j| j["params"]["gamma"] = 0.01.into()));
        assert!(bad(&|j| j["domain_sizes"] = serde_json::json!([2, 0])));
    }

    #[test]
    fn keyed_hash_is_pinned() {
        // Parties on different machines must hash alike: HMAC-SHA256 then ChaCha12 words.
        let key = SketchKey::new(vec![7; 32]).unwrap();
        assert_eq!(key.fingerprint(), PINNED_FINGERPRINT);
        let (_, mut stream) = id_stream(&key.mac(), b"person-0");
        let mut words = [0u64; 42];
        read_words(&mut stream, &mut [0u8; 8 * 42], &mut words);
        assert_eq!((words[0], words[41]), PINNED_WORDS);
        // dpfm's seek reads the same word.
        let (_, mut stream) = id_stream(&key.mac(), b"person-0");
        stream.set_word_pos(2 * 41);
        assert_eq!(stream.next_u64(), PINNED_WORDS.1);
    }

    /// A derived key depends on the secret and the context (one key per collection from one
    /// shared file), reproducibly, and refuses a short secret.
    #[test]
    fn derived_keys_are_per_secret_and_context() {
        let secret = [7u8; 32];
        let a = SketchKey::derive(&secret, b"collection a").unwrap();
        assert_eq!(
            a.fingerprint(),
            SketchKey::derive(&secret, b"collection a")
                .unwrap()
                .fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            SketchKey::derive(&secret, b"collection b")
                .unwrap()
                .fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            SketchKey::derive(&[8u8; 32], b"collection a")
                .unwrap()
                .fingerprint()
        );
        // Not the secret itself.
        assert_ne!(
            a.fingerprint(),
            SketchKey::new(secret.to_vec()).unwrap().fingerprint()
        );
        assert!(matches!(
            SketchKey::derive(&[7u8; 31], b"collection a"),
            Err(SketchError::KeyTooShort(31))
        ));
    }

    const PINNED_FINGERPRINT: &str = "f33a39c625530228";
    const PINNED_WORDS: (u64, u64) = (12_794_182_233_323_393_719, 13_893_607_028_335_034_005);
}
