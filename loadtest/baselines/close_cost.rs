//! The kernel's floor under a mass expiry: what saying goodbye to thousands of loopback
//! clients costs one core with no runtime, no gateway and no bookkeeping, only the system
//! calls, and how many TCP segments each goodbye puts on the wire.
//!
//! ```text
//! taskset -c 0 cargo run --release --example close_cost -- <mode> 9500   # prints its address
//! taskset -c 1 cargo run --release --example close_cost -- peer <address> 9500
//! ```
//!
//! (`loadtest/close-cost.sh` runs every mode, interleaved.) The server accepts the peer's
//! connections, then for each one in turn does what `<mode>` names, timing the whole loop:
//! - `write`: writes a 20-byte BYE and keeps the socket (the BYEs alone);
//! - `write-shutdown-close`: the BYE, a shutdown, a close, as idlegate did before;
//! - `more-shutdown-close`: the BYE marked `MSG_MORE`, so the shutdown's FIN rides with it;
//! - `write-close`, `more-close`: the same without the shutdown.
//!
//! The peer holds its ends without reading until it reads them in order at the end, so it
//! is woken as little as possible: the figures are a floor, not what a real client costs.

#[cfg(target_os = "linux")]
fn main() {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use tokio::time::Instant;

    /// The size of an idle_timeout BYE on the wire.
    const BYE: [u8; 20] = [0; 20];

    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: close_cost <write|write-shutdown-close|more-shutdown-close|write-close|more-close> <n> \
                 | close_cost peer <address> <n>";
    let count = |s: Option<&String>| s.and_then(|s| s.parse::<usize>().ok()).unwrap_or_else(|| exit(usage));
    match args.first().map(String::as_str) {
        Some("peer") => {
            let address = args.get(1).unwrap_or_else(|| exit(usage));
            let n = count(args.get(2));
            let peers: Vec<TcpStream> = (0..n)
                .map(|_| TcpStream::connect(address).unwrap_or_else(|e| exit(&format!("connect: {e}"))))
                .collect();
            let mut buf = [0u8; 64];
            for mut peer in peers {
                while matches!(peer.read(&mut buf), Ok(k) if k > 0) {}
            }
        }
        Some(mode) => {
            let n = count(args.get(1));
            let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| exit(&format!("bind: {e}")));
            println!("{}", listener.local_addr().unwrap_or_else(|e| exit(&format!("address: {e}"))));
            let mut sockets = Vec::with_capacity(n);
            for _ in 0..n {
                let (socket, _) = listener.accept().unwrap_or_else(|e| exit(&format!("accept: {e}")));
                let _ = socket.set_nodelay(true);
                sockets.push(socket);
            }
            // Let the handshakes' last ACKs settle before counting segments.
            std::thread::sleep(std::time::Duration::from_millis(500));
            let before = out_segments();
            let started = Instant::now();
            let mut kept = Vec::new();
            for mut socket in sockets {
                let more = || unsafe { libc::send(socket.as_raw_fd(), BYE.as_ptr().cast(), BYE.len(), libc::MSG_MORE) };
                match mode {
                    "write" => {
                        let _ = socket.write_all(&BYE);
                        kept.push(socket);
                    }
                    "write-shutdown-close" => {
                        let _ = socket.write_all(&BYE);
                        let _ = socket.shutdown(Shutdown::Write);
                    }
                    "more-shutdown-close" => {
                        more();
                        let _ = socket.shutdown(Shutdown::Write);
                    }
                    "write-close" => {
                        let _ = socket.write_all(&BYE);
                    }
                    "more-close" => {
                        more();
                    }
                    _ => exit(usage),
                }
            }
            let took = started.elapsed();
            // The peer's answers (ACKs, its FINs) arrive after the loop; wait for them.
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let segments = out_segments() - before;
            println!(
                "{mode}: {n} in {:.1} ms, {:.2} us each, {:.2} segments per connection",
                took.as_secs_f64() * 1e3,
                took.as_secs_f64() * 1e6 / n as f64,
                segments as f64 / n as f64
            );
            drop(kept);
        }
        None => exit(usage),
    }

    /// TCP segments sent by this machine so far (`OutSegs` in /proc/net/snmp), both ends
    /// of every loopback connection included.
    fn out_segments() -> u64 {
        let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
        let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
        let (Some(names), Some(values)) = (tcp.next(), tcp.next()) else {
            exit("no Tcp lines in /proc/net/snmp");
        };
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(name, _)| *name == "OutSegs")
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or_else(|| exit("no OutSegs in /proc/net/snmp"))
    }

    fn exit(why: &str) -> ! {
        eprintln!("close_cost: {why}");
        std::process::exit(2)
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("close_cost measures Linux system calls and reads /proc/net/snmp; it runs on Linux only");
}
