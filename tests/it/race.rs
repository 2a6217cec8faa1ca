//! Two operators racing never lose an update: every write is applied or refused, never
//! silently overwritten. Run against both backends, in-process and across processes.

use std::collections::BTreeSet;
use std::sync::Arc;

use kprov::repo::{Repo, RepoError};
use kprov::spec::{self, Object};
use kprov::state::{self, StateError, StateStore};

use crate::support::cli::create_aws_in;
use crate::support::moto::moto_serial;

fn cluster_yaml(name: &str) -> String {
    format!(
        "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  cloudProvider: aws\n  kubernetesVersion: 1.35.1\n  networking:\n    subnets:\n    - {{name: us-east-1a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Public}}\n---\napiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: control-plane\nspec:\n  role: ControlPlane\n"
    )
}

async fn seeded(store: Arc<dyn StateStore>, name: &str) -> Repo {
    let repo = Repo::new(store);
    let objs = spec::load_objects("seed.yaml", &cluster_yaml(name)).expect("seed parses");
    let mut cluster = None;
    let mut groups = Vec::new();
    for o in objs {
        match o.value {
            Object::Cluster(c) => cluster = Some(c),
            Object::InstanceGroup(g) => groups.push(g),
        }
    }
    repo.create(&cluster.expect("cluster"), &groups)
        .await
        .expect("create");
    repo
}

/// `writers` tasks each add their own label with read-modify-write. Returns the writers whose
/// write was applied and the labels the cluster ends with.
async fn race(
    repo: Arc<Repo>,
    name: &str,
    writers: usize,
    retry: bool,
) -> (BTreeSet<String>, BTreeSet<String>, usize) {
    let mut tasks = Vec::new();
    for i in 0..writers {
        let repo = repo.clone();
        let name = name.to_string();
        tasks.push(tokio::spawn(async move {
            let me = format!("writer-{i}");
            loop {
                let stored = repo.get(&name).await.expect("get");
                let mut c = stored.cluster.value.clone();
                c.metadata.labels.insert(me.clone(), "yes".into());
                match repo.put_cluster(&c, &stored.version).await {
                    Ok(_) => return (me, true),
                    Err(RepoError::State(StateError::Conflict { .. })) if retry => continue,
                    Err(RepoError::State(StateError::Conflict { .. })) => return (me, false),
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
        }));
    }
    let mut applied = BTreeSet::new();
    let mut refused = 0;
    for t in tasks {
        let (me, ok) = t.await.expect("task");
        if ok {
            applied.insert(me);
        } else {
            refused += 1;
        }
    }
    let labels = repo
        .get(name)
        .await
        .expect("final get")
        .cluster
        .value
        .metadata
        .labels
        .keys()
        .cloned()
        .collect();
    (applied, labels, refused)
}

async fn check_backend(store: Arc<dyn StateStore>, tag: &str) {
    let name = format!("race-{tag}.example.com");
    let repo = Arc::new(seeded(store.clone(), &name).await);
    // Without retry: refused writers got a conflict, and the final state holds exactly the
    // writers that were told they succeeded.
    let (applied, labels, refused) = race(repo.clone(), &name, 16, false).await;
    assert!(!applied.is_empty());
    assert_eq!(applied.len() + refused, 16);
    assert_eq!(
        labels, applied,
        "an applied update was lost, or a refused one landed"
    );

    // With retry on conflict every writer eventually lands, and none is lost.
    let name2 = format!("race2-{tag}.example.com");
    let repo2 = Arc::new(seeded(store, &name2).await);
    let (applied, labels, _) = race(repo2, &name2, 16, true).await;
    assert_eq!(applied.len(), 16);
    assert_eq!(labels, applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_on_a_file_store_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = state::open(&format!("file://{}", dir.path().display()))
        .await
        .unwrap();
    check_backend(store, "file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_on_s3_lose_nothing() {
    crate::needs_tier!(Moto);
    // moto checks conditional writes and then writes without a lock; only a serial moto
    // evaluates them atomically the way S3 does (see docs/state-store.md).
    let m = moto_serial();
    let bucket = format!("kprov-race-{}", std::process::id());
    let sdk = m.sdk_config().await;
    m.create_bucket(&bucket).await;
    let store: Arc<dyn StateStore> = Arc::new(state::s3::S3Store::new(&sdk, &bucket, "race"));
    check_backend(store, "s3").await;
}

/// Separate `kprov` processes adding instance groups at once: each is applied or refused
/// (lock held, exit 4), and every applied group is in the store and in the completed spec.
#[test]
fn racing_processes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("state").display());
    let kprov = assert_cmd::cargo::cargo_bin("kprov");
    let run = |args: &[&str]| {
        std::process::Command::new(&kprov)
            .args(args)
            .env("KPROV_STATE_STORE", &store)
            .env("HOME", dir.path())
            .output()
            .expect("runs")
    };
    let out = run(&create_aws_in("procs.example.com", "us-east-1a"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = 8;
    let mut children = Vec::new();
    for i in 0..n {
        let f = dir.path().join(format!("g{i}.yaml"));
        std::fs::write(&f, format!("apiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: extra-{i}\n  labels: {{kprov.dev/cluster: procs.example.com}}\nspec:\n  role: Node\n  minSize: 1\n")).unwrap();
        let child = std::process::Command::new(&kprov)
            .args(["create", "-f", f.to_str().unwrap()])
            .env("KPROV_STATE_STORE", &store)
            .env("HOME", dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        children.push((i, child));
    }
    let mut applied = BTreeSet::new();
    for (i, c) in children {
        let out = c.wait_with_output().expect("wait");
        match out.status.code() {
            Some(0) => {
                applied.insert(format!("extra-{i}"));
            }
            Some(4) => assert!(
                String::from_utf8_lossy(&out.stderr).contains("is locked by"),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            ),
            other => panic!(
                "writer {i} exited {other:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
    assert!(!applied.is_empty());
    let listed =
        String::from_utf8_lossy(&run(&["get", "ig", "procs.example.com"]).stdout).to_string();
    let stored: BTreeSet<String> = listed
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("extra-"))
        .map(str::to_string)
        .collect();
    assert_eq!(stored, applied, "{listed}");
    let completed = std::fs::read_to_string(
        dir.path()
            .join("state/procs.example.com/cluster-completed.spec"),
    )
    .unwrap();
    for g in &applied {
        assert!(
            completed.contains(&format!("name: {g}\n")),
            "completed spec misses {g}"
        );
    }
}
