//! The etcd membership of a cluster's etcd hosts, read and changed over SSH with etcdctl in
//! the host's running `etcd` container (with the etcd static pod's certificates, as `kubeadm
//! reset` does): shared by `delete instance`, the roll's control-plane replacement and the
//! etcd health gate. The answer is written to a file under /run/kprov on that host, read back
//! bounded and removed again.

use anyhow::{Context, anyhow, bail};
use serde::Serialize;

use crate::spec::Host;
use crate::ssh::task::{HostExecutor, Step};

/// Largest etcdctl answer read back from a host.
const ETCD_ANSWER_LIMIT: usize = 1024 * 1024;
const ETCD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// One etcd member, as `etcdctl member list -w json` and `endpoint health` describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMember {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub healthy: bool,
}

impl EtcdMember {
    /// The member id as etcdctl prints and takes it (hex).
    pub(crate) fn hex_id(&self) -> String {
        format!("{:x}", self.id)
    }
}

/// etcd's rule for removing `removing`: the members left must still have a quorum of healthy
/// members, and the last member is never removed.
pub(crate) fn removal_keeps_quorum(members: &[EtcdMember], removing: u64) -> Result<(), String> {
    let remaining: Vec<&EtcdMember> = members.iter().filter(|m| m.id != removing).collect();
    if remaining.is_empty() {
        return Err(
            "it is the last etcd member: removing it would destroy the cluster's data".into(),
        );
    }
    let healthy = remaining.iter().filter(|m| m.healthy).count();
    let quorum = remaining.len() / 2 + 1;
    if healthy < quorum {
        let unhealthy: Vec<&str> = remaining
            .iter()
            .filter(|m| !m.healthy)
            .map(|m| m.name.as_str())
            .collect();
        return Err(format!(
            "removing it would lose etcd quorum: {} members would remain, {healthy} of them healthy, \
             and etcd needs {quorum} (unhealthy: {}); repair or remove the unhealthy members first",
            remaining.len(),
            unhealthy.join(", ")
        ));
    }
    Ok(())
}

/// Parses `etcdctl member list -w json` and `etcdctl endpoint health --cluster -w json`. A
/// member no health answer names is counted unhealthy.
pub(crate) fn parse_members(list: &str, health: &str) -> anyhow::Result<Vec<EtcdMember>> {
    let list: serde_json::Value =
        serde_json::from_str(list).context("etcdctl member list: not JSON")?;
    let health: serde_json::Value = if health.trim().is_empty() {
        serde_json::Value::Array(Vec::new())
    } else {
        serde_json::from_str(health).context("etcdctl endpoint health: not JSON")?
    };
    let healthy_endpoints: Vec<&str> = health
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["health"].as_bool() == Some(true))
        .filter_map(|h| h["endpoint"].as_str())
        .collect();
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let members = list["members"]
        .as_array()
        .ok_or_else(|| anyhow!("etcdctl member list: no \"members\""))?;
    members
        .iter()
        .map(|m| {
            let id = m["ID"]
                .as_u64()
                .ok_or_else(|| anyhow!("etcdctl member list: a member without a numeric ID"))?;
            let client_urls = strings(&m["clientURLs"]);
            Ok(EtcdMember {
                id,
                // A member added but not started yet has no name in etcd's list.
                name: m["name"].as_str().unwrap_or_default().to_string(),
                peer_urls: strings(&m["peerURLs"]),
                healthy: client_urls
                    .iter()
                    .any(|u| healthy_endpoints.contains(&u.as_str())),
                client_urls,
            })
        })
        .collect()
}

fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    }
}

/// The member of `host`: by name (kubeadm names members after the node), else by peer address.
pub(crate) fn member_of<'a>(members: &'a [EtcdMember], host: &Host) -> Option<&'a EtcdMember> {
    members.iter().find(|m| m.name == host.name).or_else(|| {
        let addresses: Vec<&str> = [
            Some(&host.address),
            host.ip.as_ref(),
            host.access_ip.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
        members
            .iter()
            .find(|m| m.peer_urls.iter().any(|u| addresses.contains(&url_host(u))))
    })
}

/// etcdctl inside the running etcd container, with the etcd static pod's certificates.
pub(crate) const ETCDCTL: &str = "id=$(crictl ps --name '^etcd$' --state running -q | head -n1)\n\
[ -n \"$id\" ] || { echo 'no running etcd container on this host' >&2; exit 1; }\n\
etcdctl() { crictl exec \"$id\" etcdctl --endpoints=https://127.0.0.1:2379 \
--cacert=/etc/kubernetes/pki/etcd/ca.crt \
--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt \
--key=/etc/kubernetes/pki/etcd/healthcheck-client.key \"$@\"; }\n";

const ANSWER_DIR: &str = "/run/kprov";

