//! The loaded phase: idle workspaces, workers, a sampler of the daemon's memory, and the
//! fault injector, which kills processes the soak started (found from the runtime's
//! own state) at seeded random moments and checks the runtime after each.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::env::{ADMIN_DEADLINE, Env, snapshot_ids};
use super::proc;
use super::report::{Baseline, Figures};
use super::{ALL_FAULTS, Fault, FaultRecord, Opts, Shared, Slot, Stats, worker};

/// How many threads create the idle workspaces.
const CREATORS: usize = 4;
/// How often the daemon's RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(2);
/// Longest random delay before a `mountctl` is killed mid-command.
const MOUNTCTL_KILL_MAX_MS: u64 = 400;

/// Runs the loaded phase; returns the figures (the final checks come after).
pub fn soak(env: &Env, opts: &Opts, bound: Duration, baseline: &Baseline) -> Result<Figures> {
    let sh = Shared {
        env,
        opts: opts.clone(),
        slots: (0..opts.sandboxes).map(|_| Slot::default()).collect(),
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        commits: Mutex::new(Vec::new()),
        stats: Mutex::new(Stats::default()),
        faults: Mutex::new(Vec::new()),
        bound,
        started: Instant::now(),
        transient: AtomicU64::new(0),
        every_fault_done: AtomicBool::new(false),
    };
    let idle: Vec<String> = (0..opts.workspaces - opts.sandboxes)
        .map(|j| format!("{}-i{j}", env.tag))
        .collect();
    std::thread::scope(|s| -> Result<()> {
        for chunk in idle.chunks(idle.len().div_ceil(CREATORS)) {
            let sh = &sh;
            s.spawn(move || {
                for name in chunk {
                    if let Err(e) = sh.create_workspace(name) {
                        sh.fail(format!("creating idle workspace {name}: {e:#}"));
                        return;
                    }
                }
            });
        }
        Ok(())
    })?;
    check_failures(&sh)?;
    eprintln!(
        "soak: {} idle workspaces made; starting {} workers",
        idle.len(),
        opts.sandboxes
    );
    let load_started = Instant::now();
    let duration = Duration::from_secs_f64(opts.minutes * 60.0);
    std::thread::scope(|s| {
        for i in 0..opts.sandboxes {
            let sh = &sh;
            s.spawn(move || worker::run(sh, i));
        }
        let shr = &sh;
        s.spawn(move || sample_rss(shr));
        let shf = &sh;
        let idle = &idle;
        s.spawn(move || {
            if let Err(e) = inject(shf, idle, duration) {
                shf.fail(format!("fault injector: {e:#}"));
            }
        });
        let mut last_note = Instant::now();
        // The load lasts `duration`, and longer if need be until every kind of fault
        // has been injected once.
        while (load_started.elapsed() < duration || !sh.every_fault_done.load(Ordering::SeqCst))
            && !sh.stopping()
        {
            std::thread::sleep(Duration::from_millis(250));
            if last_note.elapsed() > Duration::from_secs(30) {
                last_note = Instant::now();
                let n = sh.stats.lock().unwrap().iteration_ms.len();
                let f = sh.faults.lock().unwrap().len();
                eprintln!(
                    "soak: {:.1} min: {n} iterations, {f} faults",
                    load_started.elapsed().as_secs_f64() / 60.0
                );
            }
        }
        sh.stop.store(true, Ordering::SeqCst);
    });
    let load_secs = load_started.elapsed().as_secs_f64();
    let checked = check_failures(&sh)
        .and_then(|()| global_check(&sh, &idle).context("the checks at the end"));
    let st = sh.stats.into_inner().unwrap();
    let bound_s = bound.as_secs_f64();
    let figures = Figures {
        opts: opts.clone(),
        baseline: baseline.clone(),
        load_secs,
        iterations: st.iteration_ms.len() as u64,
        interrupted: st.interrupted,
        iteration_ms: st.iteration_ms,
        exec_ms: st.exec_ms,
        create_ms: st.create_ms,
        rss_max: st.rss_max,
        rss_last: st.rss_last,
        commits: sh.commits.into_inner().unwrap().len(),
        faults: sh.faults.into_inner().unwrap(),
        bound_s,
        loadavg: std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_string(),
        total_secs: 0.0,
    };
    if let Err(e) = checked {
        println!("soak: FAILED; what it measured until then:");
        figures.print(false);
        return Err(e);
    }
    if let Some(worst) = figures.iteration_ms.iter().cloned().reduce(f64::max)
        && worst > bound_s * 1e3
    {
        bail!(
            "an iteration took {:.0} s, past the latency bound of {bound_s:.0} s",
            worst / 1e3
        );
    }
    Ok(figures)
}

