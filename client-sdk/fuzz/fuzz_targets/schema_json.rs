//! Untrusted schema JSON (collection configs come from the server): parsing must never
//! panic, and a schema that parses must encode records and decode every code (both ways,
//! what `/synthetic` and `/marginals` do) without panicking or hanging.
#![no_main]

use ldpsyn::schema::{DecodedValue, NumericDecoding, Schema};
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<Schema>(data) else {
        return;
    };
    let sizes = schema.domain_sizes();
    assert_eq!(sizes.len(), schema.len());
    assert!(
        sizes.iter().all(|&k| k >= 2),
        "a valid schema has domains of 2+ values"
    );
    // A few records: empty, every attribute null, a number, a string, the first label.
    let mut records = vec![serde_json::json!({})];
    for value in [
        serde_json::Value::Null,
        serde_json::json!(0),
        serde_json::json!(1e300),
        serde_json::json!(-0.5),
        serde_json::json!("?"),
        serde_json::json!(""),
    ] {
        let record: serde_json::Map<String, serde_json::Value> = schema
            .attributes()
            .iter()
            .map(|a| (a.name.clone(), value.clone()))
            .collect();
        records.push(serde_json::Value::Object(record));
    }
    for record in &records {
        if let Ok(encoded) = schema.encode_json(record) {
            for (&code, &k) in encoded.codes().iter().zip(&sizes) {
                assert!((code as usize) < k, "code {code} outside a domain of {k}");
            }
        }
    }
    // Every code of every attribute decodes (the first 4096 of a large domain), to a finite
    // number for a numeric attribute.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    for (a, &k) in schema.attributes().iter().zip(&sizes) {
        for code in 0..k.min(4096) as u32 {
            for how in [NumericDecoding::Midpoint, NumericDecoding::Uniform] {
                if let DecodedValue::Number(x) = a.decode(code, how, &mut rng) {
                    assert!(x.is_finite(), "`{}` code {code} decodes to {x}", a.name);
                }
            }
        }
    }
    // Re-serializing a parsed schema gives a schema that parses to the same value.
    let json = serde_json::to_vec(&schema).unwrap();
    let again: Schema = serde_json::from_slice(&json).unwrap();
    assert_eq!(again, schema);
});
