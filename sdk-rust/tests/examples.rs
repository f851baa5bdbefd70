//! The examples against a real sandboxd: each runs, leaves nothing behind, and the
//! quickstart is the one the docs show.

use testkit::{bins, bounded, Setup, ROOT};
use tokio::process::Command;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn quickstart_example_runs_and_matches_the_docs() {
    let example = bins::example("quickstart");
    let source = include_str!("../examples/quickstart.rs");
    for (name, docs) in [
        ("docs/sdk.md", include_str!("../../docs/sdk.md")),
        ("README.md", include_str!("../../README.md")),
    ] {
        assert!(
            docs.contains(&format!("```rust\n{source}```")),
            "{name} must show examples/quickstart.rs verbatim in a ```rust block"
        );
    }

    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let out = Command::new(example)
            .env("SANDBOXD_URL", d.url())
            .env("SANDBOXD_TOKEN", ROOT)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8(out.stdout.clone()).unwrap();
        assert_eq!(text, "hello\nline 1\nline 2\nline 3\nexited: exit code 0\n");
        assert_eq!(stderr(&out), "");
        // `with_sandbox` released it: nothing is left claimed.
        assert!(d.root().list().await.unwrap().is_empty());
    })
    .await
}

#[tokio::test]
async fn stream_example_gives_up_and_leaves_nothing() {
    let example = bins::example("stream");
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let out = Command::new(example)
            .env("SANDBOXD_URL", d.url())
            .env("SANDBOXD_TOKEN", ROOT)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8(out.stdout.clone()).unwrap();
        assert!(text.contains("\ntick 1\ntick 2\n"), "{text}");
        assert!(
            text.ends_with("gave up after 1s; killed\nstill running: 0\n"),
            "{text}"
        );
        assert!(d.root().list().await.unwrap().is_empty());
    })
    .await
}
