//! A private Redis primary with one replica, watched by three sentinels.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::faketime::FakeWallClock;
use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::redis::{RedisOptions, RedisServer, cli_tls_args, ping, tls_params, tls_ping};
use crate::server::{Home, Launch, Server};
use crate::tls::{ServerCert, TlsFiles};
use crate::util;

/// How long a sentinel may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The administrative ACL user of sentinels started with
/// [`RedisSentinelSet::start_with_sentinel_users`]: allowed every command and channel, used
/// by the sentinels with each other (`sentinel sentinel-user`) and by the test kit's
/// `redis-cli`, never by the store under test.
pub const SENTINEL_ADMIN_USER: &str = "sentinel-admin";
/// The password of [`SENTINEL_ADMIN_USER`].
const SENTINEL_ADMIN_PASSWORD: &str = "testkit-sentinel-admin-pw";

/// One `redis-server --sentinel` process with its own config file and directory.
#[derive(Debug)]
struct Sentinel {
    server: Server<Launcher>,
}

/// How a sentinel is started: `redis-server --sentinel` watching this primary.
#[derive(Debug)]
struct Launcher {
    bin: PathBuf,
    master: String,
    primary_port: u16,
    security: Security,
    /// Clients must present a certificate (TLS only).
    client_auth: bool,
}

/// The set's TLS and passwords, shared by every process of it.
#[derive(Debug, Clone, Default)]
struct Security {
    /// TLS only, everywhere: data servers, replication, sentinels.
    tls: Option<TlsFiles>,
    /// Which certificate the data servers and sentinels present.
    tls_cert: ServerCert,
    /// The data servers' `requirepass` (and `masterauth`).
    data_password: Option<String>,
    /// The sentinels' `requirepass` (and `sentinel sentinel-pass`).
    sentinel_password: Option<String>,
    /// An ACL user on every sentinel (name, password), besides the default user.
    sentinel_user: Option<(String, String)>,
    /// The sentinels' `default` user is off; [`SENTINEL_ADMIN_USER`] serves the sentinels
    /// and the kit instead.
    sentinel_admin: bool,
    /// Further ACL users on every sentinel: name, password, rules (after `on >password`).
    sentinel_acl_users: Vec<(String, String, String)>,
}

/// A primary, a replica of it and three sentinels (quorum 2) monitoring it under a name.
///
/// The sentinels' `down-after-milliseconds` is long (60 s) so that pausing a server in a
/// test does not start a fail-over by itself: fail-overs happen when a test asks for one
/// ([`failover`](Self::failover)). Dropping it kills every process and removes the
/// directories.
#[derive(Debug)]
pub struct RedisSentinelSet {
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    master: String,
    security: Security,
    /// Holds the TLS files, if any (removed on drop, after the processes are killed).
    _tls_home: Option<tempfile::TempDir>,
}

impl RedisSentinelSet {
    /// Starts the primary, the replica (synchronised before this returns) and three
    /// sentinels monitoring the primary as `master`.
    ///
    /// # Panics
    ///
    /// Panics if `redis-server` is missing or a process does not get ready.
    pub fn start(master: &str) -> Self {
        Self::start_with(master, &[])
    }

