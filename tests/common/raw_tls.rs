//! A TLS client that writes records by hand, as an attacker would: rustls's client does the
//! handshake, the traffic secrets come out of it (its key log and secret extraction), and
//! ring seals and opens whatever records a test wants, those no TLS library would send
//! among them. Nothing here comes from the crate under test: the key schedule is RFC 8446
//! §7.1 and §7.2 over ring's HKDF, the records RFC 8446 §5 and RFC 5246 §6.2.3.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use rustls::{ClientConfig, ClientConnection, ConnectionTrafficSecrets, SupportedCipherSuite};

pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;
pub const KEY_UPDATE: u8 = 24;
pub const HEADER: usize = 5;
const TAG: usize = 16;

/// The secrets rustls's client logs (`SSLKEYLOGFILE`'s labels), by label.
#[derive(Debug, Default)]
struct KeyLog(Mutex<HashMap<String, Vec<u8>>>);

impl rustls::KeyLog for KeyLog {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        self.0.lock().unwrap().insert(label.to_string(), secret.to_vec());
    }

    fn will_log(&self, _label: &str) -> bool {
        true
    }
}

/// One direction's key, IV, sequence number and (TLS 1.3) traffic secret.
#[derive(Clone)]
pub struct Direction {
    algorithm: &'static aead::Algorithm,
    key: Vec<u8>,
    iv: [u8; 12],
    pub seq: u64,
    secret: Option<Vec<u8>>,
    hash: hkdf::Algorithm,
    /// TLS 1.2's AES-GCM: 8 bytes of the nonce travel in each record.
    explicit: bool,
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
fn expand_label(hash: hkdf::Algorithm, secret: &[u8], label: &str, len: usize) -> Vec<u8> {
    let label = format!("tls13 {label}");
    let info = [&(len as u16).to_be_bytes()[..], &[label.len() as u8], label.as_bytes(), &[0u8]];
    let mut out = vec![0; len];
    hkdf::Prk::new_less_safe(hash, secret).expand(&info, Len(len)).unwrap().fill(&mut out).unwrap();
    out
}

impl Direction {
    fn new(
        (seq, secrets): (u64, ConnectionTrafficSecrets),
        secret: Option<Vec<u8>>,
        suite: SupportedCipherSuite,
    ) -> Direction {
        let (algorithm, key, iv, explicit) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv, true),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv, true),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv, false),
            _ => panic!("a suite this client does not know"),
        };
        let hash =
            if format!("{:?}", suite.suite()).ends_with("SHA384") { hkdf::HKDF_SHA384 } else { hkdf::HKDF_SHA256 };
        let tls13 = secret.is_some();
        Direction {
            algorithm,
            key: key.as_ref().to_vec(),
            iv: iv.as_ref().try_into().unwrap(),
            seq,
            secret,
            hash,
            explicit: explicit && !tls13,
        }
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(self.algorithm, &self.key).unwrap())
    }

    fn nonce(&self) -> [u8; 12] {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// The next keys after a KeyUpdate (RFC 8446 §7.2).
    pub fn update(&mut self) {
        let secret = self.secret.as_ref().expect("TLS 1.3");
        let next = expand_label(self.hash, secret, "traffic upd", hkdf::KeyType::len(&self.hash));
        self.key = expand_label(self.hash, &next, "key", self.key.len());
        self.iv = expand_label(self.hash, &next, "iv", 12).try_into().unwrap();
        self.secret = Some(next);
        self.seq = 0;
    }
}

/// A record as the test wants it sealed.
#[derive(Clone, Debug)]
pub struct Record {
    /// The content type (TLS 1.3: the inner one).
    pub typ: u8,
    pub payload: Vec<u8>,
    /// TLS 1.3: zeros after the inner content type.
    pub padding: usize,
    /// The outer content type, when not the usual one.
    pub outer: Option<u8>,
    /// The header's version; the AEAD authenticates 0x0303 whatever it says, as a record
    /// changed on the way would be.
    pub version: [u8; 2],
    /// A tag that does not verify.
    pub bad_tag: bool,
    /// TLS 1.3: no inner content type at all (all of the inner plaintext is zeros).
    pub no_type: bool,
}

impl Record {
    pub fn new(typ: u8, payload: impl Into<Vec<u8>>) -> Record {
        Record {
            typ,
            payload: payload.into(),
            padding: 0,
            outer: None,
            version: [3, 3],
            bad_tag: false,
            no_type: false,
        }
    }
}

/// What the server sent after the handshake, record by record, as this client read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    Data(Vec<u8>),
    /// Level and description.
    Alert(u8, u8),
    /// `request_update`.
    KeyUpdate(u8),
    /// Another handshake message (a NewSessionTicket), by type.
    Handshake(u8),
    /// A record that does not open under the keys the client holds.
    Undecryptable,
}

/// The client side of a session whose handshake is over; see the module documentation.
pub struct RawClient {
    pub tx: Direction,
    pub rx: Direction,
    pub tls13: bool,
    /// The server's bytes not yet read as whole records.
    pending: Vec<u8>,
}

