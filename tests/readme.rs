//! The README's code runs as copied: its Rust blocks are whole programs with no lines that
//! rustdoc hides (`# ...`), so that what a reader copies from the rendered page is what
//! the doctests compile (`lib.rs` includes the README as doctests).

#[test]
fn readme_rust_blocks_are_whole_programs_with_nothing_hidden() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("```rust") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            blocks.push(body);
        }
    }
    assert!(!blocks.is_empty(), "the README has Rust examples");
    for (i, body) in blocks.iter().enumerate() {
        let hidden: Vec<_> =
            body.iter().filter(|l| l.trim() == "#" || l.trim_start().starts_with("# ")).collect();
        assert!(hidden.is_empty(), "README Rust block {i} hides lines from readers: {hidden:?}");
        assert!(body.iter().any(|l| l.contains("fn main")), "README Rust block {i}: no fn main");
    }
}
