//! The SDK and `sbx` against a node that does not own the sandbox: two sandboxd nodes
//! over one etcd member, `a` with no warm guests so its claims are placed on `b`. A
//! claim, a buffered exec, a streamed process (the relay upgrade), a file round trip,
//! `sbx exec` and `sbx ls`, and the release all go through `a` and are served by `b`.

use sandbox_sdk::{ClaimOptions, Command};
use testkit::cluster::{member, start_node, wait_view};
use testkit::etcd::Etcd;
use testkit::{bounded, Setup, ROOT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_and_sbx_work_through_a_node_that_does_not_own_the_sandbox() {
    let etcd = Etcd::start(1).await;
    let a = start_node(
        &etcd,
        "a",
        &Setup {
            warm: 0,
            ..Setup::default()
        },
    )
    .await;
    let b = start_node(&etcd, "b", &Setup::default()).await;
    wait_view(&a, "b warm", |v| {
        member(v, "b").is_some_and(|m| m["pools"][0]["warm"] == 1) && member(v, "a").is_some()
    })
    .await;
    bounded(async {
        let sandbox = a.root().claim(ClaimOptions::new()).await.unwrap();
        let id = sandbox.id().to_string();
        // Placed on b: b holds it, a does not.
        let on_b = b.root().list().await.unwrap();
        assert_eq!(
            on_b.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            [id.as_str()]
        );

        let out = sandbox
            .exec(&Command::shell("echo via-a; exit 3"))
            .await
            .unwrap();
        assert_eq!(
            (out.stdout_text().as_ref(), out.exit.code()),
            ("via-a\n", Some(3))
        );
        let streamed = sandbox
            .spawn(&Command::shell("for i in 1 2 3; do echo line$i; done"))
            .await
            .unwrap()
            .output()
            .await
            .unwrap();
        assert_eq!(streamed.stdout_text(), "line1\nline2\nline3\n");
        sandbox
            .files()
            .write("/tmp/through-a", "bytes\n")
            .await
            .unwrap();
        assert_eq!(
            sandbox.files().read("/tmp/through-a").await.unwrap(),
            b"bytes\n"
        );

        let sbx = |args: &[&str]| {
            std::process::Command::new(env!("CARGO_BIN_EXE_sbx"))
                .env("SANDBOXD_URL", a.url())
                .env("SANDBOXD_TOKEN", ROOT)
                .stdin(std::process::Stdio::null())
                .args(args)
                .output()
                .expect("running sbx")
        };
        let out = sbx(&["exec", &id, "--", "cat", "/tmp/through-a"]);
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).as_ref()
            ),
            (Some(0), "bytes\n"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ls = sbx(&["ls", &format!("{id}:/tmp")]);
        assert!(
            String::from_utf8_lossy(&ls.stdout).contains("through-a"),
            "{ls:?}"
        );

        sandbox.release().await.unwrap();
        assert!(b.root().list().await.unwrap().is_empty(), "released on b");
    })
    .await;
}
