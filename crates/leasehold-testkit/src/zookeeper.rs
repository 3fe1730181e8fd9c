//! Private ZooKeeper servers: [`ZkServer`] (one standalone server, optionally serving only
//! TLS: [`ZkServer::start_tls`], or plaintext on the Netty connection factory that TLS
//! needs: [`ZkServer::start_netty`]) and [`ZkEnsemble`] (three members, their links to each other
//! optionally through fault proxies, their clients optionally served only over TLS:
//! [`ZkEnsemble::start_tls`]), each on its own ports and temporary data directory,
//! run by the `java` found on `PATH` with Debian's `/usr/share/java/zookeeper.jar`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tempfile::TempDir;

use crate::free_port;
use crate::process::ServerProcess;
use crate::proxy::{FaultProxy, ProxyMode};
use crate::ready::{self, ReadyError};
use crate::server::{Home, Launch, Server};
use crate::tls::{ServerCert, TlsFiles};
use crate::util;

/// Debian's ZooKeeper server jar (package `zookeeper`).
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The logging backend put on the class path, so that the server writes a log.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codec and resolver, which a server on the Netty connection factory (every TLS
/// server) needs and Debian's `zookeeper.jar` does not list in its class path (it lists
/// netty-handler, -buffer, -common and -transport).
const NETTY_JARS: &str = "/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar";
/// The `zoo.cfg` line that serves clients through Netty instead of the default NIO
/// factory: the only factory that serves TLS.
const NETTY_FACTORY: &str =
    "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n";
/// The line a standalone server logs once it serves (its `ContainerManager` starts after
/// the server is running): the readiness check of a TLS-only server, which answers no
/// plaintext `srvr`.
const SERVING_LINE: &str = "ContainerManager - Using checkIntervalMs";

/// How long a server may take to answer `srvr` with its mode after it was spawned (a JVM
/// start on a loaded two-core machine, and for an ensemble, a leader election).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's tick: its session timeouts are bounded to 2 to 20 ticks by default;
/// [`ZkServer`] sets the bounds explicitly (see [`MIN_SESSION_TIMEOUT`]).
pub const TICK: Duration = Duration::from_millis(250);
/// The shortest session timeout the test servers grant (two ticks).
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest session timeout the test servers grant.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);
/// The default `syncLimit`, in ticks: a follower that hears nothing from its leader for
/// this long (2.5 s) gives up on it and stops serving its clients.
pub const DEFAULT_SYNC_LIMIT: u32 = 10;

fn java() -> PathBuf {
    util::find_binary("java", "default-jre-headless (pulled in by zookeeper)")
}

fn check_jar() {
    assert!(
        Path::new(ZOOKEEPER_JAR).is_file(),
        "{ZOOKEEPER_JAR} not found: install package zookeeper"
    );
}

/// How one server of a standalone server or an ensemble is started: its `zoo.cfg`, then
/// `java`.
#[derive(Debug)]
struct Launcher {
    java: PathBuf,
    sync_limit: u32,
    /// For an ensemble member: its id and how it reaches each member (see [`write_config`]).
    ensemble: Option<(usize, Vec<(u16, u16)>)>,
    /// A standalone server serving only TLS (see [`ZkServer::start_tls`]).
    tls: Option<LaunchTls>,
    /// Serve clients through Netty's connection factory (always with `tls`; without it,
    /// see [`ZkServer::start_netty`]).
    netty: bool,
    /// The length of the log when the process was last spawned: the readiness check of a
    /// TLS server reads only what that process wrote.
    log_start: AtomicU64,
}

/// The TLS files and settings of a server started with [`ZkServer::start_tls`] (or of
/// every member of an ensemble started with [`ZkEnsemble::start_tls`]).
#[derive(Debug, Clone)]
struct LaunchTls {
    files: TlsFiles,
    /// `ssl.keyStore.location`: the key (PKCS#8) and the certificate in one PEM file, as
    /// ZooKeeper's PEM key store takes them.
    key_store: PathBuf,
    client_cert_auth: bool,
}

