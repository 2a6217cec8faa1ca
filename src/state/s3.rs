//! `s3://BUCKET/PREFIX`: the state store for teams.
//!
//! Compare-and-swap maps onto S3's conditional requests: create is `PutObject` with
//! `If-None-Match: *`, update is `PutObject` with `If-Match: <ETag>`, delete is
//! `DeleteObject` with `If-Match: <ETag>`. S3 answers a failed condition with 412
//! PreconditionFailed (409 ConditionalRequestConflict when two conditional writes to one key
//! overlap), which become `AlreadyExists` or `Conflict`.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::BucketVersioningStatus;
use bytes::Bytes;

use super::{Object, Precondition, StateError, StateStore, Version, Versioning};

/// The `s3://BUCKET/PREFIX` backend: one object per key under the prefix, compare-and-swap
/// by conditional writes on the object's ETag.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// Without trailing `/`; empty for the bucket's root.
    prefix: String,
    page_size: Option<i32>,
}

impl S3Store {
    /// A store in `bucket` under `prefix`, with the SDK settings in `sdk` (region, credentials,
    /// endpoint). Path-style addressing is used whenever the endpoint is overridden, because
    /// S3-compatible servers and emulators rarely resolve `BUCKET.host` names.
    pub fn new(sdk: &aws_config::SdkConfig, bucket: &str, prefix: &str) -> S3Store {
        S3Store::build(sdk, bucket, prefix, None)
    }

    /// [`S3Store::new`] signing for the bucket's own region. S3 refuses a request signed for
    /// another region (301 `PermanentRedirect`, the bucket's region in `x-amz-bucket-region`)
    /// and the Rust SDK does not follow it, so one state bucket serving clusters in several
    /// regions (kops's usual layout) needs the lookup: one HeadBucket, whose answer (success
    /// or the redirect) carries the region. A bucket that cannot be asked (missing, no
    /// permission) keeps the configured region; the first real request then says why.
    pub async fn open(sdk: &aws_config::SdkConfig, bucket: &str, prefix: &str) -> S3Store {
        let store = S3Store::new(sdk, bucket, prefix);
        let signing = store.client.config().region().map(|r| r.to_string());
        match store.bucket_region().await {
            Some(region) if Some(&region) != signing.as_ref() => {
                tracing::debug!(bucket, %region, "the state bucket is in another region");
                S3Store::build(sdk, bucket, prefix, Some(region))
            }
            _ => store,
        }
    }

    /// The bucket's region as S3 tells it (`x-amz-bucket-region`), when it does.
    async fn bucket_region(&self) -> Option<String> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(out) => out.bucket_region().map(str::to_string),
            Err(e) => e
                .raw_response()
                .and_then(|r| r.headers().get("x-amz-bucket-region"))
                .map(str::to_string),
        }
    }

    fn build(
        sdk: &aws_config::SdkConfig,
        bucket: &str,
        prefix: &str,
        region: Option<String>,
    ) -> S3Store {
        let mut conf = aws_sdk_s3::config::Builder::from(sdk);
        if sdk.endpoint_url().is_some() {
            conf = conf.force_path_style(true);
        }
        if let Some(region) = region {
            conf = conf.region(aws_config::Region::new(region));
        } else if sdk.region().is_none() {
            // The SDK cannot sign without a region; us-east-1 reaches every bucket's
            // redirect, and the error then tells the user to set AWS_REGION.
            tracing::debug!("no AWS region configured; using us-east-1 for the state store");
            conf = conf.region(aws_config::Region::new("us-east-1"));
        }
        S3Store {
            client: aws_sdk_s3::Client::from_conf(conf.build()),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            page_size: None,
        }
    }

    /// Limits how many keys one ListObjectsV2 page returns (S3's default and maximum is 1000);
    /// tests use it to exercise pagination without writing thousands of objects.
    pub fn with_page_size(mut self, keys: i32) -> S3Store {
        self.page_size = Some(keys);
        self
    }

    fn object_key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn backend<E>(
        &self,
        key: &str,
        what: &str,
        e: &SdkError<E, aws_smithy_runtime_api::http::Response>,
    ) -> StateError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        StateError::Backend {
            location: self.key_location(key),
            message: format!("{what}: {}", crate::aws_errors::describe_sdk_error(e)),
        }
    }

    /// Maps a failed conditional request onto the trait's errors.
    fn condition_failed<E>(
        &self,
        key: &str,
        cond: &Precondition,
        e: &SdkError<E, aws_smithy_runtime_api::http::Response>,
    ) -> Option<StateError>
    where
        E: ProvideErrorMetadata,
    {
        let status = e.raw_response().map(|r| r.status().as_u16());
        let code = e.as_service_error().and_then(|s| s.code());
        let precondition = matches!(status, Some(412 | 409))
            || matches!(
                code,
                Some("PreconditionFailed" | "ConditionalRequestConflict")
            );
        // If-Match on a key that is gone: it changed since it was read, just as a new ETag.
        // (A missing bucket is a 404 too, and must stay an error that names it.)
        let vanished = matches!(code, Some("NoSuchKey")) || (status == Some(404) && code.is_none());
        match cond {
            Precondition::Absent if precondition => Some(StateError::AlreadyExists {
                location: self.location(),
                key: key.to_string(),
            }),
            Precondition::Matches(v) if precondition || vanished => Some(StateError::Conflict {
                location: self.location(),
                key: key.to_string(),
                expected: v.to_string(),
            }),
            _ => None,
        }
    }
}

