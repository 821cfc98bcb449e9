//! A sale's group commits in flight. The book's lock is let go once a group is handed to the
//! writer thread, so the next group runs through the book while the writer commits the one
//! before; what stays serial is their ending: a group is answered only after every group sent
//! before it has ended (so no answer rests on a group that may still fail), and whoever needs
//! the book as committed (a reader, a reload) waits, holding the lock, for every group sent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;

/// Tickets of a sale's groups: taken in order under the book's lock, ended in the same order.
pub(crate) struct Pipeline {
    /// Tickets handed out (only under the book's lock).
    taken: AtomicU64,
    /// The last ticket ended (answered or failed); every ticket before it has ended too.
    ended: watch::Sender<u64>,
    /// A group failed after the lock was let go: the book may be ahead of SQLite. The next
    /// holder of the lock reloads it once every group taken has ended.
    failed: AtomicBool,
}

impl Pipeline {
    pub(crate) fn new() -> Pipeline {
        Pipeline {
            taken: AtomicU64::new(0),
            ended: watch::Sender::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// A ticket for the group about to be sent; call with the book's lock held.
    pub(crate) fn take(&self) -> Turn<'_> {
        let ticket = self.taken.fetch_add(1, Ordering::AcqRel) + 1;
        Turn {
            pipeline: self,
            ticket,
            ended: false,
        }
    }

    /// Waits, with the book's lock held (so no ticket is taken meanwhile), until every group
    /// taken has ended; true when one of them failed since the last such wait (the caller
    /// reloads the book).
    pub(crate) async fn settle(&self) -> bool {
        let taken = self.taken.load(Ordering::Acquire);
        let mut ended = self.ended.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = ended.wait_for(|e| *e >= taken).await;
        self.failed.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// One group's place in the order. Dropped without [`Turn::end`] (a panic on the way), it
/// marks the pipeline failed and ends, so that nothing waits on it for ever.
pub(crate) struct Turn<'a> {
    pipeline: &'a Pipeline,
    ticket: u64,
    ended: bool,
}

impl Turn<'_> {
    /// Waits until every group before this one has ended.
    pub(crate) async fn wait(&self) {
        let mut ended = self.pipeline.ended.subscribe();
        let _ = ended.wait_for(|e| *e + 1 >= self.ticket).await;
    }

    /// Whether a group failed since the book was last settled.
    pub(crate) fn failed(&self) -> bool {
        self.pipeline.failed()
    }

    /// Ends this group; `ok = false`: it failed (the book must be reloaded).
    pub(crate) fn end(mut self, ok: bool) {
        self.finish(ok);
    }

    fn finish(&mut self, ok: bool) {
        if !ok {
            self.pipeline.failed.store(true, Ordering::Release);
        }
        let ticket = self.ticket;
        self.pipeline.ended.send_modify(|e| *e = (*e).max(ticket));
        self.ended = true;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(false);
        }
    }
}
