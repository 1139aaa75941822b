//! TLS records once the handshake is done, kept as small as the keys.
//!
//! rustls's connection keeps, for as long as it lives, its state machine, its record
//! layer's bookkeeping and two AEAD keys expanded for AES-GCM (round keys and a GHASH
//! table, whatever the suite): about 3 KiB an idle TLS connection holds for nothing. Once the
//! handshake is over, rustls hands out the traffic secrets (its kernel-TLS API,
//! `dangerous_into_kernel_connection`) and this file protects the records with them
//! instead. Held per connection: each direction's key, IV and sequence number, and, for
//! TLS 1.3, rustls's `KernelConnection`, which derives the next keys when either side asks
//! for a key update. The AEAD itself is ring's (the same code rustls runs), its key
//! expanded on the stack for each record: a few hundred instructions each way instead of
//! more than a kilobyte per idle connection.
//!
//! What a TLS server must do after the handshake, and this does (RFC 8446 §5 and §4.6.3,
//! RFC 5246 §6.2):
//! - application data in records of at most 16 KiB, each under the next sequence number;
//! - TLS 1.3's inner content type and padding; TLS 1.2's explicit nonce (AES-GCM);
//! - a client's KeyUpdate, answered with ours when it asks; our own key update, or a close
//!   under TLS 1.2, before a key reaches its suite's confidentiality limit;
//! - close_notify either way; any other alert, a renegotiation or a record that does not
//!   decrypt ends the connection with a fatal alert of ours naming why.

use bytes::{Buf, BufMut, BytesMut};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets, ProtocolVersion, SupportedCipherSuite};
use zeroize::Zeroize;

/// A record's header: content type, legacy version, length.
const HEADER: usize = 5;

/// Every suite rustls offers has a 16-byte tag.
const TAG: usize = 16;

/// TLS 1.2's AES-GCM sends the nonce's last 8 bytes in each record.
const EXPLICIT_NONCE: usize = 8;

/// Most plaintext one record carries (RFC 8446 §5.1, RFC 5246 §6.2.1).
const MAX_PLAINTEXT: usize = 16 * 1024;

/// Most ciphertext a record may carry: TLS 1.3 allows 256 bytes of expansion (§5.2), TLS
/// 1.2 up to 2,048 (§6.2.3).
const MAX_CIPHERTEXT_TLS13: usize = MAX_PLAINTEXT + 256;
const MAX_CIPHERTEXT_TLS12: usize = MAX_PLAINTEXT + 2048;

/// Every record's legacy version after the handshake, in both versions.
const RECORD_VERSION: [u8; 2] = [0x03, 0x03];

/// Content types (RFC 8446 §5.1).
const CHANGE_CIPHER_SPEC: u8 = 20;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// The one handshake message a TLS 1.3 server accepts after the handshake (§4.6.3), and
/// its whole encoding: type, 24-bit length 1, `request_update`.
const KEY_UPDATE: u8 = 24;
const KEY_UPDATE_LEN: usize = 5;
const UPDATE_NOT_REQUESTED: u8 = 0;
const UPDATE_REQUESTED: u8 = 1;

/// Alert levels and the descriptions this layer sends or tells apart (RFC 8446 §6).
const WARNING: u8 = 1;
const FATAL: u8 = 2;
const CLOSE_NOTIFY: u8 = 0;
const UNEXPECTED_MESSAGE: u8 = 10;
const BAD_RECORD_MAC: u8 = 20;
const RECORD_OVERFLOW: u8 = 22;
const ILLEGAL_PARAMETER: u8 = 47;
const DECODE_ERROR: u8 = 50;
const INTERNAL_ERROR: u8 = 80;
const USER_CANCELED: u8 = 90;

/// KeyUpdates a client may send with no application data between them. Each one asking
/// for ours costs a key derivation and a record; past this the session ends, as rustls and
/// BoringSSL (`kMaxKeyUpdates`) end it, instead of answering a flood without bound.
const MAX_KEY_UPDATES: u8 = 32;

/// Warning alerts (user_canceled, the one a client may send and go on) a session takes in
/// all, as rustls and BoringSSL (`kMaxWarningAlerts`) take.
const MAX_WARNING_ALERTS: u8 = 4;

