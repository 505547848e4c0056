//! Task tokens: what the server asks one person to report, signed with HMAC-SHA256.
//!
//! A token binds collection, round, factor, mechanism, ε, expiry and a random nonce
//! (docs/design.md "Wire formats"). Layout before base64url (no padding):
//!
//! ```text
//! version u8 = 1 | collection 16 B | round u32 BE | mechanism u8 | epsilon f64 BE
//! | expires_at i64 BE | nonce 16 B | factor length u8 | factor u16 BE × length | HMAC 32 B
//! ```
//!
//! A task with bin maps (docs/design.md "Tasks with bin maps") takes version 2, which adds after
//! the factor, per factor attribute, `cut count u16 BE | cuts u16 BE × count` (count 0: full
//! resolution), at most [`MAX_TOKEN_CUTS`] cuts in all: the token binds the maps themselves,
//! so the server reads the table a report belongs to from the token alone.
//!
//! The MAC covers every byte before it and is checked in constant time before any field is
//! trusted. The key is shared by all aggregator processes and survives restarts (stored in
//! the database unless `LDPSYN_TOKEN_KEY` is set).
//!
//! [`validate_report`] checks an uploaded report against its token and collection.
//!
//! ```
//! use ldpsyn::{Epsilon, mechanism::MechanismKind};
//! use ldpsyn_service::tokens::{TaskClaims, TokenKey};
//! let key = TokenKey::new(vec![7; 32]).unwrap();
//! let claims = TaskClaims {
//!     collection: uuid::Uuid::nil(), round: 2, factor: vec![0, 3],
//!     mechanism: MechanismKind::Oue, epsilon: Epsilon::new(4.0).unwrap(),
//!     expires_at: 1_790_000_000, nonce: [1; 16], bins: vec![],
//! };
//! let token = key.sign(&claims);
//! assert_eq!(key.verify(&token).unwrap(), claims);
//! let other = TokenKey::new(vec![8; 32]).unwrap();
//! assert!(other.verify(&token).is_err());
//! ```

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use ldpsyn::Epsilon;
use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::{Problem, ProblemType, Report};
use sha2::Sha256;
use uuid::Uuid;

use super::ingest::CollectionHandle;
use super::storage::{NewReport, hex};
use ldpsyn_engine::{TableKey, TaskSpec};

type HmacSha256 = Hmac<Sha256>;

/// Token format version without bin maps.
const VERSION: u8 = 1;
/// Token format version with bin maps.
const VERSION_BINS: u8 = 2;
/// Most bin-map cuts one token carries.
pub const MAX_TOKEN_CUTS: usize = ldpsyn_engine::domain::space::MAX_TASK_CUTS;
/// Length of the MAC.
const MAC_LEN: usize = 32;
/// Fixed part of the body: version, collection, round, mechanism, ε, expiry, nonce, length.
const FIXED_LEN: usize = 1 + 16 + 4 + 1 + 8 + 8 + 16 + 1;
/// Longest factor a token can carry.
pub const MAX_FACTOR_LEN: usize = 64;
/// Longest token string accepted (checked before decoding).
pub const MAX_TOKEN_CHARS: usize =
    (FIXED_LEN + 2 * MAX_FACTOR_LEN + 2 * MAX_FACTOR_LEN + 2 * MAX_TOKEN_CUTS + MAC_LEN)
        .div_ceil(3)
        * 4;
/// Shortest acceptable key, bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not base64url, wrong length, unknown version or field value.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The MAC does not match: forged, altered, or signed with another key.
    #[error("token signature does not verify")]
    BadSignature,
    /// The key is too short.
    #[error("token key must have at least {MIN_KEY_BYTES} bytes")]
    WeakKey,
}

/// What a token says. All fields are covered by the MAC.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskClaims {
    /// The collection.
    pub collection: Uuid,
    /// Round (PrivIncr) or batch (SamPrivSyn) of the task.
    pub round: u32,
    /// Factor, attribute indices in report order.
    pub factor: Vec<usize>,
    /// Mechanism.
    pub mechanism: MechanismKind,
    /// ε of the report.
    pub epsilon: Epsilon,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
    /// Nonce (see [`TaskClaims::fresh_nonces`]): a token answers one report, identified by
    /// `(collection, nonce)`.
    pub nonce: [u8; 16],
    /// Bin maps of the factor's attributes (factor order, `[]` for full resolution), or
    /// empty when none is binned.
    pub bins: Vec<Vec<u32>>,
}