/// One server process of a standalone server or an ensemble.
type Member = Server<Launcher>;

/// Writes `zoo.cfg` (and `myid` for an ensemble member) in `dir`. For an ensemble member,
/// `peers` are the quorum and election ports this member dials to reach each member (its
/// own line: the ports it listens on).
/// With `tls`, the client port is a `secureClientPort` (Netty, TLS only: no `clientPort`,
/// no port unification) instead. With `netty` (implied by `tls`), clients are served by
/// Netty's connection factory instead of the default NIO one.
fn write_config(
    dir: &Path,
    client_port: u16,
    sync_limit: u32,
    ensemble: Option<(usize, &[(u16, u16)])>,
    tls: Option<&LaunchTls>,
    netty: bool,
) {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", data.display()));
    let mut listen = match tls {
        None => format!("clientPort={client_port}\nclientPortAddress=127.0.0.1\n"),
        Some(tls) => format!(
            "secureClientPort={client_port}\nsecureClientPortAddress=127.0.0.1\n\
             client.portUnification=false\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
             ssl.clientAuth={}\n",
            tls.key_store.display(),
            tls.files.ca_cert().display(),
            if tls.client_cert_auth { "need" } else { "none" },
        ),
    };
    if netty || tls.is_some() {
        listen.push_str(NETTY_FACTORY);
    }
    let mut cfg = format!(
        "tickTime={}\ninitLimit=20\nsyncLimit={sync_limit}\ndataDir={}\n\
         {listen}admin.enableServer=false\n\
         4lw.commands.whitelist=ruok,srvr,stat,mntr,cons\nminSessionTimeout={}\n\
         maxSessionTimeout={}\nmaxClientCnxns=0\n",
        TICK.as_millis(),
        data.display(),
        MIN_SESSION_TIMEOUT.as_millis(),
        MAX_SESSION_TIMEOUT.as_millis(),
    );
    if let Some((id, peers)) = ensemble {
        for (i, (quorum, election)) in peers.iter().enumerate() {
            cfg.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1));
        }
        std::fs::write(data.join("myid"), format!("{id}\n"))
            .unwrap_or_else(|e| panic!("cannot write myid: {e}"));
    }
    std::fs::write(dir.join("zoo.cfg"), cfg)
        .unwrap_or_else(|e| panic!("cannot write zoo.cfg: {e}"));
}

impl Launch for Launcher {
    const NAME: &'static str = crate::proof::ZOOKEEPER;
    const REPLICATED: bool = true;
    const LOGS: &'static [&'static str] = &["log"];
    const PORT_TAKEN: &'static [&'static str] = &["Address already in use", "BindException"];

    fn spawn(&self, dir: &Path, client_port: u16) -> ServerProcess {
        let ensemble = (self.ensemble.as_ref()).map(|(id, peers)| (*id, peers.as_slice()));
        write_config(
            dir,
            client_port,
            self.sync_limit,
            ensemble,
            self.tls.as_ref(),
            self.netty,
        );
        let log = dir.join("log");
        let log_start = std::fs::metadata(&log).map_or(0, |m| m.len());
        self.log_start.store(log_start, Ordering::Relaxed);
        let mut class_path = format!("/etc/zookeeper/conf:{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}");
        if self.netty || self.tls.is_some() {
            class_path.push(':');
            class_path.push_str(NETTY_JARS);
        }
        let mut cmd = Command::new(&self.java);
        cmd.current_dir(dir)
            // A small JVM: the machine is shared.
            .arg("-Xmx256m")
            .arg("-XX:+UseSerialGC")
            .arg("-XX:TieredStopAtLevel=1")
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-cp")
            .arg(class_path)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(dir.join("zoo.cfg"));
        for var in ["JVMFLAGS", "SERVER_JVMFLAGS", "CLASSPATH", "ZOOCFGDIR"] {
            cmd.env_remove(var);
        }
        ServerProcess::spawn(format!("zookeeper:{client_port}"), cmd, &log)
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        let Some(tls) = &self.tls else {
            return ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(100), || {
                mode(port).is_some()
            });
        };
        if self.ensemble.is_some() {
            // An ensemble member serves once it answers `srvr` (over TLS) with its mode.
            return ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(200), || {
                mode_of(&tls_four_letter(port, &tls.files, "srvr")).is_some()
            });
        }
        // A TLS-only server answers `srvr` only over TLS: ready once this process logged
        // that it serves, and the port takes connections.
        let log = tls.files.dir().parent().map(|d| d.join("log"));
        let start = self.log_start.load(Ordering::Relaxed);
        ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(100), || {
            let Some(log) = &log else { return false };
            let Ok(bytes) = std::fs::read(log) else {
                return false;
            };
            let ours = bytes
                .get(usize::try_from(start).unwrap_or(0)..)
                .unwrap_or(&[]);
            String::from_utf8_lossy(ours).contains(SERVING_LINE)
                && TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
        })
    }
}

