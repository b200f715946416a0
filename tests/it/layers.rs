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

/// Within a module, the files too import one another without a circle
/// (the issuer and its verifier, a service and the service that calls it):
/// a circle between two files is one piece of code in two places, and
/// neither can be read, tested or replaced alone. A directory's `mod.rs`
/// is its index, which declares and wires the files beside it and holds
/// what they share: its edges with them are not counted.
#[test]
fn no_two_files_of_a_module_import_each_other_round_a_circle() {
    let src = Path::new(ROOT).join("src");
    let files = file_graph(&src);
    let mut circles = Vec::new();
    for top in files.keys().filter_map(|m| m.first()).collect::<BTreeSet<_>>() {
        let inside: BTreeMap<&Vec<String>, Vec<&Vec<String>>> = files
            .iter()
            .filter(|(m, _)| m.first() == Some(top))
            .map(|(m, uses)| {
                let siblings = uses
                    .iter()
                    .filter(|u| u.first() == Some(top) && !u.starts_with(m) && !m.starts_with(u))
                    .collect();
                (m, siblings)
            })
            .collect();
        if let Some(circle) = find_circle(&inside) {
            circles.push(circle.join(" -> "));
        }
    }
    assert!(
        circles.is_empty(),
        "files import each other in a circle:\n{}",
        circles.join("\n")
    );
}

/// The file-level import graph of `src/`: each file's module path
/// (`["domain", "mfa", "step"]` for `domain/mfa/step.rs`) and the files whose
/// items it names, through `crate::`, `super::` and `self::` paths, the
/// child modules of a `mod.rs`, and the re-exports (`pub use`) of a module,
/// which lead to the file that defines the item, not to the re-exporter.
/// Test modules are left out (they import their own file).
fn file_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut list = Vec::new();
    rust_files(src, &mut list);
    let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for file in &list {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let mut path: Vec<String> = rel.iter().map(|c| c.to_str().unwrap().to_string()).collect();
        if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            path.pop();
        }
        let code = without_tests(&without_comments(&std::fs::read_to_string(file).unwrap()));
        modules.insert(path, code);
    }
    // What each module re-exports: `module + [name]` -> the path it names.
    let mut aliases: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    for (module, code) in &modules {
        for stmt in code.split(';') {
            let t = stmt.trim_start();
            let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .find_map(|p| t.strip_prefix(p))
            else {
                continue;
            };
            let mut found = Vec::new();
            tree(rest.trim(), Vec::new(), &mut found);
            for p in found {
                let target = absolute(module, &p, &modules);
                aliases.insert([module.clone(), vec![p.last().unwrap().clone()]].concat(), target);
            }
        }
    }
    let mut graph = BTreeMap::new();
    for (module, code) in &modules {
        let mut uses = BTreeSet::new();
        for p in named_paths(code, module, &modules) {
            let target = absolute(module, &p, &modules);
            if let Some(file) = file_of(&target, &modules, &aliases, 0) {
                if file != *module && !is_reexport_of(code, &p) {
                    uses.insert(file);
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// Whether `p` appears in `code` only as a re-export (`pub use p`), which is
/// no use of it.
fn is_reexport_of(code: &str, p: &[String]) -> bool {
    let text = p.join("::");
    let uses: Vec<&str> = code.split(';').filter(|s| s.contains(text.as_str())).collect();
    !uses.is_empty() && uses.iter().all(|s| s.trim_start().starts_with("pub use "))
}

/// `p` (as written in `module`) from the crate root.
fn absolute(module: &[String], p: &[String], modules: &BTreeMap<Vec<String>, String>) -> Vec<String> {
    let mut base = module.to_vec();
    let mut rest = p;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        // A child module of `module` (uniform paths), or another crate.
        Some(first) if modules.contains_key(&[module.to_vec(), vec![first.to_string()]].concat()) => {}
        _ => return Vec::new(),
    }
    [base, rest.to_vec()].concat()
}

/// The file (module path) that defines what `path` names.
fn file_of(
    path: &[String],
    modules: &BTreeMap<Vec<String>, String>,
    aliases: &BTreeMap<Vec<String>, Vec<String>>,
    depth: usize,
) -> Option<Vec<String>> {
    if path.is_empty() || depth > 8 {
        return None;
    }
    let n = (0..=path.len())
        .rev()
        .find(|&n| modules.contains_key(&path[..n]))?;
    if n < path.len() {
        if let Some(target) = aliases.get(&path[..=n]) {
            let resolved = [target.clone(), path[n + 1..].to_vec()].concat();
            return file_of(&resolved, modules, aliases, depth + 1);
        }
    }
    Some(path[..n].to_vec())
}

/// The paths `code` names from `crate::`, `super::`, `self::` or one of
/// `module`'s child modules, with groups expanded (`use super::{a::B, c}`
/// names `super::a::B` and `super::c`).
fn named_paths(code: &str, module: &[String], modules: &BTreeMap<Vec<String>, String>) -> Vec<Vec<String>> {
    let children: Vec<String> = modules
        .keys()
        .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
        .map(|m| m.last().unwrap().clone())
        .collect();
    let mut starts: Vec<String> = vec!["crate".into(), "super".into(), "self".into()];
    starts.extend(children);
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    for start in &starts {
        let needle = format!("{start}::");
        for (i, _) in code.match_indices(&needle) {
            let before = if i == 0 { b' ' } else { bytes[i - 1] };
            if before.is_ascii_alphanumeric() || before == b'_' || before == b':' {
                continue;
            }
            tree(&code[i..], Vec::new(), &mut found);
        }
    }
    found
}

/// Reads one path tree at the start of `s` (`a::b::{c, d::{e, f}}`, `a::*`,
/// `a::b as c`) into `out`; returns how much of `s` it read.
fn tree(s: &str, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut i = 0;
    let b = s.as_bytes();
    loop {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start {
            let seg = &s[start..i];
            if seg != "self" || prefix.is_empty() {
                prefix.push(seg.to_string());
            }
            if s[i..].starts_with("::") {
                i += 2;
                continue;
            }
            out.push(prefix);
            return i;
        }
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    return i + 1;
                }
                i += tree(&s[i..], prefix.clone(), out);
                // Past an alias (`as x`) to the next item.
                while i < b.len() && b[i] != b',' && b[i] != b'}' {
                    i += 1;
                }
                if i < b.len() && b[i] == b',' {
                    i += 1;
                }
            }
        }
        // `*`, or the end of the path.
        out.push(prefix);
        return i;
    }
}

