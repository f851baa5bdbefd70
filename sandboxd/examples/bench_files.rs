//! `cargo xtask bench files`: moving files in and out of a process-engine sandbox, next
//! to baselines measured in the same run on the same host. A 1 GiB file: uploaded and
//! downloaded over HTTP (`PUT`/`GET /files`) and with `sbx cp` (the SDK: uploads over
//! the relay, downloads over HTTP), against a local `cp` of the same file and a local
//! pipe (`cat | cat >`). A directory of 1,000 small files (modes, symlinks): `sbx cp` in
//! and out (the SDK's upload_dir/download_dir, tar streamed), against a local `cp -a`.
//! Prints seconds, MiB/s and each figure's ratio to the local `cp`.
//!
//! Local files go in `$BENCH_DIR`, else `/dev/shm`, else the temp dir (about 2 GiB).
//! Run as root, after `cargo xtask image` (the release binaries sit beside this example).

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::files_stream::{get_file, put_file, write_generated};
use testkit::{bins, trees, DaemonProcess, Listen, Setup, ROOT};

// A debug build is `cargo xtask bench --quick`'s smoke run: small counts.
const LEN: u64 = if cfg!(debug_assertions) {
    64 << 20
} else {
    1 << 30
};
const SMALL_FILES: usize = if cfg!(debug_assertions) { 100 } else { 1000 };

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_files: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs a local command line to success; its wall time.
fn local(argv: &[&str]) -> Result<Duration, String> {
    let t = Instant::now();
    let status = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .status()
        .map_err(|e| format!("{argv:?}: {e}"))?;
    if !status.success() {
        return Err(format!("{argv:?}: {status}"));
    }
    Ok(t.elapsed())
}

async fn sbx(url: &str, args: &[&str]) -> Result<Duration, String> {
    let t = Instant::now();
    let out = tokio::process::Command::new(bins::debug_dir().join("sbx"))
        .env("SANDBOXD_URL", url)
        .env("SANDBOXD_TOKEN", ROOT)
        .args(args)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "sbx {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(t.elapsed())
}

fn row(what: &str, took: Duration, bytes: u64, baseline: Duration) {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    println!(
        "bench files: {what:<38} {:>8.3} s {:>9.1} MiB/s   {:>5.2}x local cp",
        took.as_secs_f64(),
        mib / took.as_secs_f64(),
        took.as_secs_f64() / baseline.as_secs_f64()
    );
}

fn same_file(a: &Path, b: &Path) -> Result<(), String> {
    let (ha, hb) = (
        testkit::vm_disk::sha256_file(a),
        testkit::vm_disk::sha256_file(b),
    );
    (ha == hb)
        .then_some(())
        .ok_or(format!("{} and {} differ", a.display(), b.display()))
}

async fn bench() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: the process engine's sandboxes need their identities".into());
    }
    // Local files in RAM (/dev/shm) when there is one: the sandbox's own files live in
    // tmpfs, so a disk on this side would measure the disk, not the transfer.
    let base = std::env::var_os("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| Some(Path::new("/dev/shm").to_path_buf()).filter(|p| p.is_dir()))
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).map_err(|e| e.to_string())?;
    let d = dir.path();
    let setup = Setup {
        warm: 0,
        disk_mib: 1200,
        default_ttl_seconds: 600,
        max_ttl_seconds: 600,
        ..Setup::default()
    };
    // The file lives in the sandbox's tmpfs, which its memory cgroup is charged for.
    let text = setup
        .toml(&d.join("data"), &Listen::Tcp.address(d))
        .replace("memory_mib = 256", "memory_mib = 1500");
    let daemon = DaemonProcess::start(bins::sandboxd(), d, &text).await;
    let (id, token) = daemon.claim().await;
    let addr = daemon.addr();
    let url = daemon.url();

    let src = d.join("big");
    write_generated(&src, LEN);
    println!(
        "bench files: 1 GiB file in {} (page cache warm)",
        d.display()
    );
    let cp = local(&[
        "cp",
        src.to_str().unwrap(),
        d.join("big.cp").to_str().unwrap(),
    ])?;
    let pipe_cmd = format!(
        "cat {} | cat > {}",
        src.display(),
        d.join("big.pipe").display()
    );
    let pipe = local(&["sh", "-c", &pipe_cmd])?;
    for f in ["big.cp", "big.pipe"] {
        std::fs::remove_file(d.join(f)).map_err(|e| e.to_string())?;
    }
    row("local cp", cp, LEN, cp);
    row("local pipe (cat | cat >)", pipe, LEN, cp);

    let files = format!("/v1/sandboxes/{id}/files?path=/tmp/big");
    let t = Instant::now();
    let (status, body) = put_file(addr, &files, &token, &src).await;
    let put = t.elapsed();
    if status != 200 {
        return Err(format!("PUT: {status} {}", String::from_utf8_lossy(&body)));
    }
    let back = d.join("big.back");
    let t = Instant::now();
    let (status, n) = get_file(addr, &files, &token, &back).await;
    let get = t.elapsed();
    if (status.as_u16(), n) != (200, LEN) {
        return Err(format!("GET: {status}, {n} bytes"));
    }
    same_file(&src, &back)?;
    std::fs::remove_file(&back).map_err(|e| e.to_string())?;
    row("HTTP PUT /files (upload)", put, LEN, cp);
    row("HTTP GET /files (download)", get, LEN, cp);
    let del = daemon
        .call(
            "DELETE",
            &format!("/v1/sandboxes/{id}/fs?path=/tmp/big"),
            Some(&token),
            None,
        )
        .await;
    if del.status != 204 {
        return Err(format!("DELETE: {}", del.text()));
    }

    let remote = format!("{id}:/tmp/big");
    let up = sbx(&url, &["cp", src.to_str().unwrap(), &remote]).await?;
    let down = sbx(&url, &["cp", &remote, back.to_str().unwrap()]).await?;
    same_file(&src, &back)?;
    row("sbx cp (upload, relay)", up, LEN, cp);
    row("sbx cp (download, HTTP)", down, LEN, cp);
    std::fs::remove_file(&back).map_err(|e| e.to_string())?;

    let tree = d.join("tree");
    std::fs::create_dir(&tree).map_err(|e| e.to_string())?;
    trees::build(&tree, SMALL_FILES);
    let tree_bytes: u64 = (0..SMALL_FILES).map(|i| (i * 37 % 2048) as u64).sum();
    let cp_tree = local(&[
        "cp",
        "-a",
        tree.to_str().unwrap(),
        d.join("tree.cp").to_str().unwrap(),
    ])?;
    let remote = format!("{id}:/tmp/tree");
    let up = sbx(&url, &["cp", tree.to_str().unwrap(), &remote]).await?;
    let tree_back = d.join("tree.back");
    let down = sbx(&url, &["cp", &remote, tree_back.to_str().unwrap()]).await?;
    trees::assert_same(&tree, &tree_back);
    let per_file = |t: Duration| t.as_secs_f64() * 1e6 / SMALL_FILES as f64;
    println!(
        "bench files: {SMALL_FILES} small files ({tree_bytes} B): local cp -a {:.3} s, sbx cp in {:.3} s ({:.0} µs/file, {:.1}x), out {:.3} s ({:.0} µs/file, {:.1}x)",
        cp_tree.as_secs_f64(),
        up.as_secs_f64(),
        per_file(up),
        up.as_secs_f64() / cp_tree.as_secs_f64(),
        down.as_secs_f64(),
        per_file(down),
        down.as_secs_f64() / cp_tree.as_secs_f64(),
    );
    Ok(())
}
