//! `sbx cp` and `sbx ls ID:PATH` against a real sandboxd: files and directories both
//! ways (exact bytes, modes, symlinks), into existing directories, listings, and the
//! one-line errors for missing paths and bad arguments.

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use sandbox_sdk::ClaimOptions;
use testkit::silkd_files::random_bytes;
use testkit::{bounded, trees, DaemonProcess, Setup, ROOT};

/// Runs an `sbx` command line against this daemon with the root token.
async fn sbx(d: &DaemonProcess, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sbx"))
        .env("SANDBOXD_URL", d.url())
        .env("SANDBOXD_TOKEN", ROOT)
        .stdin(std::process::Stdio::null())
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("running sbx")
}

fn ok(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exit 1 with one line on stderr holding `what`.
fn fails(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(what), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test]
async fn cp_and_ls_both_ways() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let id = sandbox.id();
        let at = |p: &str| format!("{id}:{p}");
        let local = tempfile::tempdir().unwrap();
        let l = local.path();

        // A directory in and back out.
        let src = l.join("src");
        std::fs::create_dir(&src).unwrap();
        trees::build(&src, 100);
        ok(&sbx(&d, &["cp", src.to_str().unwrap(), &at("/home/user/dir")]).await);
        let back = l.join("back");
        ok(&sbx(&d, &["cp", &at("/home/user/dir"), back.to_str().unwrap()]).await);
        trees::assert_same(&src, &back);

        // A file in (its mode kept) and back out, exactly.
        let data = random_bytes((1 << 20) + 3, 5);
        let f = l.join("blob");
        std::fs::write(&f, &data).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o750)).unwrap();
        ok(&sbx(&d, &["cp", f.to_str().unwrap(), &at("/tmp/blob")]).await);
        let out = l.join("blob.out");
        ok(&sbx(&d, &["cp", &at("/tmp/blob"), out.to_str().unwrap()]).await);
        assert!(std::fs::read(&out).unwrap() == data);
        let mode = std::fs::metadata(&out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o750);
        // Into existing directories: under the file's own name.
        ok(&sbx(&d, &["cp", f.to_str().unwrap(), &at("/home/user/dir")]).await);
        ok(&sbx(
            &d,
            &["cp", &at("/home/user/dir/blob"), back.to_str().unwrap()],
        )
        .await);
        assert!(std::fs::read(back.join("blob")).unwrap() == data);

        // ls: a directory's entries, a file, JSON.
        let text = ok(&sbx(&d, &["ls", &at("/home/user/dir")]).await);
        assert!(
            text.lines()
                .any(|l| l.starts_with("d ") && l.ends_with(" d0")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("- 0750") && l.ends_with(" blob")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("l ") && l.ends_with("dangling -> nowhere/at/all")),
            "{text}"
        );
        let text = ok(&sbx(&d, &["ls", "--json", &at("/tmp/blob")]).await);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v[0]["size"], (1 << 20) + 3);
        // Plain `sbx ls` still lists sandboxes.
        assert!(ok(&sbx(&d, &["ls"]).await).contains(id));

        // Errors: one line, exit 1, nothing left behind.
        fails(&sbx(&d, &["ls", &at("/nope")]).await, "not found");
        fails(&sbx(&d, &["ls", "/local/path"]).await, "is not ID:PATH");
        let missing = l.join("missing");
        fails(
            &sbx(&d, &["cp", &at("/nope"), missing.to_str().unwrap()]).await,
            "not found",
        );
        assert!(!missing.exists());
        fails(
            &sbx(&d, &["cp", missing.to_str().unwrap(), &at("/tmp/m")]).await,
            "missing",
        );
        fails(&sbx(&d, &["ls", &at("/tmp/m")]).await, "not found");
        fails(&sbx(&d, &["cp", "a", "b"]).await, "neither side");
        fails(&sbx(&d, &["cp", &at("/a"), &at("/b")]).await, "both sides");
        fails(
            &sbx(&d, &["cp", &at("/tmp/blob"), "sb-nosuch:/x"]).await,
            "both sides",
        );
        fails(
            &sbx(&d, &["cp", f.to_str().unwrap(), "sb-nosuch:/x"]).await,
            "not found",
        );
        let leftovers: Vec<_> = std::fs::read_dir(l)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".sbx-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        sandbox.release().await.unwrap();
    })
    .await;
}