fn check_failures(sh: &Shared) -> Result<()> {
    let f = sh.failures.lock().unwrap();
    if !f.is_empty() {
        bail!("{}", f.join("\n"));
    }
    Ok(())
}

fn sample_rss(sh: &Shared) {
    while !sh.stopping() {
        if let Some(rss) = sh.env.daemon_pid().and_then(proc::rss_bytes) {
            let mut s = sh.stats.lock().unwrap();
            s.rss_max = s.rss_max.max(rss);
            s.rss_last = rss;
            s.rss_samples += 1;
        }
        std::thread::sleep(RSS_EVERY);
    }
}

/// Every reported commit present, `fsck` clean, every idle workspace's marker intact.
fn global_check(sh: &Shared, idle: &[String]) -> Result<()> {
    let mc = &sh.env.mc;
    let fsck = mc.run(&["--json", "fsck"], ADMIN_DEADLINE)?;
    if !fsck.ok() {
        bail!("fsck is not clean: {} {}", fsck.stdout, fsck.describe());
    }
    // The commits reported so far, read before the store's list: a commit reported
    // after the list was read would look missing.
    let commits = sh.commits.lock().unwrap().clone();
    let have = snapshot_ids(mc)?;
    let missing: Vec<&String> = commits.iter().filter(|c| !have.contains(*c)).collect();
    if !missing.is_empty() {
        bail!(
            "{} reported commits are missing from the store: {missing:?}",
            missing.len()
        );
    }
    for name in idle {
        let got = mc.ok(
            &["fs", "cat", &format!("{name}:soak/marker")],
            ADMIN_DEADLINE,
        )?;
        if got.stdout != *name {
            bail!("{name}: its marker holds {:?}", got.stdout);
        }
    }
    Ok(())
}

/// Injects the faults: the kinds shuffled by the seed and cycled, each at a random
/// moment, each checked.
fn inject(sh: &Shared, idle: &[String], duration: Duration) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(sh.opts.seed);
    let mut kinds = ALL_FAULTS.to_vec();
    rng.shuffle(&mut kinds);
    // About one fault per 20 s of load in the short form, one per 2 min in an hour.
    let n = ((duration.as_secs_f64() / 20.0) as usize).clamp(ALL_FAULTS.len(), 60);
    let gap = duration.as_secs_f64() / (n as f64 + 1.0);
    let end = Instant::now() + duration;
    // Let the workers start their sandboxes first.
    wait(sh, Duration::from_secs_f64(gap.min(20.0)));
    for k in 0.. {
        let pause = gap * (0.25 + 0.5 * rng.f64());
        if Instant::now() + Duration::from_secs_f64(pause) >= end && k >= ALL_FAULTS.len() {
            break;
        }
        if !wait(sh, Duration::from_secs_f64(pause)) {
            break;
        }
        let fault = kinds[k % kinds.len()];
        let at_s = sh.started.elapsed().as_secs_f64();
        let (target, outcome) =
            one(sh, fault, idle, &mut rng).with_context(|| format!("fault {fault:?}"))?;
        global_check(sh, idle).with_context(|| format!("the checks after fault {fault:?}"))?;
        eprintln!("soak: fault {fault:?} {target}: {outcome}; checks clean");
        sh.faults.lock().unwrap().push(FaultRecord {
            at_s,
            fault,
            target,
            outcome,
        });
        if k + 1 >= ALL_FAULTS.len() {
            sh.every_fault_done.store(true, Ordering::SeqCst);
        }
        if Instant::now() >= end && k + 1 >= ALL_FAULTS.len() {
            break;
        }
    }
    Ok(())
}

