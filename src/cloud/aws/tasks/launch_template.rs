//! A launch template: what an instance group's instances boot (image, type, key pair, security
//! groups, instance profile, user-data, metadata options). Its name is fixed once made; any
//! other change is a new complete version (the groups launch `$Latest`).
//!
//! Reading a template's latest version costs one call per template, and the preview makes it
//! only for a template that is not as kprov last wrote it: each write records on the template
//! the version it made, the digest of the compared fields ([`LaunchTemplate::digest`], the one
//! function both the write and the read use) and the values the read cannot take from the
//! desired model (`TAG_FIELD` + field: the image ID and the cloud IDs of the references).

use std::fmt;

use aws_sdk_ec2::types::{
    LaunchTemplateIamInstanceProfileSpecificationRequest,
    LaunchTemplateInstanceMetadataOptionsRequest, LaunchTemplateTagSpecificationRequest,
    LaunchTemplateVersion, RequestLaunchTemplateData, ResourceType, Tag,
};
use aws_smithy_types::base64;

use super::{
    Apply, Codec, Created, Doc, Done, Fields, Head, IamInstanceProfile, KeyPair, Kinded, Read, Ref,
    SecurityGroup, Task, text,
};
use crate::cloud::aws::ec2::tag_spec;
use crate::cloud::aws::hostkeys;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{AwsCloud, Ctx, Reader};
use crate::cloud::engine::{
    CloudError, CloudId, FieldChange, FieldRule, IdMap, Resource, ResourceId, Value,
};

const TEMPLATE_NAME: &str = "templateName";
const IMAGE_ID: &str = "imageId";
const INSTANCE_TYPE: &str = "instanceType";
const KEY_NAME: &str = "keyName";
const SECURITY_GROUPS: &str = "securityGroups";
const INSTANCE_PROFILE: &str = "instanceProfile";
const USER_DATA: &str = "userData";
const HTTP_ENDPOINT: &str = "metadataHttpEndpoint";
const HTTP_TOKENS: &str = "metadataHttpTokens";
const HOP_LIMIT: &str = "metadataHopLimit";
/// On a read template only: what the rolling update compares the groups' instances against.
const LATEST_VERSION: &str = "latestVersion";
/// The fields a template's version holds: all of them or none (a read that found no version).
const LAUNCH_FIELDS: [&str; 9] = [
    IMAGE_ID,
    INSTANCE_TYPE,
    KEY_NAME,
    SECURITY_GROUPS,
    INSTANCE_PROFILE,
    USER_DATA,
    HTTP_ENDPOINT,
    HTTP_TOKENS,
    HOP_LIMIT,
];

const TAG_VERSION: &str = "kprov.dev/launch-version";
const TAG_DIGEST: &str = "kprov.dev/launch-digest";
const TAG_FIELD: &str = "kprov.dev/launch:";
/// AWS's limit on a tag value.
pub(crate) const TAG_VALUE_MAX: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LaunchTemplate {
    pub(crate) head: Head,
    pub(crate) template_name: String,
    /// What it launches; `None` on a read template whose version was not read (deleted
    /// between the list and the version's read: the diff shows every field as changed).
    pub(crate) launch: Option<Launch>,
    /// On a read template: its latest version's number.
    pub(crate) latest_version: Option<i64>,
}

/// A template version's data.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Launch {
    pub(crate) image_id: String,
    pub(crate) instance_type: String,
    pub(crate) key_name: Ref<KeyPair>,
    pub(crate) security_groups: Vec<Ref<SecurityGroup>>,
    pub(crate) instance_profile: Ref<IamInstanceProfile>,
    /// The user-data with the private host key redacted: what the diff compares and shows
    /// (a document, line by line).
    pub(crate) user_data: String,
    /// The complete user-data apply sends: an input, never compared or printed; absent until
    /// the group's SSH host key exists.
    pub(crate) boot: Option<BootData>,
    pub(crate) http_endpoint: String,
    pub(crate) http_tokens: String,
    pub(crate) hop_limit: i64,
}

