//! A userspace TCP stack driven over a [`FrameIo`]: receive a batch, run timers, transmit
//! everything due. One `poll` is one turn of the loop; `wait` blocks in `poll(2)` until a
//! frame arrives or the stack's next deadline.

use std::io;
use std::time::{Duration, Instant};

use uiw_utcp::{Stack, StackConfig};

use crate::FrameIo;

/// Counters of one host.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub rx_frames: u64,
    pub rx_dropped: u64,
    pub tx_frames: u64,
    /// Frames the driver had no room for (the TCP retransmits them).
    pub tx_full: u64,
}

/// The stack and its driver.
pub struct Host<Io: FrameIo> {
    pub stack: Stack,
    pub io: Io,
    buf: Vec<u8>,
    pub stats: Stats,
}

impl<Io: FrameIo> Host<Io> {
    pub fn new(cfg: StackConfig, io: Io) -> Self {
        let stack = Stack::new(cfg);
        let buf = vec![0; stack.max_frame()];
        Host { stack, io, buf, stats: Stats::default() }
    }

    /// One turn: up to `budget` received frames in, timers, every due frame out. Returns
    /// whether anything moved.
    pub fn poll(&mut self, budget: usize) -> io::Result<bool> {
        let now = Instant::now();
        let stack = &mut self.stack;
        let stats = &mut self.stats;
        let n = self.io.recv(budget, &mut |f| {
            stats.rx_frames += 1;
            if stack.on_frame(f, now).is_err() {
                stats.rx_dropped += 1;
            }
        })?;
        self.stack.on_timeout(now);
        let mut sent = 0;
        while let Some(len) = self.stack.poll_transmit(now, &mut self.buf) {
            if self.io.send(&self.buf[..len])? {
                sent += 1;
            } else {
                self.stats.tx_full += 1;
                self.io.flush()?;
            }
        }
        self.stats.tx_frames += sent;
        if sent > 0 {
            self.io.flush()?;
        }
        Ok(n > 0 || sent > 0)
    }

    /// Block until a frame may have arrived, the stack's next deadline, or `max`.
    pub fn wait(&mut self, max: Duration) -> io::Result<()> {
        let now = Instant::now();
        let mut t = max;
        if let Some(d) = self.stack.poll_timeout() {
            t = t.min(d.saturating_duration_since(now));
        }
        let mut p = libc::pollfd { fd: self.io.fd(), events: libc::POLLIN, revents: 0 };
        let ms = t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }
}
