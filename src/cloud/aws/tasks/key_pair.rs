//! The cluster's SSH key pair (`spec.sshKey`), imported from the operator's public key. EC2
//! names it by its name and keeps no copy of the key to compare: the key's SHA-256, in a tag,
//! is the field the diff compares, and a new key is a new key pair. The key itself is an input
//! only apply sees: never compared, never printed.

use std::fmt;

use aws_sdk_ec2::types::ResourceType;

use super::{Apply, Codec, Task};
use crate::cloud::aws::ec2::tag_spec;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{Ctx, id_from};
use crate::cloud::engine::{CloudError, CloudId, Resource};

const PUBLIC_KEY_SHA256: &str = "publicKeySha256";
/// Where the hash is kept on the key pair.
const TAG_KEY_HASH: &str = "kprov.dev/public-key-sha256";

task! {
    struct KeyPair: AwsKind::Ec2(Ec2Kind::KeyPair), listed aws_sdk_ec2::types::KeyPairInfo as k;
    /// Also its cloud ID: EC2 names a key pair by its name.
    key_name: String = KEY_NAME("keyName"), Replace
        // why: never absent here: the reader skips a key pair listed without its name
        <- k.key_name().unwrap_or_default().to_string();
    public_key_sha256: String = PUBLIC_KEY_SHA256, Replace
        <- k
            .tags()
            .iter()
            .find(|t| t.key() == Some(TAG_KEY_HASH))
            .and_then(|t| t.value())
            // why: a key pair without the hash tag reads as none, which the diff shows as a change
            .unwrap_or_default()
            .to_string();
    /// On the desired key pair only (a read cannot get it back).
    public_key: Option<PublicKey> = PUBLIC_KEY("publicKey") as Input <- None;
}

/// An OpenSSH public key, trimmed. Shown (`Debug`) as a placeholder: its hash is what a
/// reader is shown.
#[derive(Clone, PartialEq)]
pub(crate) struct PublicKey(pub(crate) String);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PublicKey(..)")
    }
}

/// The key as an input of the engine's resource: apply hands it back, the diff never sees it.
enum Input {}

impl Codec<Option<PublicKey>> for Input {
    fn put(v: &Option<PublicKey>, r: Resource, field: &str) -> Resource {
        match v {
            Some(k) => r.input(field, k.0.clone()),
            None => r,
        }
    }

    fn take(r: &Resource, field: &str) -> Result<Option<PublicKey>, CloudError> {
        Ok(r.inputs.get(field).cloned().map(PublicKey))
    }
}

impl Task for KeyPair {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        let key = self
            .public_key
            .as_ref()
            .ok_or_else(|| CloudError::Model(format!("{id}: input {PUBLIC_KEY} is not set")))?;
        a.ec2
            .import_key_pair()
            .key_name(&self.key_name)
            .public_key_material(aws_smithy_types::Blob::new(key.0.as_bytes()))
            .tag_specifications(tag_spec(
                a.c,
                ResourceType::KeyPair,
                &id,
                &[(TAG_KEY_HASH, self.public_key_sha256.as_str())],
            ))
            .send()
            .await
            .ctx("ImportKeyPair")?;
        id_from(&id, "field keyName", &self.key_name)
    }
}

delete_by_id!(KeyPair: ec2.delete_key_pair().key_name, "DeleteKeyPair");