impl TaskClaims {
    /// `n` new nonces, in increasing order: each is the issue time in Unix milliseconds (48
    /// bits, big-endian) then 80 random bits from the thread's CSPRNG. Time first makes the
    /// replay set's key (`report_tokens`) grow at its end (a cheap insert) instead of at random
    /// pages; the time says nothing the token's `expires_at` does not already say, and 80
    /// random bits keep nonces from colliding across processes. In order, so that the answers
    /// to one fetch of many tasks, sent back in that order, insert at neighbouring keys: with
    /// the 80 bits in draw order they scattered over every page of the fetch's millisecond
    /// (`benchmarks/results/profile-ingest.md`). The order of tasks within one answer carries
    /// nothing: they are independent draws.
    pub fn fresh_nonces(now_ms: u64, n: usize) -> Vec<[u8; 16]> {
        let mut rng = rand::rng();
        let mut nonces: Vec<[u8; 16]> = (0..n)
            .map(|_| {
                let mut nonce = [0u8; 16];
                nonce[..6].copy_from_slice(&now_ms.to_be_bytes()[2..]);
                rand::RngCore::fill_bytes(&mut rng, &mut nonce[6..]);
                nonce
            })
            .collect();
        nonces.sort_unstable();
        nonces
    }

    /// The task these claims describe (round, factor, mechanism, bin maps).
    pub fn task_spec(&self) -> TaskSpec {
        TaskSpec {
            round: self.round,
            factor: self.factor.clone(),
            mechanism: self.mechanism,
            bins: self.bins.clone(),
        }
    }

    /// The nonce as lowercase hex (the database key of the token).
    pub fn nonce_hex(&self) -> String {
        hex(&self.nonce)
    }
}

/// The bytes of an even-length hex string, `None` if it is not one (or longer than 128
/// digits: it comes from an untrusted header).
fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn mechanism_code(m: MechanismKind) -> u8 {
    match m {
        MechanismKind::Grr => 1,
        MechanismKind::Oue => 2,
        MechanismKind::GrrPair => 3,
    }
}

fn mechanism_from_code(c: u8) -> Option<MechanismKind> {
    match c {
        1 => Some(MechanismKind::Grr),
        2 => Some(MechanismKind::Oue),
        3 => Some(MechanismKind::GrrPair),
        _ => None,
    }
}

/// The HMAC-SHA256 key that signs task tokens. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct TokenKey {
    mac: HmacSha256,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(<redacted>)")
    }
}

impl TokenKey {
    /// A key from raw bytes. Errors: [`TokenError::WeakKey`] below [`MIN_KEY_BYTES`].
    pub fn new(key: Vec<u8>) -> Result<Self, TokenError> {
        if key.len() < MIN_KEY_BYTES {
            return Err(TokenError::WeakKey);
        }
        // HMAC accepts keys of any length.
        let mac = HmacSha256::new_from_slice(&key).map_err(|_| TokenError::WeakKey)?;
        Ok(Self { mac })
    }

