//! Image pins in the cloud lab (issue 19, "resolve once"): a cluster on an image name pattern
//! stays on the image the pattern resolved to when first applied. A newer image matching the
//! pattern is published → the `update cluster` preview has no change (it mentions the newer
//! image) and `rolling-update` has nothing to roll → `update cluster --refresh-image` previews
//! the launch templates' move to the new AMI, naming it, and `--yes` pins it. Needs root.

use crate::support::awsroll::{
    PRIVATE_ADDRESSES, code, delete_cleanly, lab_with_zone, launched, nothing_to_roll,
    running_cluster_in, text, update_yes, workers,
};
use crate::support::cloudlab::CloudLab;

/// Images the moto account publishes (moto's RegisterImage makes them the caller's), named as
/// Ubuntu's so that the lab's hosts log in as `ubuntu`.
const PATTERN: &str = "self/ubuntu/images/hvm-ssd/ubuntu-noble-24.04-amd64-server-kprovpin-*";

fn register(lab: &CloudLab, name: &str) -> String {
    lab.block_on(async {
        aws_sdk_ec2::Client::new(&lab.sdk_config().await)
            .register_image()
            .name(name)
            .send()
            .await
            .expect("RegisterImage")
            .image_id()
            .expect("an image ID")
            .to_string()
    })
}

fn pins(lab: &CloudLab, cluster: &str) -> serde_json::Value {
    let path = lab.store_dir().join(cluster).join("status/images");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("pins {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("pins: {e}\n{text}"))
}

fn preview<'a>(cluster: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["update", "cluster", cluster];
    a.extend_from_slice(extra);
    a.extend_from_slice(PRIVATE_ADDRESSES);
    a
}

#[test]
fn a_newer_image_matching_the_pattern_rolls_nothing_until_refresh_image() {
    crate::needs_tier!(CloudLab);
    let cluster = "pin.lab.example";
    let lab = lab_with_zone("lab.example");
    let first = register(
        &lab,
        "ubuntu/images/hvm-ssd/ubuntu-noble-24.04-amd64-server-kprovpin-1",
    );
    running_cluster_in(&lab, cluster, 1, 1, PATTERN);
    let nodes = workers(&lab);
    let running = launched(&lab, &nodes);
    assert!(running.values().all(|l| l.image == first), "{running:?}");
    assert_eq!(
        pins(&lab, cluster)["images"][PATTERN]["id"].as_str(),
        Some(first.as_str()),
        "the first apply did not pin the image"
    );

    // moto stamps creation dates to the second: the newer image must be in a later one.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let newer = register(
        &lab,
        "ubuntu/images/hvm-ssd/ubuntu-noble-24.04-amd64-server-kprovpin-2",
    );

    // The preview: nothing to change, the newer image mentioned, exit 0 with --exit-code.
    let o = lab.kprov(&preview(cluster, &["--exit-code"]));
    let out = code(&lab, &o, 0);
    let all = format!("{out}{}", text(&o.stderr));
    assert!(
        out.contains("No changes: the cloud matches the spec.")
            && !all.contains("need provisioning"),
        "a newer image changed the plan:\n{all}"
    );
    assert!(
        all.contains(&format!("a newer image {newer} matches"))
            && all.contains(&format!("stays on {first}"))
            && all.contains("--refresh-image"),
        "the preview does not mention the newer image:\n{all}"
    );
    let json: serde_json::Value = serde_json::from_str(&code(
        &lab,
        &lab.kprov(&preview(cluster, &["-o", "json"])),
        0,
    ))
    .expect("json plan");
    assert_eq!(json["changes"], serde_json::json!([]), "{json:#}");
    // And no node needs a roll.
    nothing_to_roll(&lab, cluster);
    // `update --yes` keeps the pin: the launch templates are not touched.
    code(&lab, &lab.kprov(&update_yes(cluster)), 0);
    assert_eq!(
        pins(&lab, cluster)["images"][PATTERN]["id"].as_str(),
        Some(first.as_str())
    );
    nothing_to_roll(&lab, cluster);

    // Asked for: the preview names the new AMI on the launch templates, exit 2.
    let o = lab.kprov(&preview(cluster, &["--refresh-image", "--exit-code"]));
    let out = code(&lab, &o, 2);
    let all = format!("{out}{}", text(&o.stderr));
    assert!(
        all.contains(&format!(
            "refreshed from {first} to the newest match {newer}"
        )) && out.contains("Will modify resources:")
            && out.contains("imageId")
            && out.contains(&newer),
        "the --refresh-image preview does not name the new image:\n{all}"
    );
    assert_eq!(
        pins(&lab, cluster)["images"][PATTERN]["id"].as_str(),
        Some(first.as_str()),
        "a preview wrote the pins"
    );
    // Applied: pinned, and the running instances are now the roll's to replace.
    let mut yes = update_yes(cluster);
    yes.push("--refresh-image");
    code(&lab, &lab.kprov(&yes), 0);
    assert_eq!(
        pins(&lab, cluster)["images"][PATTERN]["id"].as_str(),
        Some(newer.as_str())
    );
    let o = lab.kprov(&crate::support::awsroll::rolling(cluster, &["--exit-code"]));
    code(&lab, &o, 2);
    delete_cleanly(&lab, cluster);
}
