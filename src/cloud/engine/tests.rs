//! Engine tests against an in-memory cloud that enforces what real clouds enforce: references
//! must exist at create time, and nothing may be deleted while something still points at it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;

use super::*;
use crate::cloud::{Actual, Provider};

// The test cloud's kinds (the engine takes any provider's set).
const K: Kind = Kind::new("K");
const NET: Kind = Kind::new("Net");
const DOC: Kind = Kind::new("Doc");
const OLD: Kind = Kind::new("Old");
const KS: [Kind; 3] = [Kind::new("K0"), Kind::new("K1"), Kind::new("K2")];

/// Reads the actual state through `provider` (read-only) and diffs it against `desired`: what
/// a provider's own plan does around its checks.
async fn plan(
    provider: &dyn Provider,
    cluster: &str,
    desired: Vec<Resource>,
) -> Result<Plan, CloudError> {
    let actual = provider.read(cluster, &desired).await?;
    diff(cluster, desired, actual)
}

fn id(s: &str) -> CloudId {
    CloudId::new(s).expect("a test ID is not empty")
}

#[derive(Default)]
struct MemCloud {
    state: Mutex<BTreeMap<ResourceId, Resource>>,
    next: Mutex<u32>,
    /// Remaining throttling errors to answer per resource before succeeding.
    throttle: Mutex<BTreeMap<ResourceId, usize>>,
    /// Remaining "not found (yet)" answers per resource (AWS eventual consistency).
    not_found: Mutex<BTreeMap<ResourceId, usize>>,
}

impl MemCloud {
    fn with(resources: Vec<Resource>) -> Self {
        let m = MemCloud::default();
        for mut r in resources {
            r.cloud_id = Some(m.fresh_id());
            m.state.lock().unwrap().insert(r.id.clone(), r);
        }
        m
    }

    fn fresh_id(&self) -> CloudId {
        let mut n = self.next.lock().unwrap();
        *n += 1;
        id(&format!("mem-{n}"))
    }

    fn throttled(&self, id: &ResourceId) -> Result<(), CloudError> {
        if let Some(n) = self.not_found.lock().unwrap().get_mut(id)
            && *n > 0
        {
            *n -= 1;
            return Err(CloudError::Api {
                operation: "Mem".into(),
                class: ErrorClass::NotFound,
                code: Some("InvalidGroup.NotFound".into()),
                message: "InvalidGroup.NotFound: no such group".into(),
            });
        }
        let mut t = self.throttle.lock().unwrap();
        match t.get_mut(id) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(CloudError::Api {
                    operation: "Mem".into(),
                    class: ErrorClass::Throttled,
                    code: Some("Throttling".into()),
                    message: "slow down".into(),
                })
            }
            _ => Ok(()),
        }
    }

    fn fields(&self) -> BTreeMap<ResourceId, BTreeMap<String, Value>> {
        self.state
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.fields.clone()))
            .collect()
    }
}

#[async_trait]
impl Provider for MemCloud {
    async fn read(&self, _cluster: &str, _desired: &[Resource]) -> Result<Actual, CloudError> {
        Ok(Actual {
            resources: self.state.lock().unwrap().values().cloned().collect(),
            warnings: vec![],
            conflicts: vec![],
        })
    }

    async fn create(&self, want: &Resource, ids: &IdMap) -> Result<CloudId, CloudError> {
        self.throttled(&want.id)?;
        let state = self.state.lock().unwrap();
        for d in want.dependencies() {
            if !state.contains_key(&d) || !ids.contains_key(&d) {
                return Err(CloudError::Model(format!("{} created before {d}", want.id)));
            }
        }
        drop(state);
        let mut r = Resource::new(want.id.kind, want.id.name.clone());
        r.fields = want.fields.clone();
        let cid = self.fresh_id();
        r.cloud_id = Some(cid.clone());
        self.state.lock().unwrap().insert(want.id.clone(), r);
        Ok(cid)
    }

    async fn update(
        &self,
        want: &Resource,
        _have: &Resource,
        _changes: &[FieldChange],
        _ids: &IdMap,
    ) -> Result<(), CloudError> {
        self.throttled(&want.id)?;
        let mut state = self.state.lock().unwrap();
        let r = state
            .get_mut(&want.id)
            .ok_or_else(|| CloudError::Model(format!("{} vanished", want.id)))?;
        r.fields = want.fields.clone();
        Ok(())
    }

