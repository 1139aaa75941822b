//! Certificates made by `openssl` for a test, and TLS clients trusting them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use idlegate::{Config, TlsIdentity};
use idlegate_proto::Transport;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{find_on_path, skip_without, TestServer};

/// What tests that make certificates need on the machine.
pub const INSTALL: &str = "apt-get install openssl curl";

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test certificate authority in a folder of its own, issuing leaf certificates for
/// 127.0.0.1 and localhost.
pub struct TestCa {
    pub dir: PathBuf,
    /// The CA's certificate (PEM): what clients trust.
    pub cert: String,
    key: String,
}

impl TestCa {
    /// A new CA in `dir`.
    pub fn new(dir: &Path) -> TestCa {
        let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=idlegate test CA",
            "-keyout",
            &key,
            "-out",
            &cert,
        ]);
        TestCa { dir: dir.to_path_buf(), cert, key }
    }

    /// A leaf certificate named `name`, signed by this CA: (`<name>.pem`, `<name>.key`).
    pub fn leaf(&self, name: &str) -> (String, String) {
        let path = |ext: &str| self.dir.join(format!("{name}.{ext}")).display().to_string();
        let (cert, key, csr, ext) = (path("pem"), path("key"), path("csr"), path("ext"));
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n").unwrap();
        openssl(
            &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
                .into_iter()
                .chain(["-subj", &format!("/CN={name}"), "-keyout", &key, "-out", &csr])
                .collect::<Vec<_>>(),
        );
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &self.cert,
            "-CAkey",
            &self.key,
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ]);
        (cert, key)
    }

    /// A rustls client configuration trusting this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        self.client_config_with(alpn, rustls::crypto::ring::default_provider().cipher_suites)
    }

    /// A rustls client configuration trusting this CA, offering `alpn` and only `suites`
    /// (and the versions they belong to).
    pub fn client_config_with(
        &self,
        alpn: &[&[u8]],
        suites: Vec<rustls::SupportedCipherSuite>,
    ) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(&self.cert).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = suites.iter().map(|s| s.version()).collect();
        versions.dedup();
        let provider =
            rustls::crypto::CryptoProvider { cipher_suites: suites, ..rustls::crypto::ring::default_provider() };
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A TLS connection to `addr` trusting this CA, or the handshake's error.
    pub async fn connect(&self, addr: std::net::SocketAddr, alpn: &[&[u8]]) -> std::io::Result<TlsStream<TcpStream>> {
        let connector = tokio_rustls::TlsConnector::from(self.client_config(alpn));
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        connector.connect(name, tcp).await
    }
}

/// The subject of the certificate the server at `addr` presents, and the TLS version it
/// negotiated with `version` (`-tls1_3`, `-tls1_2`, `-tls1_1`), or `None` if it refused.
pub fn handshake(addr: std::net::SocketAddr, version: &str) -> Option<(String, String)> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), version, "-brief"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let protocol =
        text.lines().find_map(|l| l.trim().strip_prefix("Protocol version:").map(|v| v.trim().to_string()))?;
    let subject =
        text.lines().find_map(|l| l.trim().strip_prefix("Peer certificate:").map(|v| v.trim().to_string()))?;
    Some((subject, protocol))
}

/// A gateway with every door open, and the CA its certificate comes from (`None`, and only
/// the clear doors, on a machine without openssl).
pub async fn server_with(config: Config) -> (TestServer, Option<TestCa>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ca = if find_on_path(&["openssl"]).is_some() {
        Some(TestCa::new(dir.path()))
    } else {
        skip_without("openssl", INSTALL);
        None
    };
    let tls = ca.as_ref().map(|ca| {
        let (cert, key) = ca.leaf("gateway");
        TlsIdentity::load(cert.as_ref(), key.as_ref()).unwrap()
    });
    (TestServer::start(Config { tls, ..config }).await, ca, dir)
}

/// The doors `server` has open, with their addresses.
pub fn doors(server: &TestServer) -> Vec<(Transport, std::net::SocketAddr)> {
    let mut doors = vec![(Transport::Tcp, server.addr), (Transport::Ws, server.ws)];
    doors.extend(server.tls.map(|a| (Transport::Tls, a)));
    doors.extend(server.wss.map(|a| (Transport::Wss, a)));
    doors
}