/// The answer to the four-letter command `srvr` on `port`, or an empty string.
fn srvr(port: u16) -> String {
    util::ask(port, b"srvr", 8192, |_| false)
        .map(|a| String::from_utf8_lossy(&a).into_owned())
        .unwrap_or_default()
}

/// The server's mode (`standalone`, `leader`, `follower`), if it serves.
fn mode(port: u16) -> Option<String> {
    mode_of(&srvr(port))
}

/// The `lcxid` of session `session`'s connection in an answer to `cons`, whose lines read
/// `/127.0.0.1:40000[1](queued=0,recved=9,sent=9,sid=0x1000…,lop=CREA,…,lcxid=0x7,…)`.
fn last_cxid(cons: &str, session: i64) -> Option<i64> {
    let sid = format!("sid={session:#x},");
    let line = cons.lines().find(|l| l.contains(&sid))?;
    let hex = line.split("lcxid=0x").nth(1)?;
    let hex: String = hex.chars().take_while(char::is_ascii_hexdigit).collect();
    i64::from_str_radix(&hex, 16).ok()
}

/// The mode in an answer to `srvr`, if it gives one.
fn mode_of(srvr: &str) -> Option<String> {
    srvr.lines()
        .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_owned()))
}

/// A TLS client trusting the test CA of `files` and presenting its client certificate.
fn tls_client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(files.ca_cert()).map_err(|e| e.to_string())? {
        roots
            .add(ca.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let chain = CertificateDer::pem_file_iter(files.client_cert())
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_file(files.client_key()).map_err(|e| e.to_string())?;
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| e.to_string())
}

/// The answer to the four-letter word `word` on a port that serves only TLS (the server's
/// certificate verified for `127.0.0.1` against the test CA, the client certificate
/// presented), or an empty string if there is none (not serving, refused, 5 s passed).
fn tls_four_letter(port: u16, files: &TlsFiles, word: &str) -> String {
    let ask = || -> Result<Vec<u8>, String> {
        let config = tls_client_config(files)?;
        let name = rustls::pki_types::ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let mut conn =
            rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
        let mut sock =
            TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        sock.set_write_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
        tls.write_all(word.as_bytes()).map_err(|e| e.to_string())?;
        tls.flush().map_err(|e| e.to_string())?;
        // The server answers and closes (with or without a TLS close_notify).
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
        Ok(answer)
    };
    ask()
        .map(|a| String::from_utf8_lossy(&a).into_owned())
        .unwrap_or_default()
}

/// Asserts that the Netty jars a server on the Netty connection factory needs are there.
///
/// # Panics
///
/// When one is missing.
fn check_netty_jars() {
    for jar in NETTY_JARS.split(':') {
        assert!(
            Path::new(jar).is_file(),
            "{jar} not found: install package libnetty-java"
        );
    }
}

