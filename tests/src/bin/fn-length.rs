//! The function-length rule, held: no product function (every crate's `src/` but this
//! test crate's) is longer than 100 lines, counted from its `fn` to its closing brace by
//! Rust's own grammar (`syn`), so a brace in a string or a comment cannot fool it. Tests
//! (`#[test]`, `#[tokio::test]`, `#[cfg(test)]` modules, `tests.rs` files) are not product.
//!
//! A test (`#[test]`, `#[tokio::test]`) under `tests/tests/` is held to 150 lines: a
//! scenario longer than that is split into steps named after what they check, so a failure
//! names its step. The tests still over it are listed, each with its length, in
//! `tests/long-tests.txt`: one may shrink, none may grow, no other may join, and a line
//! that no longer applies must go (a ratchet that only turns one way).
//!
//! `cargo run -q -p address-controller-tests --bin fn-length [-- --top N]`: prints the N
//! longest of each (default 10) and fails naming every function over its limit. Part of
//! `make lint`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use address_controller_tests::repo_root;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The longest a product function may be, in lines.
const LIMIT: usize = 100;

/// The longest a test may be, in lines.
const TEST_LIMIT: usize = 150;

/// The tests still over [`TEST_LIMIT`], each with the length it may not exceed.
const LONG_TESTS: &str = "tests/long-tests.txt";

/// The workspace's member crates, read from its `Cargo.toml` (`members = [...]`), so a new
/// crate is held to the rule the day it joins; `None` if the list cannot be read.
fn members(manifest: &str) -> Option<Vec<String>> {
    let start = manifest.find("members = [")? + "members = [".len();
    let len = manifest[start..].find(']')?;
    let list = &manifest[start..start + len];
    Some(
        list.split(',')
            .map(|m| m.trim().trim_matches('"').to_string())
            .filter(|m| !m.is_empty())
            .collect(),
    )
}

/// The product crates' sources: every member's `src/` and `build.rs`, but this test crate's.
fn sources(root: &Path, members: &[String]) -> Vec<PathBuf> {
    members
        .iter()
        .filter(|m| m.as_str() != "tests")
        .flat_map(|m| [root.join(m).join("src"), root.join(m).join("build.rs")])
        .filter(|p| p.exists())
        .collect()
}

/// One function: where it is and how long.
struct Length {
    file: PathBuf,
    name: String,
    line: usize,
    lines: usize,
}

struct Lengths<'a> {
    file: &'a Path,
    /// `Type::` for the methods of an impl or trait being walked.
    owner: Vec<String>,
    found: Vec<Length>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        let last = path.segments.last().map(|s| s.ident.to_string());
        if last.as_deref() == Some("test") {
            return true;
        }
        // #[cfg(test)], and #[cfg(all(test, …))] alike.
        path.is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                l.tokens
                    .clone()
                    .into_iter()
                    .any(|t| t.to_string() == "test")
            })
    })
}

impl Lengths<'_> {
    fn record(&mut self, name: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let name = match self.owner.last() {
            Some(owner) => format!("{owner}::{name}"),
            None => name.to_string(),
        };
        self.found.push(Length {
            file: self.file.to_path_buf(),
            name,
            line: start,
            lines: end.saturating_sub(start) + 1,
        });
    }
}

/// The tests of a file: every function with a test attribute, however nested.
struct TestLengths<'a>(Lengths<'a>);

impl<'ast> Visit<'ast> for TestLengths<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            self.0.record(&f.sig.ident, &f.sig, &f.block);
        }
        syn::visit::visit_item_fn(self, f);
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let ty = &i.self_ty;
        self.owner.push(type_name(ty));
        syn::visit::visit_item_impl(self, i);
        self.owner.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.owner.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.owner.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig.ident, &f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// The name of an impl's type, for messages (`Foo` of `a::Foo<'_>`; another kind of type
