//! Where a workspace's FUSE request threads run: on the CPUs of the processes that use
//! the workspace, when those are confined to fewer CPUs than the daemon may use.
//!
//! Every request is a round trip: the requesting thread waits while a request thread
//! answers. Before Linux 7.3 the kernel wakes a waiting request thread without saying
//! that the requester is about to sleep, so the scheduler puts the request thread on an
//! idle CPU, and the answer wakes the requester on its own CPU again: two cross-CPU
//! wakeups per request. On a VM whose host does not poll before it halts an idle vCPU,
//! each one goes through the host. A worker confined to one CPU (`taskset`, a cpuset
//! cgroup) whose workspace's request threads share that CPU has no cross-CPU wakeup at
//! all: on this project's 2-vCPU test VM that took a first walk of the Linux tree from
//! 2.37× kernel overlayfs to 1.09× and reading every file from 5.45× to 2.58×
//! (`docs/BENCHMARKS.md`, "a worker confined to one CPU, served on that CPU").
//!
//! So each workspace remembers the requesters of the last [`RECENT_MS`] (at most
//! [`RECENT_REQUESTERS`], latest first) and the CPUs each may use, asked again at most
//! every [`RELEARN_MS`] per requester (a process may be moved to a cpuset after it
//! started); its request threads may use the union of those sets (within the daemon's
//! own), and nothing else. One unconfined requester among them (a shell on the host, git
//! run by the runtime) gives the threads every CPU again, until it has asked nothing
//! for [`RECENT_MS`]: confining never takes a CPU from a workspace whose users may use
//! it. (A kernel thread writing back a mapped file's pages counts as one.) A request
//! thread applies a new set to itself when it next serves a request.
//!
//! A request thread asks the kernel nothing about a requester but `sched_getaffinity`,
//! which takes only spinlocks. Reading the requester's `/proc` files can wait for a lock
//! the requester's process holds while it waits for this very request, a deadlock: the
//! first version read `/proc/PID/stat` (to leave kernel threads out), and the acceptance
//! suite's build workload hung with both request threads in the kernel's `do_task_stat`
//! (a multi-threaded test process, compilers running from the workspace).
//!
//! The cost per request is a clock read and a few atomic loads; a requester other than
//! the last adds a lock, and one not asked about for [`RELEARN_MS`] a
//! `sched_getaffinity`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// How many distinct requesters a workspace remembers at most (the oldest go first).
pub const RECENT_REQUESTERS: usize = 64;

/// A requester that asked nothing for this long no longer counts.
pub const RECENT_MS: u64 = 10_000;

/// How often a requester's CPUs are asked again while it keeps asking.
pub const RELEARN_MS: u64 = 100;

thread_local! {
    /// The placement (by address) and generation this thread last applied to itself.
    static APPLIED: Cell<(usize, u64)> = const { Cell::new((0, 0)) };
}

/// One workspace's request-thread placement.
pub struct Placement {
    /// The daemon's own CPUs when the workspace was mounted: the widest set.
    own: CpuSet,
    /// The same, as a list.
    own_list: Vec<usize>,
    /// The requester seen last, so a run of requests from one thread costs nothing.
    last: AtomicU32,
    /// When `last` was last asked about (ms since `epoch`).
    learned: AtomicU64,
    epoch: Instant,
    recent: Mutex<Recent>,
    /// Bumped when `recent.wanted` changes; generation 0 is "never placed".
    generation: AtomicU64,
}

struct Recent {
    requesters: Requesters,
    wanted: CpuSet,
}

/// A workspace's recent requesters, latest first: pid, its CPUs, when they were asked
/// (ms).
#[derive(Default)]
struct Requesters(VecDeque<(u32, CpuSet, u64)>);

impl Requesters {
    /// Whether `pid`'s CPUs were asked about less than [`RELEARN_MS`] before `now`.
    fn fresh(&self, pid: u32, now: u64) -> bool {
        self.0
            .iter()
            .any(|&(p, _, at)| p == pid && now.saturating_sub(at) < RELEARN_MS)
    }

