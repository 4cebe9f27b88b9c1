//! Threads for the matrix products: a persistent pool of our own, and rayon for comparison.
//!
//! A decode step of SmolLM2-135M is about 211 matrix products of a few microseconds each, with
//! single-threaded work (norms, RoPE, attention) between them. Every product wakes the threads,
//! shares out its rows and waits for the last thread to finish: a fork and a join. Their cost
//! is paid 211 times per token, so it must be well under a microsecond. Sleeping threads cannot
//! give that — waking one through the kernel (a futex) takes several microseconds — so the
//! workers of [`SpinPool`] spin on a shared counter between products and only sleep after a
//! long idle spell (the end of a generation, or the sampler's turn). [`RayonPool`] runs the same
//! tasks on a rayon pool, whose threads sleep sooner and whose caller blocks on a lock: the book
//! measures the difference.
//!
//! Both implement [`Parallel`]: run `task(i)` for every `i` in `0..n_tasks` on all threads and
//! return when every task is done. Tasks are handed out from an atomic counter, so a thread
//! that was descheduled (the machine is shared) does not hold the others up for long.

use std::cell::UnsafeCell;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ANCHOR: parallel
/// Runs parallel loops on a fixed set of threads.
pub trait Parallel: Send + Sync {
    /// Threads that run tasks, the calling thread included where it takes part.
    fn threads(&self) -> usize;
    /// Call `task(i)` for every `i` in `0..n_tasks`, spread over the threads; return when all
    /// calls have returned. A panic in a task is raised again here.
    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync));
    /// A name for diagnostics.
    fn describe(&self) -> String;
}
// ANCHOR_END: parallel

/// Which implementation of [`Parallel`] to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// [`SpinPool`]: our own, workers spin between products.
    Spin,
    /// [`RayonPool`]: a rayon thread pool.
    Rayon,
}

impl std::str::FromStr for PoolKind {
    type Err = String;
    fn from_str(s: &str) -> Result<PoolKind, String> {
        match s {
            "spin" => Ok(PoolKind::Spin),
            "rayon" => Ok(PoolKind::Rayon),
            _ => Err(format!("unknown thread pool {s:?}: expected spin or rayon")),
        }
    }
}

/// A pool of `threads` threads of the given kind.
pub fn new_pool(kind: PoolKind, threads: usize) -> Arc<dyn Parallel> {
    match kind {
        PoolKind::Spin => Arc::new(SpinPool::new(threads)),
        PoolKind::Rayon => Arc::new(RayonPool::new(threads)),
    }
}

/// How long an idle worker spins before it sleeps. Long enough to cover the gaps between the
/// products of a forward pass (tens of microseconds) and between two decode steps (sampling,
/// streaming the text), short enough that an idle engine soon stops using the CPU.
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(2);

/// Polls of the job state with a `pause` between them before a waiting thread starts to yield
/// its CPU between polls: a few microseconds, the typical gap between two products.
const PAUSE_SPINS: u32 = 2000;

// ANCHOR: spin_shared
/// The job being run, published to the workers.
struct Job {
    task: *const (dyn Fn(usize) + Sync),
    n_tasks: usize,
}

/// `state` is `(epoch << 1) | OPEN`: a job is published by bumping the epoch with the open bit
/// set, and closed (bit cleared) once all its tasks are done.
const OPEN: usize = 1;

struct Shared {
    state: AtomicUsize,
    /// Written by the caller while the job is closed and no worker is `active`; read by
    /// workers only between entering (`active` + 1) and seeing the job still open.
    job: UnsafeCell<Job>,
    /// The next task to hand out, and how many are finished.
    next: AtomicUsize,
    done: AtomicUsize,
    /// Workers inside the current job.
    active: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    panicked: AtomicBool,
    shutdown: AtomicBool,
}
// ANCHOR_END: spin_shared

