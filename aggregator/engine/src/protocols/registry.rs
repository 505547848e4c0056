//! The protocol registry: the one place that maps a collection config's protocol to its
//! rules.

use std::sync::Arc;

use ldpsyn::wire::Protocol;

use crate::EngineError;
use crate::protocols::auto::Auto;
use crate::protocols::independence::Independence;
use crate::protocols::privincr::PrivIncr;
use crate::protocols::samprivsyn::SamPrivSyn;
use crate::protocols::vertical::Vertical;
use crate::protocols::{CollectionProtocol, check_privincr};

/// The protocol registry: the rules of `protocol` (parameters checked), or for a vertical
/// collection its parties as resolved against the schema (`vertical`). Adding a protocol is
/// its own module behind [`CollectionProtocol`] and one arm here (and, if it keeps
/// decisions between rounds, a [`ProtocolState`](crate::state::ProtocolState) variant to store them). Errors:
/// [`EngineError::InvalidConfig`] for invalid parameters, or a vertical protocol without its
/// resolved parties.
pub(crate) fn registry(
    protocol: &Protocol,
    vertical: Option<&Arc<Vertical>>,
) -> Result<Arc<dyn CollectionProtocol>, EngineError> {
    let rules: Arc<dyn CollectionProtocol> = match protocol {
        Protocol::Privincr(p) => {
            check_privincr(p)?;
            Arc::new(PrivIncr::new(p.clone(), true))
        }
        Protocol::Noincremental(p) => {
            check_privincr(p)?;
            Arc::new(PrivIncr::new(p.clone(), false))
        }
        Protocol::Auto(p) => {
            check_privincr(p)?;
            Arc::new(Auto::new(p.clone()))
        }
        Protocol::Samprivsyn(s) => {
            if s.batch_size == 0 {
                return Err(EngineError::InvalidConfig("batch_size must be ≥ 1".into()));
            }
            Arc::new(SamPrivSyn::new(s.clone()))
        }
        Protocol::Independence {} => Arc::new(Independence),
        Protocol::Vertical(_) => match vertical {
            Some(v) => v.clone(),
            None => {
                return Err(EngineError::InvalidConfig(
                    "a vertical collection is built from its config (Engine::new)".into(),
                ));
            }
        },
    };
    Ok(rules)
}
