//! Use cases: what a command does, without the command line. No clap, no indicatif and no
//! printing in here: progress leaves as events that `views` renders through the printer
//! (a spinner line per host on a terminal, plain lines otherwise).
//!
//! - [`platform`]: the platform seam: where a cluster runs (metal or AWS), asked for its
//!   machines as targets, the API address, the etcd members and health check; commands ask it
//!   instead of matching on the cloud.
//! - [`nodes`]: a cluster's machines over SSH on any platform: the node plan
//!   ([`crate::provision::plan`]), converging the nodes and storing the admin kubeconfig
//!   ([`nodes::converge`]), resetting them at `delete cluster` ([`nodes::reset`]).
//! - [`certificates`]: every control plane's kubeadm certificates and their expiry
//!   ([`certificates::read`]), renewal one control plane at a time ([`certificates::rotate`]).
//! - [`instance`]: `delete instance`, one node out of the cluster (drain, etcd member, reset,
//!   Node object, spec), and kprov's record of provisioned hosts.
//! - [`delete`]: `delete cluster`: its machines (cloud resources or hosts) then its objects in
//!   the store ([`delete::plan`], [`delete::apply`]).
//! - [`create`]: `create cluster`: the objects flags and an inventory stand for, checked
//!   as a whole ([`create::plan`]), then stored under the lock ([`create::apply`]).
//! - [`objects`]: `create -f` / `replace -f`: a file's objects per cluster, merged with the
//!   store's and validated before any write; `get clusters` ([`objects::list`]), `get
//!   instancegroups` and `delete instancegroup` ([`objects::plan_group_delete`],
//!   [`objects::delete_group`]).
//! - [`edit`]: `edit cluster|ig`: the object opened, reviewed through the caller's editor,
//!   saved under the lock, the user's copy kept when it is not.
//! - [`locks`]: `lock status` and `lock break`.
//! - [`model`]: the types of the layers below that commands name (errors for exit codes, the
//!   store, node targets, the roll plan), so that `cli` imports nothing but `ops`.
//! - [`hostkeys`]: `forget host-key`, a host's recorded SSH host key removed under the lock.
//! - [`bundle`]: `create bundle` (every image pinned first) and `get assets`.
//! - [`credentials`]: the cluster's API client from stored credentials
//!   ([`credentials::kube_client`], through an SSH tunnel where needed): the one way a
//!   command gets a Kubernetes client for a cluster.
//! - [`addons`]: add-on preview and apply ([`addons::deploy`]), `get addons`'s manifests and
//!   `validate cluster`'s API checks ([`addons::validate`]).
//! - [`node_config`]: kube-system's `kubelet-config` and `kube-proxy` ConfigMaps rewritten
//!   from the spec ([`node_config::sync`]).
//! - [`update`]: `update cluster` on every platform: [`update::open`], the preview
//!   ([`update::Update::plan`]), the apply under the lock ([`update::Update::apply`]).
//! - [`aws`]: `update cluster` and `delete cluster` on AWS: the cloud plan and apply, then
//!   the instances as node targets converged through [`nodes::converge`].
//! - [`interrupt`]: SIGINT/SIGTERM caught once per command, raced by every long wait.
//! - [`damaged`]: every record of a cluster that fails the checks on read, and their removal
//!   (`delete damaged`: [`damaged::plan`], [`damaged::apply`]).
//! - [`etcd`]: snapshots into the state store ([`etcd::backup`], which a rolling update
//!   calls before control-plane rolls), listing them, and restoring every member.
//! - [`etcd_backup`]: `backup etcd`, `get backups`, `restore etcd` on every platform: the
//!   machines from the platform seam ([`etcd_backup::open`]), the backup and the restore under
//!   the caller's lock.
//! - [`session`]: the state store opened once per command, and the one way a use case takes
//!   a cluster's lock ([`session::Session::with_lock`]).
//! - [`rolling_update`]: `rolling-update cluster` and `get instances` on every platform:
//!   [`rolling_update::open`], the preview ([`rolling_update::RollingUpdate::plan`]), the roll
//!   under the lock ([`rolling_update::RollingUpdate::apply`]); over [`rolling`] (the engine,
//!   with its journal), [`rolling_metal`] (in place), [`rolling_aws`] (replacing) and
//!   [`platform::rolling`] (the machines and rollers, asked of the platform seam).
//! - [`sshkey`]: the cluster's SSH public key (`create sshpublickey`), shown by fingerprint.
//! - [`toolbox`]: `toolbox dump`, the cluster's cloud resources and machines as one
//!   document, secrets never included.

pub(crate) mod addons;
pub(crate) mod aws;
pub(crate) mod bundle;
pub(crate) mod certificates;
pub(crate) mod create;
pub(crate) mod credentials;
pub(crate) mod damaged;
pub(crate) mod delete;
pub(crate) mod edit;
pub mod etcd;
pub(crate) mod etcd_backup;
pub(crate) mod etcd_members;
pub(crate) mod host_records;
pub(crate) mod hostkeys;
pub mod instance;
pub(crate) mod interrupt;
pub(crate) mod locks;
pub(crate) mod model;
pub(crate) mod node_config;
pub(crate) mod nodes;
pub(crate) mod objects;
pub(crate) mod platform;
pub(crate) mod release;
pub mod rolling;
pub(crate) mod rolling_aws;
pub(crate) mod rolling_metal;
pub(crate) mod rolling_update;
pub(crate) mod session;
pub(crate) mod sshkey;
pub(crate) mod toolbox;
pub(crate) mod update;