/// Empty records a client may send in a row. They carry nothing and cost a decryption
/// each; rustls takes 32 in a row, as OpenSSL (`MAX_EMPTY_RECORDS`) does.
const MAX_EMPTY_RECORDS: u8 = 32;

/// rustls's bounds on a key's record counter: past the soft one a TLS 1.3 key changes (a
/// TLS 1.2 session closes), and nothing is opened at the hard one.
const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;
const SEQ_HARD_LIMIT: u64 = 0xffff_ffff_ffff_fffe;

/// A record's version is 3.x (RFC 5246 §6.2.1, RFC 8446 §5.1).
fn check_version(major: u8, minor: u8) -> Result<(), Fatal> {
    if major != 3 {
        return Err(fatal(DECODE_ERROR, format!("a record of version {major}.{minor}")));
    }
    Ok(())
}

/// Why the records cannot go on: the alert we send (none to a client that sent its own),
/// and what the client is told in words.
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub(crate) struct Fatal {
    alert: Option<u8>,
    why: String,
}

fn fatal(alert: u8, why: impl Into<String>) -> Fatal {
    Fatal { alert: Some(alert), why: why.into() }
}

/// The AEAD of a suite rustls negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

/// One direction's traffic key, IV and next sequence number; wiped when dropped.
struct Keys {
    cipher: Cipher,
    /// The key's bytes; AES-128 uses the first 16.
    key: [u8; 32],
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

// === impl Keys ===

impl Keys {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> Result<Keys, Fatal> {
        let (cipher, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (Cipher::Chacha20Poly1305, key, iv),
            _ => return Err(fatal(INTERNAL_ERROR, "a cipher suite this gateway cannot protect records with")),
        };
        let mut keys = Keys { cipher, key: [0; 32], iv: [0; aead::NONCE_LEN], seq };
        let (key, iv) = (key.as_ref(), iv.as_ref());
        if key.len() != keys.key_len() || iv.len() != aead::NONCE_LEN {
            return Err(fatal(INTERNAL_ERROR, "traffic secrets of an unexpected size"));
        }
        keys.key[..key.len()].copy_from_slice(key);
        keys.iv.copy_from_slice(iv);
        Ok(keys)
    }

    fn key_len(&self) -> usize {
        match self.cipher {
            Cipher::Aes128Gcm => 16,
            Cipher::Aes256Gcm | Cipher::Chacha20Poly1305 => 32,
        }
    }