/// The TLS settings of a server or ensemble serving only TLS, its files made fresh in
/// `tls_dir` (which must not exist).
///
/// # Panics
///
/// When Netty's jars are missing or a file cannot be written.
fn make_tls(tls_dir: &Path, cert: ServerCert, client_cert_auth: bool) -> LaunchTls {
    check_netty_jars();
    std::fs::create_dir(tls_dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", tls_dir.display()));
    let files = TlsFiles::create(tls_dir);
    let (cert, key) = cert.files(&files);
    let read = |p: &Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let key_store = tls_dir.join("server-keystore.pem");
    std::fs::write(&key_store, read(&key) + &read(&cert))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", key_store.display()));
    LaunchTls {
        files,
        key_store,
        client_cert_auth,
    }
}

/// A private standalone ZooKeeper 3.8 server on 127.0.0.1: its own client port and
/// temporary data directory, a 250 ms tick, session timeouts between 0.5 s and 60 s. A
/// crash-restart keeps every acknowledged write (ZooKeeper syncs its transaction log
/// before it answers a write). Digest authentication (`addauth digest user:password`) is
/// available, as on every ZooKeeper server; started with [`start_tls`](Self::start_tls) it
/// serves only TLS, and with [`start_netty`](Self::start_netty) plaintext through the same
/// Netty connection factory.
///
/// Dropping it kills the server (`SIGKILL`) and removes the directory.
#[derive(Debug)]
pub struct ZkServer {
    server: Member,
}

impl ZkServer {
    /// Starts a server and waits until it answers `srvr` with its mode.
    ///
    /// # Panics
    ///
    /// Panics if `java` or `/usr/share/java/zookeeper.jar` is missing (package
    /// `zookeeper`), or if the server does not serve within 60 s.
    pub fn start() -> Self {
        Self::start_inner(None, false)
    }

    /// Starts a plaintext server, as [`start`](Self::start) does, but serving clients
    /// through Netty's connection factory
    /// (`serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory`, Netty's
    /// jars on the class path) instead of the default NIO one: the factory a
    /// [`start_tls`](Self::start_tls) server must use, so that the two differ only in TLS.
    /// Its log names `NettyServerCnxnFactory` where [`start`](Self::start)'s names
    /// `NIOServerCnxnFactory`.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also when Netty's jars (package `libnetty-java`) are
    /// missing.
    pub fn start_netty() -> Self {
        check_netty_jars();
        Self::start_inner(None, true)
    }

    /// Starts a server that serves only TLS and waits until it serves (its log says so and
    /// its port takes connections): fresh certificates ([`TlsFiles`], in `DIR/tls`, see
    /// [`tls`](Self::tls)); the client port is a `secureClientPort` (Netty,
    /// `ssl.keyStore.type=PEM` holding `cert` and its key, `ssl.trustStore` the test CA)
    /// with no plaintext `clientPort` and no port unification, so a plaintext client is
    /// refused. With `client_cert_auth`, `ssl.clientAuth=need`: every client must present
    /// a certificate signed by the test CA (else `none`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also when the certificates cannot be written, or when
    /// Netty's jars (package `libnetty-java`) are missing.
    pub fn start_tls(cert: ServerCert, client_cert_auth: bool) -> Self {
        Self::start_inner(Some((cert, client_cert_auth)), true)
    }

    fn start_inner(tls: Option<(ServerCert, bool)>, netty: bool) -> Self {
        check_jar();
        let dir = util::temp_dir("leasehold-zk-");
        let tls = tls.map(|(cert, client_cert_auth)| {
            make_tls(&dir.path().join("tls"), cert, client_cert_auth)
        });
        let launcher = Launcher {
            java: java(),
            sync_limit: DEFAULT_SYNC_LIMIT,
            ensemble: None,
            tls,
            netty,
            log_start: AtomicU64::new(0),
        };
        Self {
            server: Server::start(launcher, Home::Own(dir)),
        }
    }

    /// The certificates of a server started with [`start_tls`](Self::start_tls) (`None`
    /// without TLS):
    /// the CA to trust, the client certificate, and the wrong ones.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.server.launch().tls.as_ref().map(|t| &t.files)
    }

    /// `zookeeper://127.0.0.1:port/leasehold` (with TLS, add `?tls=true` and the files:
    /// see [`tls`](Self::tls)).
    pub fn url(&self) -> String {
        format!("zookeeper://127.0.0.1:{}/leasehold", self.port())
    }

    /// `127.0.0.1:port`, as ZooKeeper clients take it.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// The server's directory (its data directory is `data` inside it).
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// The server's log.
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// The xid of the last request session `session` sent to this server, as `cons` reports
    /// it (`lcxid`): a client numbers its requests one after another, and its pings (xid
    /// -2) leave the number alone, so the difference of two readings counts the requests
    /// sent in between, whatever the client's pings do. `None` when the server has no
    /// connection of that session, or the server is a TLS one.
    pub fn last_request_of(&self, session: i64) -> Option<i64> {
        if self.tls().is_some() {
            return None;
        }
        let cons = util::ask(self.port(), b"cons", 1 << 20, |_| false)?;
        last_cxid(&String::from_utf8_lossy(&cons), session)
    }

    crate::server::server_methods!("The client port on 127.0.0.1.", "`127.0.0.1:port`.");

    crate::server::restart_methods!();
}

