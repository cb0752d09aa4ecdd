//! The engine against real stores and files, and against sources that stall, lie or fail on
//! purpose. No test depends on timing: a stalled source waits on a gate the test opens, and
//! what depends on which of two sources proves faster is not asserted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use ferry_format::{HashAlg, Id, Recipe};
use ferry_store::{ChunkStore, MemStore, StoreError, VerifiedChunk};
use ferry_transfer::{
    fetch, EngineError, FileIndex, FilesSource, Options, Place, Sink, Source, SourceError,
    StoreSource, Want,
};

fn chunk(i: u64) -> Vec<u8> {
    let mut v = vec![0u8; 1000 + (i as usize % 7) * 100];
    blake3::Hasher::new_derive_key("ferry transfer tests")
        .update(&i.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

fn want(data: &[u8]) -> Want {
    Want {
        id: Id::hash(HashAlg::Blake3, data),
        len: data.len() as u32,
        place: None,
    }
}

fn store_of(items: impl IntoIterator<Item = u64>) -> MemStore {
    let s = MemStore::new(HashAlg::Blake3);
    for i in items {
        s.put(&VerifiedChunk::hash(HashAlg::Blake3, &chunk(i)))
            .unwrap();
    }
    s
}

fn wants(n: u64) -> Vec<Want> {
    (0..n).map(|i| want(&chunk(i))).collect()
}

fn holds_all(sink: &MemStore, wants: &[Want]) {
    for w in wants {
        assert!(sink.contains(&w.id).unwrap(), "{} missing", w.id);
    }
}

/// A remote-like source over a store: it cannot tell what it holds (so it is asked for
/// everything), keeps `depth` requests outstanding, and may stall or fail.
struct Remote<'a> {
    name: &'static str,
    store: &'a MemStore,
    pending: VecDeque<Vec<Want>>,
    depth: usize,
    /// Answers wait until the gate opens.
    gate: Option<Arc<Gate>>,
    /// A gate this source opens once it has failed or lied (for another source to wait on).
    opens: Option<Arc<Gate>>,
    /// Fails at this receive (counting from 0).
    fail_at: Option<usize>,
    received: usize,
    /// Answers every chunk with these bytes instead.
    lie: bool,
    /// Requests whose answers were abandoned (dropped unreceived).
    abandoned: usize,
    /// Gone silent: every receive waits until this gate opens (its interrupter opens it), then
    /// fails.
    silent: Option<Arc<Gate>>,
    /// Says it reads from this machine (a device), with this rate known before the fetch.
    local: bool,
    hint: Option<f64>,
    /// Every id it was asked for.
    asked: Vec<Id>,
    /// Waits at its gate at most this long.
    gate_limit: Option<std::time::Duration>,
    /// Opens `opens` when first asked for something.
    opens_on_request: bool,
    /// The most one request may name, and the bytes each request named.
    batch: ferry_transfer::Batch,
    sizes: Vec<u64>,
}

impl<'a> Remote<'a> {
    fn new(name: &'static str, store: &'a MemStore) -> Self {
        Remote {
            name,
            store,
            pending: VecDeque::new(),
            depth: 2,
            gate: None,
            opens: None,
            fail_at: None,
            received: 0,
            lie: false,
            abandoned: 0,
            silent: None,
            local: false,
            hint: None,
            asked: vec![],
            gate_limit: None,
            opens_on_request: false,
            batch: ferry_transfer::Batch {
                chunks: 8,
                bytes: 1 << 20,
            },
            sizes: vec![],
        }
    }
}

impl Source for Remote<'_> {
    fn name(&self) -> String {
        self.name.into()
    }
    fn depth(&self) -> usize {
        self.depth
    }
    fn batch(&self) -> ferry_transfer::Batch {
        self.batch
    }
    fn local(&self) -> bool {
        self.local
    }
    fn rate_hint(&self) -> Option<f64> {
        self.hint
    }
    fn request(&mut self, wants: &[Want]) -> Result<(), SourceError> {
        self.asked.extend(wants.iter().map(|w| w.id));
        self.sizes.push(wants.iter().map(|w| w.len as u64).sum());
        if let (true, Some(g)) = (self.opens_on_request, &self.opens) {
            g.open();
        }
        self.pending.push_back(wants.to_vec());
        Ok(())
    }
    fn interrupter(&self) -> Option<ferry_transfer::Interrupter> {
        let g = self.silent.clone()?;
        Some(Box::new(move || g.open()))
    }
    fn abandon(&mut self, n: usize) {
        for _ in 0..n {
            self.pending.pop_front().expect("asked");
            self.abandoned += 1;
        }
    }
    fn receive(&mut self) -> Result<Vec<Option<Vec<u8>>>, SourceError> {
        if let Some(g) = &self.silent {
            g.wait(None);
            return Err(SourceError::new("hung up"));
        }
        if let Some(g) = &self.gate {
            g.wait(self.gate_limit);
        }
        if self.fail_at == Some(self.received) {
            if let Some(g) = &self.opens {
                g.open();
            }
            return Err(SourceError::new("the link went down"));
        }
        self.received += 1;
        let wants = self.pending.pop_front().expect("asked");
        if self.lie {
            if let Some(g) = &self.opens {
                g.open();
            }
        }
        Ok(wants
            .iter()
            .map(|w| {
                if self.lie {
                    return Some(vec![7u8; w.len as usize]);
                }
                self.store.get(&w.id).unwrap()
            })
            .collect())
    }
}

