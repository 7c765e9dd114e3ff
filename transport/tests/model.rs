//! Random message sizes and random orders of posts, polls and closes on a loopback pair,
//! checked step by step against a model of the verbs rules: receives consumed in posting
//! order, a send waits for a receive, a message longer than its receive fails both and
//! breaks the connection, queue depths, closing flushes, completions in order per queue,
//! and the received bytes (and nothing past them) written.
//!
//! Posted buffers are left alone until their completions are polled or the endpoint
//! closed; the `unsafe` posts rely on that.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;
use tierbuf_pool::{MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_transport::{
    BufferRef, Completion, CompletionStatus, Endpoint, LoopbackEndpoint, LoopbackProvider, Opcode,
    PostError, Provider, QueueKind,
};

const DEPTH: u32 = 4;
const SLOT: usize = 128;
const GUARD: u8 = 0xEE;

#[derive(Debug, Clone)]
enum Step {
    /// Side 0 sends a message of this length.
    Send(u32),
    /// Side 1 posts a receive of this size.
    Recv(u32),
    /// A side polls.
    Poll(usize),
    /// A side closes.
    Close(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0u32..=80).prop_map(Step::Send),
        8 => (64u32..=SLOT as u32).prop_map(Step::Recv),
        6 => (0usize..2).prop_map(Step::Poll),
        1 => (0usize..2).prop_map(Step::Close),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelState {
    Open,
    ClosedBy(usize),
    Broken,
}

/// What the verbs rules say must happen.
#[derive(Debug)]
struct Model {
    state: ModelState,
    closed: [bool; 2],
    waiting_sends: VecDeque<(u64, u32)>,
    posted_recvs: VecDeque<(u64, u32)>,
    /// Completions due to side 0 (its sends) and side 1 (its receives), in order.
    due: [VecDeque<Completion>; 2],
    outstanding: [u32; 2],
    /// For each successful receive, the send whose message it holds.
    delivered_from: HashMap<u64, u64>,
}

impl Model {
    fn post_error(&self, side: usize) -> Option<PostError> {
        if self.closed[side] {
            return Some(PostError::Closed);
        }
        match self.state {
            ModelState::Open if self.outstanding[side] == DEPTH => Some(PostError::QueueFull {
                queue: [QueueKind::Send, QueueKind::Recv][side],
                depth: DEPTH,
            }),
            ModelState::Open => None,
            ModelState::ClosedBy(_) => Some(PostError::PeerClosed),
            ModelState::Broken => Some(PostError::ConnectionBroken),
        }
    }

    fn complete(&mut self, side: usize, wr_id: u64, byte_len: u32, status: CompletionStatus) {
        let opcode = [Opcode::Send, Opcode::Recv][side];
        self.due[side].push_back(Completion {
            wr_id,
            byte_len,
            status,
            opcode,
        });
    }

    fn settle(&mut self) {
        while self.state == ModelState::Open
            && !self.waiting_sends.is_empty()
            && !self.posted_recvs.is_empty()
        {
            let (send_id, len) = self.waiting_sends.pop_front().unwrap();
            let (recv_id, size) = self.posted_recvs.pop_front().unwrap();
            if len > size {
                self.complete(0, send_id, 0, CompletionStatus::RemoteInvalidRequest);
                self.complete(1, recv_id, 0, CompletionStatus::LocalLengthError);
                self.state = ModelState::Broken;
            } else {
                self.complete(0, send_id, 0, CompletionStatus::Success);
                self.complete(1, recv_id, len, CompletionStatus::Success);
                self.delivered_from.insert(recv_id, send_id);
            }
        }
        if self.state != ModelState::Open {
            while let Some((send_id, _)) = self.waiting_sends.pop_front() {
                self.complete(0, send_id, 0, CompletionStatus::Flushed);
            }
            while let Some((recv_id, _)) = self.posted_recvs.pop_front() {
                self.complete(1, recv_id, 0, CompletionStatus::Flushed);
            }
        }
    }
}

fn pattern(wr_id: u64, offset: usize) -> u8 {
    (wr_id as usize).wrapping_mul(131).wrapping_add(offset) as u8
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(16 << 20));
    let pool = SlotPool::new(&*provider.registrar(), SLOT, 2 * DEPTH as usize + 1).unwrap();
    let (a, b) = provider.pair(DEPTH, DEPTH).unwrap();
    let mut endpoints: [LoopbackEndpoint; 2] = [a, b];
    let mut model = Model {
        state: ModelState::Open,
        closed: [false; 2],
        waiting_sends: VecDeque::new(),
        posted_recvs: VecDeque::new(),
        due: [VecDeque::new(), VecDeque::new()],
        outstanding: [0; 2],
        delivered_from: HashMap::new(),
    };
    // Slots of outstanding requests by work-request id, as a connection would keep them.
    let mut held: HashMap<u64, (OwnedSlot, u32)> = HashMap::new();
    let mut next_wr_id = 0u64;
    for step in steps {
        match step {
            Step::Send(len) | Step::Recv(len) => {
                let side = usize::from(matches!(step, Step::Recv(_)));
                let wr_id = next_wr_id;
                next_wr_id += 1;
                let mut slot = pool.try_acquire_owned().unwrap();
                let buffer = BufferRef::from(&slot).prefix(len).unwrap();
                let result = if side == 0 {
                    for (offset, byte) in slot[..len as usize].iter_mut().enumerate() {
                        *byte = pattern(wr_id, offset);
                    }
                    // SAFETY: the slot is kept untouched in `held` until its completion.
                    unsafe { endpoints[0].post_send(&[buffer], wr_id) }
                } else {
                    slot.fill(GUARD);
                    // SAFETY: as for the send.
                    unsafe { endpoints[1].post_recv(buffer, wr_id) }
                };
                match model.post_error(side) {
                    Some(error) => prop_assert_eq!(result, Err(error)),
                    None => {
                        prop_assert_eq!(result, Ok(()));
                        model.outstanding[side] += 1;
                        held.insert(wr_id, (slot, len));
                        if side == 0 {
                            model.waiting_sends.push_back((wr_id, len));
                        } else {
                            model.posted_recvs.push_back((wr_id, len));
                        }
                        model.settle();
                    }
                }
            }
            Step::Poll(side) => {
                let mut batch = [Completion::default(); 3];
                loop {
                    let n = endpoints[side].poll(&mut batch).unwrap();
                    for done in &batch[..n] {
                        prop_assert_eq!(Some(*done), model.due[side].pop_front());
                        model.outstanding[side] -= 1;
                        let (slot, size) = held.remove(&done.wr_id).unwrap();
                        if side == 1 {
                            let len = done.byte_len as usize;
                            if let Some(&send_id) = model.delivered_from.get(&done.wr_id) {
                                for (offset, &byte) in slot[..len].iter().enumerate() {
                                    prop_assert_eq!(byte, pattern(send_id, offset));
                                }
                            }
                            prop_assert!(
                                slot[len..].iter().all(|&byte| byte == GUARD),
                                "bytes written past the message (receive size {})",
                                size
                            );
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                prop_assert!(model.due[side].is_empty(), "completions missing");
            }
            Step::Close(side) => {
                endpoints[side].close();
                model.closed[side] = true;
                if model.state == ModelState::Open {
                    model.state = ModelState::ClosedBy(side);
                }
                model.settle();
            }
        }
        prop_assert_eq!(endpoints[0].outstanding().sends, model.outstanding[0]);
        prop_assert_eq!(endpoints[1].outstanding().recvs, model.outstanding[1]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn loopback_keeps_the_verbs_rules(steps in proptest::collection::vec(step(), 1..80)) {
        run(steps)?;
    }
}
