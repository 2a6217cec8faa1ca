//! The state store: one conformance suite run against both backends (a temporary directory,
//! and a fresh bucket on moto_server per test), plus what is specific to each backend.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use kprov::state::layout::{self, ClusterKeys};
use kprov::state::lock::{self, Broken, LockError, LockRecord};
use kprov::state::s3::S3Store;
use kprov::state::{Precondition, StateError, StateStore, Version, Versioning, file::FileStore};
use tokio::sync::Barrier;

// The serial moto: the threaded one does not make conditional writes atomic (see the harness).
use crate::support::moto::moto_serial as moto;
use crate::support::{self, Tier};

/// A store plus whatever must live as long as it (the temporary directory).
struct Fixture {
    store: Arc<dyn StateStore>,
    _dir: Option<tempfile::TempDir>,
}

fn file_fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    Fixture {
        store: Arc::new(FileStore::new(dir.path().join("state")).expect("file store")),
        _dir: Some(dir),
    }
}

async fn s3_client() -> aws_sdk_s3::Client {
    moto().s3().await
}

/// A bucket of its own per test: moto's state is shared by every test in the binary.
async fn new_bucket() -> String {
    let bucket = format!("kprov-it-{:016x}", rand::random::<u64>());
    s3_client()
        .await
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket: {e:?}\n{}", moto().log_tail()));
    bucket
}

/// S3 under a prefix, with small list pages so every listing of more than a handful of keys
/// goes through pagination.
async fn s3_fixture() -> Fixture {
    let bucket = new_bucket().await;
    let store = S3Store::new(&moto().kprov_sdk_config().await, &bucket, "team/a").with_page_size(7);
    Fixture {
        store: Arc::new(store),
        _dir: None,
    }
}

/// Generates one test per backend for each conformance case.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod file_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let f = super::file_fixture();
                    super::$case(f.store.clone()).await;
                }
            )*
        }
        mod s3_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    if crate::support::skip(crate::support::Tier::Moto) {
                        return;
                    }
                    let f = super::s3_fixture().await;
                    super::$case(f.store.clone()).await;
                }
            )*
        }
    };
}

conformance!(
    create_if_absent,
    update_if_match,
    stale_update_refused,
    delete_if_match,
    list_with_prefix_and_pagination,
    invalid_keys_refused,
    racing_writers_with_retry_lose_nothing,
    racing_writers_without_retry_conflict,
    lock_contention_names_the_holder,
    stale_lease_takeover_has_one_winner,
    lock_renewal_keeps_the_lease_alive,
    break_lock_is_deliberate,
    dropped_guard_releases,
    waiting_acquirer_gets_the_lock_when_released,
);

const KEY: &str = "demo.example.com/config";

/// Writes `data` at KEY if `pre` holds.
async fn put(
    store: &Arc<dyn StateStore>,
    data: &'static [u8],
    pre: Precondition,
) -> Result<Version, StateError> {
    store.put(KEY, Bytes::from_static(data), pre).await
}

/// Writes "one" at KEY where nothing was, then "two" over it: both versions.
async fn one_then_two(store: &Arc<dyn StateStore>) -> (Version, Version) {
    let v1 = put(store, b"one", Precondition::Absent).await.unwrap();
    let v2 = put(store, b"two", Precondition::Matches(v1.clone()))
        .await
        .unwrap();
    (v1, v2)
}

/// The body of the object `key` of `bucket`, read past the store.
async fn object(bucket: &str, key: &str) -> bytes::Bytes {
    let raw = s3_client()
        .await
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    raw.body.collect().await.unwrap().into_bytes()
}

async fn create_if_absent(store: Arc<dyn StateStore>) {
    assert!(store.get(KEY).await.unwrap().is_none());
    let v1 = put(&store, b"one", Precondition::Absent).await.unwrap();
    let err = put(&store, b"two", Precondition::Absent).await.unwrap_err();
    assert!(matches!(err, StateError::AlreadyExists { .. }), "{err:?}");
    assert!(err.to_string().contains(KEY), "{err}");
    let obj = store.get(KEY).await.unwrap().expect("stored");
    assert_eq!(obj.data, Bytes::from_static(b"one"));
    assert_eq!(obj.version, v1);
}

async fn update_if_match(store: Arc<dyn StateStore>) {
    let (v1, v2) = one_then_two(&store).await;
    assert_ne!(v1, v2);
    let obj = store.get(KEY).await.unwrap().expect("stored");
    assert_eq!(obj.data, Bytes::from_static(b"two"));
    assert_eq!(obj.version, v2);
    // An unconditional write is still possible where a lost race does not matter.
    let v3 = put(&store, b"three", Precondition::None).await.unwrap();
    assert_eq!(store.get(KEY).await.unwrap().unwrap().version, v3);
}

