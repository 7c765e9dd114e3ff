//! Waiting without spinning: endpoints that wake a parked side (`Endpoint::arm`), the
//! blocking calls' deadlines, and `ConnectionTable::wait_ready` over many connections,
//! on the loopback and shared-memory providers, and on the verbs provider where
//! `TIERBUF_VERBS_DEVICE` names an RDMA device (`.ci/verbs-rxe` runs them on soft-RoCE).
//!
//! Every wait here has a generous bound (seconds) so that a lost wake fails the test
//! instead of hanging it; no test measures how long anything took.

mod pairs;

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use tierbuf_pool::SlotPool;
use tierbuf_transport::connection::{
    Connection, ConnectionError, ConnectionTable, ProgressConfig, ProgressStats, SendError,
};
use tierbuf_transport::{
    Armed, BufferRef, Completion, Endpoint, LoopbackProvider, Readiness, ShmProvider,
};

use pairs::{PairProvider, connections, demoting_ladder, preset};

/// Long enough that only a lost wake runs into it.
const BOUND: Duration = Duration::from_secs(20);

/// A waker that reports its wakes on a channel.
struct ChannelWake(mpsc::SyncSender<()>);

impl Wake for ChannelWake {
    fn wake(self: Arc<Self>) {
        let _ = self.0.try_send(());
    }
}

/// A waker and the channel its wakes arrive on.
fn channel_waker() -> (Waker, mpsc::Receiver<()>) {
    let (sender, receiver) = mpsc::sync_channel(16);
    (Waker::from(Arc::new(ChannelWake(sender))), receiver)
}

/// Whether `fd` turns readable (or hangs up) within `bound`.
fn fd_fires(fd: BorrowedFd<'_>, bound: Duration) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(
        fd,
        PollFlags::IN | PollFlags::RDHUP,
    )];
    let timeout = Timespec::try_from(bound).unwrap();
    rustix::event::poll(&mut fds, Some(&timeout)).unwrap() > 0
}

/// Waits for the wake of an endpoint armed with `wakes`' waker: through its descriptor
/// or its waker, whichever its readiness names. Whether it came within `bound`.
fn woken<E: Endpoint>(endpoint: &E, wakes: &mpsc::Receiver<()>, bound: Duration) -> bool {
    match endpoint.readiness() {
        Readiness::Fd(fd) => fd_fires(fd, bound),
        Readiness::Waker => wakes.recv_timeout(bound).is_ok(),
        other => panic!("{other:?}: these providers wake"),
    }
}

fn an_armed_endpoint_is_woken_by_a_delivery_from_another_thread<P: PairProvider>() {
    let provider = P::make();
    let pool = SlotPool::new(&*provider.registrar(), 4096, 2).unwrap();
    let (mut sender, mut receiver) = provider.connect_pair(4);
    let inbox = pool.try_acquire_owned().unwrap();
    let mut message = pool.try_acquire_owned().unwrap();
    message.fill(0x42);
    // SAFETY: the inbox is read only after its completion is polled.
    unsafe { receiver.post_recv(BufferRef::from(&inbox), 1).unwrap() };
    let (waker, wakes) = channel_waker();
    assert_eq!(receiver.arm(&waker), Armed::Parked, "nothing has come yet");
    let send = BufferRef::from(&message);
    let sending = thread::spawn(move || {
        // SAFETY: the message is left alone until the join below, after its completion.
        unsafe { sender.post_send(&[send], 2).unwrap() };
        let mut completions = [Completion::default(); 1];
        while sender.poll(&mut completions).unwrap() == 0 {
            thread::yield_now();
        }
        sender
    });
    assert!(
        woken(&receiver, &wakes, BOUND),
        "the delivery did not wake the receiver"
    );
    receiver.disarm();
    let mut completions = [Completion::default(); 1];
    let deadline = Instant::now() + BOUND;
    while receiver.poll(&mut completions).unwrap() == 0 {
        assert!(Instant::now() < deadline, "woken, but no completion came");
        thread::yield_now();
    }
    assert_eq!((completions[0].wr_id, completions[0].byte_len), (1, 4096));
    assert!(inbox.iter().all(|&byte| byte == 0x42));
    drop(sending.join().unwrap());
}

