//! `sandbox.files()` against a real sandboxd (process engine, real silkd): exact round
//! trips of random binary files from bytes and from readers, directories of 1,000 files
//! with modes and symlinks through upload_dir/download_dir, a watch seeing an exec's
//! changes, and the typed errors (missing paths, a full disk, a local directory that is
//! not there, a local source failing halfway, which leaves nothing in the sandbox).

use std::time::Duration;

use futures::StreamExt;
use sandbox_sdk::{ClaimOptions, Command, Error, FileKind, FsEventKind};
use testkit::silkd_files::random_bytes;
use testkit::{bounded, trees, wait_until, Setup};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn files_round_trip_exactly() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let files = sandbox.files();
        let local = tempfile::tempdir().unwrap();
        for (i, len) in [0usize, 1, 8 * 1024 * 1024 + 1].into_iter().enumerate() {
            let data = random_bytes(len, 40 + i as u64);
            // From bytes, back to bytes.
            let path = format!("/tmp/sdk/b{len}");
            let entry = files.write(&path, data.clone()).await.unwrap();
            assert_eq!((entry.kind, entry.size), (FileKind::File, len as u64));
            assert!(files.read(&path).await.unwrap() == data, "{len} B differ");
            // From a local file as a reader, back into a local file.
            let src = local.path().join(format!("src{len}"));
            std::fs::write(&src, &data).unwrap();
            let reader = tokio::fs::File::open(&src).await.unwrap();
            let path = format!("/home/user/r{len}");
            let entry = files.write_from(&path, reader, Some(0o750)).await.unwrap();
            assert_eq!((entry.size, entry.mode), (len as u64, 0o750));
            let dst = local.path().join(format!("dst{len}"));
            let mut out = tokio::fs::File::create(&dst).await.unwrap();
            assert_eq!(files.read_to(&path, &mut out).await.unwrap(), len as u64);
            assert!(
                std::fs::read(&dst).unwrap() == data,
                "{len} B differ via files"
            );
            assert_eq!(files.stat(&path).await.unwrap().size, len as u64);
        }
        // Listing, stat of a directory, mkdir, rename, remove.
        let names: Vec<String> = files
            .list("/tmp/sdk")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["b0", "b1", "b8388609"]);
        assert_eq!(files.stat("/tmp/sdk").await.unwrap().kind, FileKind::Dir);
        files.mkdir("/tmp/m/n/o").await.unwrap();
        files.mkdir("/tmp/m/n/o").await.unwrap();
        files.rename("/tmp/m/n", "/tmp/m/p").await.unwrap();
        assert_eq!(files.list_depth("/tmp/m", 3).await.unwrap().len(), 2);
        let e = files.remove("/tmp/m", false).await;
        assert!(matches!(e, Err(Error::BadRequest(_))), "{e:?}");
        files.remove("/tmp/m", true).await.unwrap();

        // Missing paths: NotFound from every verb.
        let nowhere = local.path().join("nowhere");
        assert!(matches!(
            files.read("/tmp/nope").await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            files.stat("/tmp/nope").await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            files.list("/tmp/nope").await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            files.remove("/tmp/nope", true).await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            files.rename("/tmp/nope", "/tmp/x").await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            files.watch("/tmp/nope", false).await,
            Err(Error::NotFound { .. })
        ));
        let e = files.download_dir("/tmp/nope", &nowhere).await;
        assert!(matches!(e, Err(Error::NotFound { .. })), "{e:?}");
        assert!(!nowhere.exists());
        // A local directory that is not there: a local error, nothing in the sandbox.
        let e = files.upload_dir(&nowhere, "/tmp/up").await;
        assert!(matches!(e, Err(Error::Local(_))), "{e:?}");
        assert!(matches!(
            files.stat("/tmp/up").await,
            Err(Error::NotFound { .. })
        ));

        // A source that fails halfway: a local error, and nothing at the target (the
        // guest removes its temp file once the stream goes, without a data_end).
        let failing = tokio_util::io::StreamReader::new(futures::stream::iter([
            Ok(bytes::Bytes::from(vec![1u8; 3 << 20])),
            Err(std::io::Error::other("the local disk went away")),
        ]));
        let e = files.write_from("/tmp/cut", failing, None).await;
        assert!(matches!(e, Err(Error::Local(_))), "{e:?}");
        wait_until(
            Duration::from_secs(20),
            "no trace of the cut upload",
            async || {
                let out = sandbox.exec(&Command::new("ls").args(["-a", "/tmp"])).await;
                let out = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
                (!out.contains("cut") && !out.contains(".silkd-"))
                    .then_some(())
                    .ok_or(out)
            },
        )
        .await;

        // Past the disk (64 MiB), streamed from a reader: NoSpace and nothing left.
        let endless = tokio::io::repeat(7).take(80 << 20);
        let e = files.write_from("/tmp/huge", endless, None).await;
        assert!(matches!(e, Err(Error::NoSpace(_))), "{e:?}");
        let out = sandbox
            .exec(&Command::new("ls").args(["-a", "/tmp"]))
            .await
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!out.contains("huge") && !out.contains(".silkd-"), "{out}");
        // The other files are intact.
        assert_eq!(files.read("/tmp/sdk/b1").await.unwrap().len(), 1);
        sandbox.release().await.unwrap();
    })
    .await;
    drop(d);
}

