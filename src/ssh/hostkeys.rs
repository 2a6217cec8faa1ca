//! The cluster's known host keys, kept in the state store at `<cluster>/known_hosts` in
//! OpenSSH's known_hosts format, so every operator of a cluster checks the same keys.
//!
//! ssh itself does the checking (`StrictHostKeyChecking=yes` against a private file written
//! from the store); this module only decides what goes into that file, learns keys on first
//! contact (`ssh-keyscan`, only recorded with the operator's permission) and names
//! fingerprints in errors.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tokio::process::Command;

use crate::state::{Precondition, StateError, StateStore};

/// One `pattern keytype base64` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnownKey {
    pub(crate) pattern: String,
    pub(crate) key_type: String,
    pub(crate) key: String,
}

impl KnownKey {
    pub(crate) fn line(&self) -> String {
        format!("{} {} {}", self.pattern, self.key_type, self.key)
    }
}

/// Parses known_hosts text; comments, blank lines, markers (`@revoked`) and hashed or
/// malformed lines are skipped because kprov only ever stores plain lines it wrote itself.
pub(crate) fn parse(text: &str) -> Vec<KnownKey> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('@'))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(KnownKey {
                pattern: f.next()?.to_string(),
                key_type: f.next()?.to_string(),
                key: f.next()?.to_string(),
            })
        })
        .collect()
}

/// A cluster's known_hosts object larger than this is not one kprov wrote.
const KNOWN_HOSTS_LIMIT: usize = 1 << 20;

/// Reads one line of the cluster's known_hosts with the rules kprov writes it by
/// ([`KnownKey::line`]): `pattern keytype base64` (a comment may follow), the pattern a host name, an address
/// or `[host]:port`, a key type ssh offers, the key in base64, at most 16 KiB.
fn check_line(line: &str) -> Result<KnownKey, String> {
    use crate::output::untrusted;
    crate::state::check_size(line.as_bytes(), 16 << 10, "a key line's 16 KiB")?;
    // A comment after the key (a line pasted from a `.pub` file) is allowed and never used.
    let f: Vec<&str> = line.split_whitespace().collect();
    let [pattern, key_type, key, ..] = f.as_slice() else {
        return Err(format!(
            "{:?} is not `NAME KEYTYPE KEY`",
            untrusted(&line.chars().take(80).collect::<String>())
        ));
    };
    let pattern_ok = !pattern.is_empty()
        && pattern.len() <= 300
        && pattern
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:[]%".contains(&b));
    if !pattern_ok {
        return Err(format!("{:?} is not a host name", untrusted(pattern)));
    }
    let type_ok = matches!(
        *key_type,
        "ssh-ed25519"
            | "ssh-rsa"
            | "ecdsa-sha2-nistp256"
            | "ecdsa-sha2-nistp384"
            | "ecdsa-sha2-nistp521"
            | "sk-ssh-ed25519@openssh.com"
            | "sk-ecdsa-sha2-nistp256@openssh.com"
    );
    if !type_ok {
        return Err(format!("{:?} is not an SSH key type", untrusted(key_type)));
    }
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
    {
        return Err(format!("the key of {} is not base64", untrusted(pattern)));
    }
    Ok(KnownKey {
        pattern: pattern.to_string(),
        key_type: key_type.to_string(),
        key: key.to_string(),
    })
}

/// The stored known_hosts read with [`check_line`]: the good keys, and the damaged lines
/// (1-based number, reason), which are never used. Blank lines are kprov's own separators.
pub(crate) fn parse_checked(data: &[u8]) -> (Vec<KnownKey>, Vec<(usize, String)>) {
    let limit = format_args!("a known_hosts' {KNOWN_HOSTS_LIMIT}");
    if let Err(e) = crate::state::check_size(data, KNOWN_HOSTS_LIMIT, limit) {
        return (Vec::new(), vec![(0, e)]);
    }
    let mut good = Vec::new();
    let mut damaged = Vec::new();
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let checked = std::str::from_utf8(line)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(check_line);
        match checked {
            Ok(k) => good.push(k),
            Err(reason) => damaged.push((i + 1, reason)),
        }
    }
    (good, damaged)
}

