//! Untrusted schema JSON (collection configs come from the server): parsing must never
//! panic, and a schema that parses must encode records without panicking.
#![no_main]

use ldpsyn::schema::Schema;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<Schema>(data) else {
        return;
    };
    let sizes = schema.domain_sizes();
    assert_eq!(sizes.len(), schema.len());
    assert!(sizes.iter().all(|&k| k >= 2), "a valid schema has domains of 2+ values");
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
    // Re-serializing a parsed schema gives a schema that parses to the same value.
    let json = serde_json::to_vec(&schema).unwrap();
    let again: Schema = serde_json::from_slice(&json).unwrap();
    assert_eq!(again, schema);
});
