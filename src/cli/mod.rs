//! The command line: kops-like commands over the spec, the state store and (later) the cloud.

mod addons;
mod bundle;
mod certificates;
mod commands;
mod create;
mod ctx;
mod edit;
mod etcd;
mod instance;
mod metal;
mod rolling;
mod toolbox;
mod update;

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

pub(crate) use create::CreateClusterArgs;

use crate::output::Format;

/// Exit codes (documented in the README).
pub mod exit {
    /// Success: the command did what it was asked, or a preview found nothing to do.
    pub(crate) const OK: i32 = 0;
    /// Any runtime failure: cloud, SSH, state store, I/O.
    pub const ERROR: i32 = 1;
    /// `update cluster --exit-code`: changes are pending.
    pub(crate) const CHANGES_PENDING: i32 = 2;
    /// The spec (file or flags) is invalid; nothing was written.
    pub(crate) const INVALID_SPEC: i32 = 3;
    /// Someone else changed the cluster or holds its lock; re-read and retry.
    pub(crate) const CONFLICT: i32 = 4;
    /// The command line itself is wrong.
    pub const USAGE: i32 = 64;
    /// Interrupted (Ctrl-C, 128 + SIGINT as shells report it): `rolling-update cluster --yes`
    /// stopped at a safe point and journaled it; the next run resumes.
    pub(crate) const INTERRUPTED: i32 = 130;

    /// A preview's exit code: refused 1; changes pending 2 under `--exit-code`, else 0.
    pub(crate) fn of_preview(shown: crate::views::Shown, exit_code: bool) -> i32 {
        use crate::views::Shown;
        match shown {
            Shown::Refused => ERROR,
            Shown::Pending if exit_code => CHANGES_PENDING,
            Shown::Pending | Shown::UpToDate => OK,
        }
    }
}

