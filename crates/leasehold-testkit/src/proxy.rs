//! [`FaultProxy`]: a TCP proxy on 127.0.0.1 that injects network faults.

use std::future::pending;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// How long the proxy waits for the upstream to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the proxy does with the traffic. Changing the mode affects existing
/// connections at their next chunk of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// Forward everything both ways.
    #[default]
    Pass,
    /// Forward everything, holding every chunk (in both directions) for this
    /// long first.
    Delay(Duration),
    /// Forward client bytes to the server but discard everything the server
    /// sends back: a reply lost after the request was applied. When the mode then
    /// changes to one that loses nothing, every connection that lost bytes is reset
    /// (TCP RST): a real connection never delivers what follows data it lost, and a
    /// multiplexed protocol (HTTP/2's flow-control windows and header tables) cannot
    /// go on after a gap in its stream.
    DropReplies,
    /// Accept connections, read and discard client bytes, forward nothing,
    /// reply nothing, close nothing (an end-of-stream from either side is held
    /// until the mode changes). Bytes discarded here are lost for good.
    Blackhole,
    /// Reset (TCP RST) every current connection at once, and every new one
    /// right after accepting it.
    Reset,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicUsize,
    active: AtomicUsize,
    resets: AtomicUsize,
}

/// A TCP proxy from a local port to `upstream`, with switchable faults
/// ([`ProxyMode`]).
///
/// It runs on its own single-threaded tokio runtime in a background thread,
/// so it keeps working from any test: synchronous, on a paused-time runtime or
/// with the test's runtime blocked. Dropping it stops the thread and closes
/// every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    reset_generation: watch::Sender<u64>,
    counters: Arc<Counters>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy in [`ProxyMode::Pass`] on a free port of 127.0.0.1.
    ///
    /// # Panics
    ///
    /// Panics if the listening socket or the runtime cannot be set up.
    pub fn start(upstream: SocketAddr) -> Self {
        Self::start_with_mode(upstream, ProxyMode::Pass)
    }

    /// Starts a proxy in `mode` on a free port of 127.0.0.1.
    ///
    /// # Panics
    ///
    /// Panics if the listening socket or the runtime cannot be set up.
    pub fn start_with_mode(upstream: SocketAddr, mode: ProxyMode) -> Self {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("fault proxy: cannot bind 127.0.0.1:0: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("fault proxy: cannot make the listener non-blocking: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy: no local address: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("fault proxy: cannot build a tokio runtime: {e}"));

        let (mode_tx, _) = watch::channel(mode);
        let (reset_tx, _) = watch::channel(0u64);
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let counters = Arc::new(Counters::default());
        let ctx = Ctx {
            upstream,
            mode: mode_tx.subscribe(),
            reset: reset_tx.subscribe(),
            counters: Arc::clone(&counters),
        };
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(accept_loop(listener, ctx, shutdown_rx));
                // Dropping the runtime drops every connection task and socket.
            })
            .unwrap_or_else(|e| panic!("fault proxy: cannot spawn its thread: {e}"));
        tracing::debug!(%addr, %upstream, ?mode, "fault proxy started");
        Self {
            addr,
            upstream,
            mode: mode_tx,
            reset_generation: reset_tx,
            counters,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    /// The proxy's listening address (connect clients here).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the fault mode for new and existing connections.
    pub fn set_mode(&self, mode: ProxyMode) {
        tracing::debug!(addr = %self.addr, ?mode, "fault proxy mode");
        if mode == ProxyMode::Blackhole {
            crate::proof::record(crate::proof::Injected::Partitioned);
        }
        self.mode.send_replace(mode);
    }

    /// The current fault mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// How many client connections the proxy has accepted since it started.
    pub fn connections(&self) -> usize {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// How many client connections are open right now.
    pub fn active_connections(&self) -> usize {
        self.counters.active.load(Ordering::SeqCst)
    }

    /// How many client connections the proxy has closed with a reset (TCP RST): by the
    /// `Reset` mode or [`reset_all`](Self::reset_all), when a loss to `DropReplies` ended,
    /// or when the upstream could not be reached. Counted before the reset is sent.
    pub fn resets(&self) -> usize {
        self.counters.resets.load(Ordering::SeqCst)
    }

    /// Resets (TCP RST) every current connection, staying in the current mode.
    pub fn reset_all(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy reset_all");
        self.reset_generation.send_modify(|g| *g += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[derive(Clone)]
struct Ctx {
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    reset: watch::Receiver<u64>,
    counters: Arc<Counters>,
}

async fn accept_loop(
    listener: std::net::TcpListener,
    ctx: Ctx,
    mut shutdown: oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "fault proxy: cannot register the listener");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    ctx.counters.accepted.fetch_add(1, Ordering::SeqCst);
                    ctx.counters.active.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(handle(client, ctx.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fault proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// Decrements the active connection count when a connection task ends
/// (including when the runtime drops it).
struct ActiveGuard(Arc<Counters>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resets a client connection, counted first ([`FaultProxy::resets`]).
fn reset_client(ctx: &Ctx, client: TcpStream) {
    ctx.counters.resets.fetch_add(1, Ordering::SeqCst);
    abort(client);
}

/// Closes the socket with a TCP RST instead of a FIN.
fn abort(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn handle(client: TcpStream, mut ctx: Ctx) {
    let _active = ActiveGuard(Arc::clone(&ctx.counters));
    // Mark the current reset generation as seen: only later resets count.
    ctx.reset.borrow_and_update();
    if *ctx.mode.borrow_and_update() == ProxyMode::Reset {
        reset_client(&ctx, client);
        return;
    }
    let _ = client.set_nodelay(true);
    let upstream = match tokio::time::timeout(
        UPSTREAM_CONNECT_TIMEOUT,
        TcpStream::connect(ctx.upstream),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(upstream = %ctx.upstream, error = %e, "fault proxy: upstream connect failed");
            reset_client(&ctx, client);
            return;
        }
        Err(_) => {
            tracing::debug!(upstream = %ctx.upstream, "fault proxy: upstream connect timed out");
            reset_client(&ctx, client);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let (mut client, mut upstream) = (client, upstream);

    let lost = AtomicBool::new(false);
    let clean = {
        let (client_r, client_w) = client.split();
        let (upstream_r, upstream_w) = upstream.split();
        let mode = ctx.mode.clone();
        let mut loss_ends = ctx.mode.clone();
        let to_server = pump(client_r, upstream_w, Direction::ToServer, &mode, &lost);
        let to_client = pump(upstream_r, client_w, Direction::ToClient, &mode, &lost);
        tokio::select! {
            res = async { tokio::try_join!(to_server, to_client) } => res.is_ok(),
            () = until_reset_mode(&mut ctx.mode) => false,
            () = until_reset_all(&mut ctx.reset) => false,
            () = until_loss_ends(&mut loss_ends, &lost) => false,
        }
    };
    if !clean {
        reset_client(&ctx, client);
        abort(upstream);
    }
}

async fn until_reset_mode(mode: &mut watch::Receiver<ProxyMode>) {
    if mode.wait_for(|m| *m == ProxyMode::Reset).await.is_err() {
        pending::<()>().await;
    }
}

/// Returns once the mode has left [`ProxyMode::DropReplies`] for one that loses
/// nothing, if this connection lost bytes to it.
async fn until_loss_ends(mode: &mut watch::Receiver<ProxyMode>, lost: &AtomicBool) {
    loop {
        if mode.changed().await.is_err() {
            pending::<()>().await;
        }
        let now = *mode.borrow_and_update();
        if lost.load(Ordering::SeqCst)
            && !matches!(now, ProxyMode::DropReplies | ProxyMode::Blackhole)
        {
            return;
        }
    }
}

async fn until_reset_all(reset: &mut watch::Receiver<u64>) {
    if reset.changed().await.is_err() {
        pending::<()>().await;
    }
}

async fn until_not_blackhole(mode: &mut watch::Receiver<ProxyMode>) {
    if mode.wait_for(|m| *m != ProxyMode::Blackhole).await.is_err() {
        pending::<()>().await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Copies one direction chunk by chunk, applying the mode current at each chunk.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    direction: Direction,
    mode: &watch::Receiver<ProxyMode>,
    lost: &AtomicBool,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut mode = mode.clone();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // End of stream: a blackhole closes nothing, so hold it.
            until_not_blackhole(&mut mode).await;
            to.shutdown().await?;
            return Ok(());
        }
        let mut current = *mode.borrow_and_update();
        if let ProxyMode::Delay(delay) = current {
            tokio::time::sleep(delay).await;
            // The mode may have changed while the chunk was held.
            current = *mode.borrow_and_update();
        }
        match current {
            ProxyMode::Pass | ProxyMode::Delay(_) => to.write_all(&buf[..n]).await?,
            ProxyMode::DropReplies => {
                if direction == Direction::ToServer {
                    to.write_all(&buf[..n]).await?;
                } else {
                    lost.store(true, Ordering::SeqCst);
                }
            }
            ProxyMode::Blackhole => {}
            ProxyMode::Reset => return Err(io::ErrorKind::ConnectionReset.into()),
        }
    }
}