#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    /// Waits until it opens, or at most `limit`.
    fn wait(&self, limit: Option<std::time::Duration>) {
        let deadline = limit.map(|l| std::time::Instant::now() + l);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = match deadline {
                None => self.cv.wait(open).unwrap(),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    self.cv.wait_timeout(open, left).unwrap().0
                }
            };
        }
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// A sink over a store that opens a gate once `n` chunks have arrived.
struct OpensAt<'a> {
    store: &'a MemStore,
    n: usize,
    got: AtomicUsize,
    gate: Arc<Gate>,
}

impl Sink for OpensAt<'_> {
    fn deliver(&self, i: usize, c: VerifiedChunk<'_>) -> Result<(), StoreError> {
        self.store.deliver(i, c)?;
        if self.got.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            self.gate.open();
        }
        Ok(())
    }
}

#[test]
fn every_chunk_comes_verified_from_a_store() {
    let far = store_of(0..100);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(100);
    let mut s = StoreSource::new("far", &far);
    let r = fetch(&mut [&mut s], &w, &near, &Options::default()).unwrap();
    holds_all(&near, &w);
    assert_eq!(r.chunks(), 100);
    assert_eq!(r.bytes(), w.iter().map(|w| w.len as u64).sum::<u64>());
}

#[test]
fn not_here_sends_a_chunk_to_the_next_source() {
    // Each remote holds half; both are asked for everything they may have (all of it).
    let (a, b) = (store_of(0..50), store_of(50..100));
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(100);
    let (mut ra, mut rb) = (Remote::new("a", &a), Remote::new("b", &b));
    let r = fetch(&mut [&mut ra, &mut rb], &w, &near, &Options::default()).unwrap();
    holds_all(&near, &w);
    assert_eq!(r.chunks(), 100);
    assert!(r.sources[0].misses + r.sources[1].misses > 0, "{r:?}");
}

#[test]
fn a_chunk_no_source_has_fails_the_fetch_and_keeps_the_rest() {
    let far = store_of(0..10);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(11);
    let mut ra = Remote::new("far", &far);
    let e = fetch(&mut [&mut ra], &w, &near, &Options::default()).unwrap_err();
    match e {
        EngineError::NotFound { id, tried, lied } => {
            assert_eq!(id, w[10].id);
            assert_eq!(tried, "far");
            assert!(!lied);
        }
        other => panic!("{other:?}"),
    }
    holds_all(&near, &w[..10]);
}

