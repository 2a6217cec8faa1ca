//! Kubernetes versions kprov can install. The provisioning asset table pins checksums for
//! exactly these; a version outside the list is refused at validation, not at install time.

/// Supported minor versions, oldest first (upstream supports the newest three or four).
pub const SUPPORTED_MINORS: &[(u32, u32)] = &[(1, 32), (1, 33), (1, 34), (1, 35)];
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.34.2";

/// Parses `1.34.2` or `v1.34.2` into (major, minor, patch).
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
    parse(v).is_some_and(|(ma, mi, _)| SUPPORTED_MINORS.contains(&(ma, mi)))
}

pub fn supported_list() -> String {
    SUPPORTED_MINORS
        .iter()
        .map(|(a, b)| format!("{a}.{b}"))
        .collect::<Vec<_>>()
        .join(", ")
}
