//! Wire-protocol serialization: JSON round trips of reports, payloads, tasks, answers and
//! problems (proptest), the OUE base64url encoding (no padding, URL-safe alphabet,
//! canonical), and rejection of malformed or over-complete input.

use ldpsyn::Epsilon;
use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::{
    OueBits, Payload, Problem, ProblemType, Report, ReportAnswer, ReportStatus, Task,
};
use proptest::prelude::*;
use uuid::Uuid;

fn payload_strategy() -> impl Strategy<Value = Payload> {
    prop_oneof![
        any::<u64>().prop_map(Payload::Grr),
        any::<[u64; 2]>().prop_map(Payload::GrrPair),
        prop::collection::vec(any::<u8>(), 0..600).prop_map(|b| Payload::Oue(OueBits(b))),
    ]
}

fn uuid_strategy() -> impl Strategy<Value = Uuid> {
    any::<[u8; 16]>().prop_map(|b| uuid::Builder::from_random_bytes(b).into_uuid())
}

fn report_strategy() -> impl Strategy<Value = Report> {
    (uuid_strategy(), ".{0,80}", payload_strategy()).prop_map(|(id, token, payload)| Report {
        id,
        token,
        payload,
    })
}

/// The URL-safe base64 alphabet without padding.
fn is_base64url_no_pad(s: &str) -> bool {
    s.bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

proptest! {
    #[test]
    fn report_json_round_trips(report in report_strategy()) {
        let json = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&back, &report);
        // The id goes on the wire as its hyphenated string.
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(value["id"].as_str().unwrap(), report.id.to_string());
    }

    #[test]
    fn report_batches_round_trip(batch in prop::collection::vec(report_strategy(), 0..8)) {
        let json = serde_json::to_vec(&batch).unwrap();
        let back: Vec<Report> = serde_json::from_slice(&json).unwrap();
        prop_assert_eq!(back, batch);
    }

    #[test]
    fn oue_bits_are_base64url_without_padding(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let json = serde_json::to_value(Payload::Oue(OueBits(bytes.clone()))).unwrap();
        let s = json["oue"].as_str().unwrap();
        prop_assert!(is_base64url_no_pad(s), "{}", s);
        // ⌈4n/3⌉ characters: no padding.
        prop_assert_eq!(s.len(), (4 * bytes.len()).div_ceil(3));
        let back: Payload = serde_json::from_value(json).unwrap();
        prop_assert_eq!(back, Payload::Oue(OueBits(bytes)));
    }

    #[test]
    fn arbitrary_json_strings_never_panic_the_oue_decoder(s in "[A-Za-z0-9_=+/-]{0,40}") {
        let json = serde_json::json!({ "oue": s });
        if let Ok(Payload::Oue(bits)) = serde_json::from_value::<Payload>(json) {
            // Whatever decodes re-encodes to the same (canonical) string.
            let again = serde_json::to_value(Payload::Oue(bits)).unwrap();
            prop_assert_eq!(again["oue"].as_str().unwrap(), s.as_str());
        }
    }

    #[test]
    fn task_json_round_trips(
        collection_id in uuid_strategy(),
        round in any::<u32>(),
        factor in prop::collection::vec(0usize..64, 1..4),
        kind in prop_oneof![Just(MechanismKind::Grr), Just(MechanismKind::Oue), Just(MechanismKind::GrrPair)],
        // Decimal ε as people write them (serde_json parses ≤ 15 significant digits
        // exactly; see `any_epsilon_round_trips_within_one_ulp`).
        epsilon in (1u32..20_000).prop_map(|m| f64::from(m) / 1000.0),
        token in "[A-Za-z0-9._-]{1,120}",
        expires_at in any::<i64>(),
    ) {
        let task = Task {
            collection_id,
            round,
            factor,
            mechanism: kind,
            bins: vec![],
            epsilon: Epsilon::new(epsilon).unwrap(),
            token,
            expires_at,
        };
        let back: Task = serde_json::from_str(&serde_json::to_string(&task).unwrap()).unwrap();
        prop_assert_eq!(back, task);
    }
}

proptest! {
    /// serde_json without its `float_roundtrip` feature may parse a 17-digit float 1 ulp off
    /// (e.g. 19.824778448721442 → 19.82477844872144), so an arbitrary ε survives JSON only to
    /// within 1 ulp. Exact equality holds for the decimal ε of real configs (above).
    #[test]
    fn any_epsilon_round_trips_within_one_ulp(epsilon in 1e-6f64..=ldpsyn::MAX_EPSILON) {
        let e = Epsilon::new(epsilon).unwrap();
        let back: Epsilon = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        let ulps = (back.get().to_bits() as i64 - e.get().to_bits() as i64).abs();
        prop_assert!(ulps <= 1, "{} → {}", e, back);
    }
}

