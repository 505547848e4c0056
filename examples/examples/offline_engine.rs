//! Run the estimation engine offline on a CSV: no server, no database, no HTTP.
//!
//! Every row of `examples/adult/adult.csv` (UCI Adult, committed with the repository) is one
//! person. For each, the engine (`ldpsyn-engine`) draws a task (a factor of attributes) from
//! the collection's state alone, the person's codes of that factor are randomized with the
//! task's mechanism as a device would (ε = 4), and the report is added to the sufficient
//! statistics of its table. Rounds close at their quota, as the service closes them; then
//! `finalize` fits the graphical model, which gives marginals with standard errors and
//! synthetic rows.
//!
//! ```sh
//! cargo run -p ldpsyn-examples --example offline_engine            # examples/adult/adult.csv
//! cargo run -p ldpsyn-examples --example offline_engine -- my.csv  # the same five columns
//! ```

use anyhow::Context;
use ldpsyn::Epsilon;
use ldpsyn::mechanism::SufficientStatistics;
use ldpsyn::schema::{AttributeKind, NumericDecoding, Schema};
use ldpsyn::wire::{PrivIncrParams, Protocol};
use ldpsyn_engine::{Engine, EngineOptions, Tables, Transition};
use rand::SeedableRng;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/adult/adult.csv").to_owned());
    // The schema is public: labels and bounds from the code book, not from the data.
    let schema: Schema = serde_json::from_value(serde_json::json!({"attributes": [
        {"name": "age", "type": "numeric", "min": 17, "max": 90, "bins": 8, "integer": true},
        {"name": "education-num", "type": "numeric", "min": 1, "max": 16, "bins": 4,
         "integer": true},
        {"name": "sex", "type": "categorical", "labels": ["Female", "Male"]},
        {"name": "hours-per-week", "type": "numeric", "min": 1, "max": 99, "bins": 5,
         "integer": true},
        {"name": "income", "type": "categorical", "labels": ["<=50K", ">50K"]}
    ]}))?;

    // Rows → schema codes (one per attribute); a row the schema refuses is left out.
    let mut reader = csv::Reader::from_path(&path).with_context(|| path.clone())?;
    let header: Vec<String> = reader.headers()?.iter().map(str::to_owned).collect();
    let encoder = schema.csv_encoder(&header)?;
    let (mut people, mut refused) = (Vec::<Vec<u32>>::new(), 0);
    for row in reader.records() {
        match encoder.encode(&row?.iter().collect::<Vec<_>>()) {
            Ok(record) => people.push(record.codes().to_vec()),
            Err(_) => refused += 1,
        }
    }
    println!(
        "{} people from {path} ({refused} rows refused)",
        people.len()
    );

    let engine = Engine::from_parts(
        schema.domain_sizes(),
        Epsilon::new(4.0)?,
        people.len() as u64,
        Protocol::Auto(PrivIncrParams::default()),
        EngineOptions::default(),
    )?;
    let mut state = engine.initial_state();
    let mut tables = Tables::new();
    // Tasks come from the state and this RNG only; noise from the devices' own (here one
    // seeded RNG: a simulation, not a deployment).
    let mut task_rng = rand_chacha::ChaCha12Rng::seed_from_u64(1);
    let mut noise_rng = rand_chacha::ChaCha12Rng::seed_from_u64(2);
    let mut in_round = 0;
    // `Engine::draw_task` for many draws of one state: rebuilt when a round closes.
    let mut sampler = engine.sampler(&state)?;
    for person in &people {
        let task = sampler.draw(&mut task_rng);
        let key = engine.table_key(&task);
        let mechanism = engine.mechanism(&key)?;
        let codes: Vec<u32> = task.codes(person).collect();
        let report = mechanism.randomize(&codes, &mut noise_rng)?;
        let stats = tables
            .entry(key)
            .or_insert_with(|| SufficientStatistics::new(&mechanism));
        mechanism.accumulate(&report, stats)?;
        in_round += u64::from(task.round == state.round);
        if engine.should_close(&state, in_round) {
            match engine.close_round(&mut state, &tables)? {
                Transition::RoundClosed { round, pruned } => {
                    println!("round {round} closed: {} pairs pruned", pruned.len());
                }
                Transition::EnteredCliqueMeasurement { pruned, factors } => println!(
                    "last round closed: {} pairs pruned, {factors} factors to measure",
                    pruned.len()
                ),
                other => println!("{other:?}"),
            }
            in_round = 0;
            sampler = engine.sampler(&state)?;
        }
    }
    let model = engine.finalize(&state, &tables)?;

    let name = |a: usize| schema.attributes()[a].name.as_str();
    let edges: Vec<String> = model
        .graph_edges()
        .iter()
        .map(|&(a, b)| format!("{}–{}", name(a), name(b)))
        .collect();
    println!("learned dependencies: {}", edges.join(", "));

    let (sex, income) = (2, 4);
    let m = model.marginal(&[sex, income])?;
    println!("P(sex, income): estimate ± 1.96 standard errors (the file's share)");
    for (cell, f) in m.frequencies.iter().enumerate() {
        let (s, i) = ((cell / 2) as u32, (cell % 2) as u32);
        let true_share = people
            .iter()
            .filter(|p| p[sex] == s && p[income] == i)
            .count() as f64
            / people.len() as f64;
        let se = m.std_errors.as_ref().map_or(f64::NAN, |e| e[cell]);
        println!(
            "  {:<6} {:<5} {f:.3} ± {:.3}  ({true_share:.3})",
            label(&schema, sex, s),
            label(&schema, income, i),
            1.96 * se,
        );
    }

    println!("synthetic rows ({}):", header_of(&schema));
    let mut decode_rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
    for codes in model.synthesize(5, 42) {
        let values = schema.decode(&codes, NumericDecoding::Uniform, &mut decode_rng);
        let row: Vec<String> = values.iter().map(ToString::to_string).collect();
        println!("  {}", row.join(","));
    }
    Ok(())
}

/// The label of code `code` of categorical attribute `a` (empty for a numeric one).
fn label(schema: &Schema, a: usize, code: u32) -> &str {
    match &schema.attributes()[a].kind {
        AttributeKind::Categorical { labels } => &labels[code as usize],
        _ => "",
    }
}

/// The schema's attribute names, comma-separated.
fn header_of(schema: &Schema) -> String {
    let names: Vec<&str> = schema
        .attributes()
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    names.join(",")
}
