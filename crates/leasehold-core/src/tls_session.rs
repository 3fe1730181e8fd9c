//! What a store's server shows of itself over TLS — the protocol version, the cipher, the
//! certificate it presents — read by a handshake of its own, for
//! [`Store::diagnose`](crate::Store::diagnose) and `leasehold doctor` (feature
//! `tls-session`).
//!
//! The clients the stores use (sqlx, the redis crate, tonic, the ZooKeeper client) do not
//! expose the session they negotiated, so a store's diagnosis opens one more connection
//! to the server it uses, does the TLS handshake ([`look`]), reads the session and closes
//! it without sending a byte of the store's protocol over it. The handshake checks
//! nothing: its only use is to read what the server presents; the store's own connections
//! check the certificate as the URL says, and the diagnosis states how. It presents the
//! client certificate of the URL, if any, since a server that requires one refuses the
//! handshake without it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Diagnosis;
use crate::tls::{TlsFailure, TlsProblem};

/// A certificate that ends within this is warned about by [`TlsSession::report`].
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// A client certificate chain and its key, read from PEM files, for servers that require
/// one. `Debug` shows neither the key nor the certificate.
pub struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl ClientIdentity {
    /// The certificate chain in the PEM file `cert` and the private key in the PEM file
    /// `key`. A file that cannot be read or holds no PEM of the right kind is a
    /// [`TlsProblem::Files`] failure naming the file (never its contents).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsFailure> {
        let unusable = |path: &Path, what: &str| {
            TlsFailure::new(
                TlsProblem::Files,
                None,
                format!("{} holds no usable {what}", path.display()),
            )
        };
        let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
            .map_err(|_| unusable(cert, "certificate"))?
            .collect::<Result<_, _>>()
            .map_err(|_| unusable(cert, "certificate"))?;
        if chain.is_empty() {
            return Err(unusable(cert, "certificate"));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|_| unusable(key, "private key"))?;
        Ok(Self { chain, key })
    }

    /// [`from_pem_files`](Self::from_pem_files) for a URL's optional (certificate, key)
    /// pair of files: `None` without one.
    pub fn from_pair(pair: Option<&(PathBuf, PathBuf)>) -> Result<Option<Self>, TlsFailure> {
        pair.map(|(cert, key)| Self::from_pem_files(cert, key))
            .transpose()
    }
}

/// What the server showed in the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSession {
    /// The protocol version, as servers name it: `TLSv1.3`, `TLSv1.2`.
    pub version: String,
    /// The cipher suite, by its IANA name (`TLS13_AES_256_GCM_SHA384`).
    pub cipher: String,
    /// The server's own certificate (the first of the chain it presented), if it could
    /// be read.
    pub peer: Option<PeerCertificate>,
}

/// The parts of a server's certificate an operator looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerCertificate {
    /// The subject's distinguished name (`CN=db.example, O=Example`).
    pub subject: String,
    /// The issuer's distinguished name: the CA that signed it.
    pub issuer: String,
    /// The names it is valid for (its subject alternative names: DNS names and IP
    /// addresses).
    pub names: Vec<String>,
    /// The end of its validity, in seconds since the Unix epoch.
    pub not_after: i64,
}

