//! `ByteStream` (feature `tokio`) over loopback and shared memory: the prefix
//! rule seen at `write_vectored`, `tokio::io::copy`'s 8 KiB writes on an 8 KiB tier, a
//! writer ahead of its reader, random writes of up to
//! 5 MiB read back byte for byte, zero-copy reads, the end of the stream and the half
//! close (in one process and across two), a peer process that dies, the halves of
//! `tokio::io::split` in two tasks, and HTTP/1 and HTTP/2 (hyper) carried through it
//! with bodies of growing size.
//!
//! Two shm tests run their peer in a child process: this test binary started again with
//! `BYTE_STREAM_SOCKET` set, running only `a_writer_in_a_child_process`, or with
//! `BYTE_STREAM_HALF_CLOSE_SOCKET` set, running only
//! `a_half_closing_client_in_a_child_process` (each does nothing without its variable).
#![cfg(feature = "tokio")]

mod pairs;

use std::future::poll_fn;
use std::io::IoSlice;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use tierbuf_transport::connection::{AsyncConnection, ByteStream, ConnectionError};
use tierbuf_transport::{Endpoint, ShmProvider, Transport};

use pairs::{PairProvider, connections, preset};

/// Long enough that only a lost wake runs into it.
const BOUND: Duration = Duration::from_secs(120);

/// A connected pair of byte streams on the preset ladder `ladder`.
fn streams<P: PairProvider>(
    provider: &P,
    ladder: &str,
) -> (ByteStream<P::Endpoint>, ByteStream<P::Endpoint>) {
    let (a, b) = connections(provider, preset(ladder));
    (ByteStream::new(a).unwrap(), ByteStream::new(b).unwrap())
}

/// `len` bytes that say where they are, different for each `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|at| ((at as u64).wrapping_mul(31) ^ seed.wrapping_mul(0x9e37_79b9)) as u8)
        .collect()
}

/// A small deterministic generator (xorshift64*), for the random writes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// Writes every byte of `parts` with vectored writes, checking each write takes some.
async fn write_all_vectored<W: AsyncWrite + Unpin>(writer: &mut W, parts: &[&[u8]]) {
    let mut rest = parts.to_vec();
    while rest.iter().any(|part| !part.is_empty()) {
        let slices: Vec<IoSlice<'_>> = rest.iter().map(|part| IoSlice::new(part)).collect();
        let mut taken = writer.write_vectored(&slices).await.unwrap();
        assert!(taken > 0, "a write with bytes takes some of them");
        while taken > 0 {
            let here = rest[0].len().min(taken);
            rest[0] = &rest[0][here..];
            taken -= here;
            if rest[0].is_empty() {
                rest.remove(0);
            }
        }
    }
}

