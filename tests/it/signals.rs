//! Ctrl-C and SIGTERM at the long waits (issue 20: "tests send the signal at each wait"):
//! `update cluster --yes` on AWS during the SSH wait (moto, instances that never answer: the
//! lab plays no host for them) and a bastion that never answers; `--phase nodes`'s SSH wait;
//! `rolling-update --yes` on AWS at the wait for a new control plane's etcd member; metal
//! `update cluster --yes` at a host step that waits. Each run is interrupted once the log (or
//! a host's stand-in log) shows the wait, never after a fixed sleep; the exit code, the time
//! to exit, the lock (released, read with `lock status`), the resume message and what was in
//! flight (journal or message) are asserted. The other waits' signal tests: drains
//! (`rolling::roll_with_yes::ctrl_c_stops_at_a_safe_point_...`, `instance::` delete instance),
//! the roll's Ready and validation waits on metal
//! (`rolling::roll_with_yes::ctrl_c_ends_the_rolls_ready_and_validation_waits_within_a_second`).

use std::time::Duration;

use crate::support::awsroll::{CreateAws, code, lab_with_zone, update_yes};
use crate::support::cloudlab::CloudLab;
use crate::support::signals::{
    ctrl_c, exit_within, interrupt_held_step, log_text, spawn, term, wait_for_log,
};

/// Within a second of the signal, plus a process's start-up slack on a busy machine.
const EXIT_WITHIN: Duration = Duration::from_secs(2);

#[track_caller]
fn unlocked(lab: &CloudLab, cluster: &str) {
    let status = code(lab, &lab.kprov(&["lock", "status", cluster]), 0);
    assert!(status.contains("is not locked"), "{status}");
}

/// The lab with a hosted zone `zone` and the AWS cluster `cluster` created in it (`flags` to
/// `create cluster`).
fn created(cluster: &str, zone: &str, flags: &[&str]) -> std::sync::Arc<CloudLab> {
    let lab = lab_with_zone(zone);
    CreateAws::new(cluster).flags(flags).run(&lab);
    lab
}

/// Sends `signal` to `child`, which must exit with `code` within a second of it (bounded at
/// `secs`): how long it took, and what it wrote to `log`.
fn signalled(
    child: &mut std::process::Child,
    log: &std::path::Path,
    signal: fn(&std::process::Child),
    secs: u64,
    code: i32,
) -> (Duration, String) {
    signal(child);
    let (c, took) = exit_within(child, secs);
    let err = log_text(log);
    assert_eq!(c, Some(code), "{err}");
    assert!(took < EXIT_WITHIN, "exit took {took:?}\n{err}");
    (took, err)
}

/// The metal cluster `name` of a control plane (host1) and a node (host2), created.
fn metal_pair(name: &str) -> crate::metal::Lab {
    crate::metal::Lab::with_control_plane_and_worker(name)
}

