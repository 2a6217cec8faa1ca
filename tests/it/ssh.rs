//! The SSH engine against real sshd hosts in network namespaces.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kprov::spec::{Host, HostRole};
use kprov::ssh::task::{ExecError, HostExecutor, RemoteFile, Step, StepOutcome};
use kprov::ssh::{Event, Progress, SshFleet, SshOptions};
use kprov::state::StateStore;

use crate::support::memstate::MemStore;
use crate::support::testhosts::TestHosts;

const CLUSTER: &str = "ssh.example.com";

#[derive(Default)]
struct Recorder(Mutex<Vec<Event>>);

impl Progress for Recorder {
    fn event(&self, e: &Event) {
        self.0.lock().unwrap().push(e.clone());
    }
}

fn host(th: &TestHosts, name: &str, address: &str, user: Option<&str>) -> Host {
    Host {
        name: name.to_string(),
        address: address.to_string(),
        ip: None,
        access_ip: None,
        user: Some(user.unwrap_or("root").to_string()),
        port: None,
        key_path: Some(th.client_key.display().to_string()),
        bastion: None,
        roles: vec![HostRole::Node],
        labels: Default::default(),
        taints: Vec::new(),
    }
}

fn hosts(th: &TestHosts) -> Vec<Host> {
    th.spec_hosts()
}

fn options(accept: bool) -> SshOptions {
    SshOptions {
        accept_new_host_keys: accept,
        connect_timeout: Duration::from_secs(2),
        ..SshOptions::default()
    }
}

fn fleet_with(
    hosts: Vec<Host>,
    store: &Arc<MemStore>,
    accept: bool,
    progress: Arc<dyn Progress>,
) -> SshFleet {
    SshFleet::new(CLUSTER, hosts, store.clone(), options(accept), progress).expect("fleet")
}

/// A fleet with the given options whose progress no one reads.
fn fleet_using(hosts: Vec<Host>, store: Arc<dyn StateStore>, options: SshOptions) -> SshFleet {
    SshFleet::new(
        CLUSTER,
        hosts,
        store,
        options,
        Arc::new(Recorder::default()),
    )
    .expect("fleet")
}

fn fleet(th: &TestHosts, store: &Arc<MemStore>) -> SshFleet {
    fleet_with(hosts(th), store, true, Arc::new(Recorder::default()))
}

fn step(name: &str, run: &str) -> Step {
    Step {
        name: name.to_string(),
        files: Vec::new(),
        check: None,
        run: run.to_string(),
        timeout: Duration::from_secs(20),
    }
}

/// `n` hosts and an empty state store.
fn rig(n: usize) -> (TestHosts, Arc<MemStore>) {
    (TestHosts::start(n), Arc::new(MemStore::default()))
}

/// `n` hosts and a fleet over them (its store empty) allowed to accept new host keys.
fn started(n: usize) -> (TestHosts, SshFleet) {
    let (th, store) = rig(n);
    let fleet = fleet(&th, &store);
    (th, fleet)
}

/// One host with the user `user` (whose sudo asks no password when `nopasswd`) and a fleet
/// logging in as that user.
fn as_user(user: &str, nopasswd: bool) -> (TestHosts, SshFleet) {
    let (th, store) = rig(1);
    th.hosts[0].add_user(user, nopasswd);
    let target = host(&th, "host1", &th.hosts[0].address, Some(user));
    let fleet = fleet_with(vec![target], &store, true, Arc::new(Recorder::default()));
    (th, fleet)
}

/// What `started` gives, and the recorder of the fleet's progress.
fn watched(n: usize) -> (TestHosts, Arc<Recorder>, SshFleet) {
    let (th, store) = rig(n);
    let rec = Arc::new(Recorder::default());
    let fleet = fleet_with(hosts(&th), &store, true, rec.clone());
    (th, rec, fleet)
}

/// Runs one step on host1 with permission to accept new host keys, so that the store records
/// its key, and closes that fleet.
async fn contact(th: &TestHosts, store: &Arc<MemStore>) {
    let first = fleet(th, store);
    first
        .run_steps("host1", &[step("x", "true")])
        .await
        .unwrap();
    first.close().await;
}

/// The error that running the one step `s` on `host` fails with, and its message.
async fn refusal(fleet: &SshFleet, host: &str, s: Step) -> (ExecError, String) {
    let err = fleet
        .run_steps(host, &[s])
        .await
        .expect_err("the step must fail");
    let msg = err.to_string();
    (err, msg)
}

