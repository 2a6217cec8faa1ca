//! Parsing state store URLs: `file://DIR` and `s3://BUCKET[/PREFIX]`.

use std::path::PathBuf;

use super::StateError;

/// Where a state store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A local directory; relative paths are relative to the working directory.
    File(PathBuf),
    /// An S3 bucket and a key prefix without leading or trailing `/` (may be empty).
    S3 {
        /// The bucket's name.
        bucket: String,
        /// The key prefix every object of the store is under.
        prefix: String,
    },
}

impl StoreUrl {
    /// Parses `file://DIR` or `s3://BUCKET[/PREFIX]`; the error names the URL and suggests
    /// the likely intended one (`/x` is `file:///x`).
    pub fn parse(url: &str) -> Result<StoreUrl, StateError> {
        let invalid = |reason: String| StateError::InvalidUrl {
            url: url.to_string(),
            reason,
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid(missing_scheme_hint(url)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "file" => parse_file(rest).map_err(invalid),
            "s3" => parse_s3(rest).map_err(invalid),
            other => Err(invalid(format!(
                "unsupported scheme {other:?}; use file://DIR or s3://BUCKET/PREFIX"
            ))),
        }
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::File(dir) => write!(f, "file://{}", dir.display()),
            StoreUrl::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            StoreUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

fn missing_scheme_hint(url: &str) -> String {
    if url.trim().is_empty() {
        return "the URL is empty; use file://DIR or s3://BUCKET/PREFIX".into();
    }
    if let Some(rest) = url.strip_prefix("s3:") {
        return format!(
            "missing '//' after 's3:'; did you mean s3://{}?",
            rest.trim_start_matches('/')
        );
    }
    if let Some(rest) = url.strip_prefix("file:") {
        return format!("missing '//' after 'file:'; did you mean file://{rest}?");
    }
    format!("a bare path has no scheme; did you mean file://{url}?")
}

fn parse_file(rest: &str) -> Result<StoreUrl, String> {
    if rest.is_empty() {
        return Err("file:// needs a directory, e.g. file:///var/lib/kprov or file://state".into());
    }
    // `file://localhost/x` is the RFC 8089 spelling of `/x`; anything else before the first
    // '/' is a relative path (kops accepts `file://relative` too).
    let path = rest
        .strip_prefix("localhost/")
        .map_or(rest.to_string(), |p| format!("/{p}"));
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if path.contains('?') || path.contains('#') {
        return Err("query strings and fragments are not supported in file:// URLs".into());
    }
    Ok(StoreUrl::File(PathBuf::from(path)))
}

fn parse_s3(rest: &str) -> Result<StoreUrl, String> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err("s3:// needs a bucket name, e.g. s3://my-kprov-state".into());
    }
    check_bucket_name(bucket)?;
    if prefix.contains('?') || prefix.contains('#') {
        return Err("query strings and fragments are not supported in s3:// URLs".into());
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        super::validate_key(prefix).map_err(|e| match e {
            StateError::InvalidKey { reason, .. } => format!("prefix {prefix:?}: {reason}"),
            other => other.to_string(),
        })?;
    }
    Ok(StoreUrl::S3 {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    })
}

/// The S3 naming rules for general purpose buckets, so a typo fails here and not as an
/// opaque signature or DNS error from the SDK.
fn check_bucket_name(bucket: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("bucket name {bucket:?} {why}"));
    if !(3..=63).contains(&bucket.len()) {
        return bad("must be 3 to 63 characters long");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return bad("may contain only lowercase letters, digits, '-' and '.'");
    }
    let edges = [bucket.as_bytes()[0], bucket.as_bytes()[bucket.len() - 1]];
    if edges
        .iter()
        .any(|b| !(b.is_ascii_lowercase() || b.is_ascii_digit()))
    {
        return bad("must begin and end with a letter or digit");
    }
    if bucket.contains("..") {
        return bad("must not contain two adjacent periods");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn err(url: &str) -> String {
        StoreUrl::parse(url).unwrap_err().to_string()
    }

    /// Each URL is refused with a message that contains the text paired with it.
    fn refused(cases: &[(&str, &str)]) {
        for (url, want) in cases {
            let e = err(url);
            assert!(e.contains(want), "{url}: {e}");
        }
    }

    #[test]
    fn file_urls() {
        for (url, dir) in [
            ("file:///var/lib/kprov", "/var/lib/kprov"),
            ("file://state/dev", "state/dev"),
            ("file://./state", "./state"),
            ("file://localhost/srv/kprov", "/srv/kprov"),
        ] {
            assert_eq!(
                StoreUrl::parse(url).unwrap(),
                StoreUrl::File(dir.into()),
                "{url}"
            );
        }
        assert!(err("file://").contains("needs a directory"));
    }

    #[test]
    fn s3_urls() {
        for (url, prefix) in [("s3://my-state", ""), ("s3://my-state/teams/a/", "teams/a")] {
            let want = StoreUrl::S3 {
                bucket: "my-state".into(),
                prefix: prefix.into(),
            };
            assert_eq!(StoreUrl::parse(url).unwrap(), want, "{url}");
        }
        refused(&[
            ("s3://", "needs a bucket"),
            ("s3://My_Bucket", "lowercase"),
            ("s3://ab", "3 to 63"),
            ("s3://bucket/a/../b", "'..'"),
        ]);
    }

    #[test]
    fn errors_name_the_url_and_suggest_a_fix() {
        refused(&[
            ("/var/lib/kprov", "\"/var/lib/kprov\""),
            ("/var/lib/kprov", "did you mean file:///var/lib/kprov?"),
            ("state", "did you mean file://state?"),
            ("s3:bucket/x", "did you mean s3://bucket/x?"),
            ("gs://bucket", "unsupported scheme \"gs\""),
            ("", "empty"),
        ]);
    }

    #[test]
    fn display_round_trips() {
        for url in [
            "file:///a/b",
            "file://rel",
            "s3://bucket",
            "s3://bucket/p/q",
        ] {
            assert_eq!(StoreUrl::parse(url).unwrap().to_string(), url);
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = StoreUrl::parse(&s);
        }

        #[test]
        fn s3_parse_never_panics(s in "s3://[a-z0-9./_-]{0,70}") {
            if let Ok(url) = StoreUrl::parse(&s) {
                // Whatever parses must print back to something that parses to the same value.
                prop_assert_eq!(StoreUrl::parse(&url.to_string()).unwrap(), url);
            }
        }
    }
}
