//! Bare-metal clusters end to end, as an operator runs them: the real `kprov` binary, a
//! file:// state store, real sshd test hosts in network + mount namespaces, stand-in
//! kubeadm/kubelet/containerd served by a local mirror on the hosts' bridge, and host tools
//! (systemctl, sysctl, ...) in each host's /usr/local/sbin. Needs root.
//!
//! What each host wrote is read from its overlay upper dirs; what the stand-ins were asked to
//! do from their call log (each host's /var/log is a directory of this test).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;

use kprov::spec::{self, Assets, CloudControllerManager, Cluster, Object, ObjectRef};

use crate::support::cli::{create_metal, export_kubeconfig};
use crate::support::cli::{fails, prints, says};
pub(crate) use crate::support::cli::{ok, show, text};
use crate::support::mirror::Mirror;
use crate::support::snapshot;
use crate::support::testhosts::TestHosts;

pub(crate) const VERSION: &str = "1.35.1";

/// Every host of `hosts` has a row in `table` (the line starting with its name) that says
/// `says`; fails showing the table.
#[track_caller]
pub(crate) fn rows_say(table: &str, hosts: &[&str], says: &str) {
    for h in hosts {
        let row = table
            .lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_else(|| panic!("no row for {h}:\n{table}"));
        assert!(row.contains(says), "{h}: {table}");
    }
}

/// `update cluster NAME --yes --accept-new-host-keys --skip-addons` and `extra`: a metal
/// lab's apply (its hosts' keys are new; no API for add-ons).
pub(crate) fn metal_update_yes<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "update",
        "cluster",
        name,
        "--yes",
        "--accept-new-host-keys",
        "--skip-addons",
    ];
    args.extend_from_slice(extra);
    args
}

pub(crate) struct Lab {
    pub(crate) th: TestHosts,
    pub(crate) mirror: Mirror,
    /// HOME, state store, inventories, and per host its /var/log and fake /sys entries.
    /// Under /var/tmp: the hosts mount tmpfs over /tmp, so they could not see it there.
    pub(crate) dir: tempfile::TempDir,
}

impl Lab {
    pub(crate) fn start(n: usize) -> Lab {
        let th = TestHosts::start(n);
        let mirror = Mirror::start(th.gateway.parse().expect("gateway ip"), VERSION);
        let dir = tempfile::Builder::new()
            .prefix("kprov-metal-")
            .tempdir_in("/var/tmp")
            .expect("lab dir");
        for (i, h) in th.hosts.iter().enumerate() {
            h.prepare_node(i as u32 + 1);
        }
        Lab { th, mirror, dir }
    }

    /// The start of a Kubespray `hosts.yaml` for the lab's hosts (`all.vars`, `all.hosts`
    /// with address, `ip`, the key, and `access_ip` when asked); the caller adds `children`.
    pub(crate) fn kubespray_hosts(&self, access_ip: bool) -> String {
        let mut inv = String::from("all:\n  vars:\n    ansible_user: root\n  hosts:\n");
        for h in &self.th.hosts {
            inv.push_str(&format!(
                "    {}:\n      ansible_host: {}\n      ip: {}\n",
                h.name, h.address, h.address
            ));
            if access_ip {
                inv.push_str(&format!("      access_ip: {}\n", h.address));
            }
            inv.push_str(&format!(
                "      ansible_ssh_private_key_file: {}\n",
                self.key()
            ));
        }
        inv
    }

    /// The address test hosts reach the machine running the tests at (mirrors bind there).
    pub(crate) fn gateway(&self) -> &str {
        &self.th.gateway
    }

    /// What the lab's mirror served, by path.
    pub(crate) fn mirror_downloads(&self) -> Vec<String> {
        self.mirror.downloads()
    }

    pub(crate) fn store_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub(crate) fn kprov(&self, args: &[&str]) -> Output {
        self.kprov_command(args).output().expect("runs kprov")
    }

    /// The command [`Lab::kprov`] runs, for a test that starts it in the background.
    pub(crate) fn kprov_command(&self, args: &[&str]) -> std::process::Command {
        let mut c = crate::support::cli::kprov_in(self.dir.path(), &self.store_dir());
        c.args(args);
        c
    }

