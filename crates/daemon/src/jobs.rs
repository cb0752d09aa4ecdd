//! Fetches the daemon has accepted: each recorded on disk when accepted (so a daemon restarted
//! after a crash or a kill takes up again every one not finished), run on a thread of its own,
//! and reporting what it does as numbered events a client follows and resumes from the last
//! id it saw. Records of ended jobs are dropped a week after they ended, when the daemon next
//! starts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::fetch::Fetched;
use crate::DaemonError;

/// Progress events at most this often per job.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// Events kept per job: the first, the last ones, and the end.
const KEEP_EVENTS: usize = 256;
/// How long the record of an ended job is kept (it is dropped when the daemon next starts).
const KEEP_ENDED: Duration = Duration::from_secs(7 * 24 * 3600);
/// A restarted job's events are numbered from `restarts × this`, after all of its earlier ones.
const IDS_PER_RUN: u64 = 1 << 32;

/// A job as it is recorded (`DATA/jobs/ID.json`) and reported.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub ticket: String,
    pub path: Option<PathBuf>,
    pub state: State,
    /// Times the daemon started it again after a restart.
    pub restarts: u64,
    pub error: Option<String>,
    pub report: Option<Fetched>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Running,
    Done,
    Failed,
}

/// What a job reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// Increasing within the job, across daemon restarts too.
    pub id: u64,
    #[serde(flatten)]
    pub what: What,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum What {
    /// Started (again, after a restart, when `restarts` > 0).
    Started {
        size: u64,
        restarts: u64,
    },
    /// Bytes of chunks in hand (already held or fetched) of the object's size.
    Progress {
        bytes: u64,
        size: u64,
    },
    Done {
        report: Fetched,
    },
    Failed {
        error: String,
    },
}

impl What {
    pub fn is_end(&self) -> bool {
        matches!(self, What::Done { .. } | What::Failed { .. })
    }
}

