//! kprov's own inventory: a `hosts:` list whose entries are exactly `spec::Host`.

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::{InventoryError, Located, yaml_error};
use crate::spec::Host;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    hosts: Vec<Spanned<Host>>,
}

/// Reads kprov's own inventory (`hosts:` entries as `spec.hosts` writes them), each host
/// with its line.
pub(crate) fn parse(text: &str, file: &str) -> Result<Vec<Located>, InventoryError> {
    let parsed: File = serde_saphyr::from_str(text).map_err(|e| yaml_error(file, &e))?;
    Ok(parsed
        .hosts
        .into_iter()
        .map(|s| Located {
            line: s.referenced.line() as usize,
            host: s.value,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::HostRole;
    use proptest::prelude::*;

    #[derive(serde::Serialize)]
    struct FileOut<'a> {
        hosts: &'a [Host],
    }

    /// Writes hosts in kprov's inventory format (what `parse` reads back).
    fn render(hosts: &[Host]) -> Result<String, serde_saphyr::SerializeError> {
        serde_saphyr::to_string(&FileOut { hosts })
    }

    const SAMPLE: &str = "\
hosts:
  - name: cp1
    address: 198.18.0.11
    roles: [control-plane, etcd]
  - name: w1
    address: 198.18.0.12
    ip: 10.0.0.12
    accessIP: 203.0.113.12
    user: debian
    port: 2222
    keyPath: ~/.ssh/id_ed25519
    bastion: jump@bastion.example.com
    roles: [node]
    labels: {disk: ssd}
    taints: [\"dedicated=db:NoSchedule\"]
";

    #[test]
    fn parses_with_lines() {
        let hosts = parse(SAMPLE, "inv.yaml").unwrap();
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[0].line, 2);
        assert_eq!(hosts[1].line, 5);
        let w1 = &hosts[1].host;
        assert_eq!(w1.roles, vec![HostRole::Node]);
        assert_eq!(w1.port, Some(2222));
        assert_eq!(w1.access_ip.as_deref(), Some("203.0.113.12"));
        assert_eq!(w1.labels.get("disk").map(String::as_str), Some("ssd"));
    }

    /// An unknown role and an unknown field are refused at their line, named.
    #[test]
    fn unknown_role_or_field_names_line() {
        for (line, name) in [
            ("roles: [control-plane, master]", "master"),
            ("rolez: [node]", "rolez"),
        ] {
            let text = format!("hosts:\n  - name: cp1\n    address: a\n    {line}\n");
            let err = parse(&text, "inv.yaml").unwrap_err().to_string();
            assert!(err.starts_with("inv.yaml:4:"), "{err}");
            assert!(err.contains(name), "{err}");
        }
    }

    fn arb_host() -> impl Strategy<Value = Host> {
        let word = "[a-z][a-z0-9-]{0,10}";
        (
            word,
            "[a-z0-9.]{1,20}",
            proptest::option::of("[0-9.]{1,15}"),
            proptest::option::of("[a-z]{1,8}"),
            proptest::option::of(1u16..),
            proptest::option::of("[a-z/~._-]{1,20}"),
            proptest::collection::vec(
                prop_oneof![
                    Just(HostRole::ControlPlane),
                    Just(HostRole::Node),
                    Just(HostRole::Etcd)
                ],
                0..3,
            ),
            proptest::collection::btree_map(word, "[ -~]{0,12}", 0..3),
            proptest::collection::vec("[a-z]{1,5}(=[a-z]{1,5})?:NoSchedule", 0..2),
        )
            .prop_map(
                |(name, address, ip, user, port, key_path, roles, labels, taints)| Host {
                    name,
                    address,
                    ip,
                    access_ip: None,
                    user,
                    port,
                    key_path,
                    bastion: None,
                    roles,
                    labels,
                    taints,
                },
            )
    }

    proptest! {
        #[test]
        fn round_trips(hosts in proptest::collection::vec(arb_host(), 1..5)) {
            let text = render(&hosts).unwrap();
            let back: Vec<Host> = parse(&text, "x").unwrap().into_iter().map(|l| l.host).collect();
            prop_assert_eq!(back, hosts);
        }

        #[test]
        fn never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text, "x");
        }
    }
}