/// Flushes `stream` until its send tier is `tier`, the peer reading meanwhile.
async fn until_send_tier<E: Endpoint + Unpin>(stream: &mut ByteStream<E>, tier: u8) {
    while stream.stats().send_tier != tier {
        stream.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn a_vectored_write_sends_the_prefix_that_fits_the_tier_in_force<P: PairProvider>() {
    let provider = P::make();
    // Thresholds 480 and 8 KiB.
    let (mut writer, mut reader) = streams(&provider, "two-tier");
    let reading = tokio::spawn(async move {
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.unwrap();
        received
    });
    let (a, b, big, tail) = (
        pattern(100, 1),
        pattern(100, 2),
        pattern(2000, 3),
        pattern(10, 4),
    );
    let parts = [
        IoSlice::new(&[]),
        IoSlice::new(&a),
        IoSlice::new(&b),
        IoSlice::new(&big),
    ];
    assert_eq!(
        writer.write_vectored(&parts).await.unwrap(),
        200,
        "the two small elements fit tier 0 together; the big one waits for the next write"
    );
    let stats = writer.stats();
    assert_eq!((stats.messages_sent, stats.messages_segmented), (1, 0));
    assert_eq!(stats.send_tier, 0);

    // The first element does not fit tier 0: it goes at once, segmented on tier 0, while
    // tier 1 is asked for; the element after it is left for the next write.
    let parts = [IoSlice::new(&big), IoSlice::new(&tail)];
    assert_eq!(writer.write_vectored(&parts).await.unwrap(), big.len());
    let stats = writer.stats();
    assert_eq!((stats.messages_sent, stats.messages_segmented), (2, 1));

    // Once the peer grants tier 1, the same element goes whole.
    until_send_tier(&mut writer, 1).await;
    assert_eq!(writer.stats().tiers.promotions, 1);
    let parts = [IoSlice::new(&big), IoSlice::new(&tail)];
    assert_eq!(
        writer.write_vectored(&parts).await.unwrap(),
        big.len() + tail.len(),
        "both fit tier 1 together"
    );
    let stats = writer.stats();
    assert_eq!((stats.messages_sent, stats.messages_segmented), (3, 1));

    writer.write_all(&tail).await.unwrap();
    writer.shutdown().await.unwrap();
    drop(writer);
    let expected = [&a[..], &b, &big, &big, &tail, &tail].concat();
    assert!(reading.await.unwrap() == expected, "every byte, in order");
}

/// A write past the top tier is written a top-tier message at a time; its bytes arrive.
async fn an_element_past_the_top_tier_is_written_in_parts<P: PairProvider>() {
    let provider = P::make();
    let (mut writer, mut reader) = streams(&provider, "two-tier");
    let reading = tokio::spawn(async move {
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.unwrap();
        received
    });
    let huge = pattern(100_000, 5);
    let first = writer.write(&huge).await.unwrap();
    assert!(
        first > 0 && first <= 8192,
        "at most one top-tier message: {first}"
    );
    writer.write_all(&huge[first..]).await.unwrap();
    writer.shutdown().await.unwrap();
    drop(writer);
    assert!(reading.await.unwrap() == huge);
}

/// `tokio::io::copy` writes 8 KiB at a time; on the rpc ladder (512 B, 8 KiB, 64 KiB) each
/// of those writes is a message of the 8 KiB tier's size, which that tier carries whole
/// (issue #40): the connection is promoted to it, not past it, and once there nothing is
/// segmented.
async fn copies_in_8_kib_writes_stay_on_the_8_kib_tier<P: PairProvider>() {
    let provider = P::make();
    let ladder = pairs::preset_demoting_after("rpc", Duration::from_secs(3600));
    assert_eq!(ladder.tiers()[1].slot_size(), 8192);
    let (a, b) = connections(&provider, ladder);
    let (mut writer, mut reader) = (ByteStream::new(a).unwrap(), ByteStream::new(b).unwrap());
    let reading = tokio::spawn(async move {
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.unwrap();
        (received, reader.stats())
    });
    let first = pattern(256 << 10, 6);
    let copied = tokio::io::copy(&mut &first[..], &mut writer).await.unwrap();
    assert_eq!(copied, first.len() as u64);
    // The first write asked for the tier its 8 KiB need; wait for the answer.
    while writer.stats().tiers.promotions == 0 {
        writer.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let promoted = writer.stats();
    assert_eq!(
        promoted.send_tier, 1,
        "8 KiB writes fit the 8 KiB tier: {promoted:?}"
    );

    let second = pattern(256 << 10, 7);
    tokio::io::copy(&mut &second[..], &mut writer)
        .await
        .unwrap();
    writer.shutdown().await.unwrap();
    let stats = writer.stats();
    assert_eq!(
        (stats.send_tier, stats.tiers.promotions),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(
        stats.messages_segmented, promoted.messages_segmented,
        "on the 8 KiB tier every 8 KiB write goes whole"
    );
    drop(writer);
    let (received, reader_stats) = reading.await.unwrap();
    assert!(received == [first, second].concat(), "every byte, in order");
    assert_eq!(
        reader_stats.recv_tier, 1,
        "the reader posts receives of the 8 KiB tier"
    );
}

/// The peer reads nothing: the writer runs out of credits and its write waits; once the
/// peer reads, the write is woken and goes on, and every byte arrives.
async fn a_writer_ahead_of_its_reader_waits_then_goes_on<P: PairProvider>() {
    let provider = P::make();
    let (mut writer, mut reader) = streams(&provider, "two-tier");
    let data = pattern(16 << 20, 6);
    let mut written = 0;
    let pending = poll_fn(|cx| {
        while written < data.len() {
            match Pin::new(&mut writer).poll_write(cx, &data[written..]) {
                Poll::Ready(taken) => {
                    let taken = taken.unwrap();
                    assert!(taken > 0);
                    written += taken;
                }
                Poll::Pending => return Poll::Ready(true),
            }
        }
        Poll::Ready(false)
    })
    .await;
    assert!(
        pending,
        "a peer that reads nothing holds the writer back before 16 MiB"
    );
    assert!(written < data.len());
    let expected_len = data.len();
    let reading = tokio::spawn(async move {
        let mut received = Vec::with_capacity(expected_len);
        reader.read_to_end(&mut received).await.unwrap();
        received
    });
    writer.write_all(&data[written..]).await.unwrap();
    writer.shutdown().await.unwrap();
    drop(writer);
    assert!(reading.await.unwrap() == data, "every byte, in order");
}

/// Writes of random sizes from empty to 5 MiB, some vectored with empty elements among
/// them, read back by `tokio::io::copy`: every byte, in order.
async fn random_writes_arrive_byte_for_byte<P: PairProvider>(ladder: &str, seed: u64) {
    let provider = P::make();
    let (mut writer, mut reader) = streams(&provider, ladder);
    let reading = tokio::spawn(async move {
        let mut received = Vec::new();
        tokio::io::copy(&mut reader, &mut received).await.unwrap();
        received
    });
    let mut rng = Rng(seed);
    let mut expected = Vec::new();
    for write in 0..32 {
        let len = match rng.below(4) {
            0 => rng.below(65),
            1 => rng.below(10_000),
            2 => rng.below(300_000),
            _ => rng.below((5 << 20) + 1),
        };
        let bytes = pattern(len, seed + write);
        expected.extend_from_slice(&bytes);
        if rng.below(2) == 0 {
            writer.write_all(&bytes).await.unwrap();
        } else {
            // Up to four elements, split at random points, with empty ones among them.
            let mut cuts: Vec<usize> = (0..3).map(|_| rng.below(len + 1)).collect();
            cuts.sort_unstable();
            let mut parts: Vec<&[u8]> = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([len]) {
                parts.push(&bytes[from..cut]);
                from = cut;
            }
            write_all_vectored(&mut writer, &parts).await;
        }
        if rng.below(4) == 0 {
            writer.flush().await.unwrap();
        }
    }
    writer.shutdown().await.unwrap();
    drop(writer);
    let received = reading.await.unwrap();
    assert_eq!(received.len(), expected.len());
    assert!(received == expected, "every byte, in order");
}

async fn random_writes_on_the_two_tier_ladder<P: PairProvider>() {
    random_writes_arrive_byte_for_byte::<P>("two-tier", 0x5eed).await;
}

async fn random_writes_on_the_storage_ladder<P: PairProvider>() {
    random_writes_arrive_byte_for_byte::<P>("storage", 0xbeef).await;
}

/// Reads lend each message in its receive slot (`fill_buf`) and give the slot back once
/// it is consumed; an empty message, which only a shutdown sends, is the end of the
/// stream, and nothing after it is read.
async fn buffered_reads_lend_each_message_and_an_empty_one_ends_the_stream<P: PairProvider>() {
    let provider = P::make();
    let (a, b) = connections(&provider, preset("two-tier"));
    let mut sender = AsyncConnection::new(a).unwrap();
    let mut reader = ByteStream::new(b).unwrap();
    sender.send(b"hello").await.unwrap();
    sender.send(b"").await.unwrap();
    sender.send(b"world").await.unwrap();

    let lent = reader.fill_buf().await.unwrap();
    assert_eq!(lent, b"hello", "one message at a time");
    reader.consume(2);
    assert!(reader.stats().receives_lent >= 1, "the slot is lent");
    assert_eq!(reader.fill_buf().await.unwrap(), b"llo");
    reader.consume(3);
    let mut rest = Vec::new();
    assert_eq!(
        reader.read_to_end(&mut rest).await.unwrap(),
        0,
        "the end, with the sender still open"
    );
    assert_eq!(
        reader.read(&mut [0u8; 8]).await.unwrap(),
        0,
        "still the end"
    );
    // The messages read, and the empty one, gave their slots back; the one after the
    // end, never read, may hold its slot until the stream is dropped.
    let lent = reader.stats().receives_lent;
    assert!(lent <= 1, "{lent} slots lent");
    drop(sender);
}

/// A shutdown is a half close, as TCP's: the peer reads the end while this side is
/// still open, and answers; this side reads the answer, and its own end, after its
/// shutdown. (Before, the peer read the end only once this side was dropped, so a
/// client that shut down and then waited for the answer waited for ever.)
async fn a_shutdown_is_a_half_close<P: PairProvider>() {
    let provider = P::make();
    let (mut client, mut server) = streams(&provider, "rpc");
    let request = pattern(70_000, 11);
    let expected = request.clone();
    let serving = tokio::spawn(async move {
        let mut received = Vec::new();
        server.read_to_end(&mut received).await.unwrap();
        assert!(received == expected, "every byte before the end");
        server.write_all(&pattern(3000, 12)).await.unwrap();
        server.shutdown().await.unwrap();
        // Both sides shut down: each has read the other's end, and both are still open.
        server
    });
    client.write_all(&request).await.unwrap();
    client.shutdown().await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    assert!(answer == pattern(3000, 12), "the answer, then the end");
    let server = serving.await.unwrap();
    drop((client, server));
}

/// A shutdown after the peer took every byte and closed succeeds: the peer needs no
/// telling, and nothing written was lost (as a TCP socket's `shutdown` after the peer's
/// close).
async fn a_shutdown_after_the_peer_took_everything_and_closed_succeeds<P: PairProvider>() {
    let provider = P::make();
    let (mut writer, mut reader) = streams(&provider, "rpc");
    let data = pattern(5000, 3);
    writer.write_all(&data).await.unwrap();
    writer.flush().await.unwrap();
    let mut received = vec![0u8; data.len()];
    reader.read_exact(&mut received).await.unwrap();
    assert!(received == data);
    drop(reader);
    writer
        .shutdown()
        .await
        .expect("everything written reached the peer");
    let refused = writer.write(b"late").await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::BrokenPipe);
}

/// A shut-down stream refuses writes and still reads; the peer reads the end, and once
/// the stream is dropped its writes fail with the connection's error.
async fn the_end_after_shutdown_and_drop<P: PairProvider>() {
    let provider = P::make();
    let (mut writer, mut reader) = streams(&provider, "rpc");
    let data = pattern(70_000, 7);
    let expected = data.clone();
    let reading = tokio::spawn(async move {
        reader.write_all(b"reply").await.unwrap();
        reader.flush().await.unwrap();
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.unwrap();
        assert!(received == expected, "every byte before the end");
        assert_eq!(
            reader.read(&mut [0u8; 8]).await.unwrap(),
            0,
            "still the end"
        );
        // The close may be found by the write or by the flush after it.
        loop {
            let written = reader.write_all(b"anyone?").await;
            if let Err(error) = written.and(reader.flush().await) {
                break error;
            }
            tokio::task::yield_now().await;
        }
    });
    writer.write_all(&data).await.unwrap();
    writer.shutdown().await.unwrap();
    let refused = writer.write(b"late").await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::BrokenPipe);
    let mut reply = [0u8; 5];
    writer.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"reply", "shutdown leaves the reading side open");
    drop(writer);

    let error = reading.await.unwrap();
    assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe, "{error}");
    let failure = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<Arc<ConnectionError>>())
        .expect("the connection's error is kept");
    assert!(
        matches!(**failure, ConnectionError::PeerClosed),
        "{failure:?}"
    );
}

