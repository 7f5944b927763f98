//! TLS for HTTPS clients: downstream MCP servers reached by `https://` URLs, and the stdio
//! bridge to a daemon that serves TLS. rustls on ring, trusting the system's roots and,
//! when given, a CA file of the server's own (a company's CA, or the certificate of a
//! gate whose agents' listener generated its own).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

/// An HTTP client whose TLS trusts the system's roots and the certificates in `ca_file`.
/// `Err` says which file could not be used and why. Every HTTP client of the workspace is
/// made here (or from [`builder`]): the HTTP library carries no TLS provider of its own.
pub fn client(ca_file: Option<&Path>) -> Result<reqwest::Client, String> {
    builder(ca_file)?
        .build()
        .map_err(|e| format!("the HTTP client cannot be built: {e}"))
}

/// [`client`]'s builder, for a caller that sets more (timeouts, proxies).
pub fn builder(ca_file: Option<&Path>) -> Result<reqwest::ClientBuilder, String> {
    let mut roots = rustls::RootCertStore::empty();
    // The system's store: a certificate it cannot parse is skipped, as browsers do.
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if let Some(file) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| {
                format!(
                    "the CA file {} cannot be read ({e}); give a PEM file of the certificates to trust",
                    file.display()
                )
            })?;
        if certs.is_empty() {
            return Err(format!(
                "the CA file {} holds no certificate; give a PEM file of the certificates to trust",
                file.display()
            ));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| {
                format!(
                    "a certificate in the CA file {} cannot be trusted: {e}",
                    file.display()
                )
            })?;
        }
    } else if added == 0 {
        tracing::warn!(
            "tls: this system offers no trusted root certificates (install the ca-certificates package); only servers with a ca_file can be reached over https"
        );
    }
    // ring's provider: rustls marks it deprecated for want of post-quantum key exchange;
    // the provider that has it (aws-lc-rs) needs cmake to build, which nothing else needs.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS cannot be set up: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(reqwest::Client::builder().tls_backend_preconfigured(config))
}

/// Why `url` cannot be reached over TLS, when that is why: a request made to it with the
/// same trust, whose failure is about the server's certificate or the TLS handshake. The
/// MCP client's own error does not carry its causes, so a failed handshake asks again here.
pub async fn certificate_refusal(url: &str, ca_file: Option<&Path>) -> Option<String> {
    if !url.starts_with("https://") {
        return None;
    }
    let client = client(ca_file).ok()?;
    let request = client.get(url).send();
    let error = match tokio::time::timeout(std::time::Duration::from_secs(10), request).await {
        Ok(Err(error)) => error,
        _ => return None,
    };
    let mut causes = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(&error);
    while let Some(next) = cause {
        causes.push(next.to_string());
        cause = next.source();
    }
    let text = causes.join(": ");
    let lower = text.to_ascii_lowercase();
    (lower.contains("certificate") || lower.contains("handshake")).then(|| {
        format!(
            "its TLS certificate was not accepted ({}); if a CA of your own signed it, give that CA's PEM file as ca_file = \"/path/ca.pem\" in the server's table",
            causes.last().map_or(text.as_str(), String::as_str)
        )
    })
}
