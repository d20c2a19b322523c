//! Names for temporary files and directories that are renamed into place: unique to the
//! process and, within it, to the call, so two threads of the daemon building the same
//! thing at once (two creates of a new snapshot's checkout) never share one.

use std::sync::atomic::{AtomicU64, Ordering};

/// `<stem>-<pid>-<n>`, `n` counting this process's calls.
pub fn unique(stem: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{stem}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_calls_never_share_a_name() {
        let names: std::collections::HashSet<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .map(|_| super::unique(".tmp-x"))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(names.len(), 800);
    }
}