/// User-data with the instance's private host key in it: its `Debug` never shows it.
#[derive(Clone, PartialEq)]
pub(crate) struct BootData(pub(crate) String);

impl fmt::Debug for BootData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootData({} bytes)", self.0.len())
    }
}

impl Kinded for LaunchTemplate {
    const KIND: AwsKind = AwsKind::Ec2(Ec2Kind::LaunchTemplate);
}

/// By hand: the version's fields come all or none, and the complete user-data is an input.
impl Fields for LaunchTemplate {
    fn head(&self) -> &Head {
        &self.head
    }

    fn resource(&self) -> Resource {
        let r = self
            .head
            .resource::<LaunchTemplate>()
            .field(TEMPLATE_NAME, Value::str(&self.template_name))
            .rule(TEMPLATE_NAME, FieldRule::Immutable);
        let r = match &self.launch {
            Some(l) => l.put(r),
            None => r,
        };
        <Option<i64> as Codec<Option<i64>>>::put(&self.latest_version, r, LATEST_VERSION)
    }

    fn from_resource(r: &Resource) -> Result<Self, CloudError> {
        let launch = if LAUNCH_FIELDS.iter().any(|f| r.get(f).is_some()) {
            Some(Launch::take(r)?)
        } else {
            None
        };
        Ok(LaunchTemplate {
            head: Head::of(r),
            template_name: text(r, TEMPLATE_NAME)?,
            launch,
            latest_version: <Option<i64> as Codec<Option<i64>>>::take(r, LATEST_VERSION)?,
        })
    }
}

impl Launch {
    fn put(&self, r: Resource) -> Resource {
        let r = r
            .field(IMAGE_ID, Value::str(&self.image_id))
            .field(INSTANCE_TYPE, Value::str(&self.instance_type))
            .field(KEY_NAME, self.key_name.value())
            .field(
                SECURITY_GROUPS,
                Value::set(self.security_groups.iter().map(Ref::value).collect()),
            )
            .field(INSTANCE_PROFILE, self.instance_profile.value())
            .field(USER_DATA, Value::Doc(self.user_data.clone()))
            .field(HTTP_ENDPOINT, Value::str(&self.http_endpoint))
            .field(HTTP_TOKENS, Value::str(&self.http_tokens))
            .field(HOP_LIMIT, Value::Int(self.hop_limit));
        match &self.boot {
            Some(b) => r.input(USER_DATA, b.0.clone()),
            None => r,
        }
    }

    fn take(r: &Resource) -> Result<Launch, CloudError> {
        Ok(Launch {
            image_id: text(r, IMAGE_ID)?,
            instance_type: text(r, INSTANCE_TYPE)?,
            key_name: <Ref<KeyPair>>::take(r, KEY_NAME)?,
            security_groups: <Vec<Ref<SecurityGroup>>>::take(r, SECURITY_GROUPS)?,
            instance_profile: <Ref<IamInstanceProfile>>::take(r, INSTANCE_PROFILE)?,
            user_data: Doc::take(r, USER_DATA)?,
            boot: r.inputs.get(USER_DATA).cloned().map(BootData),
            http_endpoint: text(r, HTTP_ENDPOINT)?,
            http_tokens: text(r, HTTP_TOKENS)?,
            hop_limit: i64::take(r, HOP_LIMIT)?,
        })
    }