/// by its line).
fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        other => format!("<{}>", other.span().start().line),
    }
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() && name != "tests" {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

/// Every function `visit` records in `files`, by path relative to `root`.
fn lengths(
    root: &Path,
    files: &[PathBuf],
    visit: fn(&Path, &syn::File) -> Vec<Length>,
) -> Result<Vec<Length>, String> {
    let mut all = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let parsed = syn::parse_file(&text)
            .map_err(|e| format!("{}: not Rust this parser reads: {e}", file.display()))?;
        all.extend(visit(file.strip_prefix(root).unwrap_or(file), &parsed));
    }
    all.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    Ok(all)
}

fn product_fns(file: &Path, parsed: &syn::File) -> Vec<Length> {
    let mut v = Lengths {
        file,
        owner: Vec::new(),
        found: Vec::new(),
    };
    v.visit_file(parsed);
    v.found
}

fn test_fns(file: &Path, parsed: &syn::File) -> Vec<Length> {
    let mut v = TestLengths(Lengths {
        file,
        owner: Vec::new(),
        found: Vec::new(),
    });
    v.visit_file(parsed);
    v.0.found
}

fn print_top(what: &str, all: &[Length], files: usize, top: usize) {
    println!(
        "fn-length: {} {what} in {files} files; the {} longest:",
        all.len(),
        top.min(all.len())
    );
    for l in all.iter().take(top) {
        println!(
            "  {:>4}  {}:{}  {}",
            l.lines,
            l.file.display(),
            l.line,
            l.name
        );
    }
}

/// `tests/long-tests.txt`: `path name lines` per line (`#` comments).
fn parse_long_tests(text: &str) -> Result<Vec<(String, String, usize)>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            match parts.as_slice() {
                [path, name, lines] => lines
                    .parse()
                    .map(|n| (path.to_string(), name.to_string(), n))
                    .map_err(|_| format!("{LONG_TESTS}: not a length: {l}")),
                _ => Err(format!("{LONG_TESTS}: not `path name lines`: {l}")),
            }
        })
        .collect()
}

/// What breaks the tests' rule: a test over [`TEST_LIMIT`] not listed, or longer than its
/// line allows; a line whose test is gone or no longer over the limit.
fn test_rule_breaches(tests: &[Length], listed: &[(String, String, usize)]) -> Vec<String> {
    let mut breaches = Vec::new();
    for t in tests.iter().filter(|t| t.lines > TEST_LIMIT) {
        let path = t.file.display().to_string();
        match listed.iter().find(|(p, n, _)| *p == path && *n == t.name) {
            None => breaches.push(format!(
                "{path}:{}  {} — {} lines (split it into steps)",
                t.line, t.name, t.lines
            )),
            Some((_, _, allowed)) if t.lines > *allowed => breaches.push(format!(
                "{path}:{}  {} — {} lines, grown past the {allowed} {LONG_TESTS} allows",
                t.line, t.name, t.lines
            )),
            Some(_) => {}
        }
    }
    for (path, name, _) in listed {
        let found = tests
            .iter()
            .find(|t| t.file.display().to_string() == *path && t.name == *name);
        if found.is_none_or(|t| t.lines <= TEST_LIMIT) {
            breaches.push(format!(
                "{LONG_TESTS}: {path} {name} is no longer over {TEST_LIMIT} lines: remove its line"
            ));
        }
    }
    breaches
}

