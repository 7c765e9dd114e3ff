//! Models of the `transport` crate's loopback provider, shared by the clean and the
//! planted-bug test binaries.

use loom::thread;
use tierbuf_pool::{MemoryBudget, SlotPool};
use tierbuf_transport::{BufferRef, Endpoint, LoopbackProvider, Provider};

/// One thread posts a send, another posts the receive for it, each through its own
/// endpoint. Whatever the interleaving, the message has been copied by the time both
/// posts returned — before anybody polls — because a poster either wins the matching
/// claim or the holder sees its work after releasing. Then each side polls exactly one
/// completion.
pub fn post_is_never_stranded() {
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
    let registrar = provider.registrar();
    let pool = SlotPool::new(&*registrar, 64, 2).expect("register the model's slots");
    let mut message = pool.try_acquire_owned().expect("a slot");
    let inbox = pool.try_acquire_owned().expect("a slot");
    message.fill(0x5A);
    let (mut sender, mut receiver) = provider.pair(1, 1).expect("a pair");
    let (send_buffer, recv_buffer) = (BufferRef::from(&message), BufferRef::from(&inbox));
    let poster = thread::spawn(move || {
        // SAFETY: `message` is left alone until its completion is polled below.
        unsafe { sender.post_send(&[send_buffer], 1) }.expect("post the send");
        sender
    });
    // SAFETY: `inbox` is read only after the join below, which orders the copy before it.
    unsafe { receiver.post_recv(recv_buffer, 2) }.expect("post the receive");
    let mut sender = poster.join().unwrap();
    assert!(
        inbox.iter().all(|&byte| byte == 0x5A),
        "both posts returned and the message was not copied: a post was stranded"
    );
    let mut completions = [tierbuf_transport::Completion::default(); 2];
    assert_eq!(sender.poll(&mut completions).unwrap(), 1);
    assert!(completions[0].status.is_success());
    assert_eq!(receiver.poll(&mut completions).unwrap(), 1);
    assert_eq!(completions[0].byte_len, 64);
    drop((sender, receiver, message, inbox));
}