#[async_trait::async_trait]
impl StateStore for S3Store {
    fn location(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Object>, StateError> {
        super::validate_key(key)?;
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(self.backend(key, "cannot read", &e)),
        };
        let version = out
            .e_tag()
            .map(str::to_string)
            .ok_or_else(|| StateError::Backend {
                location: self.key_location(key),
                message: "the object has no ETag, so it cannot be updated safely".into(),
            })?;
        // A tampered bucket could hold a huge object: refuse it before reading (by its
        // announced length) and while reading (whatever the length said).
        let limit = crate::bounded::STATE_OBJECT;
        let too_large = || StateError::Backend {
            location: self.key_location(key),
            message: crate::bounded::ReadError::TooLarge {
                what: "the object".into(),
                limit,
            }
            .to_string(),
        };
        if out
            .content_length()
            .is_some_and(|n| n > 0 && n as u64 > limit)
        {
            return Err(too_large());
        }
        let mut body = out.body;
        let mut data = Vec::new();
        while let Some(chunk) = body.try_next().await.map_err(|e| StateError::Backend {
            location: self.key_location(key),
            message: format!("cannot read the object's body: {e}"),
        })? {
            if (data.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            data.extend_from_slice(&chunk);
        }
        Ok(Some(Object {
            data: Bytes::from(data),
            version: Version(version),
        }))
    }

    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError> {
        super::validate_key(key)?;
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.object_key(key))
            .body(ByteStream::from(data));
        req = match &cond {
            Precondition::None => req,
            Precondition::Absent => req.if_none_match("*"),
            Precondition::Matches(v) => req.if_match(&v.0),
        };
        match req.send().await {
            Ok(out) => {
                out.e_tag()
                    .map(|t| Version(t.to_string()))
                    .ok_or_else(|| StateError::Backend {
                        location: self.key_location(key),
                        message: "the write returned no ETag".into(),
                    })
            }
            Err(e) => Err(self
                .condition_failed(key, &cond, &e)
                .unwrap_or_else(|| self.backend(key, "cannot write", &e))),
        }
    }

    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError> {
        super::validate_key(key)?;
        // S3 has no "delete only if absent"; checking first matches the file backend's answer,
        // and deleting an absent key would be a no-op anyway.
        if cond == Precondition::Absent {
            return match self.get(key).await? {
                Some(_) => Err(StateError::AlreadyExists {
                    location: self.location(),
                    key: key.to_string(),
                }),
                None => Ok(()),
            };
        }
        let mut req = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.object_key(key));
        if let Precondition::Matches(v) = &cond {
            req = req.if_match(&v.0);
        }
        match req.send().await {
            Ok(_) => Ok(()),
            Err(e) => Err(self
                .condition_failed(key, &cond, &e)
                .unwrap_or_else(|| self.backend(key, "cannot delete", &e))),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        super::validate_prefix(prefix)?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(format!("{strip}{prefix}"))
            .set_max_keys(self.page_size)
            .into_paginator()
            .send();
        let mut keys = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.backend(prefix, "cannot list", &e))?;
            for object in page.contents() {
                let Some(key) = object.key().and_then(|k| k.strip_prefix(&strip)) else {
                    continue;
                };
                // Objects written by other tools (folder markers like `a/`, odd names) are not
                // keys kprov could read back; leave them out instead of failing the listing.
                match super::validate_key(key) {
                    Ok(()) => keys.push(key.to_string()),
                    Err(e) => tracing::debug!("ignoring object in the state store: {e}"),
                }
            }
        }
        keys.sort();
        Ok(keys)
    }

    async fn check_versioning(&self) -> Versioning {
        match self
            .client
            .get_bucket_versioning()
            .bucket(&self.bucket)
            .send()
            .await
        {
            Ok(out) => match out.status() {
                Some(BucketVersioningStatus::Enabled) => Versioning::Enabled,
                Some(BucketVersioningStatus::Suspended) => Versioning::Suspended,
                Some(other) => Versioning::Unknown(format!("unexpected status {other:?}")),
                None => Versioning::Disabled,
            },
            // moto's GetBucketVersioning reply has the wrong XML root and does not parse; some
            // S3-compatible servers refuse the call. Neither should stop a command: the caller
            // warns that versioning could not be confirmed.
            Err(e) => {
                tracing::debug!(
                    bucket = %self.bucket,
                    "GetBucketVersioning failed: {}",
                    crate::aws_errors::describe_sdk_error(&e)
                );
                let reason = match e.as_service_error().and_then(|s| s.code()) {
                    Some(code) => code.to_string(),
                    None => "the bucket's versioning reply could not be read".to_string(),
                };
                Versioning::Unknown(reason)
            }
        }
    }
}