async fn stale_update_refused(store: Arc<dyn StateStore>) {
    let (v1, _) = one_then_two(&store).await;
    let err = put(&store, b"stale", Precondition::Matches(v1.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Conflict { .. }), "{err:?}");
    assert!(err.to_string().contains("changed by someone else"), "{err}");
    assert_eq!(
        store.get(KEY).await.unwrap().unwrap().data,
        Bytes::from_static(b"two")
    );
    // Updating a key that vanished since it was read is a conflict too, and creates nothing.
    let gone = "demo.example.com/instancegroup/gone";
    let err = store
        .put(gone, Bytes::from_static(b"x"), Precondition::Matches(v1))
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Conflict { .. }), "{err:?}");
    assert!(store.get(gone).await.unwrap().is_none());
}

async fn delete_if_match(store: Arc<dyn StateStore>) {
    let (v1, v2) = one_then_two(&store).await;
    let err = store
        .delete(KEY, Precondition::Matches(v1.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Conflict { .. }), "{err:?}");
    assert!(
        store.get(KEY).await.unwrap().is_some(),
        "stale delete removed the key"
    );
    store
        .delete(KEY, Precondition::Matches(v2.clone()))
        .await
        .unwrap();
    assert!(store.get(KEY).await.unwrap().is_none());
    // Deleting what is gone: fine unconditionally, a conflict if a version was expected.
    store.delete(KEY, Precondition::None).await.unwrap();
    let err = store
        .delete(KEY, Precondition::Matches(v2))
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Conflict { .. }), "{err:?}");
    assert!(store.list("").await.unwrap().is_empty());
}

