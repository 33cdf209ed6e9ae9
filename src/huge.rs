//! Large tables the data plane reads at random, on huge pages.
//!
//! A query touches a few bytes in each of several large tables (the plan's choices and
//! country tables). On 4 KiB pages each touch can also be a TLB miss, which in a
//! virtual machine costs a two-dimensional page walk; at low query rates, when every
//! query finds the TLB cold, those walks are most of what a large policy costs over a
//! small one. The kernel maps memory on 2 MiB pages when it is aligned to them and
//! advised with `madvise(MADV_HUGEPAGE)` before it is first touched (transparent huge
//! pages in `madvise` mode, Debian's default; with THP off it stays on small pages).
//!
//! [`Table`] is a vector of fixed capacity that does this when it is large.
//! [`give_back`] returns the memory a load freed to the system; [`tune_allocator`] keeps
//! the allocator's heaps few and its large blocks apart.

use std::alloc::{self, Layout};
use std::ops::Deref;
use std::ptr::NonNull;

/// Returns to the system the heap memory freed since the last call: a load (the
/// first, or a reload) builds its tables through temporaries many times their size,
/// which glibc's allocator keeps for reuse, in the middle of its heap and arenas,
/// where only `malloc_trim` can release it. Called by the control plane after each
/// load, never on the query path.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How many heaps (arenas) glibc's allocator may keep: see [`tune_allocator`].
pub const ARENAS: i32 = 2;

/// Allocations from this size on get a mapping of their own: see [`tune_allocator`].
pub const MMAP_FROM: i32 = 1 << 20;

/// Sets glibc's allocator up for a long-running server whose memory must stay bounded;
/// called first thing in `main`, before any thread starts. A setting given in the
/// environment (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`) stands instead.
///
/// - At most [`ARENAS`] heaps. Left alone, glibc gives each thread that allocates under
///   contention a heap of its own, up to eight per core, and each keeps what was freed
///   in it. The server runs a UDP thread per core and listening address and a tokio
///   worker per core, so its memory grew with the machine: the soak measured 61 MB on 2
///   cores and 99 MB with the threads of 8 (`--udp-sockets 8`,
///   `TOKIO_WORKER_THREADS=8`), 59 MB for the same threads on 2 heaps. The fast path
///   does not allocate, and glibc's per-thread cache serves the small allocations of
///   the full path without taking a heap's lock.
/// - Allocations of [`MMAP_FROM`] or more mapped on their own, and unmapped when freed.
///   By default glibc raises that threshold to the largest block freed so far (16 MB
///   once a load has freed its temporaries), after which a reload's temporaries are
///   carved out of the heaps and left there in pieces; a fixed threshold also keeps the
///   heaps' top trimmed at glibc's 128 KiB default.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (env, param, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, ARENAS),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, MMAP_FROM),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only sets a parameter of the allocator; no thread has
            // started.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

/// The size of a huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Tables smaller than this stay on ordinary pages: a huge page would cost more memory
/// than the TLB misses it saves. (A plan of 1,000 names has four tables past it, which
/// take 8 MiB of huge pages.)
const MIN_BYTES: usize = 64 << 10;

/// A vector whose capacity is fixed when it is made: past [`MIN_BYTES`] its items sit
/// in an allocation aligned to a huge page and advised as huge pages.
pub enum Table<T> {
    Small(Vec<T>),
    Huge(Huge<T>),
}

/// Items in an allocation of `cap` items aligned to a huge page; the first `len` are
/// initialised.
pub struct Huge<T> {
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
    layout: Layout,
}

// SAFETY: `Huge<T>` owns its items as a `Vec<T>` does.
unsafe impl<T: Send> Send for Huge<T> {}
// SAFETY: as above; shared access only hands out `&[T]`.
unsafe impl<T: Sync> Sync for Huge<T> {}

impl<T> Table<T> {
    /// An empty table with room for `cap` items.
    pub fn with_capacity(cap: usize) -> Table<T> {
        let small = || Table::Small(Vec::with_capacity(cap));
        let Ok(items) = Layout::array::<T>(cap) else {
            return small();
        };
        if items.size() < MIN_BYTES {
            return small();
        }
        // Whole huge pages: the advice below covers exactly this allocation, never
        // memory the allocator hands to someone else.
        let Some(layout) = items
            .size()
            .checked_next_multiple_of(HUGE_PAGE)
            .and_then(|size| Layout::from_size_align(size, HUGE_PAGE.max(items.align())).ok())
        else {
            return small();
        };
        // SAFETY: the layout's size is at least MIN_BYTES, so not zero.
        let Some(ptr) = NonNull::new(unsafe { alloc::alloc(layout) }.cast::<T>()) else {
            return small();
        };
        advise(ptr.as_ptr().cast(), layout.size());
        Table::Huge(Huge {
            ptr,
            len: 0,
            cap,
            layout,
        })
    }

