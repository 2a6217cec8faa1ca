//! YAML streams the spec's test modules load, written by one builder so that each test shows
//! only what its cluster has of its own.

/// An InstanceGroup of a stream: its name, role, and min and max size when given.
pub(crate) type Group<'a> = (&'a str, &'a str, Option<(u32, u32)>);

/// An `aws` Cluster named demo.example.com, then one InstanceGroup per `(name, role, sizes)`
/// (`minSize`/`maxSize` when given). `spec` is whole lines that follow `cloudProvider: aws`
/// under the cluster's `spec:`.
pub(crate) fn aws_stream(spec: &str, groups: &[Group]) -> String {
    let mut text = format!(
        "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: demo.example.com\n\
         spec:\n  cloudProvider: aws\n{spec}"
    );
    for (name, role, sizes) in groups {
        text += &format!(
            "---\napiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: {name}\n\
             spec:\n  role: {role}\n"
        );
        if let Some((min, max)) = sizes {
            text += &format!("  minSize: {min}\n  maxSize: {max}\n");
        }
    }
    text
}
