//! `ring` as `jsonwebtoken`'s verifier of RSA and ECDSA signatures: the crate's own
//! pure-Rust backend took about a quarter of a millisecond for one RS256 check, `ring` an
//! eighth of that (docs/BENCHMARKS.md section 11). `ring` is already the
//! gateway's TLS crypto; the key formats `DecodingKey` keeps are the ones `ring` takes (a
//! PKCS#1 RSA key or its modulus and exponent, an EC point, the Ed25519 key's 32 bytes).
//!
//! Installed once per process, before the first check ([`install`]); the JWK utilities
//! (thumbprints, public parts of private keys) stay the pure-Rust backend's. The gateway
//! never signs a JWT, so this provider has no signer. `ring` refuses RSA keys under 2048
//! bits, as every current identity provider's guidance does.

use std::sync::OnceLock;

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::signature::{self as sig, RsaPublicKeyComponents, UnparsedPublicKey};

/// Makes `ring` the verifier of every JWT this process checks, once.
pub(crate) fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    // Another provider installed first (an embedding program's) is kept.
    INSTALLED.get_or_init(|| {
        let _ = provider().install_default();
    });
}

/// The provider: `ring`'s verifier, the pure-Rust backend's JWK utilities.
pub fn provider() -> &'static CryptoProvider {
    static PROVIDER: OnceLock<&'static CryptoProvider> = OnceLock::new();
    PROVIDER.get_or_init(|| {
        Box::leak(Box::new(CryptoProvider {
            signer_factory: no_signer,
            verifier_factory: verifier,
            key_utils: jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.key_utils.clone(),
        }))
    })
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> jsonwebtoken::errors::Result<Box<dyn JwtSigner>> {
    Err(Error::from(ErrorKind::UnsupportedAlgorithm))
}

/// A verifier of `algorithm` with `key`: the key is only borrowed into `ring`'s types at
/// each check, which parse without allocating.
///
/// EdDSA and the HS algorithms stay with the pure-Rust backend, which checks them as fast
/// or faster (benches/jwt.rs, `signature/*`): `ring` takes RSA and ECDSA only.
fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> jsonwebtoken::errors::Result<Box<dyn JwtVerifier>> {
    match algorithm {
        Algorithm::EdDSA | Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            (jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.verifier_factory)(algorithm, key)
        }
        _ => Ok(Box::new(RingVerifier { algorithm: *algorithm, key: key.clone() })),
    }
}

struct RingVerifier {
    algorithm: Algorithm,
    key: DecodingKey,
}

impl RingVerifier {
    fn check(&self, message: &[u8], signature: &[u8]) -> bool {
        let rsa: Option<&'static sig::RsaParameters> = match self.algorithm {
            Algorithm::RS256 => Some(&sig::RSA_PKCS1_2048_8192_SHA256),
            Algorithm::RS384 => Some(&sig::RSA_PKCS1_2048_8192_SHA384),
            Algorithm::RS512 => Some(&sig::RSA_PKCS1_2048_8192_SHA512),
            Algorithm::PS256 => Some(&sig::RSA_PSS_2048_8192_SHA256),
            Algorithm::PS384 => Some(&sig::RSA_PSS_2048_8192_SHA384),
            Algorithm::PS512 => Some(&sig::RSA_PSS_2048_8192_SHA512),
            _ => None,
        };
        let ecdsa: Option<&'static sig::EcdsaVerificationAlgorithm> = match self.algorithm {
            Algorithm::ES256 => Some(&sig::ECDSA_P256_SHA256_FIXED),
            Algorithm::ES384 => Some(&sig::ECDSA_P384_SHA384_FIXED),
            _ => None,
        };
        match (self.key.kind(), rsa, ecdsa) {
            // A PKCS#1 key from PEM, or an EC point.
            (DecodingKeyKind::SecretOrDer(der), Some(rsa), _) => {
                UnparsedPublicKey::new(rsa, der).verify(message, signature).is_ok()
            }
            (DecodingKeyKind::SecretOrDer(der), None, Some(ecdsa)) => {
                UnparsedPublicKey::new(ecdsa, der).verify(message, signature).is_ok()
            }
            // A JWK's modulus and exponent.
            (DecodingKeyKind::RsaModulusExponent { n, e }, Some(rsa), _) => {
                RsaPublicKeyComponents { n, e }.verify(rsa, message, signature).is_ok()
            }
            // A key of another family, or an algorithm this verifier does not take.
            _ => false,
        }
    }
}

impl signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, message: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        if self.check(message, signature) {
            Ok(())
        } else {
            Err(signature::Error::new())
        }
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}