/// How a [`ZkEnsemble`] is started ([`ZkEnsemble::start_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkEnsembleOptions {
    /// Route the members' links to each other (their quorum and election ports) through a
    /// [`FaultProxy`] per member and direction, so that a member can be cut off from the
    /// others while its clients still reach it ([`ZkEnsemble::isolate`]). Default: off.
    ///
    /// Each member's `zoo.cfg` names the proxies as the other members' addresses. One
    /// link may still bypass its proxy: when a member dials the election port of a
    /// higher-numbered one, that one drops the connection and dials back the election
    /// address the first *announced* (its own port), as ZooKeeper's `QuorumCnxManager`
    /// does. The quorum links (a follower's connection to its leader: proposals, commits,
    /// pings and the sessions' activity reports) always go through their proxy.
    pub proxied_peers: bool,
    /// `syncLimit`, in ticks: a follower that hears nothing from its leader for this long
    /// gives up on it and stops serving its clients. Default [`DEFAULT_SYNC_LIMIT`].
    pub sync_limit: u32,
}

impl Default for ZkEnsembleOptions {
    fn default() -> Self {
        Self {
            proxied_peers: false,
            sync_limit: DEFAULT_SYNC_LIMIT,
        }
    }
}

/// The proxies of one member's links to another member (see
/// [`ZkEnsembleOptions::proxied_peers`]).
#[derive(Debug)]
struct PeerLink {
    /// The member that dials through these proxies.
    from: usize,
    /// The member they forward to.
    to: usize,
    quorum: FaultProxy,
    election: FaultProxy,
}

/// A private three-member ZooKeeper ensemble on 127.0.0.1: each member has its own
/// client, quorum and election ports and its own data directory; 250 ms tick. With
/// [`ZkEnsembleOptions::proxied_peers`], the members reach each other through fault
/// proxies, and a member can be cut off from the others ([`isolate`](Self::isolate)).
/// Started with [`start_tls`](Self::start_tls), every member serves its clients only over
/// TLS.
///
/// Dropping it kills every member and removes the directories.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<Member>,
    links: Vec<PeerLink>,
    tls: Option<LaunchTls>,
    _tmp: TempDir,
}

impl ZkEnsemble {
    /// The number of members.
    pub const SIZE: usize = 3;

