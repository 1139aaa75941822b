//! A delivery's signature, as the Standard Webhooks specification (standardwebhooks.com)
//! has it, so its verifier libraries (npm `standardwebhooks`, the svix packages) check it
//! unchanged: HMAC-SHA256 with each secret over `<id>.<timestamp>.<body>`, base64, as
//! `v1,<signature>`, one space-separated entry per secret.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The `webhook-signature` header's value for `body` sent as `id` at unix second `timestamp`.
pub(crate) fn signature(secrets: &[Vec<u8>], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut header = String::with_capacity(secrets.len() * 48);
    for secret in secrets {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        if !header.is_empty() {
            header.push(' ');
        }
        header.push_str("v1,");
        BASE64.encode_string(mac.finalize().into_bytes(), &mut header);
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's own example: secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`,
    /// id `msg_p5jXN8AQM9LWM0D4loKWxJek`, timestamp 1614265330, body `{"test": 2432232314}`.
    #[test]
    fn the_specifications_example_signs_as_it_says() {
        let secret = BASE64.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let header = signature(&[secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn each_secret_signs_once_in_order() {
        let header = signature(&[vec![1; 24], vec![2; 24]], "1-2", 7, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
    }
}