#[test]
fn payloads_match_the_design_examples() {
    let cases = [
        (Payload::Grr(17), r#"{"grr":17}"#),
        (Payload::GrrPair([3, 5]), r#"{"grr_pair":[3,5]}"#),
        (
            Payload::Oue(OueBits(vec![0b0000_0101, 0b1])),
            r#"{"oue":"BQE"}"#,
        ),
        // 0xFB 0xFF: the URL-safe alphabet's `-` and `_`, never `+` or `/`.
        (Payload::Oue(OueBits(vec![0xFB, 0xFF])), r#"{"oue":"-_8"}"#),
        (Payload::Oue(OueBits(vec![])), r#"{"oue":""}"#),
    ];
    for (payload, json) in cases {
        assert_eq!(serde_json::to_string(&payload).unwrap(), json);
        assert_eq!(serde_json::from_str::<Payload>(json).unwrap(), payload);
    }
}

#[test]
fn malformed_oue_base64_is_rejected() {
    for bad in [
        "BQE=",     // padding
        "BQ==",     // padding
        "+/8",      // standard alphabet
        "BQF",      // non-canonical: trailing bits set
        "B",        // impossible length
        "BQE BQ",   // whitespace
        "BQ\u{e9}", // non-ASCII
    ] {
        let json = serde_json::json!({ "oue": bad });
        assert!(
            serde_json::from_value::<Payload>(json).is_err(),
            "`{bad}` must be rejected"
        );
    }
    // Not a string at all.
    for bad in [r#"{"oue":5}"#, r#"{"oue":[1,2]}"#, r#"{"oue":null}"#] {
        assert!(serde_json::from_str::<Payload>(bad).is_err(), "{bad}");
    }
}

#[test]
fn malformed_payloads_are_rejected() {
    for bad in [
        r#"{}"#,
        r#"{"grr":1,"oue":"AA"}"#,
        r#"{"grr":-1}"#,
        r#"{"grr":1.5}"#,
        r#"{"grr":18446744073709551616}"#,
        r#"{"grr_pair":[1]}"#,
        r#"{"grr_pair":[1,2,3]}"#,
        r#"{"grr_pair":{"a":1}}"#,
        r#"{"sue":"AA"}"#,
        r#"{"GRR":1}"#,
        r#""grr""#,
        r#"[1]"#,
    ] {
        assert!(serde_json::from_str::<Payload>(bad).is_err(), "{bad}");
    }
}

#[test]
fn reports_with_extra_or_missing_keys_are_rejected() {
    let id = "0b5a3c47-3cfd-4b5e-9a3a-7e2f3c1d2e10";
    let good = format!(r#"{{"id":"{id}","token":"t","payload":{{"grr":1}}}}"#);
    assert!(serde_json::from_str::<Report>(&good).is_ok());
    for bad in [
        format!(r#"{{"id":"{id}","token":"t","payload":{{"grr":1}},"epsilon":8}}"#),
        format!(r#"{{"id":"{id}","token":"t","payload":{{"grr":1}},"mechanism":"grr"}}"#),
        format!(r#"{{"id":"{id}","token":"t"}}"#),
        format!(r#"{{"id":"{id}","payload":{{"grr":1}}}}"#),
        r#"{"id":"not-a-uuid","token":"t","payload":{"grr":1}}"#.to_owned(),
        format!(r#"{{"id":"{id}","token":7,"payload":{{"grr":1}}}}"#),
        format!(r#"{{"id":"{id}","token":"t","payload":{{"grr":1,"grr_pair":[0,0]}}}}"#),
    ] {
        assert!(serde_json::from_str::<Report>(&bad).is_err(), "{bad}");
    }
}

#[test]
fn answers_and_problems_round_trip() {
    let id = Uuid::new_v4();
    let accepted = ReportAnswer {
        id,
        status: ReportStatus::Accepted,
        problem: None,
    };
    let json = serde_json::to_value(&accepted).unwrap();
    assert_eq!(json, serde_json::json!({"id": id, "status": "accepted"}));
    assert_eq!(
        serde_json::from_value::<ReportAnswer>(json).unwrap(),
        accepted
    );
    let rejected = ReportAnswer {
        id,
        status: ReportStatus::Rejected,
        problem: Some(Problem::new(
            ProblemType::InvalidPayload,
            "bit 13 set, k = 12",
        )),
    };
    let back: ReportAnswer =
        serde_json::from_str(&serde_json::to_string(&rejected).unwrap()).unwrap();
    assert_eq!(back, rejected);
    for t in ProblemType::ALL {
        let p = Problem::new(*t, "detail");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["type"], format!("urn:ldpsyn:problem:{}", t.slug()));
        assert_eq!(json["status"], t.status());
        assert_eq!(serde_json::from_value::<Problem>(json).unwrap(), p);
        assert_eq!(ProblemType::parse(t.slug()), Some(*t));
        assert_eq!(ProblemType::parse(&t.uri()), Some(*t));
    }
    assert!(serde_json::from_str::<ProblemType>(r#""urn:ldpsyn:problem:nope""#).is_err());
}