    /// `kprov` on a terminal (a pty from util-linux `script`): stdout and stderr merged.
    pub(crate) fn kprov_tty(&self, args: &[&str]) -> Output {
        let bin = assert_cmd::cargo::cargo_bin("kprov");
        let line = std::iter::once(bin.display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .collect::<Vec<_>>()
            .join(" ");
        std::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("TERM", "xterm")
            .env(
                "KPROV_STATE_STORE",
                format!("file://{}", self.store_dir().display()),
            )
            .stdin(std::process::Stdio::null())
            .output()
            .expect("runs kprov under script")
    }

    /// `create cluster NAME --cloud metal --inventory INVENTORY` at the pinned test version,
    /// its assets served by the test mirror; it must succeed.
    /// A lab of `n` hosts with cluster `name` created from an inventory of `roles` (host,
    /// role), kept as `inventory.yaml` in the lab's directory.
    pub(crate) fn with_cluster(n: usize, name: &str, roles: &[(&str, &str)]) -> Lab {
        let lab = Lab::start(n);
        let inv = lab.inventory(roles);
        lab.create_metal(name, &inv);
        lab
    }

    /// A lab of one host per entry of `roles` (host, role) with cluster `name` created from
    /// them and provisioned.
    pub(crate) fn provisioned(name: &str, roles: &[(&str, &str)]) -> Lab {
        let lab = Lab::with_cluster(roles.len(), name, roles);
        lab.provision(name);
        lab
    }

    /// The common small lab: host1 a control plane, host2 a worker, cluster `name` created.
    pub(crate) fn with_control_plane_and_worker(name: &str) -> Lab {
        Lab::with_cluster(2, name, &layout(1, 1))
    }

    pub(crate) fn create_metal(&self, name: &str, inventory: &str) {
        self.create_metal_spec(name, inventory);
        self.use_mirror(name, None);
    }

    /// `create cluster NAME --cloud metal --inventory INVENTORY` at the pinned test version,
    /// the spec only (assets as the spec says); it must succeed.
    pub(crate) fn create_metal_spec(&self, name: &str, inventory: &str) {
        ok(&self.kprov(
            &[
                &create_metal(name, inventory)[..],
                &["--kubernetes-version", VERSION],
            ]
            .concat(),
        ));
    }

    /// `lock status NAME` succeeds and says the cluster is not locked (a stopped run
    /// released its lock).
    #[track_caller]
    pub(crate) fn assert_unlocked(&self, name: &str) {
        let status = ok(&self.kprov(&["lock", "status", name]));
        assert!(status.contains("is not locked"), "{status}");
    }

    /// Cluster `name`'s lock taken as another operator running `command` would (on `rt`):
    /// held until the guard is dropped.
    pub(crate) fn hold_lock(
        &self,
        rt: &tokio::runtime::Runtime,
        name: &str,
        command: &str,
    ) -> kprov::state::lock::LockGuard {
        let url = format!("file://{}", self.store_dir().display());
        rt.block_on(async {
            let store = kprov::state::open(&url).await.expect("store");
            kprov::state::lock::acquire(store, name, command, std::time::Duration::from_secs(60))
                .await
                .expect("lock")
        })
    }

    /// `update cluster NAME --yes --accept-new-host-keys --skip-addons`; it must succeed.
    pub(crate) fn provision(&self, name: &str) {
        ok(&self.kprov(&metal_update_yes(name, &[])));
    }

    pub(crate) fn write(&self, name: &str, content: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    }

    /// Writes `inventory.yaml` ([`kprov_inventory`] of `roles`); its path.
    pub(crate) fn inventory(&self, roles: &[(&str, &str)]) -> String {
        self.write("inventory.yaml", &kprov_inventory(self, roles))
    }

    pub(crate) fn key(&self) -> String {
        self.th.client_key.display().to_string()
    }

    pub(crate) fn host(&self, name: &str) -> &crate::support::testhosts::TestHost {
        self.th
            .hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no test host {name}"))
    }

    /// The stand-ins' calls on test host `host`: (ns timestamp, "tool args").
    pub(crate) fn calls(&self, host: &str) -> Vec<(u128, String)> {
        self.host(host).standin_calls()
    }

    pub(crate) fn kubeadm_calls(&self, host: &str) -> Vec<(u128, String)> {
        self.calls(host)
            .into_iter()
            .filter(|(_, c)| c.starts_with("kubeadm "))
            .collect()
    }

    pub(crate) fn first_call(&self, host: &str, prefix: &str) -> u128 {
        self.calls(host)
            .into_iter()
            .find(|(_, c)| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("{host}: no call {prefix:?} in {:#?}", self.calls(host)))
            .0
    }

    pub(crate) fn upper(&self, host: &str, path: &str) -> Option<String> {
        self.host(host).read_upper(path).map(|b| text(&b))
    }

    /// Everything the hosts wrote to their overlays.
    pub(crate) fn hosts_snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut all = BTreeMap::new();
        for h in &self.th.hosts {
            let etc = h.upper_path("/etc/x");
            let upper = etc.parent().and_then(Path::parent).expect("upper dir");
            all.extend(snapshot(upper));
        }
        all
    }

    /// Writes the member list the stand-in etcd answers from on `on` (crictl into the static
    /// pod, or the host's etcdctl): (member id, host, healthy), each member named after its
    /// host with the host's address in its URLs. Rewriting it while kprov runs is how a member
    /// goes unhealthy mid-roll.
    pub(crate) fn seed_etcd_members(&self, on: &str, members: &[(u64, &str, bool)]) {
        let lines: String = members
            .iter()
            .map(|(id, host, healthy)| {
                let addr = &self.host(host).address;
                format!("{id} {host} https://{addr}:2380 https://{addr}:2379 {healthy}\n")
            })
            .collect();
        self.host(on)
            .exec(&format!(
                "mkdir -p /var/lib/kprov-standins && printf '%s' '{lines}' > /var/lib/kprov-standins/etcd-members.new \
                 && mv /var/lib/kprov-standins/etcd-members.new /var/lib/kprov-standins/etcd-members"
            ))
            .expect("seed etcd members");
    }

    /// The rolling update's journal in the lab's store, when there is one.
    pub(crate) fn journal(&self, cluster: &str) -> Option<serde_json::Value> {
        let path = self
            .store_dir()
            .join(cluster)
            .join("journal/rolling-update.json");
        let bytes = std::fs::read(path).ok()?;
        // A reader may race the store's atomic rename: a torn read is retried by the caller.
        serde_json::from_slice(&bytes).ok()
    }

