//! Issue 27 items 4 and 6, against real private servers (each on its own port and data
//! directory, killed on drop): every cause of a store failure in docs/cli.md's "Errors a
//! script can expect" gets its exit status and the first words of its one line on
//! standard error — a bad URL (unknown scheme, unknown PostgreSQL parameter) 64; refused
//! credentials, a missing database, a missing privilege, a missing or unwritable SQLite
//! file or directory, missing tables, a closed port 69; `memory://` and an unusable
//! password file 64; an empty `LEASEHOLD_STORE` is the default store — and passwords stay
//! off the command line: `PGPASSWORD`, `PGPASSFILE`, `--store-password-file` and
//! `LEASEHOLD_STORE_PASSWORD_FILE` authenticate, and no password ever shows in a message,
//! in leasehold's command line or in its environment.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use leasehold_testkit::{MariaDb, Postgres, PostgresOptions, RedisOptions, RedisServer};

mod common;

use common::{Env, stderr, stdout};

/// The password of every account the tests make; it must never be printed.
const SECRET: &str = "S3cret-pw-2027";

/// A `leasehold` command with no password or PostgreSQL setting inherited from the
/// caller, and a home without `.pgpass`.
fn cmd(env: &Env) -> Command {
    let mut c = env.cmd();
    c.env("HOME", env.dir());
    for var in [
        "PGPASSWORD",
        "PGPASSFILE",
        "PGUSER",
        "PGHOST",
        "PGPORT",
        "PGDATABASE",
        "LEASEHOLD_STORE_PASSWORD_FILE",
    ] {
        c.env_remove(var);
    }
    c
}

/// Runs `leasehold ARGS`.
fn run(env: &Env, args: &[&str]) -> Output {
    cmd(env).args(args).output().unwrap()
}

/// Checks that `out` exited `status` with one line on standard error starting with
/// `starts`, and that no password shows anywhere.
fn expect(out: &Output, status: i32, starts: &str, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(status), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: one line expected: {err:?}");
    assert!(
        err.starts_with(starts),
        "{what}: expected {starts:?}…, got {err}"
    );
    no_secret(out, what);
}

/// No password in what a command printed.
fn no_secret(out: &Output, what: &str) {
    for text in [stdout(out), stderr(out)] {
        assert!(!text.contains(SECRET), "{what} shows the password: {text}");
    }
}

