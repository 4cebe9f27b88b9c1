//! The engine's thread: chapter 7's scheduler, fed through a channel.
//!
//! A forward pass takes milliseconds to hundreds of milliseconds of CPU; run on the async
//! runtime it would stall every connection the runtime serves. So the model lives on a thread
//! of its own, which owns the scheduler and loops: take the commands that arrived (new
//! requests, cancellations), drop requests whose client is gone or whose time is up, run one
//! step, send each request's new text to its channel. When nothing is left to do it sleeps on
//! the command channel. Handlers never touch the model: they send a [`Job`] and read
//! [`Event`]s.
//!
//! Two seams for what comes after: an [`Observer`] hears every step,
//! token and ending as it happens, for metrics and logs, and may hold the requests where they
//! are (this chapter's tests do, to keep requests running as long as they need); and
//! [`Worker::close`] ends every request at once with its final event, for a shutdown that
//! drains. A panic inside a step is caught: the requests in that step fail, and a fresh
//! scheduler takes the next ones.

use ch04::{GenParams, StopReason};
use ch07::{
    Finished, Lookahead, Request, RequestId, Scheduler, SchedulerConfig, Sink, StepReport, Submit,
};
use ch10::Engine;
use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// A handler's number for its request, given before the scheduler numbers it.
pub type Ticket = u64;

/// A request for the engine thread.
pub struct Job {
    /// The request's name in logs and for the [`Observer`].
    pub label: Arc<str>,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    /// When the request's time is up: it then ends as if it had reached its token limit.
    pub deadline: Instant,
    /// The prefix cache's partition it reads and fills (chapter 7's [`Submit::partition`]).
    pub partition: u64,
    /// What it feeds ahead of its decode tokens, if anything (chapter 7's [`Lookahead`]).
    pub lookahead: Option<Box<dyn Lookahead + Send>>,
    /// Where its events go. The engine notices when the receiver is dropped (the client went
    /// away) and cancels the request.
    pub events: UnboundedSender<Event>,
}

/// What the engine thread tells a handler about its request, in this order: `Accepted` or
/// `Rejected`; then text; then `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The scheduler took the request.
    Accepted,
    /// The scheduler refused it (a 400: the message says why).
    Rejected(String),
    /// New text, complete UTF-8, never part of a stop string.
    Text(String),
    Done(Outcome),
    /// A step failed (a 500).
    Failed(String),
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub stop: StopReason,
    /// Ended by the server: its time limit (reported as `length`, as llama-server reports its
    /// `t_max_predict_ms`), or a shutdown's drain limit.
    pub timed_out: bool,
    /// Ended by [`Worker::close`], short of its end: the server is shutting down, and the
    /// client is told so (an error, not a finish reason), to retry elsewhere.
    pub closed: bool,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Tokens fed ahead ([`Job::lookahead`]), and those kept.
    pub fed_ahead_tokens: usize,
    pub kept_ahead_tokens: usize,
}

/// The scheduler's state after the last step, for `/health` and the tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStatus {
    /// Requests with a sequence slot, and requests waiting for one.
    pub running: usize,
    pub waiting: usize,
    /// KV blocks in the pool, free, and held by running sequences (the rest belong only to
    /// the prefix cache, which gives them up when they are needed).
    pub kv_blocks: usize,
    pub kv_blocks_free: usize,
    pub sequence_blocks: usize,
    pub steps: usize,
    pub generated_tokens: usize,
    /// Prompt positions computed, and taken from the prefix cache instead.
    pub computed_tokens: usize,
    pub cached_tokens: usize,
}

// ANCHOR: observer
/// Hears what the engine thread does, as it does it, and may hold it; called on the engine
/// thread, so it must be quick (count, record, log). Every method does nothing (and `hold`
/// says no) unless implemented.
pub trait Observer: Send + Sync {
    /// A step ran: what it did, how long it took, and the scheduler's state after it.
    fn step(&self, _report: &StepReport, _took: Duration, _status: &PoolStatus) {}
    /// Request `label` sampled a token, `gap` after its previous one — or, for its first,
    /// after it was submitted (`first`).
    fn token(&self, _label: &str, _first: bool, _gap: Duration) {}
    /// Request `label` ended.
    fn done(&self, _label: &str, _outcome: &Outcome) {}
    /// A step failed (an error or a panic) and took request `label` with it.
    fn failed(&self, _label: &str, _message: &str) {}
    /// Whether the engine should leave the requests it has (`labels`) where they are and run
    /// no step now. While it holds, it still takes commands, lets go of the requests whose
    /// client left or whose time is up, and asks again every [`HOLD_POLL`]. No by default: a
    /// test says yes to keep requests running, unfinished, for as long as it needs them.
    fn hold(&self, _labels: &mut dyn Iterator<Item = &str>) -> bool {
        false
    }
}
// ANCHOR_END: observer

/// How often a held engine ([`Observer::hold`]) looks at its requests and asks again: a
/// client that leaves or a time limit is seen within this, as within a step.
pub const HOLD_POLL: Duration = Duration::from_millis(5);

/// Hears nothing.
impl Observer for () {}

