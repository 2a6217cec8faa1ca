//! How kprov words an AWS SDK error for the user: shared by the cloud (`cloud::aws`) and the
//! S3 state store (`state::s3`), which must not depend on each other.

use aws_credential_types::provider::error::CredentialsError;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use crate::output::untrusted;

/// An SDK error as the user should read it: the service's code and message (and HTTP status),
/// or the chain of causes for errors that never reached a service; when no credentials were
/// found, which sources were tried and how to provide one. Never a `Debug` dump (which
/// `DisplayErrorContext` appends, with the raw response, headers and body).
pub(crate) fn describe_sdk_error<E, R>(e: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    if let Some(service) = e.as_service_error()
        && let Some(code) = service.code()
    {
        // The code and message are the service's text (or whoever answers in its place):
        // escaped here, where they enter kprov, so no error message built on them can pass
        // a control character (see docs/security.md).
        let message = untrusted(service.message().unwrap_or("(no message)"));
        let shown_code = untrusted(code);
        let status = e.raw_response().and_then(raw_status);
        // Say what the operator can do about it: wait, or retry.
        let hint = match (code, status) {
            ("SlowDown" | "Throttling" | "ThrottlingException" | "RequestLimitExceeded", _) => {
                " (throttled: retry later)"
            }
            (_, Some(s)) if s >= 500 => " (the service failed: retry)",
            _ => "",
        };
        return match status {
            Some(status) => format!("{shown_code}: {message} (HTTP {status}){hint}"),
            None => format!("{shown_code}: {message}{hint}"),
        };
    }
    // The causes quote the transport's and the reply's text: escaped likewise.
    let causes = |e: &SdkError<E, R>| untrusted(&causes(e)).to_string();
    let text = match e {
        // Missing credentials also fail the dispatch; retrying does not help there.
        _ if credentials_missing(e).is_some() => causes(e),
        SdkError::DispatchFailure(_) => {
            format!("the request did not get through (retry): {}", causes(e))
        }
        SdkError::TimeoutError(_) => format!("the request timed out (retry): {}", causes(e)),
        SdkError::ResponseError(_) => {
            format!("the reply could not be read (retry): {}", causes(e))
        }
        _ => causes(e),
    };
    match credentials_missing(e) {
        Some(CredentialsError::CredentialsNotLoaded(_)) => {
            format!("{}\n  ({text})", no_credentials_help())
        }
        Some(_) => format!(
            "{text}\n  the AWS credentials could not be loaded; {}",
            chain_tried()
        ),
        None => text,
    }
}

/// The HTTP status of a raw response, when the response type is the SDK's.
fn raw_status<R: std::fmt::Debug + 'static>(r: &R) -> Option<u16> {
    (r as &dyn std::any::Any)
        .downcast_ref::<aws_smithy_runtime_api::http::Response>()
        .map(|r| r.status().as_u16())
}

/// The `Display` texts of an error and its sources, each once.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let t = err.to_string();
        if !t.is_empty() && !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = err.source();
    }
    parts.join(": ")
}

fn credentials_missing<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a CredentialsError> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(c) = err.downcast_ref::<CredentialsError>() {
            return Some(c);
        }
        cur = err.source();
    }
    None
}

fn aws_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The default chain of the AWS SDK, in its order, with what this process has set.
fn chain_tried() -> String {
    let profile = aws_env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let home = || {
        std::env::home_dir()
            .map(|h| h.display().to_string())
            .unwrap_or_else(|| "~".into())
    };
    let config = aws_env("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{}/.aws/config", home()));
    let creds = aws_env("AWS_SHARED_CREDENTIALS_FILE")
        .unwrap_or_else(|| format!("{}/.aws/credentials", home()));
    let imds =
        if aws_env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            "EC2 instance metadata (IMDS; disabled by AWS_EC2_METADATA_DISABLED)"
        } else {
            "EC2 instance metadata (IMDS)"
        };
    format!(
        "tried, in order: the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), \
         profile {profile:?} of the shared files {config} and {creds} (including SSO and \
         credential_process there), a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE), \
         ECS container credentials, {imds}"
    )
}

fn no_credentials_help() -> String {
    let profile = aws_env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    format!(
        "no AWS credentials found: {}. Fix: export AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY, or run `aws configure --profile {profile}` (or `aws sso login \
         --profile {profile}` for SSO), or choose another profile with AWS_PROFILE",
        chain_tried()
    )
}
