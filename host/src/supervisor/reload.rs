//! What starts a reload besides SIGHUP and the API: a watch on the config file and every
//! plugin's component, debounced so one build that writes a file several times reloads once.
//!
//! The directories holding the files are watched rather than the files: editors and build tools
//! replace a file by renaming a new one over it, which a watch on the file itself loses.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tracing::{debug, warn};

use super::Reloader;
use crate::config::Config;

/// How long the watch waits after a change for more before it asks for a reload.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// A running watch; dropping it stops it.
pub struct Watch {
    watcher: notify::RecommendedWatcher,
    dirs: HashSet<PathBuf>,
    files: std::sync::Arc<std::sync::RwLock<HashSet<PathBuf>>>,
}

impl Watch {
    /// Watches the files of `config`, asking `reloader` to reload when one changes.
    ///
    /// # Errors
    ///
    /// When the system's file watch cannot be set up.
    pub fn start(config: &Config, reloader: Reloader) -> anyhow::Result<Watch> {
        let files = std::sync::Arc::new(std::sync::RwLock::new(HashSet::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let wanted = files.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else {
                return;
            };
            if matches!(event.kind, notify::EventKind::Access(_)) {
                return;
            }
            let Ok(wanted) = wanted.read() else {
                return;
            };
            if event.paths.iter().any(|p| wanted.contains(&normal(p))) {
                let _ = tx.send(());
            }
        })?;
        tokio::spawn(async move {
            while rx.recv().await.is_some() {
                // Collect the rest of the burst, then reload once.
                while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                debug!("a watched file changed; reloading");
                reloader.ask("file change");
            }
        });
        let mut watch = Watch {
            watcher,
            dirs: HashSet::new(),
            files,
        };
        watch.follow(config);
        Ok(watch)
    }

    /// Follows the files of `config` (after a reload added or moved a plugin).
    pub fn follow(&mut self, config: &Config) {
        let files: HashSet<PathBuf> = super::fleet::watched_files(config)
            .iter()
            .map(|p| normal(p))
            .collect();
        for file in &files {
            let Some(dir) = file.parent().map(Path::to_path_buf) else {
                continue;
            };
            if self.dirs.contains(&dir) {
                continue;
            }
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.dirs.insert(dir);
                }
                Err(e) => warn!("cannot watch {}: {e}", dir.display()),
            }
        }
        if let Ok(mut wanted) = self.files.write() {
            *wanted = files;
        }
    }
}

/// A path made absolute, so the watch's paths and the config's compare equal.
fn normal(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// What a reload cannot apply and says so: `[store]`, `[api]` and `[telemetry]` changes, and
/// the `[host]` keys read once at start.
pub fn restart_only(old: &Config, new: &Config) -> Vec<String> {
    let mut notes = Vec::new();
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    if differs(&old.store, &new.store) {
        notes.push("[store] changed: a restart applies it; the host keeps its store".to_owned());
    }
    if differs(&old.api, &new.api) {
        notes.push("[api] changed: a restart applies it".to_owned());
    }
    if differs(&old.host, &new.host) {
        notes.push(
            "[host] changed: drain_timeout and keep_versions apply from this reload; the rest at a restart"
                .to_owned(),
        );
    }
    notes
}