// SAFETY: `job` is written only by the thread in `run`, while the job is closed and no worker
// is `active`, and read by workers only while they are counted in `active` and saw the job
// open; the SeqCst state and `active` accesses order the two (see `worker` and `run`).
// `job.task` points to a `Sync` closure, so calling it from several threads is allowed.
// Everything else is atomic or a lock.
unsafe impl Sync for Shared {}
// SAFETY: as for `Sync`: the raw pointer in `job` is the only field that is not `Send`, and it
// is used only under the protocol above.
unsafe impl Send for Shared {}

// ANCHOR: spin_work
impl Shared {
    /// Take tasks from the counter until none are left.
    ///
    /// # Safety
    /// A job must be published and stay valid for the whole call: `job` is not written, and
    /// the closure it points to is alive, until this returns.
    unsafe fn work(&self) {
        // SAFETY: the caller promises a published job: no one writes `job` during this call.
        let job = unsafe { &*self.job.get() };
        // SAFETY: the caller promises the closure `task` points to outlives this call.
        let task = unsafe { &*job.task };
        let mut finished = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= job.n_tasks {
                break;
            }
            if catch_unwind(AssertUnwindSafe(|| task(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            finished += 1;
        }
        if finished > 0 {
            self.done.fetch_add(finished, Ordering::Release);
        }
    }
}
// ANCHOR_END: spin_work

// ANCHOR: spin_pool
/// A persistent pool: `threads - 1` workers plus the calling thread, which takes part in every
/// job. Between jobs the workers spin on `state` for [`SPIN_BEFORE_SLEEP`], then sleep on a
/// condition variable until the next job wakes them.
///
/// The caller waits for the *tasks*, not for the workers: a worker that the operating system
/// has not scheduled (the machine is shared) simply takes no task, and the caller does its share.
/// Only a worker that has entered the job is waited for, so the job's closure stays alive
/// while anyone can still call it.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time; a `run` from inside a task (or from a second thread while a job is
    /// running) runs its tasks on the calling thread instead of waiting.
    busy: Mutex<()>,
}
// ANCHOR_END: spin_pool

impl SpinPool {
    pub fn new(threads: usize) -> SpinPool {
        let threads = threads.max(1);
        let noop: &(dyn Fn(usize) + Sync) = &|_| {};
        let shared = Arc::new(Shared {
            state: AtomicUsize::new(0),
            job: UnsafeCell::new(Job {
                task: noop as *const _,
                n_tasks: 0,
            }),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("llm-rs-worker-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("could not start a worker thread")
            })
            .collect();
        SpinPool {
            shared,
            workers,
            busy: Mutex::new(()),
        }
    }
}

// ANCHOR: spin_worker
/// A worker's life: wait for the next job (polling, then yielding its CPU between polls, then
/// asleep), take tasks from it until none are left, and again, until the pool shuts down.
fn worker(s: &Shared) {
    let mut seen = 0;
    loop {
        // Spin until a new job is open, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        let st = loop {
            let st = s.state.load(Ordering::Acquire);
            if st != seen && st & OPEN != 0 {
                break st;
            }
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if spins < PAUSE_SPINS {
                std::hint::spin_loop();
            } else {
                // Still nothing: offer the CPU to any other thread that wants it (on a busy
                // machine, perhaps the one that will publish the next job). With nothing
                // else to run, the call returns at once and we keep polling.
                std::thread::yield_now();
            }
            if spins.is_multiple_of(64) && start.elapsed() > SPIN_BEFORE_SLEEP {
                let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                // SeqCst on both sides: either `run` sees us in `sleepers` and notifies (it
                // takes the lock, so not before we wait), or we see its new state here.
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                loop {
                    let st = s.state.load(Ordering::SeqCst);
                    if (st != seen && st & OPEN != 0) || s.shutdown.load(Ordering::SeqCst) {
                        break;
                    }
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
        };
        seen = st;
        s.active.fetch_add(1, Ordering::SeqCst);
        // Entered: if the job is still open, the caller waits for us before it returns.
        if s.state.load(Ordering::SeqCst) == st {
            // SAFETY: the job is open and we are counted in `active`, so `run` neither rewrites
            // `job` nor returns (ending `task`'s life) until we leave.
            unsafe { s.work() };
        }
        s.active.fetch_sub(1, Ordering::Release);
    }
}
// ANCHOR_END: spin_worker

// ANCHOR: spin_run
impl Parallel for SpinPool {
    fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let _guard = match self.busy.try_lock() {
            Ok(g) if !self.workers.is_empty() && n_tasks > 1 => g,
            _ => return (0..n_tasks).for_each(task),
        };
        let s = &*self.shared;
        // SAFETY: the previous job is closed and no worker is active (the previous `run` waited
        // for both, and `busy` keeps a second `run` out), so none reads `job`. The pointer's
        // lifetime is erased: it is used only while the job is open or a worker is active, and
        // this function waits for both to end before `task` goes out of scope (a panicking task
        // is caught in `work`, so nothing unwinds past that wait).
        unsafe {
            let task: *const (dyn Fn(usize) + Sync + '_) = task;
            *s.job.get() = Job {
                task: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(task),
                n_tasks,
            };
        }
        s.next.store(0, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        let st = (s.state.load(Ordering::Relaxed) | OPEN).wrapping_add(2);
        s.state.store(st, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // SAFETY: the job is published, and `job` is not written again before this function
        // returns; `task` outlives this call.
        unsafe { s.work() };
        // The join: wait for tasks other threads took, then close the job and wait for the
        // workers still inside it (they find no task left and leave at once).
        wait_until(|| s.done.load(Ordering::Acquire) >= n_tasks);
        s.state.store(st & !OPEN, Ordering::SeqCst);
        wait_until(|| s.active.load(Ordering::SeqCst) == 0);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a task of a parallel matrix product panicked");
        }
    }

    fn describe(&self) -> String {
        format!("spin pool, {} threads", self.threads())
    }
}
// ANCHOR_END: spin_run

/// Spin until `ready()`, yielding the CPU now and then in case the thread we wait for is
/// waiting for a CPU.
fn wait_until(ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        spins += 1;
        if spins < PAUSE_SPINS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl fmt::Debug for SpinPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The same loops on a rayon pool of `threads` threads. The calling thread hands the job to the
/// pool and blocks until it is done.
pub struct RayonPool {
    pool: rayon::ThreadPool,
}

impl RayonPool {
    pub fn new(threads: usize) -> RayonPool {
        RayonPool {
            pool: rayon::ThreadPoolBuilder::new()
                .num_threads(threads.max(1))
                .thread_name(|i| format!("llm-rs-rayon-{i}"))
                .build()
                .expect("could not start the rayon thread pool"),
        }
    }
}

impl Parallel for RayonPool {
    fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        use rayon::prelude::*;
        if n_tasks <= 1 || self.threads() == 1 {
            return (0..n_tasks).for_each(task);
        }
        self.pool
            .install(|| (0..n_tasks).into_par_iter().with_max_len(1).for_each(task));
    }

    fn describe(&self) -> String {
        format!("rayon pool, {} threads", self.threads())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pool: &dyn Parallel) {
        for n in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{n}");
        }
    }

    #[test]
    fn every_task_runs_exactly_once() {
        for t in [1, 2, 3] {
            check(&SpinPool::new(t));
            check(&RayonPool::new(t));
        }
    }

    #[test]
    fn jobs_after_the_workers_fell_asleep_still_run() {
        let pool = SpinPool::new(2);
        check(&pool);
        std::thread::sleep(SPIN_BEFORE_SLEEP * 3);
        check(&pool);
    }

    #[test]
    fn a_nested_run_does_not_deadlock() {
        let pool = SpinPool::new(2);
        let total = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_survives() {
        let pool = SpinPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, &|i| {
                if i == 5 {
                    panic!("task 5");
                }
            })
        }));
        assert!(r.is_err());
        check(&pool);
    }
}
