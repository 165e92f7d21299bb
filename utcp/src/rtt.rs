//! Retransmission timeout per RFC 6298 (SRTT/RTTVAR, Karn's rule is applied by the caller).

use std::time::Duration;

/// The RFC 6298 estimator with configurable clamps.
#[derive(Debug, Clone)]
pub struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    min: Duration,
    max: Duration,
    /// RTO before back-off, restored by the next sample.
    base: Duration,
}

/// Clock granularity G of RFC 6298 §2: `Instant` is fine-grained; 100 µs keeps
/// `4·RTTVAR` from collapsing to zero on a perfectly steady link.
const G: Duration = Duration::from_micros(100);

impl Rtt {
    /// `initial` is the RTO before any sample (RFC 6298 §2.1: 1 s).
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        let rto = initial.clamp(min, max);
        Rtt { srtt: None, rttvar: Duration::ZERO, rto, min, max, base: rto }
    }

    /// The current RTO.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// Smoothed RTT, once there is a sample.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// Take one measurement (RFC 6298 §2.2, §2.3).
    pub fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = if s > r { s - r } else { r - s };
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
        let s = self.srtt.unwrap_or(r);
        self.base = (s + (self.rttvar * 4).max(G)).clamp(self.min, self.max);
        self.rto = self.base;
    }

    /// The timer expired: back off (RFC 6298 §5.5).
    pub fn backoff(&mut self) {
        self.rto = (self.rto * 2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6298_arithmetic() {
        let ms = Duration::from_millis;
        let mut r = Rtt::new(ms(1000), ms(10), ms(60_000));
        assert_eq!(r.rto(), ms(1000));
        r.sample(ms(100)); // srtt 100, rttvar 50 → 300
        assert_eq!(r.rto(), ms(300));
        r.sample(ms(100)); // rttvar 37.5 → 250
        assert_eq!(r.rto(), ms(250));
        r.backoff();
        assert_eq!(r.rto(), ms(500));
        r.sample(ms(100));
        assert!(r.rto() < ms(250));
        let mut r = Rtt::new(ms(1000), ms(200), ms(60_000));
        r.sample(Duration::from_micros(50));
        assert_eq!(r.rto(), ms(200), "clamped to the minimum");
    }
}
