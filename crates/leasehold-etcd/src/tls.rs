//! TLS for the etcd store: the client's TLS options made from the PEM files the URL
//! names, and its handshake failures as the core's [`TlsFailure`] (with the etcd URL's
//! parameters as the hint).

use std::path::Path;

use etcd_client::{Certificate, Identity, TlsOptions};
use leasehold_core::{StoreError, StoreErrorKind};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSettings;
use crate::error::err;

pub use leasehold_core::tls::{TlsFailure, TlsProblem};

/// The error for `e`, the failure of a first connection: when the URL is plaintext and
/// the failure is an unreachable member, a host of the URL that speaks only TLS makes it a
/// [`TlsProblem::PlaintextRefused`] error (`tls=true`); otherwise `e` itself. Asked within
/// the connect timeout, at most a second.
pub(crate) async fn plaintext_refused(config: &crate::EtcdConfig, e: StoreError) -> StoreError {
    leasehold_core::tls_session::plaintext_refused_tls_param(
        crate::BACKEND,
        e,
        config.uses_tls(),
        config.endpoints(),
        config.connect_bound(),
    )
    .await
}

/// The etcd URL parameters that fix `problem`.
fn hint(problem: TlsProblem) -> &'static str {
    leasehold_core::tls_session::tls_param_hint(
        problem,
        "does the member require a client certificate, cert= and key=, signed by a CA it trusts?",
    )
}

/// The rustls handshake error among the sources of `e`, as a [`TlsFailure`] with the etcd
/// URL's hint; `None` when there is none.
pub(crate) fn find(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    let found = TlsFailure::find_rustls(e)?;
    let problem = found.problem();
    Some(found.with_hint(hint(problem)))
}

/// A `Config` error for a TLS file, with its [`TlsFailure`] as the source.
fn file_error(what: &str, path: &Path, problem: &str) -> StoreError {
    let failure = TlsFailure::new(
        TlsProblem::Files,
        None,
        format!("the {what} {} {problem}", path.display()),
    )
    .with_hint(hint(TlsProblem::Files));
    err(StoreErrorKind::Config, failure.to_string()).with_source(failure)
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| file_error(what, path, &format!("cannot be read ({e})")))
}

/// The client's TLS options from `settings`, every file read and checked now, so that a
/// wrong file is reported by `connect` as what it is (the TLS library would report it
/// later, and its parse errors may quote a line of the file). The server name checked is
/// each endpoint's host.
pub(crate) fn options(settings: &TlsSettings) -> Result<TlsOptions, StoreError> {
    let mut tls = TlsOptions::new();
    match &settings.ca_file {
        Some(path) => {
            let pem = read("CA file (cacert)", path)?;
            let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>();
            if !certs.is_ok_and(|c| !c.is_empty()) {
                return Err(file_error(
                    "CA file (cacert)",
                    path,
                    "holds no PEM certificate",
                ));
            }
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    if let Some((cert_path, key_path)) = &settings.client {
        let cert = read("client certificate (cert)", cert_path)?;
        let certs = CertificateDer::pem_slice_iter(&cert).collect::<Result<Vec<_>, _>>();
        if !certs.is_ok_and(|c| !c.is_empty()) {
            return Err(file_error(
                "client certificate (cert)",
                cert_path,
                "holds no PEM certificate",
            ));
        }
        let key = read("client key (key)", key_path)?;
        // The parser's error is dropped: it may quote the file.
        if PrivateKeyDer::from_pem_slice(&key).is_err() {
            return Err(file_error(
                "client key (key)",
                key_path,
                "holds no PEM private key",
            ));
        }
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_that_is_not_a_key_is_named_and_never_quoted() {
        let dir = std::env::temp_dir().join(format!("leasehold-etcd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("bad.key");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nsentinel-key-bytes\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let cert = dir.join("c.crt");
        std::fs::write(&cert, "not pem\n").unwrap();
        let settings = TlsSettings {
            ca_file: None,
            client: Some((cert.clone(), key.clone())),
        };
        let e = options(&settings).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config);
        assert!(e.to_string().contains("c.crt"), "{e}");
        std::fs::write(&cert, CERT).unwrap();
        let e = options(&settings).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(shown.contains("bad.key"), "{shown}");
        assert!(!shown.contains("sentinel-key-bytes"), "{shown}");
        assert_eq!(
            TlsFailure::of(&e).map(TlsFailure::problem),
            Some(TlsProblem::Files)
        );
        let missing = TlsSettings {
            ca_file: Some(dir.join("none.crt")),
            client: None,
        };
        let e = options(&missing).unwrap_err();
        assert!(e.to_string().contains("none.crt"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A certificate (its content does not matter to these checks, only that it is PEM).
    const CERT: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ2j0\n-----END CERTIFICATE-----\n";
}
