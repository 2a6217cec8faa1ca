//! Kubernetes versions kprov can install: exactly those whose binaries have pinned checksums
//! in the provisioning asset table. A version outside the list is refused at validation, not
//! half-way through an install.

use crate::provision::assets::{
    DEFAULT_KUBERNETES_VERSION as PINNED_DEFAULT, SUPPORTED_KUBERNETES_VERSIONS,
};

pub const DEFAULT_KUBERNETES_VERSION: &str = PINNED_DEFAULT;

/// Parses `1.35.1` or `v1.35.1` into (major, minor, patch).
pub fn parse(v: &str) -> Option<(u32, u32, u32)> {
    let v = v.strip_prefix('v').unwrap_or(v);
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let patch = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

pub fn is_supported(v: &str) -> bool {
    SUPPORTED_KUBERNETES_VERSIONS.contains(&v.strip_prefix('v').unwrap_or(v))
}

/// Supported, or a newer patch of a known minor whose checksums the spec pins
/// (`spec.assets.checksums`, written by `create cluster`).
pub fn is_installable(v: &str, assets: Option<&crate::spec::Assets>) -> bool {
    crate::provision::assets::installable(v, assets)
}

/// The supported versions as ranges per minor (`1.34.0-1.34.11, …`), for error messages.
pub fn supported_list() -> String {
    crate::provision::assets::supported_summary()
}
