//! TLS on the MCP and admin listeners: rustls, TLS 1.2 and 1.3, ALPN `h2`
//! and `http/1.1`, a certificate that can change without a restart, and
//! optionally client certificates (mTLS) checked against a CA.
//!
//! [`Certificates`] is the server's certificate resolver: every handshake
//! takes the certificate current at that moment, so a new one (files
//! changed on disk, or SIGHUP) applies to new connections while those open
//! go on with the one they started with. A certificate or key that cannot
//! be read or does not match keeps the previous one, with a warning.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

/// How often the certificate files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// The listener's certificate, as its files last said.
#[derive(Debug)]
pub struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// The files' modification times when last loaded, and when last
    /// found unusable (not tried again, nor warned about, until they change).
    loaded: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
    failed: Mutex<Option<(Option<SystemTime>, Option<SystemTime>)>>,
}

impl Certificates {
    /// Loads the certificate chain and key (PEM); an error if they cannot
    /// be read or do not go together.
    pub fn load(cert: &Path, key: &Path) -> std::io::Result<Arc<Certificates>> {
        let stamps = (modified(cert), modified(key));
        let current = read(cert, key)?;
        Ok(Arc::new(Certificates {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: ArcSwap::from_pointee(current),
            loaded: Mutex::new(stamps),
            failed: Mutex::new(None),
        }))
    }

    /// The acceptor for the listener: TLS 1.2 and 1.3, ALPN `h2` then
    /// `http/1.1`, the certificate from here at each handshake, and client
    /// certificates checked by `clients` (see [`client_verifier`]).
    pub fn acceptor(self: &Arc<Self>, clients: Option<Arc<dyn ClientCertVerifier>>) -> std::io::Result<TlsAcceptor> {
        let builder = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("protocol versions", &e))?;
        let mut config = match clients {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        }
        .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// Loads the files again (`force`: even if their times did not change).
    /// Returns whether a new certificate is in use.
    pub fn reload(&self, force: bool) -> bool {
        let stamps = (modified(&self.cert), modified(&self.key));
        if !force
            && (*self.loaded.lock().expect("lock") == stamps || *self.failed.lock().expect("lock") == Some(stamps))
        {
            return false;
        }
        match read(&self.cert, &self.key) {
            Ok(fresh) => {
                self.current.store(Arc::new(fresh));
                *self.loaded.lock().expect("lock") = stamps;
                *self.failed.lock().expect("lock") = None;
                tracing::info!(cert = %self.cert.display(), "TLS certificate loaded; new connections use it");
                true
            }
            Err(e) => {
                // Half-written files (a renewal in progress) are tried again
                // once they change; a bad file is warned about once.
                *self.failed.lock().expect("lock") = Some(stamps);
                tracing::warn!(error = %e, "TLS certificate not reloaded; the previous one stays in use");
                false
            }
        }
    }

    /// Reloads whenever the files change (looked at every [`WATCH_EVERY`])
    /// and on SIGHUP, until `stop`.
    pub async fn watch(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let hung_up = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut stop => return,
                _ = tick.tick() => { self.reload(false); }
                _ = hung_up => { self.reload(true); }
            }
        }
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Client certificates for a listener: they must chain to a certificate
/// of the `ca` bundle (PEM) and be valid now for client authentication.
/// Without `required`, a client may present none (and authenticate some
/// other way); one it presents must verify, else the handshake fails.
pub fn client_verifier(ca: &Path, required: bool) -> std::io::Result<Arc<dyn ClientCertVerifier>> {
    use rustls::pki_types::pem::PemObject;
    let bad = |e: &dyn std::fmt::Display| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("cannot use {}: {e}", ca.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).map_err(|e| bad(&e))? {
        roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
    }
    if roots.is_empty() {
        return Err(bad(&"no certificate in the file"));
    }
    let builder = WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    );
    let builder = if required { builder } else { builder.allow_unauthenticated() };
    builder.build().map_err(|e| bad(&e))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn invalid(what: &str, e: &dyn std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("server TLS {what}: {e}"))
}

/// The certificate chain and key in these files, checked to go together.
fn read(cert: &Path, key: &Path) -> std::io::Result<CertifiedKey> {
    let (certs, key) = switchboard_core::tls::read_pem(cert, key, "server TLS")?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider.key_provider.load_private_key(key).map_err(|e| invalid("key", &e))?;
    let certified = CertifiedKey::new(certs, signing);
    certified.keys_match().map_err(|e| invalid("certificate and key", &e))?;
    Ok(certified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_are_asked_for_and_required_only_when_configured() {
        let dir = std::env::temp_dir().join(format!("sb-mtls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=clients"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let optional = client_verifier(&dir.join("ca.pem"), false).unwrap();
        assert!(optional.offer_client_auth() && !optional.client_auth_mandatory());
        let required = client_verifier(&dir.join("ca.pem"), true).unwrap();
        assert!(required.offer_client_auth() && required.client_auth_mandatory());
        std::fs::write(dir.join("empty.pem"), "").unwrap();
        let err = client_verifier(&dir.join("empty.pem"), false).err().unwrap().to_string();
        assert!(err.contains("empty.pem") && err.contains("no certificate"), "{err}");
    }

    #[test]
    fn a_bad_certificate_keeps_the_previous_one_and_is_tried_again_only_once_changed() {
        let dir = std::env::temp_dir().join(format!("sb-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).current_dir(&dir).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-x509", "-days", "1"];
        run(&[&["req"][..], &ec, &["-keyout", "k.pem", "-out", "c.pem", "-subj", "/CN=a"]].concat());
        let certs = Certificates::load(&dir.join("c.pem"), &dir.join("k.pem")).unwrap();
        let first = certs.current.load_full();
        assert!(!certs.reload(false), "unchanged files are not read again");
        // A key that does not go with the certificate.
        run(&[&["req"][..], &ec, &["-keyout", "k.pem", "-out", "other.pem", "-subj", "/CN=b"]].concat());
        assert!(!certs.reload(true));
        assert!(Arc::ptr_eq(&first, &certs.current.load_full()), "the previous certificate stays");
        assert!(certs.failed.lock().unwrap().is_some());
        assert!(!certs.reload(false), "not tried again until the files change");
        // The matching certificate arrives.
        std::fs::copy(dir.join("other.pem"), dir.join("c.pem")).unwrap();
        assert!(certs.reload(true));
        assert!(!Arc::ptr_eq(&first, &certs.current.load_full()));
        assert!(certs.failed.lock().unwrap().is_none());
    }
}