fn arming_with_a_delivery_waiting_is_pending<P: PairProvider>() {
    let provider = P::make();
    let pool = SlotPool::new(&*provider.registrar(), 64, 2).unwrap();
    let (mut sender, mut receiver) = provider.connect_pair(4);
    let (inbox, message) = (
        pool.try_acquire_owned().unwrap(),
        pool.try_acquire_owned().unwrap(),
    );
    // SAFETY: neither slot is touched until both endpoints are dropped.
    unsafe {
        receiver.post_recv(BufferRef::from(&inbox), 1).unwrap();
        sender.post_send(&[BufferRef::from(&message)], 2).unwrap();
    }
    let mut completions = [Completion::default(); 1];
    sender.poll(&mut completions).unwrap();
    let (waker, _wakes) = channel_waker();
    assert_eq!(
        receiver.arm(&waker),
        Armed::Pending,
        "a delivery is waiting"
    );
    receiver.disarm();
    assert_eq!(receiver.poll(&mut completions).unwrap(), 1);
    drop((sender, receiver));
}

fn closing_wakes_the_parked_peer<P: PairProvider>() {
    let provider = P::make();
    let (sender, mut receiver) = provider.connect_pair(4);
    let (waker, wakes) = channel_waker();
    assert_eq!(receiver.arm(&waker), Armed::Parked);
    let closing = thread::spawn(move || drop(sender));
    assert!(
        woken(&receiver, &wakes, BOUND),
        "the close did not wake the peer"
    );
    receiver.disarm();
    closing.join().unwrap();
    assert_eq!(receiver.arm(&waker), Armed::Pending, "closed by the peer");
}

fn a_deadline_passes_when_nothing_comes<P: PairProvider>() {
    let provider = P::make();
    let (mut a, mut b) = connections(&provider, preset("two-tier"));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(30);
    assert!(b.recv_deadline(deadline).unwrap().is_none());
    assert!(Instant::now() >= deadline, "returned before its deadline");
    // `b` never reads: `a` sends until the credits run out, then its deadline passes.
    let deadline = Instant::now() + Duration::from_millis(30);
    let mut sent = 0;
    let error = loop {
        match a.send_deadline(&[7; 100], deadline) {
            Ok(()) => sent += 1,
            Err(error) => break error,
        }
        assert!(sent < 10_000, "the peer's credits never ran out");
    };
    assert!(matches!(error, SendError::TimedOut(_)), "{error:?}");
    assert!(!a.flush_deadline(Instant::now()).unwrap() || sent > 0);
    for _ in 0..sent {
        let message = b.recv_deadline(Instant::now() + BOUND).unwrap();
        assert_eq!(message.expect("every message sent arrives").len(), 100);
    }
    assert!(a.flush_deadline(Instant::now() + BOUND).unwrap());
}

fn a_blocked_recv_is_woken_by_a_message_and_by_the_peer_closing<P: PairProvider>() {
    let provider = P::make();
    let (mut a, mut b) = connections(&provider, preset("two-tier"));
    let receiving = thread::spawn(move || {
        let first = b.recv().expect("the message");
        assert_eq!(&first[..], b"wake up");
        drop(first);
        let error = b.recv().expect_err("the peer closes");
        assert!(matches!(*error, ConnectionError::PeerClosed), "{error:?}");
    });
    // The receiver is most likely parked by now; it must wake either way.
    thread::sleep(Duration::from_millis(20));
    a.send(b"wake up").unwrap();
    a.flush().unwrap();
    thread::sleep(Duration::from_millis(20));
    drop(a);
    receiving.join().unwrap();
}

/// After a wait that slept longer than a millisecond a connection's next waits sleep at
/// once, with no passes first (`wait.rs`). So a flush whose progress took its last send's
/// completion must look again before it waits: a wait then would sleep until the deadline
/// with nothing left to wake it.
fn a_flush_that_takes_its_last_completion_does_not_sleep_after_it<P: PairProvider>() {
    let provider = P::make();
    let (mut a, mut b) = connections(&provider, preset("two-tier"));
    assert!(
        a.recv_deadline(Instant::now() + Duration::from_millis(5))
            .unwrap()
            .is_none()
    );
    a.send(b"one").unwrap();
    let deadline = Instant::now() + BOUND;
    assert!(a.flush_deadline(deadline).unwrap());
    assert!(
        Instant::now() < deadline,
        "the flush slept until its deadline after its last completion"
    );
    assert_eq!(&b.recv().unwrap()[..], b"one");
}

