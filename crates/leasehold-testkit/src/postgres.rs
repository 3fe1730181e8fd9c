//! A private PostgreSQL cluster on its own port and temporary directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::server::{Home, Launch, Server};
use crate::tls::{CLIENT_CERT_USER, ServerCert, TlsFiles};
use crate::util;

const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`Postgres::start_with`].
#[derive(Debug, Clone, Default)]
pub struct PostgresOptions {
    /// Keep `fsync` on. Off by default (`-c fsync=off`) for speed; durability
    /// and crash tests must turn it on.
    pub fsync: bool,
    /// Extra server settings, each passed as `-c name=value`.
    pub settings: Vec<(String, String)>,
    /// Lines put at the top of `pg_hba.conf` before the server first starts (so they
    /// hold from its first connection, with no reload to wait for); the rest of the file
    /// trusts every local and `127.0.0.1` connection.
    pub hba: Vec<String>,
    /// TLS required: `ssl=on` with fresh certificates ([`TlsFiles`], in `DIR/tls`), the
    /// server presenting the one named here, and every plaintext TCP connection rejected
    /// (`hostnossl all all all reject` at the top of `pg_hba.conf`, so the lines after it
    /// admit TLS connections only). `None`: no TLS (the default).
    pub tls: Option<ServerCert>,
    /// With [`tls`](Self::tls): the role [`CLIENT_CERT_USER`] logs in only with a client
    /// certificate signed by the test CA whose common name is the role's name
    /// (`hostssl all leasehold_cert 127.0.0.1/32 trust clientcert=verify-full`). The role
    /// itself is created by the test.
    pub client_cert_auth: bool,
}

impl PostgresOptions {
    /// Default options: `fsync=off`, no extra settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Turns `fsync` on or off.
    pub fn fsync(mut self, on: bool) -> Self {
        self.fsync = on;
        self
    }

    /// Requires a SCRAM password over TCP from `role` (created later, e.g. with
    /// `CREATE ROLE role LOGIN PASSWORD '…'`): a `pg_hba.conf` line ahead of the trusting
    /// ones. The superuser `postgres` stays trusted.
    pub fn password_role(mut self, role: &str) -> Self {
        self.hba
            .push(format!("host all {role} 127.0.0.1/32 scram-sha-256"));
        self
    }

    /// Requires TLS, the server presenting `cert` (see [`tls`](Self::tls)).
    pub fn tls(mut self, cert: ServerCert) -> Self {
        self.tls = Some(cert);
        self
    }

    /// Requires a client certificate from the role [`CLIENT_CERT_USER`] (see
    /// [`client_cert_auth`](Self::client_cert_auth)); turns TLS on if it is not.
    pub fn client_cert_auth(mut self) -> Self {
        self.tls.get_or_insert(ServerCert::Localhost);
        self.client_cert_auth = true;
        self
    }

    /// Adds a `-c name=value` server setting.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }
}

/// A private PostgreSQL server: `initdb` into a temporary directory owned by
/// the `postgres` OS user (trust authentication, superuser `postgres`), then
/// `postgres -D DIR/data -p PORT -k DIR -c listen_addresses=127.0.0.1`, both
/// run as `postgres` through `setpriv` (which execs, so the child is the
/// postmaster).
///
/// [`pause`](Self::pause) and [`kill`](Self::kill) act on the postmaster and
/// all its backends. Dropping it shuts the server down (immediate mode, then
/// `SIGKILL` if needed) and removes the directory.
#[derive(Debug)]
pub struct Postgres {
    server: Server<Launcher>,
    tls: Option<TlsFiles>,
}

/// How the postmaster is started: as `postgres` through `setpriv`, with these options.
#[derive(Debug)]
struct Launcher {
    setpriv: PathBuf,
    bin: PathBuf,
    opts: PostgresOptions,
}

/// Finds `/usr/lib/postgresql/<version>/bin` (the highest version present).
///
/// # Panics
///
/// Panics with an install hint if PostgreSQL is not installed.
pub fn postgres_bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .unwrap_or_else(|| panic!("postgres not found: install package postgresql"))
}

fn pg_binary(bin: &Path, name: &str) -> PathBuf {
    let path = bin.join(name);
    assert!(
        path.is_file(),
        "{name} not found in {}: install package postgresql",
        bin.display()
    );
    path
}

