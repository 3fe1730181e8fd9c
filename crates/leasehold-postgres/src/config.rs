//! Connection settings, table names and URL parsing.

use std::fmt;
use std::str::FromStr;

use leasehold_core::{StoreError, StoreErrorKind};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;

use crate::BACKEND_TABLE;

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1` bytes); longer ones would be
/// truncated silently, so they are refused.
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// A table name, optionally qualified by a schema, validated and quoted for SQL.
///
/// Without a schema the table is found through the connection's `search_path` (usually
/// `public`). Identifiers are used exactly as given (case-sensitive, always double-quoted),
/// must be 1 to 63 bytes long and contain no NUL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

fn check_ident(what: &str, s: &str) -> Result<(), StoreError> {
    if s.is_empty() || s.len() > MAX_IDENTIFIER_LEN || s.contains('\0') {
        return Err(StoreError::new(
            StoreErrorKind::Config,
            BACKEND_TABLE,
            format!("{what} name must be 1..=63 bytes without NUL, got {s:?}"),
        ));
    }
    Ok(())
}

/// `s` as a double-quoted SQL identifier.
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

impl TableName {
    /// A table `table` in schema `schema` (or on the `search_path` when `None`).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when a name is empty, longer than
    /// [`MAX_IDENTIFIER_LEN`] bytes or contains NUL.
    pub fn new(schema: Option<&str>, table: &str) -> Result<Self, StoreError> {
        if let Some(s) = schema {
            check_ident("schema", s)?;
        }
        check_ident("table", table)?;
        Ok(Self {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// The schema, if qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table's own name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The same table name in another schema (or on the `search_path` when `None`).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn in_schema(&self, schema: Option<&str>) -> Result<Self, StoreError> {
        Self::new(schema, &self.table)
    }

    /// The quoted, possibly schema-qualified name as it appears in SQL, e.g.
    /// `"leasehold"."leasehold_leases"`.
    pub fn sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote_ident(s), quote_ident(&self.table)),
            None => quote_ident(&self.table),
        }
    }

    /// The table `table` (a valid identifier) in the same schema as this one.
    pub(crate) fn sibling(&self, table: &'static str) -> Self {
        Self {
            schema: self.schema.clone(),
            table: table.to_owned(),
        }
    }

    /// The name as a string literal for `to_regclass`.
    pub(crate) fn regclass_literal(&self) -> String {
        format!("'{}'", self.sql().replace('\'', "''"))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sql())
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({})", self.sql())
    }
}

/// The default table of the lease-table store.
pub const DEFAULT_LEASE_TABLE: &str = "leasehold_leases";
/// The default table of the advisory-lock store.
pub const DEFAULT_ADVISORY_TABLE: &str = "leasehold_advisory";
/// The default records table ([`Store::put_record`](leasehold_core::Store::put_record)),
/// shared by both stores, in the schema of the store's table.
pub const DEFAULT_RECORD_TABLE: &str = "leasehold_records";
/// The default guard table.
pub const DEFAULT_GUARD_TABLE: &str = "leasehold_guard";
/// The default idempotency table.
pub const DEFAULT_IDEMPOTENCY_TABLE: &str = "leasehold_idempotency";
/// The default `application_name` prefix of the stores' connections.
pub const DEFAULT_APPLICATION_NAME: &str = "leasehold";

/// How to reach PostgreSQL and which table to use: the settings both stores share.
///
/// Built from a URL ([`PgConfig::from_url`]) or from sqlx's [`PgConnectOptions`]
/// ([`PgConfig::from_options`]). The password is kept only inside the connect options:
/// `Debug` and `Display` show `postgres://user@host:port/database` and the table, never
/// the password.
///
/// ## URL
/// `postgres://user:password@host:port/database?params` (also `postgresql://`, and
/// `postgres+advisory://` / `postgresql+advisory://`, which only select the store in
/// [`PgFactory`](crate::PgFactory)). Every parameter sqlx knows (`sslmode`,
/// `application_name`, `options`, ...) is passed on; leasehold's own are:
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `leasehold_schema` | the schema of the lease table | the `search_path` |
/// | `leasehold_table` | the lease table | `leasehold_leases` (`leasehold_advisory` for the advisory store) |
/// | `leasehold_pool_size` | the pool's maximum connections | 10 |
/// | `leasehold_migrate` | `true`: create the table when the store is opened | `false` |
/// | `leasehold_pooler` | `transaction`: connected through a transaction-pooling proxy such as PgBouncer in `transaction` mode (see [`Pooler`]) | `none` |
/// | `leasehold_wait_sessions` | how many callers of one store may wait for a lease at once, each on a session of its own in the server's lock queue (0..=10000; 0: waiters poll) | 64 |
///
/// Any other parameter is a configuration error (a typo must not be ignored): the
/// parameters sqlx reads are [`SQLX_PARAMETERS`]. Without a password in the URL, sqlx takes
/// it from `PGPASSWORD`, else from the file `PGPASSFILE` names (else `~/.pgpass`); the
/// other `PG*` variables fill in what the URL leaves out (`PGUSER`, `PGDATABASE`, …).
#[derive(Clone)]
pub struct PgConfig {
    connect: PgConnectOptions,
    table: Option<TableName>,
    pool_size: u32,
    migrate: bool,
    pooler: Pooler,
    application_name: String,
    wait_sessions: u32,
}