async fn put_all(store: &Arc<dyn StateStore>, keys: &[String]) {
    futures::stream::iter(keys.iter().cloned())
        .map(|k| {
            let store = store.clone();
            async move {
                store
                    .put(&k, Bytes::from(k.clone()), Precondition::Absent)
                    .await
                    .unwrap_or_else(|e| panic!("put {k}: {e}"))
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

async fn list_with_prefix_and_pagination(store: Arc<dyn StateStore>) {
    let demo = ClusterKeys::new("demo.example.com").unwrap();
    let demo2 = ClusterKeys::new("demo2.example.com").unwrap();
    let mut keys: Vec<String> = (0..40)
        .map(|i| demo.instance_group(&format!("ig-{i:02}")).unwrap())
        .collect();
    keys.extend([
        demo.config(),
        demo.completed_spec(),
        demo.pki("issued/ca.crt").unwrap(),
        demo2.config(),
        // A directory without a config is not a cluster.
        "stray/known_hosts".to_string(),
    ]);
    put_all(&store, &keys).await;

    let all = store.list("").await.unwrap();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(all, expected);

    let under_demo = store.list(&demo.prefix()).await.unwrap();
    assert_eq!(under_demo.len(), 43);
    assert!(
        under_demo
            .iter()
            .all(|k| k.starts_with("demo.example.com/"))
    );
    assert!(under_demo.windows(2).all(|w| w[0] < w[1]), "not sorted");

    // A plain string prefix, as in S3: `demo` also matches `demo2.example.com`.
    assert_eq!(store.list("demo").await.unwrap().len(), 44);
    let ig1: Vec<String> = store
        .list(&format!("{}ig-1", demo.instance_groups_prefix()))
        .await
        .unwrap();
    assert_eq!(ig1.len(), 10);
    assert!(store.list("nothing/").await.unwrap().is_empty());

    assert_eq!(
        layout::list_clusters(store.as_ref()).await.unwrap(),
        vec!["demo.example.com", "demo2.example.com"]
    );
    let groups = demo.instance_groups(store.as_ref()).await.unwrap();
    assert_eq!(groups.len(), 40);
    assert_eq!(groups[0], "ig-00");

    let deleted = demo.delete_all(store.as_ref()).await.unwrap();
    assert_eq!(deleted.len(), 43);
    assert!(store.list(&demo.prefix()).await.unwrap().is_empty());
    assert_eq!(
        layout::list_clusters(store.as_ref()).await.unwrap(),
        vec!["demo2.example.com"]
    );
}

async fn invalid_keys_refused(store: Arc<dyn StateStore>) {
    for key in ["../escape", "/etc/passwd", "a//b", "demo/.kprov.lock", ""] {
        let err = store
            .put(key, Bytes::from_static(b"x"), Precondition::None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StateError::InvalidKey { .. }),
            "{key:?}: {err:?}"
        );
        assert!(matches!(
            store.get(key).await.unwrap_err(),
            StateError::InvalidKey { .. }
        ));
        assert!(matches!(
            store.delete(key, Precondition::None).await.unwrap_err(),
            StateError::InvalidKey { .. }
        ));
    }
    assert!(matches!(
        store.list("../").await.unwrap_err(),
        StateError::InvalidKey { .. }
    ));
    assert!(store.list("").await.unwrap().is_empty());
}

const WRITERS: usize = 16;

/// WRITERS tasks, each running what `write` makes of its name (`writer-N`).
fn spawn_writers<T, F>(write: impl Fn(String) -> F) -> Vec<tokio::task::JoinHandle<T>>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    (0..WRITERS)
        .map(|i| tokio::spawn(write(format!("writer-{i}"))))
        .collect()
}

/// Reads the JSON list of entries at KEY (empty when absent) with its version.
async fn read_entries(store: &dyn StateStore) -> (Vec<String>, Option<Version>) {
    match store.get(KEY).await.unwrap() {
        Some(obj) => (
            serde_json::from_slice(&obj.data).expect("entries"),
            Some(obj.version),
        ),
        None => (Vec::new(), None),
    }
}

async fn write_entries(
    store: &dyn StateStore,
    entries: &[String],
    read: Option<Version>,
) -> Result<Version, StateError> {
    let cond = read.map_or(Precondition::Absent, Precondition::Matches);
    store
        .put(KEY, Bytes::from(serde_json::to_vec(entries).unwrap()), cond)
        .await
}

async fn racing_writers_with_retry_lose_nothing(store: Arc<dyn StateStore>) {
    let start = Arc::new(Barrier::new(WRITERS));
    let tasks = spawn_writers(|mine| {
        let (store, start) = (store.clone(), start.clone());
        async move {
            start.wait().await;
            let mut conflicts = 0;
            loop {
                let (mut entries, version) = read_entries(store.as_ref()).await;
                entries.push(mine.clone());
                match write_entries(store.as_ref(), &entries, version).await {
                    Ok(_) => return (mine, conflicts),
                    Err(StateError::Conflict { .. } | StateError::AlreadyExists { .. }) => {
                        conflicts += 1;
                    }
                    Err(e) => panic!("{mine}: {e}"),
                }
            }
        }
    });
    let mut applied = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let (mine, c) = t.await.unwrap();
        applied.push(mine);
        conflicts += c;
    }
    let (mut entries, _) = read_entries(store.as_ref()).await;
    entries.sort();
    applied.sort();
    assert_eq!(entries, applied, "an applied update was lost");
    // Sixteen writers released at once cannot all read the newest version; if none ever
    // conflicted, the writes were not concurrent and the test proved nothing.
    assert!(conflicts > 0, "no writer ever conflicted");
}

async fn racing_writers_without_retry_conflict(store: Arc<dyn StateStore>) {
    write_entries(store.as_ref(), &["initial".to_string()], None)
        .await
        .unwrap();
    let read_done = Arc::new(Barrier::new(WRITERS));
    let tasks = spawn_writers(|mine| {
        let (store, read_done) = (store.clone(), read_done.clone());
        async move {
            let (mut entries, version) = read_entries(store.as_ref()).await;
            // Everyone has read the same version before anyone writes.
            read_done.wait().await;
            entries.push(mine.clone());
            (mine, write_entries(store.as_ref(), &entries, version).await)
        }
    });
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (mine, Ok(_)) => won.push(mine),
            (_, Err(StateError::Conflict { .. })) => {}
            (mine, Err(e)) => panic!("{mine}: unexpected {e:?}"),
        }
    }
    assert_eq!(
        won.len(),
        1,
        "writers that read one version: exactly one may win: {won:?}"
    );
    let (entries, _) = read_entries(store.as_ref()).await;
    assert_eq!(entries, vec!["initial".to_string(), won[0].clone()]);
}

const CLUSTER: &str = "demo.example.com";

/// Takes CLUSTER's lock for `command`, with a lease of a minute.
async fn acquire(store: &Arc<dyn StateStore>, command: &str) -> Result<lock::LockGuard, LockError> {
    lock::acquire(store.clone(), CLUSTER, command, Duration::from_secs(60)).await
}

/// The record of CLUSTER's lock, which must be held.
async fn held(store: &dyn StateStore) -> LockRecord {
    lock::read(store, CLUSTER).await.unwrap().expect("a lock")
}

