//! Samples and the one table every suite prints: median, p90, max and n of each row next
//! to the floor measured in the same run, and their ratio. With `BENCH_JSON` set (by
//! `cargo xtask bench --json`), each row is also appended to that file as a JSON line.

use std::io::Write;
use std::time::Duration;

/// One row's timings.
#[derive(Default, Clone)]
pub struct Samples {
    times: Vec<Duration>,
    /// Requests that failed (counted, not timed).
    pub failures: usize,
}

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.times.push(d);
    }

    pub fn n(&self) -> usize {
        self.times.len()
    }

    fn sorted(&self) -> Vec<Duration> {
        let mut v = self.times.clone();
        v.sort();
        v
    }

    /// The `p` quantile (nearest rank); zero without samples.
    pub fn quantile(&self, p: f64) -> Duration {
        let v = self.sorted();
        if v.is_empty() {
            return Duration::ZERO;
        }
        v[(((v.len() as f64) * p).ceil() as usize).clamp(1, v.len()) - 1]
    }

    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    pub fn max(&self) -> Duration {
        self.sorted().last().copied().unwrap_or_default()
    }
}

/// A suite's table: a header, then rows printed as they are measured.
pub struct Table {
    suite: String,
    engine: String,
    floor: Option<(String, Duration)>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Table {
    pub fn new(suite: &str, engine: &str) -> Table {
        println!();
        println!("== bench {suite} ({engine} engine) ==");
        println!(
            "{:<52} {:>10} {:>10} {:>10} {:>6} {:>5} {:>9} {:>9}",
            "row", "median ms", "p90 ms", "max ms", "n", "fail", "× floor", "MiB/s"
        );
        Table {
            suite: suite.into(),
            engine: engine.into(),
            floor: None,
        }
    }

    /// Prints the floor row; later rows show their median over its median.
    pub fn floor(&mut self, what: &str, s: &Samples, bytes: Option<u64>) {
        self.floor = Some((what.into(), s.median()));
        self.print(&format!("floor: {what}"), s, bytes);
    }

    /// Prints a measured row.
    pub fn row(&self, what: &str, s: &Samples, bytes: Option<u64>) {
        self.print(what, s, bytes);
    }

    fn print(&self, what: &str, s: &Samples, bytes: Option<u64>) {
        let ratio = self
            .floor
            .as_ref()
            .filter(|(_, f)| !f.is_zero() && s.n() > 0)
            .map(|(_, f)| s.median().as_secs_f64() / f.as_secs_f64());
        let rate = bytes
            .filter(|_| s.n() > 0 && !s.median().is_zero())
            .map(|b| b as f64 / (1024.0 * 1024.0) / s.median().as_secs_f64());
        println!(
            "{:<52} {:>10.3} {:>10.3} {:>10.3} {:>6} {:>5} {:>9} {:>9}",
            what,
            ms(s.median()),
            ms(s.quantile(0.9)),
            ms(s.max()),
            s.n(),
            s.failures,
            ratio.map_or("—".into(), |r| format!("{r:.2}x")),
            rate.map_or("—".into(), |r| format!("{r:.0}")),
        );
        self.json(what, s, ratio, rate);
    }

    fn json(&self, what: &str, s: &Samples, ratio: Option<f64>, rate: Option<f64>) {
        let Some(path) = std::env::var_os("BENCH_JSON") else {
            return;
        };
        let row = serde_json::json!({
            "suite": self.suite,
            "engine": self.engine,
            "row": what,
            "median_ms": ms(s.median()),
            "p90_ms": ms(s.quantile(0.9)),
            "max_ms": ms(s.max()),
            "n": s.n(),
            "failures": s.failures,
            "floor": self.floor.as_ref().map(|(f, _)| f.clone()),
            "ratio_to_floor": ratio,
            "mib_per_s": rate,
        });
        let line = format!("{row}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("bench: writing {}: {e}", path.to_string_lossy());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut s = Samples::default();
        for i in 1..=10 {
            s.push(Duration::from_millis(i));
        }
        assert_eq!(s.median(), Duration::from_millis(5));
        assert_eq!(s.quantile(0.9), Duration::from_millis(9));
        assert_eq!(s.max(), Duration::from_millis(10));
    }
}
