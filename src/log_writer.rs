//! Where `serve`'s log lines go: stderr, through a bounded queue and a thread of its own, so
//! that writing a log line never blocks or fails the thread that logs it (a release, a
//! signal handler), whatever happened to stderr.
//!
//! A pipe whose reader died (`serve 2>&1 | head -3`, a log shipper that crashed) answers
//! every write with `EPIPE`; a pipe nobody reads fills and then blocks every write. Written
//! in place, the first made tracing-subscriber report the failed write with `eprintln!`,
//! which panics on a closed stderr, in whichever task logged (the SIGTERM handler among
//! them, so `serve` never stopped); the second would stall every thread that logs. Here a
//! line is handed to the queue without waiting: when the queue is full (the writer is stuck
//! on a full pipe) or the writer is gone (stderr failed, so it stopped), the line is
//! dropped and counted in `harness_log_lines_dropped_total`.
//!
//! Entry point: [`stderr`] gives the [`LossyStderr`] writer and its [`LogFlush`]; `serve`
//! calls [`LogFlush::flush`] before it exits, which waits a bounded time for the queue.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Log lines that may wait for the writer thread; past them lines are dropped.
pub const QUEUE_LINES: usize = 16_384;

/// Counts shared by the writers and the writer thread.
#[derive(Default)]
struct Counts {
    /// Lines handed to the queue.
    queued: AtomicU64,
    /// Lines the thread is done with (written, or given up on once stderr failed).
    done: AtomicU64,
    /// Set when the thread stopped (stderr failed): nothing more will be written.
    closed: AtomicBool,
}

/// The `MakeWriter` of the tracing subscriber: each event is one `write` of one line.
#[derive(Clone)]
pub struct LossyStderr {
    /// The queue's sending end; the writer thread owns the receiving end, and stops when
    /// stderr fails (from then on every send fails at once and the line is dropped).
    queue: SyncSender<Vec<u8>>,
    counts: Arc<Counts>,
    /// Told how many lines were dropped (the telemetry's counter; this module stays below it).
    dropped: fn(u64),
}

/// Waits (a bounded time) for the lines queued so far to be written; held by `serve`.
pub struct LogFlush {
    counts: Arc<Counts>,
}

/// The writer and its flush handle; starts the writer thread.
/// `dropped` is told of every line dropped (e.g. `telemetry::log_lines_dropped`).
pub fn stderr(dropped: fn(u64)) -> (LossyStderr, LogFlush) {
    to(std::io::stderr(), dropped)
}

/// As [`stderr`], to any output (tests).
pub fn to(output: impl Write + Send + 'static, dropped: fn(u64)) -> (LossyStderr, LogFlush) {
    let (queue, lines) = sync_channel(QUEUE_LINES);
    let counts = Arc::new(Counts::default());
    let thread_counts = counts.clone();
    // Not joined: the process may exit while it is stuck on a full pipe. Without a thread
    // the receiver is gone and every line is dropped rather than blocking.
    let _ = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || write_lines(lines, output, &thread_counts, dropped));
    (
        LossyStderr {
            queue,
            counts: counts.clone(),
            dropped,
        },
        LogFlush { counts },
    )
}

fn write_lines(
    lines: Receiver<Vec<u8>>,
    mut output: impl Write,
    counts: &Counts,
    dropped: fn(u64),
) {
    while let Ok(line) = lines.recv() {
        let written = output.write_all(&line).and_then(|()| output.flush());
        counts.done.fetch_add(1, Ordering::AcqRel);
        if written.is_err() {
            // EPIPE, EBADF, ...: stderr is gone for good. Dropping the receiver makes
            // every later line fail to queue at once (counted as dropped).
            counts.closed.store(true, Ordering::Release);
            let left = lines.try_iter().count() as u64;
            dropped(left + 1);
            return;
        }
    }
}

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.queue.try_send(buf.to_vec()) {
            Ok(()) => {
                self.counts.queued.fetch_add(1, Ordering::AcqRel);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                (self.dropped)(1);
            }
        }
        // Always "written": a dropped line is not the caller's problem.
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LossyStderr {
    type Writer = LossyStderr;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl LogFlush {
    /// Waits until every line queued so far is written, or `within` has passed.
    pub fn flush(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let queued = self.counts.queued.load(Ordering::Acquire);
        while self.counts.done.load(Ordering::Acquire) < queued
            && !self.counts.closed.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// An output that blocks every write until released, as a full pipe does.
    struct Stuck(Arc<Mutex<()>>);

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _held = self.0.lock().unwrap();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_output_never_blocks_the_caller_lines_past_the_queue_are_dropped() {
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let (mut writer, flush) = to(Stuck(gate.clone()), |_| ());
        for _ in 0..QUEUE_LINES + 100 {
            assert_eq!(writer.write(b"a line\n").unwrap(), 7);
        }
        let queued = writer.counts.queued.load(Ordering::Acquire) as usize;
        assert!(queued <= QUEUE_LINES + 1, "{queued} queued");
        // The flush gives up at its deadline while the output is stuck.
        flush.flush(Duration::from_millis(50));
        assert!(
            writer.counts.done.load(Ordering::Acquire)
                < writer.counts.queued.load(Ordering::Acquire)
        );
        drop(held);
        flush.flush(Duration::from_secs(30));
        assert_eq!(
            writer.counts.done.load(Ordering::Acquire),
            writer.counts.queued.load(Ordering::Acquire)
        );
    }

    #[test]
    fn a_broken_output_stops_the_thread_and_later_lines_are_dropped_without_error() {
        let (mut writer, flush) = to(Broken, |_| ());
        writer.write_all(b"first\n").unwrap();
        flush.flush(Duration::from_secs(30));
        assert!(writer.counts.closed.load(Ordering::Acquire));
        for _ in 0..10 {
            writer.write_all(b"later\n").unwrap();
        }
        // Returns at once: the thread is gone, nothing will be written.
        flush.flush(Duration::from_secs(600));
    }
}