impl PeerCertificate {
    /// The certificate's parts, from its DER; `None` if it does not parse.
    pub fn from_der(der: &[u8]) -> Option<Self> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let mut names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) => names.push((*n).to_owned()),
                    GeneralName::IPAddress(ip) => {
                        if let Ok(v4) = <[u8; 4]>::try_from(*ip) {
                            names.push(std::net::Ipv4Addr::from(v4).to_string());
                        } else if let Ok(v6) = <[u8; 16]>::try_from(*ip) {
                            names.push(std::net::Ipv6Addr::from(v6).to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        Some(Self {
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            names,
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// How long it is still valid at `now` (negative: expired that long ago), in seconds.
    pub fn seconds_left(&self, now: SystemTime) -> i64 {
        let now = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        self.not_after.saturating_sub(now)
    }
}

/// The date (UTC, `YYYY-MM-DD`) of `secs` since the Unix epoch (`?` beyond the years
/// -9999 to 9999).
fn date(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .map_or_else(|_| "?".to_owned(), |t| t.date().to_string())
}

impl TlsSession {
    /// Writes the session into `d` as the facts `TLS` (version and cipher) and `peer
    /// certificate` (subject, issuer, names, end of validity, then `checked`: how the
    /// store's own connections check it, e.g. "checked against the URL's CA and the
    /// host"), and warns when the certificate has expired or ends within
    /// [`EXPIRY_WARNING`] of `now`.
    pub fn report(&self, d: &mut Diagnosis, checked: &str, now: SystemTime) {
        d.fact("TLS", format!("{}, {}", self.version, self.cipher));
        let Some(peer) = &self.peer else {
            d.fact(
                "peer certificate",
                format!("not readable by leasehold; {checked}"),
            );
            return;
        };
        let left = peer.seconds_left(now);
        let until = date(peer.not_after);
        let validity = if left < 0 {
            format!("expired on {until}")
        } else {
            format!("valid until {until} ({} days)", left / 86_400)
        };
        let names = if peer.names.is_empty() {
            "no alternative names".to_owned()
        } else {
            format!("names {}", peer.names.join(", "))
        };
        d.fact(
            "peer certificate",
            format!(
                "{}, issued by {}; {names}; {validity}; {checked}",
                peer.subject, peer.issuer
            ),
        );
        let soon = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
        if left < 0 {
            d.warn(format!(
                "the server's certificate ({}) expired on {until}: every connection that checks \
                 it fails; renew it",
                peer.subject
            ));
        } else if left < soon {
            d.warn(format!(
                "the server's certificate ({}) expires on {until}, in {} days: renew it before \
                 then, or every connection that checks it fails",
                peer.subject,
                left / 86_400
            ));
        }
    }
}

/// Writes the outcome of a [`look`] into `d`: the session's facts
/// ([`TlsSession::report`], at the current time), or, when the look failed, the fact
/// `TLS` saying the connection uses TLS but its session could not be read (and why) and
/// `peer certificate` = `checked`.
#[allow(
    clippy::disallowed_methods,
    reason = "a certificate's validity is a wall-clock date"
)]
pub fn report_look(d: &mut Diagnosis, look: &Result<TlsSession, TlsFailure>, checked: &str) {
    match look {
        Ok(session) => session.report(d, checked, SystemTime::now()),
        Err(why) => {
            d.fact(
                "TLS",
                format!(
                    "on; the session could not be read by a handshake of leasehold's own ({why})"
                ),
            );
            d.fact("peer certificate", checked);
        }
    }
}

/// A verifier that accepts any certificate (still checking the handshake's signatures):
/// the look only reads what the server presents.
#[derive(Debug)]
struct ReadOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for ReadOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Does a TLS handshake on `stream` (already connected, past any plaintext preamble the
/// store's protocol needs before TLS) for `host`, presenting `client` if given, and reads
/// the session; then closes it. Bound it with a timeout: it waits for the server.
///
/// Cancel safe: dropping the future drops the connection.
pub async fn look<S>(
    stream: S,
    host: &str,
    client: Option<&ClientIdentity>,
) -> Result<TlsSession, TlsFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut tls, session) = handshake(stream, host, client).await?;
    close(&mut tls).await;
    Ok(session)
}

/// [`look`], then sends `request` over the session and reads the answer until the server
/// closes the connection (at most `limit` bytes): for a server that answers a plain
/// request on the same port, such as etcd's `GET /health`. Bound it with a timeout.
///
/// Cancel safe: dropping the future drops the connection.
pub async fn look_and_ask<S>(
    stream: S,
    host: &str,
    client: Option<&ClientIdentity>,
    request: &[u8],
    limit: usize,
) -> Result<(TlsSession, Vec<u8>), TlsFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut tls, session) = handshake(stream, host, client).await?;
    let io = io_failure(host);
    tls.write_all(request).await.map_err(&io)?;
    tls.flush().await.map_err(&io)?;
    let answer = read_to_close(&mut tls, limit).await.map_err(&io)?;
    close(&mut tls).await;
    Ok((session, answer))
}

/// Reads until the peer closes (or `limit` bytes): an unclean close after some bytes
/// (many servers skip close_notify) still gives what arrived; one before any byte is an
/// error.
pub async fn read_to_close<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> std::io::Result<Vec<u8>> {
    let mut answer = Vec::new();
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    match r.take(limit).read_to_end(&mut answer).await {
        Ok(_) => Ok(answer),
        Err(e) if !answer.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(answer),
        Err(e) => Err(e),
    }
}

