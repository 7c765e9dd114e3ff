//! The work one 64 B request and its reply cost between two `AsyncConnection`s over
//! loopback, a client task and an echoing server task on one current-thread runtime,
//! neither spinning (`set_spin(0)`), so every wait parks and is woken. Run it under
//! `valgrind --tool=callgrind` with two round counts and divide the difference of the
//! instructions by the difference of the rounds: the client's `send` and `recv`, the
//! server's `recv` and echo `send`, their wakes, and whatever the connections' drivers
//! do meanwhile. It tells whether a change to the async connection's waits costs
//! instructions where timings on a shared machine are too noisy to say.
//!
//! `cargo build --release -p tierbuf-benches --example async_instructions`, then
//! `valgrind --tool=callgrind target/release/examples/async_instructions ROUNDS`. See
//! `docs/connection.md`, "Timers of an async connection".

use std::time::Duration;

use tierbuf_transport::Transport;
use tierbuf_transport::connection::AsyncConnection;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let rounds: usize = match std::env::args().nth(1) {
        Some(rounds) => rounds.parse()?,
        None => 10_000,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let node = Transport::loopback()
            .ladder_preset("rpc")
            .budget_bytes(64 << 20)
            .build()?;
        let listener = node.listen("async-instructions")?;
        let mut client = AsyncConnection::new(node.connect("async-instructions")?)?;
        let mut server = AsyncConnection::new(listener.accept()?)?;
        client.set_spin(Duration::ZERO);
        server.set_spin(Duration::ZERO);
        let serving = tokio::spawn(async move {
            // Until the client hangs up.
            while let Ok(request) = server.recv().await {
                let reply = request.to_vec();
                drop(request);
                server.send(&reply).await?;
            }
            Ok::<_, Error>(())
        });
        let request = [7u8; 64];
        for _ in 0..rounds {
            client.send(&request).await?;
            let reply = client.recv().await?;
            assert_eq!(reply[..], request[..], "the echo");
        }
        drop(client);
        serving.await??;
        Ok(())
    })
}
