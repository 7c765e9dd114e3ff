//! The examples of `negotiator`'s crate-private items, run as tests: rustdoc cannot run
//! an example that names an item outside the public API.

/// The example of `negotiator::pump`.
#[test]
fn pump_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::negotiation::{Event, Negotiation, NegotiationConfig, TierShape};
    use crate::negotiator::{InMemoryNegotiator, pump};
    use crate::{RegionDescriptor, TierIndex};
    use std::time::{Duration, Instant};

    let config = NegotiationConfig::new(
        vec![
            TierShape {
                slot_size: 512,
                slot_count: 8,
            },
            TierShape {
                slot_size: 65_536,
                slot_count: 8,
            },
        ],
        Duration::from_millis(20),
        3,
    )?;
    let (mut a, mut b) = (Negotiation::new(config.clone()), Negotiation::new(config));
    let (mut a_channel, mut b_channel) = InMemoryNegotiator::pair();
    let now = Instant::now();

    a.request_tier(now, TierIndex::new(1))?;
    pump(&mut a, &mut a_channel, now)?; // the request goes out
    pump(&mut b, &mut b_channel, now)?; // b asks its owner to provision
    let Some(Event::ProvisionRequested { epoch, shape, .. }) = b.poll_event() else {
        panic!()
    };
    b.provisioned(
        now,
        epoch,
        Ok(RegionDescriptor {
            addr: 0x9000,
            len: shape.region_len(),
            remote_key: 5,
        }),
    )?;
    pump(&mut b, &mut b_channel, now)?; // the ack goes out
    pump(&mut a, &mut a_channel, now)?; // a switches and releases tier 0
    assert!(matches!(a.poll_event(), Some(Event::Switched { to, .. }) if to == TierIndex::new(1)));
    pump(&mut b, &mut b_channel, now)?;
    assert_eq!(b.inbound_grant(), a.outbound_grant());
    Ok(())
}
