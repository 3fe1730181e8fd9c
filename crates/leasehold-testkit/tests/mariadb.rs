//! Private MariaDB: start, query, pause, crash restart.

use std::time::Duration;

use leasehold_testkit::MariaDb;

#[test]
fn start_query_pause_restart() {
    let db = MariaDb::start();
    let port = db.port();
    assert_eq!(db.url(), format!("mysql://root@127.0.0.1:{port}/test"));
    assert_eq!(db.sql("select 1"), "1");
    assert_eq!(db.sql("select database()"), "test");
    assert_eq!(db.sql("select @@port"), port.to_string());
    db.sql("create table t (id int primary key, v varchar(10)) engine=InnoDB");
    db.sql("insert into t values (1, 'one')");
    assert_eq!(
        db.sql(
            "insert into t values (1, 'uno') on duplicate key update v = 'uno'; select v from t"
        ),
        "uno"
    );
    assert!(db.try_sql("select * from no_such_table").is_err());

    db.pause();
    assert!(db.is_paused());
    let mut cmd = db.client_command();
    cmd.arg("--connect-timeout=2").arg("-e").arg("select 1");
    let started = std::time::Instant::now();
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "query answered while paused");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    db.resume();
    assert_eq!(db.sql("select 1"), "1");

    let old_pid = db.pid();
    db.restart();
    assert_ne!(db.pid(), old_pid);
    assert_eq!(db.sql("select v from t"), "uno");
    db.stop();
    assert!(!db.is_running());
    db.start_again();
    assert_eq!(db.sql("select count(*) from t"), "1");
}
