//! Two sandboxd nodes forwarding to each other over mTLS (`[cluster] peer_listen`,
//! `peer_ca`, `peer_cert`, `peer_key`), one plain-HTTP etcd member, certificates made by
//! `openssl` for this run. `a` has no warm guests, so its claim is placed on `b` over the
//! peer listener (advertised as `https://` and the bound address); exec, the relay,
//! files and release through `a` are served by `b`. Hostile: plain HTTP to `b`'s peer
//! listener, a TLS client without a certificate and one with another CA's certificate
//! get no HTTP answer; the peer token on `a`'s plain listener is no longer trusted (the
//! claim is still placed, the exec still forwarded); a node without peer TLS refuses to
//! forward to an `https://` member; half a set of `peer_*` keys, an `https://`
//! `advertise_url` without them, and a key file that holds no key are refused at start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use testkit::certs::Certs;
use testkit::cluster::{
    member, refused, retrying_busy, served_by, start_node_with, wait_view, PEER_TOKEN,
};
use testkit::etcd::Etcd;
use testkit::files_http::call_bytes;
use testkit::restart::relay_info;
use testkit::{Api, Setup, ROOT};

/// The `[cluster]` lines of peer TLS with `certs`' CA and node certificate, the peer
/// listener on a loopback port of the kernel's choosing.
fn peer_keys(certs: &Certs) -> String {
    let (cert, key) = certs.node();
    format!(
        "peer_listen = \"127.0.0.1:0\"\npeer_ca = {:?}\npeer_cert = {cert:?}\npeer_key = {key:?}\n",
        certs.ca()
    )
}

/// The one line a refused sandboxd prints as it exits.
fn reason(log: &str) -> &str {
    log.lines()
        .find(|l| l.starts_with("sandboxd: "))
        .unwrap_or_else(|| panic!("no `sandboxd: ` reason in:\n{log}"))
}

/// Whether `view` shows `b` with a warm guest, and `a`.
fn b_warm(view: &Value) -> bool {
    member(view, "b").is_some_and(|m| m["pools"][0]["warm"] == 1) && member(view, "a").is_some()
}

/// A claim at `api` as root with `headers`, a 503 with `Retry-After` waited out and
/// retried as the SDK does (etcd slow on a loaded host).
async fn claim(api: &Api, headers: &[(&str, &str)]) -> testkit::http::Resp {
    let mut headers = headers.to_vec();
    headers.push(("content-type", "application/json"));
    retrying_busy("claim", async || {
        call_bytes(
            api.addr(),
            "POST",
            "/v1/claim",
            ROOT,
            &headers,
            b"{}".to_vec(),
        )
        .await
    })
    .await
}

fn id_token(r: &testkit::http::Resp) -> (String, String) {
    assert_eq!(r.status, 200, "claim: {}", r.text());
    let v = r.json();
    (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
    )
}

/// A TLS client trusting `ca`, presenting `identity` (a certificate and its key) or none.
fn client(ca: &Path, identity: Option<(PathBuf, PathBuf)>) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    TlsConnector::from(Arc::new(config))
}

/// `GET /v1/info` as root over `io`: `Ok(status line)` when an HTTP answer came back,
/// else `Err(what came instead)`.
async fn ask_info(mut io: impl AsyncRead + AsyncWrite + Unpin) -> Result<String, String> {
    let head = format!(
        "GET /v1/info HTTP/1.1\r\nhost: peer\r\nauthorization: Bearer {ROOT}\r\n\
         connection: close\r\n\r\n"
    );
    if let Err(e) = io.write_all(head.as_bytes()).await {
        return Err(format!("write: {e}"));
    }
    let mut got = Vec::new();
    // A read error keeps what was read before it.
    let end = io.read_to_end(&mut got).await;
    if got.starts_with(b"HTTP/") {
        let text = String::from_utf8_lossy(&got);
        return Ok(text.lines().next().unwrap_or_default().to_string());
    }
    Err(format!(
        "no HTTP answer: {} bytes ({:02x?}), then {end:?}",
        got.len(),
        &got[..got.len().min(16)]
    ))
}

