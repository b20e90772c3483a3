//! Checks that keep the house in order: the host's layers run one way (`cargo xtask house`),
//! and its normal and test builds share one feature set (`cargo xtask features`). Both run
//! before the tests in `cargo xtask test`, so CI keeps them true.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::{Result, cargo, root};

/// The host's modules (directories or files under `host/src`), lowest first. A module may name
/// (`crate::x`, in code or in a doc link) only modules of a lower rank: the store knows nothing
/// of claims, the runtime nothing of the supervisor, the API nothing of the CLI.
const LAYERS: &[(&str, u8)] = &[
    // Leaves: bounded reads, scratch directories, then TLS setup (which reads files).
    ("input", 0),
    ("scratch", 0),
    ("tls", 1),
    ("config", 2),
    // The nats-server launcher of the bench and the tests reads the config's store settings.
    ("natsd", 3),
    ("store", 3),
    ("telemetry", 4),
    // What the API, the CLI and guests (in the runtime) do with work: on the store and config,
    // counted in the metrics.
    ("work", 5),
    // The live hub: what running claims stream, handed to watchers (above the store).
    ("live", 5),
    ("claim", 6),
    ("runtime", 7),
    ("supervisor", 8),
    ("api", 9),
    ("bench", 10),
    ("cli", 11),
];

/// What a module may name of a lower one that it may not use all of: `(from, of, items)`. The
/// CLI takes from the API only what starts the server; what it does with work comes from
/// `work`, below both.
const NARROW: &[(&str, &str, &[&str])] = &[("cli", "api", &["ApiServer", "AgentInfo"])];

fn rank(module: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, rank)| *rank)
}

/// Every `.rs` file under `dir` (or `dir` itself when it is a file).
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for entry in entries {
        rust_files(&entry, out);
    }
}

/// The paths a line names after `crate::`, a `use crate::{a, b::C}` group as one path per
/// item.
fn crate_paths(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        // `$crate::` and `my_crate::` are not this crate.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        match rest.strip_prefix('{') {
            Some(group) => out.extend(group_items(group).into_iter().map(str::trim_start)),
            None => out.push(rest),
        }
    }
    out
}

/// The modules a line names as `crate::NAME`, including inside `use crate::{a, b}` groups.
fn named_modules(line: &str) -> Vec<String> {
    crate_paths(line)
        .into_iter()
        .map(ident)
        .filter(|name| !name.is_empty())
        .collect()
}

/// The leading identifier of `text`.
fn ident(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The comma-separated items of a `{...}` group whose opening brace is already consumed, up to
/// its closing brace (nested groups stay whole inside their item).
fn group_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..at]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// The items of `module` a line names (`crate::module::Item`, `crate::module::{A, B}`, also
/// inside a `crate::{...}` group); `None` for the module itself (`crate::module` alone, `self`
/// or a glob), which would open all of it.
fn named_items(line: &str, module: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for path in crate_paths(line) {
        if ident(path) != module {
            continue;
        }
        let items = match path[module.len()..].strip_prefix("::") {
            None => vec![None],
            Some(after) => match after.trim_start().strip_prefix('{') {
                Some(group) => group_items(group)
                    .into_iter()
                    .map(ident)
                    .map(Some)
                    .collect(),
                None => vec![Some(ident(after))],
            },
        };
        out.extend(
            items
                .into_iter()
                .map(|item| item.filter(|i| !i.is_empty() && i != "self")),
        );
    }
    out
}

/// The uses of a higher layer in `src` (the host's `src`): `(file:line, from, to)`.
fn upward_uses(src: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut unknown = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        let module = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if module == "lib" || module == "main" || path.extension().is_some_and(|e| e != "rs") {
            continue;
        }
        let Some(own) = rank(&module) else {
            unknown.push(module);
            continue;
        };
        let mut files = Vec::new();
        rust_files(&path, &mut files);
        for file in files {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            for (n, line) in text.lines().enumerate() {
                for named in named_modules(line) {
                    if named == module {
                        continue;
                    }
                    match rank(&named) {
                        Some(theirs) if theirs < own => {}
                        Some(_) => found.push(format!(
                            "{}:{}: `{module}` names `crate::{named}`, a layer at or above it",
                            file.strip_prefix(root()).unwrap_or(&file).display(),
                            n + 1
                        )),
                        // Items of the crate root (`crate::Error`-like re-exports) are fine.
                        None => {}
                    }
                }
                for (_, of, allowed) in NARROW.iter().filter(|(from, ..)| *from == module) {
                    for item in named_items(line, of) {
                        if item.as_deref().is_some_and(|i| allowed.contains(&i)) {
                            continue;
                        }
                        found.push(format!(
                            "{}:{}: `{module}` names {}; of `{of}` it may name only {}",
                            file.strip_prefix(root()).unwrap_or(&file).display(),
                            n + 1,
                            item.map_or(format!("all of `crate::{of}`"), |i| format!(
                                "`crate::{of}::{i}`"
                            )),
                            allowed.join(", ")
                        ));
                    }
                }
            }
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(format!(
            "host/src has modules the layer table in xtask/src/checks.rs does not place: {}; add \
             them to LAYERS",
            unknown.join(", ")
        ));
    }
    found.sort();
    Ok(found)
}