/// A metal run that SIGINT stopped while a host step waited: 130 within a second of it
/// (`c`, `took`), its stderr `err` saying what was `interrupted` and how to `resume`; the
/// lock of `name` released.
fn metal_interrupted(
    lab: &crate::metal::Lab,
    name: &str,
    (c, took, err): (Option<i32>, Duration, &str),
    interrupted: &str,
    resume: &str,
) {
    assert_eq!(c, Some(130), "{err}");
    assert!(took < EXIT_WITHIN, "exit took {took:?}\n{err}");
    assert!(err.contains(interrupted), "{err}");
    assert!(err.contains(resume), "{err}");
    let status = lab.kprov(&["lock", "status", name]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("is not locked"),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// `metal_interrupted` for `update cluster --yes` on the two hosts of `metal_pair`.
fn metal_update_interrupted(
    lab: &crate::metal::Lab,
    name: &str,
    run: (Option<i32>, Duration, &str),
) {
    let interrupted = format!(
        "interrupted by SIGINT while provisioning 2 hosts (a host step cut short is done again by the next run); the lock of {name} is released"
    );
    let resume = format!("Resume with `kprov update cluster {name} --yes`.");
    metal_interrupted(lab, name, run, &interrupted, &resume);
}

/// Runs `kprov args` on the metal pair `name` (provisioned first when `provisioned`) with a
/// step of host2 held by the stand-in's `hold` file until host2 is asked the command `called`
/// finds (`what`), sends Ctrl-C, then lets the step go (see [`interrupt_held_step`]): the lab,
/// and the run's exit code, time to exit and stderr.
fn interrupted_on_host2(
    name: &str,
    provisioned: bool,
    args: &[&str],
    hold: &str,
    what: &str,
    called: impl Fn(&str) -> bool,
) -> (crate::metal::Lab, (Option<i32>, Duration, String)) {
    let lab = metal_pair(name);
    if provisioned {
        lab.provision(name);
    }
    let host2 = lab.host("host2");
    host2
        .exec(&format!("mkdir -p \"$(dirname {hold})\" && touch {hold}"))
        .unwrap_or_else(|e| panic!("hold {what}: {e}"));
    let run = interrupt_held_step(
        lab.kprov_command(args),
        what,
        || lab.calls("host2").iter().any(|(_, c)| called(c)),
        || {
            host2
                .exec(&format!("rm -f {hold}"))
                .unwrap_or_else(|e| panic!("release {what}: {e}"));
        },
    );
    (lab, run)
}

/// Lines of `log` that contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn update_yes_stops_within_a_second_of_sigint_or_sigterm_during_the_ssh_wait() {
    crate::needs_tier!(CloudLab);
    let cluster = "demo.sig-ssh.example";
    let lab = created(cluster, "sig-ssh.example", &["--node-count", "2"]);
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("update.log");
    let args = update_yes(cluster);

    // 1. Ctrl-C while 3 instances do not answer: out within a second, lock released.
    let mut child = spawn(lab.kprov_command(&args), &log);
    wait_for_log(&mut child, &log, "waiting for SSH", 240);
    // Three polls of the wait (2 s apart) happen before the signal: the same cause is
    // printed once per instance, not once per poll.
    let first = std::time::Instant::now();
    while first.elapsed() < Duration::from_secs(7) {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "{}",
            log_text(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, err) = signalled(&mut child, &log, ctrl_c, 30, 130);
    assert!(
        err.contains("interrupted by SIGINT while waiting for SSH on i-"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "Resume with `kprov update cluster {cluster} --yes`."
        )),
        "{err}"
    );
    let waits = lines_with(&err, "waiting for SSH (");
    assert!(
        (3..=6).contains(&waits),
        "one line per instance and change, not per poll: {waits}\n{err}"
    );
    unlocked(&lab, cluster);

    // 2. SIGTERM (a supervisor) at the same wait of the next run: 143, lock released.
    let mut child = spawn(lab.kprov_command(&args), &log);
    wait_for_log(&mut child, &log, "waiting for SSH", 240);
    let (_, err) = signalled(&mut child, &log, term, 30, 143);
    assert!(err.contains("interrupted by SIGTERM while"), "{err}");
    unlocked(&lab, cluster);

    // 3. The cloud resources the interrupted runs made are there: the next preview has
    //    nothing left to create.
    let again = code(&lab, &lab.kprov(&["update", "cluster", cluster]), 0);
    assert!(!again.contains("Will create"), "{again}");
    eprintln!("signal figures: SIGINT to exit and SIGTERM to exit, each under {EXIT_WITHIN:?}");
}

#[test]
fn a_bastion_that_never_answers_stops_the_run_after_its_own_wait_and_a_signal_ends_that_wait() {
    crate::needs_tier!(CloudLab);
    let cluster = "demo.sig-bastion.example";
    let lab = created(
        cluster,
        "sig-bastion.example",
        &["--topology", "private", "--bastion"],
    );
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("update.log");

    // 1. SIGINT during the bastion's wait.
    let args = ["update", "cluster", cluster, "--yes"];
    let mut child = spawn(lab.kprov_command(&args), &log);
    wait_for_log(&mut child, &log, "bastion", 240);
    wait_for_log(&mut child, &log, "waiting for SSH", 60);
    let (_, err) = signalled(&mut child, &log, ctrl_c, 30, 130);
    assert!(
        err.contains("interrupted by SIGINT while waiting for SSH on bastion"),
        "{err}"
    );
    unlocked(&lab, cluster);

    // 2. Its own wait (short here) ends the run, its cause in the summary; the nodes behind
    //    it are not waited for.
    let started = std::time::Instant::now();
    let o = lab.kprov(&["update", "cluster", cluster, "--yes", "--ssh-wait", "4s"]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the bastion of {cluster} (bastion.{cluster}) did not answer SSH within 4s:"
        )),
        "{err}"
    );
    assert!(err.contains("were not contacted"), "{err}");
    assert_eq!(lines_with(&err, "waiting for SSH at"), 0, "{err}");
    assert!(took < Duration::from_secs(60), "took {took:?}\n{err}");
    unlocked(&lab, cluster);
}

