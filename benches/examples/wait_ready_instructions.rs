//! The work one request and its reply cost through a table's readiness
//! (`ConnectionTable::wait_ready`), with no waiting in it: an shm client and its served
//! connection, the latter in a table, both in this one thread, so every wait finds the
//! request already delivered and no loop spins. Run it under `valgrind --tool=callgrind`
//! twice, with `ROUNDS` and with 0, and divide the difference by `ROUNDS` for the
//! instructions of one round: the client's `send` and `recv`, the server's `wait_ready`,
//! lock, `try_recv` and echo `send`. The same round as `service/echo_64B/connections_1`
//! less the second process, so it tells whether a change to the readiness path costs
//! instructions where that bench's timings are too noisy to say.
//!
//! `cargo build --profile bench -p tierbuf-benches --example wait_ready_instructions`,
//! then `valgrind --tool=callgrind target/release/examples/wait_ready_instructions
//! ROUNDS`. See `docs/connection.md`, "Waiting".

use std::time::Duration;

use tierbuf_transport::Transport;
use tierbuf_transport::connection::{ConnectionTable, SharedConnection};

/// Rounds made before the counted ones (and before none, in the run subtracted), so
/// that the connections' start-up work is in both runs.
const WARM: u64 = 64;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let rounds: u64 = match std::env::args().nth(1) {
        Some(rounds) => rounds.parse()?,
        None => 10_000,
    };
    let node = Transport::shm()
        .ladder_preset("two-tier")
        .budget_bytes(64 << 20)
        .build()?;
    let path = std::env::temp_dir().join(format!("tierbuf-wait-ready-{}", std::process::id()));
    let listener = node.listen(&path)?;
    let mut client = node.connect(&path)?;
    let table = ConnectionTable::new();
    table.insert(listener.accept()?);
    let mut ready: Vec<SharedConnection<_>> = Vec::new();
    let request = [7u8; 64];
    for _ in 0..WARM + rounds {
        client.send(&request)?;
        let mut served = false;
        while !served {
            table.wait_ready(&mut ready, Duration::from_secs(5))?;
            for shared in &ready {
                let mut connection = shared.lock()?;
                while let Some(message) = connection.try_recv()? {
                    let echo = message.to_vec();
                    drop(message);
                    connection.send(&echo)?;
                    served = true;
                }
            }
        }
        if client.recv()?[..] != request {
            return Err("the reply differs from the request".into());
        }
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