/// A close_notify, so the server logs a closed connection rather than a reset; bounded,
/// since a server may not answer it.
async fn close<S: AsyncRead + AsyncWrite + Unpin>(tls: &mut tokio_rustls::client::TlsStream<S>) {
    let _ = tokio::time::timeout(Duration::from_secs(1), tls.shutdown()).await;
}

/// The client configuration of a look (the [`ReadOnly`] verifier, `client` presented),
/// and `host` as a server name.
fn read_only(
    host: &str,
    client: Option<&ClientIdentity>,
) -> Result<(rustls::ClientConfig, ServerName<'static>), TlsFailure> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let other = |e: rustls::Error| TlsFailure::new(TlsProblem::Other, Some(host), e.to_string());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ReadOnly(provider)));
    let config = match client {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(other)?,
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(host.to_owned()).map_err(|_| {
        TlsFailure::new(
            TlsProblem::Other,
            Some(host),
            "not a host name or IP address",
        )
    })?;
    Ok((config, name))
}

/// Whether the server at `host`:`port` speaks TLS: it answers a ClientHello with a
/// handshake of its own, or with a TLS alert (a server that requires a client certificate
/// refuses this one so). For a store whose plaintext connection failed, to say that the
/// port wants TLS ([`TlsProblem::PlaintextRefused`]) instead of "unreachable". `false`
/// when in doubt: nothing listening, a reset, an answer that is not TLS (a plaintext
/// server's error line), no answer within `within`.
///
/// Cancel safe: dropping the future drops the connection.
pub async fn speaks_tls(host: &str, port: u16, within: Duration) -> bool {
    let attempt = async {
        let Ok((config, name)) = read_only(host, None) else {
            return false;
        };
        let Ok(tcp) = tokio::net::TcpStream::connect((host, port)).await else {
            return false;
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        match connector.connect(name, tcp).await {
            Ok(mut tls) => {
                close(&mut tls).await;
                true
            }
            Err(e) => matches!(
                e.get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
                Some(rustls::Error::AlertReceived(_))
            ),
        }
    };
    tokio::time::timeout(within, attempt).await.unwrap_or(false)
}

/// `host:port` (IPv6 in brackets) as host and port; `None` without a valid port.
pub fn host_port(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host.to_owned(), port.parse().ok()?))
}

/// A store's error for a first connection that failed (`e`) with a plaintext URL: if `e`
/// says the server was unreachable (`Unavailable`, `Timeout`, or `Ambiguous` for a read
/// that checks the connection), the first of `hosts` (host, port) that [`speaks_tls`]
/// makes it a [`StoreErrorKind::Config`](crate::StoreErrorKind::Config) error with a
/// [`TlsProblem::PlaintextRefused`] failure for that host and the store's `hint` (the
/// URL's way to turn TLS on); otherwise `e` itself. Servers that speak only TLS drop a
/// plaintext client without a word, so this is the only way to tell "wrong scheme" from
/// "down". All hosts are asked at once, within `within` and at most a second.
///
/// Cancel safe.
pub async fn plaintext_refused(
    backend: &'static str,
    e: crate::StoreError,
    hosts: &[(String, u16)],
    hint: &'static str,
    within: Duration,
) -> crate::StoreError {
    use crate::StoreErrorKind::{Ambiguous, Timeout, Unavailable};
    if !matches!(e.kind(), Unavailable | Timeout | Ambiguous) {
        return e;
    }
    let within = within.min(Duration::from_secs(1));
    let asked = futures::future::join_all(
        hosts
            .iter()
            .map(|(host, port)| async move { speaks_tls(host, *port, within).await }),
    )
    .await;
    let Some(((host, port), _)) = hosts.iter().zip(asked).find(|(_, tls)| *tls) else {
        return e;
    };
    let failure = TlsFailure::new(
        TlsProblem::PlaintextRefused,
        Some(host),
        format!("port {port} answers only TLS"),
    )
    .with_hint(hint);
    crate::StoreError::new(
        crate::StoreErrorKind::Config,
        backend,
        format!("connecting without TLS: {failure}"),
    )
    .with_source(failure)
}

/// [`plaintext_refused`] for hosts written `host:port` (IPv6 in brackets); one that is
/// not is skipped.
pub async fn plaintext_refused_at(
    backend: &'static str,
    e: crate::StoreError,
    hosts: &[String],
    hint: &'static str,
    within: Duration,
) -> crate::StoreError {
    let hosts: Vec<(String, u16)> = hosts.iter().filter_map(|h| host_port(h)).collect();
    plaintext_refused(backend, e, &hosts, hint, within).await
}

