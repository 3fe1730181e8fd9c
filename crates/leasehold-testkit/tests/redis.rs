//! Private redis-server: start, pause/resume, restart, options.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use leasehold_testkit::{RedisOptions, RedisServer};

/// Sends an inline PING on `stream` and returns the raw reply (or the read error).
fn ping_on(stream: &mut TcpStream, timeout: Duration) -> std::io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"PING\r\n")?;
    read_reply(stream)
}

fn read_reply(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = [0u8; 128];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn fresh_ping(redis: &RedisServer, timeout: Duration) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(redis.addr())?;
    ping_on(&mut stream, timeout)
}

#[test]
fn start_pause_resume_restart() {
    let redis = RedisServer::start();
    let port = redis.port();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{port}/"));
    assert_eq!(redis.addr().port(), port);
    assert_eq!(
        fresh_ping(&redis, Duration::from_secs(10)).unwrap(),
        "+PONG\r\n"
    );
    assert_eq!(redis.cli(&["PING"]), "PONG");
    assert_eq!(redis.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(redis.cli(&["GET", "k"]), "v");

    // Paused: the kernel still accepts the connection, but PING hangs.
    let mut waiting = TcpStream::connect(redis.addr()).unwrap();
    redis.pause();
    assert!(redis.is_paused());
    let err = ping_on(&mut waiting, Duration::from_millis(500)).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "unexpected error while paused: {err}"
    );
    let mut fresh = TcpStream::connect(redis.addr()).expect("connect while paused");
    let err = ping_on(&mut fresh, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut
    ));

    // Resumed: the pending PINGs are answered, new ones too.
    redis.resume();
    assert!(!redis.is_paused());
    waiting
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(read_reply(&mut waiting).unwrap(), "+PONG\r\n");
    fresh
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(read_reply(&mut fresh).unwrap(), "+PONG\r\n");
    assert_eq!(
        fresh_ping(&redis, Duration::from_secs(10)).unwrap(),
        "+PONG\r\n"
    );

    // Crash restart on the same port: without persistence the data is gone.
    let old_pid = redis.pid();
    redis.restart();
    assert_ne!(redis.pid(), old_pid);
    assert_eq!(redis.port(), port);
    assert_eq!(redis.cli(&["PING"]), "PONG");
    assert_eq!(redis.cli(&["EXISTS", "k"]), "0");

    // Killed: not running, connections refused; start_again brings it back.
    redis.kill();
    assert!(!redis.is_running());
    assert!(TcpStream::connect(redis.addr()).is_err());
    redis.start_again();
    assert!(redis.is_running());
    assert_eq!(redis.cli(&["PING"]), "PONG");
}

#[test]
fn appendonly_survives_clean_and_crash_restart() {
    let redis = RedisServer::start_with(
        RedisOptions::new()
            .appendonly(true)
            .arg("--appendfsync")
            .arg("always"),
    );
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nyes"
    );
    assert_eq!(redis.cli(&["SET", "durable", "1"]), "OK");
    redis.stop_and_restart();
    assert_eq!(redis.cli(&["GET", "durable"]), "1");
    assert_eq!(redis.cli(&["SET", "durable", "2"]), "OK");
    redis.restart();
    assert_eq!(redis.cli(&["GET", "durable"]), "2");
}

#[test]
fn password_and_debug_command() {
    let redis = RedisServer::start_with(
        RedisOptions::new()
            .password("s3cret")
            .enable_debug_command(),
    );
    let reply = fresh_ping(&redis, Duration::from_secs(10)).unwrap();
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    assert!(!redis.url().contains("s3cret"));
    assert_eq!(
        redis.authed_url(),
        format!("redis://:s3cret@127.0.0.1:{}/", redis.port())
    );
    // cli authenticates by itself.
    assert_eq!(redis.cli(&["PING"]), "PONG");
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "0"]), "OK");
    assert_eq!(
        redis.cli(&["ACL", "SETUSER", "app", "on", ">pw", "~app:*", "+@all"]),
        "OK"
    );
    assert!(redis.cli(&["ACL", "LIST"]).contains("user app on"));
}

#[test]
fn missing_command_is_reported_by_cli() {
    let redis = RedisServer::start();
    let answer = redis.cli(&["NOSUCHCOMMAND"]);
    assert!(answer.contains("ERR"), "{answer}");
}

#[test]
fn drop_kills_a_paused_server() {
    let redis = RedisServer::start();
    let pid = redis.pid();
    let dir = redis.dir().to_path_buf();
    redis.pause();
    drop(redis);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(!dir.exists(), "temporary directory left behind");
}
