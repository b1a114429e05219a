//! Timestamps cheap enough to take on every call.
//!
//! The flight recorder stamps each operation with the kernel's coarse monotonic clock: a read of
//! a page the kernel updates every tick (about 6 ns, against 30 ns for the precise clock), to
//! the tick's resolution (1-4 ms). That is the resolution a hang is diagnosed at; sums of many
//! short calls' durations stay right on average (a tick falls inside a call with the
//! probability of its length). The timeline (`ACCORD_TRACE`) uses the precise clock.

/// Nanoseconds of the coarse monotonic clock.
#[inline]
pub(crate) fn coarse_ns() -> u64 {
    read(COARSE)
}

/// Nanoseconds of the precise monotonic clock.
#[inline]
pub(crate) fn precise_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

#[cfg(target_os = "linux")]
const COARSE: libc::clockid_t = libc::CLOCK_MONOTONIC_COARSE;
#[cfg(not(target_os = "linux"))]
const COARSE: libc::clockid_t = libc::CLOCK_MONOTONIC;

#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: an out-pointer to a local; both clocks exist on every supported system.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Microseconds since the Unix epoch of a monotonic reading (either clock): what dumps and
/// traces carry, so that ranks' records line up when merged (exactly on one host, to the
/// hosts' clock agreement across hosts).
pub(crate) fn epoch_us(mono_ns: u64) -> f64 {
    Epoch::now().us(mono_ns)
}

/// The offset from the monotonic clocks to the Unix epoch, read once: readings converted with
/// one offset keep their order (reading it per reading adds its jitter).
#[derive(Clone, Copy)]
pub(crate) struct Epoch(i128);

impl Epoch {
    pub(crate) fn now() -> Epoch {
        let now_mono = precise_ns() as i128;
        let now_wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        Epoch(now_wall - now_mono)
    }

    /// Microseconds since the Unix epoch of monotonic reading `mono_ns`.
    pub(crate) fn us(self, mono_ns: u64) -> f64 {
        (self.0 + mono_ns as i128) as f64 / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_agree_to_a_tick_and_map_to_now() {
        let (c, p) = (coarse_ns(), precise_ns());
        assert!(
            p + 1_000 >= c && p - c < 50_000_000,
            "coarse {c} precise {p}"
        );
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as f64;
        assert!((epoch_us(precise_ns()) - wall).abs() < 50_000.0);
    }
}
