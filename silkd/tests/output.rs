//! Backpressure: 200 MiB through a deliberately slow reader keeps silkd small and
//! loses nothing.

use std::time::Duration;

use testkit::procs;
use testkit::silkd::{exec_req, Silkd};
use testkit::wait_until;
use wire::Response;

const TOTAL: u64 = 200 * 1024 * 1024;

#[tokio::test]
async fn two_hundred_mib_through_a_slow_reader() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let idle = silkd.rss_kib();
    c.send(exec_req(&["head", "-c", &TOTAL.to_string(), "/dev/zero"]))
        .await;
    let pid = c.started().await;
    let mut received = 0u64;
    let mut frames = 0u64;
    loop {
        match c.recv().await {
            Response::Stdout { data } => {
                assert!(data.iter().all(|b| *b == 0), "corrupted output");
                received += data.len() as u64;
                frames += 1;
                // Deliberately slow: a pause every 16 frames (~1 MiB).
                if frames.is_multiple_of(16) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            Response::Exit { code, .. } => {
                assert_eq!(code, Some(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(received, TOTAL, "output lost");
    let peak = silkd.peak_rss_kib();
    println!("silkd RSS idle {idle} KiB, peak during 200 MiB slow read {peak} KiB (child {pid})");
    assert!(
        peak < 16 * 1024,
        "silkd peak RSS {peak} KiB: output is piling up instead of backpressuring"
    );
}

#[tokio::test]
async fn a_stalled_reader_stalls_the_child_not_silkd() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    c.send(exec_req(&["head", "-c", &TOTAL.to_string(), "/dev/zero"]))
        .await;
    let pid = c.started().await;
    // Read nothing: the child must end up blocked on its pipe, writing nothing more, which
    // it can only be once silkd stops reading. "Nothing more" means an unchanged byte
    // count over STALLED consecutive looks (a silkd that kept reading would move
    // megabytes between two of them).
    const STALLED: u32 = 20;
    let (mut last, mut same) = (None, 0);
    wait_until(
        Duration::from_secs(20),
        "the child blocked on its pipe",
        async || {
            let (state, written) = (procs::stat(pid).map(|s| s.state), procs::written_bytes(pid));
            same = if state == Some('S') && written == last {
                same + 1
            } else {
                0
            };
            last = written;
            if same >= STALLED {
                Ok(())
            } else {
                Err((state, written))
            }
        },
    )
    .await;
    let rss = silkd.rss_kib();
    assert!(
        rss < 16 * 1024,
        "silkd RSS {rss} KiB while the reader stalls"
    );
    let state = procs::stat(pid).expect("child alive").state;
    assert_eq!(state, 'S', "child should be blocked writing, is {state}");
}