/// [`ask_info`] over TLS to `addr` with `tls`: `Err` also when the handshake fails.
/// Bounded: a listener that neither answers nor closes fails the test.
async fn info_over_tls(addr: SocketAddr, tls: &TlsConnector) -> Result<String, String> {
    let asked = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        match tls.connect(name, tcp).await {
            Ok(session) => ask_info(session).await,
            Err(e) => Err(format!("handshake: {e}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), asked)
        .await
        .expect("the peer listener neither answered nor closed within 20 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_forward_to_each_other_over_mtls() {
    let certs = Certs::new("peers");
    let etcd = Etcd::start(1).await;
    let setup = Setup::default();
    let keys = peer_keys(&certs);
    // `a` keeps no warm guests: its claims are placed on `b`.
    let cold = Setup {
        warm: 0,
        ..setup.clone()
    };
    let a = start_node_with(&etcd, "a", &cold, &keys).await;
    let b = start_node_with(&etcd, "b", &setup, &keys).await;
    let v = wait_view(&a, "b warm, seen by a", b_warm).await;
    // Advertised: `https://` and the peer listener's bound address.
    let b_url = member(&v, "b").unwrap()["url"]
        .as_str()
        .unwrap()
        .to_string();
    let b_peer: SocketAddr = b_url
        .strip_prefix("https://127.0.0.1:")
        .map(|port| format!("127.0.0.1:{port}"))
        .unwrap_or_else(|| panic!("b advertises {b_url}"))
        .parse()
        .unwrap();
    assert_ne!(b_peer, b.addr(), "the peer listener is not the main one");

    // Placed on b over mTLS; everything else through a is served by b.
    let r = claim(&a, &[]).await;
    let (id, token) = id_token(&r);
    assert_eq!(served_by(&r), "b");
    let r = a
        .exec(&id, &token, json!({"argv": ["echo", "over mtls"]}))
        .await;
    assert_eq!(r.status, 200, "exec through a: {}", r.text());
    assert_eq!(r.json()["stdout"], "over mtls\n");
    assert_eq!(served_by(&r), "b");
    assert!(
        relay_info(a.addr(), &id, &token).await,
        "the relay through a (an upgrade over the TLS session)"
    );
    let path = format!("/v1/sandboxes/{id}/files?path=/tmp/f");
    let put = call_bytes(a.addr(), "PUT", &path, &token, &[], b"via a".to_vec()).await;
    assert_eq!(put.status, 200, "{}", put.text());
    let got = call_bytes(b.addr(), "GET", &path, &token, &[], vec![]).await;
    assert_eq!((got.status.as_u16(), &got.body[..]), (200, &b"via a"[..]));

    // The peer listener answers a client with a node certificate: the hostile probes
    // below fail for what they lack, not for a broken probe.
    let good = client(&certs.ca(), Some(certs.node()));
    let answer = info_over_tls(b_peer, &good).await;
    assert_eq!(answer.as_deref(), Ok("HTTP/1.1 200 OK"), "{answer:?}");

    // Hostile (i): plain HTTP to the peer listener gets no HTTP answer.
    let plain = tokio::time::timeout(Duration::from_secs(20), async {
        ask_info(TcpStream::connect(b_peer).await.unwrap()).await
    })
    .await
    .expect("the peer listener neither answered plain HTTP nor closed");
    println!("plain HTTP to the peer listener: {plain:?}");
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");
    // (ii) TLS without a client certificate: refused (under TLS 1.3 the client's
    // handshake may end first; the server's alert then comes instead of an answer).
    let anonymous = info_over_tls(b_peer, &client(&certs.ca(), None)).await;
    println!("no client certificate: {anonymous:?}");
    assert!(
        anonymous.is_err(),
        "served without a certificate: {anonymous:?}"
    );
    // (iii) A client certificate another CA signed: refused.
    let rogue = Certs::new("rogue");
    let foreign = info_over_tls(b_peer, &client(&certs.ca(), Some(rogue.node()))).await;
    println!("another CA's certificate: {foreign:?}");
    assert!(foreign.is_err(), "served another CA's client: {foreign:?}");

    // (iv) On a's plain listener the peer token alone is no longer trusted: a claim
    // carrying it is still placed (on b, a having no warm guest), and an exec for b's
    // sandbox still forwarded (with the token trusted, a would serve it: 401).
    wait_view(&a, "b warm again", b_warm).await;
    let forged = claim(&a, &[("x-sandboxd-peer", PEER_TOKEN)]).await;
    let (id2, token2) = id_token(&forged);
    assert_eq!(
        served_by(&forged),
        "b",
        "a claim with the peer token placed"
    );
    let exec = call_bytes(
        a.addr(),
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &token,
        &[
            ("x-sandboxd-peer", PEER_TOKEN),
            ("content-type", "application/json"),
        ],
        br#"{"argv":["echo","forwarded"]}"#.to_vec(),
    )
    .await;
    assert_eq!(
        exec.status,
        200,
        "exec with the peer token: {}",
        exec.text()
    );
    assert_eq!(
        (served_by(&exec), exec.json()["stdout"].clone()),
        ("b".to_string(), json!("forwarded\n"))
    );

    // Release through a.
    for (id, token) in [(&id, &token), (&id2, &token2)] {
        let path = format!("/v1/sandboxes/{id}/release");
        let r = a.call("POST", &path, Some(token), None).await;
        assert_eq!(r.status, 204, "release {id} through a: {}", r.text());
        assert_eq!(served_by(&r), "b");
    }

    // A node without peer TLS refuses to forward to an https:// member: it has no
    // certificate to present (its claim placed on b, the one node with a warm guest).
    let c = start_node_with(&etcd, "c", &cold, "").await;
    wait_view(&c, "b warm, seen by c", |v| {
        b_warm(v) && member(v, "c").is_some()
    })
    .await;
    let r = claim(&c, &[]).await;
    assert_eq!(r.status, 502, "c forwarding to b: {}", r.text());
    let message = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(
        message.starts_with(&format!(
            "cluster peer: not forwarding to node \"b\" ({b_url}): "
        )) && message.contains("no peer certificate"),
        "{message}"
    );
    drop(c);

    // (v) Refused at load: half of peer TLS, https:// without it; at start: a key file
    // that holds no key.
    let (cert, key) = certs.node();
    let half = format!(
        "peer_listen = \"127.0.0.1:0\"\npeer_ca = {:?}\npeer_key = {key:?}\n",
        certs.ca()
    );
    let log = refused(&etcd, "d", &setup, &half).await;
    assert_eq!(
        reason(&log),
        "sandboxd: config: [cluster] peer_listen, peer_ca, peer_cert and peer_key go \
         together (missing: peer_cert)"
    );
    let https = "advertise_url = \"https://127.0.0.1:7443\"\n";
    let log = refused(&etcd, "e", &setup, https).await;
    assert_eq!(
        reason(&log),
        "sandboxd: config: [cluster] advertise_url \"https://127.0.0.1:7443\" is not \
         http://host:port (https:// needs peer_listen, peer_ca, peer_cert and peer_key)"
    );
    let no_key = format!(
        "peer_listen = \"127.0.0.1:0\"\npeer_ca = {:?}\npeer_cert = {cert:?}\npeer_key = {cert:?}\n",
        certs.ca()
    );
    let log = refused(&etcd, "f", &setup, &no_key).await;
    let why = reason(&log);
    assert!(
        why.starts_with(&format!(
            "sandboxd: config: [cluster] peer_key {}: not a PEM private key",
            cert.display()
        )),
        "{why}"
    );
    let nodes = testkit::cluster::view(&a).await["nodes"].clone();
    let mut names: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| ["a", "b", "c"].contains(n)),
        "no refused node joined: {names:?}"
    );
}
