//! The architecture as a test: the layers listed in docs/design.md
//! ("Layers") against the imports in `src/`. Every module of the crate is in
//! exactly one layer; a module imports only from layers below its own (so
//! the import graph has no circle); the ground floor imports nothing from
//! the crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The layers of docs/design.md, bottom first: the lines `N. `a` `b` — ...`
/// between the markers `<!-- layers -->` and `<!-- /layers -->`.
fn documented_layers() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/design.md")).unwrap();
    let start = doc
        .find("<!-- layers -->")
        .expect("docs/design.md marks its layers");
    let end = doc
        .find("<!-- /layers -->")
        .expect("docs/design.md ends its layers");
    doc[start..end]
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let names = l.split(" — ").next().unwrap();
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None`: the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(name) => Some(name.to_string()),
        None => Some(first),
    }
}

/// Code without comments (so that prose naming a module is not an import).
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The crate's top-level modules that `code` names: `crate::x::...` paths
/// and every first segment of `use crate::{x, y::z, ...}`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let after = &code[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // First segments at brace depth zero of the group.
            let mut depth = 0;
            let mut at_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if c.is_whitespace() => {}
                    _ if at_start && depth == 0 => {
                        found.insert(ident(&group[j..]));
                        at_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(after));
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

#[test]
fn every_module_imports_only_from_the_layers_below_it() {
    let layers = documented_layers();
    assert!(layers.len() >= 3, "docs/design.md lists the layers: {layers:?}");
    let mut layer_of = BTreeMap::new();
    for (i, layer) in layers.iter().enumerate() {
        for m in layer {
            assert!(
                layer_of.insert(m.clone(), i).is_none(),
                "{m} is listed in two layers"
            );
        }
    }
    let src = Path::new(ROOT).join("src");
    let graph = import_graph(&src);
    let mut wrong = Vec::new();
    for (module, uses) in &graph {
        let Some(&mine) = layer_of.get(module) else {
            wrong.push(format!("src/{module} is in no layer of docs/design.md"));
            continue;
        };
        for used in uses {
            let name = used.split(' ').next().unwrap();
            match layer_of.get(name) {
                None => wrong.push(format!("{module} uses {used}, which is in no layer")),
                Some(_) if mine == 0 => {
                    wrong.push(format!("{module} is on the ground floor but uses {used}"))
                }
                Some(&theirs) if theirs >= mine => wrong.push(format!(
                    "{module} (layer {}) uses {used} (layer {})",
                    mine + 1,
                    theirs + 1
                )),
                Some(_) => {}
            }
        }
    }
    for module in layer_of.keys() {
        if !graph.contains_key(module) && !src.join(format!("{module}.rs")).exists() {
            wrong.push(format!("docs/design.md lists {module}, which is not in src/"));
        }
    }
    assert!(wrong.is_empty(), "the layers are broken:\n{}", wrong.join("\n"));
}

/// Each top-level module of `src/` and what it imports: `"name (file)"`.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let code = without_comments(&std::fs::read_to_string(file).unwrap());
        graph.entry(module.clone()).or_default().extend(
            imports(&code)
                .into_iter()
                .filter(|m| *m != module)
                .map(|m| format!("{m} ({})", file.strip_prefix(ROOT).unwrap().display())),
        );
    }
    graph
}

/// The gateway is a program of its own over the shared server layer: it
/// never leans on the service's HTTP edge (its extractors, its error
/// mapping, its handlers), which the layers alone would allow.
#[test]
fn the_gateway_imports_nothing_from_the_services_http_edge() {
    let graph = import_graph(&Path::new(ROOT).join("src"));
    let leaning: Vec<&String> = graph["gateway"]
        .iter()
        .filter(|used| used.split(' ').next() == Some("http"))
        .collect();
    assert!(
        leaning.is_empty(),
        "the gateway imports the service's edge: {leaning:?}"
    );
}

/// The service's edges (its HTTP handlers and the command line) reach the
/// database only through the domain, so that every rule the domain keeps
/// (the registration decision, the revocation of sessions, the import
/// budget) is on the path of every caller; the layers alone would let an
/// edge call the store directly.
#[test]
fn the_edges_reach_the_database_only_through_the_domain() {
    let graph = import_graph(&Path::new(ROOT).join("src"));
    let direct: Vec<&String> = ["http", "cli"]
        .iter()
        .flat_map(|edge| graph[*edge].iter())
        .filter(|used| used.split(' ').next() == Some("store"))
        .collect();
    assert!(
        direct.is_empty(),
        "an edge imports the store directly: {direct:?}"
    );
}

#[test]
fn the_import_reader_sees_grouped_and_inline_paths() {
    let code = "use crate::{a::B, b, c::{d, e}};\nfn f() { crate::g::h(); }";
    let found: Vec<String> = imports(code).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "g"]);
    assert_eq!(
        imports(&without_comments("// crate::x\n/* crate::y */ crate::z::w")),
        BTreeSet::from(["z".to_string()])
    );
}