/// kops's lifecycle phases on AWS, with instances that never answer SSH (the lab plays no
/// host for them): `--phase nodes` before the cloud exists is refused and changes nothing;
/// `--phase cloud` applies the cloud resources and returns without waiting for a single
/// instance; `--phase nodes` then waits for SSH, and a Ctrl-C there ends it at once with the
/// phase in the resume command. `toolbox dump` then lists what the cluster owns and its
/// instances, with no secret in it.
#[test]
fn update_phases_apply_the_cloud_alone_and_the_nodes_alone_and_toolbox_dump_shows_them() {
    crate::needs_tier!(CloudLab);
    let cluster = "demo.phases.example";
    let lab = created(cluster, "phases.example", &["--node-count", "1"]);

    // 1. Nodes before cloud: refused, nothing created.
    let o = lab.kprov(&["update", "cluster", cluster, "--yes", "--phase", "nodes"]);
    let err = code(&lab, &o, 1);
    let err = format!("{err}{}", String::from_utf8_lossy(&o.stderr));
    assert!(err.contains("do not match the spec yet"), "{err}");
    assert!(
        err.contains(&format!(
            "`kprov update cluster {cluster} --yes --phase cloud`"
        )),
        "{err}"
    );
    let preview = code(&lab, &lab.kprov(&["update", "cluster", cluster]), 0);
    assert!(preview.contains("Will create"), "{preview}");
    unlocked(&lab, cluster);

    // 2. Cloud alone: applied, no instance waited for.
    let o = lab.kprov(&[&update_yes(cluster)[..], &["--phase", "cloud"]].concat());
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    code(&lab, &o, 0);
    assert!(err.contains("Cloud resources of"), "{err}");
    assert!(err.contains("--phase cloud: the instances of"), "{err}");
    assert_eq!(lines_with(&err, "waiting for SSH"), 0, "{err}");
    assert_eq!(lines_with(&err, "launched by Auto Scaling"), 0, "{err}");
    let again = code(
        &lab,
        &lab.kprov(&["update", "cluster", cluster, "--phase", "cloud"]),
        0,
    );
    assert!(!again.contains("Will create"), "{again}");
    unlocked(&lab, cluster);

    // 3. Nodes alone: the SSH wait; Ctrl-C ends it, the resume names the phase.
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("update.log");
    let args = [&update_yes(cluster)[..], &["--phase", "nodes"]].concat();
    let mut child = spawn(lab.kprov_command(&args), &log);
    wait_for_log(&mut child, &log, "waiting for SSH", 240);
    let (_, err) = signalled(&mut child, &log, ctrl_c, 30, 130);
    assert!(
        err.contains(&format!(
            "Resume with `kprov update cluster {cluster} --yes --phase nodes`."
        )),
        "{err}"
    );
    assert!(
        !err.contains("Cloud resources of"),
        "nodes changed the cloud:\n{err}"
    );
    unlocked(&lab, cluster);

    // 4. toolbox dump: the owned resources with their IDs, the instances, no secret; an API
    //    that does not answer is named in the dump (loopback, nothing listens there).
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: not-a-secret-of-the-cluster}\n",
    )
    .expect("kubeconfig");
    let o = lab.kprov(&[
        "toolbox",
        "dump",
        "--name",
        cluster,
        "-o",
        "json",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    let out = code(&lab, &o, 0);
    let dump: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"));
    assert_eq!(dump["cluster"], cluster);
    assert_eq!(dump["cloud"], "aws");
    let kinds: Vec<&str> = dump["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["kind"].as_str())
        .collect();
    for k in ["Vpc", "Subnet", "AutoScalingGroup", "KeyPair"] {
        assert!(
            kinds.iter().any(|x| x.contains(k)),
            "{k} not in {kinds:?}\n{out}"
        );
    }
    assert!(
        dump["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"].as_str().is_some_and(|i| i.starts_with("vpc-"))),
        "{out}"
    );
    let machines = dump["machines"].as_array().expect("machines");
    assert_eq!(machines.len(), 2, "{out}");
    assert!(
        machines.iter().all(|m| m["instance"]["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("i-"))),
        "{out}"
    );
    assert!(
        dump["nodesError"]
            .as_str()
            .is_some_and(|e| e.contains("127.0.0.1:9")),
        "{out}"
    );
    for secret in [
        "PRIVATE KEY",
        "BEGIN CERTIFICATE",
        "not-a-secret-of-the-cluster",
    ] {
        assert!(!out.contains(secret), "{secret} in the dump:\n{out}");
    }
    // YAML by default, as kops's.
    let yaml = code(
        &lab,
        &lab.kprov(&["toolbox", "dump", cluster, "--no-api"]),
        0,
    );
    assert!(yaml.contains("cluster: demo.phases.example"), "{yaml}");
    assert!(
        !yaml.contains("\nnodes:") && !yaml.contains("nodesError"),
        "{yaml}"
    );
}

/// The wait for a new control plane's etcd member during a control-plane replacement on AWS
/// (the control-plane group's image changed: a surge instance joins, and the roll waits until
/// etcd lists its member started and healthy before the old member is removed). The stand-in
/// kubeadm adds the joining member unhealthy (the lab's `join-unhealthy` switch), so the wait
/// lasts; SIGINT once kprov says it waits for it: out within a second (the wait's own bound is
/// 10 minutes), the old control plane untouched (its member and instance kept), the journal
/// recording the node where it was and why, the lock released, the resume said; healed, the
/// next run uses the joined instance (no second surge, no second member).
#[test]
fn a_signal_ends_the_wait_for_a_new_control_planes_etcd_member_on_aws() {
    crate::needs_tier!(CloudLab);
    use crate::support::awsroll::{journal, rolling, running_cluster, text, update_yes};
    use kprov::spec::{InstanceGroupRole, Object};
    let cluster = "demo.sig-etcd.example";
    let lab = running_cluster(cluster, "sig-etcd.example", 1);
    let all = lab.instances();
    let (old_id, old) = all
        .iter()
        .find(|(_, h)| {
            h.read_upper("/etc/kubernetes/manifests/kube-apiserver.yaml")
                .is_some()
        })
        .map(|(id, h)| (id.clone(), h.clone()))
        .expect("a control plane");
    let a = &old.address;
    let members = lab.share_etcd_members(&format!(
        "1 {} https://{a}:2380 https://{a}:2379 true\n",
        old.name
    ));
    let history = members.with_extension("history");
    let unhealthy = members.with_extension("join-unhealthy");
    std::fs::write(&unhealthy, "").expect("join-unhealthy");
    lab.edit_objects(cluster, |objects| {
        for o in objects {
            if let Object::InstanceGroup(g) = o
                && g.spec.role == InstanceGroupRole::ControlPlane
            {
                g.spec.image = Some(
                    "099720109477/ubuntu/images/hvm-ssd/ubuntu-trusty-14.04-amd64-server-*".into(),
                );
            }
        }
    });
    code(&lab, &lab.kprov(&update_yes(cluster)), 0);

    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("roll.log");
    let args = rolling(cluster, &["--yes", "--validation-timeout", "3m"]);
    let mut child = spawn(lab.kprov_command(&args), &log);
    wait_for_log(&mut child, &log, "listed, not healthy yet", 600);
    let at = std::time::Instant::now();
    let (took, err) = signalled(&mut child, &log, ctrl_c, 60, 130);
    assert!(at.elapsed() < Duration::from_secs(60), "{err}");
    assert!(
        err.contains(&format!(
            "interrupted: before {} was cordoned: interrupted by SIGINT while waiting",
            old.name
        )) && err.contains(&format!(
            "the old one ({old_id}) keeps its etcd member and instance"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "The lock of {cluster} is released. Resume with `kprov rolling-update cluster {cluster} --yes`."
        )),
        "{err}"
    );
    unlocked(&lab, cluster);
    // The journal: the old control plane where it was (not cordoned), and why it stopped.
    let j = journal(&lab, cluster);
    let node = j["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["target"] == old_id.as_str()))
        .unwrap_or_else(|| panic!("{old_id} not in the journal: {j}"));
    assert_eq!(node["step"], "waiting", "{j}");
    assert!(
        node["stopped"]
            .as_str()
            .is_some_and(|s| s
                .starts_with("interrupted before its cordon: interrupted by SIGINT while waiting")),
        "{j}"
    );
    assert_eq!(j["finished"], false);
    // Nothing of the old one was touched: its member listed, its instance running, one
    // member added (the surge instance's).
    lab.sync();
    assert!(lab.instances().contains_key(&old_id), "{err}");
    let listed = std::fs::read_to_string(&members).expect("members");
    assert!(listed.contains(&format!(" {} ", old.name)), "{listed}");
    let added = |h: &str| h.lines().filter(|l| l.contains(" add ")).count();
    assert_eq!(
        added(&std::fs::read_to_string(&history).expect("history")),
        1
    );

    // Healed: the next run resumes with the joined instance and finishes.
    std::fs::remove_file(&unhealthy).expect("healthy joins");
    std::fs::write(&members, listed.replace(" false", " true")).expect("new member healthy");
    let o = lab.kprov(&args);
    let out = code(&lab, &o, 0);
    let err2 = text(&o.stderr);
    assert!(err2.contains("Resuming"), "{out}\n{err2}");
    let h = std::fs::read_to_string(&history).expect("history");
    assert_eq!(added(&h), 1, "a second member joined:\n{h}");
    assert_eq!(
        h.lines().filter(|l| l.contains(" remove ")).count(),
        1,
        "{h}"
    );
    assert!(journal(&lab, cluster)["finished"] == true, "{err2}");
    eprintln!("signal figures: SIGINT at the etcd member wait to exit {took:?}");
}

/// Ctrl-C during a metal `update cluster --yes` while a host's step waits (host2's
/// `systemctl restart containerd` held by the stand-in until the test lets it go): out within
/// a second of the signal, saying what was in flight and how to resume, the lock released; the
/// next run (hold gone) finishes both hosts.
#[test]
fn metal_update_yes_stops_within_a_second_of_sigint_while_a_host_step_waits() {
    crate::needs_tier!(SshdHosts);
    use crate::metal::metal_update_yes;
    let name = "sig.metal.example.com";
    let (lab, (c, took, err)) = interrupted_on_host2(
        name,
        false,
        &metal_update_yes(name, &[]),
        "/var/lib/kprov-standins/systemd/containerd.restart-hold",
        "host2's containerd restart",
        |c| c.trim() == "systemctl restart containerd",
    );
    metal_update_interrupted(&lab, name, (c, took, &err));
    // The next run takes the lock at once and finishes both hosts.
    lab.provision(name);
    assert!(
        lab.kubeadm_calls("host2")
            .iter()
            .any(|(_, c)| c.starts_with("kubeadm join")),
        "host2 did not join"
    );
    eprintln!("signal figures: SIGINT at a metal host step to exit {took:?}");
}

/// Ctrl-C during `delete cluster --yes` on metal while a host's reset waits (host2's
/// `kubeadm reset` held by the stand-in): out within a second, the resume command said, the lock released, the cluster
/// still in the store; the next `delete cluster --yes` (hold gone) finishes.
#[test]
fn metal_delete_cluster_stops_within_a_second_of_sigint_while_a_host_resets() {
    crate::needs_tier!(SshdHosts);
    let name = "sig-delete.metal.example.com";
    let (lab, (c, took, err)) = interrupted_on_host2(
        name,
        true,
        &["delete", "cluster", name, "--yes"],
        "/var/lib/kprov-standins/reset-hold",
        "host2's kubeadm reset",
        |c| c.starts_with("kubeadm reset"),
    );
    metal_interrupted(
        &lab,
        name,
        (c, took, &err),
        &format!(
            "interrupted by SIGINT while deleting the cluster; the lock of {name} is released"
        ),
        &format!("Resume with `kprov delete cluster {name} --yes`."),
    );
    let again = lab.kprov(&["delete", "cluster", name, "--yes"]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let gone = lab.kprov(&["get", "clusters"]);
    assert!(
        !String::from_utf8_lossy(&gone.stdout).contains(name),
        "{}",
        String::from_utf8_lossy(&gone.stdout)
    );
    eprintln!("signal figures: SIGINT at a metal host reset to exit {took:?}");
}

/// The add-ons' wait on the API at the end of `update cluster --yes` on AWS (the CCM's
/// rollout, up to `--wait` per stage), held: the lab stops playing Kubernetes and the CCM's
/// DaemonSet reads not ready. SIGINT once kprov polls it (its reads of the DaemonSet after the
/// apply): out within a second, the add-ons named as what was in flight, the resume command
/// with `--phase addons`, the lock released. (The listener caught the signal before the lock
/// was taken, so a wait that did not race it would have run to its 5-minute bound.)
#[test]
fn update_yes_stops_within_a_second_of_sigint_during_the_addons_wait_on_aws() {
    crate::needs_tier!(CloudLab);
    use crate::support::awsroll::running_cluster;
    let cluster = "demo.sig-addons.example";
    let lab = running_cluster(cluster, "sig-addons.example", 1);
    lab.unwatch();
    let ccm = lab
        .fake
        .list("DaemonSet")
        .into_iter()
        .find(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("cloud-controller-manager"))
        })
        .expect("the CCM's DaemonSet");
    let ns = ccm["metadata"]["namespace"]
        .as_str()
        .expect("ns")
        .to_string();
    let ds = ccm["metadata"]["name"].as_str().expect("name").to_string();
    lab.fake.set_status(
        "DaemonSet",
        Some(&ns),
        &ds,
        serde_json::json!({"desiredNumberScheduled": 2, "currentNumberScheduled": 2,
            "numberMisscheduled": 0, "numberReady": 0, "updatedNumberScheduled": 0,
            "numberAvailable": 0, "observedGeneration": 1}),
    );
    lab.fake.clear_requests();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("update.log");
    let args = ["update", "cluster", cluster, "--yes"];
    let mut child = spawn(lab.kprov_command(&args), &log);
    let path = format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{ds}");
    let polls = || {
        lab.fake
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    // Two reads, 2 s apart: the rollout wait's polls, past the apply.
    while polls() < 2 {
        if std::time::Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kprov never waited for {path}:\n{}", log_text(&log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (took, err) = signalled(&mut child, &log, ctrl_c, 60, 130);
    assert!(
        err.contains(
            "interrupted by SIGINT while applying the add-ons and waiting for them through the API"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "Resume with `kprov update cluster {cluster} --yes --phase addons`."
        )),
        "{err}"
    );
    unlocked(&lab, cluster);
    eprintln!("signal figures: SIGINT at the add-ons' wait to exit {took:?}");
}

/// Ctrl-C during a metal `update cluster --yes` while it reads the `file://` image archives
/// (read on a thread of their own while the hosts are observed, the plan awaiting them): the
/// archive is a FIFO the test holds open and never writes, so the read never ends by itself.
/// Out within a second of the signal, saying how to resume, the lock released: the run is not
/// kept alive by the read it left behind.
#[test]
fn metal_update_yes_stops_within_a_second_of_sigint_while_image_archives_load() {
    crate::needs_tier!(SshdHosts);
    use crate::metal::metal_update_yes;
    use std::os::unix::fs::OpenOptionsExt;
    /// Linux's `O_NONBLOCK` (<fcntl.h>): opening a FIFO to write fails at once while no one
    /// reads it.
    const O_NONBLOCK: i32 = 0o4000;
    let name = "sig-images.metal.example.com";
    let lab = metal_pair(name);
    let fifo = lab.dir.path().join("held-archive.tar");
    crate::support::run_ok(std::process::Command::new("mkfifo").arg(&fifo), "mkfifo");
    lab.edit_cluster(name, |c| {
        c.spec.assets.as_mut().expect("assets").images = vec![kprov::spec::ImageArchive {
            url: format!("file://{}", fifo.display()),
            sha256: "0".repeat(64),
        }];
    });
    // The writer end, opened once kprov reads the FIFO and held (no byte written) until kprov
    // exited: closing it would end the read.
    let writer = std::cell::RefCell::new(None);
    let args = metal_update_yes(name, &[]);
    let (c, took, err) = interrupt_held_step(
        lab.kprov_command(&args),
        "the image archive's read",
        || {
            if writer.borrow().is_none() {
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(O_NONBLOCK)
                    .open(&fifo);
                *writer.borrow_mut() = opened.ok();
            }
            writer.borrow().is_some()
        },
        || drop(writer.borrow_mut().take()),
    );
    metal_update_interrupted(&lab, name, (c, took, &err));
    eprintln!("signal figures: SIGINT at the image archives' load to exit {took:?}");
}