/// A file holding `content` (mode 0600, as `PGPASSFILE` needs).
fn secret_file(env: &Env, name: &str, content: &str) -> String {
    let path = env.path(name);
    std::fs::write(&path, content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `leasehold run` shows no password in its own command line or environment: its command
/// prints both (`/proc/$PPID`: leasehold is the command's parent).
fn run_shows_no_password(env: &Env, extra: &[(&str, &str)], args: &[&str]) {
    let mut c = cmd(env);
    for (k, v) in extra {
        c.env(k, v);
    }
    let out = c
        .args(args)
        .args([
            "run",
            "--key",
            "job:ps",
            "--",
            "sh",
            "-c",
            "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; tr '\\0' '\\n' < /proc/$PPID/environ",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let seen = stdout(&out);
    assert!(seen.contains("leasehold"), "{seen}");
    no_secret(&out, "run's command line and environment");
}

/// PostgreSQL: refused credentials (wrong, or none at all), a missing database, a missing
/// privilege, missing tables, a closed port, an unknown parameter; then the four ways to
/// give a password without a command line that shows it.
#[test]
fn postgres_causes_and_passwords_off_the_command_line() {
    let env = Env::new();
    let pg = Postgres::start_with(PostgresOptions::new().password_role("lh_pw"));
    pg.psql(&format!("CREATE ROLE lh_pw LOGIN PASSWORD '{SECRET}'"));
    let port = pg.port();
    let at = |user: &str, db: &str| format!("postgres://{user}@127.0.0.1:{port}/{db}");
    let wrong = format!("postgres://lh_pw:wrong-{SECRET}@127.0.0.1:{port}/postgres");
    let closed = leasehold_testkit::free_port();

    let auth =
        "leasehold: store error: authentication failed (check the user name and the password";
    expect(
        &run(&env, &["--store", &wrong, "inspect", "k"]),
        69,
        auth,
        "wrong password",
    );
    let no_password = at("lh_pw", "postgres");
    expect(
        &run(&env, &["--store", &no_password, "list"]),
        69,
        auth,
        "no password",
    );
    expect(
        &run(
            &env,
            &["--store", &at("postgres", "no_such_db"), "inspect", "k"],
        ),
        69,
        "leasehold: store error: no such database (create it, or fix the database name",
        "missing database",
    );
    expect(
        &run(
            &env,
            &["--store", &at("postgres", "postgres"), "inspect", "k"],
        ),
        69,
        "leasehold: store error: leasehold's tables are missing (create them with leasehold migrate)",
        "missing tables",
    );
    let bogus = format!("{}?bogus=1", at("postgres", "postgres"));
    let out = run(&env, &["--store", &bogus, "inspect", "k"]);
    expect(&out, 64, "leasehold: bad store URL: ", "unknown parameter");
    assert!(
        stderr(&out).contains("unknown URL parameter `bogus`"),
        "{}",
        stderr(&out)
    );
    let down = format!("postgres://postgres@127.0.0.1:{closed}/postgres");
    expect(
        &run(&env, &["--store", &down, "inspect", "k"]),
        69,
        "leasehold: store error: unavailable (is the store running",
        "closed port",
    );

    // The tables exist, but lh_pw may not use them.
    let right = format!("postgres://lh_pw:{SECRET}@127.0.0.1:{port}/postgres");
    let out = run(&env, &["--store", &at("postgres", "postgres"), "migrate"]);
    assert!(out.status.success(), "migrate: {}", stderr(&out));
    expect(
        &run(&env, &["--store", &right, "inspect", "k"]),
        69,
        "leasehold: store error: permission denied (grant the user what leasehold needs",
        "no privilege",
    );
    pg.psql(
        "GRANT ALL ON ALL TABLES IN SCHEMA public TO lh_pw; \
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO lh_pw; \
         GRANT ALL ON ALL FUNCTIONS IN SCHEMA public TO lh_pw",
    );

    // Passwords off the command line.
    let ok = |out: Output, what: &str| {
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        no_secret(&out, what);
    };
    ok(
        cmd(&env)
            .env("PGPASSWORD", SECRET)
            .args(["--store", &no_password, "inspect", "k"])
            .output()
            .unwrap(),
        "PGPASSWORD",
    );
    let pgpass = secret_file(
        &env,
        "pgpass",
        &format!("127.0.0.1:{port}:*:lh_pw:{SECRET}\n"),
    );
    ok(
        cmd(&env)
            .env("PGPASSFILE", &pgpass)
            .args(["--store", &no_password, "inspect", "k"])
            .output()
            .unwrap(),
        "PGPASSFILE",
    );
    let file = secret_file(&env, "pw", &format!("{SECRET}\n"));
    ok(
        run(
            &env,
            &[
                "--store",
                &no_password,
                "--store-password-file",
                &file,
                "list",
            ],
        ),
        "--store-password-file",
    );
    ok(
        cmd(&env)
            .env("LEASEHOLD_STORE", &no_password)
            .env("LEASEHOLD_STORE_PASSWORD_FILE", &file)
            .args(["inspect", "k"])
            .output()
            .unwrap(),
        "LEASEHOLD_STORE_PASSWORD_FILE",
    );
    run_shows_no_password(
        &env,
        &[],
        &["--store", &no_password, "--store-password-file", &file],
    );
    run_shows_no_password(
        &env,
        &[
            ("LEASEHOLD_STORE", &no_password),
            ("LEASEHOLD_STORE_PASSWORD_FILE", &file),
        ],
        &[],
    );

    // A wrong password from the file is refused credentials; a URL with a password and a
    // file is ambiguous; a missing file is named, never read.
    let wrong_file = secret_file(&env, "wrong", &format!("wrong-{SECRET}\n"));
    expect(
        &run(
            &env,
            &[
                "--store",
                &no_password,
                "--store-password-file",
                &wrong_file,
                "list",
            ],
        ),
        69,
        auth,
        "wrong password in the file",
    );
    expect(
        &run(
            &env,
            &["--store", &right, "--store-password-file", &file, "list"],
        ),
        64,
        "leasehold: store password file: ",
        "a password in the URL and a file",
    );
    let missing = env.path("no-such-file");
    let missing = missing.to_str().unwrap();
    // `run --json` prints its object for a failure before the start too.
    let out = run(
        &env,
        &[
            "--store",
            &no_password,
            "--store-password-file",
            missing,
            "run",
            "--json",
            "--key",
            "k",
            "--",
            "true",
        ],
    );
    expect(
        &out,
        64,
        "leasehold: store password file: ",
        "run --json, missing file",
    );
    let object: serde_json::Value =
        serde_json::from_str(stdout(&out).trim_end()).expect("one JSON object");
    assert_eq!(object["outcome"], "usage", "{object}");
    assert_eq!(object["exit_code"], 64, "{object}");
    expect(
        &run(
            &env,
            &[
                "--store",
                &no_password,
                "--store-password-file",
                missing,
                "list",
            ],
        ),
        64,
        &format!("leasehold: store password file: cannot read {missing}: "),
        "missing password file",
    );
}

/// MariaDB: refused credentials, a missing database, a database without privileges, and
/// the password file.
#[test]
fn mariadb_causes_and_the_password_file() {
    let env = Env::new();
    let db = MariaDb::start();
    let port = db.port();
    db.sql(&format!(
        "CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY '{SECRET}'; \
         GRANT ALL ON test.* TO 'app'@'127.0.0.1'; CREATE DATABASE other"
    ));
    let url = |userinfo: &str, name: &str| format!("mysql://{userinfo}@127.0.0.1:{port}/{name}");
    expect(
        &run(
            &env,
            &[
                "--store",
                &url(&format!("app:wrong-{SECRET}"), "test"),
                "list",
            ],
        ),
        69,
        "leasehold: store error: authentication failed (check the user name and the password",
        "wrong password",
    );
    expect(
        &run(&env, &["--store", &url("root", "no_such_db"), "list"]),
        69,
        "leasehold: store error: no such database (create it, or fix the database name",
        "missing database",
    );
    expect(
        &run(
            &env,
            &["--store", &url(&format!("app:{SECRET}"), "other"), "list"],
        ),
        69,
        "leasehold: store error: permission denied (grant the user what leasehold needs",
        "no privilege on the database",
    );
    let file = secret_file(&env, "pw", &format!("{SECRET}\n"));
    let out = run(
        &env,
        &[
            "--store",
            &url("app", "test"),
            "--store-password-file",
            &file,
            "list",
        ],
    );
    assert!(out.status.success(), "password file: {}", stderr(&out));
    no_secret(&out, "password file");
    run_shows_no_password(
        &env,
        &[],
        &[
            "--store",
            &url("app", "test"),
            "--store-password-file",
            &file,
        ],
    );
}

/// Redis and Redlock with `requirepass`: refused credentials (none, or wrong), and the
/// password file.
#[test]
fn redis_and_redlock_causes_and_the_password_file() {
    let env = Env::new();
    let redis = RedisServer::start_with(RedisOptions::new().password(SECRET));
    let file = secret_file(&env, "pw", &format!("{SECRET}\n"));
    let wrong = secret_file(&env, "wrong", &format!("wrong-{SECRET}\n"));
    let auth =
        "leasehold: store error: authentication failed (check the user name and the password";
    let url = redis.url();
    expect(
        &run(&env, &["--store", &url, "inspect", "k"]),
        69,
        auth,
        "no password",
    );
    expect(
        &run(
            &env,
            &[
                "--store",
                &url,
                "--store-password-file",
                &wrong,
                "inspect",
                "k",
            ],
        ),
        69,
        auth,
        "wrong password",
    );
    let out = run(
        &env,
        &[
            "--store",
            &url,
            "--store-password-file",
            &file,
            "inspect",
            "k",
        ],
    );
    assert!(out.status.success(), "password file: {}", stderr(&out));
    run_shows_no_password(
        &env,
        &[],
        &["--store", &url, "--store-password-file", &file],
    );

    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(RedisOptions::new().password(SECRET)))
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    let redlock = format!("redlock://{}", hosts.join(","));
    expect(
        &run(
            &env,
            &["--store", &redlock, "--store-password-file", &wrong, "list"],
        ),
        69,
        auth,
        "redlock, wrong password",
    );
    let out = run(
        &env,
        &["--store", &redlock, "--store-password-file", &file, "list"],
    );
    assert!(
        out.status.success(),
        "redlock, password file: {}",
        stderr(&out)
    );
    no_secret(&out, "redlock");
}

/// SQLite and the store URL itself: a missing directory (never created), an unwritable
/// file and directory (as an unprivileged user), an unknown scheme, `memory://`, a
/// password file for a store without passwords, and an empty `LEASEHOLD_STORE`.
#[test]
fn sqlite_and_url_causes() {
    let env = Env::new();
    let file = "leasehold: store error: cannot use the database file (its directory must exist";
    let missing_dir = env.path("nonexistent/dir");
    let url = format!("sqlite://{}/x.db", missing_dir.display());
    expect(
        &run(&env, &["--store", &url, "list"]),
        69,
        file,
        "missing directory",
    );
    assert!(
        !env.path("nonexistent").exists(),
        "the directory was created"
    );

    // A directory and a database file of root's, which `nobody` can read but not write.
    let shared = tempfile::Builder::new()
        .prefix("lh-ro-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = shared.path().join("leases.db");
    let db_url = format!("sqlite://{}", db.display());
    let out = run(&env, &["--store", &db_url, "list"]);
    assert!(
        out.status.success(),
        "root makes the file: {}",
        stderr(&out)
    );
    // Reading a read-only database works (`list`); a lease needs writing.
    let as_nobody = |url: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(common::BIN)
            .args(["--store", url, "run", "--key", "k", "--", "true"])
            .env("XDG_STATE_HOME", env.dir())
            .env_remove("LEASEHOLD_STORE");
        c.output().unwrap()
    };
    expect(&as_nobody(&db_url), 69, file, "unwritable file");
    let new_in_shared = format!("sqlite://{}", shared.path().join("new.db").display());
    expect(&as_nobody(&new_in_shared), 69, file, "unwritable directory");

    expect(
        &run(&env, &["--store", "nope://h/", "list"]),
        64,
        "leasehold: bad store URL: ",
        "unknown scheme",
    );
    expect(
        &run(&env, &["--store", "memory://", "list"]),
        64,
        "leasehold: memory:// keeps leases inside one process",
        "memory://",
    );
    let pw = secret_file(&env, "pw", &format!("{SECRET}\n"));
    expect(
        &run(&env, &["--store-password-file", &pw, "list"]),
        64,
        "leasehold: store password file: ",
        "a password for the default (SQLite) store",
    );

    // An empty LEASEHOLD_STORE (and an empty password file setting) is the default.
    let out = cmd(&env)
        .env("LEASEHOLD_STORE", "")
        .env("LEASEHOLD_STORE_PASSWORD_FILE", "")
        .args(["run", "--key", "job:empty", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "LEASEHOLD_STORE=: {}", stderr(&out));
    assert!(
        Path::new(&env.path("leasehold/leases.db")).is_file(),
        "the default store was not used"
    );
}

/// The base64 lines of a PEM key file: none may be printed.
fn key_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 16)
        .map(str::to_owned)
        .collect()
}

/// `run --json` for a store that fails to open: exit 69, the cause's line on standard
/// error, an object with `"outcome": "store_error"` on standard output, and neither the
/// password nor a line of the client key in either.
fn expect_json_failure(env: &Env, args: &[&str], starts: &str, key: &[String], what: &str) {
    let mut all = args.to_vec();
    all.extend(["run", "--json", "--key", "k", "--", "true"]);
    let out = run(env, &all);
    expect(&out, 69, starts, what);
    let object: serde_json::Value =
        serde_json::from_str(stdout(&out).trim_end()).expect("one JSON object");
    assert_eq!(object["outcome"], "store_error", "{what}: {object}");
    for text in [stdout(&out), stderr(&out)] {
        for line in key {
            assert!(
                !text.contains(line.as_str()),
                "{what} shows the key: {text}"
            );
        }
    }
}

const PLAINTEXT: &str = "leasehold: store error: the server refused a connection without TLS";
const UNTRUSTED: &str =
    "leasehold: store error: the server's TLS certificate is not signed by a trusted CA";
const WRONG_HOST: &str =
    "leasehold: store error: the server's TLS certificate does not name the host";
const AUTH: &str =
    "leasehold: store error: authentication failed (check the user name and the password";

/// PostgreSQL with TLS required (issue 28): a plaintext connect, a client trusting another
/// CA and a certificate for another host each have their cause and status; the password
/// from `--store-password-file` authenticates over verified TLS; no password or key line
/// is printed on a wrong password or a failed handshake, in `--json` output too.
#[test]
fn postgres_tls_causes() {
    use leasehold_testkit::ServerCert;
    let env = Env::new();
    let pg = Postgres::start_with(
        PostgresOptions::new()
            .tls(ServerCert::Localhost)
            .password_role("lh_pw"),
    );
    pg.psql(&format!("CREATE ROLE lh_pw LOGIN PASSWORD '{SECRET}'"));
    let tls = pg.tls().unwrap();
    let key = key_lines(&tls.client_key());
    let at = |pg: &Postgres, user: &str, params: &str| {
        format!(
            "postgres://{user}@127.0.0.1:{}/postgres?{params}",
            pg.port()
        )
    };
    let client = format!(
        "sslcert={}&sslkey={}",
        tls.client_cert().display(),
        tls.client_key().display()
    );
    let full = format!(
        "sslmode=verify-full&sslrootcert={}&{client}",
        tls.ca_cert().display()
    );
    let other_ca = format!(
        "sslmode=verify-full&sslrootcert={}&{client}",
        tls.wrong_ca_cert().display()
    );
    let file = secret_file(&env, "pw", &format!("{SECRET}\n"));

    expect(
        &run(
            &env,
            &[
                "--store",
                &at(&pg, "lh_pw", "sslmode=disable"),
                "--store-password-file",
                &file,
                "list",
            ],
        ),
        69,
        PLAINTEXT,
        "plaintext",
    );
    expect_json_failure(
        &env,
        &[
            "--store",
            &at(&pg, "lh_pw", &other_ca),
            "--store-password-file",
            &file,
        ],
        UNTRUSTED,
        &key,
        "another CA",
    );
    expect_json_failure(
        &env,
        &["--store", &at(&pg, &format!("lh_pw:wrong-{SECRET}"), &full)],
        AUTH,
        &key,
        "wrong password over TLS",
    );
    pg.psql("GRANT ALL ON SCHEMA public TO lh_pw");
    let full = format!("{full}&leasehold_migrate=true");
    let out = run(
        &env,
        &[
            "--store",
            &at(&pg, "lh_pw", &full),
            "--store-password-file",
            &file,
            "list",
        ],
    );
    assert!(
        out.status.success(),
        "password file over TLS: {}",
        stderr(&out)
    );
    no_secret(&out, "password file over TLS");

    let other_host = Postgres::start_with(PostgresOptions::new().tls(ServerCert::WrongHost));
    let full = format!(
        "sslmode=verify-full&sslrootcert={}",
        other_host.tls().unwrap().ca_cert().display()
    );
    let out = run(
        &env,
        &["--store", &at(&other_host, "postgres", &full), "list"],
    );
    expect(&out, 69, WRONG_HOST, "another host");
    assert!(stderr(&out).contains("`127.0.0.1`"), "{}", stderr(&out));
}

/// MariaDB with TLS required (issue 28): as [`postgres_tls_causes`].
#[test]
fn mariadb_tls_causes() {
    use leasehold_testkit::{MariaDbOptions, ServerCert};
    let env = Env::new();
    let db = MariaDb::start_with(MariaDbOptions::new().tls(ServerCert::Localhost));
    db.sql(&format!(
        "CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY '{SECRET}'; \
         GRANT ALL ON test.* TO 'app'@'127.0.0.1'"
    ));
    let tls = db.tls().unwrap();
    let key = key_lines(&tls.client_key());
    let at = |db: &MariaDb, user: &str, params: &str| {
        format!("mysql://{user}@127.0.0.1:{}/test?{params}", db.port())
    };
    let client = format!(
        "ssl-cert={}&ssl-key={}",
        tls.client_cert().display(),
        tls.client_key().display()
    );
    let full = format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={}&{client}",
        tls.ca_cert().display()
    );
    let other_ca = format!(
        "ssl-mode=verify_identity&ssl-ca={}&{client}",
        tls.wrong_ca_cert().display()
    );
    let file = secret_file(&env, "pw", &format!("{SECRET}\n"));

    expect(
        &run(
            &env,
            &[
                "--store",
                &at(&db, "app", "ssl-mode=DISABLED"),
                "--store-password-file",
                &file,
                "list",
            ],
        ),
        69,
        PLAINTEXT,
        "plaintext",
    );
    expect_json_failure(
        &env,
        &[
            "--store",
            &at(&db, "app", &other_ca),
            "--store-password-file",
            &file,
        ],
        UNTRUSTED,
        &key,
        "another CA",
    );
    expect_json_failure(
        &env,
        &["--store", &at(&db, &format!("app:wrong-{SECRET}"), &full)],
        AUTH,
        &key,
        "wrong password over TLS",
    );
    let out = run(
        &env,
        &[
            "--store",
            &at(&db, "app", &full),
            "--store-password-file",
            &file,
            "list",
        ],
    );
    assert!(
        out.status.success(),
        "password file over TLS: {}",
        stderr(&out)
    );
    no_secret(&out, "password file over TLS");

    let other_host = MariaDb::start_with(MariaDbOptions::new().tls(ServerCert::WrongHost));
    let full = format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        other_host.tls().unwrap().ca_cert().display()
    );
    let out = run(&env, &["--store", &at(&other_host, "root", &full), "list"]);
    expect(&out, 69, WRONG_HOST, "another host");
    assert!(stderr(&out).contains("`127.0.0.1`"), "{}", stderr(&out));
}