impl Postgres {
    /// Starts a server with default options (`fsync=off`) and waits until it
    /// accepts connections.
    ///
    /// # Panics
    ///
    /// Panics if PostgreSQL or `setpriv` is missing, or setup fails.
    pub fn start() -> Self {
        Self::start_with(PostgresOptions::default())
    }

    /// Starts a server with `opts` and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// Panics if PostgreSQL or `setpriv` is missing, or setup fails.
    pub fn start_with(mut opts: PostgresOptions) -> Self {
        let bin = postgres_bin_dir();
        let setpriv = util::find_binary("setpriv", "util-linux");
        let initdb = pg_binary(&bin, "initdb");
        // The socket path (DIR/.s.PGSQL.PORT) must stay short.
        let (tmp, pg_user) = util::temp_dir_owned_by("leasehold-pg-", "postgres", "postgresql");
        let dir = tmp.path().to_path_buf();

        let mut cmd = as_postgres(&setpriv, &initdb);
        cmd.current_dir(&dir)
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .arg("--locale=C.UTF-8");
        let started = Instant::now();
        let out = util::run_with_timeout(&mut cmd, INITDB_TIMEOUT, "initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            util::describe_output(&out)
        );
        tracing::debug!(elapsed = ?started.elapsed(), "initdb done");
        let tls = opts.tls.map(|cert| {
            let tls_dir = dir.join("tls");
            fs::create_dir(&tls_dir).expect("create DIR/tls");
            let files = TlsFiles::create(&tls_dir);
            // The server reads its key as `postgres`, and refuses a key others can read.
            let (cert_file, key_file) = cert.files(&files);
            for path in [&tls_dir, &cert_file, &key_file] {
                util::chown(path, &pg_user);
            }
            let mut settings = vec![
                ("ssl".to_owned(), "on".to_owned()),
                ("ssl_cert_file".to_owned(), path_setting(&cert_file)),
                ("ssl_key_file".to_owned(), path_setting(&key_file)),
                ("ssl_ca_file".to_owned(), path_setting(&files.ca_cert())),
            ];
            settings.append(&mut opts.settings);
            opts.settings = settings;
            let mut hba = vec!["hostnossl all all all reject".to_owned()];
            if opts.client_cert_auth {
                hba.push(format!(
                    "hostssl all {CLIENT_CERT_USER} 127.0.0.1/32 trust clientcert=verify-full"
                ));
            }
            hba.append(&mut opts.hba);
            opts.hba = hba;
            files
        });
        if !opts.hba.is_empty() {
            // Rewritten in place, so the file keeps its owner (`postgres`).
            let hba = dir.join("data/pg_hba.conf");
            let old = fs::read_to_string(&hba).expect("read pg_hba.conf");
            let new = format!("{}\n{old}", opts.hba.join("\n"));
            fs::write(&hba, new).expect("write pg_hba.conf");
        }

        let launcher = Launcher { setpriv, bin, opts };
        Self {
            server: Server::start(launcher, Home::Own(tmp)),
            tls,
        }
    }

