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
}

/// A privacy budget ε: finite and strictly positive (natural-log units, as in
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
    /// Checks and wraps ε. Errors: [`EpsilonError`] when `value` is not finite or not > 0.
    pub fn new(value: f64) -> Result<Self, EpsilonError> {
        if !value.is_finite() {
            Err(EpsilonError::NotFinite(value))
        } else if value <= 0.0 {
            Err(EpsilonError::NotPositive(value))
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
    }
}