    /// Signs `claims` into an opaque token string. Panics if the factor is empty, has more
    /// than [`MAX_FACTOR_LEN`] attributes or an index above `u16::MAX`, or if the bin maps do
    /// not match the factor, exceed [`MAX_TOKEN_CUTS`] cuts or a cut above `u16::MAX` (the
    /// engine never draws such tasks, and [`TokenKey::verify`] would refuse the token).
    pub fn sign(&self, claims: &TaskClaims) -> String {
        assert!(
            (1..=MAX_FACTOR_LEN).contains(&claims.factor.len()),
            "a token's factor has 1..={MAX_FACTOR_LEN} attributes"
        );
        let binned = !claims.bins.is_empty();
        assert!(
            !binned
                || (claims.bins.len() == claims.factor.len()
                    && claims.bins.iter().map(Vec::len).sum::<usize>() <= MAX_TOKEN_CUTS),
            "a token's bin maps match its factor and have at most {MAX_TOKEN_CUTS} cuts"
        );
        let mut body = Vec::with_capacity(FIXED_LEN + 2 * claims.factor.len() + MAC_LEN);
        body.push(if binned { VERSION_BINS } else { VERSION });
        body.extend_from_slice(claims.collection.as_bytes());
        body.extend_from_slice(&claims.round.to_be_bytes());
        body.push(mechanism_code(claims.mechanism));
        body.extend_from_slice(&claims.epsilon.get().to_be_bytes());
        body.extend_from_slice(&claims.expires_at.to_be_bytes());
        body.extend_from_slice(&claims.nonce);
        body.push(claims.factor.len() as u8);
        for &a in &claims.factor {
            let a = u16::try_from(a).expect("attribute index fits in u16 (checked at creation)");
            body.extend_from_slice(&a.to_be_bytes());
        }
        for cuts in &claims.bins {
            body.extend_from_slice(&(cuts.len() as u16).to_be_bytes());
            for &c in cuts {
                let c = u16::try_from(c).expect("cuts fit in u16 (domains are smaller)");
                body.extend_from_slice(&c.to_be_bytes());
            }
        }
        let mut mac = self.mac.clone();
        mac.update(&body);
        body.extend_from_slice(&mac.finalize().into_bytes());
        URL_SAFE_NO_PAD.encode(body)
    }

    /// The upload token of party `party` of vertical collection `collection`: lowercase hex
    /// of HMAC-SHA256(key, "ldpsyn-party\0" ‖ collection ‖ party). Only the server can mint
    /// one; it binds the party, so a party cannot upload for another.
    pub fn party_token(&self, collection: Uuid, party: &str) -> String {
        hex(&self.party_mac(collection, party).finalize().into_bytes())
    }

    /// Whether `presented` is [`TokenKey::party_token`] of `(collection, party)` (constant
    /// time).
    pub fn verify_party_token(&self, collection: Uuid, party: &str, presented: &str) -> bool {
        let Some(bytes) = unhex(presented) else {
            return false;
        };
        self.party_mac(collection, party)
            .verify_slice(&bytes)
            .is_ok()
    }

    fn party_mac(&self, collection: Uuid, party: &str) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(b"ldpsyn-party\0");
        mac.update(collection.as_bytes());
        mac.update(party.as_bytes());
        mac
    }

    /// Checks the MAC (constant time) and parses the claims. Expiry and collection are the
    /// caller's to check. Errors: [`TokenError::Malformed`], [`TokenError::BadSignature`].
    pub fn verify(&self, token: &str) -> Result<TaskClaims, TokenError> {
        if token.len() > MAX_TOKEN_CHARS {
            return Err(TokenError::Malformed("too long"));
        }
        let raw = URL_SAFE_NO_PAD
            .decode(token.as_bytes())
            .map_err(|_| TokenError::Malformed("not base64url without padding"))?;
        if raw.len() < FIXED_LEN + MAC_LEN {
            return Err(TokenError::Malformed("too short"));
        }
        let (body, tag) = raw.split_at(raw.len() - MAC_LEN);
        let mut mac = self.mac.clone();
        mac.update(body);
        mac.verify_slice(tag)
            .map_err(|_| TokenError::BadSignature)?;
        parse_body(body)
    }
}

