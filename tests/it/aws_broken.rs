//! kops's bad day on AWS (issue 20): one worker instance stops answering SSH (its test host
//! powered off; the instance still runs in moto). `get instances` lists it as unknown instead
//! of dropping it; `rolling-update --cloudonly --force` replaces it through its Auto Scaling
//! group without asking it anything; `delete instance --cloudonly` previews and terminates an
//! instance without a single request to the cluster's API.
//!
//! Needs root.

use crate::support::awsroll::{code, rolling, running_cluster, text, with_call, workers};

#[test]
fn a_worker_that_does_not_answer_is_listed_as_unknown_and_replaced_with_cloudonly() {
    crate::needs_tier!(CloudLab);
    let cluster = "roll.broken.example";
    let lab = running_cluster(cluster, "broken.example", 1);
    let old = workers(&lab);
    assert_eq!(old.len(), 1, "{old:?}");
    let broken = old[0].clone();
    lab.instances()[&broken].power_off();

    // 1. Listed as unknown, with the way out; not dropped.
    let o = lab.kprov(&["get", "instances", cluster]);
    let listed = code(&lab, &o, 0);
    let line = listed
        .lines()
        .find(|l| l.starts_with(broken.as_str()))
        .unwrap_or_else(|| panic!("{broken} not listed:\n{listed}"));
    assert!(line.contains("unknown"), "{line}");
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("{broken} (")) && err.contains("--cloudonly --force"),
        "{err}"
    );

    // `rolling-update cluster` forcing the nodes group's instances, cloud only, with `last`.
    let forced = |last: &'static str| {
        rolling(
            cluster,
            &["--instance-group", "nodes", "--cloudonly", "--force", last],
        )
    };
    // 2. The preview: left alone unless forced; with --force it is replaced, nothing refused.
    let o = lab.kprov(&rolling(cluster, &["--exit-code"]));
    code(&lab, &o, 0);
    let o = lab.kprov(&forced("--exit-code"));
    let out = code(&lab, &o, 2);
    assert!(
        out.lines()
            .any(|l| l.contains("replace") && l.contains("unknown:")),
        "{out}"
    );

    // 3. The roll replaces it through the group; nothing is asked of it.
    let o = lab.kprov(&forced("--yes"));
    code(&lab, &o, 0);
    // Nothing was cordoned, drained or validated, and nothing says so (progress, table).
    let said = format!("{}{}", text(&o.stdout), text(&o.stderr));
    for claim in ["cordoned", "drained", "validated"] {
        assert!(
            !said
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == claim),
            "{claim} claimed under --cloudonly:\n{said}"
        );
    }
    assert!(
        said.contains("the cluster not checked (--cloudonly)"),
        "{said}"
    );
    lab.sync();
    assert!(
        !lab.instances().contains_key(&broken),
        "{broken} still runs"
    );
    let now = workers(&lab);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], broken);
    assert!(with_call(&lab, "kubeadm join").contains(&now[0]));

    // 4. delete instance --cloudonly: preview and removal with no request to the API.
    lab.fake.clear_requests();
    let o = lab.kprov(&["delete", "instance", cluster, &now[0], "--cloudonly"]);
    let out = code(&lab, &o, 0);
    assert!(out.contains("not asked (--cloudonly)"), "{out}");
    assert!(
        out.contains(&format!("Then: {} is terminated in", now[0])),
        "{out}"
    );
    let o = lab.kprov(&[
        "delete",
        "instance",
        cluster,
        &now[0],
        "--cloudonly",
        "--yes",
    ]);
    code(&lab, &o, 0);
    assert!(text(&o.stderr).contains("Removed"), "{}", text(&o.stderr));
    assert!(
        lab.fake.requests().is_empty(),
        "--cloudonly asked the API: {:?}",
        lab.fake.requests().len()
    );
}
