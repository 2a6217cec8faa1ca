//! `create sshpublickey` (kops's `create secret sshpublickey`): the SSH public key the
//! cluster's AWS instances get (their key pair and cloud-init's authorized keys) and kprov's
//! logins use, stored in the cluster's spec in the state store (`spec.sshKey.publicKey`) and
//! shown only by its fingerprint.

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::repo::Repo;
use crate::spec::SshKey;

/// A public key read from the user's file, checked as OpenSSH's one-line format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicKey {
    /// `ssh-ed25519 AAAA... comment`, trimmed.
    pub text: String,
    /// `SHA256:...` as `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

impl PublicKey {
    /// Reads and parses the user's public key file. A public key line is short: anything
    /// larger than 16 KiB is not one (and is never read whole).
    pub(crate) fn read(file: &std::path::Path) -> anyhow::Result<PublicKey> {
        let source = file.display().to_string();
        let text = crate::bounded::read_file(file, 16 * 1024)
            .map_err(|e| anyhow::anyhow!("reading {source}: {e}"))?;
        let text = String::from_utf8(text).map_err(|_| {
            anyhow::anyhow!("{source} is not an OpenSSH public key (not UTF-8 text)")
        })?;
        PublicKey::parse(&source, &text).map_err(anyhow::Error::msg)
    }

    /// Parses one OpenSSH public key line (`source` names the file in errors). A private key
    /// is refused without echoing a byte of it.
    pub(crate) fn parse(source: &str, text: &str) -> Result<PublicKey, String> {
        let line = text.trim();
        if line.contains("PRIVATE KEY") {
            return Err(format!(
                "{source} holds a private key; give the public one (usually the same name with .pub)"
            ));
        }
        if line.lines().count() != 1 {
            return Err(format!(
                "{source}: expected one public key line ('ssh-ed25519 AAAA... comment'), found {} lines",
                line.lines().count()
            ));
        }
        let mut parts = line.split_whitespace();
        let kind = parts.next().unwrap_or_default(); // a blank line: refused below as unknown
        let known =
            kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-");
        let blob = parts.next().and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .ok()
                .filter(|d| d.len() > 16)
        });
        let (true, Some(blob)) = (known, blob) else {
            return Err(format!(
                "{source} is not an OpenSSH public key (expected 'ssh-ed25519 AAAA... comment')"
            ));
        };
        // The blob names its own type first: a key whose two halves disagree is damaged.
        let named = blob
            .get(..4)
            .map(|n| u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize)
            .and_then(|n| blob.get(4..4 + n));
        if named != Some(kind.as_bytes()) {
            return Err(format!(
                "{source}: the key's data is not a {kind} key (the line is damaged)"
            ));
        }
        Ok(PublicKey {
            text: line.to_string(),
            fingerprint: fingerprint_of(&blob),
        })
    }
}

fn fingerprint_of(blob: &[u8]) -> String {
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(blob))
    )
}

/// The `SHA256:` fingerprint of a stored public key line; `None` when it is not one.
pub(crate) fn fingerprint(text: &str) -> Option<String> {
    PublicKey::parse("the key", text)
        .ok()
        .map(|k| k.fingerprint)
}

/// What [`set`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyChange {
    Unchanged,
    /// Stored; the fingerprint of the key it replaced, if any.
    Stored {
        replaced: Option<String>,
    },
}

/// Stores `key` as the cluster's SSH public key: a conditional write of the spec (a concurrent
/// edit is a conflict, never overwritten), validated as every stored spec is.
pub(crate) async fn set(repo: &Repo, name: &str, key: &PublicKey) -> anyhow::Result<KeyChange> {
    let stored = repo.get(name).await?;
    let mut cluster = stored.cluster.value.clone();
    let old = cluster
        .spec
        .ssh_key
        .as_ref()
        .and_then(|k| k.public_key.clone());
    if old.as_deref().map(str::trim) == Some(key.text.as_str()) {
        return Ok(KeyChange::Unchanged);
    }
    cluster
        .spec
        .ssh_key
        .get_or_insert_with(SshKey::default)
        .public_key = Some(key.text.clone());
    let mut with_key = stored.clone();
    with_key.cluster.value = cluster.clone();
    // Checked as a stored spec is checked on read, before anything is written.
    with_key.resolve(&repo.location())?;
    repo.put_cluster(&cluster, &stored.version).await?;
    repo.write_completed(&cluster, &stored.group_values())
        .await?;
    Ok(KeyChange::Stored {
        replaced: old.as_deref().and_then(fingerprint),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // `ssh-keygen -t ed25519 -N '' -C t@x`; `ssh-keygen -l -f` printed FINGERPRINT.
    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDrsgbU+KqPAyw9r0WAMIPvi7Q1jtYbcYY5+u6MiVLqO t@x";
    const FINGERPRINT: &str = "SHA256:m3sHvu8PwAWFP6Zjv38RrYxg3aQGY+zKGBLbDG+ip14";

    #[test]
    fn a_public_key_gets_ssh_keygens_fingerprint_and_anything_else_is_refused() {
        let k = PublicKey::parse("id.pub", &format!("{KEY}\n")).unwrap();
        assert_eq!(k.text, KEY);
        assert_eq!(k.fingerprint, FINGERPRINT);
        assert_eq!(fingerprint(KEY).as_deref(), Some(FINGERPRINT));
        let private = PublicKey::parse(
            "id",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
        )
        .unwrap_err();
        assert!(private.contains("holds a private key"), "{private}");
        assert!(!private.contains("b3BlbnNz"), "{private}");
        assert!(PublicKey::parse("x", "ssh-ed25519 notbase64!!").is_err());
        assert!(PublicKey::parse("x", &format!("{KEY}\n{KEY}")).is_err());
        // The type in the line and the one in the data differ.
        let lying = KEY.replace("ssh-ed25519", "ssh-rsa");
        assert!(
            PublicKey::parse("x", &lying)
                .unwrap_err()
                .contains("damaged")
        );
    }
}
