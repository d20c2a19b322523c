//! Sizes as people write them: `4096`, `512m`, `20g`, `2GiB`.

/// Why a size did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeError {
    /// Not digits with an optional binary suffix.
    Malformed,
    /// More than 64 bits of bytes.
    TooLarge,
}

/// Parses a byte count: digits with an optional binary suffix `k`, `m`, `g` or `t`
/// (any case, optionally followed by `b` or `ib`: `20m`, `20MiB`, `20mb` are 20 × 2^20).
pub fn parse(text: &str) -> Result<u64, SizeError> {
    let lower = text.trim().to_ascii_lowercase();
    let lower = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match lower.as_bytes().last() {
        Some(b'k') => (&lower[..lower.len() - 1], 10),
        Some(b'm') => (&lower[..lower.len() - 1], 20),
        Some(b'g') => (&lower[..lower.len() - 1], 30),
        Some(b't') => (&lower[..lower.len() - 1], 40),
        _ => (lower, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SizeError::Malformed);
    }
    let n: u64 = digits.parse().map_err(|_| SizeError::TooLarge)?;
    n.checked_mul(1 << shift).ok_or(SizeError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_suffixes_parse_and_the_rest_is_refused() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("64m"), Ok(64 << 20));
        assert_eq!(parse("20MiB"), Ok(20 << 20));
        assert_eq!(parse("20mb"), Ok(20 << 20));
        assert_eq!(parse(" 1G "), Ok(1 << 30));
        assert_eq!(parse("2t"), Ok(2 << 40));
        for bad in ["", "m", "12x", "-1", "1.5g", "ib", "b"] {
            assert_eq!(parse(bad), Err(SizeError::Malformed), "{bad:?}");
        }
        assert_eq!(parse("99999999999999999999"), Err(SizeError::TooLarge));
        assert_eq!(parse("17179869184g"), Err(SizeError::TooLarge));
    }
}
