//! `migrate`: create a store's tables, the guard tables and the SQL guard (a function in
//! PostgreSQL, a procedure in MariaDB/MySQL, a view with a trigger in SQLite), or print
//! the SQL for a DBA. And the hint every command gives when those tables are missing.

use std::process::ExitCode;

use clap::Args;
use leasehold::StoreError;
use serde::Serialize;

use crate::admin::ADMIN_TIMEOUT;
use crate::failure::Failure;

/// The subcommand's help after the options.
pub(crate) const HELP: &str = "\
Creates what the store needs, if missing: the lease table, the records table, the guard
and idempotency tables, and the SQL guard any client can call inside its own transaction:
  PostgreSQL     SELECT leasehold_guard('resource', fence);   (raises SQLSTATE LH001)
  MariaDB/MySQL  CALL leasehold_guard('resource', fence);     (SIGNALs SQLSTATE LH001)
  SQLite         INSERT INTO leasehold_guard_check VALUES ('resource', fence);
Idempotent and safe to run concurrently; nothing is changed when everything exists.
Redis needs no schema. Without this command, the URL parameter leasehold_migrate=true
(postgres://, postgres+advisory://) or migrate=true (mysql://, the default) creates the
lease table when a store opens; SQLite creates everything when it opens.
Each step is bounded (10 s for connecting, 10 s per step).

Examples:
  leasehold migrate --store postgres://app@db/app
  leasehold migrate --store 'postgres://app@db/app?leasehold_schema=locks' --print > leasehold.sql
  leasehold migrate --store mysql://app@db/app --json

Exit status:
  0   migrated (everything exists now), or printed with --print
  64  bad usage, or a bad store URL (scheme, host, port, parameters; memory://)
  69  store error (unreachable, refused credentials, no such database, no privilege to
      create, an unusable SQLite file, no answer within 10s)

See docs/shell.md for the shell user's whole journey.";

/// `leasehold migrate` options.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Print the SQL for a DBA to apply instead of running it (connects to nothing).
    #[arg(long)]
    print: bool,
    /// Print a one-object JSON summary.
    #[arg(long, conflicts_with = "print")]
    json: bool,
}

/// What a migration ensured exists.
#[derive(Debug, Serialize)]
struct Summary {
    /// The store's backend (`postgres`, `postgres-advisory`, `mysql`, `mysql-getlock`,
    /// `sqlite`, `redis`).
    store: &'static str,
    /// The store URL without credentials.
    target: String,
    /// The objects that now exist (created or already there).
    objects: Vec<String>,
}

/// Which store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    PgTable,
    PgAdvisory,
    MySqlTable,
    MySqlGetLock,
    Sqlite,
    Other,
}

fn kind_of(url: &str) -> Kind {
    match url.split_once("://").map_or("", |(s, _)| s) {
        "postgres" | "postgresql" => Kind::PgTable,
        "postgres+advisory" | "postgresql+advisory" => Kind::PgAdvisory,
        "mysql" | "mariadb" => Kind::MySqlTable,
        "mysql+getlock" | "mariadb+getlock" => Kind::MySqlGetLock,
        "sqlite" => Kind::Sqlite,
        _ => Kind::Other,
    }
}

/// Runs `leasehold migrate`.
pub(crate) async fn migrate(url: &str, args: MigrateArgs) -> Result<ExitCode, Failure> {
    // The same refusal as every other subcommand, --print included.
    crate::admin::refuse_memory(url)?;
    if args.print {
        return crate::out::print(&sql(url)?);
    }
    // Boxed: every store's connect and migrate futures nested in one async body exceed
    // the compiler's query depth when `--release` builds the test target.
    let summary = Box::pin(run(url)).await?;
    let text = if args.json {
        format!(
            "{}\n",
            serde_json::to_string(&summary).expect("serializable")
        )
    } else {
        format!(
            "{} ({}): ready: {}\n",
            summary.target,
            summary.store,
            summary.objects.join(", ")
        )
    };
    crate::out::print(&text)
}