/// What an error says about damaged lines of `location` (the cluster's known_hosts), with
/// the command that removes them.
pub(crate) fn damaged_message(
    location: &str,
    cluster: &str,
    damaged: &[(usize, String)],
) -> String {
    let lines: Vec<String> = damaged
        .iter()
        .map(|(n, reason)| match n {
            0 => crate::output::untrusted(reason).to_string(),
            n => format!("line {n}: {}", crate::output::untrusted(reason)),
        })
        .collect();
    format!(
        "the host keys {location} are damaged ({}); no key of them is used until that is \
         removed: `kprov delete damaged {cluster}` lists it and `kprov delete damaged {cluster} \
         --yes` removes the damaged lines",
        lines.join("; ")
    )
}

/// The name ssh looks a host key up under: the HostKeyAlias if configured, else the host
/// name, with the port in brackets when it is not 22.
pub(crate) fn pattern(hostname: &str, port: u16, alias: Option<&str>) -> String {
    match alias {
        Some(a) => a.to_string(),
        None if port == 22 => hostname.to_string(),
        None => format!("[{hostname}]:{port}"),
    }
}

pub(crate) fn store_key(cluster: &str) -> String {
    format!("{cluster}/known_hosts")
}

/// `SHA256:... (ED25519)` for each key, as `ssh-keygen -lf` computes them.
pub(crate) async fn fingerprints(keys: &[KnownKey], scratch: &Path) -> Result<Vec<String>, String> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let file = tempfile::NamedTempFile::new_in(scratch).map_err(|e| e.to_string())?;
    let text: String = keys.iter().map(|k| k.line() + "\n").collect();
    std::fs::write(file.path(), text).map_err(|e| e.to_string())?;
    let out = super::stdout_of(
        Command::new("ssh-keygen").arg("-lf").arg(file.path()),
        "ssh-keygen",
        "ssh-keygen -lf",
    )
    .await?;
    // `256 SHA256:abc 198.18.0.11 (ED25519)`
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(format!("{} {}", f.get(1)?, f.last()?))
        })
        .collect())
}

