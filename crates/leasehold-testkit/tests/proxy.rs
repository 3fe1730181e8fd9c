//! FaultProxy against a tiny in-test echo server, one test per mode.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use leasehold_testkit::{FaultProxy, ProxyMode};

/// An echo server that also records every byte it received.
struct Echo {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Echo {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let log = Arc::clone(&log);
                thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                log.lock().unwrap().extend_from_slice(&buf[..n]);
                                if conn.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        Self { addr, received }
    }

    fn received(&self) -> Vec<u8> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until the server has received `expected` in total.
    fn wait_received(&self, expected: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.received() != expected {
            assert!(
                Instant::now() < deadline,
                "echo server received {:?}, expected {:?}",
                String::from_utf8_lossy(&self.received()),
                String::from_utf8_lossy(expected)
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

fn connect(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// Reads exactly `n` bytes within a generous timeout.
fn read_exact(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

/// Asserts that nothing arrives within `wait` (the read times out).
fn assert_silent(stream: &mut TcpStream, wait: Duration) {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        Ok(0) => panic!("connection closed, expected silence"),
        Ok(n) => panic!("received {:?}, expected silence", &buf[..n]),
        Err(e) => panic!("read failed with {e}, expected silence"),
    }
}

/// Asserts that the connection gets reset (within a generous timeout).
fn assert_reset(stream: &mut TcpStream) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    // The proxy sends the RST by itself: no need to write (a write that hit
    // the RST first would consume the error and the read would see EOF).
    match stream.read(&mut buf) {
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("expected a connection reset, got {other:?}"),
    }
}

#[test]
fn pass_echoes_and_counts_connections() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert_eq!(proxy.upstream(), echo.addr);
    let mut a = connect(&proxy);
    a.write_all(b"hello").unwrap();
    assert_eq!(read_exact(&mut a, 5), b"hello");
    let mut b = connect(&proxy);
    b.write_all(b"world").unwrap();
    assert_eq!(read_exact(&mut b, 5), b"world");
    assert_eq!(proxy.connections(), 2);
    assert_eq!(proxy.active_connections(), 2);

    // A client close is propagated: the echo server closes, and so does the
    // proxy's side.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.active_connections() != 1 {
        assert!(Instant::now() < deadline, "closed connection still counted");
        thread::sleep(Duration::from_millis(10));
    }

    // A large transfer goes through intact.
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut writer = b.try_clone().unwrap();
    let sent = payload.clone();
    let t = thread::spawn(move || writer.write_all(&sent).unwrap());
    assert_eq!(read_exact(&mut b, payload.len()), payload);
    t.join().unwrap();
}

#[test]
fn delay_delays_both_directions() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let mut s = connect(&proxy);
    s.write_all(b"warm").unwrap();
    assert_eq!(read_exact(&mut s, 4), b"warm");

    // Switching the mode affects the existing connection.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300)));
    assert_eq!(proxy.mode(), ProxyMode::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    s.write_all(b"slow").unwrap();
    assert_eq!(read_exact(&mut s, 4), b"slow");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(590),
        "round trip took {elapsed:?}, expected >= 2 x 300 ms"
    );

    proxy.set_mode(ProxyMode::Pass);
    s.write_all(b"fast").unwrap();
    assert_eq!(read_exact(&mut s, 4), b"fast");
}

#[test]
fn drop_replies_forwards_but_returns_nothing() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let mut s = connect(&proxy);
    s.write_all(b"a").unwrap();
    assert_eq!(read_exact(&mut s, 1), b"a");
    // A connection that sends nothing while replies are dropped loses nothing.
    let mut quiet = connect(&proxy);
    quiet.write_all(b"q").unwrap();
    assert_eq!(read_exact(&mut quiet, 1), b"q");

    proxy.set_mode(ProxyMode::DropReplies);
    s.write_all(b"applied").unwrap();
    echo.wait_received(b"aqapplied");
    assert_silent(&mut s, Duration::from_millis(700));