/// Sleeps `d` unless the soak stops (false then).
fn wait(sh: &Shared, d: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < d {
        if sh.stopping() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    !sh.stopping()
}

/// Carries out one fault; returns its target and how it ended.
fn one(
    sh: &Shared,
    fault: Fault,
    idle: &[String],
    rng: &mut fastrand::Rng,
) -> Result<(String, String)> {
    let mc = &sh.env.mc;
    match fault {
        Fault::KillDaemon => {
            let pid = sh.env.daemon_pid().context("no daemon of this root runs")?;
            proc::kill9(pid)?;
            let t = Instant::now();
            while proc::alive(pid) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            mc.ok(&["daemon", "start"], ADMIN_DEADLINE)?;
            let again = sh
                .env
                .daemon_pid()
                .context("the daemon did not start again")?;
            Ok((
                format!("fsd pid {pid}"),
                format!("daemon started again (pid {again})"),
            ))
        }
        Fault::KillKeeper | Fault::KillInit => {
            let key = if fault == Fault::KillKeeper {
                "keeper_pid"
            } else {
                "init_pid"
            };
            let i = pick_worker(sh, rng)?;
            let slot = &sh.slots[i];
            let info = slot.info.lock().unwrap().clone().context("no sandbox")?;
            let pid = info[key]
                .as_u64()
                .context("no pid in the sandbox's record")? as u32;
            *slot.outcome.lock().unwrap() = None;
            slot.pending.store(true, Ordering::SeqCst);
            proc::kill9(pid)?;
            let outcome = await_outcome(sh, slot)?;
            Ok((format!("worker {i} {key} {pid}"), outcome))
        }
        Fault::DiskFull | Fault::ForkBomb | Fault::MemoryHog => {
            let i = pick_worker(sh, rng)?;
            let slot = &sh.slots[i];
            *slot.outcome.lock().unwrap() = None;
            *slot.mailbox.lock().unwrap() = Some(fault);
            let outcome = await_outcome(sh, slot)?;
            Ok((format!("worker {i}"), outcome))
        }
        Fault::KillMountctlCreate => {
            let name = format!(
                "{}-t{}",
                sh.env.tag,
                sh.transient.fetch_add(1, Ordering::SeqCst)
            );
            let typical = proc::quantile(&sh.stats.lock().unwrap().create_ms, 0.5);
            let delay = kill_delay(rng, typical);
            let run = mc.spawn(
                &[
                    "create",
                    "soak/base",
                    "--name",
                    &name,
                    "--disk",
                    &sh.opts.disk,
                ],
                None,
            )?;
            let outcome = kill_after(run, delay)?;
            mc.ok(&["-q", "sweep"], ADMIN_DEADLINE)?;
            let state = settle(sh, &name)?;
            Ok((
                name,
                format!("killed after {delay} ms ({outcome}); {state}"),
            ))
        }
        Fault::KillMountctlCommit => {
            let name = &idle[rng.usize(0..idle.len())];
            let n = sh.transient.fetch_add(1, Ordering::SeqCst);
            // `fs write` of the file a commit then holds.
            let write = |text: String| -> Result<()> {
                let w = mc.run_in(
                    &["fs", "write", &format!("{name}:soak/c.txt")],
                    text.as_bytes(),
                    ADMIN_DEADLINE,
                )?;
                if !w.ok() {
                    bail!("fs write {name}:soak/c.txt: {}", w.describe());
                }
                Ok(())
            };
            write(format!("{n}"))?;
            // A commit run to its end first times this commit's kind of work.
            let timed = mc.ok(
                &["commit", name, "-m", "timed", "--allow-empty"],
                ADMIN_DEADLINE,
            )?;
            write(format!("{n} again"))?;
            let delay = kill_delay(rng, timed.ms);
            let run = mc.spawn(&["commit", name, "-m", "killed"], None)?;
            let outcome = kill_after(run, delay)?;
            mc.ok(&["-q", "sweep"], ADMIN_DEADLINE)?;
            let c = mc.json(
                &[
                    "commit",
                    name,
                    "-m",
                    "after a killed commit",
                    "--allow-empty",
                ],
                ADMIN_DEADLINE,
            )?;
            let snap = c["snapshot"]
                .as_str()
                .context("commit: no snapshot")?
                .to_string();
            let shown = mc.ok(&["show", &snap, "soak/c.txt"], ADMIN_DEADLINE);
            sh.commits.lock().unwrap().push(snap.clone());
            let back = mc.ok(
                &["fs", "cat", &format!("{name}:soak/c.txt")],
                ADMIN_DEADLINE,
            )?;
            if back.stdout != format!("{n} again") {
                bail!(
                    "{name}: soak/c.txt holds {:?} after a killed commit, {n} was written",
                    back.stdout
                );
            }
            Ok((
                name.clone(),
                format!(
                    "killed after {delay} ms ({outcome}); the next commit {} {}",
                    &snap[..12],
                    if shown.is_ok() {
                        "holds the file"
                    } else {
                        "made"
                    }
                ),
            ))
        }
        Fault::KillMountctlRemove => {
            let name = format!(
                "{}-t{}",
                sh.env.tag,
                sh.transient.fetch_add(1, Ordering::SeqCst)
            );
            // A removal run to its end first times this kind of work.
            sh.create_workspace(&name)?;
            let timed = mc.ok(&["-q", "remove", "--force", &name], ADMIN_DEADLINE)?;
            sh.create_workspace(&name)?;
            let delay = kill_delay(rng, timed.ms);
            let run = mc.spawn(&["remove", "--force", &name], None)?;
            let outcome = kill_after(run, delay)?;
            mc.ok(&["-q", "sweep"], ADMIN_DEADLINE)?;
            let state = settle(sh, &name)?;
            Ok((
                name,
                format!("killed after {delay} ms ({outcome}); {state}"),
            ))
        }
    }
}

/// A worker with a running sandbox and no fault under way.
fn pick_worker(sh: &Shared, rng: &mut fastrand::Rng) -> Result<usize> {
    let t = Instant::now();
    loop {
        let i = rng.usize(0..sh.slots.len());
        let s = &sh.slots[i];
        if s.info.lock().unwrap().is_some()
            && !s.pending.load(Ordering::SeqCst)
            && s.mailbox.lock().unwrap().is_none()
        {
            return Ok(i);
        }
        if t.elapsed() > Duration::from_secs(120) || sh.stopping() {
            bail!("no worker has a running sandbox to aim a fault at");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn await_outcome(sh: &Shared, slot: &Slot) -> Result<String> {
    let t = Instant::now();
    loop {
        if let Some(r) = slot.outcome.lock().unwrap().take() {
            return r.map_err(|e| anyhow::anyhow!(e));
        }
        if sh.stopping() {
            return Ok("the soak stopped first".into());
        }
        if t.elapsed() > sh.bound * 2 {
            bail!("the worker did not report within {:?}", sh.bound * 2);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A random moment within a command's typical duration (`typical_ms`), so that most
/// kills land mid-command.
fn kill_delay(rng: &mut fastrand::Rng, typical_ms: f64) -> u64 {
    let top = (typical_ms as u64).clamp(1, MOUNTCTL_KILL_MAX_MS);
    rng.u64(0..top)
}

fn kill_after(run: proc::Running, delay_ms: u64) -> Result<String> {
    std::thread::sleep(Duration::from_millis(delay_ms));
    let pid = run.pid();
    let _ = proc::kill9(pid);
    let out = run.wait(ADMIN_DEADLINE)?;
    Ok(match out.code {
        None => "killed mid-command".into(),
        Some(c) => format!("it had ended already, exit {c}"),
    })
}

/// After a `mountctl` killed mid-create or mid-remove and a `sweep`: the workspace is
/// either gone or usable (a file written and read through the files API), and a
/// `remove --force` takes it away leaving no mount; its name can be made again.
fn settle(sh: &Shared, name: &str) -> Result<String> {
    let mc = &sh.env.mc;
    let list = sh.env.workspaces()?;
    let rec = list
        .iter()
        .find(|w| w["name"].as_str() == Some(name) && w["status"].as_str() != Some("removed"));
    let state = match rec {
        None => "gone after sweep".to_string(),
        Some(w) => {
            let status = w["status"].as_str().unwrap_or("?").to_string();
            if status == "active" {
                let target = format!("{name}:soak-probe");
                let wr = mc.run_in(&["fs", "write", &target], b"probe", ADMIN_DEADLINE)?;
                let back = mc.run(&["fs", "cat", &target], ADMIN_DEADLINE)?;
                if !wr.ok() || back.stdout != "probe" {
                    bail!(
                        "{name}: active after sweep but not usable: {} / {}",
                        wr.describe(),
                        back.describe()
                    );
                }
            }
            mc.ok(&["-q", "remove", "--force", name], ADMIN_DEADLINE)?;
            format!("{status} after sweep, usable, removed")
        }
    };
    let path = sh.env.root.join("workspaces");
    for m in sh.env.mounts() {
        if m.starts_with(&path.display().to_string()) && m.ends_with("/mnt") {
            let id_dir = std::path::Path::new(&m).parent().map(|p| p.to_path_buf());
            if let Some(d) = id_dir
                && !list.iter().any(|w| {
                    w["private_dir"].as_str() == Some(&d.display().to_string())
                        && w["name"].as_str() != Some(name)
                })
            {
                bail!("{name}: mount {m} remains after it was removed");
            }
        }
    }
    sh.create_workspace(name)?;
    mc.ok(&["-q", "remove", "--force", name], ADMIN_DEADLINE)?;
    Ok(format!("{state}; its name made again and removed"))
}

/// After the load: every worker's sandbox stopped, `sweep`, nothing of a sandbox left.
pub fn final_checks(env: &Env) -> Result<()> {
    let mc = &env.mc;
    for ws in env.workspaces()? {
        if ws["sandbox"].is_object() {
            let id = ws["id"].as_str().unwrap_or_default();
            mc.ok(&["-q", "sandbox", "stop", id], ADMIN_DEADLINE)?;
        }
    }
    mc.ok(&["-q", "sweep"], ADMIN_DEADLINE)?;
    let left = env.no_sandbox_leftovers();
    if !left.is_empty() {
        bail!(
            "after every sandbox stopped and a sweep: {}",
            left.join("; ")
        );
    }
    let fsck = mc.run(&["--json", "fsck"], ADMIN_DEADLINE)?;
    if !fsck.ok() {
        bail!("fsck at the end is not clean: {}", fsck.stdout);
    }
    for ws in env.workspaces()? {
        if ws["status"].as_str() == Some("removed") {
            continue;
        }
        let id = ws["id"].as_str().unwrap_or_default();
        mc.ok(&["-q", "remove", "--force", id], ADMIN_DEADLINE)?;
    }
    let ws_prefix = format!("{}/", env.root.join("workspaces").display());
    let left: Vec<String> = env
        .mounts()
        .into_iter()
        .filter(|m| m.starts_with(&ws_prefix))
        .collect();
    if !left.is_empty() {
        bail!("after every workspace was removed, mounts remain: {left:?}");
    }
    Ok(())
}
