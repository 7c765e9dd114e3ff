//! Ladder files: TOML in, TOML out, and errors that point at the file, line and column.
//!
//! The format (documented in full in `docs/ladders.md`):
//!
//! ```toml
//! [policy]                  # optional, every key optional
//! demote_after = "30s"
//! hysteresis = "5s"
//! retain_replaced = false
//! reservoir_regions = 0
//!
//! [[tier]]                  # one table per tier, smallest first
//! slot_size = "512B"
//! slot_count = 16
//! promote_threshold = "480B"
//! ```
//!
//! Unknown keys are errors, and so is every validation failure of [`TierLadder`], located at
//! the key that broke the rule.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use toml::Spanned;

use super::size::{ByteSize, format_size_exact};
use super::{LadderError, LadderPolicy, MAX_TIERS, TierLadder};

/// Why a ladder could not be loaded from a file, a string or a preset name.
///
/// ```
/// use tierbuf_tiers::ladder::{LadderError, LoadError, TierLadder};
/// let text = "[[tier]]\nslot_size = \"512B\"\nslot_count = 0\npromote_threshold = 480\n";
/// let err = TierLadder::from_toml_str(text, "small.toml").unwrap_err();
/// assert!(matches!(
///     &err,
///     LoadError::Invalid { line: 3, column: 14, error: LadderError::SlotCountZero { .. }, .. }
/// ));
/// assert_eq!(err.to_string(), "small.toml:3:14: tier 0: slot_count must be greater than 0");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read ladder file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The text is not TOML, or not shaped like a ladder file (wrong type, unknown or missing
    /// key, bad size or duration).
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// The file name given for error messages.
        file: String,
        /// 1-based line of the offending text.
        line: usize,
        /// 1-based column, in characters, of the offending text.
        column: usize,
        /// What was wrong and what was expected.
        message: String,
    },
    /// The file is well formed but the ladder breaks a validation rule.
    #[error("{file}:{line}:{column}: {error}")]
    Invalid {
        /// The file name given for error messages.
        file: String,
        /// 1-based line of the key that broke the rule.
        line: usize,
        /// 1-based column, in characters, of the value that broke the rule.
        column: usize,
        /// The rule that was broken.
        error: LadderError,
    },
    /// No preset has this name.
    #[error("unknown ladder preset {name:?}; the presets are {}", super::PRESET_NAMES.join(", "))]
    UnknownPreset {
        /// The name asked for.
        name: String,
    },
}

/// The whole file as written, with positions kept for error messages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLadder {
    #[serde(default)]
    policy: Option<RawPolicy>,
    #[serde(default)]
    tier: Option<Spanned<Vec<Spanned<RawTier>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    demote_after: Option<Spanned<HumanDuration>>,
    hysteresis: Option<Spanned<HumanDuration>>,
    retain_replaced: Option<bool>,
    reservoir_regions: Option<Spanned<usize>>,
}

impl RawPolicy {
    fn span_of(&self, field: &str) -> Option<Range<usize>> {
        match field {
            "demote_after" => self.demote_after.as_ref().map(Spanned::span),
            "hysteresis" => self.hysteresis.as_ref().map(Spanned::span),
            "reservoir_regions" => self.reservoir_regions.as_ref().map(Spanned::span),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    slot_size: Spanned<ByteSize>,
    slot_count: Spanned<usize>,
    promote_threshold: Spanned<ByteSize>,
}

impl RawTier {
    fn span_of(&self, field: &str) -> Option<Range<usize>> {
        match field {
            "slot_size" => Some(self.slot_size.span()),
            "slot_count" => Some(self.slot_count.span()),
            "promote_threshold" => Some(self.promote_threshold.span()),
            _ => None,
        }
    }
}

/// A duration written as humantime text ("30s", "250ms", "1m 30s").
#[derive(Debug, Clone, Copy)]
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<HumanDuration, D::Error> {
        struct HumanDurationVisitor;

        impl Visitor<'_> for HumanDurationVisitor {
            type Value = HumanDuration;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str(
                    "a duration string with a unit such as \"30s\", \"250ms\" or \"1m 30s\"",
                )
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(text).map(HumanDuration).map_err(|error| {
                    E::custom(format_args!(
                        "invalid duration {text:?}: {error}; expected a duration such as \"30s\", \"250ms\" or \"1m 30s\""
                    ))
                })
            }
        }

