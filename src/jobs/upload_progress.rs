//! How much of an upload is in its scratch file while it is written: the upload writer
//! (`api::upload`) reports each batch, and the device feed (`jobs::upload_to_device`) follows it.
//! It lives here, below both, so that the feed does not reach up into the API.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How much of an upload is in its file, for a reader that follows the file while it is written (the
/// device feed, `jobs::upload_to_device`). The file has its full length from the first batch on (see
/// `write_durably`), so that it can be mapped; only the first `written` bytes hold the upload.
#[derive(Default)]
pub struct Progress {
    /// (bytes written, the writer has ended)
    state: std::sync::Mutex<(u64, bool)>,
    changed: std::sync::Condvar,
    /// Set before the first batch: the writer gives the file its full length at once.
    mapped: AtomicBool,
}

impl Progress {
    /// Asks for the file at its full length from the first batch on, for a reader that maps it
    /// while it fills (before any byte is written: the claim's check does it).
    pub fn map_while_written(&self) {
        self.mapped.store(true, Ordering::Release);
    }

    /// Whether a reader asked for the file at its full length (`map_while_written`).
    pub fn maps_while_written(&self) -> bool {
        self.mapped.load(Ordering::Acquire)
    }

    /// A guard that marks the writer ended when it is dropped, whichever way the writer returns.
    pub fn end_on_drop(self: Arc<Self>) -> EndOnDrop {
        EndOnDrop(self)
    }

    /// Blocks until at least `bytes` are written (then the count written), or the writer ended
    /// before that (None: the upload stopped short, or failed).
    pub fn wait_for(&self, bytes: u64) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match *st {
                (written, _) if written >= bytes => return Some(written),
                (_, true) => return None,
                _ => st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }

    /// The writer has written `written` bytes in all.
    pub fn advance(&self, written: u64) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 = written;
        self.changed.notify_all();
    }

    /// The writer has ended (done, or failed).
    pub fn end(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.changed.notify_all();
    }
}

/// Marks the writer ended whichever way it returns.
pub struct EndOnDrop(Arc<Progress>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}
