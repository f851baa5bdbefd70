//! The `default` template (Debian, python3, pip, node, git, user `user`) on the process
//! engine, through a real sandboxd, silkd and bwrap: commands run as the template's user
//! in its home, or as root, each as a host uid of the sandbox's own block; a writable
//! home and /tmp over a read-only tree, private to each sandbox and bounded in total by
//! `disk_mib`; a wheel installs offline; bad users are 400s.
//! Needs `target/images/default` (`cargo xtask image --template default`).

use std::time::Duration;

use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use testkit::images::template_image;

use testkit::leftovers::Census;
use testkit::procs::{marker, procs_with, status_field, wait_running};
use testkit::setup::{uid_range, UID_BLOCK};
use testkit::{wait_until, Api, Daemon, Setup, ROOT};

/// One command's answer.
#[derive(Debug)]
struct Ran {
    status: u16,
    exit: Option<i64>,
    out: String,
    body: String,
}

async fn run(api: &Api, (id, token): &(String, String), body: Value) -> Ran {
    let r = api.exec(id, token, body).await;
    let text = r.text();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ran {
        status: r.status.into(),
        exit: v["exit_code"].as_i64(),
        out: v["stdout"].as_str().unwrap_or_default().to_string()
            + v["stderr"].as_str().unwrap_or_default(),
        body: text,
    }
}

/// `bash -c script` as the template's user; stderr folded in after stdout.
async fn sh(api: &Api, sandbox: &(String, String), script: &str) -> Ran {
    let body = json!({"argv": ["bash", "-c", script], "timeout_seconds": 120});
    run(api, sandbox, body).await
}

async fn ok(api: &Api, sandbox: &(String, String), script: &str) -> String {
    let r = sh(api, sandbox, script).await;
    assert_eq!((r.status, r.exit), (200, Some(0)), "{script}: {r:?}");
    r.out
}

fn setup() -> Setup {
    Setup {
        image: Some(template_image("default")),
        // The warmup `cargo xtask up` gives its pool, in short: a golden that fails it
        // would fail every claim here.
        warmup: Some(
            r#"["sh", "-c", "python3 -c 'import json, os, subprocess' && node -e 'require(\"fs\")'"]"#
                .into(),
        ),
        ..Setup::default()
    }
}

