//! Untrusted report uploads: bytes → one `Report` or a batch `Vec<Report>`, then
//! `Mechanism::validate` against a few mechanisms. Nothing may panic; an accepted payload
//! must accumulate, and a rejected one must leave the statistics unchanged.
#![no_main]

use std::sync::OnceLock;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind, SufficientStatistics};
use ldpsyn::wire::{Payload, Report};
use libfuzzer_sys::fuzz_target;

fn mechanisms() -> &'static [Mechanism] {
    static M: OnceLock<Vec<Mechanism>> = OnceLock::new();
    M.get_or_init(|| {
        let eps = Epsilon::new(1.0).unwrap();
        [
            (MechanismKind::Grr, &[2usize, 3][..]),
            (MechanismKind::Grr, &[1000]),
            (MechanismKind::Oue, &[3, 4]),
            (MechanismKind::Oue, &[16]),
            (MechanismKind::Oue, &[9]),
            (MechanismKind::GrrPair, &[3, 4]),
        ]
        .iter()
        .map(|(kind, dims)| Mechanism::new(*kind, eps, dims).unwrap())
        .collect()
    })
}

fn check(payload: &Payload) {
    for m in mechanisms() {
        let mut stats = SufficientStatistics::new(m);
        match m.validate(payload) {
            Ok(()) => {
                m.accumulate(payload, &mut stats).unwrap();
                assert_eq!(stats.n, 1);
            }
            Err(_) => {
                assert!(m.accumulate(payload, &mut stats).is_err());
                assert_eq!(stats, SufficientStatistics::new(m));
            }
        }
    }
    // What parses re-serializes to something that parses to the same payload.
    let json = serde_json::to_vec(payload).unwrap();
    assert_eq!(&serde_json::from_slice::<Payload>(&json).unwrap(), payload);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = serde_json::from_slice::<Report>(data) {
        check(&report.payload);
    }
    if let Ok(batch) = serde_json::from_slice::<Vec<Report>>(data) {
        for report in &batch {
            check(&report.payload);
        }
    }
    if let Ok(payload) = serde_json::from_slice::<Payload>(data) {
        check(&payload);
    }
});
