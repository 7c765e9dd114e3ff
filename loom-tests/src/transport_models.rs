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

/// The shared-memory provider's queue protocol between the two processes, with a thread
/// standing in for each process and the shipped `Segment` operations between them.
pub mod shm {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;
    use tierbuf_transport::shm_segment::{
        Filled, INLINE_CAPACITY, PairState, PostedBuffer, PostedView, RingSize, Segment,
    };

    /// The receive buffer the models' receiver posts: what it names, and its bytes.
    const BUFFER: PostedBuffer = PostedBuffer {
        remote_key: 0x1201,
        addr: 0x7f00_0000_1000,
        len: 4,
    };
    const MESSAGE: [u8; 4] = [1, 2, 3, 4];
    /// The rings of receivers with one and two receives outstanding.
    const RING_OF_ONE: RingSize = RingSize::of_depth(1);
    const RING_OF_TWO: RingSize = RingSize::of_depth(2);

    /// Model 9: the receiver posts a receive that holds any inline message, then one
    /// shorter than an inline message, while the sender looks at them through one view.
    /// Whenever the view shows a receive to hold any inline message (so the sender would
    /// deliver a short message into it without reading its buffer), the receive's buffer
    /// must hold one: the mark of a short receive is ordered before its post.
    pub fn a_short_receive_is_never_shown_to_hold_an_inline_message() {
        let long = PostedBuffer {
            len: INLINE_CAPACITY as u32,
            ..BUFFER
        };
        let segment = Arc::new(Segment::<2>::new_boxed());
        let sender = {
            let segment = Arc::clone(&segment);
            thread::spawn(move || {
                let mut view = PostedView::default();
                for count in 0..2 {
                    let ring = segment.ring(0, RING_OF_TWO);
                    wait_for(|| (ring.is_posted(count, &mut view) == Ok(true)).then_some(()));
                    if view.holds_inline(count) {
                        assert!(
                            ring.posted_buffer(count).len as usize >= INLINE_CAPACITY,
                            "receive {count} shown to hold an inline message it is too short for"
                        );
                    }
                }
            })
        };
        segment.ring(0, RING_OF_TWO).post(0, long);
        segment.ring(0, RING_OF_TWO).post(1, BUFFER);
        sender.join().unwrap();
    }

    /// Waits (letting the other thread run) until `ready` gives a value.
    fn wait_for<T>(mut ready: impl FnMut() -> Option<T>) -> T {
        loop {
            if let Some(value) = ready() {
                return value;
            }
            thread::yield_now();
        }
    }

    /// Model 5: the receiver posts a buffer while the sender waits for it, copies a
    /// message into it and publishes the delivery while the receiver waits for that;
    /// then the same again through the same ring entry (a ring of one), with a second
    /// message that travels inline in the entry. The sender must see the whole posted
    /// entry once it sees the post counted, and the receiver the whole message once it
    /// sees the delivery, and never the first lap's result for the second: loom reports
    /// any read of the copied bytes not ordered after their write, and the inline words
    /// read stale are a different message.
    pub fn delivery_publishes_the_whole_message() {
        const MESSAGES: [[u8; 4]; 2] = [MESSAGE, [5, 6, 7, 8]];
        let segment = Arc::new(Segment::<1>::new_boxed());
        let receive_buffer = Arc::new(UnsafeCell::new([0u8; 4]));
        let sender = {
            let segment = Arc::clone(&segment);
            let receive_buffer = Arc::clone(&receive_buffer);
            thread::spawn(move || {
                let mut view = PostedView::default();
                for (lap, message) in (0u64..).zip(MESSAGES) {
                    let posted = wait_for(|| {
                        segment
                            .ring(0, RING_OF_ONE)
                            .posted(lap, &mut view)
                            .expect("an honest receiver's posted count")
                    });
                    assert_eq!(
                        posted, BUFFER,
                        "the sender read a posted entry before it was written"
                    );
                    assert!(segment.begin_copy(0));
                    if lap == 0 {
                        // SAFETY: the receiver posted this buffer and reads it only after
                        // the delivery below is published (what loom checks).
                        receive_buffer.with_mut(|bytes| unsafe { *bytes = message });
                        let parked = segment
                            .ring(0, RING_OF_ONE)
                            .deliver(lap, Filled::Delivered(4));
                        assert!(!parked, "the receiver never parks here");
                    } else {
                        let parked = segment
                            .ring(0, RING_OF_ONE)
                            .deliver_inline(lap, &[&message]);
                        assert!(!parked, "the receiver never parks here");
                    }
                }
            })
        };
        for (lap, message) in (0u64..).zip(MESSAGES) {
            segment.ring(0, RING_OF_ONE).post(lap, BUFFER);
            let result = wait_for(|| segment.ring(0, RING_OF_ONE).delivered(lap));
            let expected = if lap == 0 {
                Filled::Delivered(4)
            } else {
                Filled::Inline(4)
            };
            assert_eq!(
                result,
                Ok(expected),
                "a delivery without its result, or with an earlier lap's"
            );
            let received = if lap == 0 {
                // SAFETY: the delivery was seen published, so the sender's write is done.
                receive_buffer.with(|bytes| unsafe { *bytes })
            } else {
                let mut inline = [0u8; 4];
                segment
                    .ring(0, RING_OF_ONE)
                    .inline_message(lap, &mut inline);
                inline
            };
            assert_eq!(
                received, message,
                "a delivery seen without the whole message"
            );
        }
        sender.join().unwrap();
    }

