//! A terminal client of idlegate, built on the `idlegate-client` crate: logs in, prints
//! its state changes and the pushes it receives, and sends each line typed as DATA. It keeps
//! itself alive and comes back after a gateway restart on its own.
//!
//! ```text
//! cargo run --example client -- tcp://127.0.0.1:7070 42 [device]
//! IDLEGATE_TOKEN=... IDLEGATE_CA=ca.pem cargo run --example client -- wss://127.0.0.1:7443 42 phone
//! ```
//!
//! Then push to it: `curl -d '{"uids":[42],"payload":"aGk="}' 127.0.0.1:7072/v1/push`.

use idlegate_client::{Client, Event, Options};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: client <tcp|tls|ws|wss>://host:port <uid> [device]";
    let url = args.next().ok_or(usage)?;
    let uid: u64 = args.next().ok_or(usage)?.parse()?;
    let mut options = Options::new(uid).token(std::env::var("IDLEGATE_TOKEN").unwrap_or_default());
    if let Some(device) = args.next() {
        options = options.device(device.parse()?);
    }
    if let Ok(ca) = std::env::var("IDLEGATE_CA") {
        options = options.ca_pem(&std::fs::read(ca)?)?;
    }
    let (client, mut events) = Client::connect(&url, options)?;

    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::State(state)) => eprintln!("state: {state:?}"),
                Some(Event::Push(payload)) => println!("push: {}", String::from_utf8_lossy(&payload)),
                Some(Event::Refreshed { expires }) => eprintln!("token refreshed: the session lasts until {expires}"),
                Some(Event::Presence { kind, entries }) => {
                    for e in entries {
                        let state = if e.online { "online" } else { "offline" };
                        println!("presence ({kind:?}): uid {} {state} since {} {:?}", e.uid, e.at_ms, e.status);
                    }
                }
                None => return Ok(()),
            },
            line = lines.next_line() => match line? {
                Some(line) => {
                    if let Err(e) = client.try_send(line.into_bytes()) {
                        eprintln!("not sent: {e}");
                    }
                }
                None => {
                    // End of input: log out, and stop once the gateway said goodbye.
                    client.logout();
                    while let Some(event) = events.recv().await {
                        if let Event::State(state @ idlegate_client::State::Offline { .. }) = event {
                            eprintln!("state: {state:?}");
                            return Ok(());
                        }
                    }
                    return Ok(());
                }
            },
        }
    }
}