#[test]
fn wrong_bytes_are_never_delivered() {
    let good = store_of(0..40);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(40);
    let mut liar = Remote::new("liar", &good);
    liar.lie = true;
    let mut honest = Remote::new("honest", &good);
    // What the liar sends is rejected, and the honest source is asked. (The honest one
    // answers only once the liar has: on a busy machine it could otherwise do all the work
    // before the liar's first answer arrives.)
    let gate = Arc::new(Gate::default());
    liar.opens = Some(gate.clone());
    honest.gate = Some(gate);
    let r = fetch(
        &mut [&mut liar, &mut honest],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    for x in &w {
        let got = near.get(&x.id).unwrap().unwrap();
        assert!(x.id.matches(&got));
    }
    assert_eq!(r.sources[0].chunks, 0, "{r:?}");
    assert!(r.sources[0].rejected > 0, "{r:?}");
    // A liar alone gets nowhere.
    let near = MemStore::new(HashAlg::Blake3);
    let mut liar = Remote::new("liar", &good);
    liar.lie = true;
    assert!(matches!(
        fetch(&mut [&mut liar], &w, &near, &Options::default()),
        Err(EngineError::NotFound { lied: true, .. })
    ));
    assert!(ChunkStore::is_empty(&near).unwrap());
}

#[test]
fn a_failed_source_leaves_its_requests_to_the_others() {
    let far = store_of(0..200);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(200);
    let mut flaky = Remote::new("flaky", &far);
    flaky.fail_at = Some(2);
    let mut steady = Remote::new("steady", &far);
    // The steady one answers once the flaky one has failed (else, on a busy machine, it could
    // do all the work before that).
    let gate = Arc::new(Gate::default());
    flaky.opens = Some(gate.clone());
    steady.gate = Some(gate);
    let r = fetch(
        &mut [&mut flaky, &mut steady],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    assert_eq!(r.sources[0].failed.as_deref(), Some("the link went down"));
    assert_eq!(r.chunks(), 200);
    // Every source failing fails the fetch; what arrived stays.
    let near = MemStore::new(HashAlg::Blake3);
    let mut flaky = Remote::new("flaky", &far);
    flaky.fail_at = Some(3);
    let e = fetch(&mut [&mut flaky], &w, &near, &Options::default()).unwrap_err();
    assert!(
        matches!(e, EngineError::Sources(ref m) if m == "the link went down"),
        "{e:?}"
    );
    assert!(near.stats().unwrap().chunks >= 8);
}

#[test]
fn an_idle_source_borrows_the_requests_of_a_stalled_one() {
    // `slow` holds its answers until every chunk has arrived: only borrowing can get there.
    // `fast` starts once `slow` has been asked for something, however the threads are run.
    let far = store_of(0..64);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(64);
    let gate = Arc::new(Gate::default());
    let asked = Arc::new(Gate::default());
    let mut slow = Remote::new("slow", &far);
    slow.gate = Some(gate.clone());
    slow.opens = Some(asked.clone());
    slow.opens_on_request = true;
    let mut fast = Remote::new("fast", &far);
    fast.gate = Some(asked);
    let sink = OpensAt {
        store: &near,
        n: 64,
        got: AtomicUsize::new(0),
        gate,
    };
    let r = fetch(&mut [&mut slow, &mut fast], &w, &sink, &Options::default()).unwrap();
    holds_all(&near, &w);
    assert_eq!(r.sources[0].chunks, 0, "{r:?}");
    assert_eq!(r.sources[1].chunks, 64, "{r:?}");
    assert!(r.sources[1].borrowed > 0, "{r:?}");
    // What the slow one had been asked for arrived twice, or was not asked at all: each
    // chunk is delivered once either way.
    assert_eq!(r.chunks(), 64);
    // It waited for one answer at most (the one it was blocked on when everything had
    // arrived); every other request it had was abandoned, not received: a slow link's last
    // answers never hold the end of a fetch.
    assert!(!slow.asked.is_empty());
    assert!(slow.received <= 1, "{}", slow.received);
    assert!(
        slow.pending.is_empty(),
        "every request answered or abandoned"
    );
}

#[test]
fn a_source_gone_silent_is_interrupted_once_everything_arrived() {
    // `mute` never answers (a link that lost every packet) until interrupted: the others
    // bring everything (borrowing its requests), then the fetch hangs it up and ends.
    let far = store_of(0..64);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(64);
    let gate = Arc::new(Gate::default());
    let mut mute = Remote::new("mute", &far);
    mute.silent = Some(gate.clone());
    let mut fast = Remote::new("fast", &far);
    let opts = Options {
        grace: std::time::Duration::ZERO,
        ..Options::default()
    };
    let r = fetch(&mut [&mut mute, &mut fast], &w, &near, &opts).unwrap();
    holds_all(&near, &w);
    assert_eq!(r.sources[1].chunks, 64, "{r:?}");
    assert!(*gate.open.lock().unwrap(), "interrupted");
}

#[test]
fn a_store_is_asked_only_for_what_it_holds() {
    let cache = store_of(0..30);
    let far = store_of(0..100);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(100);
    let mut local = StoreSource::new("cache", &cache);
    let mut remote = Remote::new("far", &far);
    let r = fetch(
        &mut [&mut local, &mut remote],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    assert_eq!(r.sources[0].misses, 0, "{r:?}");
    assert_eq!(r.chunks(), 100);
}

#[test]
fn a_local_source_ahead_is_searched_first() {
    // A device holding the first half, the network all. (Which of the two then proves the
    // faster here, and takes more, is the machine's business: the gate itself is tested in
    // engine/gate.rs.) Without borrowing, the device's first batch is its own.
    let stick = store_of(0..50);
    let far = store_of(0..100);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(100);
    let mut device = Remote::new("stick", &stick);
    device.local = true;
    let mut remote = Remote::new("far", &far);
    let opts = Options {
        borrowing: false,
        ..Options::default()
    };
    let r = fetch(&mut [&mut device, &mut remote], &w, &near, &opts).unwrap();
    holds_all(&near, &w);
    assert_eq!(r.chunks(), 100, "{r:?}");
    assert!(r.sources[0].chunks > 0, "{r:?}");
}

#[test]
fn what_a_local_source_misses_goes_to_the_network() {
    // The device's index claims everything, but it holds only the even chunks.
    let stick = store_of((0..40).filter(|i| i % 2 == 0));
    let far = store_of(0..40);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(40);
    let mut device = Remote::new("stick", &stick);
    device.local = true;
    let mut remote = Remote::new("far", &far);
    let r = fetch(
        &mut [&mut device, &mut remote],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    // Every odd one from the network (which may also have taken some even ones).
    assert_eq!(r.chunks(), 40, "{r:?}");
    assert!(r.sources[1].chunks >= 20, "{r:?}");
}

#[test]
fn a_local_source_slower_than_the_link_gives_way() {
    // The device stalls (a stuck read) until everything has arrived; the link is known to be
    // fast. Waited for, the device shows as ever slower, and the link takes its work: the
    // queued wants and, borrowed, the batch the device is stuck on.
    let stick = store_of(0..64);
    let far = store_of(0..64);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(64);
    let gate = Arc::new(Gate::default());
    let mut device = Remote::new("stick", &stick);
    device.local = true;
    device.gate = Some(gate.clone());
    let mut remote = Remote::new("far", &far);
    remote.hint = Some(1e12);
    let sink = OpensAt {
        store: &near,
        n: 64,
        got: AtomicUsize::new(0),
        gate,
    };
    let r = fetch(
        &mut [&mut device, &mut remote],
        &w,
        &sink,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    assert_eq!((r.sources[0].chunks, r.sources[1].chunks), (0, 64), "{r:?}");
}

#[test]
fn a_link_of_unknown_rate_probes_and_takes_over_from_a_slower_device() {
    // The link's rate is unknown and everything is on the device, which stalls until the link
    // has asked for something (or a minute has passed): only a probe gets the link asked and
    // measured. (Which of the two then brings the rest depends on how the threads are
    // scheduled once the device wakes: a busy machine may give it all to the device.)
    let stick = store_of(0..64);
    let far = store_of(0..64);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(64);
    let gate = Arc::new(Gate::default());
    let mut device = Remote::new("stick", &stick);
    device.local = true;
    device.gate = Some(gate.clone());
    device.gate_limit = Some(std::time::Duration::from_secs(60));
    let mut remote = Remote::new("far", &far);
    remote.opens = Some(gate);
    remote.opens_on_request = true;
    let r = fetch(
        &mut [&mut device, &mut remote],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    assert!(!remote.asked.is_empty(), "the link was never asked: {r:?}");
    assert!(r.sources[1].requests > 0, "{r:?}");
}

#[test]
fn a_remote_source_beside_a_device_asks_for_little_before_it_is_measured() {
    // What a remote source has asked for and not yet received is what a device racing it
    // from the other end cannot take over: with a device present, its batches are sized by
    // its rate (a quarter second), 256 KiB before it is measured, not its largest (here 4 MiB,
    // which would be the whole fetch in one request).
    let stick = MemStore::new(HashAlg::Blake3);
    let far = store_of(0..1000);
    let near = MemStore::new(HashAlg::Blake3);
    let w = wants(1000);
    let mut device = StoreSource::new("stick", &stick);
    let large = |name| {
        let mut r = Remote::new(name, &far);
        r.batch = ferry_transfer::Batch {
            chunks: 4096,
            bytes: 4 << 20,
        };
        r
    };
    let mut remote = large("far");
    fetch(
        &mut [&mut device, &mut remote],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    assert!(remote.sizes[0] <= 256 << 10, "{:?}", remote.sizes);
    // Alone, it asks for everything at once.
    let near = MemStore::new(HashAlg::Blake3);
    let mut remote = large("far");
    fetch(&mut [&mut remote], &w, &near, &Options::default()).unwrap();
    assert_eq!(remote.sizes.len(), 1, "{:?}", remote.sizes);
}

#[test]
fn a_sink_that_fails_stops_the_fetch() {
    struct Full;
    impl Sink for Full {
        fn deliver(&self, _: usize, c: VerifiedChunk<'_>) -> Result<(), StoreError> {
            Err(StoreError::Corrupt {
                id: *c.id(),
                location: "test".into(),
                why: "the disk is full".into(),
            })
        }
    }
    let far = store_of(0..10);
    let mut s = StoreSource::new("far", &far);
    let e = fetch(&mut [&mut s], &wants(10), &Full, &Options::default()).unwrap_err();
    assert!(matches!(e, EngineError::Sink(_)), "{e:?}");
}

#[test]
fn a_panic_in_a_source_thread_fails_the_fetch_not_hangs_it() {
    struct Broken;
    impl Sink for Broken {
        fn deliver(&self, _: usize, _: VerifiedChunk<'_>) -> Result<(), StoreError> {
            panic!("the sink broke")
        }
    }
    // The second source stalls until the test ends: only the first's panic can end the fetch.
    let far = store_of(0..10);
    let gate = Arc::new(Gate::default());
    let mut a = Remote::new("a", &far);
    let mut b = Remote::new("b", &far);
    b.silent = Some(gate.clone());
    let opts = Options {
        grace: std::time::Duration::ZERO,
        ..Options::default()
    };
    let e = fetch(&mut [&mut a, &mut b], &wants(10), &Broken, &opts).unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");
}

#[test]
fn files_serve_chunks_by_index_and_by_place_and_stale_ones_are_not_used() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("stick");
    std::fs::create_dir_all(root.join("d")).unwrap();
    let data: Vec<u8> = (0..6).flat_map(chunk).collect();
    std::fs::write(root.join("d/f"), &data).unwrap();
    let mut offs = vec![];
    let mut at = 0u64;
    let mut refs = vec![];
    for i in 0..6 {
        let c = chunk(i);
        offs.push(at);
        at += c.len() as u64;
        refs.push(ferry_format::ChunkRef {
            id: Id::hash(HashAlg::Blake3, &c),
            len: c.len() as u32,
        });
    }
    // The index knows chunks 0-2; chunks 3-5 are found by their place in the tree.
    let mut index = FileIndex::default();
    index.add(
        "d/f",
        &Recipe::from_chunks(HashAlg::Blake3, refs[..3].to_vec()).unwrap(),
    );
    let path: Arc<[u8]> = Arc::from(&b"d/f"[..]);
    let w: Vec<Want> = (0..6)
        .map(|i| Want {
            place: (i >= 3).then(|| Place {
                path: path.clone(),
                offset: offs[i],
                recipe: None,
            }),
            ..want(&chunk(i as u64))
        })
        .collect();
    let near = MemStore::new(HashAlg::Blake3);
    let mut files = FilesSource::new(&root, index, true).unwrap();
    fetch(&mut [&mut files], &w, &near, &Options::default()).unwrap();
    holds_all(&near, &w);
    // The file changed since it was indexed: nothing wrong is served, the chunks come from
    // elsewhere.
    let mut changed = data.clone();
    changed[10] ^= 1;
    std::fs::write(root.join("d/f"), &changed).unwrap();
    let mut index = FileIndex::default();
    index.add(
        "d/f",
        &Recipe::from_chunks(HashAlg::Blake3, refs[..3].to_vec()).unwrap(),
    );
    let far = store_of(0..6);
    let near = MemStore::new(HashAlg::Blake3);
    let mut files = FilesSource::new(&root, index, true).unwrap();
    let mut remote = Remote::new("far", &far);
    let r = fetch(
        &mut [&mut files, &mut remote],
        &w,
        &near,
        &Options::default(),
    )
    .unwrap();
    holds_all(&near, &w);
    assert_eq!(r.sources[0].chunks, 5, "{r:?}");
    assert_eq!(r.sources[1].chunks, 1, "{r:?}");
}

#[test]
fn files_are_never_read_outside_their_root() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("stick");
    std::fs::create_dir_all(&root).unwrap();
    let secret = chunk(1);
    std::fs::write(t.path().join("secret"), &secret).unwrap();
    std::os::unix::fs::symlink("../secret", root.join("link")).unwrap();
    std::os::unix::fs::symlink(t.path().join("secret"), root.join("abs")).unwrap();
    let mut index = FileIndex::default();
    let recipe = Recipe::from_chunks(
        HashAlg::Blake3,
        vec![ferry_format::ChunkRef {
            id: Id::hash(HashAlg::Blake3, &secret),
            len: secret.len() as u32,
        }],
    )
    .unwrap();
    index.add("link", &recipe);
    index.add("abs", &recipe);
    index.add("../secret", &recipe);
    let w = vec![Want {
        place: Some(Place {
            path: Arc::from(&b"../secret"[..]),
            offset: 0,
            recipe: None,
        }),
        ..want(&secret)
    }];
    let near = MemStore::new(HashAlg::Blake3);
    let mut files = FilesSource::new(&root, index, true).unwrap();
    let e = fetch(&mut [&mut files], &w, &near, &Options::default()).unwrap_err();
    assert!(matches!(e, EngineError::NotFound { .. }), "{e:?}");
    assert!(ChunkStore::is_empty(&near).unwrap());
}