pub(crate) async fn etcd_members(
    exec: &dyn HostExecutor,
    via: &str,
) -> anyhow::Result<Vec<EtcdMember>> {
    etcd_members_with(exec, via, ETCDCTL).await
}

/// The member list and every member's health, read on `via`; `etcdctl` is shell code that
/// defines the `etcdctl` function the listing calls ([`ETCDCTL`] for kubeadm's static pod,
/// `Renderer::etcdctl_function` for host-deployed etcd).
pub(crate) async fn etcd_members_with(
    exec: &dyn HostExecutor,
    via: &str,
    etcdctl: &str,
) -> anyhow::Result<Vec<EtcdMember>> {
    let list_file = format!("{ANSWER_DIR}/etcd-members.json");
    let health_file = format!("{ANSWER_DIR}/etcd-health.json");
    let run = format!(
        "set -eu\numask 077\nmkdir -p {dir}\n{etcdctl}\
         etcdctl member list -w json > {list}\n\
         # Unhealthy endpoints make etcdctl exit non-zero; the JSON still lists every endpoint.\n\
         etcdctl endpoint health --cluster -w json > {health} 2>/dev/null || true\n",
        dir = crate::provision::shell::sh_quote(ANSWER_DIR),
        list = crate::provision::shell::sh_quote(&list_file),
        health = crate::provision::shell::sh_quote(&health_file),
    );
    exec.run_steps(
        via,
        &[Step {
            name: "etcd: list members".into(),
            files: Vec::new(),
            check: None,
            run,
            timeout: ETCD_TIMEOUT,
        }],
    )
    .await?;
    let answers = async {
        let list = read_answer(exec, via, &list_file, "etcdctl member list -w json", false).await?;
        let health = read_answer(
            exec,
            via,
            &health_file,
            "etcdctl endpoint health --cluster -w json",
            true,
        )
        .await?;
        Ok::<_, anyhow::Error>((list, health))
    }
    .await;
    // Cleaned up whether or not the answers were usable: the preview leaves nothing behind.
    let cleanup = crate::script!("rm -f {} {}", list_file, health_file);
    let cleaned = exec
        .run_steps(
            via,
            &[Step {
                name: "etcd: clean up".into(),
                files: Vec::new(),
                check: None,
                run: cleanup,
                timeout: ETCD_TIMEOUT,
            }],
        )
        .await;
    let (list, health) = answers?;
    cleaned?;
    parse_members(&list, &health).with_context(|| format!("etcd members read on {via}"))
}

/// Reads the file `command` wrote on `via`. The script creates it with a redirect before
/// etcdctl runs, so a missing file means the script did not get that far (or something removed
/// it): an error naming the file and the command, not an empty answer that would then fail as
/// "not JSON". `may_be_empty` is for the health answer, which etcdctl leaves empty when no
/// endpoint answers (every member is then counted unhealthy).
async fn read_answer(
    exec: &dyn HostExecutor,
    via: &str,
    path: &str,
    command: &str,
    may_be_empty: bool,
) -> anyhow::Result<String> {
    let b = exec.read_file(via, path).await?.ok_or_else(|| {
        anyhow!("{via}: {path} is missing: `{command}` should have written it there")
    })?;
    if b.len() > ETCD_ANSWER_LIMIT {
        bail!("{via}: {path} is larger than {ETCD_ANSWER_LIMIT} bytes");
    }
    let text = String::from_utf8(b.to_vec())
        .map_err(|_| anyhow!("{via}: {path} (the answer of `{command}`) is not UTF-8"))?;
    if !may_be_empty && text.trim().is_empty() {
        bail!("{via}: {path} is empty: `{command}` wrote no answer");
    }
    Ok(text)
}