async fn known_hosts(store: &MemStore) -> String {
    store
        .get(&format!("{CLUSTER}/known_hosts"))
        .await
        .unwrap()
        .map(|o| String::from_utf8_lossy(&o.data).into_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn runs_on_three_hosts_at_once() {
    crate::needs_tier!(SshdHosts);
    let (th, fleet) = started(3);
    let work: Vec<(String, Vec<Step>)> = th
        .hosts
        .iter()
        .map(|h| {
            let s = step(
                "who am i",
                "mkdir -p /etc/kprov && hostname > /etc/kprov/who",
            );
            (h.name.clone(), vec![s])
        })
        .collect();
    let summary = fleet.run_all(&work).await;
    assert!(summary.ok(), "{summary}");
    // Hosts reach servers listening on the bridge (where tests run artifact mirrors).
    let listener = std::net::TcpListener::bind((th.gateway.as_str(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::thread::spawn(move || {
        let (mut conn, from) = listener.accept().unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut conn, &mut got).unwrap();
        (from.ip().to_string(), got)
    });
    let probe = format!(
        "python3 -c \"import socket; socket.create_connection(('{}', {port}), 5).sendall(b'hello')\"",
        th.gateway
    );
    fleet
        .run_steps("host2", &[step("reach gateway", &probe)])
        .await
        .unwrap();
    let (from, got) = accepted.join().unwrap();
    assert_eq!(
        (from.as_str(), got.as_str()),
        (th.hosts[1].address.as_str(), "hello")
    );
    for h in &th.hosts {
        // Each host wrote into its own overlay: proof the commands ran on distinct hosts.
        let who = h.read_upper("/etc/kprov/who").expect("file written");
        assert_eq!(String::from_utf8_lossy(&who).trim(), h.name);
        let via_ssh = fleet.read_file(&h.name, "/etc/kprov/who").await.unwrap();
        assert_eq!(via_ssh, Some(Bytes::from(who)));
    }
    assert_eq!(
        fleet.read_file("host1", "/etc/kprov/none").await.unwrap(),
        None
    );
    // A host cannot make kprov hold an endless file in memory.
    fleet
        .run_steps(
            "host1",
            &[step("big", "head -c 17000000 /dev/zero > /etc/kprov/big")],
        )
        .await
        .unwrap();
    let err = fleet
        .read_file("host1", "/etc/kprov/big")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("larger than 16 MiB"), "{err}");
    // The control directory (sockets that run commands as root) is private.
    let meta = std::fs::metadata(fleet.control_dir()).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    let table = summary.to_string();
    assert!(table.starts_with("HOST"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");
    fleet.close().await;
}

#[tokio::test]
async fn unchanged_files_are_not_uploaded_and_rerun_is_a_noop() {
    crate::needs_tier!(SshdHosts);
    let (th, fleet) = started(1);
    let file = |path: &str, content: &str, mode| RemoteFile {
        path: path.to_string(),
        content: Bytes::from(content.to_string()),
        mode,
        resumable: false,
        on_arrival: None,
        sha256: None,
    };
    let steps = |a: &str| {
        vec![
            Step {
                files: vec![
                    file("/etc/kprov/a.conf", a, 0o644),
                    file("/opt/kprov/bin/tool", "#!/bin/sh\necho tool\n", 0o755),
                ],
                check: Some("test -f /var/lib/kprov/combined".into()),
                ..step(
                    "install",
                    "mkdir -p /var/lib/kprov && cat /etc/kprov/a.conf >> /var/lib/kprov/combined",
                )
            },
            // Files only: converged exactly when nothing was uploaded.
            Step {
                files: vec![file("/etc/kprov/b.conf", "b\n", 0o600)],
                ..step("files only", "")
            },
        ]
    };
    let h = &th.hosts[0];
    let first = fleet.run_steps("host1", &steps("one\n")).await.unwrap();
    assert_eq!(first, vec![StepOutcome::Changed, StepOutcome::Changed]);
    let upper = h.upper_path("/etc/kprov/a.conf");
    let mtime = std::fs::metadata(&upper).unwrap().modified().unwrap();
    let meta = std::fs::metadata(h.upper_path("/opt/kprov/bin/tool")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
        0o755
    );

    let second = fleet.run_steps("host1", &steps("one\n")).await.unwrap();
    assert_eq!(second, vec![StepOutcome::Unchanged, StepOutcome::Unchanged]);
    assert_eq!(
        std::fs::metadata(&upper).unwrap().modified().unwrap(),
        mtime,
        "an unchanged file was uploaded again"
    );
    assert_eq!(h.read_upper("/var/lib/kprov/combined").unwrap(), b"one\n");

    // A changed file makes the step run even though its check passes.
    let third = fleet.run_steps("host1", &steps("two\n")).await.unwrap();
    assert_eq!(third, vec![StepOutcome::Changed, StepOutcome::Unchanged]);
    assert_eq!(
        h.read_upper("/var/lib/kprov/combined").unwrap(),
        b"one\ntwo\n"
    );

    // A mode changed behind kprov's back is repaired.
    h.exec("chmod 0644 /etc/kprov/b.conf").unwrap();
    let fourth = fleet.run_steps("host1", &steps("two\n")).await.unwrap();
    assert_eq!(fourth, vec![StepOutcome::Unchanged, StepOutcome::Changed]);
    assert_eq!(
        h.exec("stat -c %a /etc/kprov/b.conf").unwrap().trim(),
        "600"
    );
    // Four runs, dozens of commands: one authenticated connection.
    assert_eq!(
        h.log().matches("Accepted publickey").count(),
        1,
        "{}",
        h.log()
    );
    fleet.close().await;
}

#[tokio::test]
async fn first_contact_needs_permission_and_records_the_key() {
    crate::needs_tier!(SshdHosts);
    let (th, store) = rig(2);
    let log_before = th.hosts[0].log();
    let refused = fleet_with(hosts(&th), &store, false, Arc::new(Recorder::default()));
    let (err, msg) = refusal(&refused, "host1", step("x", "true")).await;
    assert!(matches!(err, ExecError::UnknownHostKey { .. }), "{msg}");
    assert!(msg.starts_with("host1: "), "{msg}");
    assert!(msg.contains("--accept-new-host-keys"), "{msg}");
    // Not even scanned: a host whose key may not be recorded is never contacted.
    assert!(!msg.contains(&th.hosts[0].fingerprint()), "{msg}");
    assert_eq!(th.hosts[0].log(), log_before, "sshd saw a connection");
    assert_eq!(
        known_hosts(&store).await,
        "",
        "nothing recorded without permission"
    );
    // Nothing ran on the host either.
    assert!(th.hosts[0].read_upper("/etc/kprov").is_none());

    let rec = Arc::new(Recorder::default());
    let accepted = fleet_with(hosts(&th), &store, true, rec.clone());
    let summary = accepted
        .run_all(&[
            ("host1".into(), vec![step("x", "true")]),
            ("host2".into(), vec![step("x", "true")]),
        ])
        .await;
    assert!(summary.ok(), "{summary}");
    let recorded = known_hosts(&store).await;
    for h in &th.hosts {
        let key = h.host_public_key();
        let key: Vec<&str> = key.split_whitespace().take(2).collect();
        assert!(
            recorded.contains(&format!("{} {} {}", h.address, key[0], key[1])),
            "{recorded}"
        );
        let events = rec.0.lock().unwrap();
        assert!(
            events.iter().any(
                |e| matches!(e, Event::HostKeyRecorded { host, fingerprints }
                if *host == h.name && fingerprints.iter().any(|f| f.contains(&h.fingerprint())))
            ),
            "{events:?}"
        );
    }
    accepted.close().await;

    // Once recorded, no permission is needed any more.
    let later = fleet_with(hosts(&th), &store, false, Arc::new(Recorder::default()));
    later
        .run_steps("host2", &[step("x", "true")])
        .await
        .unwrap();
}

/// A store where another operator records a different key for every name at the moment
/// kprov first writes the cluster's known hosts: kprov's record loses the race.
#[derive(Debug)]
struct RivalRecords {
    inner: MemStore,
    rival_key: String,
    raced: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl StateStore for RivalRecords {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<kprov::state::Object>, kprov::state::StateError> {
        self.inner.get(key).await
    }
    async fn put(
        &self,
        key: &str,
        data: Bytes,
        cond: kprov::state::Precondition,
    ) -> Result<kprov::state::Version, kprov::state::StateError> {
        if key.ends_with("/known_hosts")
            && !self.raced.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let rival: String = String::from_utf8_lossy(&data)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(|name| format!("{name} {}\n", self.rival_key))
                .collect();
            self.inner
                .put(key, Bytes::from(rival), kprov::state::Precondition::None)
                .await?;
        }
        self.inner.put(key, data, cond).await
    }
    async fn delete(
        &self,
        key: &str,
        cond: kprov::state::Precondition,
    ) -> Result<(), kprov::state::StateError> {
        self.inner.delete(key, cond).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, kprov::state::StateError> {
        self.inner.list(prefix).await
    }
}

/// Review of issue 22: a first-contact record that fails (another writer recorded other keys
/// for the host) stops the connection before it starts: ssh never authenticates to the host
/// (no master to close half-started) and nothing runs there.
#[tokio::test]
async fn a_failed_first_contact_record_starts_no_connection() {
    crate::needs_tier!(SshdHosts);
    let th = TestHosts::start(1);
    // Someone else's ed25519 key: a valid key line, not the host's.
    let rival_key: String = std::fs::read_to_string(th.client_key.with_extension("pub"))
        .unwrap()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let store = Arc::new(RivalRecords {
        inner: MemStore::default(),
        rival_key: rival_key.clone(),
        raced: Default::default(),
    });
    let fleet = fleet_using(hosts(&th), store.clone(), options(true));
    let (err, _) = refusal(&fleet, "host1", step("x", "mkdir -p /etc/kprov")).await;
    assert!(matches!(err, ExecError::HostKeyChanged { .. }), "{err}");
    assert!(
        err.to_string().contains(&th.hosts[0].fingerprint()),
        "{err}"
    );
    // The rival's record stands, kprov's scanned key is not added beside it.
    let recorded = known_hosts(&store.inner).await;
    assert_eq!(
        recorded,
        format!("{} {rival_key}\n", th.hosts[0].address),
        "{recorded}"
    );
    fleet.close().await;
    let log = th.hosts[0].log();
    assert!(
        !log.contains("Accepted publickey"),
        "ssh authenticated:\n{log}"
    );
    assert!(th.hosts[0].read_upper("/etc/kprov").is_none(), "a step ran");
}

#[tokio::test]
async fn changed_host_key_is_refused_naming_both_fingerprints() {
    crate::needs_tier!(SshdHosts);
    let (th, store) = rig(1);
    contact(&th, &store).await;
    let old = th.hosts[0].fingerprint();
    th.hosts[0].new_host_key();
    let new = th.hosts[0].fingerprint();
    assert_ne!(old, new);

    // Even with permission to accept new keys, a changed key is never accepted.
    let second = fleet(&th, &store);
    let (err, msg) = refusal(&second, "host1", step("x", "touch /etc/pwned")).await;
    assert!(matches!(err, ExecError::HostKeyChanged { .. }), "{msg}");
    assert!(
        msg.contains("host1") && msg.contains(&old) && msg.contains(&new),
        "{msg}"
    );
    assert!(th.hosts[0].read_upper("/etc/pwned").is_none());
    assert!(!known_hosts(&store).await.is_empty());
}

#[tokio::test]
async fn unreachable_host_is_reported_while_others_succeed() {
    crate::needs_tier!(SshdHosts);
    let (th, store) = rig(2);
    let mut inventory = hosts(&th);
    inventory.push(host(&th, "ghost", &th.unreachable_address, None));
    let fleet = fleet_with(inventory, &store, true, Arc::new(Recorder::default()));
    let work: Vec<(String, Vec<Step>)> = ["host1", "ghost", "host2"]
        .iter()
        .map(|h| {
            (
                h.to_string(),
                vec![step("mark", "mkdir -p /etc/kprov && touch /etc/kprov/ok")],
            )
        })
        .collect();
    let started = Instant::now();
    let summary = fleet.run_all(&work).await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(!summary.ok());
    let failures: Vec<_> = summary.failures().collect();
    assert_eq!(failures.len(), 1, "{summary}");
    assert_eq!(failures[0].0.host, "ghost");
    assert!(
        matches!(failures[0].1, ExecError::Connect { .. }),
        "{:?}",
        failures[0].1
    );
    assert!(
        summary.to_string().contains(&th.unreachable_address),
        "{summary}"
    );
    for h in &th.hosts {
        assert!(
            h.read_upper("/etc/kprov/ok").is_some(),
            "{} not provisioned",
            h.name
        );
    }
}

#[tokio::test]
async fn non_root_user_works_through_sudo() {
    crate::needs_tier!(SshdHosts);
    let (th, fleet) = as_user("deploy", true);
    let h = &th.hosts[0];
    let s = Step {
        files: vec![RemoteFile {
            path: "/etc/kprov/secret".into(),
            content: Bytes::from_static(b"s3cret"),
            mode: 0o600,
            resumable: false,
            on_arrival: None,
            sha256: None,
        }],
        ..step(
            "as root",
            "echo \"$(id -u) $SUDO_USER\" > /etc/kprov/whoami",
        )
    };
    fleet.run_steps("host1", &[s]).await.unwrap();
    assert_eq!(h.read_upper("/etc/kprov/whoami").unwrap(), b"0 deploy\n");
    assert_eq!(
        h.exec("stat -c '%U %a' /etc/kprov/secret").unwrap().trim(),
        "root 600"
    );
    assert_eq!(
        fleet.read_file("host1", "/etc/kprov/secret").await.unwrap(),
        Some(Bytes::from_static(b"s3cret"))
    );
}

#[tokio::test]
async fn sudo_wanting_a_password_is_a_clear_error() {
    crate::needs_tier!(SshdHosts);
    let (_th, fleet) = as_user("alice", false);
    let (err, msg) = refusal(&fleet, "host1", step("x", "true")).await;
    assert!(matches!(err, ExecError::SudoPassword { .. }), "{msg}");
    assert!(
        msg.starts_with("sudo on host1 requires a password"),
        "{msg}"
    );
    assert!(msg.contains("NOPASSWD"), "{msg}");
}

#[tokio::test]
async fn failed_step_carries_remote_stderr_and_stops_the_host() {
    crate::needs_tier!(SshdHosts);
    let (th, fleet) = started(1);
    let err = fleet
        .run_steps(
            "host1",
            &[
                step("breaks", "echo partial; echo 'kubeadm: boom' >&2; exit 3"),
                step("never", "mkdir -p /etc/kprov && touch /etc/kprov/after"),
            ],
        )
        .await
        .unwrap_err();
    match &err {
        ExecError::Step {
            host,
            step,
            code,
            stderr,
        } => {
            assert_eq!(
                (host.as_str(), step.as_str(), *code),
                ("host1", "breaks", Some(3))
            );
            assert_eq!(stderr, "kubeadm: boom");
        }
        other => panic!("{other:?}"),
    }
    assert!(th.hosts[0].read_upper("/etc/kprov/after").is_none());
}

#[tokio::test]
async fn step_timeout_is_reported_and_the_remote_command_stopped() {
    crate::needs_tier!(SshdHosts);
    let (th, fleet) = started(1);
    let slow = Step {
        timeout: Duration::from_secs(1),
        ..step("slow", "sleep 30")
    };
    let started = Instant::now();
    let err = fleet.run_steps("host1", &[slow]).await.unwrap_err();
    assert!(matches!(err, ExecError::Timeout { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The remote sleep must not outlive its step.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if !th.hosts[0].processes().iter().any(|p| p == "sleep") {
            break;
        }
        assert!(Instant::now() < deadline, "remote sleep still running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The operator's ssh config for the bastion `th.hosts[0]`: the jump host is the operator's
/// business, its key checked by the ssh config given with -F (which ProxyJump passes on),
/// never disabled; `known` says whether its key is in the operator's known_hosts.
fn bastion_config(th: &TestHosts, known: bool) -> std::path::PathBuf {
    let bastion = &th.hosts[0];
    let bastion_known = th.dir().join("bastion_known_hosts");
    let line = if known {
        format!("{} {}", bastion.address, bastion.host_public_key())
    } else {
        String::new()
    };
    std::fs::write(&bastion_known, line).unwrap();
    let config = th.dir().join("ssh_config");
    std::fs::write(
        &config,
        format!(
            "Host {}\n  User root\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            bastion.address,
            th.client_key.display(),
            bastion_known.display()
        ),
    )
    .unwrap();
    config
}

/// A bastion whose host key the operator never accepted: not "host unreachable", but what
/// is untrusted and how to trust it (issue 21).
#[tokio::test]
async fn a_bastion_with_an_unknown_host_key_is_named_with_how_to_trust_it() {
    crate::needs_tier!(SshdHosts);
    let th = TestHosts::start(2);
    let (bastion, target) = (&th.hosts[0], &th.hosts[1]);
    let mut behind = host(&th, "inner", &target.address, None);
    behind.bastion = Some(format!("root@{}", bastion.address));
    let options = SshOptions {
        config_file: Some(bastion_config(&th, false)),
        ..options(true)
    };
    let store = Arc::new(MemStore::default());
    let fleet = fleet_using(vec![behind], store.clone(), options);
    let (_, err) = refusal(&fleet, "inner", step("mark", "true")).await;
    assert!(
        err.contains(&format!(
            "through the bastion root@{}: ssh does not trust the bastion's host key",
            bastion.address
        )) && err.contains(&format!("`ssh ssh://root@{}`", bastion.address))
            && !err.contains("host unreachable"),
        "{err}"
    );
    assert!(known_hosts(&store).await.is_empty(), "a key was recorded");
    fleet.close().await;
}

#[tokio::test]
async fn host_behind_a_bastion_is_reached_through_it() {
    crate::needs_tier!(SshdHosts);
    let th = TestHosts::start(2);
    let (bastion, target) = (&th.hosts[0], &th.hosts[1]);
    let config = bastion_config(&th, true);
    let bastion_known = th.dir().join("bastion_known_hosts");
    let mut behind = host(&th, "inner", &target.address, None);
    behind.bastion = Some(format!("root@{}", bastion.address));
    let behind_again = behind.clone();
    let store = Arc::new(MemStore::default());
    let options = SshOptions {
        config_file: Some(config),
        ..options(true)
    };
    let fleet = fleet_using(vec![behind], store.clone(), options.clone());
    fleet
        .run_steps(
            "inner",
            &[step(
                "mark",
                "mkdir -p /etc/kprov && hostname > /etc/kprov/who",
            )],
        )
        .await
        .unwrap();
    assert_eq!(target.read_upper("/etc/kprov/who").unwrap(), b"host2\n");
    // The scan through the bastion recorded the target's key, not the bastion's.
    let recorded = known_hosts(&store).await;
    let key = target.host_public_key();
    let key: Vec<&str> = key.split_whitespace().take(2).collect();
    assert!(
        recorded.contains(&format!("{} {} {}", target.address, key[0], key[1])),
        "{recorded}"
    );
    // sshd on the target saw the connection come from the bastion's address.
    assert!(
        target
            .log()
            .contains(&format!("from {} port", bastion.address)),
        "{}",
        target.log()
    );
    fleet.close().await;

    // A bastion whose key does not match is refused by ssh, and is not mistaken for a
    // changed key of the host behind it.
    std::fs::write(
        &bastion_known,
        format!("{} {}", bastion.address, target.host_public_key()),
    )
    .unwrap();
    let again = fleet_using(vec![behind_again], store.clone(), options);
    let (err, msg) = refusal(&again, "inner", step("x", "true")).await;
    // (ssh's ProxyJump child reports the refusal on a stderr the crate discards, so the
    // message is only ssh's "connection closed".)
    assert!(matches!(err, ExecError::Connect { .. }), "{msg}");
    assert!(msg.starts_with("inner: cannot connect: "), "{msg}");
}

#[tokio::test]
async fn concurrency_bounds_hosts_in_flight() {
    crate::needs_tier!(SshdHosts);
    let (th, store) = rig(3);
    let rec = Arc::new(Recorder::default());
    let options = SshOptions {
        concurrency: 1,
        ..options(true)
    };
    let fleet = SshFleet::new(CLUSTER, hosts(&th), store.clone(), options, rec.clone()).unwrap();
    let work: Vec<(String, Vec<Step>)> = th
        .hosts
        .iter()
        .map(|h| (h.name.clone(), vec![step("a", "true"), step("b", "true")]))
        .collect();
    assert!(fleet.run_all(&work).await.ok());
    // With one host in flight, each host's events form one uninterrupted block.
    let order: Vec<String> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Connecting { host } | Event::StepStarted { host, .. } => Some(host.clone()),
            _ => None,
        })
        .collect();
    let mut blocks = order.clone();
    blocks.dedup();
    assert_eq!(blocks.len(), 3, "{order:?}");
    fleet.close().await;
}

#[tokio::test]
async fn many_files_fit_through_stock_max_sessions() {
    crate::needs_tier!(SshdHosts);
    let th = TestHosts::start(1);
    // Real hosts allow 10 sessions per connection; every upload is one.
    th.hosts[0].set_max_sessions(10);
    let store = Arc::new(MemStore::default());
    let fleet = fleet(&th, &store);
    let files: Vec<RemoteFile> = (0..40)
        .map(|i| RemoteFile {
            path: format!("/etc/kprov/many/{i}.conf"),
            content: Bytes::from(format!("file {i}\n")),
            mode: 0o644,
            resumable: false,
            on_arrival: None,
            sha256: None,
        })
        .collect();
    let s = Step {
        files,
        ..step(
            "many files",
            "cat /etc/kprov/many/*.conf | wc -l > /etc/kprov/count",
        )
    };
    let outcomes = fleet
        .run_steps("host1", std::slice::from_ref(&s))
        .await
        .unwrap();
    assert_eq!(outcomes, vec![StepOutcome::Changed]);
    assert_eq!(th.hosts[0].read_upper("/etc/kprov/count").unwrap(), b"40\n");
    let upper = th.hosts[0].upper_path("/etc/kprov/many/7.conf");
    let mtime = std::fs::metadata(&upper).unwrap().modified().unwrap();
    // Without a check the run runs again, but nothing is uploaded.
    let again = fleet.run_steps("host1", &[s]).await.unwrap();
    assert_eq!(again, vec![StepOutcome::Changed]);
    assert_eq!(
        std::fs::metadata(&upper).unwrap().modified().unwrap(),
        mtime
    );
    fleet.close().await;
}

#[tokio::test]
async fn a_lost_connection_is_reopened() {
    crate::needs_tier!(SshdHosts);
    let (th, rec, fleet) = watched(1);
    let s = step("mark", "mkdir -p /etc/kprov && echo x >> /etc/kprov/runs");
    fleet
        .run_steps("host1", std::slice::from_ref(&s))
        .await
        .unwrap();
    th.hosts[0].drop_connections();
    fleet.run_steps("host1", &[s]).await.unwrap();
    assert_eq!(
        th.hosts[0].read_upper("/etc/kprov/runs").unwrap(),
        b"x\nx\n"
    );
    let connects = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::Connected { .. }))
        .count();
    assert_eq!(connects, 2);
    fleet.close().await;
}

#[tokio::test]
async fn known_host_gone_offline_is_a_connect_error_from_ssh() {
    crate::needs_tier!(SshdHosts);
    let (th, store) = rig(1);
    // The cluster knows this address's key (it was up once); now nothing answers there.
    let line = format!(
        "{} {}",
        th.unreachable_address,
        th.hosts[0].host_public_key()
    );
    store
        .put(
            &format!("{CLUSTER}/known_hosts"),
            Bytes::from(line),
            kprov::state::Precondition::Absent,
        )
        .await
        .unwrap();
    let fleet = fleet_with(
        vec![host(&th, "gone", &th.unreachable_address, None)],
        &store,
        false,
        Arc::new(Recorder::default()),
    );
    let (err, msg) = refusal(&fleet, "gone", step("x", "true")).await;
    assert!(matches!(err, ExecError::Connect { .. }), "{msg}");
    assert!(msg.starts_with("gone: cannot connect: "), "{msg}");
    assert!(msg.contains(&th.unreachable_address), "{msg}");
}

#[tokio::test]
async fn host_keys_on_another_port_are_recorded_as_ssh_looks_them_up() {
    crate::needs_tier!(SshdHosts);
    let th = TestHosts::start_on_port(1, 2222);
    let h = &th.hosts[0];
    let store = Arc::new(MemStore::default());
    contact(&th, &store).await;
    let key = h.host_public_key();
    let key: Vec<&str> = key.split_whitespace().take(2).collect();
    assert_eq!(
        known_hosts(&store).await,
        format!("[{}]:2222 {} {}\n", h.address, key[0], key[1])
    );
    // ssh finds the recorded key under that name: no permission needed the second time.
    let second = fleet_with(hosts(&th), &store, false, Arc::new(Recorder::default()));
    second
        .run_steps("host1", &[step("x", "true")])
        .await
        .unwrap();
    second.close().await;
}

/// Counts the TCP connections made to a loopback port (a stand-in for a host or a bastion).
struct Listener {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl Listener {
    fn start() -> Listener {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        // Detached: the thread ends with the test process; the socket is loopback only.
        std::thread::spawn(move || {
            for c in l.incoming() {
                if c.is_ok() {
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        Listener { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Issue 9: a read-only look (and any run not allowed to record keys) makes no network
/// contact with a host whose key is not recorded: no keyscan, no login to its bastion.
#[tokio::test]
async fn unknown_host_key_means_zero_connections_direct_and_through_a_bastion() {
    let target = Listener::start();
    let bastion = Listener::start();
    let mk = |name: &str, via: Option<String>| Host {
        name: name.into(),
        address: "127.0.0.1".into(),
        ip: None,
        access_ip: None,
        user: Some("root".into()),
        port: Some(target.port),
        key_path: None,
        bastion: via,
        roles: vec![HostRole::Node],
        labels: Default::default(),
        taints: Vec::new(),
    };
    let store = Arc::new(MemStore::default());
    let fleet = fleet_with(
        vec![
            mk("direct", None),
            mk("behind", Some(format!("root@127.0.0.1:{}", bastion.port))),
        ],
        &store,
        false,
        Arc::new(Recorder::default()),
    );
    for h in ["direct", "behind"] {
        let err = fleet
            .read_file(h, "/etc/kubernetes/kubelet.conf")
            .await
            .unwrap_err();
        assert!(matches!(err, ExecError::UnknownHostKey { .. }), "{err}");
    }
    fleet.close().await;
    // Give a stray connection (there must be none) time to be accepted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(target.accepted(), 0, "the host was contacted");
    assert_eq!(bastion.accepted(), 0, "the bastion was contacted");
    assert_eq!(known_hosts(&store).await, "");
}

#[tokio::test]
async fn steps_after_a_step_with_files_run_in_one_remote_command_with_per_step_progress() {
    crate::needs_tier!(SshdHosts);
    let (th, rec, fleet) = watched(1);
    // Each step records the remote shell that ran it: the parent of its `timeout`.
    let record = |n: u32| {
        step(
            &format!("record {n}"),
            &format!("ps -o ppid= -p $PPID | tr -d ' ' > /etc/kprov/shell.{n}"),
        )
    };
    let files = Step {
        files: vec![RemoteFile {
            path: "/etc/kprov/a.conf".into(),
            content: Bytes::from_static(b"a\n"),
            mode: 0o644,
            resumable: false,
            on_arrival: None,
            sha256: None,
        }],
        ..record(1)
    };
    let second_files = Step {
        files: vec![RemoteFile {
            path: "/etc/kprov/b.conf".into(),
            content: Bytes::from_static(b"b\n"),
            mode: 0o600,
            resumable: false,
            on_arrival: None,
            sha256: None,
        }],
        ..record(4)
    };
    let outcomes = fleet
        .run_steps("host1", &[files, record(2), record(3), second_files])
        .await
        .unwrap();
    assert_eq!(outcomes, vec![StepOutcome::Changed; 4]);
    let shell = |n: u32| {
        String::from_utf8(
            th.hosts[0]
                .read_upper(&format!("/etc/kprov/shell.{n}"))
                .unwrap(),
        )
        .unwrap()
    };
    // One command for a step with files and the file-less steps after it; the next step with
    // files starts the next command (its files are compared after the steps before it ran).
    assert_eq!(shell(1), shell(2));
    assert_eq!(shell(2), shell(3));
    assert_ne!(shell(3), shell(4));
    assert_eq!(th.hosts[0].read_upper("/etc/kprov/b.conf").unwrap(), b"b\n");
    // Progress still comes per step, in order.
    let seen: Vec<String> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::StepStarted { step, index, .. } => Some(format!("start {index} {step}")),
            Event::StepFinished { step, result, .. } => {
                Some(format!("end {step} {}", result.is_ok()))
            }
            _ => None,
        })
        .collect();
    let want: Vec<String> = (1..=4)
        .flat_map(|n| {
            [
                format!("start {} record {n}", n - 1),
                format!("end record {n} true"),
            ]
        })
        .collect();
    assert_eq!(seen, want);
    fleet.close().await;
}

/// On a CPU with AES instructions kprov's connections offer AES-GCM first (the bulk transfers'
/// cipher), through a config that still includes the user's; a cipher the user's config sets
/// wins, and no `Ciphers` of kprov's is written then.
#[tokio::test]
async fn aes_gcm_is_preferred_unless_the_users_config_sets_a_cipher() {
    crate::needs_tier!(SshdHosts);
    let th = TestHosts::start(1);
    let aes = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|w| w == "aes"));
    let store = Arc::new(MemStore::default());
    let fleet = fleet(&th, &store);
    fleet
        .run_steps("host1", &[step("one", "true")])
        .await
        .unwrap();
    let config = std::fs::read_to_string(fleet.control_dir().join("ssh_config.0"));
    if aes {
        let config = config.expect("kprov's connection config");
        assert!(
            config.contains("\n  Ciphers aes128-gcm@openssh.com,chacha20-poly1305@openssh.com"),
            "{config}"
        );
        // For the host's own address only: a ProxyJump child reads this file too.
        let address = &th.hosts[0].address;
        assert!(
            config.contains(&format!("Match originalhost \"{address}\"\n")),
            "{config}"
        );
        assert!(config.contains("Include ~/.ssh/config\n"), "{config}");
    } else {
        assert!(config.is_err(), "{config:?}");
    }
    fleet.close().await;

    let user = th.dir().join("user_ssh_config");
    std::fs::write(&user, "Ciphers aes256-ctr\n").unwrap();
    let options = SshOptions {
        config_file: Some(user.clone()),
        ..options(true)
    };
    let fleet = fleet_using(hosts(&th), store.clone(), options);
    fleet
        .run_steps("host1", &[step("two", "true")])
        .await
        .unwrap();
    assert!(
        !fleet.control_dir().join("ssh_config.0").exists(),
        "kprov wrote a config over the user's cipher"
    );
    fleet.close().await;
}

/// A file's arrival hook that outlives its own timeout is stopped on the host and fails the
/// step with an error that names the file and the hook's timeout (not the step's own
/// timeout); the step's run never starts, and `-v` saw the hook start.
#[tokio::test]
async fn an_arrival_hook_past_its_timeout_fails_the_step_naming_the_file() {
    crate::needs_tier!(SshdHosts);
    let (th, rec, fleet) = watched(1);
    let file = |path: &str, hook: &str, secs| RemoteFile {
        path: path.to_string(),
        content: Bytes::from(format!("{path}\n")),
        mode: 0o644,
        resumable: false,
        on_arrival: Some(kprov::ssh::task::Arrival {
            run: hook.to_string(),
            timeout: Duration::from_secs(secs),
        }),
        sha256: None,
    };
    let steps = vec![Step {
        files: vec![
            file("/opt/kprov/fast", "true", 60),
            file("/opt/kprov/slow", "exec sleep 600", 1),
        ],
        ..step("hooked", "touch /opt/kprov/ran")
    }];
    let e = fleet.run_steps("host1", &steps).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ExecError::Step { .. }), "{e:?}");
    assert!(
        text.contains(
            "kprov: /opt/kprov/slow: its arrival hook did not end within its timeout (1 s); stopped"
        ),
        "{text}"
    );
    assert!(!text.contains("/opt/kprov/fast: its"), "{text}");
    assert!(th.hosts[0].read_upper("/opt/kprov/ran").is_none());
    let hooks: Vec<String> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::HookStarted { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(hooks, ["/opt/kprov/fast", "/opt/kprov/slow"]);
    assert!(
        !th.hosts[0].processes().iter().any(|p| p == "sleep"),
        "the hook still runs"
    );
    fleet.close().await;
}
