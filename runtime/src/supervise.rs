//! Supervision of the long-lived tasks of a process (watches, servers, the election, the
//! workers). A task that ends while the process is not shutting down — with an error or
//! without one — ends the process with an error: a half-alive process that stays ready is
//! worse than a restart.

use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinSet;

/// A one-shot, cloneable shutdown signal.
#[derive(Clone)]
pub struct Shutdown(watch::Sender<bool>);

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown(watch::Sender::new(false))
    }
}

impl Shutdown {
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    pub fn triggered(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once [`Shutdown::trigger`] was called.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{task} failed: {error:#}")]
    Failed {
        task: &'static str,
        error: anyhow::Error,
    },
    #[error("{task} ended unexpectedly")]
    Ended { task: &'static str },
    #[error("{task} panicked")]
    Panicked { task: &'static str },
}

/// The critical tasks of a process.
pub struct Tasks {
    /// Tasks that honour the shutdown: a clean exit waits (within the grace) until they end.
    set: JoinSet<(&'static str, anyhow::Result<()>)>,
    /// Tasks that run forever (the watches, the view store): they keep going while the
    /// others finish — the workers their pass in hand, a server its open connections — and
    /// are aborted once those are done, not waited for.
    forever: JoinSet<(&'static str, anyhow::Result<()>)>,
    shutdown: Shutdown,
}

/// A task's end: nothing while shutting down, a failure before.
fn ended(
    joined: Result<(&'static str, anyhow::Result<()>), tokio::task::JoinError>,
    shutting_down: bool,
) -> Option<TaskError> {
    match joined {
        Ok((task, Ok(()))) if shutting_down => {
            tracing::debug!(task, "task finished");
            None
        }
        Ok((task, Ok(()))) => Some(TaskError::Ended { task }),
        Ok((task, Err(error))) => Some(TaskError::Failed { task, error }),
        Err(e) => {
            tracing::error!(error = %e, "a task panicked");
            Some(TaskError::Panicked { task: "unknown" })
        }
    }
}

impl Tasks {
    pub fn new(shutdown: Shutdown) -> Self {
        Tasks {
            set: JoinSet::new(),
            forever: JoinSet::new(),
            shutdown,
        }
    }

    /// Spawns a task that must keep running until shutdown.
    pub fn spawn<F>(&mut self, name: &'static str, f: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.set.spawn(async move { (name, f.await) });
    }

    /// Spawns a task that runs forever (a watch, a watchdog): it ending before shutdown is
    /// a failure; at shutdown it runs on until the other tasks are done.
    pub fn spawn_forever<F>(&mut self, name: &'static str, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.forever.spawn(async move {
            f.await;
            (name, Ok(()))
        });
    }

    /// Waits until shutdown is triggered (then gives the tasks `grace` to finish) or a
    /// task ends first (an error, returned after shutting the others down).
    pub async fn supervise(mut self, grace: std::time::Duration) -> Result<(), TaskError> {
        let shutdown = self.shutdown.clone();
        let stop = shutdown.wait();
        tokio::pin!(stop);
        let failure = loop {
            tokio::select! {
                () = &mut stop => break None,
                Some(joined) = self.set.join_next(), if !self.set.is_empty() => {
                    if let Some(e) = ended(joined, shutdown.triggered()) {
                        break Some(e);
                    }
                }
                Some(joined) = self.forever.join_next(), if !self.forever.is_empty() => {
                    if let Some(e) = ended(joined, shutdown.triggered()) {
                        break Some(e);
                    }
                }
            }
        };
        if let Some(e) = &failure {
            tracing::error!(error = %e, "a critical task stopped; shutting down");
        }
        shutdown.trigger();
        // Tasks that honour the shutdown finish on their own, the forever ones running on
        // meanwhile; then (or at the end of the grace) everything left is aborted. After a
        // failure there is nothing worth waiting long for: restart quickly.
        let grace = if failure.is_some() {
            grace.min(std::time::Duration::from_secs(2))
        } else {
            grace
        };
        let _ = tokio::time::timeout(grace, async {
            while self.set.join_next().await.is_some() {}
        })
        .await;
        self.set.abort_all();
        self.forever.abort_all();
        // Aborted tasks end at their next await; one stuck in a blocking call is left.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
            while self.set.join_next().await.is_some() {}
            while self.forever.join_next().await.is_some() {}
        })
        .await;
        failure.map_or(Ok(()), Err)
    }
}

/// Watches the async runtime from an OS thread of its own: a task on the runtime ticks
/// every second; when no tick has come for `bound`, `on_stall` is called with how long (once
/// per stall). A runtime whose worker threads are all blocked (a deadlock, a blocking call)
/// serves nothing — not even its probes — and, without a kubelet's liveness probe, would sit
/// there silently; the binaries log the threads' states and exit 1 instead. A pause of the
/// whole process (SIGSTOP, a frozen VM) stops this thread too and is not a stall: the
/// thread's own sleep overshooting restarts the count.
pub fn watch_runtime(
    handle: &tokio::runtime::Handle,
    bound: std::time::Duration,
    on_stall: impl Fn(std::time::Duration) + Send + 'static,
) -> std::io::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    let base = Instant::now();
    let millis = move || u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX);
    let tick = Arc::new(AtomicU64::new(millis()));
    let beat = tick.clone();
    handle.spawn(async move {
        loop {
            beat.store(millis(), Ordering::Release);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let period = Duration::from_millis(500);
    std::thread::Builder::new()
        .name("rt-watchdog".into())
        .spawn(move || {
            let mut reported = false;
            loop {
                let before = Instant::now();
                std::thread::sleep(period);
                if before.elapsed() > period * 4 {
                    // This thread did not run either: the process (or machine) was paused.
                    tick.store(millis(), Ordering::Release);
                    continue;
                }
                let quiet =
                    Duration::from_millis(millis().saturating_sub(tick.load(Ordering::Acquire)));
                if quiet > bound && !reported {
                    reported = true;
                    on_stall(quiet);
                } else if quiet <= bound {
                    reported = false;
                }
            }
        })
        .map(|_| ())
}

/// How long the runtime may make no progress before [`exit_when_stalled`] ends the
/// process: far beyond any legitimate pause of a task (the chart's liveness probe, served by
/// the same runtime, restarts a stalled pod after ~30 s; this is the backstop where no
/// kubelet watches, and it says why in the log).
pub const RUNTIME_STALL_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// [`watch_runtime`] with the binaries' reaction: the threads' states on stderr, exit 1.
pub fn exit_when_stalled(
    handle: &tokio::runtime::Handle,
    name: &'static str,
) -> std::io::Result<()> {
    watch_runtime(handle, RUNTIME_STALL_BOUND, move |quiet| {
        eprintln!(
            "{name}: the async runtime made no progress for {quiet:?}; exiting. Threads:\n{}",
            thread_states()
        );
        std::process::exit(1);
    })
}

/// This process's threads, one line each: name, state, kernel wait channel (Linux; empty
/// elsewhere) — what a stalled runtime's log says about itself.
pub fn thread_states() -> String {
    thread_states_of("self")
}

/// The threads of process `pid` (a number, or `self`), one line each, as
/// [`thread_states`]: how the test harness describes a replica that stopped answering.
pub fn thread_states_of(pid: &str) -> String {
    let mut out = String::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    let mut tasks: Vec<_> = dir.flatten().map(|e| e.path()).collect();
    tasks.sort();
    for t in tasks {
        let read = |f: &str| {
            std::fs::read_to_string(t.join(f))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        // The state is the field after the parenthesised command name.
        let stat = read("stat");
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .unwrap_or("?")
            .to_string();
        out.push_str(&format!(
            "thread {} {} state {state} wchan {}\n",
            t.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            read("comm"),
            read("wchan"),
        ));
    }
    out
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_that_dies_takes_the_process_down_and_the_others_with_it() {
        let shutdown = Shutdown::default();
        let mut tasks = Tasks::new(shutdown.clone());
        let stopped = shutdown.wait();
        tasks.spawn("server", async move {
            stopped.await;
            Ok(())
        });
        tasks.spawn("watch", async {
            Err(anyhow::anyhow!("connection refused"))
        });
        let err = tasks.supervise(Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.to_string(), "watch failed: connection refused");
        assert!(shutdown.triggered());
    }

    #[test]
    fn a_runtime_whose_workers_are_all_blocked_is_reported_and_a_live_one_is_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        watch_runtime(rt.handle(), Duration::from_millis(1500), move |d| {
            let _ = tx.send(d);
        })
        .unwrap();
        // Live: the runtime runs (and ticks) for 3 s; nothing is reported.
        rt.block_on(async { tokio::time::sleep(Duration::from_secs(3)).await });
        assert!(rx.try_recv().is_err(), "a live runtime was reported");
        // Blocked: its only worker sleeps in a blocking call inside a task.
        rt.block_on(async { std::thread::sleep(Duration::from_secs(4)) });
        let quiet = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the stall is reported");
        assert!(quiet > Duration::from_millis(1500), "{quiet:?}");
        assert!(
            thread_states().contains("rt-watchdog"),
            "{}",
            thread_states()
        );
    }

    #[tokio::test]
    async fn a_task_that_returns_early_is_a_failure_and_shutdown_is_not() {
        let mut tasks = Tasks::new(Shutdown::default());
        tasks.spawn_forever("watchdog", async {});
        assert!(matches!(
            tasks.supervise(Duration::from_secs(1)).await,
            Err(TaskError::Ended { task: "watchdog" })
        ));

        let shutdown = Shutdown::default();
        let mut tasks = Tasks::new(shutdown.clone());
        tasks.spawn_forever("watch", std::future::pending());
        shutdown.trigger();
        assert!(tasks.supervise(Duration::from_millis(50)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_shutdown_waits_for_the_work_in_hand_not_for_the_watches() {
        let shutdown = Shutdown::default();
        let mut tasks = Tasks::new(shutdown.clone());
        // A watch runs until the work in hand is done (what it feeds may still be read).
        let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let w = watching.clone();
        tasks.spawn_forever("watch", async move {
            struct Stopped(std::sync::Arc<std::sync::atomic::AtomicBool>);
            impl Drop for Stopped {
                fn drop(&mut self) {
                    self.0.store(false, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let _stopped = Stopped(w);
            std::future::pending::<()>().await;
        });
        // A worker finishing the pass in hand: 1 s after the signal, the watch still there.
        let (stopped, w) = (shutdown.wait(), watching.clone());
        tasks.spawn("workers", async move {
            stopped.await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            anyhow::ensure!(
                w.load(std::sync::atomic::Ordering::SeqCst),
                "the watch stopped first"
            );
            Ok(())
        });
        let grace = Duration::from_secs(10);
        let start = tokio::time::Instant::now();
        shutdown.trigger();
        tasks.supervise(grace).await.unwrap();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(1),
            "the work in hand was cut off: {took:?}"
        );
        assert!(took < grace, "waited the whole grace for a watch: {took:?}");
        assert!(
            !watching.load(std::sync::atomic::Ordering::SeqCst),
            "the watch was left running"
        );
    }
}
