//! Renders the figures tables of `docs/results.md` from `benchmarks/results/*.json`
//! ([`ldpsyn_examples::report`]); the page's prose is kept as it is.
//!
//! ```text
//! # from the repository root, after a benchmark rewrote a results file:
//! bench-report --made-at drift-file.json=$(git rev-parse --short HEAD)   # the commit it ran at
//! bench-report            # rewrite docs/results.md
//! bench-report --check    # exit 1 if docs/results.md differs from what the JSON gives
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ldpsyn_examples::Error;
use ldpsyn_examples::report::{PAGE, RESULTS, Results, render_page};

/// Renders docs/results.md's tables from the benchmark results (module docs).
#[derive(Debug, Parser)]
struct Args {
    /// Repository root.
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Record in `benchmarks/results/provenance.json` that FILE (a name in
    /// `benchmarks/results/`) was made at COMMIT, before rendering (repeat the flag).
    #[arg(long = "made-at", value_name = "FILE=COMMIT")]
    made_at: Vec<String>,
    /// Write nothing; exit 1 if the page is not what the results give.
    #[arg(long)]
    check: bool,
}

fn main() -> Result<ExitCode, Error> {
    let args = Args::parse();
    let mut results = Results::open(&args.root.join(RESULTS))?;
    for spec in &args.made_at {
        let (file, commit) = spec
            .split_once('=')
            .ok_or_else(|| format!("--made-at {spec}: expected FILE=COMMIT"))?;
        results.set_made_at(file, commit)?;
    }
    let page_path = args.root.join(PAGE);
    let page = std::fs::read_to_string(&page_path)?;
    let rendered = render_page(&page, &results)?;
    if args.check {
        if rendered != page {
            eprintln!(
                "{PAGE} differs from what {RESULTS} gives: run `cargo run -p ldpsyn-examples --bin bench-report`"
            );
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !args.made_at.is_empty() {
        results.save_provenance()?;
    }
    if rendered != page {
        std::fs::write(&page_path, rendered)?;
        println!("wrote {}", page_path.display());
    }
    Ok(ExitCode::SUCCESS)
}