/// The parsed command line; [`parse`] makes it, [`run`] carries it out.
#[derive(Debug, Parser)]
#[command(
    name = "kprov",
    version,
    about = "Declarative Kubernetes clusters: kops's workflow, Kubespray's reach",
    propagate_version = true
)]
pub struct Cli {
    /// State store: file://DIR or s3://BUCKET/PREFIX [default: file://$HOME/.kprov/state]
    #[arg(long, global = true, env = "KPROV_STATE_STORE", value_name = "URL")]
    pub(crate) state: Option<String>,
    /// More output (-v: debug, -vv: trace)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create a cluster spec from flags, or objects from a file (writes the spec only)
    Create(CreateCmd),
    /// Replace stored objects with the ones in a file
    Replace(FileArgs),
    /// List clusters or instance groups
    #[command(subcommand)]
    Get(GetWhat),
    /// Edit a stored spec in $EDITOR; an invalid result is never saved
    #[command(subcommand)]
    Edit(EditWhat),
    /// Delete a cluster or an instance group
    #[command(subcommand)]
    Delete(DeleteWhat),
    /// Inspect or break a cluster's lock
    #[command(subcommand)]
    Lock(LockWhat),
    /// Forget what kprov recorded about a host (`forget host-key CLUSTER HOST`)
    #[command(subcommand)]
    Forget(ForgetWhat),
    /// Free a host held by a cluster that no longer exists (`release host CLUSTER HOST`)
    #[command(subcommand)]
    Release(ReleaseWhat),
    /// Export credentials (kubeconfig) of a provisioned cluster
    #[command(subcommand)]
    Export(ExportWhat),
    /// Preview, and with --yes apply, what a cluster needs (cloud resources, nodes, add-ons)
    #[command(subcommand)]
    Update(UpdateWhat),
    /// Replace or re-provision nodes whose configuration is out of date, safely, in batches
    #[command(subcommand)]
    RollingUpdate(RollingUpdateWhat),
    /// Check that a running cluster is healthy
    #[command(subcommand)]
    Validate(ValidateWhat),
    /// Renew credentials of a running cluster (kubeadm certificates)
    #[command(subcommand)]
    Rotate(RotateWhat),
    /// Back up a cluster's data (etcd snapshots into the state store)
    #[command(subcommand)]
    Backup(BackupWhat),
    /// Restore a cluster's data from a backup (preview without --yes)
    #[command(subcommand)]
    Restore(RestoreWhat),
    /// Print the JSON Schema of the kprov objects (for editors)
    Schema(SchemaArgs),
    /// Print a shell completion script
    Completion(CompletionArgs),
    /// Print kprov's version (kops's `kops version`)
    Version(OutputArgs),
    /// kops's toolbox: `toolbox dump NAME` prints the cluster's cloud resources, machines and
    /// nodes as one document (never a secret)
    #[command(subcommand)]
    Toolbox(ToolboxWhat),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ToolboxWhat {
    /// The cluster's cloud resources (AWS: every one it owns, with its ID), its machines
    /// (hosts or running instances) and the nodes the API server lists, as YAML or JSON. No
    /// key, certificate or credential is ever in it; a part that cannot be read is named with
    /// its cause instead
    Dump {
        name: String,
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
        /// Kubeconfig to reach the API with (default: the credentials kprov stored)
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// Leave the API server alone (no `nodes` in the dump)
        #[arg(long)]
        no_api: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct FileArgs {
    /// File with Cluster and InstanceGroup documents ('-' for standard input)
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub(crate) file: PathBuf,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct CreateCmd {
    #[command(subcommand)]
    pub(crate) what: Option<CreateWhat>,
    /// Create the objects in FILE ('-' for standard input)
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub(crate) file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CreateWhat {
    /// Create a cluster spec (like `kops create cluster`): no infrastructure is changed
    Cluster(Box<CreateClusterArgs>),
    /// Fetch every binary and image the cluster's nodes need into one tar file, verified
    /// (air-gapped sites: `spec.assets.bundle` or `update cluster --bundle FILE` uses it)
    Bundle(CreateBundleArgs),
    /// Store the SSH public key the cluster's AWS instances get (their key pair and
    /// authorized keys) in its spec in the state store (kops's `create sshpublickey`); shown
    /// by its SHA256 fingerprint. Running instances get it when `rolling-update` replaces them
    Sshpublickey {
        /// The cluster
        name: String,
        /// The public key file (`~/.ssh/id_ed25519.pub`)
        #[arg(short = 'i', long = "ssh-public-key", value_name = "FILE")]
        file: PathBuf,
    },
    /// kops's older form: `create secret sshpublickey admin -i FILE --name CLUSTER`
    Secret {
        #[command(subcommand)]
        what: CreateSecretWhat,
    },
    /// Store a registry mirror's user name and password in the cluster's secrets (the
    /// password read from standard input, never from the command line); containerd then
    /// sends them to the mirror whose endpoint has this host. Shown only as a digest.
    RegistryCredentials {
        /// The cluster
        name: String,
        /// The mirror's host[:port], as in its endpoint in spec.containerd.registries
        #[arg(long)]
        host: String,
        #[arg(long)]
        username: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum CreateSecretWhat {
    /// The SSH public key of the cluster's instances (as `create sshpublickey`)
    Sshpublickey {
        /// kops's secret name; kprov keeps one key per cluster
        #[arg(default_value = "admin")]
        secret: String,
        /// The cluster
        #[arg(long)]
        name: String,
        #[arg(
            short = 'i',
            long = "pubkey",
            visible_alias = "ssh-public-key",
            value_name = "FILE"
        )]
        file: PathBuf,
    },
}

#[derive(Debug, Args)]
pub(crate) struct CreateBundleArgs {
    pub(crate) name: String,
    /// The bundle file to write (replaced only once complete)
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: PathBuf,
    /// The nodes' architecture (a bundle holds one)
    #[arg(long, default_value = "amd64", value_parser = ["amd64", "arm64"])]
    pub(crate) arch: String,
    /// Pull images of UPSTREAM from another registry: `registry.k8s.io=http://10.0.0.5:5000`
    /// (`http://` for a plain-HTTP registry); repeatable. Images keep their upstream names.
    #[arg(long, value_name = "UPSTREAM=HOST")]
    pub(crate) registry_mirror: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct OutputArgs {
    /// Output format
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub(crate) output: Format,
}

#[derive(Debug, Subcommand)]
pub(crate) enum GetWhat {
    /// List clusters, or show one
    #[command(visible_alias = "cluster")]
    Clusters {
        name: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
        /// Show the completed spec (defaults filled in) instead of what was written
        #[arg(long)]
        full: bool,
    },
    /// List every binary (URL, sha256) and image (reference, digest when pinned) the
    /// cluster's nodes need: what `create bundle` fetches
    #[command(visible_alias = "asset")]
    Assets {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Print the add-on manifests kprov applies to a cluster (CCM, CNI)
    #[command(visible_alias = "addon")]
    Addons {
        name: String,
        /// Output format (yaml: the manifests as applied; json: with add-on names and versions)
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// Show every control plane's kubeadm certificates with their expiry (read over SSH)
    #[command(visible_aliases = ["certificate", "certs", "cert"])]
    Certificates {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// List a cluster's etcd backups (`kprov backup etcd NAME` takes them)
    #[command(visible_alias = "backup")]
    Backups {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// List a cluster's secrets and certificates in the state store: names and sha256
    /// digests, never their values
    #[command(visible_alias = "secret")]
    Secrets {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// List every instance or host of a cluster: group, node, up to date or why not, Ready
    #[command(visible_alias = "instance")]
    Instances {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
    },
    /// List a cluster's instance groups
    #[command(visible_aliases = ["instancegroup", "ig", "igs"])]
    Instancegroups {
        /// The cluster (kops's --name is accepted too)
        #[arg(required_unless_present = "name")]
        cluster: Option<String>,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum EditWhat {
    /// Edit the Cluster object
    Cluster { name: String },
    /// Edit an InstanceGroup (`kprov edit ig --name CLUSTER GROUP`)
    #[command(visible_aliases = ["instancegroup", "ig"])]
    Instancegroups {
        group: String,
        /// The cluster
        #[arg(long)]
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum DeleteWhat {
    /// Delete a cluster (preview without --yes)
    Cluster {
        name: String,
        /// Really delete
        #[arg(long, short)]
        yes: bool,
        /// Hosts reset at once (nodes reached over SSH)
        #[arg(long, default_value_t = 20)]
        concurrency: usize,
        /// Also delete the cluster's etcd backups (kept otherwise: `kprov get backups NAME`
        /// lists them and a cluster created again under NAME can restore them)
        #[arg(long)]
        delete_backups: bool,
    },
    /// Delete an instance group from the spec (preview without --yes)
    #[command(visible_aliases = ["instancegroup", "ig"])]
    Instancegroups {
        group: String,
        #[arg(long)]
        name: String,
        #[arg(long, short)]
        yes: bool,
    },
    /// List a cluster's stored records that fail the checks on read (backups, the
    /// rolling-update journal, records of provisioned hosts, known host keys); with --yes
    /// remove them
    Damaged {
        name: String,
        /// Really remove them
        #[arg(long, short)]
        yes: bool,
    },
    /// Remove one node: cordon, drain, remove its etcd member, reset the host, delete the
    /// Node object (kops's `delete instance`, Kubespray's remove-node.yml; preview without --yes)
    Instance(DeleteInstanceArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DeleteInstanceArgs {
    /// The cluster
    pub(crate) cluster: String,
    /// The node (on metal: the host's name in the inventory)
    pub(crate) node: String,
    /// Really remove it
    #[arg(long, short)]
    pub(crate) yes: bool,
    /// Give up draining after this long (the node then stays cordoned and nothing else changes)
    #[arg(long, value_parser = addons::parse_duration, default_value = "15m")]
    pub(crate) drain_timeout: std::time::Duration,
    /// Evict pods with emptyDir volumes (their data is lost)
    #[arg(long)]
    pub(crate) delete_emptydir_data: bool,
    /// Evict pods that no controller manages (nothing re-creates them)
    #[arg(long)]
    pub(crate) force: bool,
    /// AWS: shrink the Auto Scaling group instead of letting it replace the instance
    #[arg(long)]
    pub(crate) decrement_desired_capacity: bool,
    /// AWS: terminate the instance without asking the cluster's API (kops's `--cloudonly`,
    /// for an instance or a cluster that does not answer): no drain, the Node object is left
    /// to the cloud-controller-manager
    #[arg(long = "cloudonly", visible_alias = "cloud-only")]
    pub(crate) cloud_only: bool,
    /// Kubeconfig to reach the API with (default: the credentials kprov stored)
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Output format of the preview
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub(crate) output: Format,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ForgetWhat {
    /// Remove a host's recorded SSH host key from the cluster's known hosts (a reinstalled
    /// host, a replaced key): the next `update cluster --yes --accept-new-host-keys` records
    /// its new key. Without --yes, only shows the key it would forget
    HostKey {
        cluster: String,
        /// The host's name in the spec (or in kprov's record of provisioned hosts)
        host: String,
        #[arg(long, short)]
        yes: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ReleaseWhat {
    /// Reset HOST (of CLUSTER's spec) when the ownership marker on it names a cluster the
    /// state store no longer has; a live cluster's host is refused. Without --yes, only says
    /// whose marker it carries and whether it may be released
    Host {
        /// The cluster that wants the host (HOST is in its spec)
        cluster: String,
        host: String,
        #[arg(long, short)]
        yes: bool,
        /// Record the host's SSH key if CLUSTER has none for it yet
        #[arg(long)]
        accept_new_host_keys: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum LockWhat {
    /// Show who holds a cluster's lock
    Status { cluster: String },
    /// Remove a cluster's lock, whoever holds it (only when its holder is dead)
    Break { cluster: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ExportWhat {
    /// Merge the cluster's admin credentials into your kubeconfig (context named after the
    /// cluster; KUBECONFIG honoured like kubectl does)
    Kubeconfig {
        name: String,
        /// Write this file instead of $KUBECONFIG / ~/.kube/config
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum UpdateWhat {
    /// Preview what the cluster needs; --yes applies it (cloud resources, nodes, add-ons)
    Cluster(UpdateClusterArgs),
    /// Preview the add-ons against the live cluster (server-side apply dry run); --yes applies
    #[command(visible_alias = "addon")]
    Addons(UpdateAddonsCli),
}

#[derive(Debug, Args, Clone)]
pub(crate) struct UpdateClusterArgs {
    pub(crate) name: String,
    /// Apply the changes (without it nothing is changed)
    #[arg(long, short)]
    pub(crate) yes: bool,
    /// Also delete resources the cluster owns that the spec no longer wants
    #[arg(long)]
    pub(crate) prune: bool,
    /// Exit 2 when changes are pending, 0 when there are none
    #[arg(long)]
    pub(crate) exit_code: bool,
    /// Output format of the preview
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub(crate) output: Format,
    /// Record the host keys of hosts contacted for the first time (strict checking otherwise)
    #[arg(long)]
    pub(crate) accept_new_host_keys: bool,
    /// Hosts provisioned at once
    #[arg(long, default_value_t = 20)]
    pub(crate) concurrency: usize,
    /// Kubeconfig for the add-on step (default: the credentials kprov stored)
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Provision cloud resources and nodes but leave add-ons alone
    #[arg(long)]
    pub(crate) skip_addons: bool,
    /// AWS: connect to instances at their private addresses (VPN, peered network), like
    /// `spec.topology.sshAddress: Private`
    #[arg(long)]
    pub(crate) ssh_private_address: bool,
    /// Metal: read the hosts again from this inventory (kprov YAML or Kubespray, as for
    /// `create cluster`), Kubespray's scale.yml habit: the preview shows the hosts to add and to
    /// remove; `--yes` stores them in the spec, then provisions the new ones
    #[arg(long, value_name = "DIR_OR_FILE")]
    pub(crate) inventory: Option<PathBuf>,
    /// Upload every binary and image from this bundle (`kprov create bundle`) instead of
    /// letting the hosts download them, as `spec.assets.bundle` does (air-gapped sites)
    #[arg(long, value_name = "FILE")]
    pub(crate) bundle: Option<PathBuf>,
    /// AWS: how long the instances (and the bastion) get to answer SSH after the cloud apply
    #[arg(long, value_parser = addons::parse_duration, default_value = "5m")]
    pub(crate) ssh_wait: std::time::Duration,
    /// Only one part of the apply (kops's lifecycle phases): `cloud` applies the AWS
    /// resources without waiting for the instances, `nodes` provisions the hosts or instances
    /// (the cloud resources must already match), `addons` writes kube-system's node
    /// configuration and the add-ons
    #[arg(long, value_enum, value_name = "PHASE")]
    pub(crate) phase: Option<UpdatePhase>,
    /// AWS: move image name patterns (`spec.image`, kprov's default) to the newest image that
    /// matches; otherwise each stays on the image it was pinned to when first applied, and the
    /// preview only mentions a newer one
    #[arg(long)]
    pub(crate) refresh_image: bool,
}

/// `update cluster --phase`: see [`crate::ops::aws::Phase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum UpdatePhase {
    Cloud,
    Nodes,
    Addons,
}

impl UpdatePhase {
    pub(crate) fn ops(self) -> crate::ops::aws::Phase {
        match self {
            UpdatePhase::Cloud => crate::ops::aws::Phase::Cloud,
            UpdatePhase::Nodes => crate::ops::aws::Phase::Nodes,
            UpdatePhase::Addons => crate::ops::aws::Phase::Addons,
        }
    }

    /// The flag as typed, for the commands kprov prints.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            UpdatePhase::Cloud => " --phase cloud",
            UpdatePhase::Nodes => " --phase nodes",
            UpdatePhase::Addons => " --phase addons",
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct UpdateAddonsCli {
    pub(crate) name: String,
    #[arg(long, short)]
    pub(crate) yes: bool,
    /// Kubeconfig to use (default: the credentials kprov stored)
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Take over fields another field manager changed
    #[arg(long)]
    pub(crate) force_conflicts: bool,
    /// How long to wait for the CCM rollout and node initialisation
    #[arg(long, value_parser = addons::parse_duration, default_value = "5m")]
    pub(crate) wait: std::time::Duration,
    /// Exit 2 when changes are pending
    #[arg(long)]
    pub(crate) exit_code: bool,
    /// Reach the API through an SSH tunnel to a control-plane host (automatic when the
    /// control planes sit behind a bastion)
    #[arg(long)]
    pub(crate) ssh_tunnel: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RollingUpdateWhat {
    /// Preview (and with --yes, roll) the nodes that need an update
    Cluster(rolling::RollingUpdateClusterArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ValidateWhat {
    /// Nodes registered and Ready, none left uninitialized, CCM / CNI / CoreDNS running
    Cluster {
        name: String,
        /// Keep checking until the cluster passes or this much time has passed (e.g. 10m)
        #[arg(long, value_parser = addons::parse_duration)]
        wait: Option<std::time::Duration>,
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// Reach the API through an SSH tunnel to a control-plane host (automatic when the
        /// control planes sit behind a bastion)
        #[arg(long)]
        ssh_tunnel: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum RotateWhat {
    /// Renew the kubeadm certificates one control plane at a time (preview without --yes)
    #[command(visible_aliases = ["certificate", "certs"])]
    Certificates(RotateCertificatesCli),
}

#[derive(Debug, Args)]
pub(crate) struct RotateCertificatesCli {
    pub(crate) name: String,
    /// Really rotate (without it: the certificates and the plan)
    #[arg(long, short)]
    pub(crate) yes: bool,
    /// How long static pod manifests stay out of the kubelet's directory; at least the
    /// kubelet's fileCheckFrequency (20s by default)
    #[arg(long, value_parser = addons::parse_duration, default_value = "20s")]
    pub(crate) static_pod_wait: std::time::Duration,
    /// How long to wait for each restarted kube-apiserver to be healthy
    #[arg(long, value_parser = addons::parse_duration, default_value = "5m")]
    pub(crate) health_timeout: std::time::Duration,
    /// Hosts read at once
    #[arg(long, default_value_t = 20)]
    pub(crate) concurrency: usize,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BackupWhat {
    /// Take an etcd snapshot on a healthy member and store it (with its sha256) in the state
    /// store under NAME/backups/etcd/
    Etcd {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
        /// AWS: connect to the control planes at their private addresses (VPN, peered
        /// network), like `spec.topology.sshAddress: Private`
        #[arg(long)]
        ssh_private_address: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum RestoreWhat {
    /// Restore every etcd member from a stored snapshot (checksum verified first); API
    /// servers and etcd stop meanwhile. Preview without --yes
    Etcd {
        name: String,
        /// The snapshot, as `kprov get backups NAME` lists it (e.g. 20261122T213500Z)
        #[arg(long, value_name = "SNAPSHOT")]
        from: String,
        /// Really restore (everything written after the snapshot is lost)
        #[arg(long, short)]
        yes: bool,
        /// AWS: connect to the etcd members at their private addresses (VPN, peered
        /// network), like `spec.topology.sshAddress: Private`
        #[arg(long)]
        ssh_private_address: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum SchemaKind {
    All,
    Cluster,
    Instancegroup,
}

#[derive(Debug, Args)]
pub(crate) struct SchemaArgs {
    #[arg(value_enum, default_value_t = SchemaKind::All)]
    pub(crate) kind: SchemaKind,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionArgs {
    pub(crate) shell: clap_complete::Shell,
}

/// Parses arguments; usage errors exit with [`exit::USAGE`] (2 is reserved for "changes pending").
/// The commands whose cluster is their first positional argument, by their two words
/// (aliases included). kops habits reach them with `--name NAME` or `KPROV_NAME`.
const CLUSTER_FIRST: &[(&str, &[&str])] = &[
    ("create", &["cluster", "sshpublickey"]),
    ("toolbox", &["dump"]),
    (
        "get",
        &[
            "clusters",
            "cluster",
            "addons",
            "addon",
            "certificates",
            "certificate",
            "certs",
            "cert",
            "backups",
            "backup",
            "instances",
            "instance",
            "secrets",
            "secret",
        ],
    ),
    ("edit", &["cluster"]),
    ("delete", &["cluster", "instance"]),
    ("lock", &["status", "break"]),
    ("export", &["kubeconfig"]),
    ("update", &["cluster", "addons", "addon"]),
    ("rolling-update", &["cluster"]),
    ("validate", &["cluster"]),
    ("rotate", &["certificates", "certificate", "certs"]),
    ("backup", &["etcd"]),
    ("restore", &["etcd"]),
];

/// Where the cluster goes in `args` (after the command's two words) when the command takes
/// it first; global options before the command are skipped.
fn cluster_slot(args: &[String]) -> Option<usize> {
    let mut i = 1;
    while let Some(a) = args.get(i) {
        match a.as_str() {
            "--state" => i += 2,
            a if a.starts_with('-') => i += 1,
            _ => break,
        }
    }
    let first = args.get(i)?;
    let (_, seconds) = CLUSTER_FIRST.iter().find(|(c, _)| c == first)?;
    let second = args.get(i + 1)?;
    seconds.contains(&second.as_str()).then_some(i + 2)
}

/// kops's habits, as a rewrite of the command line for commands that take the cluster first:
/// `--name NAME` (or `--name=NAME`) becomes that argument; without either, `KPROV_NAME`
/// (`env`) fills it in when clap says it is missing (`missing`). `None`: nothing to rewrite.
fn kops_name(args: &[String], env: Option<&str>, missing: bool) -> Option<Vec<String>> {
    let slot = cluster_slot(args)?;
    let mut out: Vec<String> = Vec::with_capacity(args.len() + 1);
    let mut name = None;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if i >= slot && a == "--name" && args.get(i + 1).is_some() {
            name = args.get(i + 1).cloned();
            i += 2;
            continue;
        }
        if i >= slot
            && let Some(v) = a.strip_prefix("--name=")
        {
            name = Some(v.to_string());
            i += 1;
            continue;
        }
        out.push(a.clone());
        i += 1;
    }
    let name = match (name, env) {
        (Some(n), _) => n,
        (None, Some(e)) if missing && !e.is_empty() => e.to_string(),
        _ => return None,
    };
    out.insert(slot, name);
    Some(out)
}

/// The command line of this process, kops's `--name`/`KPROV_NAME` habit accepted; a usage
/// error (or `--help`/`--version`) is printed here and ends the process.
pub fn parse() -> Cli {
    let args: Vec<String> = std::env::args().collect();
    let env = std::env::var("KPROV_NAME").ok();
    let parsed = Cli::try_parse_from(&args).or_else(|e| {
        let missing = e.kind() == clap::error::ErrorKind::MissingRequiredArgument;
        match kops_name(&args, env.as_deref(), missing) {
            // The rewritten line's own error (if any) is the one to show.
            Some(fixed) => Cli::try_parse_from(fixed),
            None => Err(e),
        }
    });
    match parsed {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => exit::OK,
                _ => exit::USAGE,
            };
            let _ = e.print();
            std::process::exit(code);
        }
    }
}

pub(crate) fn command() -> clap::Command {
    Cli::command()
}

pub use commands::run;

#[cfg(test)]
mod kops_habits {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn name_flag_and_env_become_the_cluster_argument() {
        let line = |s: &str| kops_name(&v(s), None, false).map(|a| a.join(" "));
        assert_eq!(
            line("kprov update cluster --name a.example --yes").as_deref(),
            Some("kprov update cluster a.example --yes")
        );
        assert_eq!(
            line("kprov --state file:///s -v rolling-update cluster --yes --name=a.example")
                .as_deref(),
            Some("kprov --state file:///s -v rolling-update cluster a.example --yes")
        );
        assert_eq!(
            line("kprov delete instance --name a.example node-1").as_deref(),
            Some("kprov delete instance a.example node-1")
        );
        // Commands where --name already is the cluster keep it.
        assert_eq!(line("kprov get ig --name a.example"), None);
        assert_eq!(line("kprov update cluster a.example"), None);
        let env =
            |s: &str, missing| kops_name(&v(s), Some("e.example"), missing).map(|a| a.join(" "));
        assert_eq!(
            env("kprov validate cluster --wait 5m", true).as_deref(),
            Some("kprov validate cluster e.example --wait 5m")
        );
        assert_eq!(env("kprov validate cluster x.example", false), None);
    }

    #[test]
    fn every_command_that_takes_a_cluster_accepts_name() {
        for (first, seconds) in CLUSTER_FIRST {
            for second in *seconds {
                let args = v(&format!("kprov {first} {second} --name c.example"));
                let fixed = kops_name(&args, None, false).expect("rewritten");
                // Parsing may fail on the command's other required arguments, never on
                // --name nor on the cluster.
                if let Err(e) = Cli::try_parse_from(&fixed) {
                    let full = e.to_string();
                    let text = full.split("Usage:").next().unwrap_or_default();
                    assert!(!text.contains("unrecognized subcommand"), "{full}");
                    assert!(
                        !text.contains("--name") && !text.contains("<NAME>"),
                        "{first} {second}: {text}"
                    );
                }
            }
        }
    }
}