/// Parses a token body (without MAC). Only called on authenticated bytes, but written to be
/// safe on any input (it is fuzzed).
fn parse_body(body: &[u8]) -> Result<TaskClaims, TokenError> {
    let mut r = Reader(body);
    let version = r.take::<1>()?[0];
    if version != VERSION && version != VERSION_BINS {
        return Err(TokenError::Malformed("unknown version"));
    }
    let collection = Uuid::from_bytes(r.take::<16>()?);
    let round = u32::from_be_bytes(r.take::<4>()?);
    let mechanism =
        mechanism_from_code(r.take::<1>()?[0]).ok_or(TokenError::Malformed("unknown mechanism"))?;
    let epsilon = Epsilon::new(f64::from_be_bytes(r.take::<8>()?))
        .map_err(|_| TokenError::Malformed("invalid epsilon"))?;
    let expires_at = i64::from_be_bytes(r.take::<8>()?);
    let nonce = r.take::<16>()?;
    let len = r.take::<1>()?[0] as usize;
    if len == 0 || len > MAX_FACTOR_LEN {
        return Err(TokenError::Malformed("bad factor length"));
    }
    let mut factor = Vec::with_capacity(len);
    for _ in 0..len {
        factor.push(u16::from_be_bytes(r.take::<2>()?) as usize);
    }
    let mut bins = Vec::new();
    if version == VERSION_BINS {
        let mut total = 0;
        for _ in 0..len {
            let count = u16::from_be_bytes(r.take::<2>()?) as usize;
            total += count;
            if total > MAX_TOKEN_CUTS {
                return Err(TokenError::Malformed("too many bin cuts"));
            }
            let mut cuts = Vec::with_capacity(count);
            for _ in 0..count {
                cuts.push(u32::from(u16::from_be_bytes(r.take::<2>()?)));
            }
            bins.push(cuts);
        }
        if bins.iter().all(Vec::is_empty) {
            return Err(TokenError::Malformed("version 2 without bin maps"));
        }
    }
    if !r.0.is_empty() {
        return Err(TokenError::Malformed("trailing bytes"));
    }
    Ok(TaskClaims {
        collection,
        round,
        factor,
        mechanism,
        epsilon,
        expires_at,
        nonce,
        bins,
    })
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], TokenError> {
        if self.0.len() < N {
            return Err(TokenError::Malformed("truncated"));
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }
}

/// Why a report does not validate: its answer's problem, and, for a genuine token of this
/// collection that has expired, the token's nonce (a resend of a stored report is answered
/// `duplicate` whatever its token's age, so the caller looks the nonce up).
#[derive(Debug, Clone)]
pub struct Invalid {
    /// The problem of the report's answer.
    pub problem: Problem,
    /// The expired token's nonce (hex), with `token-expired` only.
    pub expired_nonce: Option<String>,
}

impl From<Problem> for Invalid {
    fn from(problem: Problem) -> Self {
        Self {
            problem,
            expired_nonce: None,
        }
    }
}

