//! Image pins: the `ami-` ID an image name pattern resolved to when it was first applied,
//! kept in the store (`<cluster>/status/images`) and read back at every plan.
//!
//! A name pattern such as kprov's default (`099720109477/ubuntu/images/...-server-*`) resolves
//! to the newest matching image. Resolved again at every plan, the day the publisher adds an
//! image every launch template would change and every instance show as needing a roll, with no
//! change by the user. So the first `update cluster --yes` pins what each pattern resolved to;
//! later plans use the pin, and a newer image is only mentioned. Moving to it is asked for
//! (`kprov update cluster --refresh-image`, or another `spec.image`), and shown in the preview
//! as the launch template's image change.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateError, StateStore};

/// The store holds a few patterns' pins; anything much larger is not a pins document.
const MAX_DOCUMENT: usize = 64 * 1024;

/// One image: its `ami-` ID and the account that published it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PinnedImage {
    pub(crate) id: String,
    pub(crate) owner: String,
}

/// Image name (as `spec.image` spells it) → the image it is pinned to.
pub(crate) type ImagePins = BTreeMap<String, PinnedImage>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    images: ImagePins,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum PinError {
    #[error("pinned images of cluster {cluster}: {source}")]
    Store {
        cluster: String,
        #[source]
        source: StateError,
    },
    #[error(
        "pinned images in {location}: {message}; `kprov update cluster {cluster} --refresh-image --yes` writes them again"
    )]
    Invalid {
        cluster: String,
        location: String,
        message: String,
    },
}

/// `ami-` and hex digits, as EC2 makes them: the store is a trust boundary and the ID goes
/// into launch templates.
fn valid_id(id: &str) -> bool {
    id.strip_prefix("ami-")
        .is_some_and(|h| !h.is_empty() && h.len() <= 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// An account ID (digits) or an alias AWS itself uses.
fn valid_owner(owner: &str) -> bool {
    (!owner.is_empty() && owner.len() <= 32 && owner.bytes().all(|b| b.is_ascii_digit()))
        || ["amazon", "aws-marketplace"].contains(&owner)
}

fn parse(cluster: &str, location: &str, data: &[u8]) -> Result<ImagePins, PinError> {
    let invalid = |message: String| PinError::Invalid {
        cluster: cluster.to_string(),
        location: location.to_string(),
        message,
    };
    crate::state::check_size(data, MAX_DOCUMENT, MAX_DOCUMENT).map_err(invalid)?;
    let doc: Document =
        serde_json::from_slice(data).map_err(|e| invalid(format!("not a pins document: {e}")))?;
    for (name, pin) in &doc.images {
        if !valid_id(&pin.id) {
            return Err(invalid(format!(
                "image {:?}: {:?} is not an image ID",
                crate::output::escape(name),
                crate::output::escape(&pin.id)
            )));
        }
        if !valid_owner(&pin.owner) {
            return Err(invalid(format!(
                "image {:?}: {:?} is not an account",
                crate::output::escape(name),
                crate::output::escape(&pin.owner)
            )));
        }
    }
    Ok(doc.images)
}

/// The cluster's pins; none before the first `update cluster --yes`.
pub(crate) async fn load(store: &dyn StateStore, cluster: &str) -> Result<ImagePins, PinError> {
    let err = |source| PinError::Store {
        cluster: cluster.to_string(),
        source,
    };
    let key = ClusterKeys::new(cluster).map_err(err)?.pinned_images();
    match store.get(&key).await.map_err(err)? {
        Some(o) => parse(cluster, &store.key_location(&key), &o.data),
        None => Ok(ImagePins::new()),
    }
}

/// Writes `pins` (the images the applied launch templates use) when they differ from what
/// the store holds. Called under the cluster lock, so no compare-and-swap is needed.
pub(crate) async fn save(
    store: &dyn StateStore,
    cluster: &str,
    pins: &ImagePins,
) -> Result<bool, PinError> {
    if load(store, cluster).await.ok().as_ref() == Some(pins) {
        return Ok(false);
    }
    let err = |source| PinError::Store {
        cluster: cluster.to_string(),
        source,
    };
    let key = ClusterKeys::new(cluster).map_err(err)?.pinned_images();
    let doc = Document {
        images: pins.clone(),
    };
    // why: serializing a map of strings cannot fail
    let text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    store
        .put(&key, Bytes::from(text), Precondition::None)
        .await
        .map_err(err)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pins_document_round_trips_and_bad_values_are_refused_with_their_place() {
        let pins: ImagePins = [(
            "099720109477/ubuntu/images/x-*".to_string(),
            PinnedImage {
                id: "ami-0abc123".into(),
                owner: "099720109477".into(),
            },
        )]
        .into();
        let text = serde_json::to_vec(&Document {
            images: pins.clone(),
        })
        .expect("json");
        assert_eq!(
            parse("c", "mem://c/status/images", &text).expect("parse"),
            pins
        );
        for (bad, why) in [
            (
                r#"{"images":{"x":{"id":"ami-; rm","owner":"1"}}}"#,
                "is not an image ID",
            ),
            (
                r#"{"images":{"x":{"id":"ami-12","owner":"me"}}}"#,
                "is not an account",
            ),
            (r#"{"images":{}, "more": 1}"#, "not a pins document"),
        ] {
            let e = parse("c", "mem://c/status/images", bad.as_bytes())
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains(why)
                    && e.contains("mem://c/status/images")
                    && e.contains("--refresh-image"),
                "{e}"
            );
        }
    }
}
