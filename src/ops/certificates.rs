//! A cluster's kubeadm certificates: reading their expiry on every control plane
//! (`get certificates`, `validate cluster`) and renewing them one control plane at a time
//! (`rotate certificates`).
//!
//! Read: over SSH, read-only, from control planes whose host key the cluster recorded and
//! whose ownership marker names this cluster (a host of another cluster is never read). The
//! files are the ones `kubeadm certs check-expiration` lists, plus the three CAs; kprov
//! parses the PEM/DER itself (`provision::pki`), it does not trust any tool's text. A
//! kubeconfig's embedded client certificate is what is read for `*.conf`.
//!
//! Rotate (under the caller's cluster lock): every control plane is read first, and if any
//! of them cannot be read or is not this cluster's, nothing is renewed. Then, one control
//! plane at a time: `kubeadm certs renew all`; the static pods are restarted as kubeadm
//! documents it (their manifests moved out of `/etc/kubernetes/manifests`, the kubelet given
//! `static_pod_wait` to stop them, the manifests moved back); the run waits (bounded) until
//! the API server on that host answers `/livez` and, where the host has `openssl`, serves
//! the renewed certificate, and its stacked etcd member (if any) is ready again; only then
//! the next host, so a rotation never has two etcd members down at once. A failure stops the rotation there.
//! Finally the admin kubeconfig (renewed with the rest) is fetched from a control plane this
//! cluster owns and stored compare-and-swap, as `update cluster` stores it.
//!
//! Caveats: kubeadm does not renew the kubelet's client certificate (the kubelet rotates it
//! itself, `rotateCertificates`) nor the CAs (ten years), and neither does this. Dedicated
//! etcd hosts (external etcd) keep their own certificates and are not rotated here. The
//! restart waits for the kubelet, so a control plane's API server is down for about
//! `static_pod_wait` plus its start-up; with one control plane the cluster's API is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::nodes::owner::OWNER_FILE;
use crate::nodes::{self, Owner, Target};
use crate::ops::nodes::{AdminKubeconfig, fetch_admin_kubeconfig};
use crate::ops::platform::{Platform, Reach};
use crate::provision::pki;
use crate::provision::render::CloudApi;
use crate::script;
use crate::spec::ResolvedCluster;
use crate::ssh::task::{ExecError, HostExecutor, Step};
use crate::ssh::{NoProgress, SshFleet, SshOptions};
use crate::state::{StateStore, lock};

/// `validate cluster` warns about certificates that expire sooner than this.
pub(crate) const WARN_WITHIN: Duration = Duration::from_secs(30 * 24 * 3600);

/// How a file carries its certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// A PEM certificate file.
    Pem,
    /// A kubeconfig with `client-certificate-data`.
    Kubeconfig,
}

/// A certificate kubeadm keeps on a control plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Known {
    /// kubeadm's name for it (`kubeadm certs check-expiration`).
    pub name: &'static str,
    pub path: &'static str,
    pub carrier: Carrier,
    pub ca: bool,
}

const fn pem(name: &'static str, path: &'static str) -> Known {
    Known {
        name,
        path,
        carrier: Carrier::Pem,
        ca: false,
    }
}

const fn conf(name: &'static str, path: &'static str) -> Known {
    Known {
        carrier: Carrier::Kubeconfig,
        ..pem(name, path)
    }
}

const fn ca(name: &'static str, path: &'static str) -> Known {
    Known {
        ca: true,
        ..pem(name, path)
    }
}

/// What `kubeadm certs check-expiration` lists (in its order), then the CAs. The etcd
/// certificates exist only where etcd runs on the control plane.
pub(crate) const KUBEADM_CERTIFICATES: &[Known] = &[
    conf("admin.conf", "/etc/kubernetes/admin.conf"),
    pem("apiserver", "/etc/kubernetes/pki/apiserver.crt"),
    pem(
        "apiserver-etcd-client",
        "/etc/kubernetes/pki/apiserver-etcd-client.crt",
    ),
    pem(
        "apiserver-kubelet-client",
        "/etc/kubernetes/pki/apiserver-kubelet-client.crt",
    ),
    conf(
        "controller-manager.conf",
        "/etc/kubernetes/controller-manager.conf",
    ),
    pem(
        "etcd-healthcheck-client",
        "/etc/kubernetes/pki/etcd/healthcheck-client.crt",
    ),
    pem("etcd-peer", "/etc/kubernetes/pki/etcd/peer.crt"),
    pem("etcd-server", "/etc/kubernetes/pki/etcd/server.crt"),
    pem(
        "front-proxy-client",
        "/etc/kubernetes/pki/front-proxy-client.crt",
    ),
    conf("scheduler.conf", "/etc/kubernetes/scheduler.conf"),
    conf("super-admin.conf", "/etc/kubernetes/super-admin.conf"),
    ca("ca", "/etc/kubernetes/pki/ca.crt"),
    ca("etcd-ca", "/etc/kubernetes/pki/etcd/ca.crt"),
    ca("front-proxy-ca", "/etc/kubernetes/pki/front-proxy-ca.crt"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum CertState {
    Valid,
    Expired,
    /// The file does not exist (`super-admin.conf` before Kubernetes 1.29, etcd certificates
    /// with external etcd).
    Missing,
    /// The file exists but holds no certificate kprov can read.
    Invalid,
}

/// Who renews a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RenewedBy {
    /// `kubeadm certs renew all`, which `rotate certificates` runs.
    Kubeadm,
    /// The kubelet itself (`rotateCertificates`, kubeadm's default).
    Kubelet,
    /// Nobody automatically: the CAs, and a kubelet.conf with an embedded certificate.
    Manual,
}

/// The kubelet's client certificate as kubeadm (1.17+) leaves it: kubelet.conf points at the
/// kubelet's rotating file. Not renewed by kubeadm.
pub(crate) const KUBELET_CLIENT: &str = "kubelet-client";
/// The only directory kprov follows a kubelet.conf's `client-certificate` into.
const KUBELET_PKI: &str = "/var/lib/kubelet/pki/";

/// One certificate on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CertificateStatus {
    pub name: String,
    pub path: String,
    pub certificate_authority: bool,
    pub renewed_by: RenewedBy,
    pub state: CertState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_after: Option<DateTime<Utc>>,
    /// Seconds from the reading to notAfter (negative once expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Something the operator should know (an embedded kubelet certificate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CertificateStatus {
    /// "364d", "23h", "expired 2d ago", for tables and messages.
    pub(crate) fn residual(&self) -> String {
        match (self.state, self.residual_seconds) {
            (CertState::Missing, _) => "missing".into(),
            (CertState::Invalid, _) => "invalid".into(),
            (_, Some(s)) if s < 0 => format!("expired {} ago", human(s.unsigned_abs())),
            (_, Some(s)) => human(s.unsigned_abs()),
            (_, None) => "-".into(),
        }
    }

    fn expires_within(&self, within: Duration) -> bool {
        matches!(self.state, CertState::Valid | CertState::Expired)
            && self
                .residual_seconds
                .is_some_and(|s| s < i64::try_from(within.as_secs()).unwrap_or(i64::MAX))
    }
}

