//! A connection whose tier negotiation runs over a channel of the user's own: a TCP
//! connection beside the data path, as a system that already has one would use. Two
//! threads, one connection each over the loopback provider; messages of every size, so
//! the sender is promoted (and its first large message segmented meanwhile), every byte
//! checked on arrival.

mod pairs;
mod traffic;

use pairs::Shared;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::negotiator::Negotiator;
use tierbuf_transport::LoopbackProvider;
use tierbuf_transport::connection::{Connection, ConnectionCore};
use traffic::pattern;

/// Control frames over a TCP stream, each behind its length as two bytes.
struct TcpNegotiator {
    stream: TcpStream,
    /// Bytes read and not yet handed out as frames.
    inbox: Vec<u8>,
}

impl TcpNegotiator {
    fn new(stream: TcpStream) -> TcpNegotiator {
        stream.set_nodelay(true).unwrap();
        stream.set_nonblocking(true).unwrap();
        TcpNegotiator {
            stream,
            inbox: Vec::new(),
        }
    }
}

impl Negotiator for TcpNegotiator {
    type Error = io::Error;

    fn send_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let len = u16::try_from(frame.len()).map_err(io::Error::other)?;
        let bytes = [&len.to_le_bytes()[..], frame].concat();
        let mut written = 0;
        while written < bytes.len() {
            match self.stream.write(&bytes[written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(count) => written += count,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn recv_frame(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut chunk = [0u8; 512];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(count) => self.inbox.extend_from_slice(&chunk[..count]),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
        let Some(&[l0, l1]) = self.inbox.first_chunk::<2>() else {
            return Ok(None);
        };
        let len = usize::from(u16::from_le_bytes([l0, l1]));
        if self.inbox.len() < 2 + len {
            return Ok(None);
        }
        buf[..len].copy_from_slice(&self.inbox[2..2 + len]);
        self.inbox.drain(..2 + len);
        Ok(Some(len))
    }
}

#[test]
fn tiers_are_negotiated_over_a_tcp_side_channel_and_every_message_arrives() {
    let ladder = Arc::new(pairs::three_tiers().build().unwrap());
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    let Shared { config, reservoir } = Shared::new(&provider, ladder);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let side_channel = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (accepted, _) = listener.accept().unwrap();
    let depth = config.queue_depth();
    let (a, b) = provider.pair(depth, depth).unwrap();
    let connect = |endpoint, stream| {
        let core = ConnectionCore::with_negotiator(
            Arc::clone(&config),
            Arc::clone(&reservoir),
            Arc::clone(&reservoir),
            TcpNegotiator::new(stream),
            Instant::now(),
        )
        .unwrap();
        Connection::new(core, endpoint).unwrap()
    };
    let mut sender = connect(a, side_channel);
    let mut receiver = connect(b, accepted);
    let sizes: Vec<usize> = (0..60)
        .map(|i| [10, 3000, 200, 50_000, 100_000][i % 5])
        .collect();
    let expected = sizes.clone();
    let reader = std::thread::spawn(move || {
        for (seq, len) in expected.into_iter().enumerate() {
            let message = receiver.recv().unwrap();
            assert_eq!(&message[..], &pattern(len, seq as u64)[..], "message {seq}");
        }
        receiver
    });
    for (seq, &len) in sizes.iter().enumerate() {
        sender.send(&pattern(len, seq as u64)).unwrap();
    }
    sender.flush().unwrap();
    let receiver = reader.join().unwrap();
    let stats = sender.stats();
    assert!(
        stats.tiers.promotions >= 1,
        "promoted over the side channel: {stats:?}"
    );
    assert_eq!(receiver.stats().recv_tier, stats.send_tier);
    assert_eq!(receiver.stats().messages_received, sizes.len() as u64);
}