/// The halves of `tokio::io::split` in two tasks on each side: the client writes from
/// one task and reads the echo in another, the server echoes with `tokio::io::copy`.
async fn split_halves_in_two_tasks_echo_every_byte<P: PairProvider>() {
    let provider = P::make();
    let (client, server) = streams(&provider, "rpc");
    let echo = tokio::spawn(async move {
        let (mut from, mut to) = tokio::io::split(server);
        tokio::io::copy(&mut from, &mut to).await
    });
    let (mut from, mut to) = tokio::io::split(client);
    let data = pattern(6 << 20, 8);
    let expected_len = data.len();
    let reading = tokio::spawn(async move {
        let mut received = vec![0u8; expected_len];
        from.read_exact(&mut received).await.unwrap();
        (received, from)
    });
    let mut rng = Rng(0x0059_1177);
    let mut at = 0;
    while at < data.len() {
        let len = (1 + rng.below(200_000)).min(data.len() - at);
        to.write_all(&data[at..at + len]).await.unwrap();
        at += len;
    }
    to.flush().await.unwrap();
    let (received, from) = reading.await.unwrap();
    assert!(received == data, "every byte echoed, in order");
    drop(from.unsplit(to));
    assert_eq!(
        echo.await.unwrap().unwrap(),
        data.len() as u64,
        "the echo ends at the end"
    );
}

