//! Control plane: the set a node belongs to, sharing one view through the set's store:
//! etcd for a set of nameservers and probe agents (`serve --etcd`, `agent --etcd`), or
//! memory for a single node, a set of one (`control::store`). The same code runs for
//! both; only a set of many publishes observations and performance cells, and reads
//! them from others.
//!
//! ```text
//!  prober ─▶ Local ─▶ publisher ──put (lease)──▶ etcd ◀──txn / put── controller (transitions,
//!                                                 │                   API drains, freeze)
//!                       controller ◀── Shared ◀── session: range, then watch + liveness check
//! ```
//!
//! Keys under the prefix (default `/steerdns/`), values JSON; the schema is written and
//! read in one place, `store::Key` (`control/store/key.rs`); the builders below use it:
//!
//! | key | value | written by |
//! |---|---|---|
//! | `obs/{vantage}/{cdn}` | [`SharedObservation`], under the vantage's lease (≈ 3 probe intervals) | every node and agent, each round |
//! | `timeline/{name}/{cdn}` | [`Timeline`]: direction, level at start, start time | the first node whose health flips (create-if-absent, or compare-and-swap on the revision) |
//! | `drain/{id}` | [`SharedDrain`]: the rule, who, when | the node whose API got it (a lease ends it at `until`) |
//! | `freeze` | [`Freeze`]: why, who, when | the node whose API got it |
//! | `freeze/{tenant}` | [`Freeze`] of that tenant's names | the node whose API got it |
//! | `usage/{cdn}/{day}` | [`usage::SharedUsage`]: one CDN's usage records of one UTC day (a lease of 64 days) | the node whose API or feed took them (read, merge, compare-and-swap) |
//! | `commit/{name}` | [`usage::SharedBiases`]: the commit biases of the set's latest evaluation | the first node to evaluate that period (create-if-absent, or compare-and-swap) |
//! | `perf/{node}/{name}/{region}` | [`performance::SharedCells`]: one node's performance buckets of a region's window (a lease of the window) | that node, each bucket width in which it took samples |
//! | `shift/{name}/{region}` | [`performance::SharedShift`]: the set's latest performance evaluation of a region | the first node to evaluate that period (create-if-absent, or compare-and-swap) |
//! | `cookie` | `control::cookies::SharedSecrets`: the DNS cookie secrets (current, previous, when current was made), read by every node every 2 s (`control/cookies.rs`, not through the watch) | the first node to find none (create-if-absent); the first to find it older than `--cookie-rotation-seconds` rotates it (compare-and-swap on the revision) |
//! | `policy` | [`policy::SharedPolicy`]: the policy version in force (its YAML), the instant every node serves it, the last 20 applications | the node whose API or policy file gave a new version (create-if-absent, or compare-and-swap on the version it was based on) |
//! | `versions/{version}` | the YAML of a version of the history, for a rollback (not read whole) | the node that wrote the version |
//! | `audit/{node}/{serial}` | an audit entry (an hour's lease) | the node where it happened; every node appends them to its `audit.jsonl` in revision order, so all hold the same chain |
//! | `audit-head/{node}` | [`heads::SharedHead`]: the seq and hash of the last entry of that node's `audit.jsonl` (no lease), shown by every node in `/v1/state` | that node, each second its head moved (`heads.rs`) |
//!
//! A timeline is a pure function of time ([`Timeline::at`]): every node derives the same
//! step at the same moment from the same record, so the set moves together without a
//! leader. Everything read is checked before it counts (schema, sane names, CDNs and
//! names of the policy: `scope.rs`); a key that fails is counted and ignored.
//!
//! **Fail static.** The session watches and checks liveness on one and the same member:
//! every [`LIVENESS`] a linearizable read (which a member without a quorum cannot
//! answer) that must come back within [`LIVENESS_TIMEOUT`]. A member that hangs or
//! loses its quorum moves the session to the next member; when no member answers the
//! read within [`FAIL_STATIC_AFTER`], the node fails static: it keeps the last shared
//! state it saw, its observations of others age until they no longer count, and it
//! writes no timeline: no demotion starts from its own probes alone. When etcd answers
//! again it reads everything anew and follows.
//!
//! **Writers.** Only the members named by the operator (`--members`: nodes and agents)
//! are vantage points; an observation under any other name is refused and counted.
//! etcd's roles make each member write only its own `obs/{name}/` (and a node its own
//! `audit/{name}/`, `perf/{name}/` and `audit-head/{name}`, and the shared keys): see
//! the book, `docs/book/src/user/set/security.md`.
//!
//! **Bounds.** Every key is checked against the policy in force before it counts
//! toward any cap (`scope.rs`): junk outside the policy never takes the place of a real
//! decision, and the caps left come from the policy (and [`MAX_DRAINS`]). A whole read
//! takes each kind on its own ([`Key::parts`]), a page at a time at one revision; a
//! kind of the set's decisions past [`MAX_KIND_KEYS`] is not a view: the node fails
//! static. A value over [`etcd::MAX_VALUE`] is refused without being decoded; a watch
//! batch parses only the keys it changes, and the view it publishes shares every kind
//! it did not change with the view before (each kind is an `Arc`).
//!
//! | file | holds |
//! |---|---|
//! | `records.rs` | the records above, and `Timeline::at` |
//! | `view.rs` | `SharedView`, kept by `Mirror` from the read and the watch (`SharedView::add` checks each key) |
//! | `scope.rs` | `Scope`: the policy and members every key is checked against before it counts |
//! | `refused.rs` | `Refused`: why a key does not count (its form, the policy, the members, its record) |
//! | `session.rs` | `spawn_session` (whole reads, watch, liveness, fail static) and the `Publisher` of observations |
//! | `node.rs` | `ClusterLink`: the controller's side (writes, `on_shared`, proposals) |
//! | `policy.rs` | the policy version of the set: its record, `write_policy` (compare-and-swap on the version it is based on), `fetch_version` |
//! | `usage.rs`, `performance.rs` | the usage records, commit biases and performance cells of the set |
//! | `heads.rs` | the audit heads of the members: the record, and the `HeadPublisher` of this node's |
//! | `unaudited.rs` | overrides seen without their writer's audit entry, appended to this node's log (`override_seen`) |

pub(crate) mod heads;
pub(crate) mod node;
pub(crate) mod performance;
pub(crate) mod policy;
mod records;
mod refused;
mod scope;
mod session;
mod unaudited;
pub(crate) mod usage;
mod view;
pub use crate::control::store::etcd::{self, Etcd, EtcdError, EtcdOptions};
pub use crate::control::store::{Key, Store};
pub use records::{Freeze, SharedDrain, SharedObservation, Timeline};
pub use session::{spawn_session, Publisher};
pub use view::{Link, Observed, Shared, SharedView};
mod options;
pub use options::*;