    /// The key, expanded for one record. Not kept: expanded, an AES-GCM key is more than
    /// half a kilobyte, and an idle connection would hold two.
    fn aead(&self) -> LessSafeKey {
        let algorithm = match self.cipher {
            Cipher::Aes128Gcm => &aead::AES_128_GCM,
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(algorithm, &self.key[..self.key_len()]).expect("a key of the algorithm's length");
        LessSafeKey::new(key)
    }

    /// The IV XORed with the sequence number (RFC 8446 §5.3; rustls builds TLS 1.2's nonces
    /// the same way, and its extracted IV already holds AES-GCM's salt and explicit start).
    fn nonce(&self) -> [u8; aead::NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[aead::NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// TLS 1.2's additional data: sequence number, content type, version, plaintext length.
    fn tls12_aad(&self, content_type: u8, version: [u8; 2], len: usize) -> [u8; 13] {
        let mut aad = [0; 13];
        aad[..8].copy_from_slice(&self.seq.to_be_bytes());
        aad[8] = content_type;
        aad[9..11].copy_from_slice(&version);
        aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
        aad
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.key.zeroize();
        self.iv.zeroize();
    }
}

/// A TLS session's records after its handshake; see the module documentation.
pub(crate) struct Records {
    tx: Keys,
    rx: Keys,
    /// Records one key may protect before it must change (TLS 1.3) or the session end (1.2).
    limit: u64,
    /// TLS 1.3's key schedule, which alone can derive the next keys; `None` under TLS 1.2,
    /// which has no key updates.
    schedule: Option<KernelConnection<ServerConnectionData>>,
    /// The client sent close_notify or a fatal alert: nothing more is read.
    peer_closed: bool,
    /// We sent close_notify or a fatal alert: nothing more is sent.
    closed: bool,
    /// KeyUpdates still taken before application data arrives ([`MAX_KEY_UPDATES`]).
    key_updates_left: u8,
    /// Warning alerts still taken ([`MAX_WARNING_ALERTS`]).
    warnings_left: u8,
    /// Empty records still taken before one that is not ([`MAX_EMPTY_RECORDS`]).
    empties_left: u8,
    /// Our KeyUpdate went out during this read: further requests in it are answered by it
    /// (RFC 8446 §4.6.3 asks for one before our next data, not one each).
    answered: bool,
}

// === impl Records ===

impl Records {
    /// Takes over a session from rustls at the end of its handshake.
    /// `record_limit`, when given, replaces the suite's confidentiality limit.
    pub(crate) fn new(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<ServerConnectionData>,
        record_limit: Option<u64>,
    ) -> Result<Records, Fatal> {
        let suite_limit = match kernel.negotiated_cipher_suite() {
            SupportedCipherSuite::Tls13(suite) => suite.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(suite) => suite.common.confidentiality_limit,
        };
        let tls13 = kernel.protocol_version() == ProtocolVersion::TLSv1_3;
        // ChaCha20-Poly1305 has no confidentiality limit: rustls's own bound on the counter.
        let limit = record_limit.unwrap_or(suite_limit).min(SEQ_SOFT_LIMIT);
        Ok(Records {
            tx: Keys::new(secrets.tx)?,
            rx: Keys::new(secrets.rx)?,
            limit,
            schedule: tls13.then_some(kernel),
            peer_closed: false,
            closed: false,
            key_updates_left: MAX_KEY_UPDATES,
            warnings_left: MAX_WARNING_ALERTS,
            empties_left: MAX_EMPTY_RECORDS,
            answered: false,
        })
    }

    fn tls13(&self) -> bool {
        self.schedule.is_some()
    }

    /// Decrypts the whole records at the front of `raw` into `plain`, leaving a partial one;
    /// what the session must answer (a key update) goes to `wire`. `Ok(true)` once the
    /// client sent close_notify. On an error, `wire` ends with our fatal alert.
    pub(crate) fn open(
        &mut self,
        raw: &mut BytesMut,
        plain: &mut BytesMut,
        wire: &mut BytesMut,
    ) -> Result<bool, Fatal> {
        let result = self.open_records(raw, plain, wire);
        if let Err(e) = &result {
            self.peer_closed = true;
            match e.alert {
                Some(alert) => self.alert(alert, wire),
                // The client's own fatal alert: none in return (RFC 8446 §6.2).
                None => self.closed = true,
            }
        }
        result
    }

    fn open_records(&mut self, raw: &mut BytesMut, plain: &mut BytesMut, wire: &mut BytesMut) -> Result<bool, Fatal> {
        self.answered = false;
        while !self.peer_closed {
            if raw.len() < HEADER {
                // A content type or a version refused as soon as it arrives, as rustls
                // refuses them.
                if let Some(&content_type) = raw.first() {
                    self.check_type(content_type)?;
                }
                if let [_, major, minor, ..] = raw[..] {
                    check_version(major, minor)?;
                }
                return Ok(false);
            }
            let header: [u8; HEADER] = raw[..HEADER].try_into().expect("a whole header");
            let len = self.check_header(header)?;
            if raw.len() < HEADER + len {
                return Ok(false);
            }
            let (content_type, range) = self.decrypt(&mut raw[..HEADER + len])?;
            let payload = &raw[range.clone()];
            if payload.len() > MAX_PLAINTEXT {
                return Err(fatal(RECORD_OVERFLOW, "a record's plaintext over 16 KiB"));
            }
            if payload.is_empty() {
                self.empties_left = self.empties_left.checked_sub(1).ok_or_else(|| {
                    fatal(UNEXPECTED_MESSAGE, format!("more than {MAX_EMPTY_RECORDS} empty records in a row"))
                })?;
            } else {
                self.empties_left = MAX_EMPTY_RECORDS;
            }
            match content_type {
                APPLICATION_DATA => {
                    plain.extend_from_slice(payload);
                    self.key_updates_left = MAX_KEY_UPDATES;
                }
                ALERT => match *payload {
                    [level, _] if level != WARNING && level != FATAL => {
                        return Err(fatal(ILLEGAL_PARAMETER, format!("an alert of level {level}")));
                    }
                    // Answered by ours when the connection ends (`finish`).
                    [_, CLOSE_NOTIFY] => self.peer_closed = true,
                    // TLS 1.2's warnings go on, TLS 1.3's user_canceled too (RFC 8446 §6.1);
                    // every other alert TLS 1.3 treats as an error whatever its level (§6).
                    [WARNING, description] if !self.tls13() || description == USER_CANCELED => {
                        self.warnings_left = self.warnings_left.checked_sub(1).ok_or_else(|| {
                            fatal(UNEXPECTED_MESSAGE, format!("more than {MAX_WARNING_ALERTS} warning alerts"))
                        })?;
                    }
                    [_, description] => {
                        let why = format!("the client sent alert {description}");
                        return Err(Fatal { alert: None, why });
                    }
                    _ => return Err(fatal(DECODE_ERROR, "an alert of the wrong length")),
                },
                HANDSHAKE if self.tls13() => {
                    let message: [u8; KEY_UPDATE_LEN] = payload
                        .try_into()
                        .map_err(|_| fatal(UNEXPECTED_MESSAGE, "a handshake message other than KeyUpdate"))?;
                    self.key_updates_left = self.key_updates_left.checked_sub(1).ok_or_else(|| {
                        fatal(UNEXPECTED_MESSAGE, format!("{MAX_KEY_UPDATES} KeyUpdates with no data between them"))
                    })?;
                    self.key_update(message, wire)?;
                }
                // Renegotiation is not offered. no_renegotiation is a warning alert (RFC 5246
                // §7.2.2), not a fatal one; ending the session, a fatal unexpected_message says
                // it, as rustls says it past its one rebuffed request.
                HANDSHAKE => return Err(fatal(UNEXPECTED_MESSAGE, "renegotiation is not offered")),
                other => return Err(fatal(UNEXPECTED_MESSAGE, format!("a record of content type {other}"))),
            }
            // The plaintext was decrypted in place: wiped before the buffer is reused (a
            // LOGIN's token, an MQTT password). The header and the tag are no secret.
            raw[range].zeroize();
            raw.advance(HEADER + len);
        }
        // After close_notify, whatever follows is ignored (RFC 8446 §6.1).
        raw.clear();
        Ok(true)
    }

    /// A content type the version sends after the handshake: TLS 1.3 protects every record
    /// as application data; TLS 1.2 sends alerts, handshake messages and data, and no
    /// change_cipher_spec once the handshake is over.
    fn check_type(&self, content_type: u8) -> Result<(), Fatal> {
        let expected = if self.tls13() {
            content_type == APPLICATION_DATA
        } else {
            matches!(content_type, ALERT | HANDSHAKE | APPLICATION_DATA)
        };
        if expected {
            return Ok(());
        }
        let why = match content_type {
            CHANGE_CIPHER_SPEC => "a change_cipher_spec record after the handshake".to_string(),
            ALERT | HANDSHAKE => "an unprotected record after the handshake".to_string(),
            other => format!("a record of content type {other}"),
        };
        Err(fatal(UNEXPECTED_MESSAGE, why))
    }

    /// The header's length, once the header could start a record of this session: a
    /// content type the version does not send after the handshake is unexpected (RFC 8446
    /// §5, RFC 5246 §6: unexpected_message), then the checks rustls's deframer makes (RFC
    /// 8446 §5.1, RFC 5246 §6.2.1).
    fn check_header(&self, header: [u8; HEADER]) -> Result<usize, Fatal> {
        let [content_type, major, minor, high, low] = header;
        let len = usize::from(u16::from_be_bytes([high, low]));
        self.check_type(content_type)?;
        check_version(major, minor)?;
        if len == 0 && content_type != APPLICATION_DATA {
            return Err(fatal(DECODE_ERROR, "an empty record that is not application data"));
        }
        let max = if self.tls13() { MAX_CIPHERTEXT_TLS13 } else { MAX_CIPHERTEXT_TLS12 };
        if len > max {
            return Err(fatal(RECORD_OVERFLOW, format!("a record of {len} bytes, over the {max} allowed")));
        }
        Ok(len)
    }

    /// Decrypts one whole record in place: its content type and where its plaintext is.
    fn decrypt(&mut self, record: &mut [u8]) -> Result<(u8, std::ops::Range<usize>), Fatal> {
        let header: [u8; HEADER] = record[..HEADER].try_into().expect("a whole header");
        let outer_type = header[0];
        let bad_mac = || fatal(BAD_RECORD_MAC, "a record that does not decrypt");
        let result = if self.tls13() {
            debug_assert_eq!(outer_type, APPLICATION_DATA, "checked with the header");
            // The additional data is the header a TLS 1.3 record has (RFC 8446 §5.2), its
            // legacy version 0x0303 whatever the header says (§5.1: ignored for all purposes
            // but this), as rustls builds it.
            let mut aad = header;
            aad[1..3].copy_from_slice(&RECORD_VERSION);
            let nonce = Nonce::assume_unique_for_key(self.rx.nonce());
            let opened =
                self.rx.aead().open_in_place(nonce, Aad::from(aad), &mut record[HEADER..]).map_err(|_| bad_mac())?;
            // The inner plaintext, padding included, is bounded (RFC 8446 §5.4), as rustls
            // bounds it: counted before the padding is stripped.
            if opened.len() > MAX_PLAINTEXT + 1 {
                return Err(fatal(RECORD_OVERFLOW, "a record's inner plaintext over 2^14 + 1 bytes"));
            }
            // The content type is the last byte that is not padding.
            let end = opened
                .iter()
                .rposition(|&b| b != 0)
                .ok_or_else(|| fatal(UNEXPECTED_MESSAGE, "a record with no content type"))?;
            (opened[end], HEADER..HEADER + end)
        } else {
            let explicit = if self.rx.cipher == Cipher::Chacha20Poly1305 { 0 } else { EXPLICIT_NONCE };
            let body = &mut record[HEADER..];
            if body.len() < explicit + TAG {
                return Err(bad_mac());
            }
            let mut nonce = self.rx.nonce();
            if explicit > 0 {
                nonce[aead::NONCE_LEN - EXPLICIT_NONCE..].copy_from_slice(&body[..EXPLICIT_NONCE]);
            }
            // The header's own version is authenticated (RFC 5246 §6.2.3.3), as rustls does.
            let aad = self.rx.tls12_aad(outer_type, [header[1], header[2]], body.len() - explicit - TAG);
            let nonce = Nonce::assume_unique_for_key(nonce);
            let opened =
                self.rx.aead().open_in_place(nonce, Aad::from(aad), &mut body[explicit..]).map_err(|_| bad_mac())?;
            let start = HEADER + explicit;
            (outer_type, start..start + opened.len())
        };
        // A key reaches its limit long before its counter could wrap; a client that never
        // changes it gets this error past rustls's hard limit, never a reused nonce.
        self.rx.seq = self
            .rx
            .seq
            .checked_add(1)
            .filter(|&seq| seq < SEQ_HARD_LIMIT)
            .ok_or_else(|| fatal(INTERNAL_ERROR, "the client's sequence numbers ran out"))?;
        Ok(result)
    }

    /// A client's KeyUpdate: new keys for what it sends next, and ours changed too when
    /// it asks.
    fn key_update(&mut self, message: [u8; KEY_UPDATE_LEN], wire: &mut BytesMut) -> Result<(), Fatal> {
        let [KEY_UPDATE, 0, 0, 1, request] = message else {
            return Err(fatal(UNEXPECTED_MESSAGE, "a handshake message other than KeyUpdate"));
        };
        if request != UPDATE_NOT_REQUESTED && request != UPDATE_REQUESTED {
            return Err(fatal(ILLEGAL_PARAMETER, "a KeyUpdate with an unknown request_update"));
        }
        let schedule = self.schedule.as_mut().expect("TLS 1.3");
        self.rx = Keys::new(schedule.update_rx_secret().map_err(|e| fatal(INTERNAL_ERROR, e.to_string()))?)?;
        if request == UPDATE_REQUESTED && !self.answered {
            self.answered = true;
            self.update_tx(wire)?;
        }
        Ok(())
    }

    /// Sends our KeyUpdate under the old keys, then changes to the new ones (TLS 1.3).
    fn update_tx(&mut self, wire: &mut BytesMut) -> Result<(), Fatal> {
        self.seal_record(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, UPDATE_NOT_REQUESTED], wire);
        let schedule = self.schedule.as_mut().expect("TLS 1.3");
        self.tx = Keys::new(schedule.update_tx_secret().map_err(|e| fatal(INTERNAL_ERROR, e.to_string()))?)?;
        Ok(())
    }

    /// Appends `plain` to `wire` as application data records.
    pub(crate) fn seal(&mut self, plain: &[u8], wire: &mut BytesMut) -> Result<(), Fatal> {
        if self.closed {
            return Err(fatal(CLOSE_NOTIFY, "the session is closed"));
        }
        for chunk in plain.chunks(MAX_PLAINTEXT) {
            if self.tx.seq >= self.limit {
                if !self.tls13() {
                    let why = "the session's key reached its record limit; reconnect for a new one";
                    self.alert(CLOSE_NOTIFY, wire);
                    return Err(fatal(CLOSE_NOTIFY, why));
                }
                self.update_tx(wire)?;
            }
            self.seal_record(APPLICATION_DATA, chunk, wire);
        }
        Ok(())
    }

    /// Appends close_notify to `wire`, once.
    pub(crate) fn finish(&mut self, wire: &mut BytesMut) {
        if !self.closed {
            self.alert(CLOSE_NOTIFY, wire);
        }
    }

    /// Appends an alert (close_notify a warning, any other fatal) and ends the session.
    fn alert(&mut self, description: u8, wire: &mut BytesMut) {
        if self.closed {
            return;
        }
        let level = if description == CLOSE_NOTIFY { WARNING } else { FATAL };
        self.seal_record(ALERT, &[level, description], wire);
        self.closed = true;
    }

    /// Appends one record of `content_type` holding `payload` (at most 16 KiB) to `wire`.
    /// Nothing once our close_notify or fatal alert went out (RFC 8446 §6.1: nothing follows
    /// it): a KeyUpdate the client asks for after our close is not answered.
    fn seal_record(&mut self, content_type: u8, payload: &[u8], wire: &mut BytesMut) {
        debug_assert!(payload.len() <= MAX_PLAINTEXT);
        if self.closed {
            return;
        }
        let tls13 = self.tls13();
        let explicit = if !tls13 && self.tx.cipher != Cipher::Chacha20Poly1305 { EXPLICIT_NONCE } else { 0 };
        let inner = payload.len() + usize::from(tls13);
        let len = explicit + inner + TAG;
        let outer_type = if tls13 { APPLICATION_DATA } else { content_type };
        let nonce = self.tx.nonce();
        wire.reserve(HEADER + len);
        let start = wire.len();
        wire.put_u8(outer_type);
        wire.put_slice(&RECORD_VERSION);
        wire.put_u16(len as u16);
        wire.put_slice(&nonce[aead::NONCE_LEN - explicit..]);
        let body = wire.len();
        wire.put_slice(payload);
        if tls13 {
            wire.put_u8(content_type);
        }
        // TLS 1.3 authenticates the record's header, TLS 1.2 its own 13 bytes.
        let mut aad = self.tx.tls12_aad(content_type, RECORD_VERSION, payload.len());
        let aad_len = if tls13 {
            aad[..HEADER].copy_from_slice(&wire[start..start + HEADER]);
            HEADER
        } else {
            aad.len()
        };
        let tag = self
            .tx
            .aead()
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..aad_len]),
                &mut wire[body..],
            )
            .expect("a record within the AEAD's limits");
        wire.put_slice(tag.as_ref());
        self.tx.seq += 1;
    }
}

#[cfg(test)]
mod tests;
