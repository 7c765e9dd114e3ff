//! One validation for ladders: what the ladder loader (and so `tierbuf ladder check`)
//! accepts, a connection accepts, and what it refuses is refused with the field that broke
//! a bound. Each class of bad ladder is given twice: at its limit, which both the loader
//! and `ConnectionConfig::new` accept, and one step past it, which the loader refuses
//! naming the field (a `TierLadder` exists only once validated, so no connection can be
//! configured with it either).

use std::sync::Arc;
use std::time::Duration;

use tierbuf_tiers::ladder::{LoadError, TierLadder};
use tierbuf_transport::connection::{ConfigError, ConnectionConfig};

/// A ladder file of one tier and the policy keys given.
fn one_tier(slot_size: &str, slot_count: &str, policy: &str) -> String {
    format!(
        "[policy]\n{policy}\n[[tier]]\nslot_size = {slot_size}\nslot_count = {slot_count}\npromote_threshold = 64\n"
    )
}

/// A class of bad ladder: the file at the limit, the file past it, and the field named.
struct Class {
    name: &'static str,
    at_limit: String,
    past_limit: String,
    field: &'static str,
}

fn classes() -> Vec<Class> {
    let policy_key = |key: &str, value: &str| format!("{key} = {value}");
    vec![
        Class {
            name: "too few slots (a connection keeps three receives posted)",
            at_limit: one_tier("512", "3", ""),
            past_limit: one_tier("512", "2", ""),
            field: "slot_count",
        },
        Class {
            name: "one slot per tier",
            at_limit: one_tier("512", "3", ""),
            past_limit: one_tier("512", "1", ""),
            field: "slot_count",
        },
        Class {
            name: "too many slots (a receive-queue depth)",
            at_limit: one_tier("64", "16384", ""),
            past_limit: one_tier("64", "16385", ""),
            field: "slot_count",
        },
        Class {
            name: "2^32 slots",
            at_limit: one_tier("64", "16384", ""),
            past_limit: one_tier("64", "4294967296", ""),
            field: "slot_count",
        },
        Class {
            name: "2^40 slots",
            at_limit: one_tier("64", "16384", ""),
            past_limit: one_tier("64", "1099511627776", ""),
            field: "slot_count",
        },
        Class {
            name: "4 GiB slots",
            at_limit: one_tier("\"1GiB\"", "3", ""),
            past_limit: one_tier("\"4GiB\"", "3", ""),
            field: "slot_size",
        },
        Class {
            name: "a slot past 1 GiB",
            at_limit: one_tier("\"1GiB\"", "3", ""),
            past_limit: one_tier("1073741888", "3", ""),
            field: "slot_size",
        },
        Class {
            name: "a region past 32-bit lengths",
            at_limit: one_tier("\"256MiB\"", "15", ""),
            past_limit: one_tier("\"256MiB\"", "16", ""),
            field: "slot_count",
        },
        Class {
            name: "2^63-1 reservoir regions",
            at_limit: one_tier("512", "3", &policy_key("reservoir_regions", "1024")),
            past_limit: one_tier(
                "512",
                "3",
                &policy_key("reservoir_regions", "9223372036854775807"),
            ),
            field: "reservoir_regions",
        },
        Class {
            name: "a hysteresis of 2^64-1 s",
            at_limit: one_tier("512", "3", &policy_key("hysteresis", "\"24h\"")),
            past_limit: one_tier(
                "512",
                "3",
                &policy_key("hysteresis", "\"18446744073709551615s\""),
            ),
            field: "hysteresis",
        },
        Class {
            name: "a hysteresis past a day",
            at_limit: one_tier("512", "3", &policy_key("hysteresis", "\"24h\"")),
            past_limit: one_tier("512", "3", &policy_key("hysteresis", "\"24h 1s\"")),
            field: "hysteresis",
        },
        Class {
            name: "a demote_after past a day",
            at_limit: one_tier("512", "3", &policy_key("demote_after", "\"24h\"")),
            past_limit: one_tier("512", "3", &policy_key("demote_after", "\"24h 1ms\"")),
            field: "demote_after",
        },
    ]
}

#[test]
fn every_class_of_bad_ladder_is_refused_by_the_loader_and_its_limit_is_accepted_by_a_connection() {
    for class in classes() {
        let ladder = TierLadder::from_toml_str(&class.at_limit, "at-limit.toml")
            .unwrap_or_else(|error| panic!("{}: the ladder at the limit: {error}", class.name));
        let config = ConnectionConfig::new(Arc::new(ladder));
        assert!(
            config.is_ok(),
            "{}: the loader accepts a ladder a connection refuses: {:?}",
            class.name,
            config.err()
        );
        match TierLadder::from_toml_str(&class.past_limit, "past-limit.toml") {
            Err(LoadError::Invalid { error, .. }) => {
                assert_eq!(error.field(), class.field, "{}: {error}", class.name);
                let message = error.to_string();
                assert!(
                    message.contains(class.field),
                    "{}: the message names no field: {message}",
                    class.name
                );
            }
            Err(other) => panic!("{}: not a validation error: {other}", class.name),
            Ok(_) => panic!("{}: the loader accepts it", class.name),
        }
    }
}

/// A request timeout is time arithmetic on the negotiation's deadlines: one no `Instant`
/// can be pushed by is refused when configured, not found out by a panic at the first
/// promotion.
#[test]
fn a_request_timeout_past_the_limit_is_refused_when_configured() {
    let ladder = Arc::new(
        TierLadder::builder()
            .tier(512, 4, 480)
            .tier(8192, 4, 8192)
            .build()
            .unwrap(),
    );
    let config = ConnectionConfig::new(ladder).unwrap();
    for timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
        let refused = config.clone().with_request_timeout(timeout, 5);
        assert!(
            matches!(refused, Err(ConfigError::Negotiation(_))),
            "{timeout:?}: {refused:?}"
        );
    }
    assert!(
        config
            .with_request_timeout(Duration::from_secs(60 * 60), 5)
            .is_ok()
    );
}