    /// The journal's step of `node` (`waiting`, `cordoned`, ...), when journaled.
    pub(crate) fn journal_step(&self, cluster: &str, node: &str) -> Option<String> {
        let j = self.journal(cluster)?;
        j["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["nodeName"] == node)
            .and_then(|n| n["step"].as_str().map(str::to_string))
    }

    /// Changes the stored Cluster the way an operator does: `get -o yaml`, edit, `replace -f`.
    pub(crate) fn edit_cluster(&self, cluster: &str, edit: impl FnOnce(&mut Cluster)) {
        let yaml = ok(&self.kprov(&["get", "cluster", cluster, "-o", "yaml"]));
        let mut objects: Vec<Object> = spec::load_objects("stored", &yaml)
            .expect("stored objects parse")
            .into_iter()
            .map(|o| o.value)
            .collect();
        let cluster_obj = objects
            .iter_mut()
            .find_map(|o| match o {
                Object::Cluster(c) => Some(c),
                Object::InstanceGroup(_) => None,
            })
            .expect("a Cluster document");
        edit(cluster_obj);
        let refs = objects.iter().map(|o| match o {
            Object::Cluster(c) => ObjectRef::Cluster(c),
            Object::InstanceGroup(g) => ObjectRef::InstanceGroup(g),
        });
        let path = self.write("spec.yaml", &spec::to_yaml_stream(refs).expect("yaml"));
        ok(&self.kprov(&["replace", "-f", &path]));
    }

    /// Edits host `host` of the stored spec (as [`Lab::edit_cluster`]).
    pub(crate) fn edit_host(&self, cluster: &str, host: &str, edit: impl FnOnce(&mut spec::Host)) {
        self.edit_cluster(cluster, |c| {
            let h = c.spec.hosts.iter_mut().find(|h| h.name == host);
            edit(h.unwrap_or_else(|| panic!("{host} in the spec")));
        });
    }

    /// Points the cluster's assets at the mirror (what an air-gapped site does), optionally
    /// with a wrong checksum for one component.
    pub(crate) fn use_mirror(&self, cluster: &str, wrong_sha_for: Option<&str>) {
        let mut files = self.mirror.asset_files();
        for f in &mut files {
            if Some(f.name.as_str()) == wrong_sha_for {
                f.sha256 = "0".repeat(64);
            }
        }
        self.edit_cluster(cluster, |c| {
            c.spec.assets = Some(Assets {
                bundle: None,
                mirror: None,
                images: Vec::new(),
                files,
                checksums: Vec::new(),
            })
        });
    }
}

/// Everything in the lab's state store.
pub(crate) fn store_snapshot(lab: &Lab) -> BTreeMap<PathBuf, Vec<u8>> {
    snapshot(&lab.store_dir())
}

pub(crate) fn kprov_inventory(lab: &Lab, roles: &[(&str, &str)]) -> String {
    let mut s = String::from("hosts:\n");
    for (name, role) in roles {
        s.push_str(&format!(
            "  - name: {name}\n    address: {}\n    user: root\n    keyPath: {}\n    roles: [{role}]\n",
            lab.host(name).address,
            lab.key()
        ));
    }
    s
}

/// Host roles for a lab: host1, host2, ...: the first `control_planes` of them control
/// planes, then `nodes` nodes.
pub(crate) fn layout(control_planes: usize, nodes: usize) -> Vec<(&'static str, &'static str)> {
    const NAMES: [&str; 6] = ["host1", "host2", "host3", "host4", "host5", "host6"];
    let roles = std::iter::repeat_n("control-plane", control_planes)
        .chain(std::iter::repeat_n("node", nodes));
    NAMES.into_iter().zip(roles).collect()
}

#[test]
fn one_control_plane_from_kprov_inventory_lifecycle() {
    crate::needs_tier!(SshdHosts);
    let name = "one.metal.example.com";
    let lab = Lab::with_cluster(3, name, &layout(1, 2));

    // Preview before anything: nothing is written anywhere; changes are pending.
    let (store0, hosts0) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    let o = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let out = text(&o.stdout);
    for h in ["host1", "host2", "host3"] {
        assert!(out.contains(h), "{out}");
    }
    assert!(out.contains("init") && out.contains("join worker"), "{out}");
    assert!(out.contains("host key not recorded"), "{out}");
    assert_eq!(
        snapshot(&lab.store_dir()),
        store0,
        "preview wrote to the store"
    );
    assert_eq!(lab.hosts_snapshot(), hosts0, "preview changed a host");

    // Someone else holds the cluster's lock: refused with the conflict exit code, naming the
    // holder's command; no host touched, no key recorded.
    {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let guard = lab.hold_lock(&rt, name, "another operator's update");
        let o = lab.kprov(&metal_update_yes(name, &[]));
        assert_eq!(o.status.code(), Some(4), "{}", show(&o));
        says(&o, "another operator's update");
        assert_eq!(
            lab.hosts_snapshot(),
            hosts0,
            "a locked update changed a host"
        );
        assert!(!lab.store_dir().join(name).join("known_hosts").exists());
        rt.block_on(guard.release()).expect("release");
    }

    // First contact without permission: refused, naming the flag; nothing ran.
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    says(&o, "--accept-new-host-keys");
    assert!(lab.kubeadm_calls("host1").is_empty());

    let o = lab.kprov(&metal_update_yes(name, &[]));
    let table = ok(&o);
    let err = text(&o.stderr);
    assert!(err.contains("new host key recorded"), "{err}");
    rows_say(&table, &["host1", "host2", "host3"], " ok");

    // Order: init on the control plane before any join.
    let init = lab.first_call("host1", "kubeadm init --config");
    for w in ["host2", "host3"] {
        assert!(
            init < lab.first_call(w, "kubeadm join --config"),
            "{w} joined before init"
        );
    }
    // Join arguments: a token host1 created, the CA pinned, no certificate key on workers.
    let tokens = lab
        .upper("host1", "/var/lib/kprov-standins/tokens")
        .expect("tokens");
    for w in ["host2", "host3"] {
        let used = lab
            .upper(w, "/var/lib/kprov-standins/joined-with-token")
            .expect("joined");
        assert!(
            tokens.lines().any(|t| t == used.trim()),
            "{w}: {used} not in {tokens}"
        );
        let cfg = lab
            .upper(w, "/etc/kubernetes/kprov/kubeadm-join.yaml")
            .expect("join cfg");
        assert!(
            cfg.contains("caCertHashes") && cfg.contains("sha256:"),
            "{cfg}"
        );
        assert!(!cfg.contains("unsafeSkipCAVerification: true"), "{cfg}");
        assert!(!cfg.contains("certificateKey"), "{w}: {cfg}");
        assert!(lab.upper(w, "/etc/kubernetes/kubelet.conf").is_some());
        // Workers reach the API through their local proxy.
        assert!(
            lab.upper(w, "/etc/kubernetes/manifests/kprov-api-proxy.yaml")
                .is_some()
        );
    }
    // What landed: kubelet flags without a cloud provider, containerd with systemd cgroups,
    // the stand-in binaries verified and installed.
    for h in ["host1", "host2", "host3"] {
        let flags = lab
            .upper(h, "/var/lib/kubelet/kubeadm-flags.env")
            .expect("flags");
        assert!(!flags.contains("cloud-provider"), "{h}: {flags}");
        let containerd = lab
            .upper(h, "/etc/containerd/config.toml")
            .expect("containerd");
        assert!(containerd.contains("SystemdCgroup = true"), "{containerd}");
        let kubeadm = lab.upper(h, "/usr/local/bin/kubeadm").expect("kubeadm");
        assert!(kubeadm.contains(&format!("stand-in for kubeadm {VERSION}")));
    }
    assert!(lab.upper("host1", "/etc/kubernetes/admin.conf").is_some());
    assert!(lab.upper("host2", "/etc/kubernetes/admin.conf").is_none());
    let admin_key = lab.store_dir().join(name).join("secrets/admin.conf");
    assert!(admin_key.exists(), "admin kubeconfig not stored");

    // The preview of a provisioned cluster: read-only, nothing pending.
    let (store1, hosts1) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    let o = lab.kprov(&["update", "cluster", name, "--exit-code", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let planned: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json preview");
    // One document on every platform (docs/plan-json.md): the cloud plan's fields, empty here.
    for (field, want) in [
        ("schemaVersion", serde_json::json!(2)),
        ("cluster", serde_json::json!(name)),
        ("changes", serde_json::json!([])),
        ("errors", serde_json::json!([])),
        ("hostsToRemove", serde_json::json!([])),
        ("refusals", serde_json::json!([])),
    ] {
        assert_eq!(planned[field], want, "{field}: {planned}");
    }
    assert_eq!(
        planned["nodePlan"]["nodes"].as_array().map(Vec::len),
        Some(3)
    );
    assert!(
        planned["nodePlan"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["pending"] == false),
        "{planned}"
    );
    assert_eq!(
        snapshot(&lab.store_dir()),
        store1,
        "preview wrote to the store"
    );
    assert_eq!(lab.hosts_snapshot(), hosts1, "preview changed a host");

    // Re-run: no-op, says so, no kubeadm call; nothing downloaded again.
    let before: Vec<usize> = ["host1", "host2", "host3"]
        .iter()
        .map(|h| lab.kubeadm_calls(h).len())
        .collect();
    let downloads = lab.mirror.downloads().len();
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    ok(&o);
    says(&o, "No changes");
    let after: Vec<usize> = ["host1", "host2", "host3"]
        .iter()
        .map(|h| lab.kubeadm_calls(h).len())
        .collect();
    assert_eq!(before, after, "the re-run called kubeadm");
    assert_eq!(
        lab.mirror.downloads().len(),
        downloads,
        "the re-run downloaded"
    );

    // Without --skip-addons kube-system's node configuration, then the add-ons, go to the API
    // server through the stored kubeconfig; the stand-ins run none (their admin kubeconfig has
    // no usable key), so the first of those steps fails, saying the hosts are fine and how to
    // retry.
    let o = lab.kprov(&["update", "cluster", name, "--yes"]);
    let err = fails(&o, 1);
    assert!(err.contains("No changes"), "{err}");
    assert!(
        err.contains(
            "are provisioned, but its node configuration in kube-system could not be written"
        ) && err.contains(&format!("Re-run `kprov update cluster {name} --yes`"))
            && err.contains("--skip-addons"),
        "{err}"
    );

    // export kubeconfig: a context named after the cluster, the control plane reachable.
    let kc = lab.dir.path().join("kubeconfig");
    ok(&lab.kprov(&export_kubeconfig(name, &kc)));
    let kc = std::fs::read_to_string(&kc).unwrap();
    assert!(kc.contains(&format!("current-context: {name}")), "{kc}");
    assert!(
        kc.contains(&format!("https://{}:6443", lab.host("host1").address)),
        "{kc}"
    );

    // delete: the preview lists the hosts and resets nothing; --yes resets, then the state goes.
    let o = lab.kprov(&["delete", "cluster", name]);
    let out = ok(&o);
    assert!(
        out.contains("Will reset 3 hosts") && out.contains("host3"),
        "{out}"
    );
    assert!(
        lab.calls("host1")
            .iter()
            .all(|(_, c)| !c.starts_with("kubeadm reset"))
    );
    ok(&lab.kprov(&["delete", "cluster", name, "--yes"]));
    for h in ["host1", "host2", "host3"] {
        lab.first_call(h, "kubeadm reset");
        assert!(
            lab.host(h)
                .exec("test -e /etc/kubernetes/kubelet.conf")
                .is_err(),
            "{h} still has kubelet.conf"
        );
    }
    assert!(!lab.store_dir().join(name).exists(), "state not removed");
}

#[test]
fn three_control_planes_from_kubespray_hosts_yaml_and_a_changed_host_key() {
    crate::needs_tier!(SshdHosts);
    let lab = Lab::start(5);
    let name = "ha.metal.example.com";
    let mut inv = lab.kubespray_hosts(false);
    inv.push_str(
        "  children:\n    kube_control_plane:\n      hosts:\n        host1:\n        host2:\n        host3:\n\
         \x20   kube_node:\n      hosts:\n        host4:\n        host5:\n\
         \x20   etcd:\n      hosts:\n        host1:\n        host2:\n        host3:\n",
    );
    let inv = lab.write("hosts.yaml", &inv);
    lab.create_metal_spec(name, &inv);
    // A cloud provider's CCM: kubelets run with --cloud-provider=external.
    lab.edit_cluster(name, |c| {
        c.spec.cloud_controller_manager = Some(CloudControllerManager {
            provider: Some("hcloud".into()),
            ..Default::default()
        })
    });
    lab.use_mirror(name, None);

    let o = lab.kprov(&metal_update_yes(name, &["--concurrency", "3"]));
    ok(&o);

    let init = lab.first_call("host1", "kubeadm init --config");
    let join = |h: &str| lab.first_call(h, "kubeadm join --config");
    let last_kubeadm = |h: &str| lab.kubeadm_calls(h).last().map(|c| c.0).unwrap();
    // Control planes join one at a time after init; workers after the control planes.
    assert!(init < join("host2") && last_kubeadm("host2") < join("host3"));
    for w in ["host4", "host5"] {
        assert!(
            join("host3") < join(w),
            "{w} joined before the control planes"
        );
    }
    let uploaded = lab
        .upper("host1", "/var/lib/kprov-standins/uploaded-certificate-key")
        .expect("certificate key uploaded");
    for h in ["host2", "host3", "host4", "host5"] {
        let cfg = lab
            .upper(h, "/etc/kubernetes/kprov/kubeadm-join.yaml")
            .expect("join cfg");
        assert_eq!(
            cfg.contains(&format!("certificateKey: \"{}\"", uploaded.trim())),
            h == "host2" || h == "host3",
            "{h}: {cfg}"
        );
        assert!(cfg.contains("caCertHashes"), "{cfg}");
    }
    for h in ["host1", "host2", "host3", "host4", "host5"] {
        let flags = lab
            .upper(h, "/var/lib/kubelet/kubeadm-flags.env")
            .expect("flags");
        assert!(flags.contains("--cloud-provider=external"), "{h}: {flags}");
    }
    let init_cfg = lab
        .upper("host1", "/etc/kubernetes/kprov/kubeadm-init.yaml")
        .expect("init");
    let cluster_cfg = init_cfg
        .split("kind: ClusterConfiguration")
        .nth(1)
        .expect("cluster cfg");
    let cluster_cfg = cluster_cfg.split("---").next().unwrap_or_default();
    assert!(!cluster_cfg.contains("cloud-provider"), "{cluster_cfg}");
    // Every worker's proxy balances over all three control planes.
    let proxy = lab
        .upper("host4", "/etc/kubernetes/kprov/haproxy.cfg")
        .expect("proxy");
    for cp in ["host1", "host2", "host3"] {
        assert!(proxy.contains(&lab.host(cp).address), "{proxy}");
    }

    // Drift: someone edits containerd's config on host4. The preview finds it by hash
    // (read-only: no host changes), --yes puts kprov's file back.
    let wanted = lab
        .upper("host4", "/etc/containerd/config.toml")
        .expect("config");
    lab.host("host4")
        .exec("echo '# edited by hand' >> /etc/containerd/config.toml")
        .expect("edit");
    let hosts_before = lab.hosts_snapshot();
    let o = lab.kprov(&["update", "cluster", name, "--exit-code", "-o", "json"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_eq!(lab.hosts_snapshot(), hosts_before, "preview changed a host");
    let planned: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json preview");
    let rows = planned["nodePlan"]["nodes"].as_array().expect("rows");
    let pending: Vec<&str> = rows
        .iter()
        .filter(|r| r["pending"] == true)
        .map(|r| r["target"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(pending, ["host4"], "{planned}");
    let host4 = rows.iter().find(|r| r["target"] == "host4").expect("host4");
    assert_eq!(host4["action"], "settle", "{planned}");
    assert_eq!(
        host4["observed"]["drift"],
        serde_json::json!(["containerd: configure: /etc/containerd/config.toml"]),
        "{planned}"
    );
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    let table = ok(&o);
    let row = |h: &str| {
        table
            .lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row("host4").contains("ok") && !row("host4").contains("no changes"),
        "{table}"
    );
    assert!(row("host1").contains("ok, no changes"), "{table}");
    assert_eq!(
        lab.upper("host4", "/etc/containerd/config.toml"),
        Some(wanted)
    );

    // host5 is reinstalled (new host key): refused, naming the host and both fingerprints;
    // the other hosts still converge.
    let old = lab.host("host5").fingerprint();
    lab.host("host5").new_host_key();
    let new = lab.host("host5").fingerprint();
    assert_ne!(old, new);
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    let err = fails(&o, 1);
    assert!(
        err.contains("host5") && err.contains("HOST KEY CHANGED"),
        "{err}"
    );
    assert!(err.contains(&old) && err.contains(&new), "{err}");
    let table = text(&o.stdout);
    rows_say(
        &table,
        &["host1", "host2", "host3", "host4"],
        "ok, no changes",
    );
    rows_say(&table, &["host5"], "FAILED");
}

#[test]
fn checksum_mismatch_refused_then_unreachable_host_reported_then_joins_from_old_kubespray_ini() {
    crate::needs_tier!(SshdHosts);
    let lab = Lab::start(3);
    let name = "ini.metal.example.com";
    let inv = format!(
        "[all]\nnode1 ansible_host={} ip={}\nnode2 ansible_host={} ip={}\nnode3 ansible_host={}\n\n\
         [kube-master]\nnode1\n\n[etcd]\nnode1\n\n[kube-node]\nnode2\nnode3\n\n\
         [all:vars]\nansible_user=root\nansible_ssh_private_key_file={}\n",
        lab.host("host1").address,
        lab.host("host1").address,
        lab.host("host2").address,
        lab.host("host2").address,
        lab.th.unreachable_address,
        lab.key()
    );
    let inv = lab.write("inventory.ini", &inv);
    lab.create_metal_spec(name, &inv);

    // A pinned checksum that does not match what the mirror serves: nothing installed.
    lab.use_mirror(name, Some("kubelet"));
    let o = lab.kprov(&metal_update_yes(name, &[]));
    let err = fails(&o, 1);
    assert!(
        err.contains("checksum mismatch") && err.contains(&"0".repeat(64)),
        "{err}"
    );
    for h in ["host1", "host2"] {
        assert!(
            lab.upper(h, "/usr/local/bin/kubelet").is_none(),
            "{h}: kubelet installed"
        );
        assert!(lab.kubeadm_calls(h).is_empty(), "{h}: kubeadm ran");
    }

    // Fixed: the run resumes; the unreachable node3 is reported while the others finish.
    lab.use_mirror(name, None);
    let o = lab.kprov(&metal_update_yes(name, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let table = text(&o.stdout);
    rows_say(&table, &["node1", "node2"], " ok");
    rows_say(&table, &["node3"], "FAILED");
    let err = text(&o.stderr);
    assert!(
        err.contains("node3") && err.contains("cannot connect"),
        "{err}"
    );
    assert!(lab.upper("host2", "/etc/kubernetes/kubelet.conf").is_some());
    lab.first_call("host2", "kubeadm join --config");

    // The inventory is corrected (node3 is the third machine): the next run joins it and
    // changes nothing on the members but a fresh join token on the control plane.
    let before_node2 = lab.kubeadm_calls("host2").len();
    let before_node1 = lab.kubeadm_calls("host1").len();
    let address = lab.host("host3").address.clone();
    lab.edit_host(name, "node3", |node3| {
        node3.address = address.clone();
        node3.ip = Some(address.clone());
    });
    let o = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let preview = text(&o.stdout);
    let row = |t: &str, h: &str| {
        t.lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row(&preview, "node1").contains("initialised control plane"),
        "{preview}"
    );
    assert!(row(&preview, "node2").contains("member"), "{preview}");
    assert!(row(&preview, "node3").contains("join worker"), "{preview}");
    // On a terminal: spinners per host while it runs, then the same table.
    let o = lab.kprov_tty(&metal_update_yes(name, &[]));
    let table = ok(&o);
    assert!(table.contains("node3: new host key recorded"), "{table}");
    // Drawn as spinners (lines cleared and redrawn), not as plain progress lines.
    assert!(table.contains("\u{1b}[2K"), "{table}");
    assert!(!table.contains("node3: preflight (2 steps)"), "{table}");
    assert!(row(&table, "node2").contains("ok, no changes"), "{table}");
    assert!(row(&table, "node3").contains(" ok"), "{table}");
    assert_eq!(lab.kubeadm_calls("host2").len(), before_node2);
    let new_on_node1: Vec<String> = lab.kubeadm_calls("host1")[before_node1..]
        .iter()
        .map(|(_, c)| c.clone())
        .collect();
    assert!(
        new_on_node1
            .iter()
            .all(|c| c.starts_with("kubeadm token create")),
        "{new_on_node1:?}"
    );
    let used = lab
        .upper("host3", "/var/lib/kprov-standins/joined-with-token")
        .expect("joined");
    let tokens = lab
        .upper("host1", "/var/lib/kprov-standins/tokens")
        .expect("tokens");
    assert!(
        tokens.lines().any(|t| t == used.trim()),
        "{used} not in {tokens}"
    );
}

/// A cluster kprov never provisioned: delete contacts no host (loopback listeners stand in
/// for the hosts and see no connection) and removes the state.
#[test]
fn delete_of_a_never_provisioned_metal_cluster_contacts_no_host() {
    let dir = tempfile::tempdir().unwrap();
    let listeners: Vec<std::net::TcpListener> = ["127.0.0.2", "127.0.0.3"]
        .iter()
        .map(|ip| {
            let l = std::net::TcpListener::bind((*ip, 0)).expect("listener");
            l.set_nonblocking(true).unwrap();
            l
        })
        .collect();
    let mut inv = String::from("hosts:\n");
    for (i, (l, role)) in listeners.iter().zip(["control-plane", "node"]).enumerate() {
        let a = l.local_addr().unwrap();
        inv.push_str(&format!(
            "  - name: h{i}\n    address: {}\n    port: {}\n    roles: [{role}]\n",
            a.ip(),
            a.port()
        ));
    }
    let inv_path = dir.path().join("hosts.yaml");
    std::fs::write(&inv_path, inv).unwrap();
    let store = dir.path().join("state");
    let kprov = |args: &[&str]| {
        Command::cargo_bin("kprov")
            .expect("binary")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("KPROV_STATE_STORE", format!("file://{}", store.display()))
            .args(args)
            .output()
            .expect("runs kprov")
    };
    let name = "never.metal.example.com";
    ok(&kprov(&create_metal(name, inv_path.to_str().unwrap())));
    let preview = ok(&kprov(&["delete", "cluster", name]));
    assert!(
        preview.contains("Will reset 2 hosts") && preview.contains("127.0.0.3"),
        "{preview}"
    );
    let o = kprov(&["delete", "cluster", name, "--yes"]);
    ok(&o);
    says(&o, "no host to reset");
    for l in &listeners {
        assert!(
            matches!(l.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "kprov connected to a host it never provisioned"
        );
    }
    assert!(!store.join(name).exists());
}

/// Two hosts provisioned by cluster `first`, and cluster `second` created from the same
/// inventory (not provisioned).
fn provisioned_and_listed_again(first: &str, second: &str) -> Lab {
    let lab = Lab::start(2);
    let inv = lab.inventory(&layout(1, 1));
    for name in [first, second] {
        lab.create_metal(name, &inv);
    }
    lab.provision(first);
    lab
}

/// Issue 9 §2: a host belongs to one cluster. A second cluster whose inventory lists the first
/// one's hosts is refused on update (naming the owner), gets no credentials, its delete resets
/// nothing, and the first cluster still converges.
#[test]
fn a_second_cluster_listing_the_first_clusters_hosts_is_refused_and_resets_nothing() {
    crate::needs_tier!(SshdHosts);
    let (first, second) = ("first.metal.example.com", "second.metal.example.com");
    let lab = provisioned_and_listed_again(first, second);
    for h in ["host1", "host2"] {
        let marker = lab
            .upper(h, "/var/lib/kprov/owner")
            .expect("ownership marker");
        assert!(marker.contains(&format!("cluster={first}\n")), "{marker}");
        assert!(marker.starts_with("uid="), "{marker}");
    }
    let hosts_after_first = lab.hosts_snapshot();
    let kubeadm_before: Vec<usize> = ["host1", "host2"]
        .iter()
        .map(|h| lab.kubeadm_calls(h).len())
        .collect();

    // The second cluster's update: refused on both hosts, naming the owner; nothing changed.
    let o = lab.kprov(&metal_update_yes(second, &[]));
    let err = fails(&o, 1);
    for h in ["host1", "host2"] {
        assert!(
            err.contains(&format!(
                "{h}: refused: the host belongs to cluster {first}"
            )),
            "{}",
            show(&o)
        );
    }
    assert_eq!(
        lab.hosts_snapshot(),
        hosts_after_first,
        "a refused update changed a host"
    );
    assert!(
        !lab.store_dir()
            .join(second)
            .join("secrets/admin.conf")
            .exists(),
        "the second cluster received the first one's admin kubeconfig"
    );

    // Its preview (keys now recorded) lists the hosts as owned by the first and fails.
    let o = lab.kprov(&["update", "cluster", second]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    prints(&o, &format!("owned by cluster {first}"));

    // Its delete resets nothing.
    let o = lab.kprov(&["delete", "cluster", second, "--yes"]);
    ok(&o);
    says(
        &o,
        &format!("not reset: the host belongs to cluster {first}"),
    );
    assert_eq!(
        lab.hosts_snapshot(),
        hosts_after_first,
        "the second delete changed a host"
    );
    let kubeadm_after: Vec<usize> = ["host1", "host2"]
        .iter()
        .map(|h| lab.kubeadm_calls(h).len())
        .collect();
    assert_eq!(
        kubeadm_before, kubeadm_after,
        "kubeadm ran for the second cluster"
    );

    // The first cluster is intact and converges with no change.
    let o = lab.kprov(&["update", "cluster", first, "--yes", "--skip-addons"]);
    ok(&o);
    says(&o, "No changes");
    assert!(
        lab.store_dir()
            .join(first)
            .join("secrets/admin.conf")
            .exists()
    );
}

/// Issue 20, Kubespray's scale.yml habit and "nothing forgotten": `update cluster
/// --inventory` reads the hosts again (the preview shows those to add and to remove and
/// stores nothing; `--yes` stores them and provisions the new one), a host key is forgotten
/// by command (and recorded again on the next first contact), and `delete cluster --yes`
/// resets every host kprov provisioned, also the one the inventory dropped.
#[test]
fn inventory_reread_adds_and_removes_hosts_and_delete_resets_the_dropped_one() {
    crate::needs_tier!(SshdHosts);
    let lab = Lab::start(3);
    let name = "scale.metal.example.com";
    let inv1 = lab.inventory(&layout(1, 1));
    lab.create_metal(name, &inv1);
    lab.provision(name);
    let inv2 = lab.write(
        "inventory2.yaml",
        &kprov_inventory(&lab, &[("host1", "control-plane"), ("host3", "node")]),
    );
    let config = lab.store_dir().join(name).join("config");
    let before = std::fs::read(&config).unwrap();

    // `update cluster --inventory inventory2.yaml` and `extra`.
    let reread = |extra: &[&str]| {
        let base = ["update", "cluster", name, "--inventory", &inv2];
        lab.kprov(&[&base[..], extra].concat())
    };

    // The preview: hosts to add and to remove, nothing stored, exit 2 with --exit-code.
    let o = reread(&["--exit-code"]);
    let err = fails(&o, 2);
    assert!(err.contains("hosts to add: host3 ("), "{}", show(&o));
    assert!(err.contains("hosts to remove: host2 ("), "{}", show(&o));
    assert_eq!(
        std::fs::read(&config).unwrap(),
        before,
        "a preview changed the spec"
    );
    assert!(lab.upper("host3", "/var/lib/kprov/owner").is_none());

    // --yes: stored, host3 provisioned; host2 (provisioned) is reported to remove.
    let o = reread(&["--yes", "--accept-new-host-keys", "--skip-addons"]);
    ok(&o);
    let spec = text(&std::fs::read(&config).unwrap());
    assert!(
        spec.contains("name: host3") && !spec.contains("name: host2"),
        "{spec}"
    );
    assert!(
        text(&o.stderr).contains("host2") && text(&o.stderr).contains("kprov delete instance"),
        "{}",
        show(&o)
    );
    let marker = lab
        .upper("host3", "/var/lib/kprov/owner")
        .expect("host3 claimed");
    assert!(marker.contains(&format!("cluster={name}\n")), "{marker}");

    // Forget host3's key by command: gone from the store, recorded again on first contact.
    let known = lab.store_dir().join(name).join("known_hosts");
    let addr3 = lab.host("host3").address.clone();
    let o = lab.kprov(&["forget", "host-key", name, "host3"]);
    ok(&o);
    assert!(
        text(&std::fs::read(&known).unwrap()).contains(&addr3),
        "preview forgot the key"
    );
    ok(&lab.kprov(&["forget", "host-key", name, "host3", "--yes"]));
    let keys = text(&std::fs::read(&known).unwrap());
    assert!(
        !keys.lines().any(|l| l.starts_with(&format!("{addr3} "))),
        "{keys}"
    );
    assert!(keys.contains(&lab.host("host1").address), "{keys}");
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    ok(&lab.kprov(&metal_update_yes(name, &[])));
    assert!(text(&std::fs::read(&known).unwrap()).contains(&addr3));

    // delete cluster: the preview names the dropped host; --yes resets all three.
    let preview = ok(&lab.kprov(&["delete", "cluster", name]));
    assert!(
        preview.contains("Will reset 3 hosts")
            && preview
                .lines()
                .any(|l| l.contains("host2") && l.contains("no longer in the spec")),
        "{preview}"
    );
    let o = lab.kprov(&["delete", "cluster", name, "--yes"]);
    ok(&o);
    assert!(!text(&o.stderr).contains("never connected"), "{}", show(&o));
    for h in ["host1", "host2", "host3"] {
        assert!(
            lab.upper(h, "/var/lib/kprov/owner").is_none(),
            "{h} still carries the marker of a deleted cluster"
        );
        assert!(
            lab.kubeadm_calls(h)
                .iter()
                .any(|(_, c)| c.starts_with("kubeadm reset")),
            "{h} was not reset"
        );
    }
}

/// Issue 20: a host held by a cluster that no longer exists is released by command, checked
/// against the store: refused while its cluster lives (naming `delete instance`), released
/// (reset) once the store no longer has it, and then the new cluster provisions it.
#[test]
fn a_host_of_a_gone_cluster_is_released_and_a_live_clusters_host_is_not() {
    crate::needs_tier!(SshdHosts);
    let (first, second) = ("gone.metal.example.com", "next.metal.example.com");
    let lab = provisioned_and_listed_again(first, second);
    let o = lab.kprov(&metal_update_yes(second, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));

    // The first cluster lives: refused, nothing changed.
    let snapshot = lab.hosts_snapshot();
    let o = lab.kprov(&["release", "host", second, "host1", "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("which still exists")
            && text(&o.stderr).contains(&format!("kprov delete instance {first} host1")),
        "{}",
        show(&o)
    );
    assert_eq!(
        lab.hosts_snapshot(),
        snapshot,
        "a refused release changed a host"
    );

    // The first cluster's state is lost: its hosts are orphans.
    std::fs::remove_dir_all(lab.store_dir().join(first)).unwrap();
    let o = lab.kprov(&["release", "host", second, "host1"]);
    ok(&o);
    assert!(
        text(&o.stderr).contains(&format!("held by cluster {first}"))
            && text(&o.stderr).contains("no longer has"),
        "{}",
        show(&o)
    );
    assert_eq!(
        lab.hosts_snapshot(),
        snapshot,
        "the release preview changed a host"
    );
    for h in ["host1", "host2"] {
        ok(&lab.kprov(&["release", "host", second, h, "--yes"]));
        assert!(
            lab.upper(h, "/var/lib/kprov/owner").is_none(),
            "{h} kept its marker"
        );
    }
    lab.provision(second);
    let marker = lab.upper("host1", "/var/lib/kprov/owner").expect("claimed");
    assert!(marker.contains(&format!("cluster={second}\n")), "{marker}");
}

/// `get instances` lists a host that does not answer (powered off: nobody listens on its
/// address, in the lab's namespace) as unreachable with the error, escaped, instead of dropping
/// it; a rolling update refuses while it is unreachable, naming it.
#[test]
fn get_instances_lists_an_unreachable_host_as_unreachable_with_its_error() {
    crate::needs_tier!(SshdHosts);
    let name = "unreachable.metal.example.com";
    let lab = Lab::with_control_plane_and_worker(name);
    lab.provision(name);
    lab.host("host2").power_off();

    let o = lab.kprov(&["get", "instances", name]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.starts_with("host2"))
        .unwrap_or_else(|| panic!("host2 dropped:\n{}", show(&o)));
    assert!(
        row.contains("unreachable: ") && row.contains("host2: cannot connect"),
        "{}",
        show(&o)
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("host1") && l.contains("up to date")),
        "{}",
        show(&o)
    );
    says(&o, "host2 (host2): unreachable, its state cannot be read");

    let o = lab.kprov(&["get", "instances", name, "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let host2 = rows
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["target"] == "host2")
        .unwrap_or_else(|| panic!("host2 dropped: {rows:#}"));
    assert_eq!(host2["status"], "unreachable", "{rows:#}");
    let why = host2["reasons"][0].as_str().expect("the error");
    assert!(
        why.contains("host2: cannot connect") && !why.contains('\n') && !why.contains('\x1b'),
        "{rows:#}"
    );

    let o = lab.kprov(&["rolling-update", "cluster", name, "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    says(&o, "host2: cannot read its provisioning record");
}