/// The SQL `migrate` would run on `url`'s store, for a DBA.
fn sql(url: &str) -> Result<String, Failure> {
    use leasehold::{mysql, postgres, sqlite};
    let kind = kind_of(url);
    let header = |what: &str| {
        format!(
            "-- leasehold schema for {what} at {}: what `leasehold migrate` creates.\n",
            redact(url)
        )
    };
    Ok(match kind {
        Kind::PgTable | Kind::PgAdvisory => {
            let config = postgres::PgConfig::from_url(url).map_err(Failure::opening)?;
            let store_sql = if kind == Kind::PgTable {
                postgres::PgLeaseStore::schema_sql_for(
                    &config.table_or(postgres::DEFAULT_LEASE_TABLE),
                )
            } else {
                postgres::PgAdvisoryStore::schema_sql_for(
                    &config.table_or(postgres::DEFAULT_ADVISORY_TABLE),
                )
            };
            let schema = config
                .table_or(postgres::DEFAULT_LEASE_TABLE)
                .schema()
                .map(|s| {
                    format!(
                        "CREATE SCHEMA IF NOT EXISTS \"{}\";\n",
                        s.replace('"', "\"\"")
                    )
                })
                .unwrap_or_default();
            format!(
                "{}-- Apply with: psql -q -v ON_ERROR_STOP=1 --single-transaction -f FILE\n\
                 -- Quiet on success: no NOTICE for what exists already (IF NOT EXISTS).\n\
                 SET client_min_messages = warning;\n{schema}{store_sql}{}",
                header("PostgreSQL"),
                config.guard().schema_sql()
            )
        }
        Kind::MySqlTable | Kind::MySqlGetLock => {
            mysql::MySqlConfig::from_url(url).map_err(Failure::opening)?;
            let table = if kind == Kind::MySqlTable {
                mysql::LEASES_SCHEMA
            } else {
                mysql::LOCKS_SCHEMA
            };
            format!(
                "{}-- Apply with: mariadb DATABASE < FILE (or mysql)\n{table};\n{};\n{}",
                header("MariaDB/MySQL"),
                mysql::RECORDS_SCHEMA,
                mysql::guard::schema_sql()
            )
        }
        Kind::Sqlite => {
            sqlite::SqliteConfig::from_url(url).map_err(Failure::opening)?;
            format!(
                "{}-- Apply with: sqlite3 -bail FILE.db < FILE (opening the store does it too)\n{};\n{};\n{};\n",
                header("SQLite"),
                sqlite::LEASES_SCHEMA,
                sqlite::RECORDS_SCHEMA,
                sqlite::GUARD_SCHEMA
            )
        }
        Kind::Other => {
            let scheme = url.split_once("://").map_or("", |(s, _)| s);
            if !leasehold::registry().schemes().any(|s| s == scheme) {
                return Err(Failure::BadUrl(format!(
                    "unknown scheme `{scheme}://` (see leasehold --help)"
                )));
            }
            format!(
                "-- {}: this store needs no schema; nothing to apply.\n",
                redact(url)
            )
        }
    })
}

/// `call` bounded by [`ADMIN_TIMEOUT`], its timeout naming `backend` and `what`.
async fn admin<T>(
    backend: &'static str,
    what: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    StoreError::bounded(backend, what, ADMIN_TIMEOUT, call).await
}