fn human(secs: u64) -> String {
    match secs {
        s if s >= 86_400 => format!("{}d", s / 86_400),
        s if s >= 3_600 => format!("{}h", s / 3_600),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// What could be seen on a control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum HostState {
    Read,
    /// The cluster has no recorded key for it: kprov never connected, and does not now.
    HostKeyNotRecorded,
    Unreachable,
    /// Its ownership marker names another cluster, or it carries none of this one.
    NotOwned,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HostCertificates {
    pub host: String,
    pub state: HostState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub certificates: Vec<CertificateStatus>,
}

impl HostCertificates {
    fn not_read(host: &str, state: HostState, reason: String) -> Self {
        HostCertificates {
            host: host.to_string(),
            state,
            reason: Some(reason),
            certificates: Vec::new(),
        }
    }
}

/// Every control plane's certificates, as read at `checkedAt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CertificateReport {
    pub cluster: String,
    pub checked_at: DateTime<Utc>,
    pub hosts: Vec<HostCertificates>,
}

impl CertificateReport {
    /// Certificates that expire within `within` (or have expired), with their host, whoever
    /// renews them.
    pub(crate) fn expiring(&self, within: Duration) -> Vec<(&str, &CertificateStatus)> {
        self.hosts
            .iter()
            .flat_map(|h| h.certificates.iter().map(move |c| (h.host.as_str(), c)))
            .filter(|(_, c)| c.expires_within(within))
            .collect()
    }

    /// Hosts whose certificates could not be read, with why.
    pub(crate) fn unread(&self) -> Vec<&HostCertificates> {
        self.hosts
            .iter()
            .filter(|h| h.state != HostState::Read)
            .collect()
    }

    /// Certificates that are neither valid nor expired nor legitimately absent.
    pub(crate) fn invalid(&self) -> Vec<(&str, &CertificateStatus)> {
        self.hosts
            .iter()
            .flat_map(|h| h.certificates.iter().map(move |c| (h.host.as_str(), c)))
            .filter(|(_, c)| c.state == CertState::Invalid)
            .collect()
    }
}

/// Where a kubeconfig keeps its client certificate.
enum ClientCertificate {
    /// PEM text from `client-certificate-data`.
    Embedded(String),
    /// A file named by `client-certificate`.
    File(String),
}

/// The client certificate (PEM text) embedded in a kubeconfig.
fn kubeconfig_client_certificate(text: &str) -> Result<String, String> {
    match kubeconfig_client(text)? {
        ClientCertificate::Embedded(pem) => Ok(pem),
        ClientCertificate::File(file) => Err(format!(
            "the client certificate is not embedded (client-certificate: {file})"
        )),
    }
}

fn kubeconfig_client(text: &str) -> Result<ClientCertificate, String> {
    #[derive(serde::Deserialize)]
    struct Kubeconfig {
        #[serde(default)]
        users: Vec<User>,
    }
    #[derive(serde::Deserialize)]
    struct User {
        #[serde(default)]
        user: Auth,
    }
    #[derive(Default, serde::Deserialize)]
    struct Auth {
        #[serde(rename = "client-certificate-data")]
        data: Option<String>,
        #[serde(rename = "client-certificate")]
        file: Option<String>,
    }
    let kc: Kubeconfig =
        serde_saphyr::from_str(text).map_err(|e| format!("not a kubeconfig: {e}"))?;
    let auth = kc
        .users
        .into_iter()
        .next()
        .map(|u| u.user)
        .ok_or("the kubeconfig has no user")?;
    match (auth.data, auth.file) {
        (Some(data), _) => {
            let pem =
                pki::decode_base64(&data).map_err(|e| format!("client-certificate-data: {e}"))?;
            String::from_utf8(pem)
                .map(ClientCertificate::Embedded)
                .map_err(|_| "client-certificate-data is not PEM text".into())
        }
        (None, Some(file)) => Ok(ClientCertificate::File(file)),
        (None, None) => Err("the kubeconfig's user has no client certificate".into()),
    }
}

/// The status of `known` from the file's content (`None`: the file does not exist).
pub(crate) fn inspect(
    known: &Known,
    content: Option<&[u8]>,
    now: DateTime<Utc>,
) -> CertificateStatus {
    let mut status = CertificateStatus {
        name: known.name.to_string(),
        path: known.path.to_string(),
        certificate_authority: known.ca,
        renewed_by: if known.ca {
            RenewedBy::Manual
        } else {
            RenewedBy::Kubeadm
        },
        state: CertState::Missing,
        subject: None,
        issuer: None,
        not_after: None,
        residual_seconds: None,
        error: None,
        note: None,
    };
    let Some(content) = content else {
        return status;
    };
    let text = String::from_utf8_lossy(content);
    let pem = match known.carrier {
        Carrier::Pem => Ok(text.into_owned()),
        Carrier::Kubeconfig => kubeconfig_client_certificate(&text),
    };
    match pem.and_then(|p| pki::cert_info_pem(&p).map_err(|e| e.to_string())) {
        Ok(info) => {
            let residual = (info.not_after - now).num_seconds();
            status.state = if residual <= 0 {
                CertState::Expired
            } else {
                CertState::Valid
            };
            status.subject = Some(info.subject);
            status.issuer = Some(info.issuer);
            status.not_after = Some(info.not_after);
            status.residual_seconds = Some(residual);
        }
        Err(e) => {
            status.state = CertState::Invalid;
            status.error = Some(e);
        }
    }
    status
}

/// The kubelet's client certificate on a host: kubelet.conf's file in /var/lib/kubelet/pki
/// (rotated by the kubelet), or the certificate kubelet.conf embeds (rotated by nobody).
async fn kubelet_client(
    exec: &dyn HostExecutor,
    host: &str,
    now: DateTime<Utc>,
) -> Result<CertificateStatus, ExecError> {
    let conf = crate::provision::render::KUBELET_CONF;
    let known = Known {
        name: KUBELET_CLIENT,
        path: conf,
        carrier: Carrier::Pem,
        ca: false,
    };
    let mut status = inspect(&known, None, now);
    status.renewed_by = RenewedBy::Kubelet;
    let Some(text) = exec.read_file(host, conf).await? else {
        return Ok(status);
    };
    let pem = match kubeconfig_client(&String::from_utf8_lossy(&text)) {
        Ok(ClientCertificate::Embedded(pem)) => {
            status.renewed_by = RenewedBy::Manual;
            status.note = Some(format!(
                "{conf} embeds its client certificate, which the kubelet does not rotate \
                 (kubeadm before 1.17 wrote it so): point client-certificate and client-key \
                 at /var/lib/kubelet/pki/kubelet-client-current.pem as kubeadm documents"
            ));
            pem
        }
        Ok(ClientCertificate::File(file)) => {
            status.path = file.clone();
            if !file.starts_with(KUBELET_PKI) || file.contains("..") {
                status.state = CertState::Invalid;
                status.error = Some(format!(
                    "{conf} names a client certificate outside {KUBELET_PKI}; not followed"
                ));
                return Ok(status);
            }
            match exec.read_file(host, &file).await? {
                Some(b) => String::from_utf8_lossy(&b).into_owned(),
                None => return Ok(status),
            }
        }
        Err(e) => {
            status.state = CertState::Invalid;
            status.error = Some(e);
            return Ok(status);
        }
    };
    let path = status.path.clone();
    let (renewed_by, note) = (status.renewed_by, status.note.clone());
    let mut status = inspect(&known, Some(pem.as_bytes()), now);
    status.path = path;
    status.renewed_by = renewed_by;
    status.note = note;
    Ok(status)
}

fn unreachable(host: &str, e: ExecError) -> HostCertificates {
    match e {
        ExecError::UnknownHostKey { .. } => HostCertificates::not_read(
            host,
            HostState::HostKeyNotRecorded,
            "its host key is not recorded: kprov never provisioned it (`kprov update cluster NAME --yes --accept-new-host-keys`)".into(),
        ),
        e => HostCertificates::not_read(host, HostState::Unreachable, e.to_string()),
    }
}

/// Reads one control plane's certificates, if it carries `owner`'s marker.
async fn observe(
    exec: &dyn HostExecutor,
    cluster: &str,
    target: &Target,
    owner: &Owner,
    now: DateTime<Utc>,
) -> HostCertificates {
    let host = target.name();
    match exec.read_file(host, OWNER_FILE).await {
        Err(e) => return unreachable(host, e),
        Ok(None) => {
            return HostCertificates::not_read(
                host,
                HostState::NotOwned,
                format!("it carries no ownership marker ({OWNER_FILE}) of {cluster}"),
            );
        }
        Ok(Some(bytes)) => match Owner::parse(&bytes) {
            Some(m) if m.uid == owner.uid => {}
            Some(m) => {
                return HostCertificates::not_read(
                    host,
                    HostState::NotOwned,
                    format!("it belongs to {}", m.describe()),
                );
            }
            None => {
                return HostCertificates::not_read(
                    host,
                    HostState::NotOwned,
                    format!("its ownership marker ({OWNER_FILE}) is unreadable"),
                );
            }
        },
    }
    // Every file is read: where one is absent (etcd's with external etcd, super-admin.conf
    // before 1.29) it is shown as missing, which is information, not a failure.
    let mut certificates = Vec::new();
    for known in KUBEADM_CERTIFICATES {
        match exec.read_file(host, known.path).await {
            Ok(content) => certificates.push(inspect(known, content.as_deref(), now)),
            Err(e) => return unreachable(host, e),
        }
    }
    match kubelet_client(exec, host, now).await {
        Ok(c) => certificates.push(c),
        Err(e) => return unreachable(host, e),
    }
    HostCertificates {
        host: host.to_string(),
        state: HostState::Read,
        reason: None,
        certificates,
    }
}

/// Reads the certificates of `control_planes` through `exec` (any executor: the SSH fleet,
/// or a fake in tests). Without an owner the cluster never claimed a host: none is contacted.
pub(crate) async fn read_with(
    exec: &dyn HostExecutor,
    cluster: &str,
    control_planes: &[Target],
    owner: Option<&Owner>,
    now: DateTime<Utc>,
) -> CertificateReport {
    let hosts = match owner {
        None => control_planes
            .iter()
            .map(|t| {
                HostCertificates::not_read(
                    t.name(),
                    HostState::NotOwned,
                    format!("{cluster} never claimed a host (no cluster UID in the state store)"),
                )
            })
            .collect(),
        Some(owner) => {
            futures::future::join_all(
                control_planes
                    .iter()
                    .map(|t| observe(exec, cluster, t, owner, now)),
            )
            .await
        }
    };
    CertificateReport {
        cluster: cluster.to_string(),
        checked_at: now,
        hosts,
    }
}

fn control_planes(targets: &[Target]) -> Vec<Target> {
    targets
        .iter()
        .filter(|t| t.is_control_plane())
        .cloned()
        .collect()
}

/// A fleet that records no host key: only hosts the cluster already knows are contacted.
fn fleet(
    cluster: &ResolvedCluster,
    targets: &[Target],
    store: Arc<dyn StateStore>,
    concurrency: usize,
) -> anyhow::Result<SshFleet> {
    SshFleet::new(
        &cluster.name,
        targets.iter().map(|t| t.host.clone()).collect(),
        store,
        SshOptions {
            concurrency,
            accept_new_host_keys: false,
            ..SshOptions::default()
        },
        Arc::new(NoProgress),
    )
    .context("preparing ssh connections")
}

/// `get certificates`: every control plane's certificates, read-only.
pub(crate) async fn read(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    concurrency: usize,
) -> anyhow::Result<CertificateReport> {
    let owner = nodes::owner::read(store.as_ref(), &cluster.name).await?;
    let cps = control_planes(targets);
    let fleet = fleet(cluster, &cps, store, concurrency)?;
    let report = read_with(&fleet, &cluster.name, &cps, owner.as_ref(), Utc::now()).await;
    fleet.close().await;
    Ok(report)
}

/// How many control planes `get certificates` and `validate cluster` read at a time.
pub(crate) const READ_CONCURRENCY: usize = 20;

/// Why `get certificates` showed nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("{0} has no control plane: no kubeadm certificates to show")]
    NoControlPlane(String),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// `get certificates`: the control planes from the platform seam, their certificates read.
pub(crate) async fn get(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
) -> Result<CertificateReport, ReadError> {
    let (targets, _) = targets(store, cluster).await?;
    if !targets.iter().any(Target::is_control_plane) {
        return Err(ReadError::NoControlPlane(cluster.name.clone()));
    }
    Ok(read(store.clone(), cluster, &targets, READ_CONCURRENCY).await?)
}

/// The certificate part of `validate cluster`, which never fails on it (the API checks
/// decide).
#[derive(Debug)]
pub(crate) enum ValidateCheck {
    /// Not checked: finding a cloud's instances needs its credentials, which validate does
    /// not.
    NotOnCloud(crate::spec::CloudProvider),
    Read(CertificateReport),
    /// The check itself failed (a warning).
    Failed(anyhow::Error),
}

/// Reads the certificates for `validate cluster` (metal only, see [`ValidateCheck`]).
pub(crate) async fn check_for_validate(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
) -> ValidateCheck {
    if crate::ops::platform::Kind::of(&cluster.completed) != crate::ops::platform::Kind::Metal {
        return ValidateCheck::NotOnCloud(cluster.completed.spec.cloud_provider);
    }
    let checked = async {
        let (targets, _) = targets(store, cluster).await?;
        read(store.clone(), cluster, &targets, READ_CONCURRENCY).await
    }
    .await;
    match checked {
        Ok(r) => ValidateCheck::Read(r),
        Err(e) => ValidateCheck::Failed(e),
    }
}

/// How a rotation runs.
#[derive(Debug, Clone)]
pub(crate) struct RotateOptions {
    pub concurrency: usize,
    /// How long the static pods' manifests stay out of the kubelet's directory: at least
    /// the kubelet's `fileCheckFrequency` (20 s by default), or the pods are not restarted.
    pub static_pod_wait: Duration,
    /// How long to wait for a restarted API server to be healthy before giving up.
    pub health_timeout: Duration,
    /// The cloud's API settings (AWS), for the admin kubeconfig's server; `None` on metal.
    pub cloud_api: Option<CloudApi>,
}

impl Default for RotateOptions {
    fn default() -> Self {
        RotateOptions {
            concurrency: SshOptions::default().concurrency,
            static_pod_wait: Duration::from_secs(20),
            health_timeout: Duration::from_secs(300),
            cloud_api: None,
        }
    }
}

/// Progress of a rotation, for the CLI to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RotateEvent {
    /// A step started on a control plane.
    Step { host: String, step: String },
    /// A control plane was renewed, restarted and is healthy again.
    HostDone { host: String, took: Duration },
}