async fn lock_contention_names_the_holder(store: Arc<dyn StateStore>) {
    let a = acquire(&store, "kprov update cluster demo.example.com --yes")
        .await
        .unwrap();
    let err = acquire(&store, "kprov edit cluster").await.unwrap_err();
    let LockError::Held { record, .. } = &err else {
        panic!("expected Held, got {err:?}");
    };
    assert_eq!(
        record.command,
        "kprov update cluster demo.example.com --yes"
    );
    assert_eq!(record.pid, std::process::id());
    assert_eq!(record.host, gethostname::gethostname().to_string_lossy());
    assert_eq!(record.id, a.record().id);
    let msg = err.to_string();
    for part in [
        "cluster demo.example.com is locked by",
        "running `kprov update cluster demo.example.com --yes` since",
        "kprov lock break demo.example.com",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert_eq!(held(store.as_ref()).await.id, a.record().id);
    a.release().await.unwrap();
    assert!(lock::read(store.as_ref(), CLUSTER).await.unwrap().is_none());
    let b = acquire(&store, "kprov edit cluster").await.unwrap();
    b.release().await.unwrap();
}

async fn write_stale_lock(store: &dyn StateStore) {
    let past = Utc::now() - chrono::TimeDelta::minutes(10);
    let ghost = LockRecord {
        holder: "ghost".into(),
        host: "crashed-laptop".into(),
        pid: 1,
        command: "kprov update cluster demo.example.com --yes".into(),
        acquired_at: past,
        renewed_at: past,
        expires_at: past + chrono::TimeDelta::minutes(5),
        id: "ghost".into(),
    };
    store
        .put(
            &ClusterKeys::new(CLUSTER).unwrap().lock(),
            ghost.to_bytes(),
            Precondition::Absent,
        )
        .await
        .unwrap();
}

async fn stale_lease_takeover_has_one_winner(store: Arc<dyn StateStore>) {
    write_stale_lock(store.as_ref()).await;
    const TAKERS: usize = 8;
    let start = Arc::new(Barrier::new(TAKERS));
    let tasks: Vec<_> = (0..TAKERS)
        .map(|i| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let cmd = format!("taker-{i}");
                lock::acquire(store, CLUSTER, &cmd, Duration::from_secs(60)).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(guard) => winners.push(guard),
            Err(LockError::Held { record, .. }) => losers.push(record),
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "{} takers won the stale lock",
        winners.len()
    );
    let winner = winners.pop().unwrap();
    assert_eq!(losers.len(), TAKERS - 1);
    for l in &losers {
        assert_eq!(l.id, winner.record().id, "a loser was told about {l:?}");
    }
    let stored = lock::read(store.as_ref(), CLUSTER).await.unwrap().unwrap();
    assert_eq!(stored.id, winner.record().id);
    winner.release().await.unwrap();
}

async fn lock_renewal_keeps_the_lease_alive(store: Arc<dyn StateStore>) {
    // Renewals every second; the check a second after the first lease would have ended leaves
    // room for a loaded machine to delay a renewal or two.
    let lease = Duration::from_secs(3);
    let guard = lock::acquire(store.clone(), CLUSTER, "long run", lease)
        .await
        .unwrap();
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    let err = lock::acquire(store.clone(), CLUSTER, "intruder", lease)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Held { .. }), "{err:?}");
    let stored = lock::read(store.as_ref(), CLUSTER).await.unwrap().unwrap();
    assert!(
        stored.renewed_at > stored.acquired_at,
        "never renewed: {stored:?}"
    );
    assert!(stored.expires_at > Utc::now());
    guard.check().unwrap();
    guard.release().await.unwrap();
}

async fn break_lock_is_deliberate(store: Arc<dyn StateStore>) {
    assert_eq!(
        lock::break_lock(store.as_ref(), CLUSTER).await.unwrap(),
        Broken::NotLocked
    );
    let lease = Duration::from_millis(600);
    let a = lock::acquire(store.clone(), CLUSTER, "wedged run", lease)
        .await
        .unwrap();
    let Broken::Lock(record) = lock::break_lock(store.as_ref(), CLUSTER).await.unwrap() else {
        panic!("nothing broken");
    };
    assert_eq!(record.command, "wedged run");
    let b = acquire(&store, "operator").await.unwrap();
    // The old holder learns at its next renewal that the lock is gone, and its release must
    // not delete the new holder's lock.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.check().is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old holder never noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(a.check(), Err(LockError::Lost { .. })));
    assert!(matches!(a.release().await, Err(LockError::Lost { .. })));
    assert_eq!(held(store.as_ref()).await.id, b.record().id);
    b.release().await.unwrap();

    // An unreadable lock blocks acquirers with a hint, and can be broken.
    let key = ClusterKeys::new(CLUSTER).unwrap().lock();
    store
        .put(&key, Bytes::from_static(b"garbage"), Precondition::Absent)
        .await
        .unwrap();
    let err = lock::acquire(store.clone(), CLUSTER, "x", lease)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("kprov lock break demo.example.com")
    );
    assert_eq!(
        lock::break_lock(store.as_ref(), CLUSTER).await.unwrap(),
        Broken::Unreadable
    );
    assert!(store.get(&key).await.unwrap().is_none());
}

