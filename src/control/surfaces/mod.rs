//! Control plane, what people and scripts reach over HTTP on `--api`: the admin API, the status
//! page and the manual. (Content steering for players is its own room, `content/`.)
//!
//! | room | holds |
//! |---|---|
//! | `api` | the admin API: its routes (`ROUTES`), tokens, limits |
//! | `status` | the status page, `GET /` |
//! | `book` | the manual at `/book/` |
//! | `policy` | the policy versions: `GET /v1/policy`, `POST /v1/policy`, `/rollback`, `/halt` |

pub mod api;
pub(crate) mod ask;
pub mod book;
pub(crate) mod history;
pub(crate) mod mutations;
pub(crate) mod policy;
pub(crate) mod status;