    /// Starts three members (default [`ZkEnsembleOptions`]) and waits until each serves
    /// (as leader or follower).
    ///
    /// # Panics
    ///
    /// Panics if `java` or the jar is missing, or the ensemble does not form within 60 s.
    pub fn start() -> Self {
        Self::start_with(ZkEnsembleOptions::default())
    }

    /// Starts three members with `options` and waits until each serves (as leader or
    /// follower).
    ///
    /// # Panics
    ///
    /// Panics if `java` or the jar is missing, or the ensemble does not form within 60 s.
    pub fn start_with(options: ZkEnsembleOptions) -> Self {
        Self::start_inner(&options, None)
    }

    /// Starts three members (default [`ZkEnsembleOptions`]) that serve their clients only
    /// over TLS, as [`ZkServer::start_tls`] does with the server certificate for
    /// `localhost` and `127.0.0.1`: each member's client port is a `secureClientPort`
    /// (Netty, no plaintext `clientPort`, no port unification), one set of fresh
    /// certificates for all three (see [`tls`](Self::tls)); with `client_cert_auth`, every
    /// client must present a certificate signed by the test CA. The members' links to
    /// each other (quorum and election) stay plaintext. Waits until each member answers
    /// `srvr` over TLS as leader or follower; [`mode`](Self::mode),
    /// [`leader`](Self::leader) and [`four_letter_word`](Self::four_letter_word) speak
    /// TLS.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also when Netty's jars (package `libnetty-java`) are
    /// missing.
    pub fn start_tls(client_cert_auth: bool) -> Self {
        Self::start_inner(
            &ZkEnsembleOptions::default(),
            Some((ServerCert::Localhost, client_cert_auth)),
        )
    }

    fn start_inner(options: &ZkEnsembleOptions, tls: Option<(ServerCert, bool)>) -> Self {
        check_jar();
        let java = java();
        let tmp = util::temp_dir("leasehold-zk3-");
        let tls = tls.map(|(cert, client_cert_auth)| {
            make_tls(&tmp.path().join("tls"), cert, client_cert_auth)
        });
        // A port handed out by `free_port` may be taken by another test process before the
        // member binds it: start again on fresh ports then (up to 4 attempts).
        let mut attempt = 0;
        let (members, links) = loop {
            attempt += 1;
            let root = tmp.path().join(format!("try{attempt}"));
            match Self::try_start(&java, &root, options, tls.as_ref()) {
                Ok(started) => break started,
                Err((members, e)) => {
                    let taken = members.iter().any(Member::port_taken);
                    let logs: Vec<String> = members
                        .iter()
                        .map(|m| {
                            format!(
                                "--- {} ---\n{}",
                                m.dir().display(),
                                util::log_tail(&m.dir().join("log"), 4096)
                            )
                        })
                        .collect();
                    drop(members);
                    if taken && attempt < 4 {
                        tracing::warn!(attempt, "zookeeper ensemble port taken: retrying");
                        continue;
                    }
                    panic!("zookeeper ensemble {e}\n{}", logs.join("\n"));
                }
            }
        };
        let clients: Vec<u16> = members.iter().map(Member::port).collect();
        tracing::info!(
            ?clients,
            proxied = !links.is_empty(),
            tls = tls.is_some(),
            "zookeeper ensemble ready"
        );
        Self {
            members,
            links,
            tls,
            _tmp: tmp,
        }
    }