async fn dropped_guard_releases(store: Arc<dyn StateStore>) {
    let guard = acquire(&store, "failing run").await.unwrap();
    drop(guard);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if lock::read(store.as_ref(), CLUSTER).await.unwrap().is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dropped guard never released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn waiting_acquirer_gets_the_lock_when_released(store: Arc<dyn StateStore>) {
    let first = lock::acquire(store.clone(), CLUSTER, "first", lock::DEFAULT_LEASE)
        .await
        .unwrap();
    // Too short a wait ends with the holder named.
    let err = lock::acquire_waiting(
        store.clone(),
        CLUSTER,
        "impatient",
        lock::DEFAULT_LEASE,
        Duration::from_millis(300),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("running `first`"), "{err}");
    let waiter = tokio::spawn(lock::acquire_waiting(
        store.clone(),
        CLUSTER,
        "second",
        lock::DEFAULT_LEASE,
        Duration::from_secs(30),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "the waiter did not wait");
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(second.record().command, "second");
    second.release().await.unwrap();
}

// ---- file backend only ----

#[tokio::test]
async fn file_store_opens_from_urls() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/nested/state", dir.path().display());
    let store = kprov::state::open(&url).await.unwrap();
    assert_eq!(store.location(), url);
    assert_eq!(store.check_versioning().await, Versioning::NotApplicable);
    // Read-only use creates nothing; the first write creates the directory.
    assert!(store.list("").await.unwrap().is_empty());
    assert!(!dir.path().join("nested").exists());
    put(&store, b"x", Precondition::Absent).await.unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("nested/state").join(KEY)).unwrap(),
        b"x"
    );

    let err = kprov::state::open(dir.path().to_str().unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("did you mean file:///"), "{err}");
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let err = kprov::state::open(&format!("file://{}", file.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a directory"), "{err}");
}

#[tokio::test]
async fn file_store_is_private_and_leaves_no_temporary_files_or_empty_directories() {
    let f = file_fixture();
    let store = &f.store;
    let keys = ClusterKeys::new(CLUSTER).unwrap();
    let ig = keys.instance_group("nodes").unwrap();
    let v = store
        .put(&ig, Bytes::from_static(b"a"), Precondition::Absent)
        .await
        .unwrap();
    let v = store
        .put(&ig, Bytes::from_static(b"b"), Precondition::Matches(v))
        .await
        .unwrap();
    // The version is the content's sha256, so a reader can check it without the store.
    assert_eq!(
        v.0,
        "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
    );
    let root = f._dir.as_ref().unwrap().path().join("state");
    // Secrets will live here: nothing may be readable by others, whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    for path in [root.clone(), root.join(CLUSTER), root.join(&ig)] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
    }
    let names: Vec<String> = std::fs::read_dir(root.join(CLUSTER).join("instancegroup"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["nodes"]);
    store.delete(&ig, Precondition::Matches(v)).await.unwrap();
    assert!(
        !root.join(CLUSTER).exists(),
        "empty directories left behind"
    );
    assert!(root.join(".kprov.lock").exists());
    assert!(store.list("").await.unwrap().is_empty(), "lock file listed");
}

/// Several processes (this test binary re-run as children) increment one counter with
/// read-modify-write retried on conflict: the flock must serialise compare-and-rename across
/// processes, or increments get lost.
#[tokio::test]
async fn file_compare_and_swap_holds_across_processes() {
    const CHILDREN: usize = 4;
    const INCREMENTS: usize = 25;
    let f = file_fixture();
    let root = f._dir.as_ref().unwrap().path().join("state");
    let exe = std::env::current_exe().unwrap();
    let mut children = ChildGuard(Vec::new());
    for _ in 0..CHILDREN {
        let child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "state::file_cas_child_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KPROV_TEST_STATE_DIR", &root)
            .env("KPROV_TEST_INCREMENTS", INCREMENTS.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        children.0.push(child);
    }
    for child in children.0.drain(..) {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The child must really have run (a typo in the filter would run nothing and pass).
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let obj = f.store.get("counter").await.unwrap().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&obj.data),
        (CHILDREN * INCREMENTS).to_string()
    );
}

