//! Unit tests of the audit log: pages through the index against a scan, the index kept
//! while appending against the one read at start, rotation, the revision to go on from.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use super::chain::seal;
use super::index::{page, Index, Point, Reader};
use super::log::{tail_of, Log};
use super::*;

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("steerdns-audit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(path: &Path, max: u64, n: u64) -> Reader {
    let index = Arc::new(RwLock::new(Index::build(path).unwrap()));
    let mut log = Log {
        path: path.to_path_buf(),
        node: "t".into(),
        max_bytes: max,
        seq: 0,
        prev: GENESIS.into(),
        size: 0,
        index: index.clone(),
    };
    let (seq, prev, _) = tail_of(path).unwrap();
    (log.seq, log.prev) = (seq, prev);
    log.size = std::fs::metadata(path).map_or(0, |m| m.len());
    for i in 0..n {
        let Value::Object(m) = json!({"kind": "test", "i": i}) else {
            unreachable!()
        };
        log.append(m).unwrap();
    }
    Reader {
        path: path.to_path_buf(),
        index,
    }
}

/// The seqs of a page.
fn seqs(p: &Page) -> Vec<u64> {
    p.entries
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

#[test]
fn pages_seek_through_the_index_of_a_large_log() {
    // 100,000 entries written as the append thread writes them (sealed, chained),
    // without a sync per line, in one file; then indexed as at start.
    let d = dir("index");
    let path = d.join("audit.jsonl");
    let mut text = String::new();
    let mut prev = GENESIS.to_string();
    for seq in 1..=100_000u64 {
        let Value::Object(mut m) =
            json!({"kind": "test", "node": "t", "at_unix_ms": seq, "seq": seq, "prev": prev})
        else {
            unreachable!()
        };
        m.insert("detail".into(), json!({"seq": 7, "i": seq}));
        let (line, hash) = seal(&m);
        text.push_str(&line);
        prev = hash;
    }
    std::fs::write(&path, &text).unwrap();
    let index = Index::build(&path).unwrap();
    // The first entry, and every 256th: 1 + 390 places.
    assert_eq!(index.points.len(), 1 + 100_000 / INDEX_EVERY as usize);
    assert_eq!(
        index.points[0],
        Point {
            seq: 1,
            gen: KEEP as u64,
            offset: 0
        }
    );
    assert_eq!(index.size, text.len() as u64);
    let reader = Reader {
        path: path.clone(),
        index: Arc::new(RwLock::new(index)),
    };
    for after in [
        0, 1, 254, 255, 256, 257, 511, 512, 767, 1000, 4095, 4096, 50_000, 99_743, 99_744, 99_999,
        100_000, 250_000,
    ] {
        for limit in [1, 100, 256, 257, 1000] {
            let p = reader.page(after, limit).unwrap();
            let want: Vec<u64> = (after + 1..=100_000).take(limit).collect();
            assert_eq!(seqs(&p), want, "after={after} limit={limit}");
            assert_eq!(
                p.more,
                after + (limit as u64) < 100_000,
                "after={after} limit={limit}"
            );
            assert_eq!(p.next_after, want.last().copied().unwrap_or(after));
            // Sought, not scanned: at most the 256 entries before the first one
            // wanted are read, plus the page and the one after it.
            assert!(
                p.lines_read <= INDEX_EVERY as usize + limit + 1,
                "after={after} limit={limit}: {} lines read",
                p.lines_read
            );
            // The same page as a scan of the whole log.
            let scanned = page(&path, after, limit).unwrap();
            assert_eq!(seqs(&scanned), seqs(&p));
        }
    }
    // Following `next_after` from 0 walks every entry once, across the places.
    let (mut after, mut seen) = (0, 0u64);
    loop {
        let p = reader.page(after, 1000).unwrap();
        for s in seqs(&p) {
            seen += 1;
            assert_eq!(s, seen);
        }
        after = p.next_after;
        if !p.more {
            break;
        }
    }
    assert_eq!(seen, 100_000);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_index_kept_while_appending_and_rotating_is_the_index_read_at_start() {
    let d = dir("index-rotate");
    let path = d.join("audit.jsonl");
    // Small files: entries rotate through every file kept and out of the oldest.
    let reader = write(&path, 4_000, 300);
    let kept = reader.index.read().unwrap().points.clone();
    let gen = reader.index.read().unwrap().gen;
    assert!(gen > 2 * KEEP as u64, "rotated {gen} times");
    let built = Index::build(&path).unwrap();
    let shift = gen - built.gen;
    let rebased: Vec<Point> = built
        .points
        .iter()
        .map(|p| Point {
            gen: p.gen + shift,
            ..*p
        })
        .collect();
    assert_eq!(kept, rebased, "kept while appending vs read at start");
    let first = verify(&files(&path)).unwrap().first_seq;
    assert!(first < 256, "seq 256 is in a file kept: {first}");
    assert!(
        kept.iter().any(|p| p.seq == 256 && p.offset > 0),
        "{kept:?}"
    );
    for after in [0, first - 1, first, 255, 256, 257, 280, 299, 300] {
        let p = reader.page(after, 50).unwrap();
        let want: Vec<u64> = (after.max(first - 1) + 1..=300).take(50).collect();
        assert_eq!(seqs(&p), want, "after={after}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn rotation_carries_the_chain_across_files() {
    let d = dir("rotate");
    let path = d.join("audit.jsonl");
    write(&path, 600, 30);
    let all = files(&path);
    assert_eq!(all.len(), KEEP + 1, "{all:?}");
    let v = verify(&all).unwrap();
    assert_eq!(v.last_seq, 30);
    assert!(v.first_seq > 1, "the oldest files were dropped: {v:?}");
    // A restart continues the chain where it ended.
    write(&path, 600, 2);
    assert_eq!(verify(&files(&path)).unwrap().last_seq, 32);
    // Without its predecessors, a file's first line says what is missing.
    let e = verify(std::slice::from_ref(&path)).unwrap_err();
    assert!(e.line == 1 && e.what.contains("removed"), "{e}");
    // Two files out of order break the chain at the first line of the second.
    let mut wrong = files(&path);
    wrong.swap(1, 2);
    let e = verify(&wrong).unwrap_err();
    assert_eq!((e.file.clone(), e.line), (wrong[1].clone(), 1), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_revision_to_go_on_from_is_the_last_shared_entrys() {
    let d = dir("tail-rev");
    let path = d.join("audit.jsonl");
    let index = Arc::new(RwLock::new(Index::default()));
    let mut log = Log {
        path: path.clone(),
        node: "ns1".into(),
        max_bytes: MAX_BYTES,
        seq: 0,
        prev: GENESIS.into(),
        size: 0,
        index,
    };
    let obj = |v: Value| match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    };
    log.append(obj(json!({"kind": "drain", "rev": 41})))
        .unwrap();
    log.append(obj(json!({"kind": "step", "rev": 42}))).unwrap();
    // This node's own entry (an override seen without its writer's entry) last.
    log.append(obj(json!({"kind": "override_seen"}))).unwrap();
    let (seq, hash, rev) = tail_of(&path).unwrap();
    assert_eq!((seq, hash, rev), (3, log.prev.clone(), 42));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_page_starts_after_the_seq_asked() {
    let d = dir("page");
    let path = d.join("audit.jsonl");
    write(&path, 600, 12);
    let p = page(&path, 3, 5).unwrap();
    let seqs: Vec<u64> = p
        .entries
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![4, 5, 6, 7, 8]);
    assert!(p.more);
    assert_eq!(p.next_after, 8);
    let p = page(&path, 8, 100).unwrap();
    assert_eq!(p.entries.len(), 4);
    assert!(!p.more);
    let _ = std::fs::remove_dir_all(&d);
}