        deserializer.deserialize_str(HumanDurationVisitor)
    }
}

/// The 1-based line and character column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Where in the file the rule `error` broke is written.
fn locate(raw: &RawLadder, error: &LadderError) -> Range<usize> {
    let tiers = raw.tier.as_ref();
    let tier_span = |position: usize, field: &str| {
        let tier = tiers?.get_ref().get(position)?;
        tier.get_ref().span_of(field).or_else(|| Some(tier.span()))
    };
    let span = match error {
        LadderError::TooManyTiers { .. } => tier_span(MAX_TIERS, "tier"),
        LadderError::NoTiers => tiers.map(Spanned::span),
        other => match other.tier() {
            Some(tier) => tier_span(usize::from(tier.get()), other.field()),
            None => raw
                .policy
                .as_ref()
                .and_then(|policy| policy.span_of(other.field())),
        },
    };
    span.unwrap_or(0..0)
}

impl TierLadder {
    /// Loads a ladder from TOML text; `file` names the text in error messages.
    ///
    /// ```
    /// use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::from_toml_str(
    ///     r#"
    ///     [policy]
    ///     demote_after = "10s"
    ///
    ///     [[tier]]
    ///     slot_size = "512B"
    ///     slot_count = 64
    ///     promote_threshold = 480
    ///
    ///     [[tier]]
    ///     slot_size = "8KiB"
    ///     slot_count = 32
    ///     promote_threshold = "8KiB"
    ///     "#,
    ///     "inline.toml",
    /// )?;
    /// assert_eq!(ladder.tiers()[1].region_len(), 32 * (8192 + 64)); // 8 KiB and headroom
    ///
    /// let err = TierLadder::from_toml_str("[[tier]]\nslot_size = \"8KB\"\n", "bad.toml").unwrap_err();
    /// assert!(err.to_string().starts_with("bad.toml:2:13: invalid size \"8KB\""));
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn from_toml_str(text: &str, file: &str) -> Result<TierLadder, LoadError> {
        let parse_error = |span: Option<Range<usize>>, message: String| {
            let (line, column) = line_column(text, span.map_or(0, |span| span.start));
            LoadError::Parse {
                file: file.to_owned(),
                line,
                column,
                message,
            }
        };
        let raw: RawLadder = toml::from_str(text)
            .map_err(|error| parse_error(error.span(), error.message().trim_end().to_owned()))?;

        let to_usize = |size: &Spanned<ByteSize>| {
            usize::try_from(size.get_ref().0).map_err(|_| {
                parse_error(
                    Some(size.span()),
                    format!(
                        "size {} does not fit this platform's usize",
                        size.get_ref().0
                    ),
                )
            })
        };
        let mut builder = TierLadder::builder();
        for tier in raw.tier.iter().flat_map(|tiers| tiers.get_ref()) {
            let tier = tier.get_ref();
            builder = builder.tier(
                to_usize(&tier.slot_size)?,
                *tier.slot_count.get_ref(),
                to_usize(&tier.promote_threshold)?,
            );
        }
        if let Some(policy) = &raw.policy {
            let defaults = LadderPolicy::default();
            builder = builder
                .demote_after(
                    policy
                        .demote_after
                        .as_ref()
                        .map_or(defaults.demote_after, |d| d.get_ref().0),
                )
                .hysteresis(
                    policy
                        .hysteresis
                        .as_ref()
                        .map_or(defaults.hysteresis, |d| d.get_ref().0),
                )
                .retain_replaced(policy.retain_replaced.unwrap_or(defaults.retain_replaced))
                .reservoir_regions(
                    policy
                        .reservoir_regions
                        .as_ref()
                        .map_or(defaults.reservoir_regions, |r| *r.get_ref()),
                );
        }
        builder.build().map_err(|error| {
            let (line, column) = line_column(text, locate(&raw, &error).start);
            LoadError::Invalid {
                file: file.to_owned(),
                line,
                column,
                error,
            }
        })
    }