/// A table of `idle + 1` served connections, of which the client of the last one sends;
/// `wait_ready` hands out that one only, and times out while nothing is sent.
fn wait_ready_hands_out_the_busy_connection_only<P: PairProvider>(idle: usize) {
    let provider = P::make();
    let table = ConnectionTable::new();
    let mut clients = Vec::new();
    let mut busy_id = None;
    for _ in 0..=idle {
        let (client, served) = connections(&provider, preset("two-tier"));
        clients.push(client);
        busy_id = Some(table.insert(served).id());
    }
    let busy_id = busy_id.unwrap();
    let mut ready = Vec::new();
    // The first waits find the fresh connections' own start-up work; then quiet.
    let deadline = Instant::now() + BOUND;
    loop {
        let found = table
            .wait_ready(&mut ready, Duration::from_millis(20))
            .unwrap();
        if found == 0 {
            break;
        }
        for connection in &ready {
            assert!(connection.lock().unwrap().try_recv().unwrap().is_none());
        }
        assert!(Instant::now() < deadline, "the idle table never went quiet");
    }
    let mut client = clients.pop().unwrap();
    let sending = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        for round in 0..50u8 {
            client.send(&[round; 64]).unwrap();
        }
        client.flush().unwrap();
        client
    });
    let mut received = 0u8;
    let deadline = Instant::now() + BOUND;
    while received < 50 {
        assert!(Instant::now() < deadline, "messages lost: {received} of 50");
        table.wait_ready(&mut ready, BOUND).unwrap();
        for connection in &ready {
            let mut connection = connection.lock().unwrap();
            while let Some(message) = connection.try_recv().unwrap() {
                assert_eq!(message[..], [received; 64]);
                received += 1;
            }
        }
        assert!(
            ready.iter().all(|connection| connection.id() == busy_id),
            "an idle connection was handed out"
        );
    }
    drop(sending.join().unwrap());
    drop(clients);
}

/// Waits until `table`'s progress thread has gone quiet: its counters the same across
/// 50 ms, during which a thread that polled its connections would look at each of them
/// dozens of times. Returns the counters then.
fn quiet<E: tierbuf_transport::Endpoint>(table: &ConnectionTable<E>) -> ProgressStats {
    let deadline = Instant::now() + BOUND;
    let mut last = table.progress_stats();
    loop {
        thread::sleep(Duration::from_millis(50));
        let now = table.progress_stats();
        if now == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the thread never went quiet: {now:?}"
        );
        last = now;
    }
}

/// A table with a progress thread serving `count` connections whose users never call
/// `progress`: once every client has sent a message, and half the users have left
/// theirs untaken, the thread looks at no connection and sleeps; a message from a peer
/// wakes it, and it delivers that message.
fn a_progress_thread_sleeps_over_idle_connections_and_wakes_for_a_peer<P: PairProvider>(
    count: usize,
) {
    let provider = P::make();
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let (mut clients, mut served) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let (client, server) = connections(&provider, preset("two-tier"));
        clients.push(client);
        served.push(table.insert(server));
    }
    let next_delivered = |index: usize| {
        let deadline = Instant::now() + BOUND;
        loop {
            let delivered = served[index].lock().unwrap().next_delivered();
            if let Some(message) = delivered {
                return message;
            }
            assert!(
                Instant::now() < deadline,
                "connection {index}'s message lost"
            );
            thread::yield_now();
        }
    };
    for (index, client) in clients.iter_mut().enumerate() {
        client.send(&[index as u8; 100]).unwrap();
        client.flush().unwrap();
        if index % 2 == 0 {
            assert_eq!(next_delivered(index)[..], [index as u8; 100]);
        }
    }
    let settled = quiet(&table);
    // Quiet means quiet: no look at any connection, untaken messages and all.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(table.progress_stats(), settled);
    for index in (1..count).step_by(2) {
        assert_eq!(next_delivered(index)[..], [index as u8; 100]);
    }
    // A peer's message wakes the sleeping thread (nobody here touches the connection
    // until the thread has looked at it).
    let settled = quiet(&table);
    clients[count / 3].send(b"wake up").unwrap();
    let deadline = Instant::now() + BOUND;
    while table.progress_stats().progressed == settled.progressed {
        assert!(Instant::now() < deadline, "the peer's wake was lost");
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(&next_delivered(count / 3)[..], b"wake up");
    drop(clients);
}

