//! Free TCP port allocation on 127.0.0.1.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Ports handed out by this process so far: never hand out the same one twice.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Highest port [`free_port_with_bus`] returns, so that `port + 10000` is a valid port.
const MAX_BUS_BASE: u16 = 55_534;

fn probe_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the local address of a probe socket: {e}"))
        .port()
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

fn handed_out() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The kernel picks the port (bind to port 0); a port is never returned twice
/// by the same process. Another process may still grab it before the caller
/// binds it, so the server launchers in this crate retry on a fresh port when
/// a first start fails with "address in use".
///
/// # Panics
///
/// Panics if no socket can be bound on 127.0.0.1.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = probe_port();
        if handed_out().insert(port) {
            return port;
        }
    }
    panic!("free_port: could not find a port not already handed out after 1000 tries");
}

/// Returns a port `P` (below 55535) such that both `P` and `P + 10000` were
/// free a moment ago: what a Redis Cluster node needs for its cluster bus.
///
/// Neither `P` nor `P + 10000` has been handed out before by this process, and
/// both are recorded as handed out.
///
/// # Panics
///
/// Panics if no such pair is found after many tries.
pub fn free_port_with_bus() -> u16 {
    for _ in 0..5000 {
        let port = probe_port();
        if port > MAX_BUS_BASE {
            continue;
        }
        let bus = port + 10_000;
        let mut used = handed_out();
        if used.contains(&port) || used.contains(&bus) || !bindable(bus) {
            continue;
        }
        used.insert(port);
        used.insert(bus);
        return port;
    }
    panic!("free_port_with_bus: could not find a port P with P+10000 also free");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_unique_within_the_process() {
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            assert!(seen.insert(free_port()));
        }
    }

    #[test]
    fn bus_ports_leave_room_for_the_bus() {
        for _ in 0..20 {
            let port = free_port_with_bus();
            assert!(port <= MAX_BUS_BASE);
            assert!(bindable(port));
            assert!(bindable(port + 10_000));
        }
    }
}
