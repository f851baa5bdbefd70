//! The soak's quick form in CI: `bench_soak --quick --no-restart` (500 buffered execs at
//! concurrency 64 over 8 process sandboxes, 5% of clients hanging up) must answer every
//! completed exec with its own marker, give no 5xx and leave no process behind. The
//! full soak with its `kill -9` + restart is `cargo xtask bench soak` (docs/benchmarks.md).

use std::process::Command;

#[test]
fn quick_soak_answers_every_exec_with_its_own_marker_and_leaks_nothing() {
    let out = Command::new(testkit::bins::example("bench_soak"))
        .args(["--quick", "--no-restart"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench_soak failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{stdout}"))
            .to_string()
    };
    let completed = line("soak: completed replies: ");
    let (done, own) = completed
        .split_once(", carrying their own marker: ")
        .unwrap();
    let hung_up: usize = line("soak: clients that hung up: ").parse().unwrap();
    assert_eq!(done, own, "{stdout}");
    assert_eq!(done.parse::<usize>().unwrap() + hung_up, 500, "{stdout}");
    assert_eq!(line("soak: 5xx outside the restart window: "), "0");
    assert!(
        line("soak: leaked processes afterwards: ").starts_with("0 "),
        "{stdout}"
    );
}