    /// [`start`](Self::start), with `primary_args` added to the first primary's command
    /// line only (e.g. `--rename-command REPLICAOF ""` for a primary the sentinels cannot
    /// demote: a split brain).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(master: &str, primary_args: &[&str]) -> Self {
        Self::launch(master, primary_args, None, Security::default(), None)
    }

    /// [`start`](Self::start), with the replica's wall clock under `clock` (libfaketime):
    /// e.g. a replica whose clock is 5 s ahead of the primary's.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); if libfaketime is not installed.
    pub fn start_with_replica_clock(master: &str, clock: Arc<FakeWallClock>) -> Self {
        Self::launch(master, &[], Some(clock), Security::default(), None)
    }

    /// [`start`](Self::start), everything over TLS only, with fresh certificates
    /// ([`TlsFiles`], see [`tls`](Self::tls)): the data servers and the sentinels listen
    /// with TLS on their port and on no plaintext port, present `cert`, trust the CA,
    /// replicate over TLS and the sentinels reach the servers and each other over TLS
    /// (`tls-replication yes`, with the client certificate). With `client_auth`, every
    /// process requires a client certificate signed by the CA. [`url`](Self::url) is then
    /// `rediss+sentinel://…?tls_ca=…`.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(master: &str, cert: ServerCert, client_auth: bool) -> Self {
        let home = util::temp_dir("leasehold-sentinel-tls-");
        let files = TlsFiles::create(home.path());
        let security = Security {
            tls: Some(files),
            tls_cert: cert,
            ..Security::default()
        };
        Self::launch_secured(master, security, client_auth, Some(home))
    }

    /// [`start`](Self::start), with passwords: the data servers require `data_password`
    /// (the sentinels authenticate to them with it: `sentinel auth-pass`), the sentinels
    /// require `sentinel_password` (`requirepass`; and use it with each other:
    /// `sentinel sentinel-pass`), and, with `sentinel_user`, the sentinels also have that
    /// ACL user (name, password) allowed every command. With `tls`, everything is over TLS
    /// as [`start_tls`](Self::start_tls) (server certificate for `localhost`, no client
    /// certificate required).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with_passwords(
        master: &str,
        data_password: &str,
        sentinel_password: &str,
        sentinel_user: Option<(&str, &str)>,
        tls: bool,
    ) -> Self {
        let home = tls.then(|| util::temp_dir("leasehold-sentinel-tls-"));
        let security = Security {
            tls: home.as_ref().map(|h| TlsFiles::create(h.path())),
            tls_cert: ServerCert::Localhost,
            data_password: Some(data_password.to_owned()),
            sentinel_password: Some(sentinel_password.to_owned()),
            sentinel_user: sentinel_user.map(|(u, p)| (u.to_owned(), p.to_owned())),
            ..Security::default()
        };
        Self::launch_secured(master, security, false, home)
    }

    /// [`start`](Self::start) with sentinels that serve only ACL users: their `default`
    /// user is off, [`SENTINEL_ADMIN_USER`] (every command and channel) is what the
    /// sentinels use with each other and what [`sentinel_cli`](Self::sentinel_cli) uses,
    /// and each of `users` (name, password, ACL rules) exists on every sentinel: a line
    /// `user NAME on >PASSWORD RULES` in `sentinel.conf`, the rules e.g.
    /// `resetchannels -@all +sentinel|master`. The data servers have no password. With
    /// `tls`, everything is over TLS as [`start_tls`](Self::start_tls) (server certificate
    /// for `localhost`, no client certificate required).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with_sentinel_users(
        master: &str,
        users: &[(&str, &str, &str)],
        tls: bool,
    ) -> Self {
        let home = tls.then(|| util::temp_dir("leasehold-sentinel-tls-"));
        let security = Security {
            tls: home.as_ref().map(|h| TlsFiles::create(h.path())),
            tls_cert: ServerCert::Localhost,
            sentinel_admin: true,
            sentinel_acl_users: users
                .iter()
                .map(|(n, p, r)| ((*n).to_owned(), (*p).to_owned(), (*r).to_owned()))
                .collect(),
            ..Security::default()
        };
        Self::launch_secured(master, security, false, home)
    }

    fn launch_secured(
        master: &str,
        security: Security,
        client_auth: bool,
        home: Option<tempfile::TempDir>,
    ) -> Self {
        let mut set = Self::launch(master, &[], None, security, Some(client_auth));
        set._tls_home = home;
        set
    }

    fn launch(
        master: &str,
        primary_args: &[&str],
        replica_clock: Option<Arc<FakeWallClock>>,
        security: Security,
        client_auth: Option<bool>,
    ) -> Self {
        let mut opts = RedisOptions::new().args(["--repl-diskless-sync-delay", "0"]);
        if let Some(files) = &security.tls {
            opts = opts.tls(files.clone(), security.tls_cert);
            if client_auth == Some(true) {
                opts = opts.tls_client_auth();
            }
        }
        if let Some(pw) = &security.data_password {
            opts = opts.password(pw.clone()).args(["--masterauth", pw]);
        }
        let primary = RedisServer::start_with(opts.clone().args(primary_args.iter().copied()));
        let mut replica_opts = opts;
        if let Some(clock) = replica_clock {
            replica_opts = replica_opts.wall_clock(clock);
        }
        let replica = RedisServer::start_with(replica_opts.args([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ]));
        wait_until(
            Duration::from_secs(20),
            "the replica to synchronise",
            || {
                replica
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            },
        );
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master, primary.port(), &security, client_auth))
            .collect();
        let set = Self {
            servers: vec![primary, replica],
            sentinels,
            master: master.to_owned(),
            security,
            _tls_home: None,
        };
        // Every sentinel has found the replica (it fails over to it). A sentinel learns of
        // replicas from the primary's `INFO`, which it asks for when its link is up and then
        // every 10 s: on a loaded machine (`scripts/test --full` once took more than 20 s
        // here) a slow link or one missed round costs 10 s more, so the bound allows a few.
        wait_until(
            Duration::from_secs(60),
            "the sentinels to see the replica",
            || {
                (0..3).all(|i| {
                    set.sentinel_cli(i, &["SENTINEL", "REPLICAS", master])
                        .contains(&set.servers[1].port().to_string())
                })
            },
        );
        set
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        &self.master
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.server.port()).collect()
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/NAME`; for a TLS set
    /// `rediss+sentinel://…/NAME?tls_ca=CA` (with `&tls_cert=…&tls_key=…` when client
    /// certificates are required). Never contains a password.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        match &self.security.tls {
            None => format!("redis+sentinel://{}/{}", hosts.join(","), self.master),
            Some(files) => format!(
                "rediss+sentinel://{}/{}?{}",
                hosts.join(","),
                self.master,
                tls_params(files, self.servers[0].options().tls_client_auth)
            ),
        }
    }

    /// The certificates of a set started with TLS.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.security.tls.as_ref()
    }

    /// The two data servers (the first started as the primary).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The port of the server the first answering sentinel names primary.
    pub fn primary_port(&self) -> u16 {
        for i in 0..self.sentinels.len() {
            let out = self.sentinel_cli(i, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master]);
            if let Some(port) = out.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                return port;
            }
        }
        panic!("no sentinel names a primary for {}", self.master);
    }

    /// The data server on `port`.
    ///
    /// # Panics
    ///
    /// Panics if neither server has that port.
    pub fn server_on(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no data server on port {port}"))
    }

    /// The current primary.
    pub fn primary(&self) -> &RedisServer {
        self.server_on(self.primary_port())
    }

    /// The data server that is not the current primary.
    pub fn replica(&self) -> &RedisServer {
        let p = self.primary_port();
        self.servers
            .iter()
            .find(|s| s.port() != p)
            .expect("two data servers")
    }

    /// `SENTINEL FAILOVER` (forced, no agreement needed) and waits until every sentinel
    /// names the other server and it answers `ROLE` as a primary, and the old primary (if
    /// it runs and obeys) is a replica in sync with it; returns the new primary's port.
    ///
    /// # Panics
    ///
    /// Panics if the fail-over does not complete within 30 s.
    pub fn failover(&self) -> u16 {
        let old = self.primary_port();
        let out = self.sentinel_cli(0, &["SENTINEL", "FAILOVER", &self.master]);
        assert_eq!(out, "OK", "SENTINEL FAILOVER: {out}");
        crate::proof::record(crate::proof::Injected::Failover(crate::proof::REDIS));
        let mut new = old;
        wait_until(Duration::from_secs(30), "the fail-over", || {
            new = self.primary_port();
            new != old && cli_or_empty(self.server_on(new), &["ROLE"]).starts_with("master")
        });
        // Every sentinel has heard of it.
        wait_until(
            Duration::from_secs(30),
            "every sentinel to name the new primary",
            || {
                (0..self.sentinels.len()).all(|i| {
                    self.sentinel_cli(i, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master])
                        .lines()
                        .nth(1)
                        .is_some_and(|p| p.trim() == new.to_string())
                })
            },
        );
        // The old primary, if it runs (and obeys), is turned into a replica.
        let old = self.server_on(old);
        let obeys = !old
            .options()
            .extra_args
            .iter()
            .any(|a| a == "--rename-command");
        if obeys && old.is_running() && !old.is_paused() {
            wait_until(
                Duration::from_secs(30),
                "the old primary to be demoted",
                || cli_or_empty(old, &["ROLE"]).starts_with("slave"),
            );
            // And in sync with the new primary: until then a write that waits for a
            // replica's acknowledgement (`min_replicas`) cannot be served.
            wait_until(
                Duration::from_secs(30),
                "the demoted primary to be in sync with the new one",
                || {
                    let info = cli_or_empty(old, &["INFO", "replication"]);
                    info.contains("master_link_status:up")
                        && info.contains("master_sync_in_progress:0")
                },
            );
        }
        new
    }

    /// Closes the primary's replication connections (`CLIENT KILL TYPE replica`): what it
    /// writes from now on reaches no replica until one reconnects (a paused replica cannot).
    pub fn cut_replication(&self) {
        let out = self.primary().cli(&["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            out.trim().parse::<u32>().is_ok_and(|n| n >= 1),
            "CLIENT KILL: {out}"
        );
    }

    /// Runs `redis-cli` against sentinel `i` (as [`SENTINEL_ADMIN_USER`] on sentinels
    /// started with [`start_with_sentinel_users`](Self::start_with_sentinel_users)).
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        let mut cmd = Command::new(util::find_binary("redis-cli", "redis-tools"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.sentinels[i].server.port().to_string(),
        ]);
        if let Some(files) = &self.security.tls {
            cmd.args(cli_tls_args(files));
        }
        if self.security.sentinel_admin {
            cmd.args(["--user", SENTINEL_ADMIN_USER])
                .env("REDISCLI_AUTH", SENTINEL_ADMIN_PASSWORD);
        } else if let Some(pw) = &self.security.sentinel_password {
            cmd.env("REDISCLI_AUTH", pw);
        }
        cmd.args(args);
        let out = util::run_with_timeout(&mut cmd, Duration::from_secs(30), "redis-cli");
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }
}

