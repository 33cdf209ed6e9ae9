//! Secrets read from files (the etcd password, a TLS private key, the API token): one
//! check for all of them. A secret file must be readable by its owner only: a file
//! its group or every user may read (or write) is refused, with the mode and the fix.

use std::path::Path;

/// The bytes of the secret file `path`, or why it is refused: unreadable, or a mode
/// that gives its group or others any access (`install -m 600`, or systemd's
/// `LoadCredential=`, make an owner-only file).
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| format!("{shown}: {e}"))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "{shown}: a secret must be readable by its owner only, this one has mode {:o}: chmod 600 it (or install -m 600)",
                mode & 0o777
            ));
        }
    }
    std::fs::read(path).map_err(|e| format!("{shown}: {e}"))
}

/// [`read_secret_file`] as text, without its final line break(s).
pub fn read_secret_text(path: &Path) -> Result<String, String> {
    let bytes = read_secret_file(path)?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8", path.display()))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
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
            let e = read_secret_text(&f).unwrap_err();
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