/// Code without its `#[cfg(test)] mod ... { ... }` blocks.
fn without_tests(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(at) = out.find("#[cfg(test)]") {
        let Some(open) = out[at..].find('{').map(|o| at + o) else {
            break;
        };
        let header = &out[at..open];
        if !header.contains("mod ") {
            // A test-only item that is not a module: leave it out alone.
            let end = out[at..].find('\n').map_or(out.len(), |e| at + e);
            out.replace_range(at..end, "");
            continue;
        }
        let mut depth = 0;
        let mut end = out.len();
        for (j, c) in out[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(at..end, "");
    }
    out
}

/// A circle in `graph`, as the files along it, if there is one.
fn find_circle(graph: &BTreeMap<&Vec<String>, Vec<&Vec<String>>>) -> Option<Vec<String>> {
    fn visit<'a>(
        at: &'a Vec<String>,
        graph: &BTreeMap<&'a Vec<String>, Vec<&'a Vec<String>>>,
        on_path: &mut Vec<&'a Vec<String>>,
        done: &mut BTreeSet<&'a Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(i) = on_path.iter().position(|m| *m == at) {
            let mut circle: Vec<String> = on_path[i..].iter().map(|m| m.join("/")).collect();
            circle.push(at.join("/"));
            return Some(circle);
        }
        if !done.insert(at) {
            return None;
        }
        on_path.push(at);
        for next in graph.get(at).into_iter().flatten() {
            if let Some(c) = visit(next, graph, on_path, done) {
                return Some(c);
            }
        }
        on_path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        if let Some(c) = visit(start, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_file_reader_follows_groups_children_and_reexports() {
    let mut found = Vec::new();
    tree("super::{a::B, c::{d, e as f}, g::*}", Vec::new(), &mut found);
    let joined: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(joined, ["super::a::B", "super::c::d", "super::c::e", "super::g"]);
    let modules: BTreeMap<Vec<String>, String> = [
        (vec!["d".to_string()], String::new()),
        (vec!["d".to_string(), "x".to_string()], String::new()),
        (vec!["d".to_string(), "y".to_string()], String::new()),
    ]
    .into_iter()
    .collect();
    let x = vec!["d".to_string(), "x".to_string()];
    // From d/x.rs, `super::y::T` is d/y.rs; `super::T`, re-exported by
    // d/mod.rs from y, is d/y.rs too.
    let to = |p: &str| absolute(&x, &p.split("::").map(String::from).collect::<Vec<_>>(), &modules);
    let aliases: BTreeMap<Vec<String>, Vec<String>> = [(
        vec!["d".to_string(), "T".to_string()],
        vec!["d".to_string(), "y".to_string(), "T".to_string()],
    )]
    .into_iter()
    .collect();
    let y = Some(vec!["d".to_string(), "y".to_string()]);
    assert_eq!(file_of(&to("super::y::T"), &modules, &aliases, 0), y);
    assert_eq!(file_of(&to("super::T"), &modules, &aliases, 0), y);
    assert_eq!(
        file_of(&to("crate::d::U"), &modules, &aliases, 0),
        Some(vec!["d".to_string()])
    );
    let graph: BTreeMap<&Vec<String>, Vec<&Vec<String>>> =
        [(&x, vec![y.as_ref().unwrap()]), (y.as_ref().unwrap(), vec![&x])]
            .into_iter()
            .collect();
    assert!(find_circle(&graph).is_some());
    assert_eq!(
        without_tests("fn a() {}\n#[cfg(test)]\nmod tests { fn b() { {} } }\nfn c() {}"),
        "fn a() {}\n\nfn c() {}"
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