    /// Records `pid`'s CPUs as of `now` and forgets the requesters that asked nothing for
    /// [`RECENT_MS`], and those beyond [`RECENT_REQUESTERS`].
    fn learn(&mut self, pid: u32, cpus: CpuSet, now: u64) {
        self.0
            .retain(|&(p, _, at)| p != pid && now.saturating_sub(at) < RECENT_MS);
        self.0.push_front((pid, cpus, now));
        self.0.truncate(RECENT_REQUESTERS);
    }

    fn cpus(&self) -> impl Iterator<Item = &CpuSet> {
        self.0.iter().map(|(_, c, _)| c)
    }
}

impl Placement {
    /// A placement that follows requesters (`follow`), or one that never moves the
    /// threads (`None` from [`Placement::new`] then).
    pub fn new(follow: bool) -> Option<Placement> {
        if !follow {
            return None;
        }
        let own = sched_getaffinity(Pid::from_raw(0)).ok()?;
        Some(Placement {
            own,
            own_list: cpus_of(&own),
            last: AtomicU32::new(0),
            learned: AtomicU64::new(0),
            epoch: Instant::now(),
            recent: Mutex::new(Recent {
                requesters: Requesters::default(),
                wanted: own,
            }),
            generation: AtomicU64::new(0),
        })
    }

    /// Called by a request thread for each request from `pid` (the kernel's pid of the
    /// requesting thread, 0 when it has none in the daemon's namespace).
    pub fn serve(&self, pid: u32) {
        if pid != 0 {
            let now = self.epoch.elapsed().as_millis() as u64;
            let other = self.last.swap(pid, Ordering::Relaxed) != pid;
            if other || now.saturating_sub(self.learned.load(Ordering::Relaxed)) >= RELEARN_MS {
                self.learned.store(now, Ordering::Relaxed);
                self.learn(pid, now);
            }
        }
        let generation = self.generation.load(Ordering::Acquire);
        let key = (self as *const Placement as usize, generation);
        if generation == 0 || APPLIED.get() == key {
            return;
        }
        let wanted = self.lock().wanted;
        if let Err(e) = sched_setaffinity(Pid::from_raw(0), &wanted) {
            tracing::debug!(
                "request thread placement on CPUs {}: {e}",
                cpu_list(&wanted)
            );
        }
        APPLIED.set(key);
    }

    /// The CPUs the request threads are to use now.
    pub fn wanted(&self) -> CpuSet {
        self.lock().wanted
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn learn(&self, pid: u32, now: u64) {
        if self.lock().requesters.fresh(pid, now) {
            return;
        }
        let Ok(cpus) = sched_getaffinity(Pid::from_raw(pid as i32)) else {
            return; // gone already
        };
        let mut r = self.lock();
        r.requesters.learn(pid, cpus, now);
        let wanted = confine(&self.own, &self.own_list, r.requesters.cpus());
        if wanted != r.wanted {
            tracing::debug!("request threads move to CPUs {}", cpu_list(&wanted));
            r.wanted = wanted;
            self.generation.fetch_add(1, Ordering::Release);
        }
    }
}

/// The CPUs of `own` (listed in `own_list`) that any of `sets` may use; all of `own`
/// when that is none.
pub fn confine<'a>(
    own: &CpuSet,
    own_list: &[usize],
    sets: impl Iterator<Item = &'a CpuSet>,
) -> CpuSet {
    let mut out = CpuSet::new();
    let mut any = false;
    for set in sets {
        for &cpu in own_list {
            if set.is_set(cpu).unwrap_or(false) {
                let _ = out.set(cpu);
                any = true;
            }
        }
    }
    if any { out } else { *own }
}

