//! Reading sandboxd's `/metrics` text exposition in tests: one series' value, and a
//! histogram's buckets checked for the exposition's own invariants.

/// The value of the series written exactly as `series` (name and labels, e.g.
/// `sandboxd_exec_seconds_count{status="200"}`); 0 when it is absent, as Prometheus
/// treats a series not yet created.
pub fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            (name == series).then(|| v.parse::<f64>().expect("a numeric sample"))
        })
        .unwrap_or(0.0)
}

/// The `_bucket` samples of histogram `name` whose labels include `labels` (`""` for
/// none, else e.g. `status="200"`), as (le, cumulative count) in exposition order.
/// Panics unless the counts never decrease and the `+Inf` bucket equals `_count`.
pub fn buckets(text: &str, name: &str, labels: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}_bucket{{");
    let rows: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(labels))
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').expect("a sample line");
            let le = series
                .split("le=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .expect("a bucket's le label")
                .to_string();
            (le, v.parse().expect("a numeric sample"))
        })
        .collect();
    assert!(
        rows.windows(2).all(|w| w[0].1 <= w[1].1),
        "{name}{{{labels}}} buckets decrease: {rows:?}"
    );
    if let Some((le, inf)) = rows.last() {
        assert_eq!(le, "+Inf", "{name}: last bucket is not +Inf");
        let count = if labels.is_empty() {
            value(text, &format!("{name}_count"))
        } else {
            value(text, &format!("{name}_count{{{labels}}}"))
        };
        assert_eq!(*inf, count, "{name}{{{labels}}}: +Inf bucket is not _count");
    }
    rows
}
