//! Order statistics over a method's samples: median and spread.
//!
//! Percentiles use the nearest-rank definition (the smallest sample such that at
//! least p% of the samples are ≤ it), so every reported figure is a value that was
//! actually measured; with few runs p90/p99 are simply the maximum.

use serde::{Deserialize, Serialize};

/// Summary of one metric's samples for one method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

/// Median of the samples (mean of the two middle ones for an even count).
pub fn median(samples: &[f64]) -> Option<f64> {
    let s = sorted(samples)?;
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Nearest-rank percentile, `p` in 0..=100.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    assert!((0.0..=100.0).contains(&p), "percentile out of range: {p}");
    let s = sorted(samples)?;
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// The summary, or `None` for no samples.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let s = sorted(samples)?;
    Some(Summary {
        n: s.len(),
        median: median(&s)?,
        min: s[0],
        max: s[s.len() - 1],
        p90: percentile(&s, 90.0)?,
        p99: percentile(&s, 99.0)?,
        mean: s.iter().sum::<f64>() / s.len() as f64,
    })
}

fn sorted(samples: &[f64]) -> Option<Vec<f64>> {
    if samples.is_empty() {
        return None;
    }
    assert!(
        samples.iter().all(|v| v.is_finite()),
        "non-finite sample in {samples:?}"
    );
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_unsorted() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        // Few samples: p90 and p99 are the maximum, never an interpolated value.
        assert_eq!(percentile(&[5.0, 1.0, 3.0], 90.0), Some(5.0));
        assert_eq!(percentile(&[5.0, 1.0, 3.0], 50.0), Some(3.0));
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 90.0), Some(9.0));
        assert_eq!(percentile(&ten, 99.0), Some(10.0));
    }

    #[test]
    fn summary_fields() {
        let s = summarize(&[2.0, 8.0, 4.0, 6.0]).unwrap();
        assert_eq!(s.n, 4);
        assert_eq!(s.median, 5.0);
        assert_eq!((s.min, s.max), (2.0, 8.0));
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.p90, 8.0);
        assert!(summarize(&[]).is_none());
    }
}
