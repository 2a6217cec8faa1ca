use crate::support::moto::moto;

/// The harness itself: moto answers S3 calls from the real SDK.
#[tokio::test]
async fn moto_answers_the_sdk() {
    crate::needs_tier!(Moto);
    let m = moto();
    let s3 = m.s3().await;
    s3.create_bucket()
        .bucket("kprov-smoke")
        .send()
        .await
        .expect("create bucket");
    let buckets = s3.list_buckets().send().await.expect("list");
    assert!(
        buckets
            .buckets()
            .iter()
            .any(|b| b.name() == Some("kprov-smoke")),
        "{}",
        m.log_tail()
    );
}