enum Command {
    Submit(Ticket, Job),
    Cancel(Ticket),
    Close,
}

/// The handlers' side of the engine thread.
#[derive(Clone)]
pub struct Worker {
    commands: mpsc::Sender<Command>,
    next: Arc<AtomicU64>,
    status: Arc<Mutex<PoolStatus>>,
    alive: Arc<AtomicBool>,
}

impl Worker {
    /// Start the engine thread on `engine` with a scheduler configured by `config`, telling
    /// `observer` what it does.
    pub fn spawn(
        engine: Arc<Engine>,
        config: SchedulerConfig,
        observer: Arc<dyn Observer>,
    ) -> Result<Worker, Box<dyn Error>> {
        // Built here first, so that a bad configuration is an error now, not in the thread.
        let first = Scheduler::new(&engine.model, &engine.tokenizer, config.clone())?;
        let status = Arc::new(Mutex::new(pool_status(&first)));
        drop(first);
        let (commands, rx) = mpsc::channel();
        let alive = Arc::new(AtomicBool::new(true));
        let worker = Worker {
            commands,
            next: Arc::new(AtomicU64::new(0)),
            status: Arc::clone(&status),
            alive: Arc::clone(&alive),
        };
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                // Marks the engine dead however the loop ends, a panic included.
                struct Alive(Arc<AtomicBool>);
                impl Drop for Alive {
                    fn drop(&mut self) {
                        self.0.store(false, Ordering::SeqCst);
                    }
                }
                let _alive = Alive(alive);
                engine_loop(&engine, config, rx, &status, &*observer);
            })?;
        Ok(worker)
    }

    /// Queue `job`; its events follow on its channel. `None` if the engine thread has ended.
    pub fn submit(&self, job: Job) -> Option<Ticket> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        self.commands.send(Command::Submit(ticket, job)).ok()?;
        Some(ticket)
    }

    /// End request `ticket` now, freeing its slot and blocks before the next step.
    pub fn cancel(&self, ticket: Ticket) {
        let _ = self.commands.send(Command::Cancel(ticket));
    }

    /// End every request now, running or waiting, each with its final event (`Done` with
    /// [`Outcome::closed`]), and every one submitted later as soon as it arrives: what a
    /// shutdown does when its drain limit is reached.
    pub fn close(&self) {
        let _ = self.commands.send(Command::Close);
    }

    pub fn status(&self) -> PoolStatus {
        *self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the engine thread still runs.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// A request the engine thread holds.
struct Live {
    ticket: Ticket,
    label: Arc<str>,
    events: UnboundedSender<Event>,
    deadline: Instant,
    prompt_tokens: usize,
    /// When it was submitted, then when it sampled its last token.
    last: Instant,
    first: bool,
}

impl Live {
    /// The final report of this request, ended by the scheduler as `f`, with reason `stop`.
    fn outcome(&self, f: &Finished, stop: StopReason, timed_out: bool, closed: bool) -> Outcome {
        Outcome {
            stop,
            timed_out,
            closed,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: f.ids.len(),
            cached_tokens: f.cached_tokens.min(self.prompt_tokens),
            fed_ahead_tokens: f.fed_ahead,
            kept_ahead_tokens: f.kept_ahead,
        }
    }
}

/// Sends each request's text to its channel, notes whose channel is closed, and tells the
/// observer of every token.
struct Streams<'a> {
    live: &'a mut HashMap<RequestId, Live>,
    gone: &'a mut Vec<RequestId>,
    observer: &'a dyn Observer,
}

impl Sink for Streams<'_> {
    fn text(&mut self, id: RequestId, text: &str) {
        if let Some(l) = self.live.get(&id)
            && l.events.send(Event::Text(text.to_string())).is_err()
        {
            self.gone.push(id);
        }
    }

    fn token(&mut self, id: RequestId, _token: u32, _logits: &[f32]) {
        if let Some(l) = self.live.get_mut(&id) {
            let now = Instant::now();
            self.observer.token(&l.label, l.first, now - l.last);
            l.last = now;
            l.first = false;
        }
    }
}

/// What a caught panic said.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