    async fn delete(&self, have: &Resource, _ids: &IdMap) -> Result<(), CloudError> {
        let mut state = self.state.lock().unwrap();
        if let Some(user) = state
            .values()
            .find(|r| r.id != have.id && r.dependencies().contains(&have.id))
        {
            return Err(CloudError::Model(format!(
                "{} deleted while {} uses it",
                have.id, user.id
            )));
        }
        state.remove(&have.id);
        Ok(())
    }
}

fn quick() -> ApplyOptions {
    ApplyOptions {
        parallelism: 3,
        resource_deadline: Duration::from_secs(5),
        propagation: Duration::from_millis(100),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
        prune: true,
        on_done: None,
        on_wait: None,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// A random resource set: resource i may refer only to resources before it (no cycles).
fn resources(max: usize) -> impl Strategy<Value = Vec<Resource>> {
    prop::collection::vec(
        (
            prop::bool::weighted(0.8),
            0i64..3,
            prop::sample::select(vec!["x", "y"]),
            prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        ),
        0..max,
    )
    .prop_map(|specs| {
        let present: Vec<bool> = specs.iter().map(|s| s.0).collect();
        specs
            .iter()
            .enumerate()
            .filter(|(i, _)| present[*i])
            .map(|(i, (_, a, b, deps))| {
                let refs: Vec<Value> = deps
                    .iter()
                    .filter(|_| i > 0)
                    .map(|d| d.index(i))
                    .filter(|j| present[*j])
                    .map(|j| Value::reference(KS[j % 3], format!("r{j}")))
                    .collect();
                Resource::new(KS[i % 3], format!("r{i}"))
                    .field("a", Value::Int(*a))
                    .field("b", Value::str(*b))
                    .field("uses", Value::set(refs))
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The plan classifies every resource correctly, applying it (with prune) makes the cloud
    /// equal to the desired set in an order the cloud accepts, and the next plan is empty.
    #[test]
    fn apply_converges(desired in resources(10), actual in resources(10)) {
        let cloud = MemCloud::with(actual.clone());
        let rt = rt();
        let plan = rt.block_on(plan(&cloud, "c", desired.clone())).unwrap();
        let want: BTreeMap<_, _> = desired.iter().map(|r| (r.id.clone(), r)).collect();
        let have: BTreeMap<_, _> = actual.iter().map(|r| (r.id.clone(), r)).collect();
        let creates = want.keys().filter(|k| !have.contains_key(*k)).count();
        let deletes = have.keys().filter(|k| !want.contains_key(*k)).count();
        let updates = want.iter().filter(|(k, w)| have.get(*k).is_some_and(|h| h.fields != w.fields)).count();
        prop_assert_eq!(plan.summary.create, creates);
        prop_assert_eq!(plan.summary.delete, deletes);
        prop_assert_eq!(plan.summary.update, updates);
        for c in plan.changes.iter().filter(|c| c.action == Action::Update) {
            for f in &c.fields {
                prop_assert_ne!(&f.old, &f.new);
            }
        }
        // The progress hook sees every finished resource exactly once, as the report does.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook = {
            let seen = seen.clone();
            super::DoneHook(std::sync::Arc::new(move |a, id: &super::ResourceId| seen.lock().unwrap().push((a, id.clone()))))
        };
        let report = rt.block_on(apply(&cloud, &plan, &ApplyOptions { on_done: Some(hook), ..quick() })).unwrap();
        prop_assert_eq!(seen.lock().unwrap().clone(), report.done);
        let expect: BTreeMap<_, _> = desired.iter().map(|r| (r.id.clone(), r.fields.clone())).collect();
        prop_assert_eq!(cloud.fields(), expect);
        let again = rt.block_on(self::plan(&cloud, "c", desired)).unwrap();
        prop_assert!(again.is_empty());
    }

    /// Without prune nothing is deleted, and what remains still converges otherwise.
    #[test]
    fn no_prune_keeps_extras(desired in resources(8), actual in resources(8)) {
        let cloud = MemCloud::with(actual.clone());
        let rt = rt();
        let plan = rt.block_on(plan(&cloud, "c", desired.clone())).unwrap();
        rt.block_on(apply(&cloud, &plan, &ApplyOptions { prune: false, ..quick() })).unwrap();
        let state = cloud.fields();
        for r in &actual {
            prop_assert!(state.contains_key(&r.id));
        }
        for r in &desired {
            prop_assert_eq!(state.get(&r.id), Some(&r.fields));
        }
    }

    /// Diffing anything against itself finds nothing.
    #[test]
    fn diff_of_equal_sets_is_empty(set in resources(12)) {
        let actual = Actual {
            resources: set.iter().cloned().map(|r| r.cloud_id(id("x"))).collect(),
            warnings: vec![],
            conflicts: vec![],
        };
        let p = diff("c", set, actual).unwrap();
        prop_assert!(p.is_empty());
        prop_assert_eq!(p.exit_code(true), 0);
    }
}

/// Plans and applies one resource against a cloud that first answers it `times` times with
/// one of its transient errors (`answers` picks which counter): apply's error when it gave
/// up, and how many resources the cloud then holds.
fn apply_answered(
    answers: fn(&MemCloud) -> &Mutex<BTreeMap<ResourceId, usize>>,
    times: usize,
    opts: &ApplyOptions,
) -> (Option<String>, usize) {
    let cloud = MemCloud::default();
    let r = Resource::new(K, "a").field("a", Value::Int(1));
    answers(&cloud).lock().unwrap().insert(r.id.clone(), times);
    let rt = rt();
    let p = rt.block_on(plan(&cloud, "c", vec![r])).unwrap();
    let err = rt.block_on(apply(&cloud, &p, opts)).err();
    (err.map(|e| e.to_string()), cloud.fields().len())
}

#[test]
fn throttling_is_retried_until_the_deadline() {
    assert_eq!(apply_answered(|c| &c.throttle, 3, &quick()), (None, 1));

    let opts = ApplyOptions {
        resource_deadline: Duration::from_millis(50),
        ..quick()
    };
    let (err, _) = apply_answered(|c| &c.throttle, usize::MAX, &opts);
    let err = err.expect("gives up at the deadline");
    assert!(err.contains("K/a: not done within 50ms"), "{err}");
    assert!(err.contains("slow down"), "{err}");
    assert!(err.contains("throttled by the API"), "{err}");
}

/// "Not found" (an ID not propagated yet) is retried for the propagation window only: a
/// resource that meets it a few times is created, one that meets it past the window fails
/// then, long before the resource deadline, naming the answer.
#[test]
fn not_found_is_retried_within_the_propagation_window_only() {
    assert_eq!(apply_answered(|c| &c.not_found, 3, &quick()), (None, 1));

    let opts = ApplyOptions {
        resource_deadline: Duration::from_secs(30),
        propagation: Duration::from_millis(50),
        ..quick()
    };
    let t = std::time::Instant::now();
    let (err, _) = apply_answered(|c| &c.not_found, usize::MAX, &opts);
    let err = err.expect("gives up after the propagation window");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(err.contains("K/a: Mem: InvalidGroup.NotFound"), "{err}");
}

#[test]
fn immutable_changes_are_refused_and_replacements_planned() {
    let have = Resource::new(NET, "main")
        .field("cidr", Value::str("10.0.0.0/16"))
        .field("key", Value::str("k1"));
    let cloud = MemCloud::with(vec![have]);
    let want = Resource::new(NET, "main")
        .field("cidr", Value::str("10.1.0.0/16"))
        .field("key", Value::str("k1"))
        .rule("cidr", FieldRule::Immutable);
    let rt = rt();
    let p = rt.block_on(plan(&cloud, "c", vec![want])).unwrap();
    assert_eq!(p.errors.len(), 1);
    assert!(
        p.errors[0]
            .contains("Net/main: field cidr cannot change (\"10.0.0.0/16\" -> \"10.1.0.0/16\")"),
        "{}",
        p.errors[0]
    );
    let err = rt.block_on(apply(&cloud, &p, &quick())).unwrap_err();
    assert!(matches!(err, CloudError::Refused(_)));
    assert_eq!(p.exit_code(true), 1);

    let want = Resource::new(NET, "main")
        .field("cidr", Value::str("10.0.0.0/16"))
        .field("key", Value::str("k2"))
        .rule("key", FieldRule::Replace);
    let p = rt.block_on(plan(&cloud, "c", vec![want])).unwrap();
    assert_eq!(p.summary.replace, 1);
    let before = cloud.state.lock().unwrap()[&ResourceId::new(NET, "main")]
        .cloud_id
        .clone();
    rt.block_on(apply(&cloud, &p, &quick())).unwrap();
    let after = cloud.state.lock().unwrap()[&ResourceId::new(NET, "main")]
        .cloud_id
        .clone();
    assert_ne!(before, after, "a replacement is a new cloud resource");
}

#[test]
fn adopted_resources_must_exist_and_match() {
    let cloud = MemCloud::default();
    let want = Resource::new(NET, "main")
        .lifecycle(Lifecycle::ExistsAndValidates)
        .cloud_id(id("vpc-123"))
        .field("cidr", Value::str("10.0.0.0/16"));
    let p = rt()
        .block_on(plan(&cloud, "c", vec![want.clone()]))
        .unwrap();
    assert!(p.changes.is_empty());
    assert_eq!(
        p.errors,
        ["Net/main: must already exist (vpc-123) but was not found"]
    );

    let cloud = MemCloud::with(vec![
        Resource::new(NET, "main")
            .lifecycle(Lifecycle::ExistsAndValidates)
            .field("cidr", Value::str("10.9.0.0/16")),
    ]);
    let p = rt().block_on(plan(&cloud, "c", vec![want])).unwrap();
    assert!(p.changes.is_empty(), "an adopted resource is never changed");
    assert!(
        p.errors[0].contains("adopted resource differs"),
        "{:?}",
        p.errors
    );
}

#[test]
fn cycles_and_dangling_references_are_model_errors() {
    let a = Resource::new(K, "a").field("x", Value::reference(K, "b"));
    let b = Resource::new(K, "b").field("x", Value::reference(K, "a"));
    let err = diff("c", vec![a.clone(), b], Actual::default()).unwrap_err();
    assert!(err.to_string().contains("dependency cycle"), "{err}");
    let err = diff("c", vec![a], Actual::default()).unwrap_err();
    assert!(err.to_string().contains("K/a depends on K/b"), "{err}");
}

#[test]
fn preview_text_groups_diffs_documents_and_colours_on_request() {
    let have = Resource::new(DOC, "d")
        .field("body", Value::Doc("a\nb\nc\n".into()))
        .field("n", Value::Int(1))
        .field("set", Value::set(vec![Value::str("x"), Value::str("y")]))
        .cloud_id(id("d-1"));
    let want = Resource::new(DOC, "d")
        .field("body", Value::Doc("a\nB\nc\n".into()))
        .field("n", Value::Int(2))
        .field("set", Value::set(vec![Value::str("y"), Value::str("z")]));
    let extra = Resource::new(OLD, "o").cloud_id(id("o-1"));
    let p = diff(
        "c",
        vec![want],
        Actual {
            resources: vec![have, extra],
            warnings: vec!["careful".into()],
            conflicts: vec![],
        },
    )
    .unwrap();
    let plain = render_text(&p, RenderOptions::default());
    assert_eq!(
        plain,
        "Warning: careful\n\n\
         Will modify resources:\n  Doc\n    ~ d (d-1)\n      body:\n         a\n        -b\n        +B\n         c\n      n: 1 -> 2\n      set:\n        - \"x\"\n        + \"z\"\n\n\
         Would delete resources (owned but no longer in the spec; run with --prune):\n  Old\n    - o (o-1)\n\n\
         Plan: 0 to create, 1 to modify, 0 to replace, 1 to delete (deletions need --prune).\n"
    );
    assert!(!plain.contains('\u{1b}'));
    let colour = render_text(
        &p,
        RenderOptions {
            color: true,
            prune: true,
        },
    );
    assert!(colour.contains("\u{1b}[31m-b"), "{colour:?}");
    assert!(colour.contains("Will delete resources:"));
    assert_eq!(p.exit_code(false), 2);
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["schemaVersion"], 2);
    assert_eq!(json["changes"][0]["fields"][1]["old"], 1);
    assert_eq!(json["changes"][1]["action"], "delete");
}

/// Text read back from the cloud becomes an identity only with a kind of the provider's set;
/// anything else is an error naming the tag, escaped.
#[test]
fn an_identity_tag_parses_only_to_a_known_kind() {
    let kinds = [K, NET];
    assert_eq!(
        ResourceId::parse("Net/main", &kinds).ok(),
        Some(ResourceId::new(NET, "main"))
    );
    assert_eq!(
        ResourceId::parse("K/a/b", &kinds).ok(),
        Some(ResourceId::new(K, "a/b")),
        "the name is everything after the first slash"
    );
    for (tag, why) in [
        ("Bucket/logs", "not a resource kind of this provider"),
        ("Doc/d", "not a resource kind of this provider"),
        ("Net", "not of the form Kind/name"),
        ("Net/", "no name after the kind"),
        ("/main", "not a resource kind of this provider"),
    ] {
        let e = ResourceId::parse(tag, &kinds).expect_err(tag);
        assert_eq!(
            e.to_string(),
            format!("resource model: identity tag \"{tag}\": {why}")
        );
    }
    let e = ResourceId::parse("X\u{1b}[2J/a", &kinds).expect_err("unknown");
    assert!(!e.to_string().contains('\u{1b}'), "{e}");
    assert!(e.to_string().contains("X\\x1b[2J/a"), "{e}");
}
