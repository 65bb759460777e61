//! The layers of `docs/ARCHITECTURE.md` are the layers of the code: every `crate::<module>`
//! path in a module's source (tests and comments aside) names a module that module may use.
//! A new arrow fails here until the architecture document and this table change together.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Module -> the modules it may use (besides itself and the crate-root macros).
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("error", &[][..]),
        ("proto", &["error"][..]),
        ("wire", &["error", "proto"][..]),
        ("schema", &["error", "proto"][..]),
        ("graph", &["error", "proto", "wire", "schema"][..]),
        (
            "autodiff",
            &["error", "proto", "wire", "graph", "schema", "device"][..],
        ),
        ("device", &["error", "proto"][..]),
        ("tensor", &["error", "proto", "device"][..]),
        ("threads", &[][..]),
        ("blas", &["error", "tensor", "threads"][..]),
        // The workspace names the registry type it holds (docs/ARCHITECTURE.md explains the
        // one mutual reference between the workspace and the operator contract).
        ("workspace", &["error", "proto", "tensor", "ops"][..]),
        (
            "serialize",
            &["error", "proto", "wire", "device", "tensor", "workspace"][..],
        ),
        (
            "ops",
            &[
                "error",
                "proto",
                "wire",
                "schema",
                "device",
                "tensor",
                "blas",
                "threads",
                "workspace",
                "serialize",
            ][..],
        ),
        (
            "net",
            &[
                "error",
                "proto",
                "device",
                "tensor",
                "blas",
                "threads",
                "workspace",
                "ops",
            ][..],
        ),
        ("plan", &["error", "proto", "workspace", "net"][..]),
        (
            "rnn",
            &[
                "error",
                "proto",
                "tensor",
                "blas",
                "threads",
                "workspace",
                "ops",
                "net",
            ][..],
        ),
        (
            "cuda",
            &[
                "error",
                "proto",
                "device",
                "tensor",
                "workspace",
                "ops",
                "net",
            ][..],
        ),
        (
            "collective",
            &["error", "proto", "device", "tensor", "workspace", "ops"][..],
        ),
        ("shape_infer", &["error", "proto", "workspace", "ops"][..]),
        (
            "runtime",
            &[
                "error",
                "proto",
                "workspace",
                "ops",
                "net",
                "rnn",
                "cuda",
                "collective",
            ][..],
        ),
    ])
}

/// Names reachable as `crate::<name>` that are macros or re-exports at the crate root, not
/// modules.
const ROOT_ITEMS: &[&str] = &[
    "dispatch",
    "bail",
    "ensure",
    "err",
    "Error",
    "Result",
    "cuda_launch",
];

fn strip(text: &str) -> String {
    let body = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            visit(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    visit(&src, &mut files);
    let table = allowed();
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap_or(&f);
        let first = rel
            .components()
            .next()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .unwrap_or_default();
        if first == "lib" {
            continue;
        }
        seen.insert(first.clone());
        let Some(ok) = table.get(first.as_str()) else {
            wrong.push(format!(
                "{}: module {first} is not in the layer table",
                rel.display()
            ));
            continue;
        };
        let text = fs::read_to_string(&f).unwrap_or_default();
        for used in uses(&strip(&text)) {
            if used == first || ROOT_ITEMS.contains(&used.as_str()) || ok.contains(&used.as_str()) {
                continue;
            }
            wrong.push(format!("{}: {first} uses crate::{used}", rel.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows not in docs/ARCHITECTURE.md:\n{}",
        wrong.join("\n")
    );
    for m in table.keys() {
        assert!(
            seen.contains(*m),
            "layer table names a module that does not exist: {m}"
        );
    }
}
