//! TLS pieces every layer shares: PEM files read with errors that name
//! them, and the client configuration the router uses towards others
//! (upstreams, authorization servers): the platform's roots plus any CA
//! the configuration adds, certificate verification always on, an optional
//! client certificate.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate chain and its private key, from PEM files; `which` names
/// them in errors ("server TLS", "upstream github client certificate").
#[allow(clippy::type_complexity)]
pub fn read_pem(
    cert: &Path,
    key: &Path,
    which: &str,
) -> std::io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{which} {what}: {e}"))
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| invalid(&format!("certificate {}", cert.display()), &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(&format!("certificate {}", cert.display()), &e))?;
    if certs.is_empty() {
        return Err(invalid("certificate", &format!("no certificate in {}", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid(&format!("key {}", key.display()), &e))?;
    Ok((certs, key))
}

/// The certificates of a PEM bundle.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| format!("not PEM: {e}"))
}

/// The platform's trusted roots, read once.
fn platform_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| rustls_native_certs::load_native_certs().certs)
}

/// A TLS client configuration: the platform's roots and the certificates
/// of `extra_ca` (PEM) trusted, `client` (chain and key) presented when a
/// server asks, and these ALPN protocols offered. Server certificates are
/// always verified (name and chain).
pub fn client_config(
    extra_ca: Option<&[u8]>,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in platform_roots() {
        // A platform root rustls cannot use is skipped, as browsers do.
        let _ = roots.add(cert.clone());
    }
    if let Some(pem) = extra_ca {
        let certs = pem_certificates(pem)?;
        if certs.is_empty() {
            return Err("the CA file holds no certificate".into());
        }
        for cert in certs {
            roots.add(cert).map_err(|e| format!("a CA certificate cannot be used: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match client {
        Some((chain, key)) => {
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("the client certificate: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
