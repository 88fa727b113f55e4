//! The function-length rule, held: no product function (every crate's `src/` but this
//! test crate's) is longer than 100 lines, counted from its `fn` to its closing brace by
//! Rust's own grammar (`syn`), so a brace in a string or a comment cannot fool it. Tests
//! (`#[test]`, `#[tokio::test]`, `#[cfg(test)]` modules, `tests.rs` files) are not product.
//!
//! `cargo run -q -p address-controller-tests --bin fn-length [-- --top N]`: prints the N
//! longest (default 10) and fails naming every function over the limit. Part of `make lint`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use address_controller_tests::repo_root;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The longest a product function may be, in lines.
const LIMIT: usize = 100;

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
    let mut all = Vec::new();
    for file in &files {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("fn-length: {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        };
        let parsed = match syn::parse_file(&text) {
            Ok(p) => p,
            Err(e) => {
                eprintln!(
                    "fn-length: {}: not Rust this parser reads: {e}",
                    file.display()
                );
                return ExitCode::FAILURE;
            }
        };
        let rel = file.strip_prefix(&root).unwrap_or(file);
        let mut v = Lengths {
            file: rel,
            owner: Vec::new(),
            found: Vec::new(),
        };
        v.visit_file(&parsed);
        all.extend(v.found);
    }
    all.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    println!(
        "fn-length: {} product functions in {} files; the {} longest:",
        all.len(),
        files.len(),
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
    let over: Vec<&Length> = all.iter().filter(|l| l.lines > LIMIT).collect();
    if over.is_empty() {
        println!("fn-length: none over {LIMIT} lines");
        return ExitCode::SUCCESS;
    }
    eprintln!("fn-length: {} over {LIMIT} lines:", over.len());
    for l in over {
        eprintln!(
            "  {}:{}  {} — {} lines",
            l.file.display(),
            l.line,
            l.name,
            l.lines
        );
    }
    ExitCode::FAILURE
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