/// The default of [`PgConfig::wait_sessions`].
pub const DEFAULT_WAIT_SESSIONS: u32 = 64;

/// What sits between the stores and PostgreSQL.
///
/// A transaction-pooling proxy (PgBouncer in `transaction` mode) hands each transaction to
/// whichever server connection is free, so nothing may outlive a transaction on a
/// connection: not a session lock, not a named prepared statement (sqlx names and caches
/// statements per client connection; PgBouncer before 1.21 does not track them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// A direct connection, or a pooler in `session` mode.
    ///
    /// Not behind a transaction-pooling proxy: there the lease-table store's named
    /// prepared statements meet server connections they were not made on. That fails with
    /// a `Config` error naming `leasehold_pooler`, a protocol error, or (seen with
    /// PgBouncer 1.18) runs another client's statement, so an answer may be wrong.
    #[default]
    None,
    /// A transaction-pooling proxy: the lease-table store sends each operation as one
    /// simple-protocol statement (values inlined as escaped literals, one round trip, no
    /// prepared statement), and the advisory-lock store refuses to open (its locks live in
    /// a session).
    Transaction,
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("target", &self.target())
            .field("sslmode", &self.connect.get_ssl_mode())
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("migrate", &self.migrate)
            .field("pooler", &self.pooler)
            .field("application_name", &self.application_name)
            .field("wait_sessions", &self.wait_sessions)
            .finish()
    }
}

impl fmt::Display for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.target())
    }
}

/// The connection parameters of a `postgres://` URL that sqlx reads (and passes on);
/// `options[NAME]` sets the server setting NAME too. Every other parameter but leasehold's
/// own is refused: sqlx would only log and ignore it.
pub const SQLX_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Whether sqlx reads the URL parameter `name` ([`SQLX_PARAMETERS`], `options[…]`).
fn is_sqlx_parameter(name: &str) -> bool {
    SQLX_PARAMETERS.contains(&name) || (name.starts_with("options[") && name.ends_with(']'))
}

fn config_err(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, BACKEND_TABLE, message)
}

