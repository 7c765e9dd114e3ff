//! Byte sizes as people write them in ladder files and read them in tables.
//!
//! Accepted: a plain integer (bytes) or a string of digits followed by an optional unit,
//! `B`, `KiB`, `MiB`, `GiB` or `TiB`, with at most one space between them ("512B", "8KiB",
//! "1 MiB"). Decimal units (`KB`, `MB`) and fractions are refused rather than guessed at.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The binary units, largest first, with their multipliers.
const UNITS: [(&str, u64); 4] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

const EXPECTED: &str = "a size in bytes such as 512, \"512B\", \"8KiB\", \"1MiB\" or \"1GiB\"";

/// Parses a size; the error says what was expected.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, rest) = text.split_at(digits_end);
    let unit = rest.strip_prefix(' ').unwrap_or(rest);
    let invalid = || format!("invalid size {text:?}: expected {EXPECTED}");
    if digits.is_empty() {
        return Err(invalid());
    }
    let multiplier = match unit {
        "" | "B" => 1,
        _ => match UNITS.iter().find(|(name, _)| *name == unit) {
            Some(&(_, multiplier)) => multiplier,
            None if ["KB", "kB", "MB", "GB", "TB"].contains(&unit) => {
                return Err(format!(
                    "invalid size {text:?}: decimal units are ambiguous, write binary units (KiB = 1024 bytes, MiB, GiB)"
                ));
            }
            None => return Err(invalid()),
        },
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(multiplier))
        .ok_or_else(|| format!("invalid size {text:?}: larger than {} bytes", u64::MAX))
}

/// The exact size in the largest unit that divides it ("8KiB"), or plain bytes ("1000B").
pub(crate) fn format_size_exact(bytes: u64) -> String {
    match UNITS
        .iter()
        .find(|&&(_, multiplier)| bytes != 0 && bytes.is_multiple_of(multiplier))
    {
        Some((unit, multiplier)) => format!("{}{unit}", bytes / multiplier),
        None => format!("{bytes}B"),
    }
}

/// A size for people to read: exact when a unit divides it ("8 KiB"), else one decimal
/// ("156.3 MiB"); below 1 KiB in bytes ("480 B").
pub(crate) fn format_size_readable(bytes: u128) -> String {
    let Some(&(unit, multiplier)) = UNITS
        .iter()
        .find(|&&(_, multiplier)| bytes >= u128::from(multiplier))
    else {
        return format!("{bytes} B");
    };
    let multiplier = u128::from(multiplier);
    if bytes.is_multiple_of(multiplier) {
        format!("{} {unit}", bytes / multiplier)
    } else {
        // Rounded to tenths in integers: exact, and no overflow even near u128::MAX.
        let tenths =
            bytes / multiplier * 10 + (bytes % multiplier * 10 + multiplier / 2) / multiplier;
        format!("{}.{} {unit}", tenths / 10, tenths % 10)
    }
}

/// A size read from a ladder file: an integer (bytes) or a string with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ByteSize(pub(crate) u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ByteSize, D::Error> {
        struct ByteSizeVisitor;

        impl Visitor<'_> for ByteSizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str(EXPECTED)
            }

            fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(bytes))
            }

            fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<ByteSize, E> {
                u64::try_from(bytes)
                    .map(ByteSize)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(bytes), &self))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ByteSize, E> {
                parse_size(text).map(ByteSize).map_err(E::custom)
            }
        }

        deserializer.deserialize_any(ByteSizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        let good = [
            ("0", 0),
            ("512", 512),
            ("512B", 512),
            ("512 B", 512),
            ("8KiB", 8192),
            ("8 KiB", 8192),
            ("1MiB", 1 << 20),
            ("3GiB", 3 << 30),
            ("2TiB", 2 << 40),
        ];
        for (text, bytes) in good {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn bad_sizes_say_what_was_expected() {
        for text in [
            "", "KiB", "8 kib", "8  KiB", "1.5MiB", "-1", "+1", " 8KiB", "8KiB ", "8K", "eight",
        ] {
            let err = parse_size(text).unwrap_err();
            assert!(err.contains("expected a size in bytes"), "{text}: {err}");
        }
        assert!(
            parse_size("8KB")
                .unwrap_err()
                .contains("decimal units are ambiguous")
        );
        assert!(
            parse_size("99999999999999999999")
                .unwrap_err()
                .contains("larger than")
        );
        assert!(
            parse_size("16777216TiB")
                .unwrap_err()
                .contains("larger than")
        );
    }

    #[test]
    fn exact_format_round_trips() {
        for bytes in [
            0,
            1,
            64,
            480,
            512,
            1000,
            1024,
            8192,
            1 << 20,
            (1 << 20) + 64,
            5 << 30,
            u64::MAX,
        ] {
            let text = format_size_exact(bytes);
            assert_eq!(parse_size(&text), Ok(bytes), "{text}");
        }
        assert_eq!(format_size_exact(8192), "8KiB");
        assert_eq!(format_size_exact(1 << 20), "1MiB");
        assert_eq!(format_size_exact(480), "480B");
        assert_eq!(format_size_exact(0), "0B");
    }

    #[test]
    fn readable_format_rounds_to_tenths() {
        assert_eq!(format_size_readable(0), "0 B");
        assert_eq!(format_size_readable(480), "480 B");
        assert_eq!(format_size_readable(8192), "8 KiB");
        assert_eq!(format_size_readable(1536), "1.5 KiB");
        assert_eq!(format_size_readable(10_000 * 16 * 1024), "156.3 MiB");
        assert_eq!(format_size_readable(10_000 * 256 * 1024), "2.4 GiB");
        assert_eq!(format_size_readable(1 << 50), "1024 TiB");
        assert!(format_size_readable(u128::MAX).ends_with(" TiB"));
        assert_eq!(format_size_readable((1 << 20) * 2 - 1), "2.0 MiB");
    }
}