/// Migrates `url`'s store: its table, the guard tables, the SQL guard.
async fn run(url: &str) -> Result<Summary, Failure> {
    use leasehold::{mysql, postgres, sqlite};
    let kind = kind_of(url);
    match kind {
        Kind::PgTable | Kind::PgAdvisory => {
            let config = postgres::PgConfig::from_url(url).map_err(Failure::opening)?;
            let guard = config.guard();
            // The two PostgreSQL stores have the same migration methods, each its own type.
            macro_rules! migrated {
                ($store:ty, $backend:expr) => {{
                    let backend = $backend;
                    let store = admin(backend, "connecting", <$store>::connect(&config))
                        .await
                        .map_err(Failure::opening)?;
                    admin(backend, "creating the lease table", store.migrate()).await?;
                    let (table, records) = (store.table().clone(), store.records_table().clone());
                    (backend, table, records, store.pool().clone())
                }};
            }
            let (backend, table, records, pool) = if kind == Kind::PgTable {
                migrated!(postgres::PgLeaseStore, postgres::BACKEND_TABLE)
            } else {
                migrated!(postgres::PgAdvisoryStore, postgres::BACKEND_ADVISORY)
            };
            admin(
                backend,
                "creating the guard tables and function",
                guard.migrate(&pool),
            )
            .await?;
            pool.close().await;
            Ok(Summary {
                store: backend,
                target: config.target(),
                objects: vec![
                    format!("table {table}"),
                    format!("table {records}"),
                    format!("table {}", guard.guard_table()),
                    format!("table {}", guard.idempotency_table()),
                    format!("function {}(text, bigint)", guard.function_name()),
                ],
            })
        }
        Kind::MySqlTable | Kind::MySqlGetLock => {
            let config = mysql::MySqlConfig::from_url(url)
                .map_err(Failure::opening)?
                .migrate(true);
            let target = redact(url);
            let (backend, table, pool) = if kind == Kind::MySqlTable {
                let backend = mysql::BACKEND_TABLE;
                let store = admin(
                    backend,
                    "connecting and creating the lease table",
                    mysql::MySqlLeaseStore::connect(config),
                )
                .await
                .map_err(Failure::opening)?;
                (backend, "leasehold_leases", store.pool().clone())
            } else {
                let backend = mysql::BACKEND_GETLOCK;
                let store = admin(
                    backend,
                    "connecting and creating the lock table",
                    mysql::MySqlGetLockStore::connect(config),
                )
                .await
                .map_err(Failure::opening)?;
                (backend, "leasehold_locks", store.pool().clone())
            };
            admin(
                backend,
                "creating the guard tables and procedure",
                mysql::guard::migrate(&pool),
            )
            .await?;
            pool.close().await;
            Ok(Summary {
                store: backend,
                target,
                objects: vec![
                    format!("table {table}"),
                    "table leasehold_records".into(),
                    "table leasehold_guard".into(),
                    "table leasehold_idempotency".into(),
                    "procedure leasehold_guard(resource, fence)".into(),
                ],
            })
        }
        Kind::Sqlite => {
            let config = sqlite::SqliteConfig::from_url(url).map_err(Failure::opening)?;
            let target = config.to_string();
            // Opening creates everything that is missing; migrate() again says so.
            let store = admin(
                sqlite::BACKEND,
                "opening the database",
                sqlite::SqliteStore::connect(config),
            )
            .await
            .map_err(Failure::opening)?;
            admin(sqlite::BACKEND, "creating the tables", store.migrate()).await?;
            store.close().await;
            Ok(Summary {
                store: sqlite::BACKEND,
                target,
                objects: vec![
                    "table leasehold_leases".into(),
                    "table leasehold_records".into(),
                    "table leasehold_guard".into(),
                    "table leasehold_idempotency".into(),
                    "view leasehold_guard_check (with its trigger)".into(),
                ],
            })
        }
        Kind::Other => {
            // Checks that the store can be reached, as any other command would.
            let store = crate::admin::connect(url).await?;
            Ok(Summary {
                store: store.backend(),
                target: redact(url),
                objects: Vec::new(),
            })
        }
    }
}

/// How the PostgreSQL and MariaDB/MySQL stores name this command in a missing-schema
/// message, for any URL: replaced by the command for the user's own URL. Only wording:
/// a missing schema is recognised by type
/// ([`StoreError::is_schema_missing`](leasehold::StoreError::is_schema_missing)).
const GENERIC_COMMAND: &str = "`leasehold migrate --store URL`";

/// A store failure that says leasehold's schema is missing
/// ([`StoreError::is_schema_missing`](leasehold::StoreError::is_schema_missing)),
/// rewritten to name the exact command to run (with `url` stripped of credentials): in
/// place of the store's generic command, or after its message when it names none. Any
/// other failure as it is.
pub(crate) fn explain_missing_schema(url: &str, failure: Failure) -> Failure {
    match failure {
        Failure::Store(e) if e.is_schema_missing() => {
            let command = format!("`leasehold migrate --store '{}'`", redact(url));
            let mut message = if e.message().contains(GENERIC_COMMAND) {
                e.message().replace(GENERIC_COMMAND, &command)
            } else {
                format!("{}: create them with {command}", e.message())
            };
            if let Some(source) = std::error::Error::source(&e) {
                message = format!("{message}: {source}");
            }
            Failure::Store(e.reworded(message))
        }
        other => other,
    }
}

/// URL parameters that never hold a secret, kept in a URL shown back to the user.
const SHOWN_PARAMETERS: &[&str] = &[
    "leasehold_schema",
    "leasehold_table",
    "leasehold_pooler",
    "leasehold_pool_size",
    "sslmode",
    // TLS files are named by path; their content is never part of a URL.
    "sslrootcert",
    "sslcert",
    "sslkey",
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "application_name",
    "socket",
    "timeout",
    "connect_timeout",
    "max_connections",
    "busy_timeout",
    "synchronous",
];

/// `url` without credentials: no password in the user part, and only the parameters of
/// [`SHOWN_PARAMETERS`] (any other could carry a password or a key).
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<store URL>".into();
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let before_query = before_query.split('#').next().unwrap_or("");
    let authority_end = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{user}@{host}")
        }
        None => authority.to_owned(),
    };
    let kept: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| {
            let name = p.split('=').next().unwrap_or("");
            SHOWN_PARAMETERS.contains(&name)
        })
        .collect();
    let mut shown = format!("{scheme}://{authority}{path}");
    if !kept.is_empty() {
        shown.push('?');
        shown.push_str(&kept.join("&"));
    }
    shown
}

