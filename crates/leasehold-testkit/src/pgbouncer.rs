//! A private PgBouncer in front of a private PostgreSQL, on its own port and directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::postgres::Postgres;
use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::server::{Home, Launch, Server};
use crate::util;

/// PgBouncer's pooling mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client session.
    Session,
    /// A server connection per transaction: consecutive transactions of one client may run
    /// on different server connections (and so different backends).
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A private `pgbouncer` (Debian package `pgbouncer`) forwarding every database to a
/// private [`Postgres`] as user `postgres`, with no authentication (`auth_type = any`), a
/// small server pool (`pool_size` connections per database), run as the `postgres` OS user
/// (PgBouncer refuses to run as root). Killed on drop.
#[derive(Debug)]
pub struct PgBouncer {
    server: Server<Launcher>,
}

/// How `pgbouncer` is started: in front of this upstream port, in this mode, with this pool.
#[derive(Debug)]
struct Launcher {
    bin: PathBuf,
    setpriv: PathBuf,
    upstream: u16,
    mode: PoolMode,
    pool_size: u32,
}

impl PgBouncer {
    /// Starts PgBouncer in front of `upstream` in `mode`, with `pool_size` server
    /// connections per database, and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// Panics if `pgbouncer` is not installed or does not get ready.
    pub fn start(upstream: &Postgres, mode: PoolMode, pool_size: u32) -> Self {
        let launcher = Launcher {
            bin: util::find_binary("pgbouncer", "pgbouncer"),
            setpriv: util::find_binary("setpriv", "util-linux"),
            upstream: upstream.port(),
            mode,
            pool_size,
        };
        let (tmp, _) = util::temp_dir_owned_by("leasehold-pgbouncer-", "postgres", "postgresql");
        let pooler = Self {
            server: Server::start(launcher, Home::Own(tmp)),
        };
        if mode == PoolMode::Transaction {
            crate::proof::record(crate::proof::Injected::TransactionPooler);
        }
        pooler
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB` through the pooler.
    pub fn url_for_db(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port())
    }

    /// PgBouncer's log.
    pub fn log(&self) -> String {
        self.server.log()
    }

    crate::server::server_methods!("The TCP port on 127.0.0.1.", "`127.0.0.1:port`.");
}

impl Launch for Launcher {
    const NAME: &'static str = "pgbouncer";
    const LOGS: &'static [&'static str] = &["pgbouncer.log"];
    const PORT_TAKEN: &'static [&'static str] = &["Address already in use"];

    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let ini = dir.join("pgbouncer.ini");
        fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={up} user=postgres\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 200\n\
                 server_reset_query_always = 0\n\
                 ignore_startup_parameters = extra_float_digits,options,search_path\n",
                up = self.upstream,
                mode = self.mode.as_str(),
                pool_size = self.pool_size,
            ),
        )
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", ini.display()));
        let mut cmd = Command::new(&self.setpriv);
        cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
            .arg(&self.bin)
            .arg(&ini)
            .current_dir(dir);
        ServerProcess::spawn(format!("pgbouncer:{port}"), cmd, &dir.join("pgbouncer.log"))
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        ready::wait_ready(
            process,
            Duration::from_secs(30),
            Duration::from_millis(20),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        )
    }
}