/// A connection its user holds, with a wake from its peer that nobody can take while
/// it is held, is looked at once per polling sleep (1 ms), not spun on; once released,
/// the thread delivers the message.
fn a_held_connection_with_a_wake_waiting_is_polled_not_spun_on<P: PairProvider>() {
    let provider = P::make();
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let (mut client, server) = connections(&provider, preset("two-tier"));
    let served = table.insert(server);
    quiet(&table);
    let held = served.lock().unwrap();
    let (before, started) = (table.progress_stats(), Instant::now());
    client.send(b"while held").unwrap();
    thread::sleep(Duration::from_millis(100));
    let (during, elapsed) = (table.progress_stats(), started.elapsed());
    // About one look a millisecond (twice that, for a timer's rounding, and a few for the
    // wakes themselves); spinning makes tens of thousands.
    let polls = during.parks - before.parks;
    assert!(
        polls <= 2 * elapsed.as_millis() as u64 + 10,
        "{polls} sleeps in {elapsed:?}: the thread spun on the held connection"
    );
    assert!(during.skipped_busy > before.skipped_busy, "{during:?}");
    drop(held);
    let deadline = Instant::now() + BOUND;
    let message = loop {
        let delivered = served.lock().unwrap().next_delivered();
        if let Some(message) = delivered {
            break message;
        }
        assert!(Instant::now() < deadline, "the message was lost");
        thread::yield_now();
    };
    assert_eq!(&message[..], b"while held");
}

/// A connection whose peer has gone is failed for good: the progress thread tells the
/// waiters once and then leaves it to its user, instead of looking at it again and again.
fn a_connection_whose_peer_left_costs_the_progress_thread_nothing<P: PairProvider>() {
    let provider = P::make();
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let (client, server) = connections(&provider, preset("two-tier"));
    let served = table.insert(server);
    quiet(&table);
    drop(client);
    let settled = quiet(&table);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(table.progress_stats(), settled);
    let mut ready = Vec::new();
    assert_eq!(
        table.wait_ready(&mut ready, BOUND).unwrap(),
        1,
        "handed out to its user"
    );
    assert!(served.lock().unwrap().try_recv().is_err(), "the peer left");
}

