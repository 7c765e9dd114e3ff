//! Registered memory over time: a [`Sampler`] reads a budget on a thread of its own, each
//! sample the most bytes it held since the one before (so no peak falls between two
//! samples), and a [`Series`] of samples says where it started, peaked and ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tierbuf_pool::MemoryBudget;

/// One reading of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When, in microseconds since the Unix epoch: comparable between the processes of
    /// one host.
    pub at_micros: u64,
    /// The most registered bytes the budget held at once since the sample before (for
    /// the first, since sampling began): [`MemoryBudget::reset_peak`].
    pub bytes: u64,
}

/// Microseconds since the Unix epoch now.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// Samples a budget every period until dropped.
#[derive(Debug)]
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling `budget` every `period`, the first sample at once. The sampler
    /// resets the budget's peak at every sample: nothing else of the process may use it.
    pub fn start(budget: MemoryBudget, period: Duration) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (samples, stop) = (Arc::clone(&samples), Arc::clone(&stop));
            std::thread::spawn(move || {
                // What the setup held before sampling began is not part of the series.
                budget.reset_peak();
                while !stop.load(Ordering::Relaxed) {
                    let sample = Sample {
                        at_micros: now_micros(),
                        bytes: budget.reset_peak(),
                    };
                    samples
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(sample);
                    std::thread::sleep(period);
                }
            })
        };
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // The thread only sleeps and reads the budget: it does not panic.
            let _ = thread.join();
        }
    }
}

/// Samples in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Series {
    /// The samples, oldest first.
    pub samples: Vec<Sample>,
}

impl Series {
    /// The sum of two processes' series at every time either sampled: each one's latest
    /// sample at or before that time (nothing before its first).
    pub fn sum(&self, other: &Series) -> Series {
        let mut times: Vec<u64> = self
            .samples
            .iter()
            .chain(&other.samples)
            .map(|sample| sample.at_micros)
            .collect();
        times.sort_unstable();
        times.dedup();
        Series {
            samples: times
                .into_iter()
                .map(|at_micros| Sample {
                    at_micros,
                    bytes: self.at(at_micros) + other.at(at_micros),
                })
                .collect(),
        }
    }

    /// The latest reading at or before `at_micros`, 0 before the first.
    pub fn at(&self, at_micros: u64) -> u64 {
        let after = self
            .samples
            .partition_point(|sample| sample.at_micros <= at_micros);
        after
            .checked_sub(1)
            .map_or(0, |last| self.samples[last].bytes)
    }

    /// The samples from `from` to `to` microseconds, both included.
    pub fn between(&self, from: u64, to: u64) -> impl Iterator<Item = &Sample> {
        self.samples
            .iter()
            .filter(move |sample| (from..=to).contains(&sample.at_micros))
    }

    /// The highest reading from `from` to `to` microseconds, 0 if none.
    pub fn peak(&self, from: u64, to: u64) -> u64 {
        self.between(from, to)
            .map(|sample| sample.bytes)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(samples: &[(u64, u64)]) -> Series {
        Series {
            samples: samples
                .iter()
                .map(|&(at_micros, bytes)| Sample { at_micros, bytes })
                .collect(),
        }
    }

    #[test]
    fn two_series_add_up_at_every_time_either_sampled() {
        let client = series(&[(10, 1), (30, 5)]);
        let server = series(&[(20, 100), (30, 200), (40, 50)]);
        assert_eq!(
            client.sum(&server),
            series(&[(10, 1), (20, 101), (30, 205), (40, 55)])
        );
        assert_eq!(client.sum(&server).peak(0, 35), 205);
        assert_eq!(client.sum(&server).peak(31, 100), 55);
        assert_eq!(client.at(5), 0);
    }
}
