//! Client TLS for the host's own outbound connections: guests' HTTPS requests
//! (`runtime::outbound`) and the trace exporter (`telemetry::otlp`).
//!
//! One setup: rustls on ring, the built-in web roots, plus the PEM certificates of the
//! configured `tls_ca` files (each read with a bound). A leaf module: it uses only
//! [`input`](crate::input), so every layer may use it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use rustls::pki_types::CertificateDer;

/// The largest CA file read.
const MAX_CA_FILE: u64 = 1 << 20;

/// A TLS client setup trusting the web roots and the certificates in `ca_files`.
///
/// # Errors
///
/// When a CA file cannot be read or holds no usable certificate.
pub fn client_config(ca_files: &[PathBuf]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    Ok(Arc::new(config_with(read_ca_files(ca_files)?)?))
}

/// The certificates of `files`, each a PEM file of at most 1 MiB holding at least one.
///
/// # Errors
///
/// When a file cannot be read, is not PEM, or holds no certificate, naming the file.
pub fn read_ca_files(files: &[PathBuf]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let mut out = Vec::new();
    for path in files {
        let bytes = crate::input::read_file_capped(path, MAX_CA_FILE, "the CA file", "1 MiB")
            .with_context(|| format!("tls_ca {}", path.display()))?;
        let mut found = 0;
        for cert in CertificateDer::pem_slice_iter(&bytes) {
            let cert =
                cert.with_context(|| format!("tls_ca {}: not a PEM certificate", path.display()))?;
            out.push(cert);
            found += 1;
        }
        if found == 0 {
            bail!("tls_ca {}: holds no PEM certificate", path.display());
        }
    }
    Ok(out)
}

/// A TLS client setup trusting the web roots and `extra` (from [`read_ca_files`]), speaking
/// HTTP/1.1.
///
/// # Errors
///
/// When a certificate is not a usable trust anchor.
pub fn config_with(extra: Vec<CertificateDer<'static>>) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in extra {
        roots
            .add(cert)
            .context("tls_ca: a certificate is not a usable trust anchor")?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS setup")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
