//! A node of a set speaking TLS to etcd with a client certificate: one etcd member run
//! with `--client-cert-auth` on a loopback `https://` URL (certificates made here with
//! rcgen, a CA, the member's and the node's), stopped by PID. Needs `etcd`: skipped
//! with a message without it, failed under CI.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::etcd::{free_port, require_etcd};
use common::stack::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use serde_json::json;
use steerdns::control::cluster::{ClusterOptions, EtcdOptions};

struct Member(std::process::Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reaches_etcd_over_tls_with_a_client_certificate() {
    if !require_etcd("a_node_reaches_etcd_over_tls…") {
        return;
    }
    let dir = scratch("etcd-tls");
    // A CA, the member's certificate for 127.0.0.1, the node's client certificate.
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "steerdns test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = usages;
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_pem, server_key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        "etcd",
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (client_pem, client_key) = leaf(
        vec!["steerdns".into()],
        "steerdns",
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    );
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca = write("ca.pem", &ca_cert.pem());
    let server_cert = write("server.pem", &server_pem);
    let server_key = write("server-key.pem", &server_key);
    let client_cert = write("client.pem", &client_pem);
    let client_key = write("client-key.pem", &client_key);
    // A private key is a secret: readable by its owner only, or refused.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&client_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    let (client, peer) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{client}");
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let _member = Member(
        Command::new("etcd")
            .args([
                "--name",
                "m1",
                "--data-dir",
                &dir.join("etcd-data").display().to_string(),
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("m1=http://127.0.0.1:{peer}"),
                "--cert-file",
                &server_cert.display().to_string(),
                "--key-file",
                &server_key.display().to_string(),
                "--client-cert-auth",
                "--trusted-ca-file",
                &ca.display().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts"),
    );

    let opts = |cert: bool| ClusterOptions {
        etcd: EtcdOptions {
            endpoints: vec![url.parse().unwrap()],
            ca_file: Some(ca.clone()),
            cert_file: cert.then(|| client_cert.clone()),
            key_file: cert.then(|| client_key.clone()),
            // Without a certificate the node has no authentication: it must say so.
            insecure: !cert,
            ..EtcdOptions::default()
        },
        node: "ns1".into(),
        prefix: "/steerdns/".into(),
        members: vec!["ns1".into()],
    };
    policy(&dir, "[50, 100]", 30.0);
    let node = Stack::start_node(&dir, "ns1", opts(true)).await;
    node.wait_for("connected over TLS", |s| s["cluster"]["connected"] == true)
        .await;
    let (status, body) = node
        .post(
            "/v1/drains",
            json!({"name": "www.example.com", "cdn": "a", "reason": "over TLS", "immediate": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    node.wait_for("the drain back from the watch", |s| {
        s["cluster"]["drains"][0]["reason"] == "over TLS"
    })
    .await;

    // Without a client certificate the member refuses the node: it never connects.
    let dir2 = scratch("etcd-tls-nocert");
    policy(&dir2, "[50, 100]", 30.0);
    let mut o = opts(false);
    o.node = "ns2".into();
    let other = Stack::start_node(&dir2, "ns2", o).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        let s = other.state().await;
        assert_eq!(s["cluster"]["connected"], false, "{s:#}");
        if s["cluster"]["error"]
            .as_str()
            .is_some_and(|e| e != "not connected yet")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the node without a certificate reported no error");
}
