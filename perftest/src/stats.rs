//! Medians with their spread, ratios between them, and the targets a ratio
//! is judged against.

/// The repetitions of one measurement: median and min–max of the successful
/// ones, plus how many there were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// Median (the mean of the two middle values for an even count), min and
/// max. `None` for no samples. NaN samples are ignored.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

/// uiw / peer of the medians; `None` when the peer's median is not positive.
pub fn ratio(uiw: &Summary, peer: &Summary) -> Option<f64> {
    if peer.median > 0.0 && uiw.median.is_finite() {
        Some(uiw.median / peer.median)
    } else {
        None
    }
}

/// A target on the ratio uiw/peer, from the issue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// ratio ≥ x (bandwidth against raw TCP)
    AtLeast(f64),
    /// ratio > x (bandwidth against UCX)
    Above(f64),
    /// ratio ≤ x (latency against TCP busy-poll)
    AtMost(f64),
    /// ratio < x (latency against UCX, libfabric)
    Below(f64),
}

impl Target {
    pub fn passes(self, ratio: f64) -> bool {
        match self {
            Target::AtLeast(x) => ratio >= x,
            Target::Above(x) => ratio > x,
            Target::AtMost(x) => ratio <= x,
            Target::Below(x) => ratio < x,
        }
    }

    /// As printed in the table: `≥ 0.9×`.
    pub fn label(self) -> String {
        let (op, x) = match self {
            Target::AtLeast(x) => ("≥", x),
            Target::Above(x) => (">", x),
            Target::AtMost(x) => ("≤", x),
            Target::Below(x) => ("<", x),
        };
        format!("{op} {}×", trim_float(x))
    }
}

/// `1` for 1.0, `0.9` for 0.9: the shortest exact-looking form for labels.
pub fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Pass/miss of a target, or why it cannot be judged.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass,
    Miss,
    /// No target on this comparison (informational row).
    Info,
    /// A side has no figure.
    Unjudged,
}

pub fn judge(target: Option<Target>, ratio: Option<f64>) -> Verdict {
    match (target, ratio) {
        (None, _) => Verdict::Info,
        (Some(_), None) => Verdict::Unjudged,
        (Some(t), Some(r)) => {
            if t.passes(r) {
                Verdict::Pass
            } else {
                Verdict::Miss
            }
        }
    }
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Pass => "**pass**",
            Verdict::Miss => "**miss**",
            Verdict::Info => "—",
            Verdict::Unjudged => "n/a",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_spread() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!(
            s,
            Summary {
                median: 2.0,
                min: 1.0,
                max: 3.0,
                n: 3
            }
        );
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!((s.min, s.max, s.n), (1.0, 4.0, 4));
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[f64::NAN]), None);
        assert_eq!(summarize(&[f64::NAN, 5.0]).unwrap().median, 5.0);
    }

    #[test]
    fn ratio_of_medians() {
        let a = summarize(&[2.0, 4.0, 3.0]).unwrap();
        let b = summarize(&[6.0]).unwrap();
        assert_eq!(ratio(&a, &b), Some(0.5));
        let zero = summarize(&[0.0]).unwrap();
        assert_eq!(ratio(&a, &zero), None);
    }

    #[test]
    fn targets() {
        assert!(Target::AtLeast(0.9).passes(0.9));
        assert!(!Target::AtLeast(0.9).passes(0.8999));
        assert!(!Target::Above(1.0).passes(1.0));
        assert!(Target::Above(1.0).passes(1.01));
        assert!(Target::AtMost(1.2).passes(1.2));
        assert!(!Target::AtMost(1.2).passes(1.21));
        assert!(!Target::Below(1.0).passes(1.0));
        assert!(Target::Below(1.0).passes(0.99));
        assert_eq!(Target::AtLeast(0.9).label(), "≥ 0.9×");
        assert_eq!(Target::Below(1.0).label(), "< 1×");
        assert_eq!(judge(None, Some(1.0)), Verdict::Info);
        assert_eq!(judge(Some(Target::Below(1.0)), None), Verdict::Unjudged);
        assert_eq!(judge(Some(Target::Below(1.0)), Some(0.5)), Verdict::Pass);
        assert_eq!(judge(Some(Target::AtMost(1.2)), Some(1.5)), Verdict::Miss);
    }
}