/// Kills children still running when a test fails half-way.
struct ChildGuard(Vec<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by file_compare_and_swap_holds_across_processes"]
async fn file_cas_child_process() {
    let (Ok(dir), Ok(n)) = (
        std::env::var("KPROV_TEST_STATE_DIR"),
        std::env::var("KPROV_TEST_INCREMENTS"),
    ) else {
        return;
    };
    let store = FileStore::new(dir).unwrap();
    for _ in 0..n.parse::<usize>().unwrap() {
        loop {
            let (count, cond) = match store.get("counter").await.unwrap() {
                Some(obj) => (
                    String::from_utf8_lossy(&obj.data).parse::<usize>().unwrap(),
                    Precondition::Matches(obj.version),
                ),
                None => (0, Precondition::Absent),
            };
            match store
                .put("counter", Bytes::from((count + 1).to_string()), cond)
                .await
            {
                Ok(_) => break,
                Err(StateError::Conflict { .. } | StateError::AlreadyExists { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
}

// ---- S3 backend only ----

#[tokio::test]
async fn s3_keys_live_under_the_prefix_and_prefixes_are_isolated() {
    crate::needs_tier!(Moto);
    let bucket = new_bucket().await;
    let sdk = moto().kprov_sdk_config().await;
    let a = S3Store::new(&sdk, &bucket, "team/a/");
    let b = S3Store::new(&sdk, &bucket, "team/b");
    let root = S3Store::new(&sdk, &bucket, "");
    assert_eq!(a.location(), format!("s3://{bucket}/team/a"));
    a.put(KEY, Bytes::from_static(b"a"), Precondition::Absent)
        .await
        .unwrap();
    assert!(b.get(KEY).await.unwrap().is_none());
    assert!(b.list("").await.unwrap().is_empty());
    assert_eq!(root.list("").await.unwrap(), vec![format!("team/a/{KEY}")]);
    assert_eq!(object(&bucket, &format!("team/a/{KEY}")).await, "a");
}

#[tokio::test]
async fn s3_errors_name_the_bucket() {
    crate::needs_tier!(Moto);
    let store = S3Store::new(&moto().kprov_sdk_config().await, "kprov-no-such-bucket", "");
    let err = store.get(KEY).await.unwrap_err().to_string();
    assert!(
        err.contains("s3://kprov-no-such-bucket/demo.example.com/config"),
        "{err}"
    );
    assert!(err.contains("NoSuchBucket"), "{err}");
    // Conditional requests to a missing bucket are not conflicts: the bucket must be named.
    let stale = Precondition::Matches(Version("\"0123\"".into()));
    let err = store
        .put(KEY, Bytes::from_static(b"x"), stale.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
    let err = store.delete(KEY, stale).await.unwrap_err();
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
}

#[tokio::test]
async fn s3_versioning_check_does_not_fail() {
    crate::needs_tier!(Moto);
    let bucket = new_bucket().await;
    let store = S3Store::new(&moto().kprov_sdk_config().await, &bucket, "");
    // moto's GetBucketVersioning reply does not parse in the Rust SDK: the check must report
    // that it could not tell, so the CLI warns instead of failing.
    match store.check_versioning().await {
        Versioning::Unknown(reason) => assert!(!reason.is_empty()),
        other => panic!("moto's reply unexpectedly parsed: {other:?}"),
    }
}

/// `state::open("s3://...")` configures itself from the environment alone, as the CLI will run
/// it: the child process gets moto's endpoint as `AWS_ENDPOINT_URL` with a `localhost` host,
/// which only works with path-style addressing (`BUCKET.localhost` does not resolve).
#[tokio::test]
async fn s3_store_opens_from_the_environment() {
    crate::needs_tier!(Moto);
    let bucket = new_bucket().await;
    let url = format!("s3://{bucket}/ops/");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "state::s3_open_child_process",
        "--ignored",
        "--test-threads=1",
    ])
    .env("KPROV_TEST_S3_URL", &url)
    .env("AWS_CONFIG_FILE", "/nonexistent")
    .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent");
    for (k, v) in moto().env() {
        cmd.env(k, v.replace("127.0.0.1", "localhost"));
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        moto().log_tail()
    );
    assert_eq!(object(&bucket, &format!("ops/{KEY}")).await, "from env");
}

#[tokio::test]
#[ignore = "run as a child process by s3_store_opens_from_the_environment"]
async fn s3_open_child_process() {
    let Ok(url) = std::env::var("KPROV_TEST_S3_URL") else {
        return;
    };
    let store = kprov::state::open(&url).await.unwrap();
    assert_eq!(store.location(), url.trim_end_matches('/'));
    put(&store, b"from env", Precondition::Absent)
        .await
        .unwrap();
}

// ---- both backends, one behaviour ----

#[derive(Debug, Clone, Copy)]
enum Cond {
    None,
    Absent,
    /// The version this client last saw for the key (from a get or its own put).
    LastSeen,
    /// A version no object ever had.
    Bogus,
}

#[derive(Debug, Clone)]
enum Op {
    Put(usize, &'static str, Cond),
    Delete(usize, Cond),
    Get(usize),
    List(&'static str),
}

const MODEL_KEYS: [&str; 4] = ["a/config", "a/instancegroup/x", "b/config", "a/pki/ca.crt"];

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let key = 0..MODEL_KEYS.len();
    let cond = prop_oneof![
        Just(Cond::None),
        Just(Cond::Absent),
        Just(Cond::LastSeen),
        Just(Cond::LastSeen),
        Just(Cond::Bogus),
    ];
    // Few distinct contents, so rewrites of identical content (same version) happen too.
    let data = prop_oneof![Just("one"), Just("two"), Just("three")];
    prop_oneof![
        (key.clone(), data, cond.clone()).prop_map(|(k, d, c)| Op::Put(k, d, c)),
        (key.clone(), cond).prop_map(|(k, c)| Op::Delete(k, c)),
        key.prop_map(Op::Get),
        prop_oneof![Just(""), Just("a/"), Just("a"), Just("b/config")].prop_map(Op::List),
    ]
}

/// What an operation returned, with versions left out (ETags and hashes differ by design).
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Data(Option<Bytes>),
    Keys(Vec<String>),
    AlreadyExists,
    Conflict,
}

/// Runs `ops` as one client of `store` would, checking every outcome against a model of the
/// compare-and-swap rules in docs/state-store.md, and returns the outcomes.
async fn run_against_model(store: &dyn StateStore, ops: &[Op]) -> Vec<Outcome> {
    let mut content: std::collections::BTreeMap<&str, Bytes> = Default::default();
    // Per key: the version this client last saw and the content it had then.
    let mut seen: std::collections::HashMap<&str, (Version, Bytes)> = Default::default();
    let mut outcomes = Vec::new();
    for op in ops {
        let (precondition, expected_ok) = match op {
            Op::Put(k, _, c) | Op::Delete(k, c) => {
                let (p, ok) = precondition(&content, &seen, MODEL_KEYS[*k], *c);
                (p, Some(ok))
            }
            Op::Get(_) | Op::List(_) => (Precondition::None, None),
        };
        let before = content.clone();
        let outcome = match op {
            Op::Put(k, d, _) => {
                let key = MODEL_KEYS[*k];
                match store.put(key, Bytes::from(*d), precondition).await {
                    Ok(v) => {
                        content.insert(key, Bytes::from(*d));
                        seen.insert(key, (v, Bytes::from(*d)));
                        Outcome::Ok
                    }
                    Err(e) => error_outcome(e),
                }
            }
            Op::Delete(k, _) => {
                let key = MODEL_KEYS[*k];
                match store.delete(key, precondition).await {
                    Ok(()) => {
                        content.remove(key);
                        Outcome::Ok
                    }
                    Err(e) => error_outcome(e),
                }
            }
            Op::Get(k) => {
                let key = MODEL_KEYS[*k];
                let obj = store.get(key).await.unwrap();
                if let Some(o) = &obj {
                    seen.insert(key, (o.version.clone(), o.data.clone()));
                }
                assert_eq!(obj.as_ref().map(|o| &o.data), content.get(key), "get {key}");
                Outcome::Data(obj.map(|o| o.data))
            }
            Op::List(prefix) => {
                let keys = store.list(prefix).await.unwrap();
                let model: Vec<String> = content
                    .keys()
                    .filter(|k| k.starts_with(prefix))
                    .map(|k| k.to_string())
                    .collect();
                assert_eq!(keys, model, "list {prefix:?}");
                Outcome::Keys(keys)
            }
        };
        if let Some(ok) = expected_ok {
            assert_eq!(
                outcome == Outcome::Ok,
                ok,
                "{op:?} gave {outcome:?}; content before: {before:?}"
            );
        }
        outcomes.push(outcome);
    }
    outcomes
}

/// The precondition a client sends for `cond`, and whether the model says it holds: both
/// backends compare versions that identify content (sha256, single-part ETag), so "still at the
/// version I saw" means "still has the content I saw".
fn precondition(
    content: &std::collections::BTreeMap<&str, Bytes>,
    seen: &std::collections::HashMap<&str, (Version, Bytes)>,
    key: &str,
    cond: Cond,
) -> (Precondition, bool) {
    let current = content.get(key);
    match (cond, seen.get(key)) {
        (Cond::None, _) => (Precondition::None, true),
        (Cond::Absent, _) => (Precondition::Absent, current.is_none()),
        (Cond::LastSeen, Some((v, data))) => {
            (Precondition::Matches(v.clone()), current == Some(data))
        }
        (Cond::LastSeen | Cond::Bogus, _) => (
            Precondition::Matches(Version("\"0123456789abcdef\"".into())),
            false,
        ),
    }
}

fn error_outcome(e: StateError) -> Outcome {
    match e {
        StateError::AlreadyExists { .. } => Outcome::AlreadyExists,
        StateError::Conflict { .. } => Outcome::Conflict,
        other => panic!("unexpected error {other:?}"),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..Default::default()
    })]

    /// Random operation sequences give the same outcomes on a directory and on S3, and both
    /// follow the model of the compare-and-swap rules.
    #[test]
    fn both_backends_follow_one_model(ops in proptest::collection::vec(op(), 1..25)) {
        if support::skip(Tier::Moto) {
            return Ok(());
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let file = file_fixture();
            let s3 = s3_fixture().await;
            let on_file = run_against_model(file.store.as_ref(), &ops).await;
            let on_s3 = run_against_model(s3.store.as_ref(), &ops).await;
            assert_eq!(on_file, on_s3);
        });
    }
}

/// A real store whose first create "loses its reply": the write happens, but the caller hears
/// `AlreadyExists`, as when the SDK retries a create whose answer never arrived.
#[derive(Debug)]
struct LostReply {
    inner: Arc<dyn StateStore>,
    lost: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl StateStore for LostReply {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn get(&self, key: &str) -> Result<Option<kprov::state::Object>, StateError> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError> {
        let absent = cond == Precondition::Absent;
        let v = self.inner.put(key, data, cond).await?;
        if absent && !self.lost.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(StateError::AlreadyExists {
                location: self.location(),
                key: key.to_string(),
            });
        }
        Ok(v)
    }
    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError> {
        self.inner.delete(key, cond).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        self.inner.list(prefix).await
    }
}

#[tokio::test]
async fn lock_whose_create_reply_was_lost_is_still_ours() {
    let f = file_fixture();
    let store: Arc<dyn StateStore> = Arc::new(LostReply {
        inner: f.store.clone(),
        lost: Default::default(),
    });
    let guard = lock::acquire(
        store.clone(),
        CLUSTER,
        "kprov edit cluster",
        lock::DEFAULT_LEASE,
    )
    .await
    .expect("our own lock reported as held by someone else");
    assert_eq!(held(store.as_ref()).await.id, guard.record().id);
    guard.release().await.unwrap();
    assert!(lock::read(store.as_ref(), CLUSTER).await.unwrap().is_none());
}

/// A lock key that is a directory (empty, or holding keys) is neither "not locked" nor a
/// write error about prefixes: every lock operation names it and `lock break` clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_lock_that_is_a_directory_is_reported_and_broken() {
    let f = file_fixture();
    let store = f.store.clone();
    let root = f._dir.as_ref().unwrap().path().join("state");
    for planted in [&[][..], &["a", "b/c"][..]] {
        let dir = root.join(CLUSTER).join("lock");
        std::fs::create_dir_all(&dir).unwrap();
        for p in planted {
            let p = dir.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x").unwrap();
        }
        let what = if planted.is_empty() {
            "an empty directory, not an object".to_string()
        } else {
            format!(
                "a directory, not an object but a prefix of 2 other keys ({CLUSTER}/lock/a, {CLUSTER}/lock/b/c)"
            )
        };
        for err in [
            lock::read(store.as_ref(), CLUSTER).await.unwrap_err(),
            acquire(&store, "x").await.unwrap_err(),
        ] {
            let LockError::Blocked { what: w, .. } = &err else {
                panic!("{err:?}");
            };
            assert_eq!(*w, what);
            assert!(
                err.to_string()
                    .contains("kprov lock break demo.example.com"),
                "{err}"
            );
        }
        let Broken::Obstruction {
            what: w,
            location,
            removed,
        } = lock::break_lock(store.as_ref(), CLUSTER).await.unwrap()
        else {
            panic!("not an obstruction");
        };
        assert_eq!(w, what);
        // Where it was, as `lock break` prints it: the lock's own key in this store.
        let key = ClusterKeys::new(CLUSTER).unwrap().lock();
        assert_eq!(location, store.key_location(&key));
        assert!(location.ends_with(&key), "{location}");
        assert_eq!(removed, planted.len());
        assert!(!dir.exists());
        assert!(lock::read(store.as_ref(), CLUSTER).await.unwrap().is_none());
        let guard = acquire(&store, "x").await.unwrap();
        guard.release().await.unwrap();
    }
}