    /// From a version's data as EC2 lists it.
    fn read(v: &LaunchTemplateVersion, rd: &Reader<'_>) -> Launch {
        let d = v.launch_template_data();
        let user_data = d
            .and_then(|d| d.user_data())
            .and_then(|u| base64::decode(u).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            // why: no user-data reads as empty, which the diff shows as a change
            .unwrap_or_default();
        let imds = d.and_then(|d| d.metadata_options());
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        let or_empty = |s: Option<&str>| s.unwrap_or_default().to_string();
        Launch {
            image_id: or_empty(d.and_then(|d| d.image_id())),
            instance_type: or_empty(d.and_then(|d| d.instance_type()).map(|t| t.as_str())),
            key_name: Ref::read(rd, &or_empty(d.and_then(|d| d.key_name()))),
            security_groups: Ref::read_all(
                rd,
                d.map(|d| d.security_group_ids())
                    // why: an absent list field is an empty list
                    .unwrap_or_default(),
            ),
            instance_profile: Ref::read(
                rd,
                &or_empty(
                    d.and_then(|d| d.iam_instance_profile())
                        .and_then(|p| p.name()),
                ),
            ),
            // Compared by the private key's digest; a plan never shows the key.
            user_data: hostkeys::redact(&user_data),
            boot: None,
            http_endpoint: or_empty(imds.and_then(|m| m.http_endpoint()).map(|v| v.as_str())),
            http_tokens: or_empty(imds.and_then(|m| m.http_tokens()).map(|v| v.as_str())),
            hop_limit: imds
                .and_then(|m| m.http_put_response_hop_limit())
                .map(i64::from)
                .unwrap_or(0),
        }
    }

    /// What the version is made of; the instances and their volumes carry the group's
    /// identity tag.
    fn data(
        &self,
        c: &AwsCloud,
        id: &ResourceId,
        ids: &IdMap,
    ) -> Result<RequestLaunchTemplateData, CloudError> {
        let boot = self.boot.as_ref().ok_or_else(|| {
            CloudError::Model(format!(
                "{id}: the instance group has no SSH host key yet (update cluster --yes \
                 generates it before writing launch templates)"
            ))
        })?;
        let instance_tags = |rt: ResourceType| {
            let display = format!("{}.{}", id.name, c.cluster);
            let tags = c
                .tags(
                    &ResourceId::new(AwsKind::Instance.kind(), &id.name),
                    &display,
                )
                .into_iter()
                .map(|(k, v)| Tag::builder().key(k).value(v).build());
            LaunchTemplateTagSpecificationRequest::builder()
                .resource_type(rt)
                .set_tags(Some(tags.collect()))
                .build()
        };
        let groups = self
            .security_groups
            .iter()
            .map(|g| g.resolve(ids).map(str::to_string))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RequestLaunchTemplateData::builder()
            .image_id(&self.image_id)
            .instance_type(self.instance_type.as_str().into())
            .key_name(self.key_name.resolve(ids)?)
            .set_security_group_ids(Some(groups))
            .iam_instance_profile(
                LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                    .name(self.instance_profile.resolve(ids)?)
                    .build(),
            )
            .user_data(base64::encode(&boot.0))
            .metadata_options(
                LaunchTemplateInstanceMetadataOptionsRequest::builder()
                    .http_endpoint(self.http_endpoint.as_str().into())
                    .http_tokens(self.http_tokens.as_str().into())
                    .set_http_put_response_hop_limit(i32::try_from(self.hop_limit).ok())
                    .build(),
            )
            .tag_specifications(instance_tags(ResourceType::Instance))
            .tag_specifications(instance_tags(ResourceType::Volume))
            .build())
    }
}

/// What the read found for one template of the cluster.
pub(crate) enum ListedTemplate {
    /// Its latest version, read.
    Version(Box<LaunchTemplateVersion>),
    /// As kprov wrote it from `want` ([`LaunchTemplate::as_written`]): no version read.
    Written(aws_sdk_ec2::types::LaunchTemplate, Box<LaunchTemplate>),
    /// Listed, but its version was not there to read (deleted since the list).
    Gone(aws_sdk_ec2::types::LaunchTemplate),
}

impl Read for LaunchTemplate {
    type Listed = ListedTemplate;

    fn read(head: Head, listed: &Self::Listed, rd: &Reader<'_>) -> Self {
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        let name = |n: Option<&str>| n.unwrap_or_default().to_string();
        match listed {
            ListedTemplate::Version(v) => LaunchTemplate {
                head,
                template_name: name(v.launch_template_name()),
                launch: Some(Launch::read(v, rd)),
                latest_version: Some(v.version_number().unwrap_or(0)),
            },
            ListedTemplate::Written(t, want) => LaunchTemplate {
                head,
                template_name: name(t.launch_template_name()),
                launch: want.launch.as_ref().map(|w| as_recorded(t, w, rd)),
                latest_version: Some(t.latest_version_number().unwrap_or(0)),
            },
            ListedTemplate::Gone(t) => LaunchTemplate {
                head,
                template_name: name(t.launch_template_name()),
                launch: None,
                latest_version: Some(t.latest_version_number().unwrap_or(0)),
            },
        }
    }
}

