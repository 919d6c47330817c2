//! Expiry times as memcached reads them, and the base64 of meta keys.

use super::*;

/// Parses an expiry time as memcached does, given the time now: `None`
/// for no expiry, `Some(0)` for already expired, else the deadline in the
/// same milliseconds as `now_ms`. `unix_now_ms` is the wall clock, for
/// absolute times (over [`MC_RELATIVE_EXPTIME_SECS_MAX`]).
pub fn deadline_ms(exptime: i64, now_ms: u64, unix_now_ms: u64) -> Option<u64> {
    if exptime == 0 {
        return None;
    }
    if exptime < 0 {
        return Some(0);
    }
    let t = exptime as u64;
    if exptime <= MC_RELATIVE_EXPTIME_SECS_MAX {
        return Some(now_ms.saturating_add(t * 1000).max(1));
    }
    let at = t.saturating_mul(1000);
    if at <= unix_now_ms {
        Some(0)
    } else {
        Some(now_ms.saturating_add(at - unix_now_ms).max(1))
    }
}

pub(crate) const B64: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub(crate) fn b64_value(c: u8) -> Option<u32> {
    B64.iter().position(|&x| x == c).map(|p| p as u32)
}

/// Decodes standard base64 (with padding) into `out`; the decoded length,
/// or `None` if `src` is not base64 or does not fit.
pub fn base64_decode(src: &[u8], out: &mut [u8]) -> Option<usize> {
    if src.is_empty() || !src.len().is_multiple_of(4) {
        return None;
    }
    let mut n = 0;
    let chunks = src.len() / 4;
    for (i, c) in src.chunks(4).enumerate() {
        let last = i + 1 == chunks;
        let pad = if last {
            c.iter().rev().take_while(|&&b| b == b'=').count()
        } else {
            0
        };
        if pad > 2 {
            return None;
        }
        let mut v: u32 = 0;
        for &b in &c[..4 - pad] {
            v = (v << 6) | b64_value(b)?;
        }
        v <<= 6 * pad as u32;
        let bytes = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        for &b in &bytes[..3 - pad] {
            *out.get_mut(n)? = b;
            n += 1;
        }
    }
    Some(n)
}

/// Appends the standard base64 of `src` to `out`.
pub fn base64_encode(src: &[u8], out: &mut Vec<u8>) {
    for c in src.chunks(3) {
        let v = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[((v >> (18 - 6 * i)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}
