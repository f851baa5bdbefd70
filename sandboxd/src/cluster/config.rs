//! `[cluster]`: the etcd endpoints, this node's name and advertised URL, the peer secret
//! the lease TTL, how to reach etcd (credentials, TLS) and the optional mTLS listener for
//! the other nodes (`peer_*`), with their one validation. No `[cluster]` means a single
//! node.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `[cluster]`: this node is one of several that act as one service through etcd.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client endpoints (`http://host:port`, or all `https://host:port` with
    /// `etcd_ca`), any subset of the etcd cluster.
    pub etcd: Vec<String>,
    /// This node's name, unique in the cluster; its membership key and ownership
    /// records carry it, so a restarted node with the same name takes its sandboxes back.
    pub node_name: String,
    /// How the other nodes reach this one: `http://host:port`, the bound TCP address
    /// when absent (then `listen` must not be a wildcard or a Unix socket); with peer
    /// TLS `https://host:port` (`peer_listen`'s), the bound `peer_listen` address when
    /// absent (then not a wildcard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
    /// Shared secret nodes present to each other (`x-sandboxd-peer`), marking a request
    /// as already routed so that it is served where it lands.
    pub peer_token: String,
    /// TTL of this node's etcd lease: a node silent this long is gone, and its
    /// sandboxes are reported lost.
    #[serde(default = "lease_ttl")]
    pub lease_ttl_seconds: u64,
    /// Prefix of every key this cluster keeps in etcd (several clusters may share one).
    #[serde(default = "prefix")]
    pub prefix: String,
    /// etcd user, when etcd has authentication on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_user: Option<String>,
    /// Its password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_password: Option<String>,
    /// PEM CA certificate(s) that etcd's serving certificate must chain to; required by
    /// (and only with) `https://` endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate this node presents to etcd (`--client-cert-auth`), with
    /// `etcd_key`; both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_cert: Option<PathBuf>,
    /// PEM private key of `etcd_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_key: Option<PathBuf>,
    /// `HOST:PORT` of the mTLS listener the other nodes forward to (peer TLS); with
    /// `peer_ca`, `peer_cert` and `peer_key`, all four or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_listen: Option<String>,
    /// PEM CA certificate(s) every node's certificate chains to: the peer listener takes
    /// only clients it signed, and forwards trust only servers it signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ca: Option<PathBuf>,
    /// PEM certificate this node serves and presents on the peer connections (server and
    /// client authentication both; a SAN for the host of its `advertise_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_cert: Option<PathBuf>,
    /// PEM private key of `peer_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_key: Option<PathBuf>,
}

fn lease_ttl() -> u64 {
    10
}

fn prefix() -> String {
    "/sandboxd".into()
}

/// `http://host:port` with a non-empty host and a port, nothing after it.
fn plain_http_url(url: &str) -> bool {
    url.strip_prefix("http://").is_some_and(host_port)
}

/// `https://host:port`, likewise.
fn https_url(url: &str) -> bool {
    url.strip_prefix("https://").is_some_and(host_port)
}

fn host_port(rest: &str) -> bool {
    let rest = rest.trim_end_matches('/');
    match rest.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !rest.contains('/') && port.parse::<u16>().is_ok()
        }
        None => false,
    }
}

/// The four keys of peer TLS, in the order messages name them.
const PEER_KEYS: [&str; 4] = ["peer_listen", "peer_ca", "peer_cert", "peer_key"];

impl ClusterConfig {
    /// Whether node-to-node calls go over mTLS (`peer_listen` and the rest are set).
    pub fn peer_tls(&self) -> bool {
        self.peer_listen.is_some()
    }

    /// `peer_listen` as the address to bind (`None` without peer TLS).
    pub fn peer_listen_addr(&self) -> Result<Option<SocketAddr>> {
        let Some(listen) = &self.peer_listen else {
            return Ok(None);
        };
        listen.parse().map(Some).map_err(|e| {
            Error::Config(format!(
                "[cluster] peer_listen {listen:?} is not HOST:PORT (an IP address and a port): {e}"
            ))
        })
    }