// ANCHOR: engine_loop
/// The engine thread: take commands, let go of the requests that must leave, run one step,
/// send the events; sleep when there is nothing to run; return when every handle is dropped.
fn engine_loop(
    engine: &Engine,
    config: SchedulerConfig,
    commands: mpsc::Receiver<Command>,
    status: &Mutex<PoolStatus>,
    observer: &dyn Observer,
) {
    let new_scheduler = || {
        Scheduler::new(&engine.model, &engine.tokenizer, config.clone())
            .expect("the configuration was checked when the worker started")
    };
    let mut scheduler = new_scheduler();
    let mut live: HashMap<RequestId, Live> = HashMap::new();
    let mut tickets: HashMap<Ticket, RequestId> = HashMap::new();
    let mut gone: Vec<RequestId> = Vec::new();
    let mut closed = false;
    let mut held = false;
    loop {
        // 1. Commands; with nothing to run, sleep until one comes; held by the observer,
        //    wait for one at most HOLD_POLL.
        let first = if scheduler.is_idle() {
            match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => return, // every handle is dropped: the server is done
            }
        } else if held {
            match commands.recv_timeout(HOLD_POLL) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        // ANCHOR_END: engine_loop
        // ANCHOR: commands
        for command in first.into_iter().chain(commands.try_iter()) {
            match command {
                Command::Submit(ticket, job) => {
                    let prompt_tokens = job.prompt.len();
                    let submitted = Instant::now();
                    let request = Request {
                        prompt: job.prompt,
                        params: job.params,
                    };
                    let with = Submit {
                        partition: job.partition,
                        lookahead: job.lookahead,
                    };
                    match scheduler.submit_with(request, with) {
                        Ok(id) => {
                            let _ = job.events.send(Event::Accepted);
                            tickets.insert(ticket, id);
                            live.insert(
                                id,
                                Live {
                                    ticket,
                                    label: job.label,
                                    events: job.events,
                                    deadline: job.deadline,
                                    prompt_tokens,
                                    last: submitted,
                                    first: true,
                                },
                            );
                        }
                        Err(e) => {
                            let _ = job.events.send(Event::Rejected(e.to_string()));
                        }
                    }
                }
                Command::Cancel(ticket) => {
                    if let Some(id) = tickets.get(&ticket) {
                        gone.push(*id);
                    }
                }
                Command::Close => closed = true,
            }
        }
        // ANCHOR_END: commands

        // ANCHOR: leave
        // 2. Requests whose client left, or whose time is up (or all, once closed), leave
        //    before the step.
        // ANCHOR: yours_leave
        let now = Instant::now();
        let mut late = Vec::new();
        for (&id, l) in &live {
            if l.events.is_closed() {
                gone.push(id);
            } else if closed || now >= l.deadline {
                late.push(id);
            }
        }
        for id in gone.drain(..).chain(late.iter().copied()) {
            if let Some(f) = scheduler.cancel(id)
                && let Some(l) = live.remove(&id)
            {
                tickets.remove(&l.ticket);
                let timed_out = late.contains(&id);
                // A request the server ends reports `length`, as if it reached its limit.
                let stop = if timed_out {
                    StopReason::MaxTokens
                } else {
                    f.stop
                };
                let outcome = l.outcome(&f, stop, timed_out, timed_out && closed);
                observer.done(&l.label, &outcome);
                let _ = l.events.send(Event::Done(outcome));
            }
        }
        // ANCHOR_END: yours_leave
        // ANCHOR_END: leave

        // ANCHOR: step
        // 3. One step for everyone, unless the observer holds them. A panic inside it (a bug,
        //    or an injected fault) is caught and handled as a failed step, so one
        //    bad step does not end the server.
        held = !scheduler.is_idle() && observer.hold(&mut live.values().map(|l| &*l.label));
        if !scheduler.is_idle() && !held {
            let started = Instant::now();
            let mut sink = Streams {
                live: &mut live,
                gone: &mut gone,
                observer,
            };
            let result = match catch_unwind(AssertUnwindSafe(|| scheduler.step(&mut sink))) {
                Ok(Ok(report)) => Ok(report),
                Ok(Err(e)) => Err(engine.explain_step(e).to_string()),
                Err(p) => Err(format!("the engine panicked: {}", panic_message(&*p))),
            };
            match result {
                Ok(report) => {
                    let took = started.elapsed();
                    for f in &report.finished {
                        if let Some(l) = live.remove(&f.id) {
                            tickets.remove(&l.ticket);
                            let outcome = l.outcome(f, f.stop, false, false);
                            observer.done(&l.label, &outcome);
                            let _ = l.events.send(Event::Done(outcome));
                        }
                    }
                    let now = pool_status(&scheduler);
                    observer.step(&report, took, &now);
                    *status.lock().unwrap_or_else(|e| e.into_inner()) = now;
                    continue;
                }
                Err(message) => {
                    // The scheduler's state is unspecified after a failed step: every request
                    // in it fails, and a new scheduler takes the next ones.
                    for (_, l) in live.drain() {
                        observer.failed(&l.label, &message);
                        let _ = l.events.send(Event::Failed(message.clone()));
                    }
                    tickets.clear();
                    gone.clear();
                    scheduler = new_scheduler();
                }
            }
        }
        *status.lock().unwrap_or_else(|e| e.into_inner()) = pool_status(&scheduler);
    }
}
// ANCHOR_END: step

fn pool_status(s: &Scheduler<'_, ch04::Model>) -> PoolStatus {
    let kv = s.kv();
    let mut held = HashSet::new();
    for (_, slot) in s.running_slots() {
        if let Some(t) = kv.table(slot) {
            held.extend(t.blocks.iter().copied());
        }
    }
    let stats = s.stats();
    let running = s.n_running();
    PoolStatus {
        running,
        waiting: s.n_unfinished() - running,
        kv_blocks: kv.allocator.n_blocks(),
        kv_blocks_free: kv.allocator.n_free(),
        sequence_blocks: held.len(),
        steps: stats.steps,
        generated_tokens: stats.generated_tokens,
        computed_tokens: stats.computed_tokens,
        cached_tokens: stats.cached_tokens,
    }
}
