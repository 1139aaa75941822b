//! The crate's layout rules that a compiler does not check: inside `src/cluster/` the
//! files' imports point one way (no file reaches, through others, back to itself), and
//! `cluster/` and the HTTP side (`http/`) never use each other.
//!
//! Imports are read from the source text: every `crate::cluster::<file>` path outside a
//! comment, whether in a `use` line or written out in the code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `file -> files it uses` for the `.rs` files of `dir` (a module's folder), read from
/// every `crate::<module>::<file>` path outside comments.
fn graph(dir: &Path, module: &str) -> BTreeMap<String, BTreeSet<String>> {
    let prefix = if module.is_empty() { "crate::".to_string() } else { format!("crate::{module}::") };
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_none_or(|e| e != "rs") || name == "mod" || name == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut uses = BTreeSet::new();
        for line in text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
            for (at, _) in line.match_indices(&prefix) {
                let rest = &line[at + prefix.len()..];
                let used: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !used.is_empty() && used != name {
                    uses.insert(used);
                }
            }
        }
        graph.insert(name, uses);
    }
    graph
}

/// A circle in `graph`, as the files along it, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_cluster_s_files_import_one_way() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cluster"), "cluster");
    assert!(graph.len() > 5, "read {graph:?}");
    assert_eq!(circle(&graph), None, "an import circle in src/cluster: {graph:#?}");
    // What every task shares uses none of the tasks.
    for task in ["writer", "membership", "inbox", "node", "directory", "stream"] {
        assert!(!graph["shared"].contains(task), "shared uses {task}");
    }
}

/// The load-test harness's files import one way too: what the whole fleet shares
/// (`fleet`) and the payloads' layouts (`payload`) are its floor, importing nothing above.
#[test]
fn the_load_test_harness_imports_one_way() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("loadtest/src"), "");
    assert!(graph.len() > 8, "read {graph:?}");
    assert_eq!(circle(&graph), None, "an import circle in loadtest/src: {graph:#?}");
    for floor in ["fleet", "payload"] {
        let above: Vec<&String> = graph[floor].iter().filter(|m| !["fleet", "payload"].contains(&m.as_str())).collect();
        assert!(above.is_empty(), "{floor} imports {above:?}");
    }
}

#[test]
fn the_cluster_and_the_http_side_never_use_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (dir, other) in [("cluster", "crate::http"), ("http", "crate::cluster")] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let used = text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")).any(|l| l.contains(other));
            assert!(!used, "{} uses {other}", path.display());
        }
    }
}

/// Each top-level module's layer: a module may import only modules of a lower layer, so
/// modules of one layer never use each other. The composition root (`server`) is the only
/// module above the doors: it builds every part and hands each side a narrow handle.
const LAYERS: [(&str, u32); 17] = [
    // The wire vocabulary's own crate (crates/idlegate-proto), named `proto` in lib.rs.
    ("proto", 0),
    ("error", 0),
    ("descriptors", 0),
    ("config", 2),
    ("metrics", 3),
    ("presence", 4),
    // Side by side: the protocol machine, the cluster, the HTTP side.
    ("protocol", 5),
    ("cluster", 5),
    ("http", 5),
    ("webhook", 5),
    ("jwks", 5),
    ("transport", 6),
    ("server", 7),
    ("lib", 8),
    ("main", 8),
    ("bench", 8),
    ("conformance", 8),
];

/// `module -> modules of the crate it names` for the top-level modules of `src/`, read from
/// every `crate::<module>` path outside comments in the module's file or folder.
fn top_level_imports() -> BTreeMap<String, BTreeSet<String>> {
    fn files(path: &Path, out: &mut Vec<std::path::PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                files(&entry.unwrap().path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut imports = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_stem().map(|n| n.to_string_lossy().into_owned()) else { continue };
        if !(path.is_dir() || path.extension().is_some_and(|e| e == "rs")) {
            continue;
        }
        let mut all = Vec::new();
        files(&path, &mut all);
        let mut uses = BTreeSet::new();
        for file in all {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
                for (at, _) in line.match_indices("crate::") {
                    let used: String =
                        line[at + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !used.is_empty() && used != name && used.chars().all(|c| c.is_lowercase() || c == '_') {
                        uses.insert(used);
                    }
                }
            }
        }
        imports.insert(name, uses);
    }
    imports
}

#[test]
fn the_crate_s_modules_import_downward_only() {
    let layer = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l);
    let imports = top_level_imports();
    assert!(imports.contains_key("presence") && imports.contains_key("server"), "read {imports:?}");
    for (module, uses) in &imports {
        let own = layer(module).unwrap_or_else(|| panic!("src/{module} has no layer in LAYERS: give it one"));
        for used in uses {
            let theirs = layer(used).unwrap_or_else(|| panic!("{module} uses crate::{used}, which has no layer"));
            assert!(theirs < own, "{module} (layer {own}) imports {used} (layer {theirs}): imports point downward");
        }
    }
}

