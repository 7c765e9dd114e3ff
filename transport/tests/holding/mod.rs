//! What the test endpoints that hold completions back from the connection above them
//! share (`peer_close.rs`, `async_polling.rs`): taking everything the wrapped endpoint
//! has, and counting what they hold as still outstanding, as the provider rules say a
//! request is until its completion is polled.

use tierbuf_transport::{Completion, Endpoint, Opcode, Outstanding, TransportError};

/// Polls `inner` until it has nothing more, handing each completion to `keep`.
pub(crate) fn take_all<E: Endpoint>(
    inner: &mut E,
    mut keep: impl FnMut(Completion),
) -> Result<(), TransportError> {
    let mut batch = [Completion::default(); 64];
    loop {
        let ready = inner.poll(&mut batch)?;
        batch[..ready]
            .iter()
            .for_each(|completion| keep(*completion));
        if ready < batch.len() {
            return Ok(());
        }
    }
}

/// `outstanding` with the `held` completions counted in.
pub(crate) fn with_held<'a>(
    mut outstanding: Outstanding,
    held: impl IntoIterator<Item = &'a Completion>,
) -> Outstanding {
    for completion in held {
        match completion.opcode {
            Opcode::Send => outstanding.sends += 1,
            Opcode::Recv => outstanding.recvs += 1,
        }
    }
    outstanding
}
