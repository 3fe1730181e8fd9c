//! `leader` and `observe`: read an election (`leasehold run --key NAME` campaigns for it).

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use leasehold::{Election, Leader, LeaseClient, LeaseConfig};
use serde::Serialize;

use crate::admin::{ADMIN_TIMEOUT, connect};
use crate::failure::Failure;

/// `leasehold leader`.
pub(crate) const LEADER_HELP: &str = "\
The leader of election NAME is the holder of the lease NAME: a library campaigner
(Election::campaign) or `leasehold run --key NAME`. Its term is that lease's fence.
With --json, one line: {\"name\":...,\"leader\":{\"owner\",\"term\",\"value\"}|null};
\"value\" is the published value as text (null: none published, or not UTF-8).

Exit status:
  0   printed (there may be no leader: see \"leader\")
  64  bad usage (flags, name, a bad store URL, memory://), or a store without records
  69  store error (unreachable, no answer within 10s, refused credentials, no
      such database, no privilege, an unusable SQLite file, missing tables)

Example:
  leasehold leader leader:billing --json";

/// `leasehold observe`.
pub(crate) const OBSERVE_HELP: &str = "\
Prints the leader of election NAME now, then one line of JSON per change (a new term,
no leader, or the value published): {\"name\",\"leader\":{\"owner\",\"term\",\"value\"}|null}.
Where the store notifies changes (see the store's README) a change is printed as soon
as the store tells of it; the leader is also read every --interval, which
is how an expiry (never notified) is seen, and how changes are seen on the other stores.
It never joins the queue of campaigners. Runs until interrupted; a store error is printed
as {\"name\",\"error\":...} and reading goes on.

Exit status:
  0   interrupted (SIGINT, SIGTERM) or its reader closed the pipe
  64  bad usage (flags, name, a bad store URL, memory://), or a store without records
  69  store error while opening the store (unreachable, refused credentials, no such
      database, no privilege, an unusable SQLite file, missing tables)

Example:
  leasehold observe leader:billing --interval 500ms";

#[derive(Serialize)]
struct View {
    owner: String,
    term: u64,
    value: Option<String>,
}

fn view(leader: &Leader) -> View {
    View {
        owner: leader.owner.to_hex(),
        term: leader.term.get(),
        value: leader
            .value
            .as_ref()
            .and_then(|v| String::from_utf8(v.clone()).ok()),
    }
}

async fn election(url: &str, name: &str) -> Result<Election, Failure> {
    let store = connect(url).await?;
    let config = LeaseConfig::builder(Duration::from_secs(60))
        .op_timeout(ADMIN_TIMEOUT)
        .build()
        .map_err(|e| Failure::Internal(e.to_string()))?;
    let client = LeaseClient::new(store, config);
    let election = client
        .election(name)
        .map_err(|e| Failure::Usage(format!("invalid election name: {e}")))?;
    crate::kind::election(&client, &election).await?;
    Ok(election)
}

fn line(name: &str, leader: Option<&Leader>) -> String {
    format!(
        "{}\n",
        serde_json::json!({ "name": name, "leader": leader.map(view) })
    )
}

pub(crate) async fn leader(url: &str, name: &str, json: bool) -> Result<ExitCode, Failure> {
    let election = election(url, name).await?;
    let leader = election
        .leader()
        .await
        .map_err(|e| Failure::from_lease(e, crate::exit::NOT_ACQUIRED))?;
    let text = if json {
        line(name, leader.as_ref())
    } else {
        match leader.as_ref().map(view) {
            Some(v) => format!(
                "{name}\tterm {}\towner {}\tvalue {}\n",
                v.term,
                v.owner,
                v.value.as_deref().unwrap_or("-")
            ),
            None => format!("{name}\tno leader\n"),
        }
    };
    crate::out::print(&text)
}

pub(crate) async fn observe(
    url: &str,
    name: &str,
    interval: Duration,
) -> Result<ExitCode, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let election = election(url, name).await?;
    // Installed before the first line is printed: a SIGTERM or SIGINT sent once it is seen
    // ends `observe` with 0, never by the signal's default action.
    let handler = |kind| {
        signal(kind).map_err(|e| Failure::Internal(format!("cannot install signal handlers: {e}")))
    };
    let (mut term, mut int) = (
        handler(SignalKind::terminate())?,
        handler(SignalKind::interrupt())?,
    );
    let mut changes = Box::pin(election.observe(interval));
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(ExitCode::SUCCESS),
            _ = int.recv() => return Ok(ExitCode::SUCCESS),
            next = changes.next() => {
                let text = match next {
                    Some(Ok(leader)) => line(name, leader.as_ref()),
                    Some(Err(e)) => format!(
                        "{}\n",
                        serde_json::json!({ "name": name, "error": e.to_string() })
                    ),
                    None => return Ok(ExitCode::SUCCESS),
                };
                if crate::out::print_or_closed(&text)? {
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
    }
}