impl PgConfig {
    /// Parses a `postgres://` URL (see the type's docs for the accepted forms).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for a malformed URL, a bad port, an unknown scheme, an
    /// invalid `leasehold_*` parameter or an unknown parameter (neither leasehold's nor one
    /// of [`SQLX_PARAMETERS`]). The message never repeats the URL.
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_core::StoreErrorKind;
    /// use leasehold_postgres::{PgConfig, Pooler};
    ///
    /// let config = PgConfig::from_url(
    ///     "postgres://app:s3cret@db.internal:5432/app?leasehold_schema=locks&leasehold_pool_size=4",
    /// )?;
    /// assert_eq!(config.get_pool_size(), 4);
    /// assert_eq!(config.get_pooler(), Pooler::None);
    /// assert!(!config.to_string().contains("s3cret")); // never printed
    ///
    /// // A misspelt leasehold parameter is refused, not ignored.
    /// let err = PgConfig::from_url("postgres://app@db/app?leasehold_pool=4").unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// # Ok::<(), leasehold_core::StoreError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let mut parsed =
            url::Url::parse(url).map_err(|e| config_err(format!("invalid PostgreSQL URL: {e}")))?;
        match parsed.scheme() {
            "postgres" | "postgresql" | "postgres+advisory" | "postgresql+advisory" => {}
            other => {
                return Err(config_err(format!(
                    "unsupported URL scheme `{other}`: use postgres://, postgresql://, postgres+advisory:// or postgresql+advisory://"
                )));
            }
        }
        let mut schema = None;
        let mut table = None;
        let mut pool_size = 10;
        let mut migrate = false;
        let mut pooler = Pooler::None;
        let mut wait_sessions = DEFAULT_WAIT_SESSIONS;
        let mut rest: Vec<(String, String)> = Vec::new();
        for (k, v) in parsed.query_pairs() {
            match &*k {
                "leasehold_schema" => schema = Some(v.into_owned()),
                "leasehold_table" => table = Some(v.into_owned()),
                "leasehold_pool_size" => {
                    pool_size = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| config_err("leasehold_pool_size must be 1..=1000"))?;
                }
                "leasehold_migrate" => {
                    migrate = match &*v {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(config_err("leasehold_migrate must be true or false")),
                    }
                }
                "leasehold_pooler" => {
                    pooler = match &*v {
                        "none" | "session" => Pooler::None,
                        "transaction" => Pooler::Transaction,
                        _ => {
                            return Err(config_err(
                                "leasehold_pooler must be none, session or transaction",
                            ));
                        }
                    }
                }
                "leasehold_wait_sessions" => {
                    wait_sessions = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n <= 10_000)
                        .ok_or_else(|| config_err("leasehold_wait_sessions must be 0..=10000"))?;
                }
                k if !is_sqlx_parameter(k) => {
                    let shown: String = k.chars().take(32).collect();
                    return Err(config_err(format!(
                        "unknown URL parameter `{shown}`; known: leasehold_schema, leasehold_table, leasehold_pool_size, leasehold_migrate, leasehold_pooler, leasehold_wait_sessions, and sqlx's {}, options[NAME]",
                        SQLX_PARAMETERS.join(", ")
                    )));
                }
                _ => rest.push((k.into_owned(), v.into_owned())),
            }
        }
        if rest.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(rest);
        }
        // sqlx does not look at the scheme; normalise it anyway.
        let normalised =
            parsed
                .as_str()
                .replacen(&format!("{}://", parsed.scheme()), "postgres://", 1);
        let normalised = url::Url::parse(&normalised)
            .map_err(|e| config_err(format!("invalid PostgreSQL URL: {e}")))?;
        let connect = PgConnectOptions::from_url(&normalised).map_err(|e| {
            // sqlx's configuration errors name the bad parameter, never the password.
            config_err(format!("invalid PostgreSQL URL: {}", sanitize(&e)))
        })?;
        let table = match table {
            Some(t) => Some(TableName::new(schema.as_deref(), &t)?),
            None => match schema {
                Some(s) => {
                    check_ident("schema", &s)?;
                    // The table name is filled in by each store; keep the schema.
                    Some(TableName {
                        schema: Some(s),
                        table: String::new(),
                    })
                }
                None => None,
            },
        };
        Ok(Self {
            connect,
            table,
            pool_size,
            migrate,
            pooler,
            application_name: DEFAULT_APPLICATION_NAME.to_owned(),
            wait_sessions,
        })
        .map(|c| c.with_app_name_from_url())
    }

    fn with_app_name_from_url(mut self) -> Self {
        if let Some(name) = self.connect.get_application_name() {
            self.application_name = name.to_owned();
        }
        self
    }

    /// Settings from sqlx connect options (which may carry a password; it stays there).
    pub fn from_options(connect: PgConnectOptions) -> Self {
        Self {
            connect,
            table: None,
            pool_size: 10,
            migrate: false,
            pooler: Pooler::None,
            application_name: DEFAULT_APPLICATION_NAME.to_owned(),
            wait_sessions: DEFAULT_WAIT_SESSIONS,
        }
        .with_app_name_from_url()
    }

    /// What sits between the stores and PostgreSQL (default [`Pooler::None`]).
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// The configured [`Pooler`].
    pub fn get_pooler(&self) -> Pooler {
        self.pooler
    }

    /// Uses `table` instead of the store's default table.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = Some(table);
        self
    }

    /// The maximum number of pooled connections (default 10). The advisory-lock store
    /// opens one more dedicated connection per held lease.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// How many callers of one store may wait for a lease at the same time (default
    /// [`DEFAULT_WAIT_SESSIONS`]). Each waiter waits on a connection of its own, in the
    /// server's lock queue, so that waiters are woken by the release and served in the
    /// order they came (see the crate's README); mind `max_connections`. A caller beyond
    /// the limit backs off and retries; 0 turns waiting off (every waiter backs off and
    /// retries, as behind a transaction-pooling proxy).
    pub fn wait_sessions(mut self, n: u32) -> Self {
        self.wait_sessions = n;
        self
    }

    /// The configured [`wait_sessions`](Self::wait_sessions).
    pub fn get_wait_sessions(&self) -> u32 {
        self.wait_sessions
    }

    /// Whether opening a store through [`PgFactory`](crate::PgFactory) first runs its
    /// idempotent migration (default `false`).
    pub fn migrate_on_open(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// The `application_name` prefix of the stores' connections (default `leasehold`, or
    /// the URL's `application_name`). The advisory-lock store names each holder's
    /// connection `<prefix>/<owner token>` so an operator can find it in
    /// `pg_stat_activity`.
    pub fn application_name(mut self, prefix: &str) -> Self {
        self.application_name = prefix.to_owned();
        self
    }

    /// The guard (its tables and SQL function) in the schema the URL names with
    /// `leasehold_schema` (on the `search_path` without one): where `leasehold migrate`
    /// puts it.
    pub fn guard(&self) -> crate::PgGuard {
        match self.table.as_ref().and_then(|t| t.schema.as_deref()) {
            Some(schema) => crate::PgGuard::with_tables(
                TableName::new(Some(schema), DEFAULT_GUARD_TABLE).expect("checked schema"),
                TableName::new(Some(schema), DEFAULT_IDEMPOTENCY_TABLE).expect("checked schema"),
            ),
            None => crate::PgGuard::new(),
        }
    }

    /// The lease table a store uses: the configured one, with `default` as the table name
    /// when only a schema (or nothing) was given ([`DEFAULT_LEASE_TABLE`] for the
    /// lease-table store, [`DEFAULT_ADVISORY_TABLE`] for the advisory-lock store).
    pub fn table_or(&self, default: &str) -> TableName {
        match &self.table {
            Some(t) if !t.table.is_empty() => t.clone(),
            Some(t) => TableName {
                schema: t.schema.clone(),
                table: default.to_owned(),
            },
            None => TableName {
                schema: None,
                table: default.to_owned(),
            },
        }
    }

    /// The connect options (they may hold the password: do not log them with `{:?}`).
    pub fn connect_options(&self) -> &PgConnectOptions {
        &self.connect
    }

    /// The configured maximum pool size.
    pub fn get_pool_size(&self) -> u32 {
        self.pool_size
    }

    /// Whether the store is migrated when opened through the factory.
    pub fn get_migrate_on_open(&self) -> bool {
        self.migrate
    }

    /// The `application_name` prefix.
    pub fn get_application_name(&self) -> &str {
        &self.application_name
    }

    /// `postgres://user@host:port/database` (no password), for logs and errors.
    pub fn target(&self) -> String {
        let c = &self.connect;
        let host = match c.get_socket() {
            Some(p) => p.display().to_string(),
            None => c.get_host().to_owned(),
        };
        format!(
            "postgres://{}@{}:{}/{}",
            c.get_username(),
            host,
            c.get_port(),
            c.get_database().unwrap_or("")
        )
    }

    /// Connect options for one connection named `application_name`, without statement
    /// logging below `debug`.
    pub(crate) fn options_named(&self, application_name: &str) -> PgConnectOptions {
        self.connect
            .clone()
            .application_name(application_name)
            .log_statements(tracing::log::LevelFilter::Trace)
    }
}