impl Task for LaunchTemplate {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        // A new template's only version is 1.
        let written = self.written_tags(a.ids, 1)?;
        let written: Vec<(&str, &str)> = written
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        a.ec2
            .create_launch_template()
            .launch_template_name(&self.template_name)
            .launch_template_data(self.launch()?.data(a.c, &id, a.ids)?)
            .tag_specifications(tag_spec(a.c, ResourceType::LaunchTemplate, &id, &written))
            .send()
            .await
            .created(self, "CreateLaunchTemplate", |out| {
                out.launch_template().and_then(|t| t.launch_template_id())
            })
    }

    /// Instance groups use `$Latest`: a new complete version is the change (the name is
    /// fixed: the plan refuses a change).
    async fn update(&self, have: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        let tid = have.cloud_id()?;
        let out = a
            .ec2
            .create_launch_template_version()
            .launch_template_id(tid)
            .launch_template_data(self.launch()?.data(a.c, &self.id(), a.ids)?)
            .send()
            .await
            .ctx("CreateLaunchTemplateVersion")?;
        // Recorded so the next read need not read this version (`as_written`). Until the
        // tags land (or if they fail) they name an older version, so a read reads it.
        let Some(n) = out
            .launch_template_version()
            .and_then(|v| v.version_number())
        else {
            return Ok(());
        };
        let tags = self.written_tags(a.ids, n)?;
        if tags.is_empty() {
            return Ok(());
        }
        a.ec2
            .create_tags()
            .resources(tid)
            .set_tags(Some(
                tags.into_iter()
                    .map(|(k, v)| Tag::builder().key(k).value(v).build())
                    .collect(),
            ))
            .send()
            .await
            .ctx("CreateTags")?;
        Ok(())
    }
}

delete_by_id!(
    LaunchTemplate: ec2.delete_launch_template().launch_template_id,
    "DeleteLaunchTemplate"
);

impl LaunchTemplate {
    /// What it launches; a desired template always says.
    fn launch(&self) -> Result<&Launch, CloudError> {
        self.launch
            .as_ref()
            .ok_or_else(|| CloudError::Model(format!("{}: no launch data", self.id())))
    }

