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
    set: JoinSet<(&'static str, anyhow::Result<()>)>,
    shutdown: Shutdown,
}

impl Tasks {
    pub fn new(shutdown: Shutdown) -> Self {
        Tasks {
            set: JoinSet::new(),
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

    /// Spawns a task that runs forever (a watch, a watchdog).
    pub fn spawn_forever<F>(&mut self, name: &'static str, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, async move {
            f.await;
            Ok(())
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
                joined = self.set.join_next() => match joined {
                    None => break None,
                    Some(Ok((task, Ok(())))) if shutdown.triggered() => {
                        tracing::debug!(task, "task finished");
                    }
                    Some(Ok((task, Ok(())))) => break Some(TaskError::Ended { task }),
                    Some(Ok((task, Err(error)))) => break Some(TaskError::Failed { task, error }),
                    Some(Err(e)) => {
                        tracing::error!(error = %e, "a task panicked");
                        break Some(TaskError::Panicked { task: "unknown" });
                    }
                }
            }
        };
        if let Some(e) = &failure {
            tracing::error!(error = %e, "a critical task stopped; shutting down");
        }
        shutdown.trigger();
        // Tasks that honour the shutdown finish on their own; the rest are aborted. After a
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
        failure.map_or(Ok(()), Err)
    }
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
}