/// The hint, for `problem`, of the stores whose URL turns TLS on with `tls=true` and names
/// its files `cacert=`, `cert=` and `key=` (etcd, ZooKeeper): the parameter that fixes it,
/// or `other` for [`TlsProblem::Other`] (the store's question about a client certificate,
/// naming its servers as the store does); empty for the rest.
pub fn tls_param_hint(problem: TlsProblem, other: &'static str) -> &'static str {
    match problem {
        TlsProblem::UntrustedCertificate => "cacert=",
        TlsProblem::PlaintextRefused => "tls=true",
        TlsProblem::Other => other,
        _ => "",
    }
}

/// [`plaintext_refused_at`] for the stores of [`tls_param_hint`], with its hint
/// (`tls=true`): `e` itself when the URL already `uses_tls`.
///
/// Cancel safe.
pub async fn plaintext_refused_tls_param(
    backend: &'static str,
    e: crate::StoreError,
    uses_tls: bool,
    hosts: &[String],
    within: Duration,
) -> crate::StoreError {
    if uses_tls {
        return e;
    }
    let hint = tls_param_hint(TlsProblem::PlaintextRefused, "");
    plaintext_refused_at(backend, e, hosts, hint, within).await
}

/// `attempt` within `within`: past it, a failure for `host` saying no handshake came.
pub async fn bounded<T>(
    host: &str,
    within: Duration,
    attempt: impl std::future::Future<Output = Result<T, TlsFailure>>,
) -> Result<T, TlsFailure> {
    tokio::time::timeout(within, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(TlsFailure::new(
                TlsProblem::Other,
                Some(host),
                format!("no TLS handshake within {within:?}"),
            ))
        })
}

/// An I/O error on the way to `host`'s handshake, as a failure.
pub fn io_failure(host: &str) -> impl Fn(std::io::Error) -> TlsFailure + '_ {
    move |e| TlsFailure::new(TlsProblem::Other, Some(host), e.to_string())
}

async fn handshake<S>(
    stream: S,
    host: &str,
    client: Option<&ClientIdentity>,
) -> Result<(tokio_rustls::client::TlsStream<S>, TlsSession), TlsFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (config, name) = read_only(host, client)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = connector.connect(name, stream).await.map_err(|e| {
        TlsFailure::find_rustls(&e)
            .unwrap_or_else(|| TlsFailure::new(TlsProblem::Other, None, e.to_string()))
            .or_host(host)
    })?;
    let (_, conn) = tls.get_ref();
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_owned(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_owned(),
        Some(v) => format!("{v:?}"),
        None => "unknown".to_owned(),
    };
    let cipher = conn.negotiated_cipher_suite().map_or_else(
        || "unknown".to_owned(),
        |s| {
            s.suite()
                .as_str()
                .map_or_else(|| format!("{:?}", s.suite()), str::to_owned)
        },
    );
    let peer = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|c| PeerCertificate::from_der(c));
    Ok((
        tls,
        TlsSession {
            version,
            cipher,
            peer,
        },
    ))
}

