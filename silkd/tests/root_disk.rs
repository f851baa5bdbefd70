//! `--root-disk` and `--disk-mib` outside a VM: sizes that cannot be a writable layer are
//! refused at parse time, naming the flag; a silkd that is not PID 1 never mounts or
//! switches root whatever it is told (it serves, and its root is still the host's).

use std::process::Command;

use testkit::silkd::Silkd;

#[test]
fn a_writable_layer_size_out_of_range_is_refused_naming_the_flag() {
    for bad in ["0", "-1", "1048577", "18446744073709551616", "1g", ""] {
        let out = Command::new(env!("CARGO_BIN_EXE_silkd"))
            .args([
                "--listen",
                "unix:/nonexistent/s.sock",
                "--root-disk",
                "/dev/vda",
            ])
            .arg(format!("--disk-mib={bad}"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--disk-mib {bad:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--disk-mib"), "--disk-mib {bad:?}: {err}");
    }
}

#[tokio::test]
async fn not_pid_1_it_serves_without_touching_mounts() {
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let silkd = Silkd::start_with(
        env!("CARGO_BIN_EXE_silkd"),
        &["--root-disk", "/nonexistent-disk", "--disk-mib", "64"],
    )
    .await;
    let mut c = silkd.connect().await;
    let out = c
        .run(&["sh", "-c", "test -d /usr/bin && echo served"])
        .await;
    assert_eq!(out.stdout, b"served\n", "{out:?}");
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/root", silkd.pid())).unwrap(),
        std::path::Path::new("/"),
        "silkd changed its root"
    );
    let mounts_after = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_eq!(mounts_before, mounts_after, "silkd mounted something");
}
