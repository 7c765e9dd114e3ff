//! Models of the `tiers` crate's `TieredRegion`, shared by the clean and the planted-bug
//! test binaries.

use std::sync::Arc as StdArc;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use tierbuf_pool::{HostRegistrar, MemoryBudget, Registrar};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::{Reservoir, TierError, TierIndex, TieredRegion};

const SMALL: TierIndex = TierIndex::SMALLEST;
const LARGE: TierIndex = TierIndex::new(1);
/// Region lengths of the model's two tiers: 3 slots of 64 bytes, 3 slots of 128 bytes
/// (the fewest a ladder allows).
const SMALL_LEN: u64 = 192;
const LARGE_LEN: u64 = 384;

/// What the budget charges a region of `len` bytes: the whole pages it maps.
fn charged(len: u64) -> u64 {
    len.next_multiple_of(tierbuf_pool::page_size() as u64)
}

fn region() -> (MemoryBudget, Arc<TieredRegion>) {
    let ladder = TierLadder::builder()
        .tier(64, 3, 64)
        .tier(128, 3, 128)
        .build()
        .expect("a valid ladder");
    let budget = MemoryBudget::with_cap(1 << 20);
    let registrar: StdArc<dyn Registrar> = StdArc::new(HostRegistrar::new(budget.clone()));
    let reservoir = Reservoir::new(registrar, StdArc::new(ladder));
    let region = TieredRegion::new(StdArc::new(reservoir)).expect("the smallest tier");
    (budget, Arc::new(region))
}

/// Changes `region` to `tier`, the only change under way.
fn change_to(region: &TieredRegion, tier: TierIndex) {
    region
        .begin_change(tier)
        .expect("the only change")
        .install(false)
        .expect("within budget");
}

/// Marks the first and last byte of a slot as written by `writer`.
fn stamp(slot: &mut [u8], writer: u8) {
    let last = slot.len() - 1;
    slot[0] = writer;
    slot[last] = writer;
}

/// A reader takes a slot of the small tier and writes it while another thread promotes
/// and reclaims. The reader's slot stays valid, the small tier is retired only after the
/// slot is back (its drop asserts no slot is held), and it is deregistered exactly once:
/// the budget ends holding exactly the large tier.
pub fn swap_during_read() {
    let (budget, region) = region();
    let reader_region = Arc::clone(&region);
    let reader = thread::spawn(move || {
        let mut cache = reader_region.cache();
        if let Some(mut slot) = cache.try_acquire() {
            stamp(&mut slot, 1);
        }
    });
    change_to(&region, LARGE);
    region.reclaim();
    reader.join().unwrap();
    while region.reclaim() > 0 {}
    assert_eq!(region.replaced_tiers(), 0, "the small tier retired");
    assert_eq!(
        budget.in_use(),
        charged(LARGE_LEN),
        "the small tier deregistered once"
    );
    drop(region);
    assert_eq!(budget.in_use(), 0);
}

/// Two threads that both see an oversize message try to promote: exactly one promotion
/// is installed.
pub fn promotion_race() {
    let (_budget, region) = region();
    let installed = Arc::new(AtomicUsize::new(0));
    let promote = {
        let (region, installed) = (Arc::clone(&region), Arc::clone(&installed));
        move || match region.begin_change(LARGE) {
            Ok(change) => {
                change.install(false).expect("within budget");
                installed.fetch_add(1, Ordering::Relaxed);
            }
            Err(TierError::ChangePending { .. } | TierError::AlreadyOn { .. }) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    };
    let other = thread::spawn(promote.clone());
    promote();
    other.join().unwrap();
    assert_eq!(region.tier(), LARGE);
    assert_eq!(
        installed.load(Ordering::Relaxed),
        1,
        "exactly one promotion installed"
    );
}

/// A slot of the large tier is in flight (its holder dropped its cache, so only the region
/// keeps the tier) while another thread demotes and reclaims: the large tier must not be
/// freed while the slot is held, and is retired once it is back.
pub fn demotion_against_in_flight_slot() {
    let (budget, region) = region();
    change_to(&region, LARGE);
    assert_eq!(region.reclaim(), 1);
    let holder_region = Arc::clone(&region);
    let holder = thread::spawn(move || {
        let slot = holder_region.cache().try_acquire();
        if let Some(mut slot) = slot {
            stamp(&mut slot, 2);
        }
    });
    change_to(&region, SMALL);
    region.reclaim();
    holder.join().unwrap();
    while region.reclaim() > 0 {}
    assert_eq!(
        budget.in_use(),
        charged(SMALL_LEN),
        "the large tier deregistered once"
    );
}

/// On a ladder that retains replaced tiers, the peer releases the middle tier (retained
/// since the region left it for the top one) while another thread demotes to the smallest
/// tier, which gives the middle tier back: the release is never lost, so once the peer has
/// also released the top tier, both retire and only the smallest tier stays registered.
pub fn release_while_a_demotion_gives_back_a_retained_tier() {
    const MIDDLE: TierIndex = TierIndex::new(1);
    const TOP: TierIndex = TierIndex::new(2);
    let ladder = TierLadder::builder()
        .tier(64, 3, 64)
        .tier(128, 3, 128)
        .tier(256, 3, 256)
        .retain_replaced(true)
        .build()
        .expect("a valid ladder");
    let budget = MemoryBudget::with_cap(1 << 20);
    let registrar: StdArc<dyn Registrar> = StdArc::new(HostRegistrar::new(budget.clone()));
    let reservoir = Reservoir::new(registrar, StdArc::new(ladder));
    let region = Arc::new(TieredRegion::new(StdArc::new(reservoir)).expect("the smallest tier"));
    for tier in [MIDDLE, TOP] {
        region
            .begin_change(tier)
            .expect("the only change")
            .install(true)
            .expect("within budget");
    }
    let peer_region = Arc::clone(&region);
    let peer = thread::spawn(move || assert!(peer_region.peer_released(MIDDLE)));
    region
        .begin_change(SMALL)
        .expect("the only change")
        .install(true)
        .expect("a retained tier");
    peer.join().unwrap();
    assert!(region.peer_released(TOP));
    assert_eq!(region.reclaim(), 2, "the middle and the top tier retire");
    assert_eq!(
        budget.in_use(),
        charged(SMALL_LEN),
        "the smallest tier only"
    );
}