/// [`look`] on a new TCP connection to `host`:`port`, all within `within`.
///
/// Cancel safe: dropping the future drops the connection.
pub async fn look_at(
    host: &str,
    port: u16,
    client: Option<&ClientIdentity>,
    within: Duration,
) -> Result<TlsSession, TlsFailure> {
    bounded(host, within, async {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(io_failure(host))?;
        look(stream, host, client).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil_dates() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(date(1_796_342_400), "2026-12-04");
        assert_eq!(date(1_796_342_399), "2026-12-03");
        assert_eq!(date(-86_400), "1969-12-31");
        assert_eq!(date(4_107_542_399), "2100-02-28");
        assert_eq!(date(4_107_542_400), "2100-03-01");
        assert_eq!(date(13_574_563_200), "2400-02-29");
        assert_eq!(date(i64::MAX), "?");
    }

    fn session(not_after: i64) -> TlsSession {
        TlsSession {
            version: "TLSv1.3".into(),
            cipher: "TLS13_AES_256_GCM_SHA384".into(),
            peer: Some(PeerCertificate {
                subject: "CN=db".into(),
                issuer: "CN=ca".into(),
                names: vec!["db".into(), "127.0.0.1".into()],
                not_after,
            }),
        }
    }

    #[test]
    fn the_report_names_the_certificate_and_warns_before_it_ends() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_342_400);
        let day = 86_400;
        let mut d = Diagnosis::new();
        session(1_796_342_400 + 400 * day).report(&mut d, "checked", now);
        assert_eq!(
            d.fact_value("TLS"),
            Some("TLSv1.3, TLS13_AES_256_GCM_SHA384")
        );
        assert_eq!(
            d.fact_value("peer certificate"),
            Some(
                "CN=db, issued by CN=ca; names db, 127.0.0.1; valid until 2028-01-08 (400 days); \
                 checked"
            )
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        // The first day inside the window is warned about; the last one outside is not.
        let mut d = Diagnosis::new();
        session(1_796_342_400 + 30 * day).report(&mut d, "c", now);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let mut d = Diagnosis::new();
        session(1_796_342_400 + 30 * day - 1).report(&mut d, "c", now);
        assert_eq!(d.warnings.len(), 1);
        assert!(d.warnings[0].contains("expires on 2027-01-02, in 29 days"));
        let mut d = Diagnosis::new();
        session(1_796_342_400 - 1).report(&mut d, "c", now);
        assert!(
            d.fact_value("peer certificate")
                .unwrap()
                .contains("expired on 2026-12-03"),
            "{:?}",
            d.facts
        );
        assert!(d.warnings[0].contains("expired on 2026-12-03"));
        let mut d = Diagnosis::new();
        TlsSession {
            peer: None,
            ..session(0)
        }
        .report(&mut d, "checked", now);
        assert_eq!(
            d.fact_value("peer certificate"),
            Some("not readable by leasehold; checked")
        );
    }

    /// A server certificate for `localhost` and 127.0.0.1, from a CA made here, and a
    /// client certificate from the same CA: `(ca, server chain, server key, client
    /// identity)`.
    fn certificates() -> (
        CertificateDer<'static>,
        CertificateDer<'static>,
        PrivateKeyDer<'static>,
        ClientIdentity,
    ) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, "probe CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::from_params(&ca, &ca_key);
        let leaf = |names: Vec<String>, cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(names).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            let cert = p.signed_by(&key, &issuer).unwrap();
            (
                cert.der().clone(),
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
        };
        let (server, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            "db",
        );
        let (client, client_key) = leaf(vec![], "client");
        (
            ca_cert.der().clone(),
            server,
            server_key,
            ClientIdentity {
                chain: vec![client],
                key: client_key,
            },
        )
    }

    /// Serves one TLS handshake on a loopback port, requiring a client certificate
    /// signed by `ca` if `require_client` (TLS 1.2 only if `tls12`); returns the port.
    async fn serve_once(
        ca: CertificateDer<'static>,
        chain: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
        require_client: bool,
        tls12: bool,
        reply: &'static [u8],
    ) -> u16 {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
            &[&rustls::version::TLS12]
        } else {
            &[&rustls::version::TLS13]
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .unwrap();
        let builder = if require_client {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca).unwrap();
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(vec![chain], key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Ok(mut tls) = acceptor.accept(tcp).await {
                let mut buf = [0u8; 64];
                let _ = tls.read(&mut buf).await;
                let _ = tls.write_all(reply).await;
                let _ = tls.shutdown().await;
            }
        });
        port
    }

    #[tokio::test]
    async fn a_handshake_reads_the_version_cipher_and_certificate() {
        let (ca, chain, key, _) = certificates();
        let port = serve_once(ca, chain, key, false, false, b"").await;
        let s = look_at("localhost", port, None, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(s.version, "TLSv1.3");
        assert!(s.cipher.starts_with("TLS13_"), "{}", s.cipher);
        let peer = s.peer.unwrap();
        assert_eq!(peer.subject, "CN=db");
        assert_eq!(peer.issuer, "CN=probe CA");
        assert_eq!(peer.names, ["localhost", "127.0.0.1", "::1"]);
        // rcgen's default validity ends in 4096.
        assert_eq!(date(peer.not_after), "4096-01-01");
        assert!(peer.seconds_left(UNIX_EPOCH + Duration::from_secs(1_796_342_400)) > 0);

        let (ca, chain, key, _) = certificates();
        let port = serve_once(ca, chain, key, false, true, b"").await;
        let s = look_at("127.0.0.1", port, None, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(s.version, "TLSv1.2");
        assert!(s.cipher.starts_with("TLS_ECDHE_"), "{}", s.cipher);
    }

    #[tokio::test]
    async fn a_server_that_requires_a_client_certificate_gets_the_urls() {
        let (ca, chain, key, id) = certificates();
        let port = serve_once(ca.clone(), chain.clone(), key.clone_key(), true, false, b"").await;
        let s = look_at("localhost", port, Some(&id), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(s.peer.unwrap().subject, "CN=db");
        // Without one, TLS 1.3's server refuses after the client's Finished: the first
        // read after the handshake fails, or the handshake itself, depending on timing.
        // Either way no session is reported as if all were well with a TLS 1.2 server.
        let port = serve_once(ca, chain, key, true, true, b"").await;
        let e = look_at("localhost", port, None, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(e.host(), Some("localhost"));
    }

    #[tokio::test]
    async fn a_request_over_the_session_gets_the_whole_answer_and_no_more_than_the_limit() {
        let (ca, chain, key, _) = certificates();
        let port = serve_once(
            ca.clone(),
            chain.clone(),
            key.clone_key(),
            false,
            false,
            b"HTTP/1.1 200 OK\r\n\r\nhealthy",
        )
        .await;
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (s, answer) = look_and_ask(stream, "127.0.0.1", None, b"GET /health\r\n\r\n", 1024)
            .await
            .unwrap();
        assert_eq!(s.version, "TLSv1.3");
        assert_eq!(answer, b"HTTP/1.1 200 OK\r\n\r\nhealthy");
        let port = serve_once(ca, chain, key, false, false, b"0123456789").await;
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (_, answer) = look_and_ask(stream, "127.0.0.1", None, b"x", 4)
            .await
            .unwrap();
        assert_eq!(answer, b"0123");
    }

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(host_port("db:2379"), Some(("db".into(), 2379)));
        assert_eq!(host_port("[::1]:2181"), Some(("::1".into(), 2181)));
        assert_eq!(host_port("db"), None);
        assert_eq!(host_port("db:x"), None);
        assert_eq!(host_port("db:70000"), None);
    }

    /// A TLS server that answers one request with `reply` and drops the connection without
    /// a close_notify, as many servers do; returns the port.
    async fn serve_and_drop(reply: &'static [u8]) -> u16 {
        let (_, chain, key, _) = certificates();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![chain], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let mut buf = [0u8; 64];
            let _ = tls.read(&mut buf).await;
            tls.write_all(reply).await.unwrap();
            tls.flush().await.unwrap();
            drop(tls);
        });
        port
    }

    #[tokio::test]
    async fn an_unclean_close_keeps_what_arrived_and_an_empty_one_is_an_error() {
        let port = serve_and_drop(b"HTTP/1.1 200 OK\r\n\r\nok").await;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (_, answer) = look_and_ask(tcp, "127.0.0.1", None, b"GET /\r\n\r\n", 1024)
            .await
            .unwrap();
        assert_eq!(answer, b"HTTP/1.1 200 OK\r\n\r\nok");
        let port = serve_and_drop(b"").await;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let e = look_and_ask(tcp, "127.0.0.1", None, b"GET /\r\n\r\n", 1024)
            .await
            .unwrap_err();
        assert_eq!(e.host(), Some("127.0.0.1"));
    }

    #[test]
    fn the_end_of_validity_itself_is_still_valid() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_342_400);
        let mut d = Diagnosis::new();
        session(1_796_342_400).report(&mut d, "c", now);
        assert!(
            d.fact_value("peer certificate")
                .unwrap()
                .contains("valid until 2026-12-04 (0 days)"),
            "{:?}",
            d.facts
        );
        assert_eq!(d.warnings.len(), 1);
        assert!(
            d.warnings[0].contains("expires on 2026-12-04, in 0 days"),
            "{:?}",
            d.warnings
        );
    }

    #[tokio::test]
    async fn a_tls_port_is_told_from_a_plaintext_one() {
        let (ca, chain, key, _) = certificates();
        let tls = serve_once(
            ca.clone(),
            chain.clone(),
            key.clone_key(),
            false,
            false,
            b"",
        )
        .await;
        assert!(speaks_tls("127.0.0.1", tls, Duration::from_secs(10)).await);
        // One that requires a client certificate refuses with an alert (TLS 1.2) or after
        // the handshake (TLS 1.3): TLS either way.
        let picky = serve_once(ca, chain, key, true, true, b"").await;
        assert!(speaks_tls("127.0.0.1", picky, Duration::from_secs(10)).await);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.write_all(b"-ERR unknown command\r\n").await;
        });
        assert!(!speaks_tls("127.0.0.1", plain, Duration::from_secs(10)).await);
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        assert!(!speaks_tls("127.0.0.1", port, Duration::from_millis(200)).await);
        drop(silent);
    }

    #[tokio::test]
    async fn a_plaintext_refusal_names_the_tls_host_and_the_stores_hint() {
        let (ca, chain, key, _) = certificates();
        let tls = serve_once(ca, chain, key, false, false, b"").await;
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let down = || crate::StoreError::new(crate::StoreErrorKind::Unavailable, "test", "down");
        let hosts = [
            ("127.0.0.1".to_owned(), closed),
            ("localhost".to_owned(), tls),
        ];
        let e =
            plaintext_refused("test", down(), &hosts, "rediss://", Duration::from_secs(10)).await;
        assert_eq!(e.kind(), crate::StoreErrorKind::Config);
        let failure = TlsFailure::of(&e).unwrap();
        assert_eq!(failure.problem(), TlsProblem::PlaintextRefused);
        assert_eq!(failure.host(), Some("localhost"));
        assert!(e.to_string().contains("(rediss://)"), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("port {tls} answers only TLS")),
            "{e}"
        );
        let none = [format!("127.0.0.1:{closed}"), "no port".to_owned()];
        let e = plaintext_refused_at("test", down(), &none, "x", Duration::from_secs(1)).await;
        assert_eq!(
            (e.kind(), e.message()),
            (crate::StoreErrorKind::Unavailable, "down")
        );
        // Only an unreachable server is asked about: a refused password stays what it is.
        let (ca, chain, key, _) = certificates();
        let tls = serve_once(ca, chain, key, false, false, b"").await;
        let refused = crate::StoreError::new(crate::StoreErrorKind::Config, "test", "password");
        let hosts = [("127.0.0.1".to_owned(), tls)];
        let e = plaintext_refused("test", refused, &hosts, "x", Duration::from_secs(10)).await;
        assert!(TlsFailure::of(&e).is_none(), "{e}");
        // An ambiguous read (a connection check) counts as unreachable.
        let ambiguous = crate::StoreError::new(crate::StoreErrorKind::Ambiguous, "test", "read");
        let e = plaintext_refused("test", ambiguous, &hosts, "x", Duration::from_secs(10)).await;
        assert!(TlsFailure::of(&e).is_some(), "{e}");
        // Within at most a second, whatever the store's bound.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hosts = [("127.0.0.1".to_owned(), silent.local_addr().unwrap().port())];
        let started = std::time::Instant::now();
        let e = plaintext_refused("test", down(), &hosts, "x", Duration::from_secs(60)).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(e.message(), "down");
    }

    #[test]
    fn the_tls_param_stores_hints_name_their_parameters() {
        let other = "a client certificate, cert= and key=?";
        assert_eq!(
            [
                TlsProblem::UntrustedCertificate,
                TlsProblem::PlaintextRefused,
                TlsProblem::Other,
                TlsProblem::WrongHost,
                TlsProblem::Files,
                TlsProblem::NotOffered,
            ]
            .map(|p| tls_param_hint(p, other)),
            ["cacert=", "tls=true", other, "", "", ""]
        );
    }

    #[tokio::test]
    async fn a_tls_param_store_is_told_tls_true_only_when_its_url_is_plaintext() {
        let (ca, chain, key, _) = certificates();
        let tls = serve_once(ca, chain, key, false, false, b"").await;
        let hosts = [format!("localhost:{tls}")];
        let down = || crate::StoreError::new(crate::StoreErrorKind::Unavailable, "test", "down");
        let within = Duration::from_secs(10);
        // A URL with TLS on is not asked about (the one handshake served is left for below).
        let e = plaintext_refused_tls_param("test", down(), true, &hosts, within).await;
        assert_eq!(
            (e.kind(), e.message()),
            (crate::StoreErrorKind::Unavailable, "down")
        );
        let e = plaintext_refused_tls_param("test", down(), false, &hosts, within).await;
        assert_eq!(
            TlsFailure::of(&e).map(TlsFailure::problem),
            Some(TlsProblem::PlaintextRefused)
        );
        assert!(e.to_string().contains("(tls=true)"), "{e}");
    }

    #[tokio::test]
    async fn a_port_that_does_not_speak_tls_is_an_error_not_a_hang() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.write_all(b"-ERR plaintext\r\n").await;
        });
        let e = look_at("127.0.0.1", port, None, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(e.problem(), TlsProblem::Other);
        // Nothing listening: refused at once.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = look_at("127.0.0.1", closed, None, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(e.host(), Some("127.0.0.1"));
        // A server that never answers: the bound.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let e = look_at("127.0.0.1", port, None, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no TLS handshake within"), "{e}");
        drop(silent);
    }

    #[test]
    fn a_failed_look_still_says_tls_is_on_and_how_the_store_checks() {
        let mut d = Diagnosis::new();
        let failed = Err(TlsFailure::new(TlsProblem::Other, Some("db"), "reset"));
        report_look(&mut d, &failed, "checked against the CA");
        assert_eq!(
            d.fact_value("TLS"),
            Some(
                "on; the session could not be read by a handshake of leasehold's own (TLS: the \
                 TLS connection failed (host `db`): reset)"
            )
        );
        assert_eq!(
            d.fact_value("peer certificate"),
            Some("checked against the CA")
        );
        let mut d = Diagnosis::new();
        report_look(&mut d, &Ok(session(i64::MAX / 2)), "checked");
        assert_eq!(
            d.fact_value("TLS"),
            Some("TLSv1.3, TLS13_AES_256_GCM_SHA384")
        );
    }

    #[test]
    fn unreadable_files_are_named_without_their_contents() {
        let dir = std::env::temp_dir().join(format!("lh-tls-session-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "secret-looking text, no PEM").unwrap();
        let e = ClientIdentity::from_pem_files(&junk, &junk).unwrap_err();
        assert_eq!(e.problem(), TlsProblem::Files);
        let text = e.to_string();
        assert!(
            text.contains("junk.pem holds no usable certificate"),
            "{text}"
        );
        assert!(!text.contains("secret-looking"), "{text}");
        let missing = dir.join("missing.pem");
        let e = ClientIdentity::from_pem_files(&missing, &missing).unwrap_err();
        assert!(e.to_string().contains("missing.pem"));
        // A good certificate beside a key file that holds none: the key file is named.
        let (_, _, _, id) = certificates();
        let key = rcgen::KeyPair::generate().unwrap();
        let made = rcgen::CertificateParams::new(vec!["client".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let cert = dir.join("cert.pem");
        std::fs::write(&cert, made.pem()).unwrap();
        let e = ClientIdentity::from_pem_files(&cert, &junk).unwrap_err();
        assert!(
            e.to_string()
                .contains("junk.pem holds no usable private key"),
            "{e}"
        );
        let key_file = dir.join("key.pem");
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let loaded = ClientIdentity::from_pem_files(&cert, &key_file).unwrap();
        assert_eq!(loaded.chain.len(), 1);
        // The same through a URL's optional pair: none is no identity, a pair is read.
        assert!(ClientIdentity::from_pair(None).unwrap().is_none());
        let pair = (cert.clone(), key_file.clone());
        let paired = ClientIdentity::from_pair(Some(&pair)).unwrap().unwrap();
        assert_eq!(paired.chain.len(), 1);
        let bad = (cert.clone(), junk.clone());
        let e = ClientIdentity::from_pair(Some(&bad)).unwrap_err();
        assert!(
            e.to_string()
                .contains("junk.pem holds no usable private key"),
            "{e}"
        );
        // Debug names neither the key nor the certificate.
        let shown = format!("{loaded:?} {id:?}");
        assert_eq!(
            shown,
            "ClientIdentity { certificates: 1, .. } ClientIdentity { certificates: 1, .. }"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_certificate_without_names_and_a_clock_before_the_epoch() {
        let mut d = Diagnosis::new();
        let mut s = session(1_000);
        if let Some(p) = s.peer.as_mut() {
            p.names.clear();
        }
        s.report(&mut d, "c", UNIX_EPOCH + Duration::from_secs(500));
        assert!(
            d.fact_value("peer certificate")
                .unwrap()
                .contains("; no alternative names; valid until 1970-01-01 (0 days)"),
            "{:?}",
            d.facts
        );
        // A clock before the epoch counts backwards.
        let peer = s.peer.unwrap();
        assert_eq!(
            peer.seconds_left(UNIX_EPOCH - Duration::from_secs(10)),
            1_010
        );
        assert_eq!(peer.seconds_left(UNIX_EPOCH + Duration::from_secs(10)), 990);
    }
}
