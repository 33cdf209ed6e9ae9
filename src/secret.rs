//! Secrets read from files (the etcd password, a TLS private key, the API token, the
//! API tokens file, DNSSEC keys, DNS cookie secrets): one check for all of them. A
//! secret file must be readable by its owner only: a file its group or every user may
//! read (or write) is refused, with the mode and the fix.
//!
//! No message about a secret file quotes what is in it: a key file holding only the
//! bare key would otherwise print the key into the log, the audit log and
//! `GET /v1/audit`. A parser's message goes through [`unquoted`]; our own messages
//! name the file, the line and the field, and say what is wrong without the bytes.

use std::path::{Path, PathBuf};

/// Why a secret file is refused. The secret itself is never part of the message.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file (or its metadata) cannot be read.
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Its group or others have some access to it.
    #[error("{}: a secret must be readable by its owner only, this one has mode {mode:o}: chmod 600 it (or install -m 600)", path.display())]
    NotOwnerOnly { path: PathBuf, mode: u32 },
    /// A text secret that is not UTF-8.
    #[error("{}: not UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
}

/// For the callers still on `String` errors (the etcd client's TLS key).
impl From<SecretError> for String {
    fn from(e: SecretError) -> String {
        e.to_string()
    }
}

/// What marks the left-out part of a message about a secret file.
pub(crate) const NOT_SHOWN: &str = "(not shown: a secret file)";

/// A parser's message about a secret file without what it quotes of the file. serde's
/// messages (YAML, JSON) put a value they did not expect in quotes (`invalid type:
/// string "…", expected …`, ``unknown variant `…`, expected one of …``, ``unknown
/// field `…` ``); everything from the first quote up to serde's own `, expected …` (or
/// to the end, without one) is left out. What is left says what is wrong and what was
/// expected, never the bytes.
pub(crate) fn unquoted(message: &str) -> String {
    let Some(open) = message.find(['"', '`', '\'']) else {
        return message.to_string();
    };
    let tail = message[open..]
        .rfind(", expected")
        .map_or("", |i| &message[open + i..]);
    format!("{}{NOT_SHOWN}{tail}", &message[..open])
}

/// The bytes of the secret file `path`, or why it is refused: unreadable, or a mode
/// that gives its group or others any access (`install -m 600`, or systemd's
/// `LoadCredential=`, make an owner-only file).
pub(crate) fn read_secret_file(path: &Path) -> Result<Vec<u8>, SecretError> {
    let unreadable = |source| SecretError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(unreadable)?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::NotOwnerOnly {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
    }
    std::fs::read(path).map_err(unreadable)
}

/// [`read_secret_file`] as text, without its final line break(s).
pub(crate) fn read_secret_text(path: &Path) -> Result<String, SecretError> {
    let bytes = read_secret_file(path)?;
    let text = String::from_utf8(bytes).map_err(|_| SecretError::NotUtf8 {
        path: path.to_path_buf(),
    })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(test)]
mod quoting {
    use super::*;

    #[test]
    fn a_parsers_quotes_are_left_out_and_its_expectation_kept() {
        for (message, want) in [
            (
                "invalid type: string \"MIGHAgEAMBMG\", expected struct KeyFile at line 1 column 1",
                "invalid type: string (not shown: a secret file), expected struct KeyFile at line 1 column 1",
            ),
            (
                "tokens[0].verbs[0]: unknown variant `s3cret, expected x`, expected one of `drain`, `undrain`",
                "tokens[0].verbs[0]: unknown variant (not shown: a secret file), expected one of `drain`, `undrain`",
            ),
            (
                "invalid type: string \"a\\\"b\"",
                "invalid type: string (not shown: a secret file)",
            ),
            (
                "did not find expected key at line 3 column 1",
                "did not find expected key at line 3 column 1",
            ),
        ] {
            assert_eq!(unquoted(message), want);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_an_owner_only_file_is_read() {
        let dir = std::env::temp_dir().join(format!("steerdns-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "s3cret\n").unwrap();
        let chmod = |mode| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode));
        for mode in [0o644, 0o640, 0o604, 0o620, 0o660] {
            chmod(mode).unwrap();
            let e = read_secret_text(&f).unwrap_err().to_string();
            assert!(
                e.contains("owner only") && e.contains(&format!("{mode:o}")),
                "{e}"
            );
        }
        for mode in [0o600, 0o400] {
            chmod(mode).unwrap();
            assert_eq!(read_secret_text(&f).unwrap(), "s3cret", "mode {mode:o}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
