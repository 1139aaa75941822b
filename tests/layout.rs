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
    let prefix = format!("crate::{module}::");
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_none_or(|e| e != "rs") || name == "mod" {
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
