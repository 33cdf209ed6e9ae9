//! Input (at load) and data plane (on lookup): how far an answer may reach past the
//! network that holds an address.
//!
//! A resolver caches a tailored answer for the network in the echoed ECS scope, so the
//! widest correct scope saves it (and its users) cache misses. The answer depends on the
//! client's place only through the policy's regions: neighbouring networks of different
//! countries that fall in the same region (both in `continent:EU`, both in the default)
//! get the same answer, and the block that holds them all may be echoed.
//!
//! Which places count as "the same" differs per steered name, and a policy may have
//! thousands of names, so what is built here is shared by all of them:
//! - every distinct place of the database gets a small index ([`Places`] is a set of
//!   them, one bit each);
//! - every block of the search tree has the set of places it holds; going up from a
//!   network, the set grows in *steps*, each the widest run of blocks with one set;
//!   steps are shared by every network below them;
//! - a steered name keeps, per answer, the set of places that get that answer
//!   (`plan`). Widening is then: follow the steps up from the client's network while
//!   each step's set lies within the answer's; stop at the first that does not.
//!
//! Space the tables do not describe (the IPv4 aliases in IPv6, anything a database
//! leaves out) is never merged into. Unknown addresses (empty networks) are a place.

use std::collections::HashMap;

/// Words of a [`Places`]: up to 511 distinct places (one cache line); a database with
/// more has its extra places share the last index, which no answer ever allows.
const WORDS: usize = 8;
const _: () = assert!(
    WORDS * 64 <= SET as usize,
    "place indexes leave the SET bit free"
);
/// The index of places beyond the first 511 (`geo::Index` gives it).
pub(super) const OTHER: u16 = (WORDS * 64 - 1) as u16;

/// A set of places, by index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Places([u64; WORDS]);

impl Places {
    pub fn insert(&mut self, i: u16) {
        self.0[usize::from(i / 64)] |= 1 << (i % 64);
    }

    /// Whether place `i` is in the set.
    ///
    /// # Hot path
    /// A shift and a mask.
    fn has(&self, i: u16) -> bool {
        self.0[usize::from(i / 64) % WORDS] >> (i % 64) & 1 == 1
    }
}

/// Where a network's steps start, set in the place a lookup returns: the widest
/// prefix whose block (around the network) holds only its own place, in the top 8
/// bits, and its first step up in the low 24 (`NO_STEP`: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start(u32);

/// Steps of a family are numbered in 24 bits (a few hundred thousand are seen).
const NO_STEP: u32 = (1 << 24) - 1;

impl Start {
    fn new(top: u8, step: u32) -> Start {
        Start(u32::from(top) << 24 | step.min(NO_STEP))
    }

    fn top(self) -> u8 {
        (self.0 >> 24) as u8
    }

    fn step(self) -> u32 {
        self.0 & NO_STEP
    }
}

impl Default for Start {
    /// No widening: the network alone.
    fn default() -> Start {
        Start::new(u8::MAX, NO_STEP)
    }
}

/// One step up from a network: the widest run of blocks holding the same places.
#[derive(Clone, Copy, Debug)]
struct Step {
    /// The places of the run's blocks: up to two inline (the usual first steps, so
    /// that a walk ending there reads nothing else), `SPARE` filling; or, with `SET`
    /// set in the first, the set's number in `Around::sets` in the other 31 bits.
    places: [u16; 2],
    /// The prefix of the run's widest block, and the next step up (`NO_STEP`: the
    /// block above is not described), as a [`Start`].
    up: Start,
}

/// Place indexes stay below 512: the top bit of `Step::places[0]` marks a set.
const SET: u16 = 0x8000;
const SPARE: u16 = u16::MAX;

/// The steps of one address family.
#[derive(Debug, Default)]
pub(crate) struct Around {
    steps: Box<[Step]>,
    /// Per set of three places or more, where its places start in `places` (and the
    /// next set's start is where they end).
    sets: Box<[u32]>,
    /// Every set's places (indexes), sorted, one after another.
    places: Box<[u16]>,
}