    /// Loads a ladder from a TOML file; errors name the file.
    ///
    /// ```
    /// use tierbuf_tiers::ladder::{LoadError, TierLadder};
    /// let err = TierLadder::from_file("/nonexistent/ladder.toml").unwrap_err();
    /// assert!(matches!(err, LoadError::Read { .. }));
    /// assert!(err.to_string().contains("/nonexistent/ladder.toml"));
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<TierLadder, LoadError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        TierLadder::from_toml_str(&text, &path.display().to_string())
    }

    /// The ladder as a ladder file, which [`from_toml_str`](Self::from_toml_str) reads back
    /// into an equal ladder.
    ///
    /// ```
    /// use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::preset("rpc")?;
    /// let text = ladder.to_toml_string();
    /// assert!(text.contains("slot_size = \"64KiB\""));
    /// assert_eq!(TierLadder::from_toml_str(&text, "rpc.toml")?, ladder);
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn to_toml_string(&self) -> String {
        let policy = self.policy();
        let mut text = format!(
            "[policy]\ndemote_after = \"{}\"\nhysteresis = \"{}\"\nretain_replaced = {}\nreservoir_regions = {}\n",
            humantime::format_duration(policy.demote_after()),
            humantime::format_duration(policy.hysteresis()),
            policy.retain_replaced(),
            policy.reservoir_regions(),
        );
        for tier in self.tiers() {
            text.push_str(&format!(
                "\n[[tier]]\nslot_size = \"{}\"\nslot_count = {}\npromote_threshold = \"{}\"\n",
                format_size_exact(tier.slot_size() as u64),
                tier.slot_count(),
                format_size_exact(tier.promote_threshold() as u64),
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TierIndex;

    const PATENT_LIKE: &str = r#"# two tiers
[policy]
demote_after = "250ms"
hysteresis = "1m 30s"
retain_replaced = true
reservoir_regions = 3

[[tier]]
slot_size = "512B"
slot_count = 16
promote_threshold = 480

[[tier]]
slot_size = "8 KiB"
slot_count = 16
promote_threshold = 8192
"#;

    fn load(text: &str) -> Result<TierLadder, LoadError> {
        TierLadder::from_toml_str(text, "test.toml")
    }

    /// The error's `file:line:column: message` split into its location and message.
    fn located(text: &str) -> ((usize, usize), String) {
        match load(text).unwrap_err() {
            LoadError::Parse {
                file,
                line,
                column,
                message,
            } => {
                assert_eq!(file, "test.toml");
                ((line, column), message)
            }
            LoadError::Invalid {
                file,
                line,
                column,
                error,
            } => {
                assert_eq!(file, "test.toml");
                ((line, column), error.to_string())
            }
            other => panic!("not a located error: {other}"),
        }
    }

    #[test]
    fn a_full_file_loads() {
        let ladder = load(PATENT_LIKE).unwrap();
        let expected = TierLadder::builder()
            .tier(512, 16, 480)
            .tier(8192, 16, 8192)
            .demote_after(Duration::from_millis(250))
            .hysteresis(Duration::from_secs(90))
            .retain_replaced(true)
            .reservoir_regions(3)
            .build()
            .unwrap();
        assert_eq!(ladder, expected);
    }

    #[test]
    fn a_missing_policy_or_policy_key_takes_the_documented_default() {
        let tiers_only = "[[tier]]\nslot_size = 512\nslot_count = 3\npromote_threshold = 512\n";
        assert_eq!(*load(tiers_only).unwrap().policy(), LadderPolicy::default());
        let partial = format!("[policy]\nreservoir_regions = 7\n{tiers_only}");
        let policy = *load(&partial).unwrap().policy();
        assert_eq!(policy.reservoir_regions(), 7);
        assert_eq!(
            policy.demote_after(),
            LadderPolicy::default().demote_after()
        );
    }

    #[test]
    fn syntax_errors_point_at_the_line_and_column() {
        let ((line, column), message) = located("[[tier]]\nslot_size = = 512\n");
        assert_eq!((line, column), (2, 13));
        assert!(!message.is_empty());
        let ((line, _), _) = located("[policy]\ndemote_after = \"30s\n");
        assert_eq!(line, 2);
    }

    #[test]
    fn unknown_keys_are_rejected_where_they_are() {
        let ((line, column), message) =
            located("[[tier]]\nslot_size = 512\nslot_cuont = 1\npromote_threshold = 512\n");
        assert_eq!((line, column), (3, 1));
        assert!(message.contains("unknown field `slot_cuont`"), "{message}");
        let ((line, _), message) = located("[polcy]\n");
        assert_eq!(line, 1);
        assert!(message.contains("unknown field `polcy`"), "{message}");
        let ((line, column), message) = located("[policy]\n  demote_afterr = \"1s\"\n");
        assert_eq!((line, column), (2, 3));
        assert!(message.contains("unknown field"), "{message}");
    }

    #[test]
    fn missing_keys_and_wrong_types_are_rejected() {
        let (_, message) = located("[[tier]]\nslot_size = 512\nslot_count = 3\n");
        assert!(
            message.contains("missing field `promote_threshold`"),
            "{message}"
        );
        let ((line, column), message) =
            located("[[tier]]\nslot_size = 512\nslot_count = \"16\"\npromote_threshold = 1\n");
        assert_eq!((line, column), (3, 14));
        assert!(message.contains("expected usize"), "{message}");
        let ((line, column), message) =
            located("[[tier]]\nslot_size = 512\nslot_count = -1\npromote_threshold = 1\n");
        assert_eq!((line, column), (3, 14));
        assert!(message.contains("-1"), "{message}");
        let ((line, column), message) =
            located("[[tier]]\nslot_size = -512\nslot_count = 3\npromote_threshold = 1\n");
        assert_eq!((line, column), (2, 13));
        assert!(message.contains("expected a size in bytes"), "{message}");
        let (_, message) = located("tier = 3\n");
        assert!(message.contains("invalid type"), "{message}");
    }

    #[test]
    fn bad_sizes_point_at_the_value() {
        let ((line, column), message) =
            located("[[tier]]\nslot_count = 3\npromote_threshold = 1\nslot_size = \"1.5KiB\"\n");
        assert_eq!((line, column), (4, 13));
        assert!(
            message.contains("invalid size \"1.5KiB\": expected a size in bytes"),
            "{message}"
        );
        let (_, message) =
            located("[[tier]]\nslot_count = 3\npromote_threshold = 1\nslot_size = \"8KB\"\n");
        assert!(message.contains("decimal units are ambiguous"), "{message}");
        let (_, message) =
            located("[[tier]]\nslot_count = 3\npromote_threshold = 1\nslot_size = 1.5\n");
        assert!(message.contains("expected a size in bytes"), "{message}");
    }

    #[test]
    fn bad_durations_point_at_the_value() {
        let ((line, column), message) = located("[policy]\nhysteresis = \"5 parsecs\"\n");
        assert_eq!((line, column), (2, 14));
        assert!(
            message.contains("invalid duration \"5 parsecs\""),
            "{message}"
        );
        let ((line, column), message) = located("[policy]\n\ndemote_after = 30\n");
        assert_eq!((line, column), (3, 16));
        assert!(
            message.contains("a duration string with a unit"),
            "{message}"
        );
    }

    #[test]
    fn validation_errors_point_at_the_key_that_broke_the_rule() {
        let text = "[[tier]]\nslot_size = 512\nslot_count = 3\npromote_threshold = 512\n\n[[tier]]\nslot_size = \"8KiB\"\nslot_count = 3\npromote_threshold = 100\n";
        let err = load(text).unwrap_err();
        let LoadError::Invalid {
            line,
            column,
            error,
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!((*line, *column), (9, 21));
        assert_eq!(
            *error,
            LadderError::PromoteThresholdNotIncreasing {
                tier: TierIndex::new(1),
                promote_threshold: 100,
                below: 512
            }
        );
        assert_eq!(
            err.to_string(),
            "test.toml:9:21: tier 1: promote_threshold 100 is not larger than the promote_threshold 512 of the tier below, so no message would ever need this tier"
        );

        let unaligned =
            located("[[tier]]\nslot_count = 3\n    slot_size = 100\npromote_threshold = 1\n");
        assert_eq!(
            unaligned,
            (
                (3, 17),
                "tier 0: slot_size 100 is not a multiple of 64 bytes".to_owned()
            )
        );
        let zero_count =
            located("[[tier]]\nslot_size = 64\nslot_count = 0\npromote_threshold = 1\n");
        assert_eq!(
            zero_count,
            (
                (3, 14),
                "tier 0: slot_count must be greater than 0".to_owned()
            )
        );
        let demote = located(
            "[policy]\ndemote_after = \"0s\"\n[[tier]]\nslot_size = 64\nslot_count = 3\npromote_threshold = 1\n",
        );
        assert_eq!(
            demote,
            (
                (2, 16),
                "policy: demote_after must be greater than 0".to_owned()
            )
        );
        let few = located("[[tier]]\nslot_size = 64\nslot_count = 2\npromote_threshold = 1\n");
        assert_eq!(
            few,
            (
                (3, 14),
                "tier 0: slot_count 2 is below 3, the receives a connection keeps posted"
                    .to_owned()
            )
        );
        let tier = "[[tier]]\nslot_size = 64\nslot_count = 3\npromote_threshold = 1\n";
        let hysteresis = located(&format!("[policy]\nhysteresis = \"2days\"\n{tier}"));
        assert_eq!(
            hysteresis,
            (
                (2, 14),
                "policy: hysteresis 2days passes the maximum of 1day".to_owned()
            )
        );
        let reservoir = located(&format!("[policy]\n\nreservoir_regions = 1025\n{tier}"));
        assert_eq!(
            reservoir,
            (
                (3, 21),
                "policy: reservoir_regions 1025 passes the maximum of 1024".to_owned()
            )
        );
    }

    #[test]
    fn a_file_without_tiers_is_an_error() {
        assert_eq!(
            located(""),
            ((1, 1), "a ladder needs at least one [[tier]]".to_owned())
        );
        assert_eq!(
            located("\n\ntier = []\n"),
            ((3, 8), "a ladder needs at least one [[tier]]".to_owned())
        );
    }

    #[test]
    fn too_many_tiers_points_at_the_first_tier_too_many() {
        let text: String = (1..=256)
            .map(|step| {
                format!(
                    "[[tier]]\nslot_size = {}\nslot_count = 3\npromote_threshold = {}\n",
                    step * 64,
                    step * 64
                )
            })
            .collect();
        let ((line, column), message) = located(&text);
        assert_eq!((line, column), (255 * 4 + 1, 1));
        assert_eq!(message, "a ladder has at most 255 tiers, this one has 256");
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let ((line, column), _) = located(
            "# ünïcödé\n[[tier]]\nslot_size = 512 # größe\nslot_count = 3\npromote_threshold = \"9ß\"\n",
        );
        assert_eq!((line, column), (5, 21));
        assert_eq!(line_column("aé\nxyz", 3), (1, 3));
        assert_eq!(
            line_column("aé\nxyz", 2),
            (1, 2),
            "inside a character: its start"
        );
        assert_eq!(line_column("ab", 99), (1, 3));
    }

    #[test]
    fn read_errors_name_the_file() {
        let err = TierLadder::from_file("/nonexistent/dir/ladder.toml").unwrap_err();
        assert!(
            matches!(&err, LoadError::Read { path, .. } if path == Path::new("/nonexistent/dir/ladder.toml"))
        );
        assert!(
            err.to_string()
                .starts_with("cannot read ladder file /nonexistent/dir/ladder.toml: ")
        );
    }

    #[test]
    fn written_files_read_back_equal() {
        let ladder = load(PATENT_LIKE).unwrap();
        let text = ladder.to_toml_string();
        assert!(text.contains("hysteresis = \"1m 30s\""), "{text}");
        assert!(text.contains("promote_threshold = \"480B\""), "{text}");
        assert_eq!(load(&text).unwrap(), ladder);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;
        use crate::ladder::MAX_POLICY_DURATION;

        /// Builder inputs that satisfy every rule: increments keep sizes and thresholds rising,
        /// fractions keep each threshold between the one below and its own slot size.
        fn valid_ladder() -> impl Strategy<Value = TierLadder> {
            let tier = (1usize..2000, 3usize..500, 0usize..=1000);
            let policy = (
                1u64..10_000_000,
                0u32..1_000_000_000,
                any::<u64>(),
                any::<bool>(),
                0usize..100,
            );
            (prop::collection::vec(tier, 1..8), policy).prop_map(|(tiers, policy)| {
                let (demote_millis, hysteresis_nanos, hysteresis_secs, retain_replaced, reservoir) =
                    policy;
                let mut builder = TierLadder::builder()
                    .demote_after(Duration::from_millis(demote_millis))
                    .hysteresis(Duration::new(
                        hysteresis_secs % MAX_POLICY_DURATION.as_secs(),
                        hysteresis_nanos,
                    ))
                    .retain_replaced(retain_replaced)
                    .reservoir_regions(reservoir);
                let (mut slot_size, mut threshold) = (0, 0);
                for (increment, slot_count, fraction) in tiers {
                    slot_size += increment * 64;
                    threshold += 1 + (slot_size - threshold - 1) * fraction / 1000;
                    builder = builder.tier(slot_size, slot_count, threshold);
                }
                builder
                    .build()
                    .expect("the strategy only makes valid ladders")
            })
        }

        /// Text that looks like a ladder file, right or wrong in many ways.
        const LADDERISH: &str = "((\\[\\[tier\\]\\]|\\[policy\\]|tier = \\[\\]|(slot_size|slot_count|promote_threshold|demote_after|hysteresis|retain_replaced|reservoir_regions|bogus) = (-?[0-9]{1,22}|\"[0-9]{0,4} ?(B|KiB|MiB|TiB|KB|s|ms|m 5s|h|)\"|true|\\[\\]|1\\.5|\\{\\}))\n){0,24}";

        proptest! {
            #[test]
            fn valid_ladders_round_trip_through_toml(ladder in valid_ladder()) {
                let text = ladder.to_toml_string();
                prop_assert_eq!(TierLadder::from_toml_str(&text, "generated.toml").unwrap(), ladder);
            }

            #[test]
            fn random_bytes_never_panic_the_loader(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                let text = String::from_utf8_lossy(&bytes);
                if let Err(LoadError::Parse { line, column, .. } | LoadError::Invalid { line, column, .. }) =
                    TierLadder::from_toml_str(&text, "random.toml")
                {
                    prop_assert!(line >= 1 && column >= 1);
                }
            }

            #[test]
            fn random_ladder_files_load_valid_or_fail_located(text in LADDERISH) {
                match TierLadder::from_toml_str(&text, "random.toml") {
                    Ok(ladder) => {
                        prop_assert_eq!(TierLadder::from_toml_str(&ladder.to_toml_string(), "again.toml").unwrap(), ladder);
                    }
                    Err(LoadError::Parse { line, column, .. } | LoadError::Invalid { line, column, .. }) => {
                        prop_assert!(line >= 1 && line <= text.lines().count().max(1) + 1);
                        prop_assert!(column >= 1);
                    }
                    Err(other) => prop_assert!(false, "unexpected error {}", other),
                }
            }
        }
    }
}
