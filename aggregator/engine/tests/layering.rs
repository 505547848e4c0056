//! The engine is a layered pipeline: a module imports only from its own layer or the layers
//! below it, and no two files import each other, however indirectly. Read from the source
//! (`use crate::…` and `crate::…` paths outside comments and test modules), so a new upward
//! import fails here rather than in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. A top-level module of `src/` that is not listed fails the test: place it.
const LAYERS: &[&str] = &[
    "numeric",
    "graph",
    "domain",
    "measure",
    "select",
    "fit",
    "synth",
    "state",
    "protocols",
    "pipeline",
    "engine",
    "central",
    "tuning",
];

/// Every `.rs` file under `dir`, as (module path, file).
fn modules(src: &Path, dir: &Path, out: &mut Vec<(Vec<String>, PathBuf)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            modules(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts != ["lib"] {
                out.push((parts, path));
            }
        }
    }
}

/// The code of a file without its comments and its test module.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        let line = line.split("//").next().unwrap_or("");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The crate paths a file's code names: `crate::a::b::C` and each leaf of a use tree
/// `use crate::{a::B, c::{D, E}}`, as segment lists.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let used = use_tree(rest, &[], &mut out);
        rest = &rest[used..];
    }
    out
}

/// Parses the use tree at the start of `text` under `prefix`, pushing its leaves; returns the
/// bytes read.
fn use_tree(text: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    let mut pos = 0;
    loop {
        let rest = &text[pos..];
        let word = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if word > 0 {
            path.push(rest[..word].to_string());
            pos += word;
        }
        let rest = &text[pos..];
        let group = if rest.starts_with("::{") {
            Some(3)
        } else if word == 0 && rest.starts_with('{') {
            Some(1)
        } else {
            None
        };
        if let Some(open) = group {
            pos += open;
            loop {
                let skip = text[pos..].len() - text[pos..].trim_start().len();
                pos += skip;
                if text[pos..].starts_with('}') {
                    return pos + 1;
                }
                pos += use_tree(&text[pos..], &path, out);
                let skip = text[pos..].len() - text[pos..].trim_start().len();
                pos += skip;
                if text[pos..].starts_with(',') {
                    pos += 1;
                }
            }
        } else if rest.starts_with("::") {
            pos += 2;
        } else {
            if path.len() > prefix.len() {
                out.push(path);
            }
            return pos;
        }
    }
}

#[test]
fn imports_only_go_down_and_files_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    modules(&src, &src, &mut files);
    let known: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let layer = |m: &[String]| LAYERS.iter().position(|l| *l == m[0]);
    let mut problems = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, path) in &files {
        let Some(own) = layer(module) else {
            problems.push(format!("{}: not in LAYERS", module.join("::")));
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        for p in crate_paths(&code(&text)) {
            // The longest module the path names; `crate::EngineError` (the crate's one
            // error type, in lib.rs) names none and is allowed everywhere, other root items
            // (re-exports) are not.
            let Some(target) = (1..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|m| known.contains(m))
            else {
                if p != ["EngineError"] {
                    // A root re-export would hide the layer it comes from.
                    problems.push(format!(
                        "{} names crate::{}: use the defining module's path",
                        module.join("::"),
                        p.join("::")
                    ));
                }
                continue;
            };
            if &target == module {
                continue;
            }
            if layer(&target).is_some_and(|t| t > own) {
                problems.push(format!(
                    "{} (layer {}) imports {} (layer {})",
                    module.join("::"),
                    LAYERS[own],
                    p.join("::"),
                    target[0]
                ));
            }
            edges.entry(module.clone()).or_default().insert(target);
        }
    }
    // Depth-first search for a cycle among files.
    fn visit(
        m: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        problems: &mut Vec<String>,
    ) {
        match state.get(m) {
            Some(2) => return,
            Some(1) => {
                let start = stack.iter().position(|s| s == m).unwrap();
                let cycle: Vec<String> = stack[start..].iter().map(|s| s.join("::")).collect();
                problems.push(format!("cycle: {} -> {}", cycle.join(" -> "), m.join("::")));
                return;
            }
            _ => {}
        }
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for t in edges.get(m).into_iter().flatten() {
            visit(t, edges, state, stack, problems);
        }
        stack.pop();
        state.insert(m.clone(), 2);
    }
    let mut state = BTreeMap::new();
    for m in &known {
        visit(m, &edges, &mut state, &mut Vec::new(), &mut problems);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The reader sees grouped, nested and inline paths, and skips comments and test modules.
#[test]
fn the_reader_sees_every_path() {
    let paths = crate_paths(&code(
        "use crate::{fit::pgm::FitOptions, synth::{model::Model, sampler}};\n\
         // use crate::engine::Engine;\n\
         fn f() { crate::select::gain::best_pair_gain(); }\n\
         #[cfg(test)]\nuse crate::tuning::KNOBS;\n",
    ));
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        [
            "fit::pgm::FitOptions",
            "synth::model::Model",
            "synth::sampler",
            "select::gain::best_pair_gain"
        ]
    );
}