impl Around {
    /// The widest prefix around a network of `prefix` bits, starting its steps at
    /// `start`, whose every address is at a place in `allowed` (which holds the
    /// network's own).
    ///
    /// # Hot path
    /// A test per new place per step; the first step with a place not allowed ends it.
    pub(crate) fn widest(&self, prefix: u8, start: Start, allowed: &Places) -> u8 {
        let mut widest = prefix.min(start.top());
        let mut at = start.step();
        while let Some(step) = self.steps.get(at as usize) {
            let [a, b] = step.places;
            let ok = if a & SET == 0 {
                allowed.has(a) && (b == SPARE || allowed.has(b))
            } else {
                let set = (usize::from(a & !SET) << 16) | usize::from(b);
                let (from, to) = (self.sets[set] as usize, self.sets[set + 1] as usize);
                self.places[from..to].iter().all(|&p| allowed.has(p))
            };
            if !ok {
                break;
            }
            widest = step.up.top();
            at = step.up.step();
        }
        widest
    }
}

/// An address family's addresses as unsigned integers.
pub(crate) trait Bits: Copy + Ord {
    const BITS: u8;
    const ZERO: Self;
    /// The address with only bit `q` (counted from the top, 0-based) set.
    fn bit(q: u8) -> Self;
    fn or(self, other: Self) -> Self;
    /// The last address of the block of `prefix` bits holding `self`.
    fn last(self, prefix: u8) -> Self;
    /// The first address of the block of `prefix` bits holding `self`.
    fn first(self, prefix: u8) -> Self;
}

/// `Bits` for an unsigned integer type of `$bits` bits.
macro_rules! bits {
    ($t:ty, $bits:expr) => {
        impl Bits for $t {
            const BITS: u8 = $bits;
            const ZERO: $t = 0;
            fn bit(q: u8) -> $t {
                1 << ($bits - 1 - u32::from(q))
            }
            fn or(self, other: $t) -> $t {
                self | other
            }
            fn last(self, prefix: u8) -> $t {
                self | <$t>::MAX.checked_shr(u32::from(prefix)).unwrap_or(0)
            }
            fn first(self, prefix: u8) -> $t {
                self & !<$t>::MAX.checked_shr(u32::from(prefix)).unwrap_or(0)
            }
        }
    };
}

bits!(u32, 32);
bits!(u64, 64);
bits!(u128, 128);

/// Computes the steps of one family and each network's [`Start`]. `net(i)` is the
/// search tree's `i`th leaf of `n`: sorted by start, aligned and disjoint, each with its
/// prefix and place index. Networks that are not (a malformed database) get no widening.
///
/// Two traversals of the tree: the first gives every block its set of places, keeping
/// only those of the blocks that split (4 bytes each); the second makes the steps.
pub(crate) fn build<K: Bits>(
    n: usize,
    net: impl Fn(usize) -> (K, u8, u16),
) -> (Around, Vec<Start>) {
    let aligned = |i: usize| {
        let (s, p, _) = net(i);
        p <= K::BITS && s.first(p) == s
    };
    let ordered = |i: usize| {
        let ((a, p, _), (b, _, _)) = (net(i - 1), net(i));
        a.last(p) < b
    };
    if !(0..n).all(aligned) || !(1..n).all(ordered) {
        return (Around::default(), vec![Start::default(); n]);
    }
    let mut tree = Tree {
        net: &net,
        n,
        next: 0,
        splits: Vec::with_capacity(n),
        sets: Sets::default(),
        _k: std::marker::PhantomData,
    };
    tree.sets_of(0, K::ZERO);
    let mut walk = Walk {
        tree: &tree,
        next: 0,
        split: 0,
        runs: Vec::new(),
        starts: Vec::with_capacity(n),
    };
    walk.visit(0, K::ZERO, None);
    let Walk { runs, starts, .. } = walk;
    let Tree { splits, sets, .. } = tree;
    drop(splits);
    // Sets of one or two places go inline; the others, once each, to the arena.
    let mut arena = vec![0u32];
    let mut places = Vec::new();
    let mut numbers: HashMap<u32, u32> = HashMap::new();
    let steps = runs
        .iter()
        .map(|&(set, up)| {
            let all = &sets.all[set as usize];
            let places = match **all {
                [a] => [a, SPARE],
                [a, b] => [a, b],
                _ => {
                    let n = *numbers.entry(set).or_insert_with(|| {
                        places.extend_from_slice(all);
                        arena.push(places.len() as u32);
                        (arena.len() - 2) as u32
                    });
                    [SET | (n >> 16) as u16, n as u16]
                }
            };
            Step { places, up }
        })
        .collect();
    let around = Around {
        steps,
        sets: arena.into_boxed_slice(),
        places: places.into_boxed_slice(),
    };
    (around, starts)
}