pub(crate) type RotateEvents = Arc<dyn Fn(&RotateEvent) + Send + Sync>;

/// The order of the work, for previews: the control planes, as the spec lists them.
pub(crate) fn rotation_order(targets: &[Target]) -> Vec<String> {
    control_planes(targets)
        .iter()
        .map(|t| t.name().to_string())
        .collect()
}

pub(crate) const STEP_RENEW: &str = "certificates: kubeadm certs renew all";
pub(crate) const STEP_RESTART: &str = "certificates: restart static pods";
pub(crate) const STEP_HEALTH: &str = "certificates: wait for kube-apiserver and etcd";

/// Where manifests wait while the kubelet stops their pods (outside its directory).
const HELD_MANIFESTS: &str = "/etc/kubernetes/kprov/manifests-held";
const MANIFESTS: &str = "/etc/kubernetes/manifests";

/// The steps run on one control plane, in order.
pub(crate) fn rotation_steps(options: &RotateOptions) -> Vec<Step> {
    let wait = options.static_pod_wait.as_secs().to_string();
    let health = options.health_timeout.as_secs().max(1).to_string();
    let renew = Step {
        name: STEP_RENEW.into(),
        files: Vec::new(),
        check: None,
        run: "set -eu\nkubeadm certs renew all\n".into(),
        timeout: Duration::from_secs(120),
    };
    // A run cut off while the manifests were aside would leave the control plane down:
    // they go back first thing, and on any exit.
    let restart = Step {
        name: STEP_RESTART.into(),
        files: Vec::new(),
        check: None,
        run: script!(
            r#"set -eu
manifests={}
held={}
restore() {{
  for f in "$held"/*.yaml; do
    [ -e "$f" ] || continue
    mv -f "$f" "$manifests/"
  done
}}
mkdir -p "$held"
restore
trap restore EXIT
moved=0
for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
  if [ -f "$manifests/$c.yaml" ]; then
    mv "$manifests/$c.yaml" "$held/"
    moved=$((moved + 1))
  fi
done
[ "$moved" -gt 0 ] || {{ echo "no static pod manifests in $manifests" >&2; exit 1; }}
sleep {}
restore
"#,
            MANIFESTS,
            HELD_MANIFESTS,
            wait
        ),
        timeout: options.static_pod_wait + Duration::from_secs(60),
    };
    // /livez answers once the new API server runs; the served certificate proves it is the
    // restarted one (where openssl is installed). A stacked etcd member was restarted too:
    // the next control plane's restart takes a second member down, so the rotation goes on
    // only once this one is back and ready (etcd's /readyz on kubeadm's local metrics port
    // answers once the member has a leader), or three members would lose quorum.
    let healthy = Step {
        name: STEP_HEALTH.into(),
        files: Vec::new(),
        check: None,
        run: script!(
            r#"set -u
timeout={}
crt={}
deadline=$(( $(date +%s) + timeout ))
last="no answer"
while :; do
  if out=$(curl -fsSk --max-time 5 https://127.0.0.1:6443/livez 2>&1); then
    if ! command -v openssl >/dev/null 2>&1; then served=same want=same; else
    served=$(openssl s_client -connect 127.0.0.1:6443 </dev/null 2>/dev/null | openssl x509 -noout -enddate 2>/dev/null || true)
    want=$(openssl x509 -noout -enddate -in "$crt" 2>/dev/null || true)
    fi
    if [ -n "$served" ] && [ "$served" = "$want" ]; then
      [ -f {} ] || exit 0
      if etcd=$(curl -fsS --max-time 5 http://127.0.0.1:2381/readyz 2>&1); then exit 0; fi
      last="the API server is back; the local etcd member is not ready: $etcd"
    else
      last="serves a certificate other than $crt ($served, the file: $want)"
    fi
  else
    last="https://127.0.0.1:6443/livez: $out"
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "control plane not healthy after ${{timeout}}s: $last" >&2
    exit 1
  fi
  sleep 1
done
"#,
            health,
            "/etc/kubernetes/pki/apiserver.crt",
            "/etc/kubernetes/manifests/etcd.yaml"
        ),
        timeout: options.health_timeout + Duration::from_secs(30),
    };
    vec![renew, restart, healthy]
}

/// What a rotation did.
#[derive(Debug, Clone)]
pub(crate) struct RotateReport {
    pub rolled: Rolled,
    pub admin_kubeconfig: AdminKubeconfig,
    pub after: CertificateReport,
}

impl RotateReport {
    pub(crate) fn success(&self) -> bool {
        self.rolled.failed.is_none()
            && matches!(
                self.admin_kubeconfig,
                AdminKubeconfig::Stored | AdminKubeconfig::Unchanged
            )
    }
}

/// How far a rotation got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rolled {
    /// Control planes renewed, restarted and healthy, in order, with how long each took.
    pub renewed: Vec<(String, Duration)>,
    /// The control plane where the rotation stopped, and why.
    pub failed: Option<(String, String)>,
    /// Control planes not reached because the rotation stopped.
    pub not_started: Vec<String>,
}

/// Renews, restarts and waits for each control plane in turn, through any executor; stops
/// at the first failure. `still_locked` is asked before each host (the cluster lock).
pub(crate) async fn roll(
    exec: &dyn HostExecutor,
    control_planes: &[Target],
    options: &RotateOptions,
    still_locked: &(dyn Fn() -> Result<(), lock::LockError> + Send + Sync),
    events: &RotateEvents,
) -> anyhow::Result<Rolled> {
    let mut rolled = Rolled::default();
    let steps = rotation_steps(options);
    for (i, cp) in control_planes.iter().enumerate() {
        still_locked()?;
        let host = cp.name();
        let started = Instant::now();
        for step in &steps {
            events(&RotateEvent::Step {
                host: host.to_string(),
                step: step.name.clone(),
            });
            if let Err(e) = exec.run_steps(host, std::slice::from_ref(step)).await {
                rolled.failed = Some((host.to_string(), e.to_string()));
                rolled.not_started = control_planes[i + 1..]
                    .iter()
                    .map(|t| t.name().to_string())
                    .collect();
                return Ok(rolled);
            }
        }
        let took = started.elapsed();
        events(&RotateEvent::HostDone {
            host: host.to_string(),
            took,
        });
        rolled.renewed.push((host.to_string(), took));
    }
    Ok(rolled)
}

/// The cluster's machines and, on AWS, its API settings (for the admin kubeconfig), from the
/// platform seam: the inventory (metal) or the running instances (AWS).
pub(crate) async fn targets(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
) -> anyhow::Result<(Vec<Target>, Option<CloudApi>)> {
    let platform = Platform::open(store, cluster, Reach::default()).await?;
    Ok((platform.targets().await?, platform.cloud_api().cloned()))
}

/// What `rotate certificates` would renew: the cluster's control planes in the order they are
/// renewed. Read-only; the preview prints it with the certificates it reads
/// ([`RotatePlan::read`]).
#[derive(Debug, Clone)]
pub(crate) struct RotatePlan {
    pub cluster: ResolvedCluster,
    pub targets: Vec<Target>,
    /// The control planes, one at a time in this order.
    pub order: Vec<String>,
    /// The API settings the platform sets (AWS), for the admin kubeconfig's server.
    pub cloud_api: Option<CloudApi>,
}

/// Why `rotate certificates` did not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RotateError {
    #[error("{0} has no control plane: no kubeadm certificates to rotate")]
    NoControlPlane(String),
    /// The cluster's lock could not be taken, or was lost.
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    /// A refusal (a control plane unreadable or not this cluster's), or a failed step.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Plans the rotation of `cluster`'s certificates (completed and validated). Read-only.
pub(crate) async fn plan(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
) -> Result<RotatePlan, RotateError> {
    let (targets, cloud_api) = targets(store, cluster).await?;
    let order = rotation_order(&targets);
    if order.is_empty() {
        return Err(RotateError::NoControlPlane(cluster.name.clone()));
    }
    Ok(RotatePlan {
        cluster: cluster.clone(),
        targets,
        order,
        cloud_api,
    })
}

impl RotatePlan {
    /// The certificates of the plan's control planes now (the preview's table).
    pub(crate) async fn read(
        &self,
        store: Arc<dyn StateStore>,
        concurrency: usize,
    ) -> anyhow::Result<CertificateReport> {
        read(store, &self.cluster, &self.targets, concurrency).await
    }
}

/// Carries out `plan` under `guard`, the lock the caller holds
/// ([`crate::ops::session::Session::with_lock`]); `options.cloud_api` is the plan's.
pub(crate) async fn apply(
    store: Arc<dyn StateStore>,
    plan: &RotatePlan,
    guard: &lock::LockGuard,
    options: &RotateOptions,
    events: &RotateEvents,
) -> Result<RotateReport, RotateError> {
    let options = RotateOptions {
        cloud_api: plan.cloud_api.clone(),
        ..options.clone()
    };
    Ok(rotate(store, &plan.cluster, &plan.targets, guard, &options, events).await?)
}

/// `rotate certificates --yes`: call under the cluster lock (`guard`).
pub(crate) async fn rotate(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    guard: &lock::LockGuard,
    options: &RotateOptions,
    events: &RotateEvents,
) -> anyhow::Result<RotateReport> {
    guard.check()?;
    let name = cluster.name.as_str();
    let owner = nodes::owner::read(store.as_ref(), name)
        .await?
        .ok_or_else(|| {
            anyhow!(
                "{name} never claimed a host (no cluster UID in the state store): nothing to rotate; provision it with `kprov update cluster {name} --yes`"
            )
        })?;
    let cps = control_planes(targets);
    if cps.is_empty() {
        anyhow::bail!("{name} has no control plane: no kubeadm certificates to rotate");
    }
    let fleet = fleet(cluster, targets, store.clone(), options.concurrency)?;
    let result = async {
        let before = read_with(&fleet, name, &cps, Some(&owner), Utc::now()).await;
        let unread = before.unread();
        if !unread.is_empty() {
            anyhow::bail!(
                "refusing to rotate the certificates of {name}; nothing was renewed:\n{}",
                unread
                    .iter()
                    .map(|h| format!(
                        "  {}: {}",
                        h.host,
                        h.reason.as_deref().unwrap_or("not readable")
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        let rolled = roll(&fleet, &cps, options, &|| guard.check(), events).await?;
        let admin_kubeconfig = if rolled.renewed.is_empty() {
            AdminKubeconfig::NotFetched("no control plane was renewed".into())
        } else {
            let (cloud_api, store) = (options.cloud_api.as_ref(), store.as_ref());
            fetch_admin_kubeconfig(&fleet, store, cluster, targets, &owner, cloud_api, guard)
                .await?
                .unwrap_or_else(AdminKubeconfig::NotFetched)
        };
        let after = read_with(&fleet, name, &cps, Some(&owner), Utc::now()).await;
        Ok(RotateReport {
            rolled,
            admin_kubeconfig,
            after,
        })
    }
    .await;
    fleet.close().await;
    result
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;
    use chrono::TimeZone;

    use super::*;
    use crate::provision::orchestrate::tests::{hosts, owner, targets};
    use crate::ssh::task::StepOutcome;
    use crate::ssh::task::fake::{Files, StepByStep, on_host, step_failed};

    /// testdata/ca.crt: notAfter 2036-11-18T11:16:51Z.
    const CA: &str = include_str!("../provision/testdata/ca.crt");

    fn at(y: i32, m: u32, d: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap()
    }

    fn kubeconfig(pem: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: {}\n    client-key-data: eA==\n",
            aws_smithy_types::base64::encode(pem)
        )
    }

    /// Hosts as files; records every read and step.
    #[derive(Default)]
    struct Fake {
        files: Files,
        reads: Mutex<Vec<(String, String)>>,
        steps: Mutex<Vec<(String, String)>>,
        unknown_key: Vec<String>,
        fail_step: Option<(String, String)>,
    }

    impl Fake {
        fn put(&self, host: &str, path: &str, content: &str) {
            self.files.put(host, path, content.to_string());
        }

        /// A control plane of `owner` with every certificate kubeadm writes.
        fn control_plane(&self, host: &str, marker: &Owner) {
            self.put(host, OWNER_FILE, &marker.marker());
            self.put(
                host,
                crate::provision::render::KUBELET_CONF,
                &kubeconfig(CA),
            );
            for k in KUBEADM_CERTIFICATES {
                match k.carrier {
                    Carrier::Pem => self.put(host, k.path, CA),
                    Carrier::Kubeconfig => self.put(host, k.path, &kubeconfig(CA)),
                }
            }
        }

        fn reads_on(&self, host: &str) -> Vec<String> {
            on_host(&self.reads, host, String::clone)
        }
    }

    #[async_trait::async_trait]
    impl StepByStep for Fake {
        async fn step(&self, host: &str, s: &Step) -> Result<StepOutcome, ExecError> {
            self.steps
                .lock()
                .unwrap()
                .push((host.to_string(), s.name.clone()));
            if self.fail_step.as_ref() == Some(&(host.to_string(), s.name.clone())) {
                return Err(step_failed(
                    host,
                    s,
                    "kube-apiserver not healthy after 300s",
                ));
            }
            Ok(StepOutcome::Changed)
        }

        async fn read(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
            if self.unknown_key.iter().any(|h| h == host) {
                return Err(ExecError::UnknownHostKey {
                    host: host.into(),
                    fingerprints: "SHA256:test".into(),
                });
            }
            self.reads
                .lock()
                .unwrap()
                .push((host.to_string(), path.to_string()));
            Ok(self.files.get(host, path))
        }
    }

    #[test]
    fn inspect_reads_pem_and_kubeconfigs_and_says_what_is_wrong() {
        let now = at(2036, 11, 1);
        let apiserver = &KUBEADM_CERTIFICATES[1];
        let admin = &KUBEADM_CERTIFICATES[0];
        let s = inspect(apiserver, Some(CA.as_bytes()), now);
        assert_eq!(s.state, CertState::Valid);
        assert_eq!(s.subject.as_deref(), Some("kubernetes"));
        assert_eq!(
            s.not_after,
            Some(Utc.with_ymd_and_hms(2036, 11, 18, 11, 16, 51).unwrap())
        );
        assert_eq!(s.residual(), "17d");
        let s = inspect(admin, Some(kubeconfig(CA).as_bytes()), now);
        assert_eq!(
            (s.state, s.residual()),
            (CertState::Valid, "17d".to_string())
        );

        let s = inspect(apiserver, Some(CA.as_bytes()), at(2036, 11, 20));
        assert_eq!(
            (s.state, s.residual()),
            (CertState::Expired, "expired 1d ago".to_string())
        );
        assert_eq!(inspect(apiserver, None, now).state, CertState::Missing);

        for (known, content, why) in [
            (apiserver, "not a certificate", "no PEM CERTIFICATE block"),
            (admin, "users: []\n", "no user"),
            (
                admin,
                "users:\n- name: x\n  user:\n    client-certificate: /var/lib/kubelet/pki/c.pem\n",
                "not embedded",
            ),
            (
                admin,
                "users:\n- name: x\n  user:\n    client-certificate-data: '!!'\n",
                "client-certificate-data",
            ),
            (admin, ": [", "not a kubeconfig"),
        ] {
            let s = inspect(known, Some(content.as_bytes()), now);
            assert_eq!(s.state, CertState::Invalid, "{content}");
            assert!(
                s.error.as_deref().unwrap_or("").contains(why),
                "{content}: {:?}",
                s.error
            );
        }
    }

    #[tokio::test]
    async fn read_covers_every_control_plane_and_only_this_clusters() {
        let fake = Fake {
            unknown_key: vec!["cp3".into()],
            ..Fake::default()
        };
        let ts = targets(&hosts(4, 1));
        let me = owner();
        fake.control_plane("cp1", &me);
        let other = Owner {
            uid: "fedcba9876543210".into(),
            cluster: "other.example.com".into(),
            store: "s3://elsewhere".into(),
        };
        fake.control_plane("cp2", &other);
        fake.control_plane("cp4", &me);
        // cp4 runs no etcd (external etcd): its etcd certificates are missing, not invalid.
        for k in KUBEADM_CERTIFICATES
            .iter()
            .filter(|k| k.name.starts_with("etcd-"))
        {
            fake.files
                .lock()
                .unwrap()
                .remove(&("cp4".to_string(), k.path.to_string()));
        }
        let cps = control_planes(&ts);
        let r = read_with(&fake, "demo.example.com", &cps, Some(&me), at(2036, 11, 1)).await;
        let states: Vec<_> = r.hosts.iter().map(|h| (h.host.as_str(), h.state)).collect();
        assert_eq!(
            states,
            [
                ("cp1", HostState::Read),
                ("cp2", HostState::NotOwned),
                ("cp3", HostState::HostKeyNotRecorded),
                ("cp4", HostState::Read),
            ]
        );
        assert!(
            r.hosts[1]
                .reason
                .as_deref()
                .unwrap()
                .contains("other.example.com")
        );
        // The other cluster's host: its marker is read, nothing else.
        assert_eq!(fake.reads_on("cp2"), [OWNER_FILE]);
        assert!(fake.reads_on("w1").is_empty(), "a worker was read");
        // Plus the kubelet's client certificate.
        assert_eq!(
            r.hosts[0].certificates.len(),
            KUBEADM_CERTIFICATES.len() + 1
        );
        let missing: Vec<_> = r.hosts[3]
            .certificates
            .iter()
            .filter(|c| c.state == CertState::Missing)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            missing,
            [
                "etcd-healthcheck-client",
                "etcd-peer",
                "etcd-server",
                "etcd-ca"
            ]
        );
        assert!(r.invalid().is_empty());
        assert!(
            r.hosts[0]
                .certificates
                .iter()
                .all(|c| c.state == CertState::Valid)
        );
        // All expire within 30 days of 2036-11-01, CAs included.
        assert_eq!(
            r.expiring(WARN_WITHIN).len(),
            2 * (KUBEADM_CERTIFICATES.len() + 1) - 4
        );
        assert!(r.expiring(Duration::from_secs(86_400)).is_empty());
        assert_eq!(r.unread().len(), 2);

        // A cluster that never claimed a host contacts none.
        let quiet = Fake::default();
        let r = read_with(&quiet, "demo.example.com", &cps, None, at(2036, 11, 1)).await;
        assert!(r.hosts.iter().all(|h| h.state == HostState::NotOwned));
        assert!(quiet.reads.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_kubelet_client_certificate_is_followed_only_into_its_directory() {
        let fake = Fake::default();
        let now = at(2036, 11, 1);
        let conf = crate::provision::render::KUBELET_CONF;
        let pem = "/var/lib/kubelet/pki/kubelet-client-current.pem";
        let file_conf = |path: &str| {
            format!(
                "users:\n- name: n\n  user:\n    client-certificate: {path}\n    client-key: {path}\n"
            )
        };
        // kubeadm 1.17+: the kubelet's rotating file.
        fake.put("cp1", conf, &file_conf(pem));
        fake.put(
            "cp1",
            pem,
            &format!("{CA}-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n"),
        );
        let c = kubelet_client(&fake, "cp1", now).await.unwrap();
        assert_eq!(
            (c.state, c.renewed_by, c.path.as_str(), c.note.is_none()),
            (CertState::Valid, RenewedBy::Kubelet, pem, true)
        );
        // An old kubeadm's embedded certificate: nobody rotates it, and the note says so.
        fake.put("cp2", conf, &kubeconfig(CA));
        let c = kubelet_client(&fake, "cp2", now).await.unwrap();
        assert_eq!(
            (c.state, c.renewed_by),
            (CertState::Valid, RenewedBy::Manual)
        );
        assert!(c.note.unwrap().contains("does not rotate"));
        // A path elsewhere is not read.
        fake.put("cp3", conf, &file_conf("/etc/shadow"));
        fake.put(
            "cp4",
            conf,
            &file_conf("/var/lib/kubelet/pki/../../../../etc/shadow"),
        );
        for h in ["cp3", "cp4"] {
            let c = kubelet_client(&fake, h, now).await.unwrap();
            assert_eq!(c.state, CertState::Invalid, "{h}");
            assert!(
                !fake.reads_on(h).iter().any(|p| p.contains("shadow")),
                "{h}"
            );
        }
        // No kubelet.conf: missing.
        let c = kubelet_client(&fake, "cp5", now).await.unwrap();
        assert_eq!(c.state, CertState::Missing);
    }

    #[tokio::test]
    async fn roll_goes_one_control_plane_at_a_time_and_stops_at_a_failure() {
        let ts = targets(&hosts(3, 1));
        let cps = control_planes(&ts);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let events: RotateEvents = {
            let seen = seen.clone();
            Arc::new(move |e: &RotateEvent| seen.lock().unwrap().push(e.clone()))
        };
        let ok = Fake::default();
        let rolled = roll(&ok, &cps, &RotateOptions::default(), &|| Ok(()), &events)
            .await
            .unwrap();
        let order: Vec<_> = ok.steps.lock().unwrap().clone();
        let want: Vec<(String, String)> = ["cp1", "cp2", "cp3"]
            .iter()
            .flat_map(|h| {
                [STEP_RENEW, STEP_RESTART, STEP_HEALTH]
                    .iter()
                    .map(move |s| (h.to_string(), s.to_string()))
            })
            .collect();
        assert_eq!(order, want);
        assert_eq!(
            rolled
                .renewed
                .iter()
                .map(|(h, _)| h.as_str())
                .collect::<Vec<_>>(),
            ["cp1", "cp2", "cp3"]
        );
        assert!(rolled.failed.is_none());
        assert_eq!(
            seen.lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, RotateEvent::HostDone { .. }))
                .count(),
            3
        );

        // cp2's API server does not come back: cp3 is not touched.
        let failing = Fake {
            fail_step: Some(("cp2".into(), STEP_HEALTH.into())),
            ..Fake::default()
        };
        let rolled = roll(
            &failing,
            &cps,
            &RotateOptions::default(),
            &|| Ok(()),
            &events,
        )
        .await
        .unwrap();
        assert_eq!(rolled.renewed.len(), 1);
        let (host, why) = rolled.failed.unwrap();
        assert_eq!(host, "cp2");
        assert!(why.contains("not healthy"), "{why}");
        assert_eq!(rolled.not_started, ["cp3"]);
        assert!(
            failing
                .steps
                .lock()
                .unwrap()
                .iter()
                .all(|(h, _)| h != "cp3")
        );

        // The lock lost before a host: stop, touch nothing more.
        let lost = Fake::default();
        let err = roll(
            &lost,
            &cps,
            &RotateOptions::default(),
            &|| {
                Err(lock::LockError::Lost {
                    cluster: "demo.example.com".into(),
                    reason: "test".into(),
                })
            },
            &events,
        )
        .await;
        assert!(err.is_err());
        assert!(lost.steps.lock().unwrap().is_empty());
    }

    #[test]
    fn steps_quote_their_values_and_restore_manifests_first() {
        let steps = rotation_steps(&RotateOptions {
            static_pod_wait: Duration::from_secs(7),
            health_timeout: Duration::from_secs(9),
            ..RotateOptions::default()
        });
        assert_eq!(steps[0].run, "set -eu\nkubeadm certs renew all\n");
        let restart = &steps[1].run;
        assert!(restart.contains("sleep '7'"), "{restart}");
        assert!(restart.contains("trap restore EXIT"), "{restart}");
        assert!(
            restart.find("restore\ntrap").unwrap()
                < restart.find("mv \"$manifests/$c.yaml\"").unwrap(),
            "{restart}"
        );
        assert!(steps[2].run.contains("timeout='9'"), "{}", steps[2].run);
        assert!(steps[2].timeout > Duration::from_secs(9));
    }
}