    /// Model 7: side 1 closes while side 0 may be copying into side 1's posted buffer.
    /// Once `close` and `shut_incoming` return, side 1 reuses the buffer; the sender must
    /// either have found the gate shut and not copied, or have finished its copy before
    /// the wait ended. loom reports a copy that overlaps the reuse.
    pub fn close_waits_for_a_copy_in_progress() {
        let segment = Arc::new(Segment::<2>::new_boxed());
        let receive_buffer = Arc::new(UnsafeCell::new([0u8; 4]));
        segment.ring(0, RING_OF_TWO).post(0, BUFFER);
        let sender = {
            let segment = Arc::clone(&segment);
            let receive_buffer = Arc::clone(&receive_buffer);
            thread::spawn(move || {
                if segment.begin_copy(0) {
                    // SAFETY: `begin_copy` passed the gate, so the receiver waits for this
                    // copy before it touches the buffer again (what loom checks).
                    receive_buffer.with_mut(|bytes| unsafe { *bytes = MESSAGE });
                    let parked = segment
                        .ring(0, RING_OF_TWO)
                        .deliver(0, Filled::Delivered(4));
                    assert!(!parked, "the receiver never parks here");
                }
            })
        };
        segment.close(1);
        segment.shut_incoming(1, || true);
        // SAFETY: the close returned, so no copy into the buffer is in progress.
        receive_buffer.with_mut(|bytes| unsafe { *bytes = [0xEE; 4] });
        assert_eq!(segment.state(), PairState::ClosedBy(1));
        sender.join().unwrap();
    }

    /// Model 8: the receiver parks while the sender delivers. The receiver asks to be
    /// woken, then looks for the delivery; if it finds none it would sleep, and then the
    /// sender's delivery must have reported it parked, so that it is woken. loom reports
    /// an interleaving where the receiver would sleep through the message.
    pub fn a_parked_receiver_is_woken_by_the_delivery_it_missed() {
        let segment = Arc::new(Segment::<2>::new_boxed());
        segment.ring(0, RING_OF_TWO).post(0, BUFFER);
        let sender = {
            let segment = Arc::clone(&segment);
            thread::spawn(move || {
                let ring = segment.ring(0, RING_OF_TWO);
                assert!(segment.begin_copy(0));
                ring.deliver_inline(0, &[&MESSAGE])
            })
        };
        segment.park_incoming(1);
        let found = segment.ring(0, RING_OF_TWO).delivered(0).is_some();
        let woken = sender.join().unwrap();
        assert!(
            found || woken,
            "the receiver parked, found no delivery, and the sender did not wake it"
        );
        if !found {
            segment.unpark_incoming(1);
        }
    }
}

/// The exposure table's revocation protocol (`tierbuf_transport::exposure`), with a thread
/// standing in for each side.
pub mod exposure {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;
    use tierbuf_transport::Access;
    use tierbuf_transport::exposure::{ExposureTable, Window};

    const WINDOW: Window = Window {
        region_key: 0x1201,
        addr: 0x7f00_0000_1000,
        len: 4,
    };
    /// A key as `KeySerial` makes them: a serial above the slot bits, slot 3.
    const KEY: u32 = 1 << 6 | 3;

    /// The owner exposes a buffer for writing; the peer writes it if the key is in force
    /// when it begins; the owner revokes and then takes the buffer back (reads and
    /// rewrites it). Whatever the interleaving, the owner's access comes after the peer's
    /// copy (loom reports any access to the buffer not ordered after the other), and once
    /// the revocation has returned the key is refused.
    pub fn revocation_waits_out_an_access() {
        let table = Arc::new(ExposureTable::default());
        let buffer = Arc::new(UnsafeCell::new([0u8; 4]));
        table.expose(KEY, Access::Write, WINDOW);
        let peer = {
            let (table, buffer) = (Arc::clone(&table), Arc::clone(&buffer));
            thread::spawn(move || {
                if let Ok(window) = table.begin_access(KEY, Access::Write) {
                    assert_eq!(window, WINDOW, "the peer read a range not yet published");
                    // SAFETY: the key was in force and the slot is marked accessed: the
                    // owner does not touch the buffer until the access ends.
                    buffer.with_mut(|bytes| unsafe { *bytes = [1, 2, 3, 4] });
                    table.end_access(KEY);
                }
            })
        };
        assert!(table.revoke(KEY, || true), "the peer's access ends");
        // SAFETY: revoked: the peer's access, if any, has ended and no new one begins.
        let seen = buffer.with_mut(|bytes| unsafe {
            let seen = *bytes;
            *bytes = [9; 4];
            seen
        });
        assert!(
            seen == [0; 4] || seen == [1, 2, 3, 4],
            "a torn write: {seen:?}"
        );
        assert!(
            table.begin_access(KEY, Access::Write).is_err(),
            "a revoked key was accepted"
        );
        peer.join().unwrap();
    }
}