    /// The digest of the compared fields, except the name (the list gives it) and the
    /// resolved fields (recorded as they are): the one function both the write (recording it)
    /// and the read (comparing it) use.
    pub(crate) fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        fn put(h: &mut Sha256, tag: u8, bytes: &[u8]) {
            h.update([tag]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        fn value(h: &mut Sha256, v: &Value) {
            match v {
                Value::Str(s) => put(h, b's', s.as_bytes()),
                Value::Doc(s) => put(h, b'd', s.as_bytes()),
                Value::Int(i) => put(h, b'i', &i.to_le_bytes()),
                Value::Bool(b) => put(h, b'b', &[u8::from(*b)]),
                Value::Ref(id) => put(h, b'r', id.to_string().as_bytes()),
                Value::List(items) => {
                    put(h, b'l', &(items.len() as u64).to_le_bytes());
                    for i in items {
                        value(h, i);
                    }
                }
            }
        }
        let mut h = Sha256::new();
        for (k, v) in &self.resource().fields {
            if k == TEMPLATE_NAME || resolved_field(k, v) {
                continue;
            }
            put(&mut h, b'f', k.as_bytes());
            value(&mut h, v);
        }
        hex::encode(h.finalize())
    }

    /// The tags recording `version` of the template as written from `self`. Empty when a
    /// resolved value does not fit a tag: the read then reads that template's version every
    /// time, which is only slower.
    pub(crate) fn written_tags(
        &self,
        ids: &IdMap,
        version: i64,
    ) -> Result<Vec<(String, String)>, CloudError> {
        let mut tags = vec![
            (TAG_VERSION.to_string(), version.to_string()),
            (TAG_DIGEST.to_string(), self.digest()),
        ];
        let Some(l) = &self.launch else {
            return Ok(tags);
        };
        let groups = l
            .security_groups
            .iter()
            .map(|g| g.resolve(ids))
            .collect::<Result<Vec<_>, _>>()?;
        if groups.iter().any(|g| g.contains(' ')) {
            return Ok(Vec::new());
        }
        let resolved = [
            (IMAGE_ID, l.image_id.clone()),
            (KEY_NAME, l.key_name.resolve(ids)?.to_string()),
            (SECURITY_GROUPS, groups.join(" ")),
            (
                INSTANCE_PROFILE,
                l.instance_profile.resolve(ids)?.to_string(),
            ),
        ];
        for (k, value) in resolved {
            if value.len() > TAG_VALUE_MAX {
                return Ok(Vec::new());
            }
            tags.push((format!("{TAG_FIELD}{k}"), value));
        }
        Ok(tags)
    }

    /// Whether template `t`'s latest version is the one kprov wrote from what `self` (desired)
    /// asks now, so its fields are `self`'s (the resolved ones from their tags) without
    /// reading it.
    ///
    /// Trusting the tags is safe: a new version by anyone (the console, a script, another
    /// tool) raises `LatestVersionNumber` past the recorded number, and every version is
    /// immutable, so the recorded version is exactly what was written; rewriting the tags to
    /// match a changed template needs ec2:CreateTags on the cluster's templates, the same
    /// right that can rewrite the ownership tags every read trusts. A template written before
    /// these tags (or whose tags did not fit) simply has its version read.
    pub(crate) fn as_written(&self, t: &aws_sdk_ec2::types::LaunchTemplate) -> bool {
        let version = tag_of(t, TAG_VERSION).and_then(|v| v.parse::<i64>().ok());
        self.launch.is_some()
            && version.is_some()
            && version == t.latest_version_number()
            && tag_of(t, TAG_DIGEST) == Some(self.digest().as_str())
            && RESOLVED
                .iter()
                .all(|k| tag_of(t, &format!("{TAG_FIELD}{k}")).is_some())
    }
}

/// The fields whose written value the read cannot know from the desired model: the image
/// (the preview's read runs with image names standing in for IDs) and the references (cloud
/// IDs).
const RESOLVED: [&str; 4] = [IMAGE_ID, KEY_NAME, SECURITY_GROUPS, INSTANCE_PROFILE];

/// Whether field `name` of the resource is one of the [`RESOLVED`] ones: the image, and any
/// reference (a raw cloud ID is no reference, and is compared as it is).
fn resolved_field(name: &str, v: &Value) -> bool {
    name == IMAGE_ID
        || match v {
            Value::Ref(_) => true,
            Value::List(items) => items.iter().any(|i| matches!(i, Value::Ref(_))),
            _ => false,
        }
}

fn tag_of<'a>(t: &'a aws_sdk_ec2::types::LaunchTemplate, key: &str) -> Option<&'a str> {
    t.tags()
        .iter()
        .find(|tag| tag.key() == Some(key))
        .and_then(|tag| tag.value())
}

/// A version as kprov wrote it: `want`'s data, the resolved fields from the tags (each cloud
/// ID turned back into a reference the way a version read's would be).
fn as_recorded(t: &aws_sdk_ec2::types::LaunchTemplate, want: &Launch, rd: &Reader<'_>) -> Launch {
    let recorded = |k: &str| tag_of(t, &format!("{TAG_FIELD}{k}"));
    let mut l = want.clone();
    l.boot = None;
    if let Some(image) = recorded(IMAGE_ID) {
        l.image_id = image.to_string();
    }
    if let Some(key) = recorded(KEY_NAME) {
        l.key_name = Ref::read(rd, key);
    }
    if let Some(groups) = recorded(SECURITY_GROUPS) {
        l.security_groups = Ref::read_all(rd, groups.split_whitespace());
    }
    if let Some(profile) = recorded(INSTANCE_PROFILE) {
        l.instance_profile = Ref::read(rd, profile);
    }
    l
}
