//! A fixed-size histogram of microsecond durations, for the host's own per-dispatch costs.
//!
//! Log-linear buckets: values below 64 µs are exact, above that each power of two is split
//! into 32 buckets, so a quantile is within about 3% of the true value. Memory is constant
//! (a long-running host records every dispatch), and recording is an index and an increment.

/// Sub-buckets per power of two above the exact range.
const SUB: u32 = 32;
/// Values below this are counted exactly.
const EXACT: u64 = 2 * SUB as u64;
/// Powers of two covered above the exact range (up to about 2^40 µs, 12 days).
const OCTAVES: usize = 34;

/// Counts of durations in log-linear buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; EXACT as usize + OCTAVES * SUB as usize],
            total: 0,
        }
    }
}

impl Histogram {
    /// Counts one value (µs).
    pub fn record(&mut self, micros: u64) {
        let index = bucket(micros).min(self.counts.len() - 1);
        self.counts[index] += 1;
        self.total += 1;
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0 to 1): the smallest bucket value with at least `q` of the
    /// recorded values at or below it. `None` when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(lower_bound(index));
            }
        }
        Some(lower_bound(self.counts.len() - 1))
    }

    /// Adds `other`'s counts to this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
    }
}

/// The bucket of `v`.
fn bucket(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    // v >= 64: its top bit is at `bits - 1` >= 6; keep the five bits below it.
    let bits = 64 - v.leading_zeros();
    let octave = (bits - 7) as usize;
    let sub = ((v >> (bits - 6)) & u64::from(SUB - 1)) as usize;
    EXACT as usize + octave * SUB as usize + sub
}

/// The smallest value that lands in bucket `index`.
fn lower_bound(index: usize) -> u64 {
    if index < EXACT as usize {
        return index as u64;
    }
    let octave = (index - EXACT as usize) / SUB as usize;
    let sub = ((index - EXACT as usize) % SUB as usize) as u64;
    (u64::from(SUB) + sub) << (octave + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_below_64_and_within_3_percent_above() {
        for v in [0, 1, 63, 64, 65, 100, 1_000, 12_345, 1 << 30, (1 << 40) - 1] {
            let low = lower_bound(bucket(v));
            assert!(low <= v, "{v}: bucket starts at {low}");
            if v < EXACT {
                assert_eq!(low, v);
            } else {
                assert!((v - low) as f64 / v as f64 <= 1.0 / 32.0, "{v}: {low}");
            }
        }
        // Bucket boundaries are increasing: no value maps below a smaller one.
        let mut last = 0;
        for v in 0..100_000u64 {
            let b = bucket(v);
            assert!(b >= last, "{v}");
            last = b;
        }
    }

    #[test]
    fn quantiles_follow_the_recorded_values() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile(0.5), Some(50));
        assert_eq!(h.quantile(0.0), Some(1));
        let p99 = h.quantile(0.99).unwrap_or(0);
        assert!((96..=99).contains(&p99), "{p99}");
        let mut other = Histogram::default();
        other.record(u64::MAX);
        h.merge(&other);
        assert_eq!(h.count(), 101);
        assert!(h.quantile(1.0).unwrap_or(0) > 1 << 39);
    }
}
