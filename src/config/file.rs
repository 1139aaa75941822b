//! The configuration file (`--config <path>`, TOML): every flag of `idlegate serve` is a
//! key, named as the flag without its leading dashes (`max-connections = 19000`,
//! `jwt-key-file = "/etc/idlegate/jwks.json"`). A flag on the command line or its
//! environment variable wins over the file, so a unit file's `--config` and a one-off
//! override compose.
//!
//! The file becomes command-line arguments, put before the real ones: one parser, one set
//! of checks and one set of error messages for both. An unknown key, a key given twice or
//! a value of the wrong TOML type is refused here, naming the key and its line; a value
//! the flag's own parser refuses is named the same way by the caller, through
//! [`ConfigFile::line_of`].

use std::path::{Path, PathBuf};

use crate::error::ConfigError;

/// What the file needs to know of one flag.
#[derive(Debug, Clone)]
pub struct FlagSpec {
    /// The long name, without dashes.
    pub long: String,
    /// Its environment variable, if it has one.
    pub env: Option<String>,
    /// Whether it takes a value (`--timeout 30s`) or is a switch (`--api-tls`).
    pub takes_value: bool,
    /// Whether several values may be given, comma-separated (`--ws-allowed-origins`).
    pub list: bool,
    /// Its default, as the flag's parser reads it: a key set to it is left out, as if
    /// absent (a flag that needs another, given at its default, asks for nothing).
    pub default: Option<String>,
    /// Whether its value is a secret (a token, a password): a file that sets it should be
    /// readable by its owner alone.
    pub secret: bool,
}

/// One key of the file: its value(s) as the flag's parser reads them, and its line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: String,
    value: Value,
    line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Text(String),
    Switch(bool),
}

/// A read configuration file.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    entries: Vec<Entry>,
}

impl ConfigFile {
    /// Reads and checks `path` against `flags`.
    pub fn read(path: &Path, flags: &[FlagSpec]) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("--config", format!("{}: {e}", path.display())))?;
        ConfigFile::parse(path, &text, flags)
    }

    /// Checks `text`, the contents of `path`.
    pub fn parse(path: &Path, text: &str, flags: &[FlagSpec]) -> Result<ConfigFile, ConfigError> {
        let at =
            |line: usize, why: String| ConfigError::new("--config", format!("{} line {line}: {why}", path.display()));
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e.span().map_or(1, |span| line_at(text, span.start));
            at(line, e.message().to_string())
        })?;
        let mut entries = Vec::new();
        for (key, value) in table {
            let line = key_line(text, &key);
            let Some(flag) = flags.iter().find(|f| f.long == key) else {
                return Err(at(
                    line,
                    format!("unknown key `{key}`: the keys are `idlegate serve`'s flags without the dashes"),
                ));
            };
            let value = match (&value, flag.takes_value) {
                (toml::Value::Boolean(on), false) => Value::Switch(*on),
                (_, false) => return Err(at(line, format!("`{key}` is a switch: true or false"))),
                (toml::Value::String(s), true) => Value::Text(s.clone()),
                (toml::Value::Integer(n), true) => Value::Text(n.to_string()),
                (toml::Value::Float(x), true) => Value::Text(x.to_string()),
                (toml::Value::Boolean(b), true) => Value::Text(b.to_string()),
                (toml::Value::Array(items), true) if flag.list => {
                    let texts: Option<Vec<String>> = items.iter().map(|v| v.as_str().map(str::to_string)).collect();
                    let texts = texts.ok_or_else(|| at(line, format!("`{key}`: a list of strings")))?;
                    Value::Text(texts.join(","))
                }
                (_, true) => return Err(at(line, format!("`{key}`: a string or a number"))),
            };
            entries.push(Entry { key, value, line });
        }
        entries.sort_by_key(|e| e.line);
        Ok(ConfigFile { path: path.to_path_buf(), entries })
    }

    /// The arguments the file stands for, leaving out every flag `given` on the command
    /// line and every one whose environment variable `env_set` says is set: those win.
    pub fn args(
        &self,
        flags: &[FlagSpec],
        given: impl Fn(&str) -> bool,
        env_set: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let mut args = Vec::new();
        for entry in &self.entries {
            let Some(flag) = flags.iter().find(|f| f.long == entry.key) else { continue };
            if given(&flag.long) || flag.env.as_deref().is_some_and(&env_set) {
                continue;
            }
            match &entry.value {
                Value::Switch(true) => args.push(format!("--{}", flag.long)),
                Value::Switch(false) => {}
                Value::Text(text) if flag.default.as_ref() == Some(text) => {}
                Value::Text(text) => args.push(format!("--{}={text}", flag.long)),
            }
        }
        args
    }

    /// A warning when the file holds a secret (a flag marked secret, or a URL with a
    /// password) and its group or others may read it; `None` when it holds none, or only its
    /// owner may read it.
    pub fn exposed_secrets(&self, flags: &[FlagSpec]) -> Option<String> {
        let secret = |entry: &Entry| match &entry.value {
            Value::Text(text) => flags.iter().any(|f| f.long == entry.key && f.secret) || url_has_password(text),
            Value::Switch(_) => false,
        };
        let keys: Vec<&str> = self.entries.iter().filter(|e| secret(e)).map(|e| e.key.as_str()).collect();
        if keys.is_empty() {
            return None;
        }
        let mode = file_mode(&self.path)?;
        (mode & 0o077 != 0).then(|| {
            format!(
                "--config {}: holds secrets ({}) and its group or others may read it (mode {:03o}); \
                 chmod 600 it, or move the secrets to files of their own (--auth-secret-file, --api-token-file)",
                self.path.display(),
                keys.join(", "),
                mode & 0o777
            )
        })
    }

    /// Where `key` is set, for an error about its value: `<path> line <n>`.
    pub fn line_of(&self, key: &str) -> Option<String> {
        self.entries.iter().find(|e| e.key == key).map(|e| format!("{} line {}", self.path.display(), e.line))
    }
}

