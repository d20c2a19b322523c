//! The limits' values: byte counts (`--memory`) and CPU bandwidth against the host.

use crate::error::{Error, Result};

/// `--cpus C` on a host with `online` CPUs: more bandwidth than the host has would be
/// accepted by the kernel and mean nothing, so it is refused with the host's count.
pub(super) fn check_cpus_fit(cpus: f64, online: usize) -> Result<()> {
    if online > 0 && cpus > online as f64 {
        return Err(Error::InvalidInput(format!(
            "--cpus {cpus}: this host has {online} CPU{} online: give at most {online}",
            if online == 1 { "" } else { "s" }
        )));
    }
    Ok(())
}

/// Parses a `--memory` byte count ([`sandbox_api::size::parse`]).
pub fn parse_bytes(text: &str) -> Result<u64> {
    use sandbox_api::size::{SizeError, parse};
    parse(text).map_err(|e| {
        Error::InvalidInput(match e {
            SizeError::Malformed => format!(
                "--memory {text:?}: expected bytes, or a number with a k, m, g or t suffix (e.g. 512m)"
            ),
            SizeError::TooLarge => format!(
                "--memory {text:?}: too large: a limit is at most {} bytes (16 EiB, 64 bits)",
                u64::MAX
            ),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_parse_with_suffixes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64m").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert!(parse_bytes("12x").is_err());
        for (text, says) in [
            ("99999999999g", "too large"),
            ("99999999999999999999", "too large"),
            ("12x", "expected bytes"),
            ("g", "expected bytes"),
            ("-5m", "expected bytes"),
        ] {
            let e = parse_bytes(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn cpus_beyond_the_host_are_refused_naming_its_count() {
        assert!(check_cpus_fit(2.0, 2).is_ok());
        assert!(check_cpus_fit(0.5, 1).is_ok());
        let e = check_cpus_fit(1000.0, 2).unwrap_err().to_string();
        assert!(
            e.contains("this host has 2 CPUs") && e.contains("at most 2"),
            "{e}"
        );
    }
}
