//! A server and a client configuration of one cipher suite over the test certificate in
//! `tests/data` (ECDSA P-256, for `localhost`): what the records' unit tests
//! (`src/transport/records.rs`), the differential tests and
//! `examples/tls_session_memory.rs` handshake with. Both sides allow secret extraction:
//! the server's hands over to the door's records, the client's feeds the raw client.

use std::sync::Arc;

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, ServerConfig, SupportedCipherSuite};

const CERT: &[u8] = include_bytes!("../data/records-cert.pem");
const KEY: &[u8] = include_bytes!("../data/records-key.pem");

/// The configurations of `suite` alone (and its version).
pub fn configs(suite: SupportedCipherSuite) -> (ServerConfig, ClientConfig) {
    let cert = CertificateDer::from_pem_slice(CERT).unwrap();
    let provider = Arc::new(rustls::crypto::CryptoProvider { cipher_suites: vec![suite], ..default_provider() });
    let versions = [suite.version()];
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::from_pem_slice(KEY).unwrap())
        .unwrap();
    server.enable_secret_extraction = true;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.enable_secret_extraction = true;
    (server, client)
}
