//! The privacy parameter ε as a checked newtype.

use serde::{Deserialize, Serialize};

/// Why a value cannot be an [`Epsilon`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EpsilonError {
    /// ε must be a finite number: NaN and ±∞ give no privacy guarantee.
    #[error("epsilon must be finite, got {0}")]
    NotFinite(f64),
    /// ε must be strictly positive (ε = 0 would make every report pure noise).
    #[error("epsilon must be > 0, got {0}")]
    NotPositive(f64),
    /// ε above [`MAX_EPSILON`]: the randomizers' probabilities round towards certainty
    /// (GRR at ε ≥ 37 keeps the true value with probability 1 in f64) and the report is
    /// no longer private in any useful sense.
    #[error("epsilon must be ≤ {MAX_EPSILON}, got {0}")]
    TooLarge(f64),
}

/// Largest ε a report may use (and a collection may ask for). At ε = 20 a GRR report over
/// any domain still tells the truth with probability < 1 − 2·10⁻⁹, the OUE threshold is
/// ≈ 3.8·10¹⁰ of 2⁶⁴; beyond it rounding takes over.
pub const MAX_EPSILON: f64 = 20.0;

/// Smallest ε a collection accepts (the aggregator's rule; a report at ε/2 of a SamPrivSyn
/// pair may go below it): below, estimates need more people than any collection has.
pub const MIN_COLLECTION_EPSILON: f64 = 0.01;

/// A privacy budget ε: finite, strictly positive and at most [`MAX_EPSILON`] (natural-log
/// units, as in
/// `Pr[M(x) = y] ≤ e^ε · Pr[M(x') = y]`).
///
/// An invalid value cannot be constructed, so every mechanism built from an `Epsilon`
/// is well defined. Deserialization checks the same rules.
///
/// ```
/// use ldpsyn::Epsilon;
/// let eps = Epsilon::new(4.0).unwrap();
/// assert_eq!(eps.get(), 4.0);
/// assert!(Epsilon::new(0.0).is_err());
/// assert!(Epsilon::new(f64::NAN).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Epsilon(f64);

impl Epsilon {
    /// Checks and wraps ε. Errors: [`EpsilonError`] when `value` is not finite, not > 0
    /// or above [`MAX_EPSILON`].
    pub fn new(value: f64) -> Result<Self, EpsilonError> {
        if !value.is_finite() {
            Err(EpsilonError::NotFinite(value))
        } else if value <= 0.0 {
            Err(EpsilonError::NotPositive(value))
        } else if value > MAX_EPSILON {
            Err(EpsilonError::TooLarge(value))
        } else {
            Ok(Self(value))
        }
    }

    /// The value of ε.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `e^ε`, the largest allowed probability ratio.
    pub fn exp(self) -> f64 {
        self.0.exp()
    }

    /// ε/2: the budget of each half of a SamPrivSyn pair report (Theorem 1 of SamPrivSyn:
    /// two independent ε/2-LDP reports compose to ε-LDP).
    pub fn half(self) -> Self {
        // Half of a finite positive number is finite and positive (subnormals included).
        Self(self.0 / 2.0)
    }
}

impl TryFrom<f64> for Epsilon {
    type Error = EpsilonError;
    fn try_from(value: f64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<Epsilon> for f64 {
    fn from(e: Epsilon) -> f64 {
        e.0
    }
}

impl std::fmt::Display for Epsilon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_invalid_values() {
        assert_eq!(Epsilon::new(-1.0), Err(EpsilonError::NotPositive(-1.0)));
        assert_eq!(Epsilon::new(0.0), Err(EpsilonError::NotPositive(0.0)));
        assert!(matches!(
            Epsilon::new(f64::INFINITY),
            Err(EpsilonError::NotFinite(_))
        ));
        assert!(serde_json::from_str::<Epsilon>("0").is_err());
        assert!(serde_json::from_str::<Epsilon>("-2.5").is_err());
        assert_eq!(serde_json::from_str::<Epsilon>("1.5").unwrap().get(), 1.5);
        assert_eq!(Epsilon::new(3.0).unwrap().half().get(), 1.5);
        assert_eq!(Epsilon::new(20.0).unwrap().get(), 20.0);
        assert_eq!(Epsilon::new(20.5), Err(EpsilonError::TooLarge(20.5)));
        assert_eq!(Epsilon::new(800.0), Err(EpsilonError::TooLarge(800.0)));
        assert!(serde_json::from_str::<Epsilon>("37").is_err());
    }

    /// At the largest ε every mechanism still randomizes: GRR's keep probability and OUE's
    /// flip probability are strictly inside (0, 1), and randomizing does not panic.
    #[test]
    fn mechanisms_at_max_epsilon_still_randomize() {
        use crate::mechanism::{Mechanism, MechanismKind};
        use rand::SeedableRng;
        let e = Epsilon::new(MAX_EPSILON).unwrap();
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(1);
        for (kind, dims) in [
            (MechanismKind::Grr, vec![2usize]),
            (MechanismKind::Grr, vec![1000]),
            (MechanismKind::Oue, vec![1000]),
            (MechanismKind::GrrPair, vec![4, 4]),
        ] {
            let m = Mechanism::new(kind, e, &dims).unwrap();
            let codes: Vec<u32> = dims.iter().map(|_| 1).collect();
            m.randomize(&codes, &mut rng).unwrap();
        }
        let g = crate::mechanism::grr::Grr::new(e, 1000).unwrap();
        assert!(g.p() < 1.0 && g.q() > 0.0);
    }
}
