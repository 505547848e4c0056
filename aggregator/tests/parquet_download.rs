//! The Parquet synthetic download (issue 36, item 8): `GET …/synthetic?format=parquet` and
//! `collections download --format parquet` give one Parquet file whose columns take their
//! types from the schema (integer numeric Int64, real numeric Float64, categorical
//! dictionary-encoded strings, "missing" null), read back with the `parquet` crate's reader,
//! holding the rows and values of the CSV download of the same seed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::Schema;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};
use uuid::Uuid;

const ADMIN: &str = "parquet-admin-token-36b";
const PEOPLE: u32 = 400;
const ROWS: usize = 1500;

fn schema() -> Value {
    json!({"attributes": [
        {"name": "age", "type": "numeric", "min": 17, "max": 90, "bins": 8, "integer": true},
        {"name": "hours", "type": "numeric", "min": 0, "max": 10, "bins": 4},
        {"name": "work", "type": "categorical", "labels": ["private", "public", "self"],
         "missing": "category"}
    ]})
}

/// A finalized collection of [`schema`] with [`PEOPLE`] reports; its id.
async fn finalized_collection(base: &str) -> Uuid {
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema(), "protocol": "independence", "epsilon": 4.0,
            "target_users": PEOPLE}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let schema: Schema = serde_json::from_value(created["schema"].clone()).unwrap();
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), 1);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    let mut people: Vec<_> = (0..PEOPLE)
        .map(|i| SimulatedPerson {
            // Every code of `work`, "missing" (code 3) included.
            record: schema.encoded(vec![i % 8, i % 4, i % 4]).unwrap(),
            ledger: MemoryLedger::default(),
        })
        .collect();
    for r in client.submit_batch(&mut people).await.unwrap() {
        r.unwrap();
    }
    // Finalized at its target; the model is fit off the ingest path.
    let start = Instant::now();
    loop {
        let r = http
            .get(format!("{base}/v1/collections/{id}/model"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            return id;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no model");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A synthetic download: content type and body.
async fn download(base: &str, id: Uuid, query: &str) -> (String, bytes::Bytes) {
    let r = reqwest::Client::new()
        .get(format!("{base}/v1/collections/{id}/synthetic?{query}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{query}");
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    (ct, r.bytes().await.unwrap())
}

/// The record batches of a Parquet file.
fn read_parquet(file: bytes::Bytes) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Row `i` of column `c` of `batches` as the CSV writes it ("" for null).
fn cell(batches: &[RecordBatch], c: usize, mut i: usize) -> String {
    for b in batches {
        if i >= b.num_rows() {
            i -= b.num_rows();
            continue;
        }
        let col = b.column(c);
        if col.is_null(i) {
            return String::new();
        }
        return match col.data_type() {
            DataType::Int64 => col.as_primitive::<Int64Type>().value(i).to_string(),
            DataType::Float64 => col.as_primitive::<Float64Type>().value(i).to_string(),
            DataType::Dictionary(..) => {
                let d = col.as_dictionary::<Int32Type>();
                let key = d.keys().value(i) as usize;
                d.values().as_string::<i32>().value(key).to_owned()
            }
            other => panic!("unexpected column type {other}"),
        };
    }
    panic!("row out of range");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_download_has_typed_columns_and_the_csv_rows() {
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let id = finalized_collection(&base).await;
    let query = format!("rows={ROWS}&seed=7");
    let (ct, csv) = download(&base, id, &query).await;
    assert!(ct.starts_with("text/csv"), "{ct}");
    let (ct, file) = download(&base, id, &format!("{query}&format=parquet")).await;
    assert_eq!(ct, "application/vnd.apache.parquet");
    assert!(file.starts_with(b"PAR1") && file.ends_with(b"PAR1"));
    let (_, again) = download(&base, id, &format!("{query}&format=parquet")).await;
    assert_eq!(file, again, "same seed, same bytes");

    let batches = read_parquet(file.clone());
    let fields = batches[0].schema().fields().clone();
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["age", "hours", "work"]);
    assert_eq!(fields[0].data_type(), &DataType::Int64);
    assert_eq!(fields[1].data_type(), &DataType::Float64);
    assert_eq!(
        fields[2].data_type(),
        &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
    );
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, ROWS);

    // Every value agrees with the CSV of the same seed (a missing `work` is null there and
    // an empty cell here).
    let mut reader = csv::Reader::from_reader(csv.as_ref());
    assert_eq!(reader.headers().unwrap().iter().collect::<Vec<_>>(), names);
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), ROWS);
    let mut nulls = 0;
    for (i, rec) in records.iter().enumerate() {
        for c in 0..3 {
            assert_eq!(cell(&batches, c, i), rec[c], "row {i} column {}", names[c]);
        }
        nulls += usize::from(rec[2].is_empty());
    }
    assert!(nulls > 0, "no missing `work` in {ROWS} rows");

    // The CLI writes the same file.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("synthetic.parquet");
    let run = Command::new(common::BIN)
        .args(["collections", "download", &id.to_string(), "--out"])
        .arg(&out)
        .args([
            "--rows",
            &ROWS.to_string(),
            "--seed",
            "7",
            "--format",
            "parquet",
        ])
        .args(["--quiet"])
        .env("LDPSYN_SERVER", &base)
        .env("LDPSYN_ADMIN_TOKEN", ADMIN)
        .env("LDPSYN_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(said.contains(&format!("{ROWS} rows written")), "{said}");
    assert_eq!(std::fs::read(&out).unwrap(), file.as_ref());

    // An unknown format: 400 invalid-parameter, as before.
    let r = reqwest::Client::new()
        .get(format!(
            "{base}/v1/collections/{id}/synthetic?rows=5&format=xlsx"
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}