    /// The certificates of a server started with [`PostgresOptions::tls`] (`None`
    /// without TLS): the CA to trust, the client certificate, and the wrong ones.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for_db("postgres")
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url_for_db(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port())
    }

    /// The data directory (`DIR/data`).
    pub fn data_dir(&self) -> PathBuf {
        self.server.dir().join("data")
    }

    /// The directory holding the Unix socket (`-k`).
    pub fn socket_dir(&self) -> &Path {
        self.server.dir()
    }

    /// The directory with the PostgreSQL binaries in use.
    pub fn bin_dir(&self) -> &Path {
        &self.server.launch().bin
    }

    /// The options the server was started with.
    pub fn options(&self) -> &PostgresOptions {
        &self.server.launch().opts
    }

    /// The server log (stdout and stderr of every start).
    pub fn log(&self) -> String {
        self.server.log()
    }

    crate::server::server_methods!("The TCP port on 127.0.0.1.", "`127.0.0.1:port`.");

    /// Fast shutdown (`SIGINT`: sessions are ended, a checkpoint is written).
    pub fn stop(&self) {
        self.server.stop(Signal::SIGINT, STOP_TIMEOUT);
    }

    /// Immediate shutdown (`SIGQUIT`, like `pg_ctl stop -m immediate`): no
    /// checkpoint, the next start runs crash recovery.
    pub fn stop_immediate(&self) {
        self.server.stop(Signal::SIGQUIT, STOP_TIMEOUT);
    }

    /// Starts the server again on the same data directory and port, after
    /// [`stop`](Self::stop), [`stop_immediate`](Self::stop_immediate) or
    /// [`kill`](Self::kill), and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// Panics if it is still running or does not get ready.
    pub fn start_again(&self) {
        self.server.start_again();
    }

    /// Fast shutdown then start again.
    pub fn restart(&self) {
        self.stop();
        self.start_again();
    }

    /// A `psql` command connected as `postgres` to database `postgres` over
    /// TCP, with `-X -q -A -t -v ON_ERROR_STOP=1` (no psqlrc, unaligned
    /// tuples only).
    pub fn psql_command(&self) -> Command {
        let mut cmd = Command::new(pg_binary(self.bin_dir(), "psql"));
        cmd.current_dir(self.socket_dir())
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
            ])
            .arg(self.port().to_string())
            .args(["-U", "postgres", "-d", "postgres"])
            .env("PGCONNECT_TIMEOUT", "10");
        cmd
    }

    /// Runs `sql` with `psql -c` and returns stdout without the trailing
    /// newline, or the error output if psql failed.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let mut cmd = self.psql_command();
        cmd.arg("-c").arg(sql);
        let out = util::run_with_timeout(&mut cmd, PSQL_TIMEOUT, "psql");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
        } else {
            Err(util::describe_output(&out))
        }
    }

    /// Runs `sql` with `psql -c` and returns stdout without the trailing
    /// newline (one line per row, columns separated by `|`).
    ///
    /// # Panics
    ///
    /// Panics if psql fails or takes more than 60 s.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql {sql:?} on port {} failed: {e}", self.port()))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let process = self.server.process();
        if process.is_running() {
            // An immediate shutdown lets the postmaster reap its backends and
            // remove its shared memory; a bare SIGKILL would leak both.
            process.terminate(Signal::SIGQUIT, Duration::from_secs(20));
        } else {
            drop(process);
            self.remove_stale_shared_memory();
        }
    }
}

impl Postgres {
    /// After a `SIGKILL`, the System V shared memory segment named in
    /// `postmaster.pid` is left behind: mark it for removal.
    fn remove_stale_shared_memory(&self) {
        let Ok(pidfile) = fs::read_to_string(self.data_dir().join("postmaster.pid")) else {
            return;
        };
        let Some(shmid) = pidfile
            .lines()
            .nth(6)
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|id| id.parse::<u64>().ok())
        else {
            return;
        };
        if let Some(ipcrm) = util::try_find_binary("ipcrm") {
            let mut cmd = Command::new(ipcrm);
            cmd.arg("-m").arg(shmid.to_string());
            let _ = util::run_with_timeout(&mut cmd, Duration::from_secs(10), "ipcrm");
        }
    }
}

/// A path as a quoted server setting value.
fn path_setting(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "''"))
}

fn as_postgres(setpriv: &Path, program: &Path) -> Command {
    let mut cmd = Command::new(setpriv);
    cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
        .arg(program);
    cmd
}

impl Launch for Launcher {
    const NAME: &'static str = crate::proof::POSTGRES;
    const LOGS: &'static [&'static str] = &["postgres.log"];
    const PORT_TAKEN: &'static [&'static str] = &["could not bind"];

    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let mut cmd = as_postgres(&self.setpriv, &pg_binary(&self.bin, "postgres"));
        cmd.current_dir(dir)
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(dir)
            .args(["-c", "listen_addresses=127.0.0.1"]);
        if !self.opts.fsync {
            cmd.args(["-c", "fsync=off"]);
        }
        for (name, value) in &self.opts.settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        ServerProcess::spawn(format!("postgres:{port}"), cmd, &dir.join("postgres.log"))
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        let pg_isready = pg_binary(&self.bin, "pg_isready");
        ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(50), || {
            let mut cmd = Command::new(&pg_isready);
            cmd.args(["-q", "-h", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .args(["-U", "postgres", "-t", "5"]);
            util::run_with_timeout(&mut cmd, Duration::from_secs(30), "pg_isready")
                .status
                .success()
        })
    }
}
