//! The guards keep their promise: what a test started is gone once the test panicked,
//! and a sent signal is visible at once.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use testkit::procs::{marker, procs_with, signalled};
use testkit::{ChildGuard, Daemon, Setup};

/// Runs `body` on its own thread and expects it to panic.
fn panics(body: impl FnOnce() + Send) {
    std::thread::scope(|s| {
        let joined = s.spawn(body).join();
        assert!(joined.is_err(), "the body should have panicked");
    });
}

#[test]
fn a_child_dies_with_its_panicking_test() {
    let m = marker(1);
    panics(|| {
        let _child = ChildGuard::spawn("sleep", Command::new("sleep").arg(&m));
        assert!(!procs_with(&m).is_empty());
        panic!("test failure");
    });
    assert_eq!(procs_with(&m), Vec::<u32>::new());
}

#[test]
fn a_sent_kill_shows_at_once() {
    let m = marker(2);
    let mut child = ChildGuard::spawn("sleep", Command::new("sleep").arg(&m));
    assert!(!signalled(child.pid()));
    kill(Pid::from_raw(child.pid() as i32), Signal::SIGKILL).unwrap();
    assert!(signalled(child.pid()));
    assert!(child.wait_exit(Duration::from_secs(5)).is_some());
}

#[test]
fn an_in_process_daemon_and_its_sandboxes_stop_with_a_panicking_test() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_string_lossy().into_owned();
    panics(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let d = Daemon::start_in(data.path(), &Setup::default()).await;
            d.wait_pool(Duration::from_secs(10), "1 warm", |p| p["warm"] == 1)
                .await;
            assert!(!procs_with(&dir).is_empty(), "a warm sandbox runs");
            panic!("test failure");
        });
    });
    assert_eq!(procs_with(&dir), Vec::<u32>::new());
}
