//! Input (loading): a bound on the walk of a MaxMind DB search tree, checked before
//! the walk. A tree of `node_count` nodes has at most `node_count + 1` networks, and
//! a walk visits each node once (the IPv4 subtree of an IPv6 database a few times more,
//! through its aliases). A crafted file whose nodes share children, or point back up
//! the tree, describes exponentially many networks in a few hundred bytes: walking it
//! would take the memory of every network and hours, or never end. So the nodes a walk
//! would visit are counted first, without decoding anything, and a tree past
//! [`visit_bound`] (derived from its node count, itself bounded by the file's size,
//! and never above [`MAX_NETWORKS`] networks) is refused at once, when
//! [`super::mmdb::open`] opens the file.

/// More networks than any real geo or ASN database holds (GeoIP2 City: about 10 M).
pub(crate) const MAX_NETWORKS: usize = 50_000_000;

/// The node visits a walk of a sound tree of `node_count` nodes can make: each node
/// once, the IPv4 subtree of an IPv6 tree up to three times more (through its aliases
/// `::ffff:0:0/96`, `2001::/32`, `2002::/16`), and slack.
pub(crate) fn visit_bound(node_count: usize) -> usize {
    node_count
        .saturating_mul(6)
        .saturating_add(256)
        .min(2 * MAX_NETWORKS)
}

/// Why a search tree is refused before it is walked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    /// More steps than its nodes allow: shared children or a loop.
    #[error(
        "corrupt search tree: its {node_count} nodes lead to more than {bound} \
         steps of a walk, so its nodes share children or loop (a crafted or \
         damaged file); refused before walking it"
    )]
    Loops { node_count: usize, bound: usize },
    /// A record points past the end of the file.
    #[error("corrupt search tree: node {node} is not in the file")]
    NodeOutside { node: usize },
}

/// Counts the node visits of a walk of the search tree at the start of `bytes` (the
/// whole file, as `maxminddb` validated it: the tree lies within it); an error when
/// they pass [`visit_bound`].
pub(crate) fn check(
    bytes: &[u8],
    node_count: usize,
    record_size: u16,
    ip_version: u16,
) -> Result<usize, TreeError> {
    let node_bytes = usize::from(record_size) / 4;
    let depth = if ip_version == 6 { 128 } else { 32 };
    let bound = visit_bound(node_count);
    let record = |node: usize, right: bool| -> Option<usize> {
        let at = node.checked_mul(node_bytes)?;
        let b = bytes.get(at..at + node_bytes)?;
        let value = match (record_size, right) {
            (24, false) => u32::from_be_bytes([0, b[0], b[1], b[2]]),
            (24, true) => u32::from_be_bytes([0, b[3], b[4], b[5]]),
            (28, false) => u32::from_be_bytes([b[3] >> 4, b[0], b[1], b[2]]),
            (28, true) => u32::from_be_bytes([b[3] & 0x0f, b[4], b[5], b[6]]),
            (32, false) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            (32, true) => u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            _ => return None,
        };
        usize::try_from(value).ok()
    };
    let mut visits = 0usize;
    let mut stack: Vec<(usize, u8)> = vec![(0, 0)];
    while let Some((node, bit)) = stack.pop() {
        visits += 1;
        if visits > bound {
            return Err(TreeError::Loops { node_count, bound });
        }
        for right in [false, true] {
            let Some(next) = record(node, right) else {
                return Err(TreeError::NodeOutside { node });
            };
            if next < node_count && bit + 1 < depth {
                stack.push((next, bit + 1));
            }
        }
    }
    Ok(visits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree of 24-bit records: `nodes[i] = (left, right)`.
    fn tree(nodes: &[(u32, u32)]) -> Vec<u8> {
        let mut b = Vec::new();
        for &(l, r) in nodes {
            b.extend_from_slice(&l.to_be_bytes()[1..]);
            b.extend_from_slice(&r.to_be_bytes()[1..]);
        }
        b
    }

    #[test]
    fn a_sound_tree_is_walked_once() {
        // 3 nodes, 4 networks: 0 -> (1, 2), 1 and 2 -> leaves (3 = empty).
        let b = tree(&[(1, 2), (3, 3), (3, 3)]);
        assert_eq!(check(&b, 3, 24, 4), Ok(3));
    }

    #[test]
    fn shared_children_and_loops_are_refused() {
        // Each node's two children are the next node: 2^24 networks from 24 nodes.
        let shared: Vec<(u32, u32)> = (1..=24).map(|i| (i, i)).collect();
        let e = check(&tree(&shared), 24, 24, 4).unwrap_err();
        assert!(matches!(e, TreeError::Loops { node_count: 24, .. }));
        assert!(e.to_string().contains("share children or loop"), "{e}");
        // A node pointing to itself: 2^128 paths.
        let e = check(&tree(&[(0, 0)]), 1, 24, 6).unwrap_err();
        assert!(e.to_string().contains("share children or loop"), "{e}");
        // A record past the file.
        assert_eq!(
            check(&tree(&[(1, 1)]), 2, 24, 4),
            Err(TreeError::NodeOutside { node: 1 })
        );
    }
}