macro_rules! on_each_provider {
    ($($test:ident $(($arg:expr))?),* $(,)?) => {
        mod loopback {
            use super::*;
            $(#[test] fn $test() { super::$test::<LoopbackProvider>($($arg)?); })*
        }
        mod shm {
            use super::*;
            $(#[test] fn $test() { super::$test::<ShmProvider>($($arg)?); })*
        }
    };
}

/// The tests run on verbs, with tables of 8 idle connections and 16 echoing pairs instead
/// of hundreds (CI's `idle_cost verbs rxe0 400` measures a table of 400). Not run on
/// verbs: `arming_with_a_delivery_waiting_is_pending`, which asks that a delivery be there
/// the instant its sender's completion is (verbs makes the two on two sides of a wire).
#[cfg(feature = "verbs")]
macro_rules! on_verbs {
    ($($test:ident $(($arg:expr))?),* $(,)?) => {
        mod verbs {
            use super::*;
            use tierbuf_transport::verbs::VerbsProvider;
            $(#[test] fn $test() {
                if pairs::skipped_without_a_verbs_device() {
                    return;
                }
                super::$test::<VerbsProvider>($($arg)?);
            })*
        }
    };
}

#[cfg(feature = "verbs")]
on_verbs!(
    an_armed_endpoint_is_woken_by_a_delivery_from_another_thread,
    closing_wakes_the_parked_peer,
    a_deadline_passes_when_nothing_comes,
    a_blocked_recv_is_woken_by_a_message_and_by_the_peer_closing,
    a_flush_that_takes_its_last_completion_does_not_sleep_after_it,
    wait_ready_hands_out_the_busy_connection_only(8),
    a_progress_thread_sleeps_over_idle_connections_and_wakes_for_a_peer(8),
    a_connection_whose_peer_left_costs_the_progress_thread_nothing,
    a_held_connection_with_a_wake_waiting_is_polled_not_spun_on,
    tables_echo_through_promotions_and_demotions(16),
);

on_each_provider!(
    an_armed_endpoint_is_woken_by_a_delivery_from_another_thread,
    arming_with_a_delivery_waiting_is_pending,
    closing_wakes_the_parked_peer,
    a_deadline_passes_when_nothing_comes,
    a_blocked_recv_is_woken_by_a_message_and_by_the_peer_closing,
    a_flush_that_takes_its_last_completion_does_not_sleep_after_it,
    wait_ready_hands_out_the_busy_connection_only(300),
    tables_echo_through_promotions_and_demotions(200),
    a_progress_thread_sleeps_over_idle_connections_and_wakes_for_a_peer(400),
    a_held_connection_with_a_wake_waiting_is_polled_not_spun_on,
    a_connection_whose_peer_left_costs_the_progress_thread_nothing,
);

/// Offers `pending`'s message without blocking; whether it went.
fn offer<E: tierbuf_transport::Endpoint>(
    connection: &mut Connection<E>,
    pending: &mut Option<Vec<u8>>,
) -> bool {
    let Some(bytes) = pending.as_ref() else {
        return true;
    };
    match connection.try_send(bytes) {
        Ok(()) => {
            *pending = None;
            true
        }
        Err(SendError::WouldBlock(_)) => false,
        Err(error) => panic!("{error}"),
    }
}

/// Two tables, a client's and a server's, each driven by one thread through
/// `wait_ready` only: `connections` pairs echo `rounds` requests each, one in flight per
/// connection, one in ten promoted and segmented, with demotions falling due between.
fn tables_echo_through_promotions_and_demotions<P: PairProvider>(count: usize) {
    use std::collections::HashMap;
    const ROUNDS: usize = 20;
    let provider = P::make();
    let servers = ConnectionTable::new();
    let clients = ConnectionTable::new();
    let mut handles = Vec::new();
    for _ in 0..count {
        let (client, server) = connections(&provider, demoting_ladder(Duration::from_millis(30)));
        servers.insert(server);
        handles.push(clients.insert(client));
    }
    let size = |round: usize| if round % 10 == 9 { 8000 } else { 64 };
    let serving = thread::spawn(move || {
        let (mut ready, mut served) = (Vec::new(), 0);
        let mut replies: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
        while served < count * ROUNDS || replies.values().any(Option::is_some) {
            assert!(
                servers.wait_ready(&mut ready, BOUND).unwrap() > 0,
                "the servers stalled"
            );
            for shared in &ready {
                let mut connection = shared.lock().unwrap();
                let reply = replies.entry(shared.id().get()).or_default();
                if !offer(&mut connection, reply) {
                    continue;
                }
                while let Some(request) = connection.try_recv().unwrap() {
                    *reply = Some(request.to_vec());
                    served += 1;
                    drop(request);
                    if !offer(&mut connection, reply) {
                        break;
                    }
                }
            }
        }
        // A reply `try_send` took whole may still be going out in segments, which only
        // this thread's progress posts.
        for id in servers.ids() {
            servers.get(id).unwrap().lock().unwrap().flush().unwrap();
        }
        servers
    });
    let mut requests: Vec<_> = (0..count).map(|_| Some(vec![7; size(0)])).collect();
    for (index, shared) in handles.iter().enumerate() {
        offer(&mut shared.lock().unwrap(), &mut requests[index]);
    }
    let (mut replies, mut ready) = (vec![0; count], Vec::new());
    while replies.iter().sum::<usize>() < count * ROUNDS {
        assert!(
            clients.wait_ready(&mut ready, BOUND).unwrap() > 0,
            "the clients stalled"
        );
        for shared in &ready {
            let index = handles.iter().position(|h| h.id() == shared.id()).unwrap();
            let mut connection = shared.lock().unwrap();
            if !offer(&mut connection, &mut requests[index]) {
                continue;
            }
            while let Some(reply) = connection.try_recv().unwrap() {
                assert_eq!(reply.len(), size(replies[index]));
                replies[index] += 1;
                if replies[index] < ROUNDS {
                    requests[index] = Some(vec![7; size(replies[index])]);
                    if !offer(&mut connection, &mut requests[index]) {
                        break;
                    }
                }
            }
        }
        // Now and then a pause long enough for demotions to fall due.
        if replies.iter().sum::<usize>() % (count * 3) == 0 {
            thread::sleep(Duration::from_millis(40));
        }
    }
    drop(serving.join().unwrap());
}
