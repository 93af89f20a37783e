//! A suffix trie of bounded depth with occurrence counts, over a set of token sequences.
//!
//! Every start position `s` of an indexed sequence contributes one path from the root, spelling
//! `tokens[s..min(s + DEPTH, len)]`; a node's `count` is the number of start positions whose path runs
//! through it, which is the number of occurrences of the string the node spells (of length at most
//! `DEPTH`). A path grows one token at a time (`extend`), and leaves whole (`remove_path`) or from some
//! depth down (`shorten_path`); a node whose count reaches 0 is freed and its slot reused.
//!
//! Invariant: a child's count never exceeds its parent's (every path through the child runs through the
//! parent), so a freed node has no children. Nodes are found by `(parent, token)` in a hash map (a
//! constant-time step whatever a node's fan-out) and enumerated through a doubly linked sibling list
//! (most recently created child first).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The deepest path: strings of up to this many tokens are counted. A match of `m` tokens leaves room
/// for `DEPTH - m` proposed ones, so 24 lets an 8-token match propose the 16 the exactness cap allows.
pub const DEPTH: usize = 24;

/// The root's index; it spells the empty string and is never freed.
pub const ROOT: u32 = 0;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    token: u32,
    count: u32,
    parent: u32,
    first_child: u32,
    next_sibling: u32,
    prev_sibling: u32,
}

/// Bytes one node in use costs at most, counting capacity left by doublings: two slots of the node
/// vector (24 bytes each), two of the free list (4 each), and its hash-map entry at the map's lowest
/// load (the map doubles when 7/8 full, so 16/7 buckets of a 16-byte key-value and a control byte).
pub const BYTES_PER_NODE_BOUND: usize = 2 * 24 + 2 * 4 + 39;

