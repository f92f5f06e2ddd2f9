//! The house's shape, checked: every module of `src/` imports only the layers below it
//! (the table in `src/lib.rs` and docs/DESIGN.md), and inside `channel/` and `cuda/` (the GPU
//! wing) each file only the files before it, so that no import runs in a circle; those
//! tables list exactly these layers; and CUDA appears only in the GPU wing. Reads the
//! sources as text; a violation names the file and line.

use std::path::{Path, PathBuf};

/// The layers of the library, bottom to top. A module may use its own layer's module
/// only if it is itself (two modules of one layer do not know each other).
const LAYERS: &[&[&str]] = &[
    &["sync", "fault"],
    &["descriptor", "wait"],
    &["layout", "bus_guard"],
    &["shm"],
    &["liveness"],
    &["ring"],
    &["named", "pool"],
    &["channel"],
    &["cuda", "inspect"],
];

/// The folders whose files are ordered, each file using only those before it (`mod.rs`,
/// the facade that declares and re-exports them, is left out).
const FOLDERS: &[(&str, &[&str])] = &[
    (
        "channel",
        &[
            "producer", "backend", "lease", "error", "table", "builder", "message", "parts",
            "sender", "receiver", "select",
        ],
    ),
    (
        "cuda",
        &[
            "slack", "register", "lane", "events", "returns", "device", "flag", "backend",
            "pinned", "setup",
        ],
    ),
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
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

/// The first segment of every path that follows `prefix` in `code` (a `{...}` group
/// gives each of its paths' first segments).
fn targets(code: &str, prefix: &str) -> Vec<String> {
    let first = |path: &str| path.trim().split("::").next().unwrap_or("").to_owned();
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        if let Some(group) = after.strip_prefix('{') {
            // The group's paths, split at its top-level commas.
            let (mut depth, mut start) = (0, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    '}' | ',' if depth == 0 => {
                        found.push(first(&group[start..i]));
                        start = i + 1;
                        if c == '}' {
                            break;
                        }
                    }
                    _ => {}
                }
            }
        } else {
            found.push(first(
                after.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or(""),
            ));
        }
        rest = after;
    }
    found.retain(|t| !t.is_empty());
    found
}

#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let module = parts[0].trim_end_matches(".rs").to_owned();
        if module == "lib" {
            continue; // the facade
        }
        let mine = layer(&module).unwrap_or_else(|| panic!("{module} is in no layer"));
        let folder = FOLDERS.iter().find(|(f, _)| *f == module && parts.len() == 2);
        let ordered = folder
            .map(|(_, files)| (*files, parts[1].trim_end_matches(".rs").to_owned()))
            .filter(|(_, f)| f != "mod");
        for (n, line) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for target in targets(code, "crate::") {
                let ok = target == module || layer(&target).is_some_and(|l| l < mine);
                if !ok {
                    violations.push(format!("{}:{}: {module} uses {target}", rel.display(), n + 1));
                }
            }
            let Some((files, me)) = &ordered else { continue };
            let my_rank = files
                .iter()
                .position(|f| f == me)
                .unwrap_or_else(|| panic!("{module}/{me}.rs is not in FOLDERS"));
            for target in targets(code, "super::") {
                let rank = files.iter().position(|f| *f == target);
                if rank.is_some_and(|r| r >= my_rank) {
                    violations.push(format!(
                        "{}:{}: {module}/{me} uses {target}",
                        rel.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "imports that run up the layers:\n{}", violations.join("\n"));
}

#[test]
fn the_checker_sees_a_violation() {
    // `shm` (layer 4) naming `ring` (layer 6) must be caught; `ring` naming `shm` not.
    assert_eq!(targets("use crate::ring::RingSegment;", "crate::"), ["ring"]);
    assert_eq!(targets("use crate::{layout::A, shm::{B, C}};", "crate::"), ["layout", "shm"]);
    assert!(layer("ring") > layer("shm"));
}

/// The backticked names in a table cell (`layout/` and [`inspect`] count as `layout` and
/// `inspect`).
fn cell_modules(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(|m| m.trim_end_matches('/').to_owned()).collect()
}

fn expected() -> Vec<Vec<String>> {
    LAYERS.iter().map(|l| l.iter().map(|m| (*m).to_owned()).collect()).collect()
}

#[test]
fn the_documented_tables_are_the_checked_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // docs/DESIGN.md: `| row | module | ... |`, a row number per module, rows in order.
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).unwrap();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let table = design.lines().skip_while(|l| !l.starts_with("| row | module |"));
    for line in table.take_while(|l| l.starts_with('|')) {
        let cells: Vec<_> = line.split('|').map(str::trim).collect();
        let Some(row) = cells.get(1).and_then(|c| c.parse::<usize>().ok()) else { continue };
        if rows.len() < row {
            rows.resize(row, Vec::new());
        }
        rows[row - 1].extend(cell_modules(cells[2]));
    }
    assert_eq!(rows, expected(), "docs/DESIGN.md's module table");

    // src/lib.rs: the table under "Modules, bottom to top", one row per layer.
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let table: Vec<Vec<String>> = lib
        .lines()
        .skip_while(|l| !l.contains("## Modules, bottom to top"))
        .filter_map(|l| l.strip_prefix("//! | "))
        .map(|l| cell_modules(l.split('|').next().unwrap()))
        .filter(|m| !m.is_empty())
        .collect();
    assert_eq!(table, expected(), "src/lib.rs's module table");

    // And every layer names a module that exists.
    for m in LAYERS.iter().flat_map(|l| l.iter()) {
        let src = root.join("src");
        assert!(
            src.join(format!("{m}.rs")).exists() || src.join(m).join("mod.rs").exists(),
            "layer module {m} has no file"
        );
    }
}

#[test]
fn cuda_lives_in_the_gpu_wing() {
    // Outside `cuda/`, the feature is named only where the wing is declared and re-exported
    // (`lib.rs`), and no file names the driver's crate.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut outside = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        if rel.starts_with("cuda") {
            continue;
        }
        for (n, line) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
            let gated = line.contains("feature = \"cuda\"") && rel != Path::new("lib.rs");
            if gated || line.contains("cudarc") {
                outside.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(outside.is_empty(), "CUDA outside the GPU wing:\n{}", outside.join("\n"));
}

#[test]
fn no_source_file_is_over_600_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<_> = files
        .iter()
        .map(|f| (f, std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, n)| *n > 600)
        .map(|(f, n)| format!("{}: {n} lines", f.strip_prefix(&src).unwrap().display()))
        .collect();
    assert!(long.is_empty(), "files to split by concern:\n{}", long.join("\n"));
}
