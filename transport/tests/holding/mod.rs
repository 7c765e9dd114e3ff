//! What the test endpoints that hold completions back from the connection above them
//! share (`peer_close.rs`, `async_polling.rs`): taking everything the wrapped endpoint
//! has, and counting what they hold as still outstanding, as the provider rules say a
//! request is until its completion is polled.

use tierbuf_transport::{Completion, Endpoint, Outstanding, QueueKind, TransportError};

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
        match completion.opcode.queue() {
            QueueKind::Send => outstanding.sends += 1,
            QueueKind::Recv => outstanding.recvs += 1,
        }
    }
    outstanding
}

/// The one-sided methods of an `Endpoint` wrapper whose `inner` endpoint carries them out
/// as they are.
macro_rules! forward_one_sided {
    () => {
        unsafe fn expose(
            &mut self,
            buffer: tierbuf_transport::BufferRef,
            access: tierbuf_transport::Access,
        ) -> Result<tierbuf_transport::RemoteBuffer, tierbuf_transport::PostError> {
            // SAFETY: the caller keeps `Endpoint::expose`'s contract, passed on as is.
            unsafe { self.inner.expose(buffer, access) }
        }

        fn revoke(
            &mut self,
            exposed: tierbuf_transport::RemoteBuffer,
        ) -> Result<(), tierbuf_transport::PostError> {
            self.inner.revoke(exposed)
        }

        unsafe fn post_write(
            &mut self,
            gather: &[tierbuf_transport::BufferRef],
            remote: tierbuf_transport::RemoteBuffer,
            imm: Option<u32>,
            wr_id: u64,
        ) -> Result<(), tierbuf_transport::PostError> {
            // SAFETY: the caller keeps `Endpoint::post_write`'s contract, passed on as is.
            unsafe { self.inner.post_write(gather, remote, imm, wr_id) }
        }

        unsafe fn post_read(
            &mut self,
            buffer: tierbuf_transport::BufferRef,
            remote: tierbuf_transport::RemoteBuffer,
            wr_id: u64,
        ) -> Result<(), tierbuf_transport::PostError> {
            // SAFETY: the caller keeps `Endpoint::post_read`'s contract, passed on as is.
            unsafe { self.inner.post_read(buffer, remote, wr_id) }
        }
    };
}
pub(crate) use forward_one_sided;
