//! `homing dev`: the host for agent authors. It runs `homing run` on a config with the file
//! watch on, and watches the source folder of every plugin built by `homing build` (a plugin
//! whose `path` is `<folder>/build/<name>.wasm` with an agent project in `<folder>`): a change
//! there rebuilds that agent, and the host's own watch swaps the new component in when the build
//! writes it. A failed build prints why and leaves the running version serving. Each dispatch's
//! outcome is printed as it finishes (the host's `dispatch finished` line, with its version).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tracing::{info, warn};

use crate::config::Config;

/// How long a source change waits for more before the agent is rebuilt.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Folders and files whose changes never rebuild: build outputs, dependencies, tool caches.
const IGNORED: &[&str] = &[
    "build",
    "target",
    "node_modules",
    ".venv",
    "__pycache__",
    ".git",
    ".homing",
];

/// The agent project folders of `config`'s plugins: those whose component is
/// `<folder>/build/<name>.wasm` and whose folder `homing build` recognises.
pub fn projects(config: &Config) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for plugin in config.plugins.values() {
        let path = config.resolve(&plugin.path);
        let Some(build) = path.parent() else {
            continue;
        };
        if build.file_name().and_then(|n| n.to_str()) != Some("build") {
            continue;
        }
        let Some(dir) = build.parent() else {
            continue;
        };
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if super::build::is_project(&dir) && !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// The files whose changes rebuild: sources, manifests and WIT. `homing.toml` is not one (the
/// host reloads it itself), nor is the store kept beside it.
const SOURCES: &[&str] = &["rs", "py", "js", "mjs", "ts", "wit", "json"];
const MANIFESTS: &[&str] = &["Cargo.toml", "pyproject.toml"];

/// Whether a changed path should rebuild its project (`dir`).
fn counts(dir: &Path, changed: &Path) -> bool {
    let Ok(rel) = changed.strip_prefix(dir) else {
        return false;
    };
    if rel.components().any(|c| {
        c.as_os_str()
            .to_str()
            .is_some_and(|name| IGNORED.contains(&name))
    }) {
        return false;
    }
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    MANIFESTS.contains(&name)
        || rel
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| SOURCES.contains(&e))
}

/// Builds every project once, then rebuilds each when its sources change, until the process
/// ends. Builds run one at a time, off the async workers.
///
/// # Errors
///
/// When the source watch cannot be set up.
pub fn watch_sources(dirs: Vec<PathBuf>) -> anyhow::Result<notify::RecommendedWatcher> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PathBuf>();
    let watched = dirs.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            return;
        };
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        for path in &event.paths {
            for dir in &watched {
                if counts(dir, path) {
                    let _ = tx.send(dir.clone());
                }
            }
        }
    })?;
    for dir in &dirs {
        watcher.watch(dir, RecursiveMode::Recursive)?;
        info!("watching {} for changes", dir.display());
    }
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut pending: HashSet<PathBuf> = HashSet::from([first]);
            while let Ok(Some(more)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                pending.insert(more);
            }
            for dir in pending {
                info!("sources changed in {}; rebuilding", dir.display());
                let built = tokio::task::spawn_blocking({
                    let dir = dir.clone();
                    move || super::build::run(&dir)
                })
                .await;
                match built {
                    Ok(Ok(())) => info!("rebuilt {}; the host swaps it in", dir.display()),
                    Ok(Err(e)) => warn!(
                        "the build of {} failed; the running version keeps serving: {e:#}",
                        dir.display()
                    ),
                    Err(e) => warn!("the build of {} did not finish: {e}", dir.display()),
                }
            }
        }
    });
    Ok(watcher)
}

/// Builds each project once before the host starts, so it serves what the sources say.
///
/// # Errors
///
/// When a build fails (the host has nothing to serve for it).
pub fn build_all(dirs: &[PathBuf]) -> anyhow::Result<()> {
    for dir in dirs {
        super::build::run(dir)?;
    }
    Ok(())
}