    /// Spawns three members under `root` on fresh ports (with their peer proxies, if
    /// asked) and waits until each serves.
    #[allow(clippy::type_complexity)]
    fn try_start(
        java: &Path,
        root: &Path,
        options: &ZkEnsembleOptions,
        tls: Option<&LaunchTls>,
    ) -> Result<(Vec<Member>, Vec<PeerLink>), (Vec<Member>, String)> {
        // `free_port` never hands out a port twice, so the nine ports are distinct.
        let peers: Vec<(u16, u16)> = (0..Self::SIZE)
            .map(|_| (free_port(), free_port()))
            .collect();
        let clients: Vec<u16> = (0..Self::SIZE).map(|_| free_port()).collect();
        let mut links = Vec::new();
        if options.proxied_peers {
            for from in 0..Self::SIZE {
                for to in (0..Self::SIZE).filter(|&to| to != from) {
                    let (quorum, election) = peers[to];
                    links.push(PeerLink {
                        from,
                        to,
                        quorum: FaultProxy::start((Ipv4Addr::LOCALHOST, quorum).into()),
                        election: FaultProxy::start((Ipv4Addr::LOCALHOST, election).into()),
                    });
                }
            }
        }
        let members: Vec<Member> = (0..Self::SIZE)
            .map(|i| {
                let dir = root.join(format!("m{}", i + 1));
                // How member `i` reaches each member: its own ports for itself, the proxies
                // of its links to the others.
                let seen: Vec<(u16, u16)> = (0..Self::SIZE)
                    .map(|j| {
                        links
                            .iter()
                            .find(|l| l.from == i && l.to == j)
                            .map_or(peers[j], |l| (l.quorum.port(), l.election.port()))
                    })
                    .collect();
                let launcher = Launcher {
                    java: java.to_path_buf(),
                    sync_limit: options.sync_limit,
                    ensemble: Some((i + 1, seen)),
                    tls: tls.cloned(),
                    netty: tls.is_some(),
                    log_start: AtomicU64::new(0),
                };
                let process = launcher.spawn(&dir, clients[i]);
                Server::new(process, clients[i], launcher, Home::In(dir))
            })
            .collect();
        for m in &members {
            let result = m.launch().ready(&m.process(), m.port());
            if let Err(e) = result {
                let msg = format!("member on port {} {e}", m.port());
                return Err((members, msg));
            }
        }
        Ok((members, links))
    }

    /// Sets every proxy of member `i`'s links, to and from the others, to `mode`.
    fn set_links(&self, i: usize, mode: ProxyMode) {
        assert!(
            !self.links.is_empty(),
            "the ensemble was started without proxied_peers: its members' links cannot be cut"
        );
        for l in self.links.iter().filter(|l| l.from == i || l.to == i) {
            l.quorum.set_mode(mode);
            l.election.set_mode(mode);
        }
    }

    /// Cuts member `i` off from the other members: every proxy of its links to and from
    /// them blackholes (bytes in flight and after are dropped, nothing is closed), while
    /// its clients still reach it on its client port. A follower keeps serving its clients
    /// from its own copy until it gives up on the leader (`syncLimit` ticks); the others
    /// keep a quorum.
    ///
    /// # Panics
    ///
    /// Panics if the ensemble was started without [`ZkEnsembleOptions::proxied_peers`].
    pub fn isolate(&self, i: usize) {
        self.set_links(i, ProxyMode::Blackhole);
        crate::proof::record(crate::proof::Injected::Partitioned);
    }

    /// Undoes [`isolate`](Self::isolate): member `i`'s links pass again (connections
    /// that lost bytes meanwhile are reset, so the members connect anew).
    ///
    /// # Panics
    ///
    /// Panics if the ensemble was started without [`ZkEnsembleOptions::proxied_peers`].
    pub fn rejoin(&self, i: usize) {
        self.set_links(i, ProxyMode::Pass);
        for l in self.links.iter().filter(|l| l.from == i || l.to == i) {
            l.quorum.reset_all();
            l.election.reset_all();
        }
    }

