//! One way to run controllers, used by the core and by every driver built on the kit
//! (controller-rs's runner, kubert's): a pool of workers per work queue, every queue
//! examined again whenever this replica becomes the leader, each queue's stall a liveness
//! failure while it leads, and the queues closed at shutdown so the workers finish the pass
//! in hand.
//!
//! ```ignore
//! Controllers::new(gate, observe)
//!     .pool("claim", queues.claims.clone(), 4, bound(&ctx, claim_pass))
//!     .on_lead(move || queue_everything(ctx.clone()))
//!     .spawn(&mut tasks, &shutdown);
//! ```

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;

use crate::queue::Queue;
use crate::supervise::{Shutdown, Tasks};
use crate::workers::{self, Gate, Observe, Outcome, PassError};

/// `pass` bound to `ctx`: what a pool runs for each key.
pub fn bound<C, K, Fut>(
    ctx: &Arc<C>,
    pass: fn(Arc<C>, K) -> Fut,
) -> impl Fn(K) -> Fut + Send + Sync + 'static
where
    C: Send + Sync + 'static,
    K: 'static,
    Fut: 'static,
{
    let ctx = ctx.clone();
    move |k| pass(ctx.clone(), k)
}

/// One pool: its workers, how its queue is closed and how its health is watched.
struct Pool {
    controller: &'static str,
    workers: BoxFuture<'static, ()>,
    shut_down: Box<dyn FnOnce() + Send>,
    watch: Box<dyn FnOnce(&Gate) + Send>,
}

/// What runs when this replica becomes the leader.
type OnLead = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// The controllers of a process, built pool by pool and spawned once.
pub struct Controllers {
    gate: Gate,
    observe: Observe,
    pools: Vec<Pool>,
    on_lead: Option<OnLead>,
}

impl Controllers {
    /// Controllers that act only through `gate` and record each pass on `observe`.
    pub fn new(gate: Gate, observe: Observe) -> Controllers {
        Controllers {
            gate,
            observe,
            pools: Vec::new(),
            on_lead: None,
        }
    }

    /// `workers` workers of `controller` running `pass` over `queue`.
    pub fn pool<K, F, Fut, E>(
        mut self,
        controller: &'static str,
        queue: Arc<Queue<K>>,
        workers: usize,
        pass: F,
    ) -> Controllers
    where
        K: Clone + Eq + Hash + Ord + Display + Send + Sync + 'static,
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, E>> + Send + 'static,
        E: PassError + 'static,
    {
        let run = workers::run(
            controller,
            queue.clone(),
            workers,
            self.gate.clone(),
            pass,
            self.observe.clone(),
        );
        let (closed, watched) = (queue.clone(), queue);
        self.pools.push(Pool {
            controller,
            workers: Box::pin(run),
            shut_down: Box::new(move || closed.shut_down()),
            watch: Box::new(move |gate: &Gate| {
                let leadership = gate.leadership.clone();
                gate.health
                    .queue(controller, watched, move || leadership.is_leader());
            }),
        });
        self
    }

    /// What to queue when this replica becomes the leader (the new leader examines
    /// everything; the pools start on the first keys while the rest are queued).
    pub fn on_lead<F, Fut>(mut self, queue_everything: F) -> Controllers
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.on_lead = Some(Arc::new(move || Box::pin(queue_everything())));
        self
    }

    /// The controllers' names, in the order they were added.
    pub fn names(&self) -> Vec<&'static str> {
        self.pools.iter().map(|p| p.controller).collect()
    }

    /// Spawns every pool as a supervised task (one ending before shutdown ends the
    /// process), the on-lead task, and the task that closes the queues at shutdown (the
    /// workers then finish the pass in hand, within the supervisor's grace).
    pub fn spawn(self, tasks: &mut Tasks, shutdown: &Shutdown) {
        let mut closers = Vec::with_capacity(self.pools.len());
        for pool in self.pools {
            (pool.watch)(&self.gate);
            closers.push(pool.shut_down);
            let workers = pool.workers;
            tasks.spawn(pool.controller, async move {
                workers.await;
                Ok(())
            });
        }
        if let Some(on_lead) = self.on_lead {
            tasks.spawn_forever(
                "leadership",
                self.gate.leadership.acquired().for_each(move |()| {
                    tracing::info!("leading: examining every object");
                    on_lead()
                }),
            );
        }
        let stop = shutdown.wait();
        tasks.spawn("workers shutdown", async move {
            stop.await;
            for close in closers {
                close();
            }
            Ok(())
        });
    }
}