impl RawClient {
    /// Runs rustls's client with `config` against `server`, a function from the client's
    /// bytes to the server's answer, until the handshake is over; then takes the keys. What
    /// the server sent after its last flight (tickets) stays to be read.
    pub fn handshake(config: &ClientConfig, server: &mut dyn FnMut(&[u8]) -> Vec<u8>) -> RawClient {
        let log = Arc::new(KeyLog::default());
        let mut config = config.clone();
        config.key_log = log.clone();
        config.enable_secret_extraction = true;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = ClientConnection::new(Arc::new(config), name).unwrap();
        let mut leftover = Vec::new();
        for _ in 0..16 {
            let mut out = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut out).unwrap();
            }
            let back = if out.is_empty() { Vec::new() } else { server(&out) };
            if !client.is_handshaking() {
                leftover = back;
                break;
            }
            let mut back = &back[..];
            while !back.is_empty() {
                client.read_tls(&mut back).unwrap();
                client.process_new_packets().expect("the handshake");
            }
        }
        assert!(!client.is_handshaking(), "the handshake did not finish");
        let suite = client.negotiated_cipher_suite().unwrap();
        let tls13 = suite.tls13().is_some();
        let secrets = client.dangerous_extract_secrets().unwrap();
        let logged = log.0.lock().unwrap();
        let secret = |label: &str| tls13.then(|| logged.get(label).cloned().expect("logged"));
        RawClient {
            tx: Direction::new(secrets.tx, secret("CLIENT_TRAFFIC_SECRET_0"), suite),
            rx: Direction::new(secrets.rx, secret("SERVER_TRAFFIC_SECRET_0"), suite),
            tls13,
            pending: leftover,
        }
    }

    /// `record` sealed under the client's keys, which move on by one record.
    pub fn seal(&mut self, record: &Record) -> Vec<u8> {
        let keys = &mut self.tx;
        let nonce = keys.nonce();
        let (outer, mut body): (u8, Vec<u8>);
        let mut out = Vec::new();
        if self.tls13 {
            outer = record.outer.unwrap_or(APPLICATION_DATA);
            let mut inner = record.payload.clone();
            if !record.no_type {
                inner.push(record.typ);
            }
            inner.extend(std::iter::repeat_n(0, record.padding));
            let len = (inner.len() + TAG) as u16;
            // The header a TLS 1.3 sender writes is what it authenticates (RFC 8446 §5.2); the
            // header sent may then differ, as one changed on the way would.
            let aad = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
            keys.aead()
                .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut inner)
                .unwrap();
            body = inner;
        } else {
            outer = record.outer.unwrap_or(record.typ);
            let mut a = keys.seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[record.typ, 3, 3]);
            a.extend_from_slice(&(record.payload.len() as u16).to_be_bytes());
            let mut sealed = record.payload.clone();
            keys.aead()
                .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&a[..]), &mut sealed)
                .unwrap();
            body = if keys.explicit { nonce[4..].to_vec() } else { Vec::new() };
            body.extend_from_slice(&sealed);
        }
        if record.bad_tag {
            *body.last_mut().unwrap() ^= 1;
        }
        out.extend_from_slice(&[outer, record.version[0], record.version[1]]);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(&body);
        keys.seq += 1;
        out
    }

    /// Reads `bytes` from the server: every whole record, as heard. Once a record does not
    /// open, the rest is not read.
    pub fn read(&mut self, bytes: &[u8]) -> Vec<Heard> {
        self.pending.extend_from_slice(bytes);
        let mut heard = Vec::new();
        loop {
            if self.pending.len() < HEADER {
                break;
            }
            let len = usize::from(u16::from_be_bytes([self.pending[3], self.pending[4]]));
            if self.pending.len() < HEADER + len {
                break;
            }
            let mut record: Vec<u8> = self.pending.drain(..HEADER + len).collect();
            match self.open(&mut record) {
                Some(message) => {
                    let was_key_update = matches!(message, Heard::KeyUpdate(_));
                    heard.push(message);
                    if was_key_update {
                        self.rx.update();
                    }
                }
                None => {
                    heard.push(Heard::Undecryptable);
                    self.pending.clear();
                    break;
                }
            }
        }
        heard
    }

    fn open(&mut self, record: &mut [u8]) -> Option<Heard> {
        let keys = &mut self.rx;
        let header: [u8; HEADER] = record[..HEADER].try_into().unwrap();
        let (typ, payload) = if self.tls13 {
            let opened = keys
                .aead()
                .open_in_place(Nonce::assume_unique_for_key(keys.nonce()), Aad::from(header), &mut record[HEADER..])
                .ok()?;
            let end = opened.iter().rposition(|&b| b != 0)?;
            (opened[end], opened[..end].to_vec())
        } else {
            let mut nonce = keys.nonce();
            let mut body = &mut record[HEADER..];
            if keys.explicit {
                if body.len() < 8 {
                    return None;
                }
                nonce[4..].copy_from_slice(&body[..8]);
                body = &mut body[8..];
            }
            let len = body.len().checked_sub(TAG)?;
            let mut a = keys.seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[header[0], header[1], header[2]]);
            a.extend_from_slice(&(len as u16).to_be_bytes());
            let opened =
                keys.aead().open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&a[..]), body).ok()?;
            (header[0], opened.to_vec())
        };
        keys.seq += 1;
        Some(match (typ, &payload[..]) {
            (APPLICATION_DATA, _) => Heard::Data(payload),
            (ALERT, [level, description]) => Heard::Alert(*level, *description),
            (HANDSHAKE, [KEY_UPDATE, 0, 0, 1, request]) => Heard::KeyUpdate(*request),
            (HANDSHAKE, [kind, ..]) => Heard::Handshake(*kind),
            _ => return None,
        })
    }
}