struct Live {
    job: Mutex<Job>,
    events: Mutex<Vec<Event>>,
    next: Mutex<(u64, Instant)>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Live {
    fn new(job: Job) -> Arc<Live> {
        let first = job.restarts * IDS_PER_RUN + 1;
        Arc::new(Live {
            job: Mutex::new(job),
            events: Mutex::new(vec![]),
            next: Mutex::new((first, Instant::now() - PROGRESS_EVERY)),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    /// Records an event (a progress event only when the last is old enough, or `force`).
    fn emit(&self, what: What, force: bool) {
        let id = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let is_progress = matches!(what, What::Progress { .. });
            if is_progress && !force && next.1.elapsed() < PROGRESS_EVERY {
                return;
            }
            if is_progress {
                next.1 = Instant::now();
            }
            next.0 += 1;
            next.0 - 1
        };
        let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        ev.push(Event { id, what });
        if ev.len() > KEEP_EVENTS {
            let cut = ev.len() - KEEP_EVENTS / 2;
            ev.drain(1..cut);
        }
        drop(ev);
        self.changed.send_replace(id);
    }
}

/// The daemon's jobs.
pub struct Jobs {
    dir: PathBuf,
    live: Mutex<HashMap<String, Arc<Live>>>,
}

/// What runs a job: fetches (and installs) the ticket's object, telling `progress` the bytes
/// in hand.
pub type Runner =
    Arc<dyn Fn(&Job, &(dyn Fn(u64) + Sync)) -> Result<Fetched, DaemonError> + Send + Sync>;

impl Jobs {
    /// Opens the jobs in `dir`, and starts again (with `run`) every one not finished.
    pub fn open(dir: &Path, run: Runner) -> Result<Arc<Jobs>, DaemonError> {
        std::fs::create_dir_all(dir).map_err(DaemonError::file("create", dir))?;
        let jobs = Arc::new(Jobs {
            dir: dir.to_path_buf(),
            live: Mutex::new(HashMap::new()),
        });
        let entries = std::fs::read_dir(dir).map_err(DaemonError::file("read", dir))?;
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let job: Job = match std::fs::read(&p)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            {
                Some(j) => j,
                None => {
                    tracing::warn!("{}: not a job record; ignored", p.display());
                    continue;
                }
            };
            let again = job.state == State::Running;
            // An ended job's record is kept a while for whoever follows it, then forgotten.
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > KEEP_ENDED);
            if !again && old {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            let job = if again {
                Job {
                    restarts: job.restarts + 1,
                    ..job
                }
            } else {
                job
            };
            let live = Live::new(job.clone());
            jobs.lock().insert(job.id.clone(), live.clone());
            if again {
                tracing::info!("taking up fetch {} again", job.id);
                jobs.save(&job)?;
                jobs.start(live, run.clone());
            } else {
                let end = match (&job.report, &job.error) {
                    (Some(r), _) => What::Done { report: r.clone() },
                    (None, e) => What::Failed {
                        error: e.clone().unwrap_or_default(),
                    },
                };
                live.emit(end, true);
            }
        }
        Ok(jobs)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accepts a fetch: recorded durably before this returns, then run.
    pub fn accept(
        &self,
        ticket: String,
        path: Option<PathBuf>,
        run: Runner,
    ) -> Result<Job, DaemonError> {
        let job = Job {
            id: hex::encode(rand::random::<[u8; 8]>()),
            ticket,
            path,
            state: State::Running,
            restarts: 0,
            error: None,
            report: None,
        };
        self.save(&job)?;
        let live = Live::new(job.clone());
        self.lock().insert(job.id.clone(), live.clone());
        self.start(live, run);
        Ok(job)
    }

    fn start(self: &Jobs, live: Arc<Live>, run: Runner) {
        let dir = self.dir.clone();
        std::thread::spawn(move || {
            let job = live.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let size = job
                .ticket
                .parse::<crate::Ticket>()
                .map(|t| t.size)
                .unwrap_or(0);
            live.emit(
                What::Started {
                    size,
                    restarts: job.restarts,
                },
                true,
            );
            let progress = |bytes| live.emit(What::Progress { bytes, size }, false);
            let r = run(&job, &progress);
            let mut done = job.clone();
            let end = match r {
                Ok(report) => {
                    live.emit(What::Progress { bytes: size, size }, true);
                    done.state = State::Done;
                    done.report = Some(report.clone());
                    What::Done { report }
                }
                Err(e) => {
                    done.state = State::Failed;
                    done.error = Some(e.to_string());
                    What::Failed {
                        error: e.to_string(),
                    }
                }
            };
            if let Err(e) = save(&dir, &done) {
                tracing::error!("cannot record the end of fetch {}: {e}", done.id);
            }
            *live.job.lock().unwrap_or_else(|e| e.into_inner()) = done;
            live.emit(end, true);
        });
    }

    fn save(&self, job: &Job) -> Result<(), DaemonError> {
        save(&self.dir, job)
    }

    pub fn get(&self, id: &str) -> Option<Job> {
        let live = self.lock().get(id)?.clone();
        let job = live.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Some(job)
    }

    /// The job's events after `after`, waiting (at most `wait`) for one when there are none
    /// yet; `None` if there is no such job.
    pub async fn events(&self, id: &str, after: u64, wait: Duration) -> Option<Vec<Event>> {
        let live = self.lock().get(id)?.clone();
        let mut rx = live.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let ev: Vec<Event> = {
                let all = live.events.lock().unwrap_or_else(|e| e.into_inner());
                let after_it: Vec<Event> = all.iter().filter(|e| e.id > after).cloned().collect();
                match all.last() {
                    // Asked after the end: nothing more will come; the end again says so.
                    Some(end) if after_it.is_empty() && end.what.is_end() => vec![end.clone()],
                    _ => after_it,
                }
            };
            if !ev.is_empty() {
                return Some(ev);
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Some(vec![]);
            }
        }
    }
}

/// Writes a job's record atomically and durably.
fn save(dir: &Path, job: &Job) -> Result<(), DaemonError> {
    use std::io::Write;
    let path = dir.join(format!("{}.json", job.id));
    let mut tmp = tempfile::Builder::new()
        .prefix(".job")
        .tempfile_in(dir)
        .map_err(DaemonError::file("create a file in", dir))?;
    let bytes = serde_json::to_vec_pretty(job).map_err(|e| DaemonError::Damaged(e.to_string()))?;
    tmp.write_all(&bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(DaemonError::file("write", &path))?;
    tmp.persist(&path)
        .map_err(|e| DaemonError::file("write", &path)(e.error))?;
    crate::sync_dir(dir);
    Ok(())
}
