//! The host TSC frequency, for `tsc_early_khz=` on the guest kernel command line: under
//! TCG the guest's TSC is the host's, and without this hint a microvm guest can hang in
//! early boot when its vCPU thread is descheduled (measured: 14 of 20 boots hung under host
//! load without it, 0 of 32 with it; see `docs/deploy.md`, `[qemu]`).

use std::sync::OnceLock;
use std::time::Duration;

/// Measures once (≈200 ms) and caches: rdtsc against CLOCK_MONOTONIC_RAW.
pub fn host_tsc_khz() -> u64 {
    static KHZ: OnceLock<u64> = OnceLock::new();
    *KHZ.get_or_init(measure)
}

fn monotonic_raw_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

fn measure() -> u64 {
    let (t0, c0) = (monotonic_raw_ns(), rdtsc());
    std::thread::sleep(Duration::from_millis(200));
    let (t1, c1) = (monotonic_raw_ns(), rdtsc());
    let ns = (t1 - t0).max(1);
    ((c1.wrapping_sub(c0)) as u128 * 1_000_000 / ns) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn plausible_frequency() {
        let khz = super::host_tsc_khz();
        assert!((500_000..10_000_000).contains(&khz), "{khz} kHz");
    }
}