/// Asks the host for its keys without authenticating. Behind a bastion the scan runs on the
/// bastion, reached like ProxyJump reaches it (same ssh config, its key checked strictly).
pub(crate) async fn scan(
    hostname: &str,
    port: u16,
    pattern: &str,
    bastion: Option<&str>,
    ssh_config: Option<&Path>,
    timeout_secs: u64,
) -> Result<Vec<KnownKey>, String> {
    let scan_args = [
        "-T".to_string(),
        timeout_secs.to_string(),
        "-p".to_string(),
        port.to_string(),
        "-t".to_string(),
        "ed25519,ecdsa,rsa".to_string(),
        hostname.to_string(),
    ];
    let out = match bastion {
        None => Command::new("ssh-keyscan").args(&scan_args).output().await,
        Some(b) => {
            let remote = std::iter::once("ssh-keyscan".to_string())
                .chain(scan_args.iter().map(|a| shell_quote(a)))
                .collect::<Vec<_>>()
                .join(" ");
            let mut ssh = Command::new("ssh");
            if let Some(f) = ssh_config {
                ssh.arg("-F").arg(f);
            }
            ssh.args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
                .arg(format!("ssh://{b}"))
                .arg(remote)
                .output()
                .await
        }
    }
    .map_err(|e| format!("ssh-keyscan: {e}"))?;
    let keys: Vec<KnownKey> = parse(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .map(|k| KnownKey {
            pattern: pattern.to_string(),
            ..k
        })
        .collect();
    if keys.is_empty() {
        let via = bastion.map(|b| format!(" via {b}")).unwrap_or_default(); // no bastion: reached directly
        let stderr = String::from_utf8_lossy(&out.stderr);
        let detail: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect();
        let detail = crate::output::untrusted(&detail.join("; ")).to_string();
        // Through a bastion, the scan runs over an ssh to the bastion that checks its key
        // strictly: an unknown or changed bastion key is the reason, not the host.
        if let Some(b) = bastion.filter(|_| {
            stderr.contains("Host key verification failed")
                || stderr.contains("HOST IDENTIFICATION HAS CHANGED")
                || stderr.contains("No ED25519 host key is known")
                || stderr.contains("host key for")
        }) {
            return Err(format!(
                "cannot reach {hostname} port {port} through the bastion {b}: ssh does not \
                 trust the bastion's host key ({detail}). kprov checks a bastion's key against \
                 your own known_hosts: check its fingerprint with whoever runs it, then add it \
                 (connect once with `ssh ssh://{b}` and accept it, or append the checked line of \
                 `ssh-keyscan` to ~/.ssh/known_hosts)"
            ));
        }
        return Err(format!(
            "no host key from {hostname} port {port}{via} (host unreachable or no sshd listening){}{detail}",
            if detail.is_empty() { "" } else { ": " },
        ));
    }
    Ok(keys)
}

/// Quotes one word for a POSIX shell.
pub(crate) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Removes every key recorded under `pattern` (compare-and-swap, retried when another writer
/// got there first) and returns them; the next connection to that host is a first contact
/// again (recorded only with `--accept-new-host-keys`). How a host key is forgotten or
/// replaced without editing the store by hand.
pub(crate) async fn forget(
    store: &Arc<dyn StateStore>,
    cluster: &str,
    pattern: &str,
) -> Result<Vec<String>, StateError> {
    let key = store_key(cluster);
    for _ in 0..10 {
        let Some(current) = store.get(&key).await? else {
            return Ok(vec![]);
        };
        let text = String::from_utf8_lossy(&current.data).into_owned();
        let (gone, kept): (Vec<KnownKey>, Vec<KnownKey>) =
            parse(&text).into_iter().partition(|k| k.pattern == pattern);
        if gone.is_empty() {
            return Ok(vec![]);
        }
        let rest: String = kept.iter().map(|k| k.line() + "\n").collect();
        match store
            .put(
                &key,
                Bytes::from(rest),
                Precondition::Matches(current.version.clone()),
            )
            .await
        {
            Ok(_) => {
                return Ok(gone
                    .iter()
                    .map(|k| format!("{} {}", k.key_type, k.key))
                    .collect());
            }
            Err(StateError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StateError::Backend {
        location: store.location(),
        message: format!("{key} kept changing while kprov removed {pattern}'s keys"),
    })
}

/// Adds `keys` (all for one pattern) to the store with compare-and-swap, retrying when
/// another writer got there first. If meanwhile someone recorded *different* keys for the
/// same pattern, those win and are returned as the error, so the caller reports a change.
pub(crate) async fn record(
    store: &Arc<dyn StateStore>,
    cluster: &str,
    keys: &[KnownKey],
) -> Result<(), RecordError> {
    let key = store_key(cluster);
    for _ in 0..10 {
        let current = store.get(&key).await.map_err(RecordError::Store)?;
        let (mut text, cond) = match &current {
            Some(o) => (
                String::from_utf8_lossy(&o.data).into_owned(),
                Precondition::Matches(o.version.clone()),
            ),
            None => (String::new(), Precondition::Absent),
        };
        let existing: Vec<KnownKey> = parse(&text)
            .into_iter()
            .filter(|k| keys.iter().any(|n| n.pattern == k.pattern))
            .collect();
        if !existing.is_empty() {
            if existing.iter().any(|e| keys.contains(e)) {
                return Ok(());
            }
            return Err(RecordError::Differs(existing));
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for k in keys {
            text.push_str(&k.line());
            text.push('\n');
        }
        match store.put(&key, Bytes::from(text), cond).await {
            Ok(_) => return Ok(()),
            Err(StateError::Conflict { .. } | StateError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(RecordError::Store(e)),
        }
    }
    Err(RecordError::Store(StateError::Backend {
        location: store.key_location(&key),
        message: "gave up recording host keys after 10 conflicting concurrent writes".into(),
    }))
}

#[derive(Debug)]
pub(crate) enum RecordError {
    Store(StateError),
    /// The store already holds other keys for this host.
    Differs(Vec<KnownKey>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_follows_ssh_lookup_rules() {
        assert_eq!(pattern("10.0.0.1", 22, None), "10.0.0.1");
        assert_eq!(pattern("10.0.0.1", 2222, None), "[10.0.0.1]:2222");
        assert_eq!(pattern("10.0.0.1", 2222, Some("cp1")), "cp1");
    }

    #[test]
    fn parse_skips_what_kprov_never_writes() {
        let text =
            "# c\n\n@revoked * ssh-rsa AAA\nh1 ssh-ed25519 AAAA x\nbroken\n[h2]:2200 ssh-rsa BBB\n";
        let keys = parse(text);
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].line(), "h1 ssh-ed25519 AAAA");
        assert_eq!(keys[1].pattern, "[h2]:2200");
    }

    #[test]
    fn stored_keys_are_checked_line_by_line_and_damaged_lines_named() {
        let text = "h1 ssh-ed25519 AAAAC3Nz\n\n[h2]:2200 ssh-rsa AAAAB3=\n\
                    # a comment\n\
                    evil\u{1b}]52;c;eA==\u{7} ssh-ed25519 AAAA\n\
                    h3 ssh-dss AAAA\n\
                    h4 ssh-ed25519 AA$(x)\n\
                    h5 ssh-ed25519\n\
                    h6 ssh-ed25519 AAAA a comment\n";
        let (good, damaged) = parse_checked(text.as_bytes());
        assert_eq!(
            good.iter().map(KnownKey::line).collect::<Vec<_>>(),
            [
                "h1 ssh-ed25519 AAAAC3Nz",
                "[h2]:2200 ssh-rsa AAAAB3=",
                "h6 ssh-ed25519 AAAA"
            ]
        );
        assert_eq!(
            damaged,
            [
                (4, "\"#\" is not a host name".to_string()),
                (
                    5,
                    "\"evil\\x1b]52;c;eA==\\x07\" is not a host name".to_string()
                ),
                (6, "\"ssh-dss\" is not an SSH key type".to_string()),
                (7, "the key of h4 is not base64".to_string()),
                (
                    8,
                    "\"h5 ssh-ed25519\" is not `NAME KEYTYPE KEY`".to_string()
                ),
            ]
        );
        let (_, damaged) = parse_checked(b"h1 ssh-ed25519 \xff\xfe\n");
        assert_eq!(damaged, [(1, "not UTF-8".to_string())]);
        let msg = damaged_message("s3://b/c/known_hosts", "c", &damaged);
        assert_eq!(
            msg,
            "the host keys s3://b/c/known_hosts are damaged (line 1: not UTF-8); no key of them \
             is used until that is removed: `kprov delete damaged c` lists it and `kprov delete \
             damaged c --yes` removes the damaged lines"
        );
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(text in "\\PC*") {
            let _ = parse(&text);
        }

        #[test]
        fn lines_round_trip(
            keys in proptest::collection::vec(
                ("[a-z0-9.\\[\\]:-]{1,30}", "(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256)", "[A-Za-z0-9+/=]{1,80}"),
                0..8,
            )
        ) {
            let keys: Vec<KnownKey> = keys
                .into_iter()
                .map(|(pattern, key_type, key)| KnownKey { pattern, key_type, key })
                .collect();
            let text: String = keys.iter().map(|k| k.line() + "\n").collect();
            proptest::prop_assert_eq!(parse(&text), keys);
        }
    }

    #[test]
    fn shell_quote_round_trips_through_sh() {
        for s in ["plain", "with space", "it's", "", "$(x)`y`", "a\nb"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(s)))
                .output()
                .expect("sh");
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }
}