/// Rounds of [`split_halves_copy_one_way_without_a_timer`], and the bytes of each.
const ONE_WAY_ROUNDS: usize = 4;
const ONE_WAY_LEN: usize = 16 << 20;

/// The halves of `tokio::io::split` in tasks of their own on both sides, the bytes going
/// one way: the client's writer copies 16 MiB a round with `tokio::io::copy` while its
/// reader waits for the server's answer, and the server's reader takes each round while
/// its writer waits to answer. Demotion is an hour away, so a wake lost between the
/// halves is a hang (with the ladder's own 10 s, each round waited for a multiple of it).
async fn split_halves_copy_one_way_without_a_timer<P: PairProvider>() {
    const ROUND: Duration = Duration::from_secs(20);
    let provider = P::make();
    let ladder = pairs::preset_demoting_after("rpc", Duration::from_secs(3600));
    let (client, server) = connections(&provider, ladder);
    let (mut server_read, mut server_write) = tokio::io::split(ByteStream::new(server).unwrap());
    let (mut client_read, mut client_write) = tokio::io::split(ByteStream::new(client).unwrap());
    let (rounds_read, mut read) = tokio::sync::mpsc::channel(1);
    let reading = tokio::spawn(async move {
        for round in 0..ONE_WAY_ROUNDS {
            let mut received = vec![0u8; ONE_WAY_LEN];
            server_read.read_exact(&mut received).await.unwrap();
            assert!(
                received == pattern(ONE_WAY_LEN, round as u64),
                "round {round}"
            );
            rounds_read.send(round).await.unwrap();
        }
        let mut rest = Vec::new();
        server_read.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "nothing after the rounds");
        server_read
    });
    let answering = tokio::spawn(async move {
        let mut rounds = 0;
        while read.recv().await.is_some() {
            rounds += 1;
        }
        server_write.write_all(b"done").await.unwrap();
        server_write.shutdown().await.unwrap();
        (rounds, server_write)
    });
    let answer = tokio::spawn(async move {
        let mut answer = Vec::new();
        client_read.read_to_end(&mut answer).await.unwrap();
        (answer, client_read)
    });
    for round in 0..ONE_WAY_ROUNDS {
        let data = pattern(ONE_WAY_LEN, round as u64);
        let copied = tokio::time::timeout(ROUND, async {
            let copied = tokio::io::copy(&mut &data[..], &mut client_write).await;
            client_write.flush().await.unwrap();
            copied
        })
        .await
        .unwrap_or_else(|_| panic!("round {round} was not copied within {ROUND:?}"))
        .unwrap();
        assert_eq!(copied, ONE_WAY_LEN as u64);
    }
    client_write.shutdown().await.unwrap();
    let server_read = tokio::time::timeout(ROUND, reading)
        .await
        .expect("the reader takes every round and the end")
        .unwrap();
    let (rounds, server_write) = answering.await.unwrap();
    assert_eq!(rounds, ONE_WAY_ROUNDS);
    let (answer, client_read) = tokio::time::timeout(ROUND, answer)
        .await
        .expect("the answer and its end arrive")
        .unwrap();
    assert_eq!(&answer[..], b"done");
    drop(client_read.unsplit(client_write));
    drop(server_read.unsplit(server_write));
}