/// `cargo xtask house`: fails on any use of a higher layer, and on a use of a lower one past
/// what [`NARROW`] allows.
pub fn house() -> Result<()> {
    let src = root().join("host").join("src");
    let up = upward_uses(&src)?;
    let store = store_rules(&src.join("store"))?;
    if up.is_empty() && store.is_empty() {
        return Ok(());
    }
    let order: Vec<&str> = LAYERS.iter().map(|(name, _)| *name).collect();
    let mut problems = Vec::new();
    if !up.is_empty() {
        problems.push(format!(
            "the layers must run one way ({}), but:\n  {}",
            order.join(" < "),
            up.join("\n  ")
        ));
    }
    if !store.is_empty() {
        problems.push(format!(
            "the store's files must run one way (its rules name only the model and the errors, \
             neither backend names the other, no file circles), but:\n  {}",
            store.join("\n  ")
        ));
    }
    Err(problems.join("\n"))
}

/// What the store's rules (`store/rules`) may name of the store: the records and the errors
/// (the store root's `StoreError`, `StoreResult` and `REASON_*` texts are the errors').
fn rules_may_name(first: &str) -> bool {
    matches!(
        first,
        "model" | "error" | "rules" | "StoreError" | "StoreResult"
    ) || first.starts_with("REASON_")
}

/// A store file's module path below the store (`nats/view.rs` is `["nats", "view"]`,
/// `nats/mod.rs` is `["nats"]`).
fn module_of(store: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(store).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The paths a line names relative to the store: `crate::store::a::b` and `super::a` (from
/// the module `at`), one per item of a `{...}` group; each as its segments.
fn store_paths(line: &str, at: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let segments = |base: Vec<String>, rest: &str| -> Vec<Vec<String>> {
        let items: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group_items(group)
                .into_iter()
                .map(str::trim_start)
                .collect(),
            None => vec![rest],
        };
        items
            .into_iter()
            .map(|item| {
                let mut path = base.clone();
                path.extend(
                    item.split("::")
                        .map(ident)
                        .take_while(|s| !s.is_empty())
                        .filter(|s| s != "self"),
                );
                path
            })
            .collect()
    };
    for path in crate_paths(line) {
        if let Some(rest) = path.strip_prefix("store::") {
            out.extend(segments(Vec::new(), rest));
        }
    }
    let mut rest = line;
    while let Some(found) = rest.find("super::") {
        let before = rest[..found].chars().next_back();
        rest = &rest[found..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            rest = &rest["super::".len()..];
            continue;
        }
        // `super::super::x` climbs once per `super`; a file's `super` is its parent module.
        let mut base: Vec<String> = at.to_vec();
        base.pop();
        while let Some(next) = rest.strip_prefix("super::") {
            rest = next;
            if rest.starts_with("super::") {
                base.pop();
            }
        }
        out.extend(segments(base, rest));
    }
    out
}

/// The inner rules of the store (`cargo xtask house`): `store/rules` names only the model and
/// the errors; `store/embedded` and `store/nats` never name each other; and no circle of files
/// names each other (a file naming an item of a module above it, its parent's shared types,
/// is not counted). Tests (after a line starting `#[cfg(test)]`) and comments are not read.
fn store_rules(store: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    rust_files(store, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(store, f), f.clone()))
        .collect();
    let mut found = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (at, file) in &modules {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let shown = file
            .strip_prefix(root())
            .unwrap_or(file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("#[cfg(test)]") {
                break;
            }
            if code.starts_with("//") {
                continue;
            }
            for path in store_paths(line, at) {
                let Some(first) = path.first() else { continue };
                let top = at.first().map(String::as_str);
                if top == Some("rules") && !rules_may_name(first) {
                    found.push(format!(
                        "{shown}:{}: the rules name `store::{}`; they may name only the model and the errors",
                        n + 1,
                        path.join("::")
                    ));
                }
                for (from, of) in [("embedded", "nats"), ("nats", "embedded")] {
                    if top == Some(from) && first == of {
                        found.push(format!(
                            "{shown}:{}: the {from} backend names `store::{}`",
                            n + 1,
                            path.join("::")
                        ));
                    }
                }
                // The deepest module the path names.
                let mut target = Vec::new();
                for segment in &path {
                    target.push(segment.clone());
                    if !modules.contains_key(&target) {
                        target.pop();
                        break;
                    }
                }
                if !target.is_empty() && !at.starts_with(&target) {
                    edges.entry(at.clone()).or_default().insert(target);
                }
            }
        }
    }
    for circle in circles(&edges) {
        let names: Vec<String> = circle
            .iter()
            .map(|m| {
                modules.get(m).map_or(m.join("/"), |f| {
                    f.strip_prefix(root()).unwrap_or(f).display().to_string()
                })
            })
            .collect();
        found.push(format!(
            "these files name each other in a circle: {}",
            names.join(", ")
        ));
    }
    Ok(found)
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a [String], (usize, usize)>,
        stack: Vec<&'a [String]>,
        on_stack: BTreeSet<&'a [String]>,
        out: Vec<Vec<Vec<String>>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a [String]) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            self.on_stack.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                let w = w.as_slice();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.index[w].1;
                    if let Some(e) = self.index.get_mut(v) {
                        e.1 = e.1.min(low);
                    }
                } else if self.on_stack.contains(w) {
                    let idx = self.index[w].0;
                    if let Some(e) = self.index.get_mut(v) {
                        e.1 = e.1.min(idx);
                    }
                }
            }
            let (idx, low) = self.index[v];
            if idx == low {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_vec());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_slice()) {
            walk.visit(v);
        }
    }
    walk.out
}

