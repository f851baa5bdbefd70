//! Throwaway TLS material for a test, made with the `openssl` CLI in a temp dir: a CA,
//! a server certificate for 127.0.0.1, a client certificate, and a node certificate for
//! 127.0.0.1 good for both (a cluster node's `peer_cert`), all signed by it. Gone when
//! the value is dropped. Needs Debian's `openssl` (`cargo xtask deps`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A CA and the certificates it signed, as PEM files.
pub struct Certs {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("`openssl` is missing ({e}): install Debian's openssl (`cargo xtask deps`)")
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// P-256 keys: fast to make, and every TLS stack here (Go's, rustls) takes them.
const KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Certs {
    /// A new CA (its subject names `name`) with a server certificate (SAN 127.0.0.1),
    /// a client certificate and a node certificate (both usages, SAN 127.0.0.1).
    pub fn new(name: &str) -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let subject = format!("/CN={name}-ca");
        let ca = [
            &KEY[..],
            &["-x509", "-nodes", "-days", "2", "-subj", &subject],
        ]
        .concat();
        openssl(
            d,
            &[&["req"], &ca[..], &["-keyout", "ca.key", "-out", "ca.pem"]].concat(),
        );
        let made = [
            ("server", "serverAuth"),
            ("client", "clientAuth"),
            ("node", "serverAuth,clientAuth"),
        ];
        for (who, usage) in made {
            let ext = format!(
                "basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\nsubjectAltName=IP:127.0.0.1\n"
            );
            std::fs::write(d.join(format!("{who}.ext")), ext).unwrap();
            let (key, csr, pem) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.pem"),
            );
            let subj = format!("/CN={name}-{who}");
            let req = [&KEY[..], &["-nodes", "-subj", &subj, "-keyout", &key]].concat();
            openssl(d, &[&["req"], &req[..], &["-out", &csr]].concat());
            let ext = format!("{who}.ext");
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                    "-out",
                    &pem,
                ],
            );
        }
        Certs { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.file("ca.pem")
    }

    /// The server certificate and its key.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.file("server.pem"), self.file("server.key"))
    }

    /// The client certificate and its key.
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (self.file("client.pem"), self.file("client.key"))
    }

    /// The node certificate (server and client authentication, SAN 127.0.0.1) and its
    /// key: what a cluster node serves and presents on its peer connections.
    pub fn node(&self) -> (PathBuf, PathBuf) {
        (self.file("node.pem"), self.file("node.key"))
    }
}