/// A multiply-xorshift hash for `(parent, token)` keys (the default SipHash is several times slower,
/// and the keys are not chosen by an adversary who could exploit collisions: they are token ids and
/// node slots, and a collision only costs a probe).
#[derive(Default)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, key: u64) {
        let x = (self.0 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

fn key(parent: u32, token: u32) -> u64 {
    (u64::from(parent) << 32) | u64::from(token)
}

pub struct Trie {
    nodes: Vec<Node>,
    free: Vec<u32>,
    children: HashMap<u64, u32, BuildHasherDefault<PairHasher>>,
}

impl Trie {
    pub fn new() -> Self {
        Trie {
            nodes: vec![Node {
                token: 0,
                count: 0,
                parent: NIL,
                first_child: NIL,
                next_sibling: NIL,
                prev_sibling: NIL,
            }],
            free: Vec::new(),
            children: HashMap::default(),
        }
    }

    /// Nodes in use, the root excluded.
    pub fn nodes_in_use(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    /// Bytes held (node slots and the map's buckets, by capacity).
    pub fn bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * 4
            + self.children.capacity() * 17 * 8 / 7
    }

    pub fn clear(&mut self) {
        self.nodes.truncate(1);
        self.nodes[0].first_child = NIL;
        self.free.clear();
        self.children.clear();
    }

    pub fn count(&self, node: u32) -> u32 {
        self.nodes[node as usize].count
    }

    pub fn token(&self, node: u32) -> u32 {
        self.nodes[node as usize].token
    }

    pub fn child(&self, parent: u32, token: u32) -> Option<u32> {
        self.children.get(&key(parent, token)).copied()
    }

    /// The child with the highest count (the most recently created on a tie), if any.
    pub fn most_frequent_child(&self, parent: u32) -> Option<u32> {
        let mut best: Option<u32> = None;
        let mut at = self.nodes[parent as usize].first_child;
        while at != NIL {
            let node = &self.nodes[at as usize];
            if best.is_none_or(|b| node.count > self.nodes[b as usize].count) {
                best = Some(at);
            }
            at = node.next_sibling;
        }
        best
    }

    /// One more path runs through `parent`'s child `token`: its count grows, or it is created.
    pub fn extend(&mut self, parent: u32, token: u32) -> u32 {
        if let Some(&child) = self.children.get(&key(parent, token)) {
            self.nodes[child as usize].count += 1;
            return child;
        }
        let first = self.nodes[parent as usize].first_child;
        let node = Node {
            token,
            count: 1,
            parent,
            first_child: NIL,
            next_sibling: first,
            prev_sibling: NIL,
        };
        let child = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if first != NIL {
            self.nodes[first as usize].prev_sibling = child;
        }
        self.nodes[parent as usize].first_child = child;
        self.children.insert(key(parent, token), child);
        child
    }

    /// One path fewer runs through `node` (which has no child left if its count reaches 0: callers go
    /// deepest first).
    fn release(&mut self, node: u32) {
        let n = &mut self.nodes[node as usize];
        n.count -= 1;
        if n.count > 0 {
            return;
        }
        let Node {
            token,
            parent,
            next_sibling,
            prev_sibling,
            ..
        } = *n;
        if prev_sibling == NIL {
            self.nodes[parent as usize].first_child = next_sibling;
        } else {
            self.nodes[prev_sibling as usize].next_sibling = next_sibling;
        }
        if next_sibling != NIL {
            self.nodes[next_sibling as usize].prev_sibling = prev_sibling;
        }
        self.children.remove(&key(parent, token));
        self.free.push(node);
    }

    /// The nodes of the path spelling `tokens` from the root (all of it: the path must exist).
    fn path(&self, tokens: impl Iterator<Item = u32>, out: &mut Vec<u32>) {
        out.clear();
        let mut at = ROOT;
        for t in tokens {
            at = self.child(at, t).expect("an indexed path exists");
            out.push(at);
        }
    }

    /// Removes the path spelling `tokens` (as inserted).
    pub fn remove_path(&mut self, tokens: impl Iterator<Item = u32>, scratch: &mut Vec<u32>) {
        self.path(tokens, scratch);
        for &node in scratch.iter().rev() {
            self.release(node);
        }
    }

    /// Cuts the path spelling `tokens` back to its first `keep` tokens; returns the node it then ends at.
    pub fn shorten_path(
        &mut self,
        tokens: impl Iterator<Item = u32>,
        keep: usize,
        scratch: &mut Vec<u32>,
    ) -> u32 {
        self.path(tokens, scratch);
        for &node in scratch[keep..].iter().rev() {
            self.release(node);
        }
        if keep == 0 {
            ROOT
        } else {
            scratch[keep - 1]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One more path spelling `tokens` from the root.
    fn insert_path(trie: &mut Trie, tokens: &[u32]) {
        tokens.iter().fold(ROOT, |at, &t| trie.extend(at, t));
    }

    #[test]
    fn counts_follow_inserts_and_removals() {
        let mut trie = Trie::new();
        let mut scratch = Vec::new();
        insert_path(&mut trie, &[1, 2, 3]);
        insert_path(&mut trie, &[1, 2, 4]);
        insert_path(&mut trie, &[1, 2, 4]);
        let a = trie.child(ROOT, 1).unwrap();
        let b = trie.child(a, 2).unwrap();
        assert_eq!((trie.count(a), trie.count(b)), (3, 3));
        let best = trie.most_frequent_child(b).unwrap();
        assert_eq!((trie.token(best), trie.count(best)), (4, 2));
        assert_eq!(trie.nodes_in_use(), 4);
        trie.remove_path([1, 2, 4].into_iter(), &mut scratch);
        trie.remove_path([1, 2, 4].into_iter(), &mut scratch);
        assert_eq!(trie.nodes_in_use(), 3);
        assert!(trie.child(b, 4).is_none());
        // A tie goes to the most recently created child.
        insert_path(&mut trie, &[1, 2, 5]);
        assert_eq!(trie.token(trie.most_frequent_child(b).unwrap()), 5);
        let end = trie.shorten_path([1, 2, 5].into_iter(), 1, &mut scratch);
        assert_eq!(end, a);
        assert_eq!(trie.count(a), 2);
        assert_eq!(trie.count(b), 1);
        trie.remove_path([1, 2, 3].into_iter(), &mut scratch);
        trie.remove_path([1].into_iter(), &mut scratch);
        assert_eq!(trie.nodes_in_use(), 0);
        // Freed slots are reused.
        let slots = trie.nodes.len();
        insert_path(&mut trie, &[7, 8]);
        assert_eq!(trie.nodes.len(), slots);
    }
}
