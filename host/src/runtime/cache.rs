//! The compiled-component cache.
//!
//! Compiling a component costs 50 ms for a small Rust guest and about 9 s for a 12-18 MB Python
//! or JavaScript guest; loading the compiled artifact costs milliseconds. Artifacts are keyed by
//! the SHA-256 of the component's bytes and by the engine's compatibility hash (wasmtime version,
//! target, and every setting that changes code generation), so a changed plugin or a changed
//! engine never loads a stale artifact. Files are written to a temporary name and renamed, so a
//! crash mid-write leaves no half artifact under the real name; an artifact that fails to load
//! anyway is recompiled and replaced.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::WasmContext;
use sha2::{Digest, Sha256};
use tracing::{info, warn};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where the artifact of `bytes` for `engine` lives under `dir`.
pub fn artifact_path(engine: &Engine, bytes: &[u8], dir: &Path) -> PathBuf {
    artifact_of(engine, &Sha256::digest(bytes).into(), dir)
}

/// Where the artifact of the component whose SHA-256 is `digest` lives under `dir`.
fn artifact_of(engine: &Engine, digest: &[u8; 32], dir: &Path) -> PathBuf {
    let content: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    dir.join(format!("{content}-{:016x}.cwasm", hasher.finish()))
}

/// Loads the component at `path`, from the cache when a matching artifact exists; returns it
/// with the SHA-256 (hex) of the bytes it was compiled from, read once: what runs, whatever
/// the file holds later.
///
/// # Errors
///
/// When the file cannot be read, is not a regular file, is over `max_size` bytes (`[host]
/// max_component_size`), or is not a valid component.
pub fn load(
    engine: &Engine,
    path: &Path,
    dir: &Path,
    plugin: &str,
    max_size: u64,
) -> anyhow::Result<(Component, String)> {
    let bytes = read_component(path, max_size).with_context(|| format!("plugin `{plugin}`"))?;
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    let sha256: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let artifact = artifact_of(engine, &digest, dir);
    if artifact.exists() {
        match deserialize(engine, &artifact) {
            Ok(component) => {
                info!(plugin, artifact = %artifact.display(), "compiled component loaded from cache");
                return Ok((component, sha256));
            }
            Err(e) => {
                warn!(plugin, artifact = %artifact.display(), "cached artifact unusable, recompiling: {e:#}")
            }
        }
    }
    info!(
        plugin,
        size_mb = format!("{:.1}", bytes.len() as f64 / 1e6),
        "compiling the component for this machine (once per build of it; a Python or JavaScript \
         agent takes 10-20 s, a Rust one well under a second)"
    );
    let started = std::time::Instant::now();
    let compiled = engine.precompile_component(&bytes).wasm_context(|| {
        format!(
            "plugin `{plugin}`: {} is not a valid component",
            path.display()
        )
    })?;
    info!(
        plugin,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "component compiled (cache miss)"
    );
    if let Err(e) = write_atomically(&artifact, &compiled) {
        warn!(plugin, dir = %dir.display(), "cannot write the compiled-component cache: {e:#}");
    }
    // SAFETY: `compiled` was produced by `precompile_component` of this very engine a moment
    // ago, in this process; it is exactly the trusted input `deserialize` requires.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, &compiled) }?;
    Ok((component, sha256))
}

/// The bytes of the component file at `path`, refused by name when it is a special file and
/// before reading when it is over `max_size` bytes.
///
/// # Errors
///
/// As [`crate::input::read_file_capped`].
pub fn read_component(path: &Path, max_size: u64) -> anyhow::Result<Vec<u8>> {
    Ok(crate::input::read_file_capped(
        path,
        max_size,
        "the component",
        "[host] max_component_size",
    )?)
}

fn deserialize(engine: &Engine, artifact: &Path) -> anyhow::Result<Component> {
    // SAFETY: the cache directory is the host's own, artifacts are only ever written by
    // `write_atomically` below from `precompile_component` output, and the file name binds the
    // content hash and the engine compatibility hash; wasmtime also checks the header (version,
    // target, settings) and refuses a mismatch. A user who can write the cache directory can
    // already replace the plugin itself.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize_file(engine, artifact) }?;
    Ok(component)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().context("artifact path has no directory")?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("artifact"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