async fn release(api: &Api, id: &str) {
    let r = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(ROOT),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn runtimes_run_as_the_template_user_in_its_home() {
    let d = Daemon::start(setup()).await;
    let a = d.claim().await;
    assert_eq!(
        ok(&d, &a, "whoami; id -u; pwd; echo $HOME $USER $LANG").await,
        "user\n1000\n/home/user\n/home/user user C.UTF-8\n"
    );
    assert_eq!(ok(&d, &a, "python3 -c 'print(1)'").await, "1\n");
    assert!(ok(&d, &a, "pip --version").await.starts_with("pip "));
    ok(&d, &a, "node -e 0").await;
    assert!(ok(&d, &a, "git --version").await.starts_with("git version"));
    // The template's dotfiles are in the home, owned by the user.
    assert_eq!(
        ok(&d, &a, "stat -c %U ~/.bashrc").await,
        "user\n",
        "home seeded from the template"
    );
    // Home and /tmp writable, the tree (and /usr) not; Python's caches work.
    ok(
        &d,
        &a,
        "echo hi > ~/f && cat ~/f && echo t > /tmp/f && mkdir -p ~/.cache/x",
    )
    .await;
    let r = sh(&d, &a, "touch /usr/x 2>&1; touch /etc/x 2>&1; true").await;
    assert_eq!(r.out.matches("Read-only file system").count(), 2, "{r:?}");
    // A request's user, by name or uid: the template's, or root.
    for (who, is) in [
        ("user", "user"),
        ("1000", "user"),
        ("root", "root"),
        ("0", "root"),
    ] {
        let body = json!({"argv": ["whoami"], "user": who});
        let r = run(&d, &a, body).await;
        assert_eq!((r.status, r.out.trim()), (200, is), "{who}: {r:?}");
    }
    // Root inside can do root's work on the sandbox's own files, still not on the tree.
    let root = |script: &str| json!({"argv": ["bash", "-c", script], "user": "root"});
    let r = run(
        &d,
        &a,
        root("chown root ~user/f && stat -c %U ~user/f && touch /usr/x"),
    )
    .await;
    assert_eq!(r.exit, Some(1), "{r:?}");
    assert!(
        r.out.starts_with("root\n") && r.out.contains("Read-only"),
        "{r:?}"
    );
    // sudo is setuid: no_new_privs (kept for every sandbox) stops it.
    let r = sh(&d, &a, "sudo -n true 2>&1; echo rc=$?").await;
    assert!(!r.out.contains("rc=0"), "sudo must not work: {r:?}");
    // On the host, what root and the user write belongs to the sandbox's block: its first
    // uid (root inside) and that plus 1000 (the user); never host root, never outside.
    ok(&d, &a, "touch /tmp/by-user").await;
    let m = marker(1);
    let (api, sandbox, m2) = ((*d).clone(), a.clone(), m.clone());
    let parked = tokio::spawn(async move {
        let script = format!("touch /tmp/by-root && exec sleep {m2}");
        run(&api, &sandbox, root(&script)).await
    });
    wait_running(&m).await;
    // The marker is in bash's argv before it runs touch: wait for the exec'd sleep.
    let pid = wait_until(Duration::from_secs(30), "the root sleep", async || {
        procs_with(&m).into_iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c == "sleep\n")
        })
    })
    .await;
    let first = status_field(pid, "Uid:").unwrap() as u32;
    let range = uid_range(&d.dir);
    assert!(
        range.contains(&first) && (first - range.start).is_multiple_of(UID_BLOCK),
        "{first}"
    );
    let owner = |f: &str| std::fs::metadata(format!("/proc/{pid}/root/tmp/{f}")).unwrap();
    assert_eq!(
        (owner("by-root").uid(), owner("by-root").gid()),
        (first, first)
    );
    assert_eq!(owner("by-user").uid(), first + 1000);
    // cwd still wins over the template's workdir.
    let r = run(&d, &a, json!({"argv": ["pwd"], "cwd": "/tmp"})).await;
    assert_eq!(r.out, "/tmp\n", "{r:?}");
    release(&d, &a.0).await;
    parked.await.unwrap();
    d.stop().await;
}

/// Unknown and hostile users are 400s with a typed error; the sandbox serves on.
#[tokio::test(flavor = "multi_thread")]
async fn bad_users_are_400s() {
    let d = Daemon::start(setup()).await;
    let a = d.claim().await;
    for (who, says) in [
        (json!("nosuchuser"), "unknown user"),
        (json!("4242"), "unknown user"),
        (json!(""), "user must be"),
        (json!("a\u{0}b"), "user must be"),
        (json!(5), ""),
    ] {
        let r = run(&d, &a, json!({"argv": ["true"], "user": who})).await;
        assert_eq!(r.status, 400, "{who}: {r:?}");
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert!(
            v["error"].as_str().unwrap().contains(says),
            "{who}: {}",
            r.body
        );
    }
    assert_eq!(ok(&d, &a, "echo alive").await, "alive\n");
    release(&d, &a.0).await;
    d.stop().await;
}

/// What one sandbox writes (home, /tmp) no other sandbox sees, nor a later claim.
#[tokio::test(flavor = "multi_thread")]
async fn writes_are_private_to_one_sandbox() {
    let d = Daemon::start(setup()).await;
    let a = d.claim().await;
    let b = d.claim().await;
    ok(&d, &a, "echo secret > ~/mine && echo secret > /tmp/mine").await;
    let none = "ls ~/mine /tmp/mine 2>/dev/null | wc -l";
    assert_eq!(ok(&d, &b, none).await, "0\n");
    release(&d, &a.0).await;
    let c = d.claim().await;
    assert_eq!(ok(&d, &c, none).await, "0\n");
    release(&d, &b.0).await;
    release(&d, &c.0).await;
    d.stop().await;
}