#[cfg(test)]
mod tests {
    use leasehold::StoreErrorKind;

    use super::*;

    #[test]
    fn redaction_drops_passwords_and_unknown_parameters() {
        assert_eq!(
            redact(
                "postgres://app:s3cret@db:5433/app?leasehold_schema=locks&password=x&sslmode=require"
            ),
            "postgres://app@db:5433/app?leasehold_schema=locks&sslmode=require"
        );
        assert_eq!(
            redact("mysql://root:p%40ss@127.0.0.1/test"),
            "mysql://root@127.0.0.1/test"
        );
        // The TLS parameters stay, so that the migrate command shown connects the same way.
        assert_eq!(
            redact(
                "mysql://root:pw@db/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=%2Fca.pem&ssl-cert=c&ssl-key=k"
            ),
            "mysql://root@db/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=%2Fca.pem&ssl-cert=c&ssl-key=k"
        );
        assert_eq!(
            redact("postgres://a:pw@db/app?sslmode=verify-full&sslrootcert=%2Fca.pem"),
            "postgres://a@db/app?sslmode=verify-full&sslrootcert=%2Fca.pem"
        );
        assert_eq!(
            redact("sqlite:///var/lib/x/leases.db?busy_timeout=5s"),
            "sqlite:///var/lib/x/leases.db?busy_timeout=5s"
        );
        assert_eq!(redact("rediss://:pw@h1:1,h2:2/"), "rediss://@h1:1,h2:2/");
        assert_eq!(redact("no scheme"), "<store URL>");
    }

    #[test]
    fn a_missing_table_names_the_command_with_the_url_and_no_password() {
        let e = StoreError::schema_missing(
            "postgres",
            "acquire failed: a leasehold table does not exist: create leasehold's tables with `leasehold migrate --store URL`, the URL parameter leasehold_migrate=true, or migrate()",
        );
        let f = explain_missing_schema("postgres://u:pw@h/d", Failure::Store(e));
        let text = f.to_string();
        assert!(
            text.contains("`leasehold migrate --store 'postgres://u@h/d'`"),
            "{text}"
        );
        assert!(!text.contains("pw"), "{text}");
        assert_eq!(f.code(), crate::exit::STORE);
        let other = StoreError::new(StoreErrorKind::Config, "postgres", "permission denied");
        let f = explain_missing_schema("postgres://u:pw@h/d", Failure::Store(other));
        assert_eq!(
            f.to_string(),
            "store error: postgres store: permission denied"
        );
    }

    /// A missing schema is recognised by its type, not by what its message says: one
    /// that names no command still gets the user's; a message that names the command but
    /// is not marked is left alone (and opening with it is a bad URL, exit 64).
    #[test]
    fn a_missing_schema_is_recognised_by_type_not_text() {
        let e = StoreError::schema_missing("sqlite", "acquire: lacks leasehold's tables")
            .with_source(std::io::Error::other("no such table: leasehold_leases"));
        let f = Failure::opening(e);
        assert_eq!(f.code(), crate::exit::STORE);
        let f = explain_missing_schema("sqlite:///var/x.db?key=secret", f);
        assert_eq!(
            f.to_string(),
            "store error: leasehold's tables are missing (create them with leasehold migrate): \
             sqlite store: acquire: lacks leasehold's tables: create them with \
             `leasehold migrate --store 'sqlite:///var/x.db'`: no such table: leasehold_leases"
        );
        assert_eq!(f.code(), crate::exit::STORE);

        let text = "a leasehold table does not exist: run `leasehold migrate --store URL`";
        let unmarked = StoreError::new(StoreErrorKind::Config, "postgres", text);
        let f = explain_missing_schema("postgres://u:pw@h/d", Failure::Store(unmarked));
        assert_eq!(
            f.to_string(),
            format!("store error: postgres store: {text}")
        );
        let f = Failure::opening(StoreError::new(StoreErrorKind::Config, "mysql", text));
        assert!(matches!(f, Failure::BadUrl(_)), "{f}");
        assert_eq!(f.code(), crate::exit::USAGE);
        let f = Failure::opening(StoreError::schema_missing("mysql", "no table"));
        assert!(matches!(f, Failure::Store(_)), "{f}");
    }
}
