//! Build script: records the git commit being built as `STEERDNS_COMMIT`, for
//! `steerdns_build_info{commit}` and `steerdns --version`.
//!
//! The commit is, in order: `STEERDNS_COMMIT` from the environment (a package built from
//! a source tarball sets it), else `git rev-parse --short=12 HEAD`, else `unknown` (no
//! git, or not a checkout). Uncommitted changes are not marked: the script reruns when
//! HEAD moves, not on every edit, so such a mark would be stale.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=STEERDNS_COMMIT");
    let commit = std::env::var("STEERDNS_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=STEERDNS_COMMIT={}", commit.trim());
}

/// The short hash of HEAD, and which files to watch so that a new commit rebuilds.
fn git_commit() -> Option<String> {
    let out = |args: &[&str]| -> Option<String> {
        let o = Command::new("git").args(args).output().ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let hash = out(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD moves when a branch is checked out; the branch's ref when a commit is made
    // (in a worktree, HEAD is in the worktree's git dir and refs in the common one). A
    // path that does not exist would rerun the script on every build: skip it.
    let mut watch = vec![out(&["rev-parse", "--git-path", "HEAD"])];
    watch.push(out(&["rev-parse", "--git-path", "packed-refs"]));
    if let Some(branch) = out(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(out(&["rev-parse", "--git-path", &branch]));
    }
    for path in watch.into_iter().flatten().map(PathBuf::from) {
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(hash)
}