/// Body sizes the HTTP tests send, growing.
const BODY_SIZES: [usize; 5] = [1, 1 << 10, 64 << 10, 1 << 20, 4 << 20];

/// The server's answer: the request's body, back.
async fn echo_body(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = request.into_body().collect().await?.to_bytes();
    Ok(Response::new(Full::new(body)))
}

/// A POST of `body`, echoed back: checks every byte.
fn post(size: usize) -> (Request<Full<Bytes>>, Vec<u8>) {
    let body = pattern(size, size as u64);
    let request = Request::post("http://tierbuf/echo")
        .header(hyper::header::HOST, "tierbuf")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    (request, body)
}

async fn http1_posts_of_growing_size_echo_every_byte<P: PairProvider>() {
    let provider = P::make();
    let (client, server) = streams(&provider, "rpc");
    let serving = tokio::spawn(async move {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server), service_fn(echo_body))
            .await
    });
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client))
        .await
        .unwrap();
    let driving = tokio::spawn(connection);
    for size in BODY_SIZES {
        let (request, body) = post(size);
        // One request at a time: the connection takes the next once the last is done.
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), hyper::StatusCode::OK);
        let echoed = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(echoed.len(), size);
        assert!(
            echoed[..] == body[..],
            "a {size}-byte body came back changed"
        );
    }
    drop(sender);
    driving.await.unwrap().unwrap();
    serving.await.unwrap().unwrap();
}