/// Distinct sets of places (sorted indexes), numbered as first seen.
#[derive(Default)]
struct Sets {
    ids: HashMap<Box<[u16]>, u32>,
    all: Vec<Box<[u16]>>,
}

impl Sets {
    fn id(&mut self, set: Box<[u16]>) -> u32 {
        if let Some(&id) = self.ids.get(&set) {
            return id;
        }
        let id = self.all.len() as u32;
        self.all.push(set.clone());
        self.ids.insert(set, id);
        id
    }

    /// The set of one place, if it has a number.
    fn single(&self, place: u16) -> Option<u32> {
        self.ids.get(&[place][..]).copied()
    }

    fn union(&mut self, a: u32, b: u32) -> u32 {
        if a == b {
            return a;
        }
        let (x, y) = (&self.all[a as usize], &self.all[b as usize]);
        let mut merged = Vec::with_capacity(x.len() + y.len());
        let (mut i, mut j) = (0, 0);
        while i < x.len() || j < y.len() {
            let next = match (x.get(i), y.get(j)) {
                (Some(&p), Some(&q)) if p == q => {
                    i += 1;
                    j += 1;
                    p
                }
                (Some(&p), Some(&q)) if p < q => {
                    i += 1;
                    p
                }
                (Some(&p), None) => {
                    i += 1;
                    p
                }
                (_, Some(&q)) => {
                    j += 1;
                    q
                }
                (None, None) => break,
            };
            merged.push(next);
        }
        self.id(merged.into_boxed_slice())
    }
}

/// The search tree's blocks that split, in pre-order, each with its set of places
/// (`NONE`: it holds space no network describes). A network's own set is that of its
/// place alone, and a gap has none: neither is kept.
struct Tree<'f, K, F> {
    net: &'f F,
    n: usize,
    /// The next network not yet visited.
    next: usize,
    splits: Vec<u32>,
    sets: Sets,
    _k: std::marker::PhantomData<K>,
}

/// No set: the block holds space no network describes.
const NONE: u32 = u32::MAX;

/// What a block of the tree is, seen from a traversal that has visited every network
/// before `next`.
enum Block {
    /// Network `next` is this block.
    Network,
    /// No network starts inside it: space the tables do not describe.
    Gap,
    /// Networks lie inside: look at both halves.
    Split,
}

impl<K: Bits, F: Fn(usize) -> (K, u8, u16)> Tree<'_, K, F> {
    fn block(&self, next: usize, prefix: u8, start: K) -> Block {
        if next >= self.n {
            return Block::Gap;
        }
        match (self.net)(next) {
            (s, p, _) if s == start && p == prefix => Block::Network,
            (s, _, _) if s <= start.last(prefix) && prefix < K::BITS => Block::Split,
            _ => Block::Gap,
        }
    }

    /// Fills `splits` for the block and everything under it; returns the block's set.
    fn sets_of(&mut self, prefix: u8, start: K) -> Option<u32> {
        match self.block(self.next, prefix, start) {
            Block::Network => {
                let own = (self.net)(self.next).2;
                self.next += 1;
                Some(self.sets.id(Box::new([own])))
            }
            Block::Gap => None,
            Block::Split => {
                let id = self.splits.len();
                self.splits.push(NONE);
                let left = self.sets_of(prefix + 1, start);
                let right = self.sets_of(prefix + 1, start.or(K::bit(prefix)));
                let set = left.zip(right).map(|(l, r)| self.sets.union(l, r));
                self.splits[id] = set.unwrap_or(NONE);
                set
            }
        }
    }
}

/// The same traversal again, now that every block's set is known: the steps, and each
/// network's start.
struct Walk<'t, 'f, K, F> {
    tree: &'t Tree<'f, K, F>,
    next: usize,
    /// The pre-order index of the next block that splits.
    split: usize,
    /// The steps: each run's set (in `Tree::sets`), and its widest prefix and next
    /// step up.
    runs: Vec<(u32, Start)>,
    starts: Vec<Start>,
}

/// The block above the one visited: its set, and the step of its run (`None`: the
/// block is not described).
type Above = Option<(u32, u32)>;

