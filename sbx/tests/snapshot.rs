//! The SDK's `snapshot`, `ClaimOptions::from_snapshot`, `hibernate`, the tenant's list
//! and delete, and `sbx snapshot take|ls|rm`, `sbx fork`, `sbx hibernate`, against a real
//! sandboxd (process engine: the writable layer only, hibernation refused).

use sandbox_sdk::{ClaimOptions, Command, Error, SnapshotOptions};
use testkit::{bounded, Setup, ROOT};

fn sbx(d: &testkit::DaemonProcess, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sbx"))
        .env("SANDBOXD_URL", d.url())
        .env("SANDBOXD_TOKEN", ROOT)
        .stdin(std::process::Stdio::null())
        .args(args)
        .output()
        .expect("running sbx")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

#[tokio::test]
async fn sdk_and_sbx_snapshot_fork_and_hibernate() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let client = d.root();
        let parent = client.claim(ClaimOptions::new()).await.unwrap();
        let write = Command::from_argv(["sh", "-c", "echo snap-me > /tmp/f"]);
        assert!(parent.exec(&write).await.unwrap().exit.success());

        let snap = parent
            .snapshot(SnapshotOptions::new().name("sdk"))
            .await
            .unwrap();
        assert!(!snap.memory, "the process engine keeps no memory");
        let bad = parent.snapshot(SnapshotOptions::new().name("a/b")).await;
        assert!(matches!(bad, Err(Error::BadRequest(_))), "{bad:?}");

        let fork = client
            .claim(ClaimOptions::from_snapshot(&snap.snapshot_id))
            .await
            .unwrap();
        let cat = Command::from_argv(["cat", "/tmp/f"]);
        assert_eq!(fork.exec(&cat).await.unwrap().stdout, b"snap-me\n");
        let unknown = client
            .claim(ClaimOptions::from_snapshot("snap-000000000000000000000000"))
            .await;
        assert!(
            matches!(unknown, Err(Error::NotFound { .. })),
            "{unknown:?}"
        );
        let refused = parent.hibernate().await;
        assert!(
            matches!(&refused, Err(Error::Unexpected { status: 409, .. })),
            "{refused:?}"
        );

        // The CLI: list, fork, hibernate (refused: exit 1, the reason on stderr), rm.
        let out = sbx(&d, &["snapshot", "ls"]);
        assert!(text(&out.stdout).contains(&snap.snapshot_id), "{out:?}");
        let out = sbx(&d, &["fork", &snap.snapshot_id, "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let forked: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = forked["id"].as_str().unwrap();
        let out = sbx(&d, &["exec", id, "--", "cat", "/tmp/f"]);
        assert_eq!(text(&out.stdout), "snap-me");
        let out = sbx(&d, &["snapshot", "take", parent.id(), "--name", "cli"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let second = text(&out.stdout);
        assert!(second.starts_with("snap-"), "{second}");
        let out = sbx(&d, &["hibernate", parent.id()]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("cannot hibernate"),
            "{}",
            text(&out.stderr)
        );
        for s in [&snap.snapshot_id, &second] {
            let out = sbx(&d, &["snapshot", "rm", s]);
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
        assert!(client.snapshots().await.unwrap().is_empty());
        let out = sbx(&d, &["snapshot", "rm", "../../etc"]);
        assert_eq!(out.status.code(), Some(1));
    })
    .await;
}