    /// Checks every field; `unix_listen` says whether `listen` is a Unix socket.
    pub fn validate(&self, unix_listen: bool) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(format!("[cluster] {msg}")));
        if self.etcd.is_empty() {
            return bad("etcd must name at least one endpoint".into());
        }
        // One scheme for all: TLS settings are per client, and a mix would be a typo.
        let tls = self.etcd_ca.is_some();
        let (scheme_ok, form): (fn(&str) -> bool, _) = if tls {
            (https_url, "https://host:port (etcd_ca is set)")
        } else {
            (plain_http_url, "http://host:port (https:// needs etcd_ca)")
        };
        if let Some(e) = self.etcd.iter().find(|e| !scheme_ok(e)) {
            return bad(format!("etcd endpoint {e:?} is not {form}"));
        }
        if self.etcd_cert.is_some() != self.etcd_key.is_some() {
            return bad("etcd_cert and etcd_key go together".into());
        }
        if self.etcd_cert.is_some() && !tls {
            return bad("etcd_cert needs etcd_ca and https:// endpoints".into());
        }
        let peer_set = [
            self.peer_listen.is_some(),
            self.peer_ca.is_some(),
            self.peer_cert.is_some(),
            self.peer_key.is_some(),
        ];
        if peer_set.contains(&true) && peer_set.contains(&false) {
            let missing: Vec<&str> = PEER_KEYS
                .iter()
                .zip(peer_set)
                .filter(|(_, set)| !set)
                .map(|(k, _)| *k)
                .collect();
            return bad(format!(
                "peer_listen, peer_ca, peer_cert and peer_key go together (missing: {})",
                missing.join(", ")
            ));
        }
        let peer_addr = self.peer_listen_addr()?;
        let files = [
            ("etcd_ca", &self.etcd_ca),
            ("etcd_cert", &self.etcd_cert),
            ("etcd_key", &self.etcd_key),
            ("peer_ca", &self.peer_ca),
            ("peer_cert", &self.peer_cert),
            ("peer_key", &self.peer_key),
        ];
        for (key, path) in files {
            if let Some(p) = path.as_deref().filter(|p| !p.is_file()) {
                return bad(format!("{key} {} is not a readable file", p.display()));
            }
        }
        let name_ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
        if self.node_name.is_empty()
            || self.node_name.len() > 63
            || !self.node_name.chars().all(name_ok)
        {
            return bad("node_name must be 1-63 characters of [A-Za-z0-9._-]".into());
        }
        match (&self.advertise_url, peer_addr) {
            (Some(u), Some(_)) if !https_url(u) => {
                return bad(format!(
                    "advertise_url {u:?} is not https://host:port (peer TLS is on: the other \
                     nodes reach this one on peer_listen)"
                ))
            }
            (Some(u), None) if !plain_http_url(u) => {
                let why = if https_url(u) {
                    " (https:// needs peer_listen, peer_ca, peer_cert and peer_key)"
                } else {
                    ""
                };
                return bad(format!("advertise_url {u:?} is not http://host:port{why}"));
            }
            (None, Some(a)) if a.ip().is_unspecified() => {
                return bad("advertise_url is required when peer_listen is a wildcard".into())
            }
            (None, None) if unix_listen => {
                return bad("advertise_url is required when listen is a Unix socket".into())
            }
            _ => {}
        }
        if self.peer_token.len() < 16 {
            return bad("peer_token must be at least 16 characters".into());
        }
        if !(2..=300).contains(&self.lease_ttl_seconds) {
            return bad("lease_ttl_seconds must be 2..=300".into());
        }
        if !self.prefix.starts_with('/') || self.prefix.len() < 2 || self.prefix.ends_with('/') {
            return bad("prefix must start with '/' and not end with one".into());
        }
        if self.etcd_user.is_some() != self.etcd_password.is_some() {
            return bad("etcd_user and etcd_password go together".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> ClusterConfig {
        ClusterConfig {
            etcd: vec!["http://127.0.0.1:2379".into()],
            node_name: "n1".into(),
            advertise_url: None,
            peer_token: "peer-token-0123456789".into(),
            lease_ttl_seconds: 10,
            prefix: prefix(),
            etcd_user: None,
            etcd_password: None,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            peer_listen: None,
            peer_ca: None,
            peer_cert: None,
            peer_key: None,
        }
    }

    /// [`good`] with peer TLS (every PEM path a readable file).
    fn peer() -> ClusterConfig {
        ClusterConfig {
            peer_listen: Some("10.0.0.21:8443".into()),
            peer_ca: Some("/etc/passwd".into()),
            peer_cert: Some("/etc/passwd".into()),
            peer_key: Some("/etc/passwd".into()),
            ..good()
        }
    }

    #[test]
    fn validation() {
        assert!(good().validate(false).is_ok());
        assert!(
            good().validate(true).is_err(),
            "unix listen needs advertise_url"
        );
        let cases: [fn(&mut ClusterConfig); 14] = [
            |c| c.etcd.clear(),
            |c| c.etcd = vec!["https://x:1".into()],
            |c| c.node_name = "a/b".into(),
            |c| c.node_name = String::new(),
            |c| c.advertise_url = Some("http://host".into()),
            |c| c.peer_token = "short".into(),
            |c| c.lease_ttl_seconds = 1,
            |c| c.prefix = "x/".into(),
            |c| c.etcd_user = Some("u".into()),
            |c| c.etcd_ca = Some("/etc/passwd".into()),
            |c| {
                c.etcd = vec!["https://x:1".into()];
                c.etcd_ca = Some("/nonexistent/ca.pem".into());
            },
            |c| {
                c.etcd = vec!["https://x:1".into()];
                c.etcd_ca = Some("/etc/passwd".into());
                c.etcd_cert = Some("/etc/passwd".into());
            },
            |c| c.etcd_cert = Some("/etc/passwd".into()),
            |c| {
                c.etcd = vec!["https://x:1".into(), "http://y:1".into()];
                c.etcd_ca = Some("/etc/passwd".into());
            },
        ];
        for (i, break_it) in cases.iter().enumerate() {
            let mut c = good();
            break_it(&mut c);
            assert!(c.validate(false).is_err(), "case {i} passed: {c:?}");
        }
        assert!(plain_http_url("http://10.0.0.1:8080"));
        assert!(plain_http_url("http://[::1]:8080"));
        assert!(!plain_http_url("http://h:8080/path"));
        let mut tls = good();
        tls.etcd = vec!["https://127.0.0.1:2379".into()];
        tls.etcd_ca = Some("/etc/passwd".into());
        tls.etcd_cert = Some("/etc/passwd".into());
        tls.etcd_key = Some("/etc/passwd".into());
        assert!(tls.validate(false).is_ok());
        let err = tls.etcd_ca.replace("/nonexistent/ca.pem".into());
        assert!(err.is_some());
        let msg = tls.validate(false).unwrap_err().to_string();
        assert!(msg.contains("/nonexistent/ca.pem"), "{msg}");

        // Peer TLS: all four keys or none; an https:// advertise_url with it only.
        assert!(peer().validate(false).is_ok());
        assert!(peer().validate(true).is_ok(), "advertised on peer_listen");
        let with_url = ClusterConfig {
            advertise_url: Some("https://node-a.internal:8443".into()),
            ..peer()
        };
        assert!(with_url.validate(false).is_ok());
        assert!(peer().peer_tls() && !good().peer_tls());
        let peer_cases: [fn(&mut ClusterConfig); 9] = [
            |c| c.peer_cert = None,
            |c| c.peer_listen = None,
            |c| c.peer_listen = Some("localhost:8443".into()),
            |c| c.peer_listen = Some("10.0.0.21".into()),
            |c| c.peer_listen = Some("0.0.0.0:8443".into()),
            |c| c.peer_key = Some("/nonexistent/peer.key".into()),
            |c| c.peer_ca = Some("/etc".into()),
            |c| c.advertise_url = Some("http://10.0.0.21:8080".into()),
            |c| c.advertise_url = Some("https://10.0.0.21".into()),
        ];
        for (i, break_it) in peer_cases.iter().enumerate() {
            let mut c = peer();
            break_it(&mut c);
            assert!(c.validate(false).is_err(), "peer case {i} passed: {c:?}");
        }
        let msg = |c: ClusterConfig| c.validate(false).unwrap_err().to_string();
        let half = ClusterConfig {
            peer_ca: Some("/etc/passwd".into()),
            ..good()
        };
        assert_eq!(
            msg(half),
            "config: [cluster] peer_listen, peer_ca, peer_cert and peer_key go together \
             (missing: peer_listen, peer_cert, peer_key)"
        );
        let https_alone = ClusterConfig {
            advertise_url: Some("https://10.0.0.21:8443".into()),
            ..good()
        };
        assert_eq!(
            msg(https_alone),
            "config: [cluster] advertise_url \"https://10.0.0.21:8443\" is not http://host:port \
             (https:// needs peer_listen, peer_ca, peer_cert and peer_key)"
        );
        let wildcard = ClusterConfig {
            peer_listen: Some("[::]:8443".into()),
            ..peer()
        };
        assert_eq!(
            msg(wildcard),
            "config: [cluster] advertise_url is required when peer_listen is a wildcard"
        );
        let missing_key = ClusterConfig {
            peer_key: Some("/nonexistent/peer.key".into()),
            ..peer()
        };
        assert_eq!(
            msg(missing_key),
            "config: [cluster] peer_key /nonexistent/peer.key is not a readable file"
        );
    }
}