    // Back to normal: the connection that lost a reply is reset (a real one never
    // delivers what follows a gap); the one that lost nothing goes on, and so do new ones.
    assert_eq!(proxy.resets(), 0, "nothing is reset while the loss lasts");
    proxy.set_mode(ProxyMode::Pass);
    assert_reset(&mut s);
    quiet.write_all(b"still").unwrap();
    assert_eq!(read_exact(&mut quiet, 5), b"still");
    let mut after = connect(&proxy);
    after.write_all(b"next").unwrap();
    assert_eq!(read_exact(&mut after, 4), b"next");
    assert_eq!(
        proxy.resets(),
        1,
        "only the connection that lost a reply is reset"
    );
}

#[test]
fn blackhole_neither_forwards_nor_replies_nor_closes() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let mut old = connect(&proxy);
    old.write_all(b"1").unwrap();
    assert_eq!(read_exact(&mut old, 1), b"1");

    proxy.set_mode(ProxyMode::Blackhole);
    old.write_all(b"lost").unwrap();
    // New connections are accepted but hang too.
    let mut new = connect(&proxy);
    new.write_all(b"also lost").unwrap();
    // The client can even half-close: nothing is propagated.
    new.shutdown(std::net::Shutdown::Write).unwrap();
    assert_silent(&mut old, Duration::from_millis(700));
    assert_silent(&mut new, Duration::from_millis(300));
    assert_eq!(echo.received(), b"1", "blackholed bytes reached the server");

    proxy.set_mode(ProxyMode::Pass);
    let mut after = connect(&proxy);
    after.write_all(b"ok").unwrap();
    assert_eq!(read_exact(&mut after, 2), b"ok");
    // The held half-close is delivered once the blackhole is lifted.
    new.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(new.read(&mut buf).unwrap(), 0);
}

#[test]
fn reset_resets_existing_and_new_connections() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let mut old = connect(&proxy);
    old.write_all(b"x").unwrap();
    assert_eq!(read_exact(&mut old, 1), b"x");

    proxy.set_mode(ProxyMode::Reset);
    assert_reset(&mut old);
    let mut new = connect(&proxy);
    assert_reset(&mut new);

    proxy.set_mode(ProxyMode::Pass);
    let mut after = connect(&proxy);
    after.write_all(b"back").unwrap();
    assert_eq!(read_exact(&mut after, 4), b"back");
}

#[test]
fn reset_all_keeps_the_mode() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let mut a = connect(&proxy);
    let mut b = connect(&proxy);
    a.write_all(b"a").unwrap();
    b.write_all(b"b").unwrap();
    assert_eq!(read_exact(&mut a, 1), b"a");
    assert_eq!(read_exact(&mut b, 1), b"b");

    proxy.reset_all();
    assert_reset(&mut a);
    assert_reset(&mut b);
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    let mut c = connect(&proxy);
    c.write_all(b"c").unwrap();
    assert_eq!(read_exact(&mut c, 1), b"c");
}

#[test]
fn unreachable_upstream_resets_clients() {
    // Bind and drop a listener to get an address that refuses connections.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = FaultProxy::start(dead);
    let mut s = connect(&proxy);
    assert_reset(&mut s);
}

#[test]
fn drop_stops_the_proxy() {
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let addr = proxy.addr();
    let mut s = connect(&proxy);
    s.write_all(b"x").unwrap();
    assert_eq!(read_exact(&mut s, 1), b"x");
    drop(proxy);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 8];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    assert!(TcpStream::connect(addr).is_err(), "listener still open");
}

#[tokio::test]
async fn works_from_an_async_test() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = Echo::start();
    let proxy = FaultProxy::start(echo.addr);
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"async").await.unwrap();
    let mut buf = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"async");

    proxy.set_mode(ProxyMode::Blackhole);
    s.write_all(b"gone").await.unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
    assert!(silent.is_err(), "blackhole answered: {silent:?}");
}
