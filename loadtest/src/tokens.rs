//! Where each client's LOGIN token comes from: minted here with the gateway's HMAC secret
//! (`--auth-secret`), or read from a file of tokens minted elsewhere (`--token-file`: a JWT
//! per uid, from the identity provider's library), or none.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use idlegate_proto::{unix_now, Auth};

/// How long a minted token lives: longer than any run.
const MINTED_TTL_SECS: u64 = 3600;

/// The tokens of a run; see the module documentation.
#[derive(Debug, Clone, Default)]
pub enum Tokens {
    #[default]
    None,
    Hmac(Auth),
    /// uid -> token.
    File(Arc<HashMap<u64, String>>),
}

impl Tokens {
    /// Reads `path`: one `<uid> <token>` a line.
    pub fn read(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        let mut tokens = HashMap::new();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let (uid, token) = line
                .split_once(' ')
                .and_then(|(uid, token)| Some((uid.parse::<u64>().ok()?, token.trim())))
                .ok_or_else(|| format!("--token-file {} line {}: expected `<uid> <token>`", path.display(), n + 1))?;
            tokens.insert(uid, token.to_string());
        }
        Ok(Tokens::File(Arc::new(tokens)))
    }

    /// The token of `uid`'s next LOGIN, if the run has tokens.
    pub fn for_uid(&self, uid: u64) -> Option<String> {
        match self {
            Tokens::None => None,
            Tokens::Hmac(auth) => Some(auth.mint(uid, unix_now() + MINTED_TTL_SECS)),
            Tokens::File(tokens) => tokens.get(&uid).cloned(),
        }
    }
}