#[tokio::test]
async fn directories_of_a_thousand_files_travel_exactly() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let files = sandbox.files();
        let local = tempfile::tempdir().unwrap();
        let src = local.path().join("src");
        std::fs::create_dir(&src).unwrap();
        trees::build(&src, 1000);
        files.upload_dir(&src, "/home/user/tree").await.unwrap();
        // What the sandbox sees: the same count, the absolute link kept as it was.
        let out = sandbox
            .exec(&Command::new("sh").args([
                "-c",
                "find /home/user/tree -type f | wc -l; readlink /home/user/tree/venv/bin/python",
            ]))
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "1000\n/usr/bin/python3\n"
        );
        let back = local.path().join("back/tree");
        files.download_dir("/home/user/tree", &back).await.unwrap();
        trees::assert_same(&src, &back);
        // Into an existing directory: merged.
        files
            .download_dir("/home/user/tree/d1", &back)
            .await
            .unwrap();
        assert!(back.join("e0/f1").exists() && back.join("d1/e0/f1").exists());
        sandbox.release().await.unwrap();
    })
    .await;
    drop(d);
}

#[tokio::test]
async fn a_watch_sees_an_execs_create_write_and_delete() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();
        let files = sandbox.files();
        files.mkdir("/tmp/w").await.unwrap();
        let mut watch = files.watch("/tmp/w", false).await.unwrap();
        let script = "echo one > /tmp/w/f && echo two >> /tmp/w/f && rm /tmp/w/f";
        let out = sandbox
            .exec(&Command::new("sh").args(["-c", script]))
            .await
            .unwrap();
        assert!(out.exit.success(), "{out:?}");
        let mut seen = Vec::new();
        while !seen.contains(&FsEventKind::Delete) {
            let event = tokio::time::timeout(Duration::from_secs(20), watch.next())
                .await
                .expect("no event within 20 s")
                .expect("the watch ended early")
                .unwrap();
            assert_eq!(event.path, "/tmp/w/f");
            if seen.last() != Some(&event.kind) {
                seen.push(event.kind);
            }
        }
        assert_eq!(
            seen,
            [
                FsEventKind::Create,
                FsEventKind::Modify,
                FsEventKind::Delete
            ]
        );
        // The directory removed: the watch ends.
        files.remove("/tmp/w", true).await.unwrap();
        let rest = tokio::time::timeout(Duration::from_secs(20), async {
            let mut n = 0;
            while let Some(e) = watch.next().await {
                e.unwrap();
                n += 1;
            }
            n
        })
        .await
        .expect("the watch did not end when its directory went");
        assert!(rest <= 2, "{rest} events after the delete");
        sandbox.release().await.unwrap();
    })
    .await;
    drop(d);
}