    /// Appends `item`. A full huge table moves to an ordinary vector (callers size
    /// tables exactly; this only keeps a wrong size from being an error).
    pub fn push(&mut self, item: T) {
        match self {
            Table::Small(v) => v.push(item),
            Table::Huge(h) if h.len < h.cap => {
                // SAFETY: `len < cap`, so the slot is inside the allocation and unused.
                unsafe { h.ptr.as_ptr().add(h.len).write(item) };
                h.len += 1;
            }
            Table::Huge(h) => {
                let mut v = Vec::with_capacity(h.cap * 2 + 1);
                // SAFETY: the first `len` items are initialised; they are moved out
                // and `len` set to 0, so that dropping `h` does not drop them again.
                unsafe {
                    v.extend(
                        std::slice::from_raw_parts(h.ptr.as_ptr(), h.len)
                            .iter()
                            .map(|x| std::ptr::read(x)),
                    );
                }
                h.len = 0;
                v.push(item);
                *self = Table::Small(v);
            }
        }
    }

    /// Whether the items sit on memory advised as huge pages.
    pub fn is_huge(&self) -> bool {
        matches!(self, Table::Huge(_))
    }
}

impl<T: Clone> Table<T> {
    pub fn extend_from_slice(&mut self, items: &[T]) {
        for item in items {
            self.push(item.clone());
        }
    }
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table::Small(Vec::new())
    }
}

impl<T> Deref for Table<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Table::Small(v) => v,
            // SAFETY: the first `len` items are initialised and owned by the table.
            Table::Huge(h) => unsafe { std::slice::from_raw_parts(h.ptr.as_ptr(), h.len) },
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T> Drop for Huge<T> {
    fn drop(&mut self) {
        // SAFETY: the first `len` items are initialised and dropped once; the memory
        // was allocated with `layout`.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            alloc::dealloc(self.ptr.as_ptr().cast(), self.layout);
        }
    }
}

/// Asks for huge pages over `[start, start + len)`: an allocation of whole huge pages.
#[cfg(target_os = "linux")]
fn advise(start: *mut u8, len: usize) {
    debug_assert!((start as usize).is_multiple_of(HUGE_PAGE) && len.is_multiple_of(HUGE_PAGE));
    // SAFETY: advice about memory this process owns (a fresh allocation of exactly
    // `len` bytes); MADV_HUGEPAGE never changes its contents, and failing leaves it as
    // it was.
    unsafe {
        libc::madvise(
            start.cast(),
            len.min(isize::MAX as usize),
            libc::MADV_HUGEPAGE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn advise(_start: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn small_tables_are_vectors_and_large_ones_aligned_to_a_huge_page() {
        assert!(!Table::<u64>::with_capacity(100).is_huge());
        let n = (1 << 20) / 8;
        let mut t = Table::<u64>::with_capacity(n);
        assert!(t.is_huge());
        for i in 0..n as u64 {
            t.push(i);
        }
        assert_eq!(t.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(t.len(), n);
        assert_eq!(t.iter().sum::<u64>(), (n as u64 - 1) * n as u64 / 2);
    }

    #[test]
    fn the_allocation_is_whole_huge_pages_so_the_advice_stays_inside_it() {
        // Before, a 100 KiB table was a 100 KiB allocation advised over 2 MiB: the
        // advice (and the huge page) covered memory of other allocations.
        for bytes in [MIN_BYTES, 100 << 10, HUGE_PAGE, HUGE_PAGE + 8] {
            let t = Table::<u64>::with_capacity(bytes / 8);
            let Table::Huge(h) = &t else {
                panic!("{bytes}: not huge")
            };
            assert_eq!(h.layout.size() % HUGE_PAGE, 0, "{bytes}");
            assert!(h.layout.size() >= bytes, "{bytes}");
            assert_eq!(h.ptr.as_ptr() as usize % HUGE_PAGE, 0, "{bytes}");
        }
    }

    #[test]
    fn a_full_table_moves_and_every_item_is_dropped_once() {
        let item = Arc::new(());
        let n = MIN_BYTES / size_of::<Arc<()>>();
        let mut t = Table::with_capacity(n);
        assert!(t.is_huge());
        for _ in 0..n + 5 {
            t.push(item.clone());
        }
        assert!(!t.is_huge());
        assert_eq!(t.len(), n + 5);
        assert_eq!(Arc::strong_count(&item), n + 6);
        drop(t);
        assert_eq!(Arc::strong_count(&item), 1);

        let mut t = Table::with_capacity(n);
        t.push(item.clone());
        drop(t);
        assert_eq!(Arc::strong_count(&item), 1);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_tables_are_advised_as_huge_pages() {
        let n = (3 << 20) / 8;
        let mut t = Table::<u64>::with_capacity(n);
        for i in 0..n as u64 {
            t.push(i);
        }
        let at = t.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        // The mapping holding the table is flagged `hg` (MADV_HUGEPAGE).
        let mut inside = false;
        let mut flagged = false;
        for line in smaps.lines() {
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            if let Some((Ok(lo), Ok(hi))) =
                range.map(|(lo, hi)| (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)))
            {
                inside = (lo..hi).contains(&at);
                continue;
            }
            if inside && line.starts_with("VmFlags:") {
                flagged |= line.split_whitespace().any(|f| f == "hg");
            }
        }
        assert!(flagged, "no `hg` flag on the mapping of {at:#x}");
    }
}
