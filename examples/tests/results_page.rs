//! `docs/results.md` cannot drift from `benchmarks/results/*.json`: its tables are rendered
//! again from the JSON and compared with the committed page.

use std::path::{Path, PathBuf};

use ldpsyn_examples::report::{COMMAND, PAGE, PROVENANCE, RESULTS, Results, TABLES, render_page};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn results_page_matches_the_json() {
    let results = Results::open(&root().join(RESULTS)).unwrap();
    let page = std::fs::read_to_string(root().join(PAGE)).unwrap();
    let rendered = render_page(&page, &results).unwrap();
    if rendered != page {
        let (line, (want, got)) = rendered
            .lines()
            .zip(page.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map_or((0, ("(length differs)", "")), |(i, p)| (i + 1, p));
        panic!(
            "{PAGE} differs from what {RESULTS} gives (first at line {line}:\n  page:     {got}\n  rendered: {want})\nregenerate with `{COMMAND}`"
        );
    }
}

#[test]
fn every_table_is_on_the_page_once() {
    let page = std::fs::read_to_string(root().join(PAGE)).unwrap();
    for name in TABLES {
        let marker = format!("{}{name} -->", ldpsyn_examples::report::BEGIN);
        assert_eq!(page.matches(&marker).count(), 1, "{marker}");
    }
}

#[test]
fn every_results_json_has_its_commit_recorded() {
    let results = Results::open(&root().join(RESULTS)).unwrap();
    for entry in std::fs::read_dir(root().join(RESULTS)).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".json") && name != PROVENANCE {
            assert!(
                results.provenance().contains_key(&name),
                "{name} has no entry in {RESULTS}/{PROVENANCE}: `{COMMAND} -- --made-at {name}=COMMIT`"
            );
        }
    }
    for name in results.provenance().keys() {
        assert!(
            root().join(RESULTS).join(name).is_file(),
            "{PROVENANCE} names {name}, which is gone"
        );
    }
}
