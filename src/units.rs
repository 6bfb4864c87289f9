//! Byte sizes as operators write them, parsed one way everywhere (config files and the command
//! line).
//!
//! A size is a number (integer or decimal) and an optional unit, case-insensitive, with optional
//! space between them:
//!
//! | unit | factor | why |
//! |---|---|---|
//! | none, `B` | 1 | |
//! | `KiB`, `MiB`, `GiB`, `TiB` | 2^10, 2^20, 2^30, 2^40 | IEC binary units |
//! | `K`, `M`, `G`, `T` | 2^10, 2^20, 2^30, 2^40 | as systemd's `MemoryMax=` and `docker --memory` read them |
//! | `KB`, `MB`, `GB`, `TB` | 10^3, 10^6, 10^9, 10^12 | SI decimal units, as disk vendors write them |
//!
//! So `8G` and `8GiB` are both 8 x 2^30 bytes, `8GB` is 8 x 10^9. A fraction is rounded to the
//! nearest byte (`1.5GiB`). Zero, negative numbers, and anything that does not fit in 64 bits are
//! errors.
//!
//! May use: the standard library and serde only.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A positive number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Why a string is not a byte size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("`{0}` is not a byte size (a number and a unit, e.g. 8GiB, 512MiB, 2GB)")]
    Syntax(String),
    #[error("unknown unit `{unit}` in `{text}` (B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB)")]
    Unit { text: String, unit: String },
    #[error("`{0}` is not a positive size that fits in 64 bits")]
    Range(String),
}

impl ByteSize {
    pub const KIB: u64 = 1 << 10;
    pub const MIB: u64 = 1 << 20;
    pub const GIB: u64 = 1 << 30;

    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The size in MiB, for reports.
    pub fn mib(self) -> f64 {
        self.0 as f64 / Self::MIB as f64
    }
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let t = text.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() || num.len() > 32 {
            return Err(ByteSizeError::Syntax(text.to_string()));
        }
        let value: f64 = num.parse().map_err(|_| ByteSizeError::Syntax(text.to_string()))?;
        let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kib" => (1u64 << 10) as f64,
            "m" | "mib" => (1u64 << 20) as f64,
            "g" | "gib" => (1u64 << 30) as f64,
            "t" | "tib" => (1u64 << 40) as f64,
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            u => return Err(ByteSizeError::Unit { text: text.to_string(), unit: u.to_string() }),
        };
        let bytes = (value * factor).round();
        // 2^64 itself is the first f64 that does not fit
        if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
            return Err(ByteSizeError::Range(text.to_string()));
        }
        Ok(Self(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that keeps the number at least 1, e.g. `8GiB`, `1.5GiB`, `300B`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (size, name) in UNITS {
            if self.0 >= size {
                let v = self.0 as f64 / size as f64;
                return if self.0.is_multiple_of(size) { write!(f, "{}{name}", self.0 / size) } else { write!(f, "{v:.2}{name}") };
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    /// An integer (bytes) or a string with a unit.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            N(i64),
            S(String),
        }
        match Either::deserialize(d)? {
            Either::N(n) if n > 0 => Ok(Self(n as u64)),
            Either::N(n) => Err(serde::de::Error::custom(format!("{n} must be a positive byte count"))),
            Either::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<u64, ByteSizeError> {
        s.parse::<ByteSize>().map(|b| b.0)
    }

    #[test]
    fn units() {
        assert_eq!(p("8GiB"), Ok(8 << 30));
        assert_eq!(p("8G"), Ok(8 << 30));
        assert_eq!(p("8g"), Ok(8 << 30));
        assert_eq!(p("8GB"), Ok(8_000_000_000));
        assert_eq!(p("512 MiB"), Ok(512 << 20));
        assert_eq!(p("512M"), Ok(512 << 20));
        assert_eq!(p("2MB"), Ok(2_000_000));
        assert_eq!(p("1.5GiB"), Ok(3 << 29));
        assert_eq!(p("1.5GB"), Ok(1_500_000_000));
        assert_eq!(p("4096"), Ok(4096));
        assert_eq!(p("4096B"), Ok(4096));
        assert_eq!(p(" 3 KiB "), Ok(3072));
        assert_eq!(p("1TiB"), Ok(1 << 40));
    }

    #[test]
    fn rejects() {
        assert!(matches!(p("lots"), Err(ByteSizeError::Syntax(_))));
        assert!(matches!(p("8XB"), Err(ByteSizeError::Unit { .. })));
        assert!(matches!(p("0"), Err(ByteSizeError::Range(_))));
        assert!(matches!(p("0.1"), Err(ByteSizeError::Range(_))));
        assert!(matches!(p("-1G"), Err(ByteSizeError::Syntax(_))));
        assert!(matches!(p("1.2.3G"), Err(ByteSizeError::Syntax(_))));
        assert!(matches!(p("99999999999TiB"), Err(ByteSizeError::Range(_))));
        assert!(matches!(p(""), Err(ByteSizeError::Syntax(_))));
    }

    #[test]
    fn toml_and_display() {
        #[derive(Deserialize)]
        struct T {
            a: ByteSize,
            b: ByteSize,
        }
        let t: T = toml::from_str("a = 1024\nb = \"2G\"").unwrap();
        assert_eq!((t.a.0, t.b.0), (1024, 2 << 30));
        assert!(toml::from_str::<T>("a = -1\nb = 1").is_err());
        assert!(toml::from_str::<T>("a = 1\nb = \"2Q\"").is_err());
        assert_eq!(ByteSize(8 << 30).to_string(), "8GiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.50GiB");
        assert_eq!(ByteSize(300).to_string(), "300B");
    }
}