async fn http2_posts_of_growing_size_echo_every_byte<P: PairProvider>() {
    let provider = P::make();
    let (client, server) = streams(&provider, "rpc");
    let serving = tokio::spawn(async move {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(server), service_fn(echo_body))
            .await
    });
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
            .await
            .unwrap();
    let driving = tokio::spawn(connection);
    // Two requests at a time on the one connection, as HTTP/2 allows.
    for sizes in BODY_SIZES.chunks(2) {
        let calls: Vec<_> = sizes
            .iter()
            .map(|&size| {
                let mut sender = sender.clone();
                tokio::spawn(async move {
                    let (request, body) = post(size);
                    let response = sender.send_request(request).await.unwrap();
                    assert_eq!(response.status(), hyper::StatusCode::OK);
                    let echoed = response.into_body().collect().await.unwrap().to_bytes();
                    assert!(
                        echoed[..] == body[..],
                        "a {size}-byte body came back changed"
                    );
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
    }
    drop(sender);
    // Both sides send a last frame (GOAWAY) as they end, and a connection has no half
    // close: the side that ends second may find the other gone.
    ended_or_found_the_peer_gone(driving.await.unwrap());
    ended_or_found_the_peer_gone(serving.await.unwrap());
}

/// Passes an HTTP/2 connection that ended cleanly, or whose last write found the peer
/// closed: an I/O error of kind `BrokenPipe` saying the connection's `PeerClosed`. h2
/// keeps an I/O error as its kind and message only, so the message is what says it.
fn ended_or_found_the_peer_gone(ended: Result<(), hyper::Error>) {
    let Err(error) = ended else {
        return;
    };
    let io = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .unwrap_or_else(|| panic!("not an I/O error: {error:?}"));
    assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe, "{error:?}");
    let inner = io
        .get_ref()
        .unwrap_or_else(|| panic!("the cause is kept: {error:?}"));
    match inner.downcast_ref::<Arc<ConnectionError>>() {
        Some(failure) => assert!(
            matches!(**failure, ConnectionError::PeerClosed),
            "{error:?}"
        ),
        None => assert_eq!(
            inner.to_string(),
            ConnectionError::PeerClosed.to_string(),
            "{error:?}"
        ),
    }
}

pairs::tokio_on_each_provider!(
    within BOUND;
    a_vectored_write_sends_the_prefix_that_fits_the_tier_in_force,
    an_element_past_the_top_tier_is_written_in_parts,
    copies_in_8_kib_writes_stay_on_the_8_kib_tier,
    a_writer_ahead_of_its_reader_waits_then_goes_on,
    random_writes_on_the_two_tier_ladder,
    random_writes_on_the_storage_ladder,
    buffered_reads_lend_each_message_and_an_empty_one_ends_the_stream,
    a_shutdown_is_a_half_close,
    a_shutdown_after_the_peer_took_everything_and_closed_succeeds,
    the_end_after_shutdown_and_drop,
    split_halves_in_two_tasks_echo_every_byte,
    split_halves_copy_one_way_without_a_timer,
    http1_posts_of_growing_size_echo_every_byte,
    http2_posts_of_growing_size_echo_every_byte,
);

/// A tokio runtime on the calling thread, with IO and timers.
fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn http1_on_a_current_thread_runtime() {
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        tokio::time::timeout(
            BOUND,
            http1_posts_of_growing_size_echo_every_byte::<ShmProvider>(),
        )
        .await
        .unwrap();
    });
}

/// Environment variable naming the socket the child process listens at.
const CHILD_SOCKET: &str = "BYTE_STREAM_SOCKET";
/// Bytes the child writes before it waits to be killed.
const CHILD_WRITES: usize = 300_000;

/// A transport of the `rpc` ladder over shared memory.
fn shm_transport() -> Transport<tierbuf_transport::Shm> {
    Transport::shm()
        .ladder_preset("rpc")
        .budget_bytes(1 << 30)
        .build()
        .unwrap()
}

