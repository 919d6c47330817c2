//! Human-readable sizes (`512`, `64KB`, `1.5GB`), as used by `--memory`.
//!
//! Suffixes are binary (1 KB = 1024 bytes), as in memcached and Redis
//! configuration files; `B`, `KiB` style and lower case are accepted.

use std::fmt;

/// Why a size string did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size {:?}: expected a number with an optional B, KB, MB, GB or TB suffix",
            self.0
        )
    }
}

impl std::error::Error for SizeError {}

/// Parses a size in bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_uppercase();
    let mult: u64 = match unit.as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(SizeError(s.to_string())),
    };
    if num.is_empty() {
        return Err(SizeError(s.to_string()));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| SizeError(s.to_string()));
    }
    let f: f64 = num.parse().map_err(|_| SizeError(s.to_string()))?;
    let bytes = f * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(SizeError(s.to_string()));
    }
    Ok(bytes as u64)
}

/// Formats a byte count with a binary suffix, for logs and tables.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64KB"), Ok(64 << 10));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        assert_eq!(parse_size("1MB"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GB"), Ok(3 << 29));
        assert_eq!(parse_size(" 10 MB "), Ok(10 << 20));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "MB", "12XB", "-1", "1..2GB", "99999999999999999999TB"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(10), "10B");
        assert_eq!(format_size(1536), "1.5KB");
        assert_eq!(format_size(1 << 30), "1.0GB");
    }
}