pub(crate) async fn remove_member(
    exec: &dyn HostExecutor,
    via: &str,
    member: &EtcdMember,
) -> anyhow::Result<()> {
    let run = format!(
        "set -eu\n{ETCDCTL}{}",
        crate::script!("etcdctl member remove {}\n", member.hex_id())
    );
    exec.run_steps(
        via,
        &[Step {
            name: format!("etcd: remove member {} ({})", member.name, member.hex_id()),
            files: Vec::new(),
            check: None,
            run,
            timeout: ETCD_TIMEOUT,
        }],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::HostRole;
    use bytes::Bytes;
    use std::collections::HashMap;

    #[test]
    fn members_and_health_are_parsed_from_etcdctl_json() {
        let list = r#"{"header":{"cluster_id":1,"member_id":2,"raft_term":3},"members":[
            {"ID":10501334649042878790,"name":"cp1","peerURLs":["https://198.18.0.2:2380"],"clientURLs":["https://198.18.0.2:2379"]},
            {"ID":2,"name":"cp2","peerURLs":["https://198.18.0.3:2380"],"clientURLs":["https://198.18.0.3:2379"]},
            {"ID":3,"name":"","peerURLs":["https://[fd00::4]:2380"],"clientURLs":[]}]}"#;
        let health = r#"[{"endpoint":"https://198.18.0.2:2379","health":true,"took":"1ms"},
            {"endpoint":"https://198.18.0.3:2379","health":false,"error":"context deadline exceeded"}]"#;
        let m = parse_members(list, health).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].hex_id(), "91bc3c398fb3c146");
        assert!(m[0].healthy && !m[1].healthy && !m[2].healthy);
        let host = |name: &str, address: &str| {
            crate::spec::test_host(name, address, &[HostRole::ControlPlane])
        };
        assert_eq!(member_of(&m, &host("cp2", "x")).map(|m| m.id), Some(2));
        // A member not (yet) named is found by its peer address.
        assert_eq!(
            member_of(&m, &host("cp3", "fd00::4")).map(|m| m.id),
            Some(3)
        );
        assert!(member_of(&m, &host("cp9", "198.18.0.9")).is_none());
        assert!(parse_members("not json", "").is_err());
        assert!(parse_members(r#"{"members":[{"name":"x"}]}"#, "").is_err());
        // No health answer at all: nobody is counted healthy.
        assert!(parse_members(list, "").unwrap().iter().all(|m| !m.healthy));
    }

    /// An etcd host whose etcdctl wrote `files` (path → content); records the steps run.
    struct EtcdHost {
        files: HashMap<String, &'static str>,
        steps: std::sync::Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl HostExecutor for EtcdHost {
        async fn run_steps(
            &self,
            _host: &str,
            steps: &[Step],
        ) -> Result<Vec<crate::ssh::task::StepOutcome>, crate::ssh::task::ExecError> {
            let mut names = self.steps.lock().unwrap_or_else(|p| p.into_inner());
            names.extend(steps.iter().map(|s| s.name.clone()));
            Ok(vec![crate::ssh::task::StepOutcome::Changed; steps.len()])
        }

        async fn read_file(
            &self,
            _host: &str,
            path: &str,
        ) -> Result<Option<Bytes>, crate::ssh::task::ExecError> {
            Ok(self
                .files
                .get(path)
                .map(|t| Bytes::from_static(t.as_bytes())))
        }
    }

    fn etcd_host(list: Option<&'static str>, health: Option<&'static str>) -> EtcdHost {
        let mut files = HashMap::new();
        if let Some(l) = list {
            files.insert(format!("{ANSWER_DIR}/etcd-members.json"), l);
        }
        if let Some(h) = health {
            files.insert(format!("{ANSWER_DIR}/etcd-health.json"), h);
        }
        EtcdHost {
            files,
            steps: Default::default(),
        }
    }

    const LIST: &str = r#"{"members":[{"ID":2,"name":"cp2","peerURLs":["https://198.18.0.3:2380"],"clientURLs":["https://198.18.0.3:2379"]}]}"#;

    #[tokio::test]
    async fn a_missing_or_empty_etcdctl_answer_names_the_file_the_host_and_the_command() {
        let host = etcd_host(None, Some("[]"));
        let e = format!("{:#}", etcd_members(&host, "cp2").await.unwrap_err());
        assert!(
            e.contains("cp2: /run/kprov/etcd-members.json is missing")
                && e.contains("`etcdctl member list -w json` should have written it"),
            "{e}"
        );
        assert!(!e.contains("not JSON"), "{e}");
        // The answer files are removed even when the answer was unusable.
        assert_eq!(
            *host.steps.lock().unwrap(),
            ["etcd: list members", "etcd: clean up"]
        );

        let error = async |list, health| {
            let e = etcd_members(&etcd_host(list, health), "cp2").await;
            format!("{:#}", e.unwrap_err())
        };
        let e = error(Some(" \n"), Some("[]")).await;
        assert!(
            e.contains("cp2: /run/kprov/etcd-members.json is empty")
                && e.contains("`etcdctl member list -w json` wrote no answer"),
            "{e}"
        );
        let e = error(Some(LIST), None).await;
        assert!(
            e.contains("cp2: /run/kprov/etcd-health.json is missing")
                && e.contains("`etcdctl endpoint health --cluster -w json`"),
            "{e}"
        );

        // An empty health answer is what etcdctl leaves when no endpoint answers: every
        // member is then unhealthy, which is not an error.
        let m = etcd_members(&etcd_host(Some(LIST), Some("")), "cp2")
            .await
            .unwrap();
        assert_eq!(m.len(), 1);
        assert!(!m[0].healthy);
    }

    #[test]
    fn url_hosts() {
        assert_eq!(url_host("https://10.0.0.1:2380"), "10.0.0.1");
        assert_eq!(url_host("https://[fd00::1]:2380"), "fd00::1");
        assert_eq!(url_host("http://cp1"), "cp1");
    }
}