#[test]
fn a_writer_in_a_child_process() {
    // Only as the child process of `a_peer_process_that_dies_is_an_error_not_the_end`.
    let Some(path) = std::env::var_os(CHILD_SOCKET) else {
        return;
    };
    let node = shm_transport();
    let listener = node.listen(PathBuf::from(path)).unwrap();
    let connection = listener.accept().unwrap();
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let mut stream = ByteStream::new(connection).unwrap();
        stream.write_all(&pattern(CHILD_WRITES, 9)).await.unwrap();
        stream.flush().await.unwrap();
        // The parent writes nothing and kills this process; should it go first, the read
        // ends and so does this process.
        let _ = stream.read(&mut [0u8; 1]).await;
    });
}

#[test]
fn a_peer_process_that_dies_is_an_error_not_the_end() {
    let path = std::env::temp_dir().join(format!(
        "tierbuf-byte-stream-{}-child.sock",
        std::process::id()
    ));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_writer_in_a_child_process", "--nocapture"])
        .env(CHILD_SOCKET, &path)
        .spawn()
        .unwrap();
    let node = shm_transport();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < deadline, "the child listens in time");
        std::thread::sleep(Duration::from_millis(10));
    }
    let connection = node
        .connect_timeout(&path, Duration::from_secs(10))
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let error = runtime.block_on(async {
        let mut stream = ByteStream::new(connection).unwrap();
        let mut received = vec![0u8; CHILD_WRITES];
        stream.read_exact(&mut received).await.unwrap();
        assert!(received == pattern(CHILD_WRITES, 9), "the child's bytes");
        child.kill().unwrap();
        child.wait().unwrap();
        let mut more = Vec::new();
        tokio::time::timeout(BOUND, stream.read_to_end(&mut more))
            .await
            .expect("the death is found, not waited on for ever")
            .expect_err("a peer that died is not the end of the stream")
    });
    let _ = std::fs::remove_file(&path);
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    let failure = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<Arc<ConnectionError>>())
        .expect("the connection's error is kept");
    assert!(
        matches!(**failure, ConnectionError::PeerDied(_)),
        "{failure:?}"
    );
}

/// Environment variable naming the socket a half-closing client in a child process
/// connects to.
const HALF_CLOSE_SOCKET: &str = "BYTE_STREAM_HALF_CLOSE_SOCKET";
/// Bytes of the child's request, and of the parent's answer.
const REQUEST_LEN: usize = 200_000;
const ANSWER_LEN: usize = 70_000;

#[test]
fn a_half_closing_client_in_a_child_process() {
    // Only as the child process of `a_client_process_shuts_down_and_reads_the_answer`.
    let Some(path) = std::env::var_os(HALF_CLOSE_SOCKET) else {
        return;
    };
    let node = shm_transport();
    let connection = node
        .connect_timeout(PathBuf::from(path), Duration::from_secs(10))
        .unwrap();
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let mut stream = ByteStream::new(connection).unwrap();
        stream.write_all(&pattern(REQUEST_LEN, 21)).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer == pattern(ANSWER_LEN, 22),
            "the answer, then the end"
        );
    });
}

/// A client in another process writes its request and shuts down; the server reads the
/// request to its end with the client still there, answers and shuts down, and the
/// client reads the answer to its end: a half close across two processes over shared
/// memory, as a TCP client's `shutdown(Write)`.
#[test]
fn a_client_process_shuts_down_and_reads_the_answer() {
    let path = std::env::temp_dir().join(format!(
        "tierbuf-byte-stream-{}-half-close.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let node = shm_transport();
    let listener = node.listen(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_half_closing_client_in_a_child_process",
            "--nocapture",
        ])
        .env(HALF_CLOSE_SOCKET, &path)
        .spawn()
        .unwrap();
    let connection = listener.accept_timeout(Duration::from_secs(30)).unwrap();
    let runtime = current_thread_runtime();
    let stream = runtime.block_on(async {
        let mut stream = ByteStream::new(connection).unwrap();
        let mut request = Vec::new();
        tokio::time::timeout(BOUND, stream.read_to_end(&mut request))
            .await
            .expect("the client's shutdown ends the request")
            .unwrap();
        assert!(
            request == pattern(REQUEST_LEN, 21),
            "the request, then the end"
        );
        stream.write_all(&pattern(ANSWER_LEN, 22)).await.unwrap();
        stream.shutdown().await.unwrap();
        stream
    });
    // This side stays open (shut down, not closed) until the client has read the answer
    // to its end and exited.
    let status = child.wait().unwrap();
    drop((stream, listener));
    assert!(status.success(), "the client process: {status}");
}