/// `disk_mib` bounds the writable directories together: filling /tmp, then the home, is
/// ENOSPC at the total (and /dev/shm is full too); the node and the sandbox go on, the
/// host's disk takes nothing, and nothing is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn writing_past_disk_mib_is_enospc_and_the_node_is_fine() {
    let d = Daemon::start(setup()).await;
    d.wait_pool(Duration::from_secs(30), "1 warm", |p| p["warm"] == 1)
        .await;
    let census = Census::new(&d.dir, uid_range(&d.dir));
    let before = census.count();
    let a = d.claim().await;
    let r = sh(
        &d,
        &a,
        "dd if=/dev/zero of=/tmp/fill bs=1M count=40 2>/dev/null; echo tmp=$?; \
         dd if=/dev/zero of=$HOME/fill bs=1M count=100 2>&1; echo rc=$?; \
         echo x > /dev/shm/x || echo shm=full; \
         echo home=$(($(wc -c < $HOME/fill) / 1048576)); \
         echo total=$((($(wc -c < $HOME/fill) + $(wc -c < /tmp/fill)) / 1048576)); \
         rm $HOME/fill /tmp/fill",
    )
    .await;
    assert!(r.out.contains("tmp=0"), "40 MiB fit in /tmp: {r:?}");
    assert!(r.out.contains("No space left on device"), "{r:?}");
    assert!(
        r.out.contains("rc=1") && r.out.contains("shm=full"),
        "{r:?}"
    );
    // 64 MiB in all (less the seeded dotfiles), so the home took about 24.
    assert!(r.out.contains("home=2"), "home filled to the rest: {r:?}");
    assert!(
        r.out.contains("total=6"),
        "filled to about 64 MiB in all: {r:?}"
    );
    assert_eq!(ok(&d, &a, "echo fine > ~/f && cat ~/f").await, "fine\n");
    let b = d.claim().await;
    assert_eq!(ok(&d, &b, "echo alive").await, "alive\n");
    release(&d, &a.0).await;
    release(&d, &b.0).await;
    census.wait_back_to(&before).await;
    d.stop().await;
}

/// A wheel made inside the sandbox (python's own zipfile) installs offline with
/// `pip install --user` into the writable home, and imports.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_wheel_installs_offline_with_pip_user() {
    let d = Daemon::start(setup()).await;
    let a = d.claim().await;
    let make = r#"
import zipfile, hashlib, base64
files = {
    "tinypkg/__init__.py": "X = 42\n",
    "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
    "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(text.encode())}")
record.append("tinypkg-0.1.dist-info/RECORD,,")
files["tinypkg-0.1.dist-info/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile("/tmp/tinypkg-0.1-py3-none-any.whl", "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
"#;
    let body = json!({"argv": ["python3", "-c", make]});
    let r = run(&d, &a, body).await;
    assert_eq!(r.exit, Some(0), "{r:?}");
    // Debian marks its Python externally managed (PEP 668); --user into the home is
    // what an agent does, with the override pip asks for.
    ok(
        &d,
        &a,
        "pip install --user --no-index --break-system-packages \
         /tmp/tinypkg-0.1-py3-none-any.whl 2>&1",
    )
    .await;
    assert_eq!(
        ok(
            &d,
            &a,
            "cd / && python3 -c 'import tinypkg; print(tinypkg.X, tinypkg.__file__)'"
        )
        .await,
        "42 /home/user/.local/lib/python3.11/site-packages/tinypkg/__init__.py\n"
    );
    release(&d, &a.0).await;
    d.stop().await;
}

/// A template without metadata (`base`, busybox): commands run as root with HOME=/root,
/// which is writable (a size-capped tmpfs), in the legacy work dir.
#[tokio::test(flavor = "multi_thread")]
async fn home_is_writable_without_template_metadata() {
    let d = Daemon::start(Setup::default()).await;
    let a = d.claim().await;
    let body = json!({"argv": ["sh", "-c", "echo hi > ~/f && cat ~/f; echo $HOME $USER; pwd"]});
    let r = run(&d, &a, body).await;
    assert_eq!(r.out, "hi\n/root root\n/home/sandbox\n", "{r:?}");
    release(&d, &a.0).await;
    d.stop().await;
}