fn main() -> ExitCode {
    let top: usize = std::env::args()
        .skip_while(|a| a != "--top")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(10);
    let root = repo_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let Some(members) = members(&manifest) else {
        eprintln!("fn-length: Cargo.toml names no workspace members (`members = [...]`)");
        return ExitCode::FAILURE;
    };
    let mut files = Vec::new();
    for s in sources(&root, &members) {
        rust_files(&s, &mut files);
    }
    files.sort();
    let mut test_files = Vec::new();
    rust_test_files(&root.join("tests/tests"), &mut test_files);
    test_files.sort();
    let listed = std::fs::read_to_string(root.join(LONG_TESTS))
        .map_err(|e| format!("{LONG_TESTS}: {e}"))
        .and_then(|t| parse_long_tests(&t));
    let (all, tests, listed) = match (
        lengths(&root, &files, product_fns),
        lengths(&root, &test_files, test_fns),
        listed,
    ) {
        (Ok(a), Ok(t), Ok(l)) => (a, t, l),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("fn-length: {e}");
            return ExitCode::FAILURE;
        }
    };
    print_top("product functions", &all, files.len(), top);
    print_top("tests", &tests, test_files.len(), top);
    let over: Vec<&Length> = all.iter().filter(|l| l.lines > LIMIT).collect();
    let breaches = test_rule_breaches(&tests, &listed);
    if over.is_empty() && breaches.is_empty() {
        println!(
            "fn-length: no product function over {LIMIT} lines; no test over {TEST_LIMIT} but the {} in {LONG_TESTS}",
            listed.len()
        );
        return ExitCode::SUCCESS;
    }
    if !over.is_empty() {
        eprintln!("fn-length: {} over {LIMIT} lines:", over.len());
    }
    for l in over {
        eprintln!(
            "  {}:{}  {} — {} lines",
            l.file.display(),
            l.line,
            l.name,
            l.lines
        );
    }
    if !breaches.is_empty() {
        eprintln!("fn-length: the tests' rule ({TEST_LIMIT} lines):");
    }
    for b in breaches {
        eprintln!("  {b}");
    }
    ExitCode::FAILURE
}

/// Every `.rs` file under `dir` (the tests' own directories included).
fn rust_test_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_test_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_from_the_workspace_manifest() {
        let manifest = "[workspace]\nresolver = \"3\"\nmembers = [\"api\", \"drivers/cilium\", \"tests\"]\n\n[workspace.package]\nx = [\"y\"]\n";
        assert_eq!(
            members(manifest),
            Some(vec![
                "api".to_string(),
                "drivers/cilium".to_string(),
                "tests".to_string()
            ])
        );
        assert_eq!(members("[package]\nname = \"x\"\n"), None);
    }

    #[test]
    fn the_tests_rule_turns_one_way() {
        let t = |name: &str, lines| Length {
            file: PathBuf::from("tests/tests/x.rs"),
            name: name.to_string(),
            line: 1,
            lines,
        };
        let listed =
            parse_long_tests("# c\ntests/tests/x.rs long 200\ntests/tests/x.rs gone 170\n")
                .expect("parses");
        let tests = [t("long", 180), t("short", 150), t("new", 151)];
        let breaches = test_rule_breaches(&tests, &listed);
        assert_eq!(breaches.len(), 2, "{breaches:?}");
        assert!(breaches[0].contains("new — 151 lines"), "{breaches:?}");
        assert!(
            breaches[1].contains("gone is no longer over"),
            "{breaches:?}"
        );
        // Grown past its line.
        let breaches = test_rule_breaches(&[t("long", 201), t("gone", 170)], &listed);
        assert_eq!(breaches.len(), 1, "{breaches:?}");
        assert!(breaches[0].contains("grown past the 200"), "{breaches:?}");
        assert!(parse_long_tests("tests/tests/x.rs long").is_err());
    }

    #[test]
    fn this_workspace_holds_every_driver_to_the_rule() {
        let root = repo_root();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
        let sources = sources(&root, &members(&manifest).expect("members"));
        for driver in [
            "drivers/range/src",
            "drivers/metallb/src",
            "drivers/cilium/src",
        ] {
            assert!(
                sources.contains(&root.join(driver)),
                "{driver} is not checked"
            );
        }
        assert!(!sources.contains(&root.join("tests/src")));
        assert!(sources.contains(&root.join("address-controller/src")));
    }
}