impl<K: Bits, F: Fn(usize) -> (K, u8, u16)> Walk<'_, '_, K, F> {
    fn visit(&mut self, prefix: u8, start: K, above: Above) {
        match self.tree.block(self.next, prefix, start) {
            Block::Network => {
                let own = self.tree.sets.single((self.tree.net)(self.next).2);
                self.next += 1;
                let start = match above {
                    // The run above holds only this network's place: start past it.
                    Some((a, step)) if Some(a) == own => self.runs[step as usize].1,
                    Some((_, step)) => Start::new(prefix, step),
                    None => Start::new(prefix, NO_STEP),
                };
                self.starts.push(start);
            }
            Block::Gap => {}
            Block::Split => {
                let set = self.tree.splits[self.split];
                self.split += 1;
                let here = (set != NONE).then(|| match above {
                    // The same places as the block above: the same run.
                    Some((a, step)) if a == set => (set, step),
                    _ => {
                        let next = above.map_or(NO_STEP, |(_, step)| step);
                        self.runs.push((set, Start::new(prefix, next)));
                        (set, (self.runs.len() - 1) as u32)
                    }
                });
                self.visit(prefix + 1, start, here);
                self.visit(prefix + 1, start.or(K::bit(prefix)), here);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8-bit addresses in a u32's top byte, for readable trees; places by index.
    fn net(a: u32, prefix: u8, place: u16) -> (u32, u8, u16) {
        (a << 24, prefix, place)
    }

    fn set(places: &[u16]) -> Places {
        let mut s = Places::default();
        for &p in places {
            s.insert(p);
        }
        s
    }

    fn widest(built: &(Around, Vec<Start>), nets: &[(u32, u8, u16)], i: usize, ok: &[u16]) -> u8 {
        built.0.widest(nets[i].1, built.1[i], &set(ok))
    }

    #[test]
    fn a_network_reaches_as_far_as_its_places_are_allowed() {
        // 0/1 A, 128/2 B, 192/3 C, 224/3 D.
        let nets = [net(0, 1, 0), net(128, 2, 1), net(192, 3, 2), net(224, 3, 3)];
        let built = build(nets.len(), |i| nets[i]);
        assert_eq!(built.1.len(), 4);
        assert_eq!(widest(&built, &nets, 2, &[2]), 3);
        assert_eq!(widest(&built, &nets, 2, &[2, 3]), 2);
        assert_eq!(widest(&built, &nets, 2, &[1, 2, 3]), 1);
        assert_eq!(widest(&built, &nets, 2, &[0, 1, 2, 3]), 0);
        // Allowing A but not D does not get C past D's /2.
        assert_eq!(widest(&built, &nets, 2, &[0, 1, 2]), 3);
        assert_eq!(widest(&built, &nets, 0, &[0, 1, 2]), 1);
        assert_eq!(widest(&built, &nets, 0, &[0, 1, 2, 3]), 0);
    }

    #[test]
    fn runs_of_one_place_are_one_step_and_gaps_end_the_walk() {
        // 0/3 A, 32/3 A, 64/2 A: A's /1 holds only A. 128/2 not described; 192/2 B.
        let nets = [net(0, 3, 0), net(32, 3, 0), net(64, 2, 0), net(192, 2, 1)];
        let built = build(nets.len(), |i| nets[i]);
        assert_eq!(built.1.len(), 4);
        assert_eq!(widest(&built, &nets, 0, &[0]), 1);
        assert_eq!(widest(&built, &nets, 0, &[0, 1]), 1, "the gap stops it");
        assert_eq!(widest(&built, &nets, 3, &[0, 1]), 2);
    }

    #[test]
    fn many_places_in_one_block() {
        // 64 networks of /8 bits... /6 each, all different places, then the same again.
        let nets: Vec<(u32, u8, u16)> = (0..64u32).map(|i| net(i * 4, 6, i as u16)).collect();
        let built = build(nets.len(), |i| nets[i]);
        let all: Vec<u16> = (0..64).collect();
        assert_eq!(widest(&built, &nets, 5, &all), 0);
        assert_eq!(widest(&built, &nets, 5, &all[..32]), 1);
        assert_eq!(widest(&built, &nets, 5, &all[4..8]), 4);
        assert_eq!(widest(&built, &nets, 40, &all[32..]), 1);
    }

    #[test]
    fn malformed_tables_get_no_widening() {
        let nets = [net(0, 1, 0), net(64, 2, 1)];
        let built = build(nets.len(), |i| nets[i]);
        assert_eq!(widest(&built, &nets, 1, &[0, 1]), 2);
    }

    #[test]
    fn places_beyond_the_index_are_never_allowed() {
        let mut all = Places::default();
        for i in 0..OTHER {
            all.insert(i);
        }
        assert!(!all.has(OTHER));
        assert!(all.has(OTHER - 1));
    }
}