/// `package version -> features` as `cargo tree` resolves them for the host, with or without its
/// dev-dependencies (the test build's extra edges).
fn resolved_features(with_dev: bool) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut cmd = cargo();
    cmd.current_dir(root()).args([
        "tree", "--quiet", "-p", "homing", "--prefix", "none", "-f", "{p} {f}",
    ]);
    if !with_dev {
        cmd.args(["-e", "no-dev"]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run cargo tree: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim_end_matches(" (*)");
        let mut parts = line.splitn(3, ' ');
        let (Some(name), Some(version)) = (parts.next(), parts.next()) else {
            continue;
        };
        // `(proc-macro)` and a path source follow the version; features come last, comma-separated.
        let features = parts
            .next()
            .unwrap_or("")
            .rsplit(' ')
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|f| !f.is_empty() && !f.starts_with('('))
            .map(str::to_owned);
        map.entry(format!("{name} {version}"))
            .or_default()
            .extend(features);
    }
    Ok(map)
}

/// `cargo xtask features`: fails when a crate both builds use has more features in the test
/// build, naming the crate and the features for `hack/Cargo.toml`.
pub fn same_features() -> Result<()> {
    let normal = resolved_features(false)?;
    let test = resolved_features(true)?;
    let mut differ = Vec::new();
    for (package, features) in &normal {
        if let Some(in_test) = test.get(package)
            && in_test != features
        {
            let extra: Vec<&str> = in_test.difference(features).map(String::as_str).collect();
            let missing: Vec<&str> = features.difference(in_test).map(String::as_str).collect();
            differ.push(format!(
                "{package}: the test build adds [{}]{}",
                extra.join(", "),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(" and lacks [{}]", missing.join(", "))
                }
            ));
        }
    }
    if differ.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the test build resolves shared crates with other features than `cargo build`, so it \
         would compile them (and what depends on them, wasmtime included) again; list these \
         features in hack/Cargo.toml ([build-dependencies] for proc-macro helpers like syn):\n  {}",
        differ.join("\n  ")
    ))
}

