//! Issue 22: the preview reads launch template versions by ID, only the cluster's own, and
//! only those not as kprov wrote them (the tags each write records: version and digest).

use kprov::cloud::engine::{Action, RenderOptions};

use kprov::spec::{Cluster, InstanceGroup};

use crate::aws::{Env, apply, delete_all, plan, zoned};

const FOREIGN_USER_DATA: &str = "#!/bin/sh\necho another cluster's secret\n";

/// The op names sent that read launch template versions.
fn version_reads(ops: &[String]) -> usize {
    ops.iter()
        .filter(|o| o.ends_with(":DescribeLaunchTemplateVersions"))
        .count()
}

/// A preview with no change that read no launch template version.
async fn empty_preview_without_version_reads(e: &Env, c: &Cluster, igs: &[InstanceGroup]) {
    e.rec.take();
    let p = plan(e, c, igs).await;
    let ops = e.rec.take();
    assert!(
        p.is_empty(),
        "{}",
        kprov::cloud::engine::render_text(&p, RenderOptions::default())
    );
    assert_eq!(version_reads(&ops), 0, "{ops:?}");
}

/// (a) another cluster's launch template is never read, (b) a manual new version of an owned
/// template shows as a change, (c) an unchanged cluster's preview reads no version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_reads_only_the_cluster_templates_that_changed() {
    crate::needs_tier!(Moto);
    let name = "reads.templates.example.com";
    let zone = "templates.example.com";
    let (e, _, c, igs) = zoned(name, zone, false).await;
    let p = plan(&e, &c, &igs).await;
    apply(&e, &p, false).await;

    // Another cluster's template, with the identity tag of one of ours.
    let ec2 = aws_sdk_ec2::Client::new(&e.sdk);
    let tag = |k: &str, v: &str| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build();
    let foreign = ec2
        .create_launch_template()
        .launch_template_name("nodes.other.templates.example.com")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id("ami-1e749f67")
                .instance_type("t3.medium".into())
                .user_data(aws_smithy_types::base64::encode(FOREIGN_USER_DATA))
                .build(),
        )
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::LaunchTemplate)
                .tags(tag(
                    &kprov::cloud::aws::owned_tag_key("other.templates.example.com"),
                    "owned",
                ))
                .tags(tag("kprov.dev/id", "LaunchTemplate/nodes"))
                .build(),
        )
        .send()
        .await
        .expect("foreign template");
    let foreign = foreign
        .launch_template()
        .and_then(|t| t.launch_template_id())
        .expect("foreign template ID")
        .to_string();

    // (c) and (a): nothing changed, nothing read, the foreign template least of all.
    empty_preview_without_version_reads(&e, &c, &igs).await;

    // (b): someone adds a version to the cluster's `nodes` template.
    let nodes = ec2
        .describe_launch_templates()
        .launch_template_names(format!("nodes.{name}"))
        .send()
        .await
        .expect("nodes template");
    let nodes = nodes.launch_templates()[0]
        .launch_template_id()
        .expect("nodes template ID")
        .to_string();
    ec2.create_launch_template_version()
        .launch_template_id(&nodes)
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id("ami-1e749f67")
                .instance_type("t3.nano".into())
                .build(),
        )
        .send()
        .await
        .expect("manual version");
    let p = plan(&e, &c, &igs).await;
    let reads = e.rec.template_reads();
    e.rec.take();
    assert_eq!(
        reads,
        vec![Some(nodes.clone())],
        "foreign template {foreign}"
    );
    let text = kprov::cloud::engine::render_text(&p, RenderOptions::default());
    assert!(!text.contains("another cluster"), "{text}");
    let change = p
        .changes
        .iter()
        .find(|ch| ch.kind == "LaunchTemplate" && ch.name == "nodes")
        .unwrap_or_else(|| panic!("no change of the nodes template:\n{text}"));
    assert_eq!(change.action, Action::Update, "{text}");
    let itype = change
        .fields
        .iter()
        .find(|f| f.field == "instanceType")
        .unwrap_or_else(|| panic!("instanceType unchanged:\n{text}"));
    assert_eq!(
        itype.old.as_ref().and_then(|v| v.as_str()),
        Some("t3.nano"),
        "{text}"
    );
    assert_eq!(p.changes.len(), 1, "only the changed template:\n{text}");

    // Applying writes the spec's version again and records it: the next preview finds it as
    // desired without reading it.
    apply(&e, &p, false).await;
    empty_preview_without_version_reads(&e, &c, &igs).await;

    delete_all(&e, &c, &igs).await;
    ec2.delete_launch_template()
        .launch_template_id(&foreign)
        .send()
        .await
        .expect("delete foreign template");
}
