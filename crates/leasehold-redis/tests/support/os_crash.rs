//! The operating-system crash of a Redis server with `appendonly yes` and `appendfsync
//! everysec`, simulated (docs/faults.md row 31): shared by the standalone and the cluster
//! tests, and by Redlock's (`#[path]`-included, not a test target of its own).

use std::time::Duration;

use leasehold_testkit::RedisServer;
use tokio::time::sleep;

/// The host's wall clock, in whole seconds since the epoch.
#[allow(clippy::disallowed_methods)] // the server's clock is the host's: which second it is now
fn host_unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

async fn server_time(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    (secs, micros)
}

async fn info_field(conn: &mut redis::aio::MultiplexedConnection, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO persistence:\n{info}"))
        .trim()
        .to_owned()
}

/// What an operating-system crash leaves of a server with `appendfsync everysec` (the
/// default): the append-only file up to its last sync. Redis 7.0 starts a background
/// sync at most once per wall-clock second (when its cached second is past the second of
/// the last one), covering what was written up to then. The crash is simulated in that
/// window: a fresh second begins; a marker write (of `marker`, a key the server serves:
/// on a cluster node, one of its slots) starts that second's sync, which is
/// awaited (`aof_pending_bio_fsync:0`), and the file's length then is the synced length;
/// the writes under test follow and are acknowledged; the server is frozen (`SIGSTOP`)
/// while the host's clock is still in that second, so no later sync can have started;
/// then it is killed, the file is cut back to the synced length (what the crash loses)
/// and the server starts again (a cluster node: on its directory and cluster config file,
/// so it comes back with its slots). `attempt` runs the acknowledged writes; if the second
/// ran out before the freeze (a loaded machine), the window is set up again with fresh
/// keys (a precondition, not the outcome, is retried).
pub async fn os_crash_after<T, F, Fut>(server: &RedisServer, marker: &str, mut attempt: F) -> T
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let aof = server.aof_incr_file();
    for round in 0..5u32 {
        // Quiet for two seconds of the server's clock: everything written before has been
        // synced, and the last sync was in an earlier second.
        let (quiet_from, _) = server_time(&mut raw).await;
        while server_time(&mut raw).await.0 < quiet_from + 2 {
            sleep(Duration::from_millis(50)).await;
        }
        while info_field(&mut raw, "aof_pending_bio_fsync").await != "0" {
            sleep(Duration::from_millis(10)).await;
        }
        // Some way into a fresh second (the server's cached second has caught up).
        let (mut second, mut micros) = server_time(&mut raw).await;
        while !(150_000..400_000).contains(&micros) {
            sleep(Duration::from_millis(10)).await;
            (second, micros) = server_time(&mut raw).await;
        }
        let _: () = redis::cmd("SET")
            .arg(marker)
            .arg(round)
            .query_async(&mut raw)
            .await
            .unwrap();
        let synced = std::fs::metadata(&aof).unwrap().len();
        while info_field(&mut raw, "aof_pending_bio_fsync").await != "0" {
            sleep(Duration::from_millis(1)).await;
        }
        let out = attempt(round).await;
        tokio::task::block_in_place(|| server.pause());
        if host_unix_secs() != second {
            // The second ran out: a sync may have covered the writes. Set it up again.
            tokio::task::block_in_place(|| server.resume());
            continue;
        }
        let written = std::fs::metadata(&aof).unwrap().len();
        assert!(
            written > synced,
            "the acknowledged writes are not in the file"
        );
        tokio::task::block_in_place(|| {
            server.kill();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&aof)
                .unwrap()
                .set_len(synced)
                .unwrap();
            server.start_again();
        });
        return out;
    }
    panic!("could not fit the writes and the freeze into one second in 5 tries");
}