    /// The client ports of the members, in member order.
    pub fn ports(&self) -> Vec<u16> {
        self.members.iter().map(Member::port).collect()
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`.
    pub fn connect_string(&self) -> String {
        self.ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zookeeper://127.0.0.1:p1,…/leasehold` (with TLS, add `?tls=true` and the files:
    /// see [`tls`](Self::tls)).
    pub fn url(&self) -> String {
        format!("zookeeper://{}/leasehold", self.connect_string())
    }

    /// The certificates of an ensemble started with [`start_tls`](Self::start_tls)
    /// (`None` without TLS): the CA to trust, the client certificate, and the wrong ones.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|t| &t.files)
    }

    /// Member `i`'s answer to the four-letter word `word` (`srvr`, `stat`, `mntr`, `cons`
    /// or `ruok`), over TLS for an ensemble started with [`start_tls`](Self::start_tls);
    /// an empty string if it gives none (it does not run or serve).
    pub fn four_letter_word(&self, i: usize, word: &str) -> String {
        let port = self.members[i].port();
        match &self.tls {
            Some(tls) => tls_four_letter(port, &tls.files, word),
            None => util::ask(port, word.as_bytes(), 65536, |_| false)
                .map(|a| String::from_utf8_lossy(&a).into_owned())
                .unwrap_or_default(),
        }
    }

    /// Member `i`'s mode (`leader`, `follower`), or `None` if it does not serve.
    pub fn mode(&self, i: usize) -> Option<String> {
        mode_of(&self.four_letter_word(i, "srvr"))
    }

    /// The index of the current leader, if a member says it leads.
    pub fn leader(&self) -> Option<usize> {
        (0..Self::SIZE).find(|&i| self.mode(i).as_deref() == Some("leader"))
    }

    /// Waits up to `timeout` for a member to say it leads (a loaded machine may leave a
    /// member's answer to `srvr` late, or the ensemble between leaders for a moment).
    pub fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
        crate::util::poll_until(timeout, Duration::from_millis(50), || self.leader())
    }

    /// Member `i`'s log.
    pub fn log(&self, i: usize) -> String {
        self.members[i].log()
    }

    /// Kills member `i` with `SIGKILL` and waits for it.
    pub fn kill(&self, i: usize) {
        self.members[i].kill();
    }

    /// Freezes member `i` with `SIGSTOP`.
    pub fn pause(&self, i: usize) {
        self.members[i].pause();
    }

    /// Continues member `i`.
    pub fn resume(&self, i: usize) {
        self.members[i].process().resume();
    }

    /// Whether member `i`'s process is alive.
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].process().is_running()
    }

    /// Starts member `i` again on its ports and data directory after
    /// [`kill`](Self::kill), and waits until it serves.
    ///
    /// # Panics
    ///
    /// Panics if it is still running or does not rejoin within 60 s.
    pub fn start_again(&self, i: usize) {
        self.members[i].start_again();
    }

    /// Kills member `i` and starts it again.
    pub fn restart(&self, i: usize) {
        self.kill(i);
        self.start_again(i);
    }

    /// Freezes every member.
    pub fn pause_all(&self) {
        for m in &self.members {
            m.pause();
        }
    }

    /// Continues every member.
    pub fn resume_all(&self) {
        for m in &self.members {
            m.process().resume();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::last_cxid;

    #[test]
    fn the_last_request_of_a_session_is_read_from_its_cons_line() {
        let cons = " /127.0.0.1:41000[1](queued=0,recved=12,sent=12,sid=0x1000012ab0000,lop=CREA,\
                    est=1700000000000,to=8000,lcxid=0x1f,lzxid=0x2a,lresp=1,llat=0,minlat=0,avglat=0.3,maxlat=2)\n \
                    /127.0.0.1:41002[1](queued=0,recved=3,sent=3,sid=0x1000012ab0001,lop=PING,\
                    est=1700000000000,to=8000,lcxid=0x2,lzxid=0xffffffffffffffff,lresp=1)\n";
        assert_eq!(last_cxid(cons, 0x1000012ab0000), Some(0x1f));
        assert_eq!(last_cxid(cons, 0x1000012ab0001), Some(2));
        assert_eq!(
            last_cxid(cons, 0x1000012ab00),
            None,
            "a prefix of another sid"
        );
        assert_eq!(last_cxid(cons, 7), None);
    }
}