impl Sentinel {
    fn start(
        master: &str,
        primary_port: u16,
        security: &Security,
        client_auth: Option<bool>,
    ) -> Self {
        let launcher = Launcher {
            bin: util::find_binary("redis-server", "redis-server"),
            master: master.to_owned(),
            primary_port,
            security: security.clone(),
            client_auth: client_auth == Some(true),
        };
        let home = Home::Own(util::temp_dir("leasehold-sentinel-"));
        Self {
            server: Server::start(launcher, home),
        }
    }
}

impl Launch for Launcher {
    const NAME: &'static str = "redis sentinel";
    const LOGS: &'static [&'static str] = &["log"];
    const PORT_TAKEN: &'static [&'static str] = &["Address already in use"];

    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let conf: PathBuf = dir.join("sentinel.conf");
        let sec = &self.security;
        let mut text = match &sec.tls {
            None => format!("port {port}\n"),
            Some(files) => {
                let (cert, key) = sec.tls_cert.files(files);
                format!(
                    "port 0\ntls-port {port}\ntls-cert-file {cert}\ntls-key-file {key}\n\
                     tls-ca-cert-file {ca}\ntls-client-cert-file {ccert}\n\
                     tls-client-key-file {ckey}\ntls-replication yes\n\
                     tls-auth-clients {auth}\n",
                    cert = cert.display(),
                    key = key.display(),
                    ca = files.ca_cert().display(),
                    ccert = files.client_cert().display(),
                    ckey = files.client_key().display(),
                    auth = if self.client_auth { "yes" } else { "optional" },
                )
            }
        };
        text.push_str(&format!(
            "bind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {master} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {master} 60000\n\
             sentinel failover-timeout {master} 10000\n\
             sentinel parallel-syncs {master} 1\n",
            dir = dir.display(),
            log = dir.join("log").display(),
            master = self.master,
            primary_port = self.primary_port,
        ));
        if let Some(pw) = &sec.data_password {
            text.push_str(&format!("sentinel auth-pass {} {pw}\n", self.master));
        }
        if let Some(pw) = &sec.sentinel_password {
            text.push_str(&format!("requirepass {pw}\nsentinel sentinel-pass {pw}\n"));
        }
        if let Some((user, pw)) = &sec.sentinel_user {
            text.push_str(&format!("user {user} on >{pw} allchannels +@all\n"));
        }
        if sec.sentinel_admin {
            text.push_str(&format!(
                "user default off\n\
                 user {SENTINEL_ADMIN_USER} on >{SENTINEL_ADMIN_PASSWORD} allchannels +@all\n\
                 sentinel sentinel-user {SENTINEL_ADMIN_USER}\n\
                 sentinel sentinel-pass {SENTINEL_ADMIN_PASSWORD}\n"
            ));
        }
        for (user, pw, rules) in &sec.sentinel_acl_users {
            text.push_str(&format!("user {user} on >{pw} {rules}\n"));
        }
        std::fs::write(&conf, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", conf.display()));
        let mut cmd = Command::new(&self.bin);
        cmd.current_dir(dir).arg(&conf).arg("--sentinel");
        ServerProcess::spawn(
            format!("redis-sentinel:{port}"),
            cmd,
            &dir.join("stdout.log"),
        )
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        let auth = self.security.sentinel_password.is_some() || self.security.sentinel_admin;
        if let Some(files) = &self.security.tls {
            let cli = util::find_binary("redis-cli", "redis-tools");
            return ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(50), || {
                tls_ping(&cli, files, port, auth)
            });
        }
        ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(20), || {
            ping(port, auth)
        })
    }
}

/// `redis-cli ARGS` on `server`, its stdout, or nothing if it failed: while a fail-over
/// runs, the sentinels close the servers' client connections (`CLIENT KILL TYPE normal`),
/// and a `redis-cli` caught by it (over TLS: killed by `SIGPIPE`) is simply asked again.
fn cli_or_empty(server: &RedisServer, args: &[&str]) -> String {
    let out = util::run_with_timeout(
        &mut server.cli_command(args),
        Duration::from_secs(30),
        "redis-cli",
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