/// Redis and Redlock with TLS only (issue 28): their handshake failures are the same
/// `leasehold::TlsFailure` as the other stores', so a client trusting another CA and a
/// certificate for another host exit 69 with the same lines, never "bad store URL"; the
/// password stays out of every line.
#[test]
fn redis_and_redlock_tls_causes() {
    use leasehold_testkit::{ServerCert, TlsFiles};
    let env = Env::new();
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    let redis = RedisServer::start_with(
        RedisOptions::new()
            .password(SECRET)
            .tls(files.clone(), ServerCert::Localhost),
    );
    let port = redis.port();
    let at = |scheme: &str, ca: &Path| {
        format!(
            "{scheme}://:{SECRET}@127.0.0.1:{port}/?tls_ca={}",
            ca.display()
        )
    };
    let out = run(&env, &["--store", &at("rediss", &files.ca_cert()), "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let wrong_ca = at("rediss", &files.wrong_ca_cert());
    expect(
        &run(&env, &["--store", &wrong_ca, "list"]),
        69,
        UNTRUSTED,
        "rediss, another CA",
    );
    let more: Vec<RedisServer> = (0..2)
        .map(|_| {
            RedisServer::start_with(
                RedisOptions::new()
                    .password(SECRET)
                    .tls(files.clone(), ServerCert::Localhost),
            )
        })
        .collect();
    let redlock = format!(
        "redlock://:{SECRET}@127.0.0.1:{port},127.0.0.1:{},127.0.0.1:{}/?tls=true&tls_ca={}",
        more[0].port(),
        more[1].port(),
        files.wrong_ca_cert().display()
    );
    expect(
        &run(&env, &["--store", &redlock, "list"]),
        69,
        UNTRUSTED,
        "redlock, another CA",
    );

    let other_dir = tempfile::tempdir().unwrap();
    let other_files = TlsFiles::create(other_dir.path());
    let other = RedisServer::start_with(
        RedisOptions::new().tls(other_files.clone(), ServerCert::WrongHost),
    );
    let url = format!(
        "rediss://127.0.0.1:{}/?tls_ca={}",
        other.port(),
        other_files.ca_cert().display()
    );
    let out = run(&env, &["--store", &url, "list"]);
    expect(&out, 69, WRONG_HOST, "rediss, another host");
    assert!(stderr(&out).contains("127.0.0.1"), "{}", stderr(&out));
    // Plaintext to the TLS-only port: dropped by the server, then found to speak TLS.
    let plain = format!("redis://:{SECRET}@127.0.0.1:{port}/?connect_timeout=2s");
    let out = run(&env, &["--store", &plain, "list"]);
    expect(&out, 69, PLAINTEXT, "redis:// to a TLS port");
    assert!(
        stderr(&out).contains("rediss:// for redis://"),
        "{}",
        stderr(&out)
    );
}
