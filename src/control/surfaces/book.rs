//! Control plane: the manual at `/book/` on the API, where the status page's links
//! lead. `serve --book` names either a directory holding the built book (mdBook's HTML,
//! what `scripts/book.sh` writes to `docs/book/book`), served read-only, or the URL of a
//! published copy, to which `/book/PAGE` redirects. So the links work during an
//! incident without the internet when the book is on the host.
//!
//! Only files inside the directory are served: a path with an empty, `.` or `..`
//! segment, a backslash or a `%` is refused, and a file whose real path (symbolic links
//! followed) is outside the directory is not found. Files are at most
//! [`MAX_FILE_BYTES`].

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{header, Response, StatusCode};

use crate::control::http::{text, Reply};

/// The largest file served (the book's search index is the largest, about 1 MB).
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Where the manual is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Book {
    /// A directory holding the built book, served at `/book/`.
    Dir(PathBuf),
    /// A published copy (`http://` or `https://`), which `/book/PAGE` redirects to.
    Url(String),
}

impl Book {
    /// `--book`'s value: a URL when it starts with `http://` or `https://`, else a
    /// directory.
    pub fn parse(value: &str) -> Book {
        if value.starts_with("http://") || value.starts_with("https://") {
            Book::Url(value.trim_end_matches('/').to_string())
        } else {
            Book::Dir(PathBuf::from(value))
        }
    }

    /// The answer to `GET /book/{page}` (`page` without the leading `/book/`).
    pub async fn get(&self, page: &str) -> Reply {
        // Segments are names: no `.`, `..` or empty one (but the last: a directory).
        let segments: Vec<&str> = page.split('/').collect();
        let last = segments.len() - 1;
        let safe = !page.contains(['\\', '%', '\0'])
            && segments
                .iter()
                .enumerate()
                .all(|(i, s)| !matches!(*s, "." | "..") && (!s.is_empty() || i == last));
        if !safe {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
        match self {
            Book::Url(base) => {
                let mut r = text(StatusCode::FOUND, "the manual is published elsewhere\n");
                if let Ok(to) = header::HeaderValue::from_str(&format!("{base}/{page}")) {
                    r.headers_mut().insert(header::LOCATION, to);
                }
                r
            }
            Book::Dir(dir) => match read(dir, page).await {
                Some((bytes, kind)) => {
                    let mut r = Response::new(Full::new(Bytes::from(bytes)));
                    let headers = r.headers_mut();
                    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
                    headers.insert(
                        header::X_CONTENT_TYPE_OPTIONS,
                        header::HeaderValue::from_static("nosniff"),
                    );
                    r
                }
                None if !dir.join("index.html").is_file() => text(
                    StatusCode::NOT_FOUND,
                    "the manual is not built here: run `bash scripts/book.sh` in the source tree, \
                     or start serve with --book DIR (the built book) or --book URL (a published copy)\n",
                ),
                None => text(StatusCode::NOT_FOUND, "not found\n"),
            },
        }
    }
}

/// The file `page` of `dir` (its `index.html` for a directory) and its content type, if
/// it is a regular file inside `dir` and not too large.
async fn read(dir: &Path, page: &str) -> Option<(Vec<u8>, &'static str)> {
    let root = tokio::fs::canonicalize(dir).await.ok()?;
    let mut path = tokio::fs::canonicalize(root.join(page)).await.ok()?;
    if !path.starts_with(&root) {
        return None;
    }
    if tokio::fs::metadata(&path).await.ok()?.is_dir() {
        path = path.join("index.html");
    }
    let meta = tokio::fs::metadata(&path).await.ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    let kind = content_type(&path);
    Some((tokio::fs::read(&path).await.ok()?, kind))
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "txt" | "md" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(r: Reply) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn serves_the_files_of_the_built_book_and_nothing_outside_it() {
        let base = std::env::temp_dir().join(format!("steerdns-book-unit-{}", std::process::id()));
        let dir = base.join("book");
        std::fs::create_dir_all(dir.join("user")).unwrap();
        std::fs::write(dir.join("index.html"), "<h1>index</h1>").unwrap();
        std::fs::write(
            dir.join("user/operating.html"),
            "<h2 id=\"drains\">Drains</h2>",
        )
        .unwrap();
        std::fs::write(base.join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink(base.join("secret"), dir.join("link")).unwrap();
        let book = Book::parse(dir.to_str().unwrap());

        let r = book.get("user/operating.html").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert!(body(r).await.contains("Drains"));
        assert!(body(book.get("").await).await.contains("index"));
        for bad in [
            "../secret",
            "user/../../secret",
            "link",
            "user//operating.html",
            "%2e%2e/secret",
            "nope.html",
        ] {
            let r = book.get(bad).await;
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{bad}");
            assert!(!body(r).await.contains("outside"), "{bad}");
        }
        let missing = Book::parse(base.join("absent").to_str().unwrap());
        assert!(body(missing.get("index.html").await)
            .await
            .contains("scripts/book.sh"));
        let _ = std::fs::remove_dir_all(&base);
    }

    #[tokio::test]
    async fn a_published_copy_is_a_redirect() {
        let book = Book::parse("https://docs.example.net/steerdns/");
        let r = book.get("user/operating.html").await;
        assert_eq!(r.status(), StatusCode::FOUND);
        assert_eq!(
            r.headers()[header::LOCATION],
            "https://docs.example.net/steerdns/user/operating.html"
        );
    }
}