/// Whether a line of cargo's output says it compiles wasmtime or cranelift.
pub fn compiles_wasmtime(line: &str) -> bool {
    let line = line.trim_start();
    line.strip_prefix("Compiling ")
        .is_some_and(|rest| rest.starts_with("wasmtime") || rest.starts_with("cranelift"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_modules_a_line_names() {
        assert_eq!(named_modules("use crate::store::Store;"), ["store"]);
        assert_eq!(
            named_modules("use crate::{config::Config, runtime};"),
            ["config", "runtime"]
        );
        assert_eq!(
            named_modules("/// see [`x`](crate::claim::Handle) and crate::api"),
            ["claim", "api"]
        );
        assert!(named_modules("$crate::foo; my_crate::bar").is_empty());
        assert_eq!(
            named_modules("use crate::{api::{self, ApiServer}, config};"),
            ["api", "config"]
        );
    }

    #[test]
    fn finds_the_items_a_line_names_of_a_module() {
        let some = |items: &[&str]| -> Vec<Option<String>> {
            items.iter().map(|i| Some((*i).to_owned())).collect()
        };
        assert_eq!(
            named_items("use crate::api::{AgentInfo, ApiServer};", "api"),
            some(&["AgentInfo", "ApiServer"])
        );
        assert_eq!(
            named_items("let t = crate::api::ApiServer::check_tokens(&c)?;", "api"),
            some(&["ApiServer"])
        );
        assert_eq!(
            named_items("use crate::{api::{self, ApiServer}, config};", "api"),
            vec![None, Some("ApiServer".to_owned())]
        );
        assert_eq!(named_items("use crate::api::*;", "api"), vec![None]);
        assert_eq!(named_items("/// see crate::api.", "api"), vec![None]);
        assert!(named_items("use crate::apis::X; use crate::bench;", "api").is_empty());
    }

    #[test]
    fn the_store_rules_find_a_circle_a_rule_that_names_a_feature_and_a_backend_naming_the_other() {
        let dir = std::env::temp_dir().join(format!("xtask-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["rules", "embedded", "nats"] {
            std::fs::create_dir_all(dir.join(d)).unwrap_or_default();
        }
        let write = |f: &str, text: &str| std::fs::write(dir.join(f), text).unwrap_or_default();
        write("mod.rs", "pub struct StoreError;\n");
        write("model.rs", "");
        write("inbox.rs", "use super::model::X;\n");
        write(
            "rules/mod.rs",
            "use crate::store::model::Dispatch;\nuse crate::store::StoreError;\n",
        );
        write("embedded/mod.rs", "use super::inbox::Y;\n");
        write(
            "embedded/a.rs",
            "use super::b::B;\nuse super::EmbeddedStore;\n",
        );
        write("embedded/b.rs", "use super::rows::db;\n");
        write("embedded/rows.rs", "");
        write("nats/mod.rs", "");
        assert_eq!(store_rules(&dir), Ok(vec![]));
        write(
            "embedded/rows.rs",
            "use super::{a::A, c};\n#[cfg(test)]\nuse super::b::B;\n",
        );
        let found = store_rules(&dir).unwrap_or_default();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("embedded/a.rs")
                && found[0].contains("embedded/b.rs")
                && found[0].contains("embedded/rows.rs"),
            "{found:?}"
        );
        write("embedded/rows.rs", "");
        write("rules/mod.rs", "use crate::store::inbox::follow;\n");
        write(
            "nats/mod.rs",
            "// crate::store::embedded in a comment\nuse crate::store::embedded::Y;\n",
        );
        let found = store_rules(&dir).unwrap_or_default();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("nats/mod.rs:2"), "{found:?}");
        assert!(
            found[1].contains("rules/mod.rs:1") && found[1].contains("inbox"),
            "{found:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_host_source_passes_and_an_upward_use_fails() {
        let dir = std::env::temp_dir().join(format!("xtask-house-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("store")).unwrap_or_default();
        std::fs::write(dir.join("store/mod.rs"), "use crate::config::Config;\n")
            .unwrap_or_default();
        std::fs::write(dir.join("config.rs"), "").unwrap_or_default();
        assert_eq!(upward_uses(&dir), Ok(vec![]));
        std::fs::write(
            dir.join("store/mod.rs"),
            "use crate::config::Config;\nuse crate::telemetry;\n",
        )
        .unwrap_or_default();
        let found = upward_uses(&dir).unwrap_or_default();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("mod.rs:2"), "{found:?}");
        // The CLI may name of the API only what starts the server.
        std::fs::write(dir.join("store/mod.rs"), "").unwrap_or_default();
        std::fs::write(dir.join("api.rs"), "").unwrap_or_default();
        std::fs::write(dir.join("cli.rs"), "use crate::api::ApiServer;\n").unwrap_or_default();
        assert_eq!(upward_uses(&dir), Ok(vec![]));
        std::fs::write(dir.join("cli.rs"), "use crate::api::{ApiServer, ops};\n")
            .unwrap_or_default();
        let found = upward_uses(&dir).unwrap_or_default();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("`crate::api::ops`"), "{found:?}");
        std::fs::write(dir.join("gadget.rs"), "").unwrap_or_default();
        assert!(upward_uses(&dir).is_err(), "an unplaced module fails");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn spots_a_wasmtime_compile_line() {
        assert!(compiles_wasmtime("   Compiling wasmtime v48.0.8"));
        assert!(compiles_wasmtime("   Compiling cranelift-codegen v0.125.8"));
        assert!(!compiles_wasmtime(
            "   Compiling homing v0.1.0 (/work/host)"
        ));
        assert!(!compiles_wasmtime("    Finished `release` profile"));
    }
}