/// Whether `text` is a URL that carries a password (`redis://:pw@host`).
fn url_has_password(text: &str) -> bool {
    let Some((_, rest)) = text.split_once("://") else { return false };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// `path`'s permission bits, where the platform has them.
#[cfg(unix)]
fn file_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).ok().map(|m| m.permissions().mode())
}

#[cfg(not(unix))]
fn file_mode(_: &Path) -> Option<u32> {
    None
}

/// The 1-based line of byte `offset` of `text`.
fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line a top-level `key = ...` is on (1 if it cannot be found: a quoted key).
fn key_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(1, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Vec<FlagSpec> {
        let flag = |long: &str, env: Option<&str>, takes_value: bool, list: bool| FlagSpec {
            long: long.into(),
            env: env.map(Into::into),
            takes_value,
            list,
            default: (long == "max-connections").then(|| "10000".to_string()),
            secret: long == "auth-secret",
        };
        vec![
            flag("timeout", Some("IDLEGATE_TIMEOUT"), true, false),
            flag("max-connections", Some("IDLEGATE_MAX_CONNECTIONS"), true, false),
            flag("api-tls", None, false, false),
            flag("ws-allowed-origins", Some("IDLEGATE_WS_ALLOWED_ORIGINS"), true, true),
            flag("auth-secret", Some("IDLEGATE_AUTH_SECRET"), true, false),
            flag("redis", Some("IDLEGATE_REDIS"), true, false),
        ]
    }

    #[cfg(unix)]
    #[test]
    fn secrets_in_a_file_others_may_read_draw_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let warning = |text: &str, mode: u32| {
            let path = dir.path().join("g.toml");
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            ConfigFile::read(&path, &flags()).unwrap().exposed_secrets(&flags())
        };
        let said = warning("timeout = \"20s\"\nauth-secret = \"s\"\n", 0o644).expect("a warning");
        assert!(said.contains("auth-secret") && said.contains("mode 644"), "{said}");
        let said = warning("redis = \"redis://:pw@10.0.0.1:6379\"\n", 0o640).expect("a warning");
        assert!(said.contains("redis") && !said.contains("pw@"), "{said}");
        assert_eq!(warning("auth-secret = \"s\"\n", 0o600), None, "the owner alone reads it");
        assert_eq!(warning("timeout = \"20s\"\nredis = \"redis://10.0.0.1\"\n", 0o644), None, "no secret");
    }

    #[test]
    fn keys_become_flags_and_flags_and_env_win() {
        let text = "# a comment\ntimeout = \"20s\"\nmax-connections = 500\napi-tls = true\nws-allowed-origins = [\"https://a\", \"https://b\"]\n";
        let file = ConfigFile::parse(Path::new("g.toml"), text, &flags()).unwrap();
        let all = file.args(&flags(), |_| false, |_| false);
        assert_eq!(
            all,
            ["--timeout=20s", "--max-connections=500", "--api-tls", "--ws-allowed-origins=https://a,https://b"]
        );
        let some = file.args(&flags(), |f| f == "timeout", |e| e == "IDLEGATE_MAX_CONNECTIONS");
        assert_eq!(some, ["--api-tls", "--ws-allowed-origins=https://a,https://b"]);
        assert_eq!(file.line_of("max-connections").as_deref(), Some("g.toml line 3"));
        let at_default = ConfigFile::parse(Path::new("g.toml"), "max-connections = 10000\n", &flags()).unwrap();
        assert!(at_default.args(&flags(), |_| false, |_| false).is_empty(), "a key at its default is left out");
    }

    #[test]
    fn an_unknown_key_or_a_wrong_type_names_the_key_and_its_line() {
        let err = |text: &str| ConfigFile::parse(Path::new("g.toml"), text, &flags()).unwrap_err().to_string();
        assert!(err("timeout = \"1s\"\nmax_connections = 5\n").contains("g.toml line 2: unknown key `max_connections`"));
        assert!(err("api-tls = \"yes\"\n").contains("g.toml line 1: `api-tls` is a switch"));
        assert!(err("\n\ntimeout = [1]\n").contains("g.toml line 3: `timeout`: a string or a number"));
        assert!(err("timeout = \n").contains("g.toml line 1"));
    }
}