/// The CPUs in `set`.
pub fn cpus_of(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// `0-3,6` for messages.
pub fn cpu_list(set: &CpuSet) -> String {
    let mut out = Vec::new();
    let mut cpu = 0;
    while cpu < CpuSet::count() {
        if set.is_set(cpu).unwrap_or(false) {
            let start = cpu;
            while cpu + 1 < CpuSet::count() && set.is_set(cpu + 1).unwrap_or(false) {
                cpu += 1;
            }
            out.push(if start == cpu {
                start.to_string()
            } else {
                format!("{start}-{cpu}")
            });
        }
        cpu += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        let mut s = CpuSet::new();
        for &c in cpus {
            s.set(c).unwrap();
        }
        s
    }

    #[test]
    fn confine_is_the_union_within_the_daemons_cpus() {
        let own = set(&[0, 1, 2, 3]);
        let list = cpus_of(&own);
        assert_eq!(list, [0, 1, 2, 3]);
        let confine = |sets: &[CpuSet]| confine(&own, &list, sets.iter());
        assert_eq!(confine(&[set(&[2])]), set(&[2]));
        assert_eq!(confine(&[set(&[2]), set(&[0])]), set(&[0, 2]));
        // An unconfined requester: every CPU of the daemon's.
        assert_eq!(confine(&[set(&[2]), set(&[0, 1, 2, 3, 4, 5])]), own);
        // Outside the daemon's own CPUs (a cpuset it is not in): nothing to confine to.
        assert_eq!(confine(&[set(&[7])]), own);
        assert_eq!(confine(&[set(&[3, 7])]), set(&[3]));
        assert_eq!(confine(&[]), own);
    }

    #[test]
    fn requesters_age_out_and_are_asked_again() {
        let mut r = Requesters::default();
        r.learn(10, set(&[0, 1]), 0);
        r.learn(11, set(&[1]), 50);
        assert!(r.fresh(10, 99));
        assert!(!r.fresh(10, 100), "asked again after RELEARN_MS");
        assert!(!r.fresh(12, 60), "never asked");
        // 10 moved to a cpuset: its new CPUs replace the old ones.
        r.learn(10, set(&[1]), 150);
        assert_eq!(
            r.cpus().cloned().collect::<Vec<_>>(),
            [set(&[1]), set(&[1])]
        );
        // Quiet for RECENT_MS: forgotten at the next learn.
        r.learn(12, set(&[0]), 150 + RECENT_MS);
        assert_eq!(r.0.iter().map(|e| e.0).collect::<Vec<_>>(), [12]);
        for pid in 100..100 + RECENT_REQUESTERS as u32 + 5 {
            r.learn(pid, set(&[0]), 200 + RECENT_MS);
        }
        assert_eq!(r.0.len(), RECENT_REQUESTERS);
        assert_eq!(r.0[0].0, 100 + RECENT_REQUESTERS as u32 + 4);
    }

    #[test]
    fn cpu_lists_read_like_the_kernels() {
        assert_eq!(cpu_list(&set(&[0, 1, 2, 3, 6])), "0-3,6");
        assert_eq!(cpu_list(&set(&[1])), "1");
        assert_eq!(cpu_list(&CpuSet::new()), "");
    }

    #[test]
    fn a_thread_applies_a_confined_requesters_cpus_and_gives_them_back() {
        let Some(p) = Placement::new(true) else {
            return;
        };
        let own = p.own;
        let own_cpus = cpus_of(&own);
        let first = own_cpus[0];
        if own_cpus.len() < 2 {
            eprintln!("skipped: this process may use one CPU only");
            return;
        }
        // A requester confined to one CPU: a child thread of ours, pinned.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let pinned = std::thread::spawn(move || {
            sched_setaffinity(Pid::from_raw(0), &set(&[first])).unwrap();
            tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let me = nix::unistd::gettid().as_raw() as u32;
        let seen = std::thread::scope(|s| {
            // One request thread serves the pinned requester, then this test's own thread,
            // which is unconfined: it moves to the one CPU, then gets every CPU back.
            s.spawn(|| {
                let mut seen = Vec::new();
                for pid in [tid, me] {
                    p.serve(pid);
                    seen.push((sched_getaffinity(Pid::from_raw(0)).unwrap(), p.wanted()));
                }
                seen
            })
            .join()
            .unwrap()
        });
        assert_eq!(seen[0], (set(&[first]), set(&[first])));
        assert_eq!(seen[1], (own, own));
        drop(done_tx);
        pinned.join().unwrap();
    }
}