/// Opens one connection to check the address and credentials (failing fast, unlike a pool
/// that retries until its timeout), then makes the pool.
pub(crate) async fn open_pool(
    config: &PgConfig,
    backend: &'static str,
) -> Result<sqlx::PgPool, StoreError> {
    use sqlx::Connection;
    leasehold_sql::tls::install_provider();
    let opts = config.options_named(config.get_application_name());
    let probe = sqlx::PgConnection::connect_with(&opts)
        .await
        .map_err(|e| crate::error::map_connect(backend, "connecting", e, &opts))?;
    let _ = probe.close().await;
    // The pool opens its first connection now, so the first operation does not pay for
    // connecting (and authenticating) inside its time budget.
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.get_pool_size())
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(opts.clone())
        .await
        .map_err(|e| crate::error::map_connect(backend, "connecting", e, &opts))
}

impl FromStr for PgConfig {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_url(s)
    }
}

/// A sqlx configuration error as text. sqlx builds these from the offending parameter
/// name or a parse error; it never includes the password, but be defensive: cut anything
/// after an `@` that could be a URL's userinfo.
fn sanitize(e: &sqlx::Error) -> String {
    let s = e.to_string();
    if s.contains("://") {
        "malformed connection parameters".to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_hide_password() {
        let c = PgConfig::from_url(
            "postgres://app:s3ntinel-pw@db.example:6543/leases?leasehold_schema=lh&leasehold_pool_size=4&sslmode=disable",
        )
        .unwrap();
        assert_eq!(c.target(), "postgres://app@db.example:6543/leases");
        assert_eq!(c.get_pool_size(), 4);
        assert_eq!(
            c.table_or(DEFAULT_LEASE_TABLE).sql(),
            "\"lh\".\"leasehold_leases\""
        );
        for s in [format!("{c}"), format!("{c:?}")] {
            assert!(!s.contains("s3ntinel-pw"), "{s}");
        }
        let c = PgConfig::from_url("postgresql+advisory://u@h/d?leasehold_table=t").unwrap();
        assert_eq!(c.table_or(DEFAULT_ADVISORY_TABLE).sql(), "\"t\"");
    }

    #[test]
    fn bad_urls_are_config_errors_without_secrets() {
        for url in [
            "postgres://u:s3ntinel-pw@h:99999/d",
            "mysql://u:s3ntinel-pw@h/d",
            "postgres://u:s3ntinel-pw@h/d?leasehold_tabel=x",
            "postgres://u:s3ntinel-pw@h/d?leasehold_pool_size=0",
            "postgres://u:s3ntinel-pw@h/d?leasehold_table=",
            "postgres://u:s3ntinel-pw@h/d?leasehold_wait_sessions=10001",
            "postgres://u:s3ntinel-pw@h/d?leasehold_wait_sessions=-1",
            "postgres://u:s3ntinel-pw@h/d?bogus=1",
            "postgres://u:s3ntinel-pw@h/d?connect_timeout=2",
            "not a url s3ntinel-pw",
        ] {
            let e = PgConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{url}: {e}");
            assert!(!e.to_string().contains("s3ntinel-pw"), "{e}");
            assert!(!format!("{e:?}").contains("s3ntinel-pw"), "{e:?}");
        }
    }

    #[test]
    fn sqlx_parameters_pass_and_others_are_refused_by_name() {
        let c = PgConfig::from_url(
            "postgres://u@h/d?sslmode=disable&application_name=app&options[statement_timeout]=5s",
        )
        .unwrap();
        assert_eq!(c.get_application_name(), "app");
        let e = PgConfig::from_url("postgres://u@h/d?bogus=1").unwrap_err();
        assert!(
            e.to_string().contains("unknown URL parameter `bogus`"),
            "{e}"
        );
        assert_eq!(e.refusal(), None);
    }

    #[test]
    fn wait_sessions() {
        let c = PgConfig::from_url("postgres://u@h/d").unwrap();
        assert_eq!(c.get_wait_sessions(), DEFAULT_WAIT_SESSIONS);
        let c = PgConfig::from_url("postgres+advisory://u@h/d?leasehold_wait_sessions=0").unwrap();
        assert_eq!(c.get_wait_sessions(), 0);
        assert_eq!(c.wait_sessions(3).get_wait_sessions(), 3);
    }

    #[test]
    fn identifiers() {
        assert!(TableName::new(None, "").is_err());
        assert!(TableName::new(Some("a\0b"), "t").is_err());
        assert!(TableName::new(None, &"x".repeat(64)).is_err());
        assert_eq!(
            TableName::new(Some("My \"S\""), "t").unwrap().sql(),
            "\"My \"\"S\"\"\".\"t\""
        );
        assert_eq!(
            TableName::new(None, "it's").unwrap().regclass_literal(),
            "'\"it''s\"'"
        );
    }
}
