//! Upload bodies (`service::http::parse_upload`) and the payload checks the upload handler
//! runs on each report. Two bodies per input: the raw bytes, and the bytes spliced into the
//! `payload` of an otherwise well-formed one-report upload. For each, nothing panics and:
//!
//! - `parse_upload` accepts 1..=`max` reports, answers 413 (`PayloadTooLarge`) above `max`
//!   and 400 (`MalformedRequest` / `InvalidParameter`) otherwise;
//! - each report's token goes through `TokenKey::verify` (never panics);
//! - against GRR (k = 5, 1000), OUE (k = 12, 16, 9) and pair-GRR (3 × 4): a payload that
//!   validates accumulates (n = 1; counts grow by 1 for GRR / pair, by the set bits for
//!   OUE), one that does not is refused by `accumulate` with the statistics unchanged.
#![no_main]

use std::sync::OnceLock;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind, SufficientStatistics};
use ldpsyn::wire::{Payload, ProblemType};
use ldpsyn_service::error::ApiError;
use ldpsyn_service::http::parse_upload;
use ldpsyn_service::tokens::TokenKey;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 1000;

fn mechanisms() -> &'static [Mechanism] {
    static M: OnceLock<Vec<Mechanism>> = OnceLock::new();
    M.get_or_init(|| {
        let eps = Epsilon::new(1.0).unwrap();
        [
            (MechanismKind::Grr, &[5usize][..]),
            (MechanismKind::Grr, &[10, 100]),
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

fn kind(e: ApiError) -> ProblemType {
    match e {
        ApiError::Problem { kind, .. } => kind,
        other => panic!("parse_upload answered a non-client error: {other:?}"),
    }
}

fn check(data: &[u8]) {
    let reports = match parse_upload(data, MAX) {
        Ok(r) => r,
        Err(e) => {
            let k = kind(e);
            assert!(
                matches!(
                    k,
                    ProblemType::MalformedRequest
                        | ProblemType::InvalidParameter
                        | ProblemType::PayloadTooLarge
                ),
                "{k:?}"
            );
            return;
        }
    };
    assert!((1..=MAX).contains(&reports.len()));
    // The limit is exact.
    assert!(parse_upload(data, reports.len()).is_ok());
    let below = parse_upload(data, reports.len() - 1).expect_err("one above the limit");
    assert_eq!(kind(below), ProblemType::PayloadTooLarge);

    let key = TokenKey::new(vec![42; 32]).unwrap();
    for r in &reports {
        let _ = key.verify(&r.token);
        for m in mechanisms() {
            let mut stats = SufficientStatistics::new(m);
            if m.validate(&r.payload).is_ok() {
                m.accumulate(&r.payload, &mut stats)
                    .expect("validated payload accumulates");
                assert_eq!(stats.n, 1);
                // One count per GRR / pair report, one per set bit for OUE.
                let hits = match &r.payload {
                    Payload::Oue(bits) => bits.0.iter().map(|b| u64::from(b.count_ones())).sum(),
                    _ => 1,
                };
                assert_eq!(stats.counts.iter().sum::<u64>(), hits);
            } else {
                assert!(m.accumulate(&r.payload, &mut stats).is_err());
                assert_eq!(stats, SufficientStatistics::new(m));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Raw bytes almost never make a whole report (a UUID, a token, one payload key): the
    // input is also spliced into a well-formed one-report upload, its first byte choosing
    // the payload's key (or none: the rest is the whole payload).
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let (open, close): (&[u8], &[u8]) = match choice % 4 {
        0 => (b"", b""),
        1 => (br#"{"grr":"#, b"}"),
        2 => (br#"{"grr_pair":"#, b"}"),
        _ => (br#"{"oue":""#, br#""}"#),
    };
    let mut body =
        br#"[{"id":"67e55044-10b1-426f-9247-bb680e5fe0c8","token":"t","payload":"#.to_vec();
    body.extend_from_slice(open);
    body.extend_from_slice(rest);
    body.extend_from_slice(close);
    body.extend_from_slice(b"}]");
    check(&body);
});