/// Validates one report against its token and the collection: a verified token of this
/// collection, unexpired, with the collection's ε, and a payload that fits the token's
/// mechanism and factor ([`ldpsyn::mechanism::Mechanism::validate`]). Errors: the problem
/// of the report's answer (`invalid-token`, `token-expired`, `invalid-payload`).
pub fn validate_report(
    key: &TokenKey,
    h: &CollectionHandle,
    report: Report,
    now: i64,
) -> Result<NewReport, Invalid> {
    let claims = key
        .verify(&report.token)
        .map_err(|e| Problem::new(ProblemType::InvalidToken, e.to_string()))?;
    if claims.collection != h.id {
        return Err(Problem::new(
            ProblemType::InvalidToken,
            "the token was issued for another collection",
        )
        .into());
    }
    if claims.expires_at < now {
        return Err(Invalid {
            problem: Problem::new(
                ProblemType::TokenExpired,
                format!("the token expired at {}", claims.expires_at),
            ),
            expired_nonce: Some(claims.nonce_hex()),
        });
    }
    if claims.epsilon != h.config.epsilon {
        return Err(Problem::new(
            ProblemType::InvalidToken,
            "the token's epsilon is not the collection's",
        )
        .into());
    }
    let key: TableKey = h.engine.table_key(&claims.task_spec());
    let m = h
        .mechanism(&key)
        .map_err(|e| Problem::new(ProblemType::InvalidToken, format!("engine: {e}")))?;
    m.validate(&report.payload)
        .map_err(|e| Problem::new(ProblemType::InvalidPayload, e.to_string()))?;
    Ok(NewReport {
        collection: h.id,
        report_id: report.id,
        nonce: claims.nonce_hex(),
        task_round: claims.round,
        key,
        payload: report.payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> TaskClaims {
        TaskClaims {
            collection: Uuid::from_u128(42),
            round: 3,
            factor: vec![1, 4, 7],
            mechanism: MechanismKind::GrrPair,
            epsilon: Epsilon::new(1.5).unwrap(),
            expires_at: -5,
            nonce: [9; 16],
            bins: vec![],
        }
    }

    #[test]
    fn round_trip_and_tamper() {
        let key = TokenKey::new(vec![1; 32]).unwrap();
        let t = key.sign(&claims());
        assert!(t.len() <= MAX_TOKEN_CHARS);
        assert_eq!(key.verify(&t).unwrap(), claims());
        // Flip one character anywhere: never verifies.
        for i in 0..t.len() {
            let mut b = t.clone().into_bytes();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            let s = String::from_utf8(b).unwrap();
            assert!(key.verify(&s).is_err(), "position {i}");
        }
        assert_eq!(key.verify(""), Err(TokenError::Malformed("too short")));
        assert!(matches!(key.verify("!!"), Err(TokenError::Malformed(_))));
    }

    /// A binned task's token carries its maps (version 2) and any change to them breaks the
    /// MAC; an unbinned token keeps version 1's bytes.
    #[test]
    fn bin_maps_round_trip_and_are_bound() {
        let key = TokenKey::new(vec![1; 32]).unwrap();
        let plain = key.sign(&claims());
        assert_eq!(URL_SAFE_NO_PAD.decode(&plain).unwrap()[0], VERSION);
        let mut binned = claims();
        binned.bins = vec![vec![2, 5], vec![], vec![1000, 60000]];
        let t = key.sign(&binned);
        assert!(t.len() <= MAX_TOKEN_CHARS);
        assert_eq!(key.verify(&t).unwrap(), binned);
        let mut raw = URL_SAFE_NO_PAD.decode(&t).unwrap();
        // The last cut's low byte sits just before the MAC.
        let at = raw.len() - MAC_LEN - 1;
        raw[at] ^= 1;
        assert_eq!(
            key.verify(&URL_SAFE_NO_PAD.encode(&raw)),
            Err(TokenError::BadSignature)
        );
        // A version-2 body whose maps are all empty is refused even when signed.
        let mut body = URL_SAFE_NO_PAD.decode(&plain).unwrap();
        body.truncate(body.len() - MAC_LEN);
        body[0] = VERSION_BINS;
        body.extend_from_slice(&[0; 6]);
        assert!(matches!(parse_body(&body), Err(TokenError::Malformed(_))));
        // A count beyond the body is truncated, not a panic.
        body.truncate(body.len() - 6);
        body.extend_from_slice(&[0xff, 0xff]);
        assert!(matches!(parse_body(&body), Err(TokenError::Malformed(_))));
    }

    #[test]
    fn fresh_nonces_sort_by_time_and_differ() {
        let a = TaskClaims::fresh_nonces(1_790_000_000_000, 1000);
        let c = TaskClaims::fresh_nonces(1_790_000_000_001, 1);
        assert_eq!(a.len(), 1000);
        assert!(
            a.windows(2).all(|w| w[0] < w[1]),
            "increasing, no two alike"
        );
        assert!(a.iter().all(|n| n[..6] == a[0][..6]));
        // As the replay set compares them: hex text.
        assert!(hex(&a[999]) < hex(&c[0]));
        let b = TaskClaims::fresh_nonces(1_790_000_000_000, 1000);
        assert!(
            b.iter().all(|n| a.binary_search(n).is_err()),
            "80 random bits"
        );
        assert!(TaskClaims::fresh_nonces(1_790_000_000_000, 0).is_empty());
    }

    #[test]
    fn weak_key_and_debug() {
        assert_eq!(TokenKey::new(vec![0; 31]).unwrap_err(), TokenError::WeakKey);
        let k = TokenKey::new(vec![0x55; 32]).unwrap();
        assert_eq!(format!("{k:?}"), "TokenKey(<redacted>)");
        assert_eq!(hex(&[0, 255, 16]), "00ff10");
    }
}
