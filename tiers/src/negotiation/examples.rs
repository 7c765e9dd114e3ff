//! The examples of `negotiation`'s crate-private items, run as tests: rustdoc cannot run
//! an example that names an item outside the public API.

/// The example of `negotiation::Negotiation`.
#[test]
fn negotiation_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::negotiation::{Event, Negotiation, NegotiationConfig, TierShape};
    use crate::{RegionDescriptor, TierIndex};
    use std::time::{Duration, Instant};

    let config = NegotiationConfig::new(
        vec![
            TierShape {
                slot_size: 512,
                slot_count: 8,
            },
            TierShape {
                slot_size: 8192,
                slot_count: 8,
            },
        ],
        Duration::from_millis(10),
        3,
    )?;
    let (mut sender, mut receiver) = (Negotiation::new(config.clone()), Negotiation::new(config));
    let now = Instant::now();

    sender.request_tier(now, TierIndex::new(1))?;
    receiver.handle_message(now, sender.poll_transmit().unwrap());
    let Some(Event::ProvisionRequested { epoch, shape, .. }) = receiver.poll_event() else {
        panic!()
    };
    let region = RegionDescriptor {
        addr: 0x10_0000,
        len: shape.region_len(),
        remote_key: 42,
    };
    receiver.provisioned(now, epoch, Ok(region))?;
    sender.handle_message(now, receiver.poll_transmit().unwrap()); // the ack
    assert!(matches!(sender.poll_event(), Some(Event::Switched { region: r, .. }) if r == region));
    receiver.handle_message(now, sender.poll_transmit().unwrap()); // the release
    assert!(matches!(
        receiver.poll_event(),
        Some(Event::PeerSwitched { .. })
    ));
    assert!(
        matches!(receiver.poll_event(), Some(Event::Retire { tier, .. }) if tier == TierIndex::SMALLEST)
    );
    assert_eq!(sender.outbound_grant().tier, receiver.inbound_grant().tier);
    Ok(())
}