#[test]
fn a_circle_is_found() {
    let g = |edges: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            graph.entry(a.to_string()).or_default().insert(b.to_string());
            graph.entry(b.to_string()).or_default();
        }
        graph
    };
    assert_eq!(circle(&g(&[("node", "writer"), ("writer", "shared"), ("inbox", "shared")])), None);
    let found = circle(&g(&[("node", "writer"), ("writer", "inbox"), ("inbox", "node")])).unwrap();
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4);
}

/// The wire vocabulary is shared with clients that may run on any runtime, or none: its
/// crate depends on nothing but `bytes` and `thiserror` unless a feature asks, and no file
/// but the feature's own names tokio.
#[test]
fn the_wire_vocabulary_needs_no_runtime() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/idlegate-proto");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    let required: Vec<&str> = deps
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("optional = true"))
        .map(|l| l.split('=').next().unwrap().trim())
        .collect();
    assert_eq!(required, ["bytes", "thiserror"], "idlegate-proto's dependencies");
    for entry in std::fs::read_dir(root.join("src")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "tokio_codec.rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("tokio::") && !text.contains("use tokio"), "{} uses tokio", path.display());
        }
    }
}

/// Every library crate forbids unsafe code (the binary's one `mallopt` call is outside
/// them, with its SAFETY comment), and the workspace names each shared dependency once.
#[test]
fn libraries_forbid_unsafe_code_and_share_their_dependencies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for lib in ["src/lib.rs", "crates/idlegate-proto/src/lib.rs", "crates/idlegate-client/src/lib.rs"] {
        let text = std::fs::read_to_string(root.join(lib)).unwrap();
        assert!(text.contains("#![forbid(unsafe_code)]"), "{lib} does not forbid unsafe code");
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("[workspace.dependencies]"), "no [workspace.dependencies]");
    for member in
        ["Cargo.toml", "loadtest/Cargo.toml", "crates/idlegate-proto/Cargo.toml", "crates/idlegate-client/Cargo.toml"]
    {
        let text = std::fs::read_to_string(root.join(member)).unwrap();
        // The members' own tables, not the workspace's list itself.
        let text = text.split("[workspace.package]").last().unwrap_or(&text);
        for shared in ["bytes", "thiserror", "tokio", "rustls"] {
            for line in text.lines().filter(|l| l.starts_with(&format!("{shared} ="))) {
                assert!(line.contains("workspace = true"), "{member}: {line}");
            }
        }
    }
}

/// No module holds the whole gateway: there is no `gateway` module or `Gateway` type, and
/// only the composition root builds the cluster or names the backplane it picks.
#[test]
fn only_the_composition_root_holds_the_whole() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(!src.join("gateway.rs").exists() && !src.join("gateway").exists(), "src/gateway is back");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 40, "read {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code: Vec<&str> = text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")).collect();
        let name = file.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        for line in &code {
            assert!(!line.contains("crate::gateway") && !line.contains("Gateway"), "{name}: {line}");
        }
        if !(name == "server.rs" || name.starts_with("cluster/")) {
            for line in &code {
                assert!(
                    !line.contains("Joining") && !line.contains("dyn Backplane"),
                    "{name} names the backplane: {line}"
                );
            }
        }
    }
}

/// `cargo run -p loadtest -- ...`, as docs/BENCHMARKS.md writes it, must pick the harness among the
/// package's binaries (the baselines are binaries too).
#[test]
fn cargo_run_of_the_loadtest_package_runs_the_harness() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("loadtest/Cargo.toml")).unwrap();
    let binaries = manifest.matches("[[bin]]").count();
    assert!(binaries == 0 || manifest.contains("default-run = \"loadtest\""), "loadtest/Cargo.toml needs default-run");
}
