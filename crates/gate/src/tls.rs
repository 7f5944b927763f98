//! TLS for the gate's listeners (the review page, and the agents' endpoint when agents
//! reach it from other machines): a certificate from the configuration's files, or one the
//! gate generates for the host name once and keeps in the data directory, and the
//! fingerprints a person compares between screens, or gives a client to trust.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ListenerTls;

/// The folder of the data directory that keeps a generated certificate and its key.
pub const TLS_DIR: &str = "tls";

/// A listener's TLS, ready to accept connections, and what identifies its certificate.
#[derive(Clone)]
pub struct PageTls {
    /// Accepts a connection's TLS handshake.
    pub acceptor: TlsAcceptor,
    /// SHA-256 of the certificate, in colon-separated hex (as certificate viewers show it).
    pub certificate_sha256: String,
    /// SHA-256 of the certificate's public key (its SubjectPublicKeyInfo), base64: the
    /// form a browser can be told to trust it by.
    pub public_key_sha256: Option<String>,
}

impl std::fmt::Debug for PageTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageTls")
            .field("certificate_sha256", &self.certificate_sha256)
            .finish()
    }
}

/// The TLS of a listener reached at `host`: from the configured files, or generated for
/// `host` in `data_dir` (kept, and used again, at the next start). Its certificate file is
/// [`certificate_file`] when generated.
pub fn load(tls: &ListenerTls, host: &str, data_dir: &Path) -> Result<PageTls, String> {
    let (cert_file, key_file) = match tls {
        ListenerTls::Files { cert, key } => (cert.clone(), key.clone()),
        ListenerTls::SelfSigned => generated(host, data_dir)?,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_file)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| {
            format!(
                "the certificate {} cannot be read ({e}); give a PEM file of the certificate chain",
                cert_file.display()
            )
        })?;
    let first = certs.first().ok_or_else(|| {
        format!(
            "{} holds no certificate; give a PEM file of the certificate chain",
            cert_file.display()
        )
    })?;
    let certificate_sha256 = Sha256::digest(first.as_ref())
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":");
    let key_pem = std::fs::read_to_string(&key_file)
        .map_err(|e| format!("the private key {} cannot be read: {e}", key_file.display()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
        format!(
            "the private key {} is not a PEM private key ({e})",
            key_file.display()
        )
    })?;
    let public_key_sha256 = rcgen::KeyPair::from_pem(&key_pem).ok().map(|pair| {
        use base64::Engine as _;
        use rcgen::PublicKeyData as _;
        base64::engine::general_purpose::STANDARD
            .encode(Sha256::digest(pair.subject_public_key_info()))
    });
    // ring's provider: rustls marks it deprecated for want of post-quantum key exchange,
    // which a page on a person's own network does not need; the provider that has it
    // (aws-lc-rs) needs cmake to build, which the workspace does not otherwise need.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS cannot be set up: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "the certificate {} and key {} do not make a TLS identity ({e}); check that the key is the certificate's",
                cert_file.display(),
                key_file.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(PageTls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        certificate_sha256,
        public_key_sha256,
    })
}

/// Where the certificate generated for `host` is kept in `data_dir`: what a client on
/// another machine is given to trust (`ca_file`, `gate mcp --ca-file`).
pub fn certificate_file(host: &str, data_dir: &Path) -> std::path::PathBuf {
    data_dir.join(TLS_DIR).join(format!("{host}.pem"))
}

/// The generated certificate and key files for `host`, made now unless they exist: a
/// self-signed certificate naming `host` (and `localhost`), the key readable only by the
/// daemon's user.
fn generated(
    host: &str,
    data_dir: &Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let dir = data_dir.join(TLS_DIR);
    let cert = certificate_file(host, data_dir);
    let key = dir.join(format!("{host}.key"));
    if cert.is_file() && key.is_file() {
        return Ok((cert, key));
    }
    let fail = |e: &dyn std::fmt::Display| {
        format!("could not make a certificate in {}: {e}", dir.display())
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(&e))?;
    let mut names = vec![host.to_owned()];
    if host != "localhost" {
        names.push("localhost".to_owned());
    }
    let made = rcgen::generate_simple_self_signed(names).map_err(|e| fail(&e))?;
    write_private(&key, made.signing_key.serialize_pem().as_bytes()).map_err(|e| fail(&e))?;
    std::fs::write(&cert, made.cert.pem()).map_err(|e| fail(&e))?;
    tracing::info!(
        host,
        "web.tls: generated a self-signed certificate for the review page"
    );
    Ok((cert, key))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_is_kept_and_used_again() {
        let dir = std::env::temp_dir().join(format!("gate-web-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = load(&ListenerTls::SelfSigned, "gate.example.org", &dir).expect("made");
        let again = load(&ListenerTls::SelfSigned, "gate.example.org", &dir).expect("kept");
        assert_eq!(first.certificate_sha256, again.certificate_sha256);
        assert_eq!(first.certificate_sha256.len(), 32 * 3 - 1);
        assert!(first.public_key_sha256.is_some());
        let key = dir.join(TLS_DIR).join("gate.example.org.key");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&key).expect("key").permissions(),
        );
        assert_eq!(mode & 0o077, 0, "the key is the daemon's user's alone");
        let other = load(&ListenerTls::SelfSigned, "other.example.org", &dir).expect("made");
        assert_ne!(first.certificate_sha256, other.certificate_sha256);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_that_are_not_a_certificate_are_refused_naming_them() {
        let dir = std::env::temp_dir().join(format!("gate-web-tls-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, "not a certificate").expect("written");
        std::fs::write(&key, "not a key").expect("written");
        let error = load(&ListenerTls::Files { cert, key }, "x", &dir).expect_err("refused");
        assert!(error.contains("cert.pem holds no certificate"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
