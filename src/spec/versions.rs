//! Kubernetes versions kprov can install: exactly those whose binaries have pinned checksums
//! in the provisioning asset table. A version outside the list is refused at validation, not
//! half-way through an install.

pub(crate) use super::assets::parse;
use super::assets::{DEFAULT_KUBERNETES_VERSION as PINNED_DEFAULT, SUPPORTED_KUBERNETES_VERSIONS};

pub(crate) const DEFAULT_KUBERNETES_VERSION: &str = PINNED_DEFAULT;

pub(crate) fn is_supported(v: &str) -> bool {
    SUPPORTED_KUBERNETES_VERSIONS.contains(&v.strip_prefix('v').unwrap_or(v))
}

/// Supported, or a newer patch of a known minor whose checksums the spec pins
/// (`spec.assets.checksums`, written by `create cluster`).
pub(crate) fn is_installable(v: &str, assets: Option<&crate::spec::Assets>) -> bool {
    crate::spec::assets::installable(v, assets)
}

/// The supported versions as ranges per minor (`1.34.0-1.34.11, …`), for error messages.
pub(crate) fn supported_list() -> String {
    crate::spec::assets::supported_summary()
}
