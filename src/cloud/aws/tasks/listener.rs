//! A load balancer's TCP listener, forwarding to its target group: fixed to its load
//! balancer once made, its port, protocol and target group are changed in place.

use aws_sdk_elasticloadbalancingv2::types::{Action, ActionTypeEnum, ProtocolEnum};

use super::{Apply, Created, Done, LoadBalancer, Ref, TargetGroup, Task};
use crate::cloud::aws::Ctx;
use crate::cloud::aws::elb::{port, tags};
use crate::cloud::aws::kinds::{AwsKind, ElbKind};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap};

task! {
    struct Listener: AwsKind::Elb(ElbKind::Listener), listed ListedListener as l, rd;
    load_balancer: Ref<LoadBalancer> = LOAD_BALANCER("loadBalancer"), Immutable
        <- Ref::read(rd, &l.load_balancer);
    port: i64 = PORT("port") <- l.listener.port().unwrap_or(0).into();
    protocol: String = PROTOCOL("protocol")
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- l.listener.protocol().map(|p| p.as_str()).unwrap_or_default().to_string();
    target_group: Ref<TargetGroup> = TARGET_GROUP("targetGroup")
        <- Ref::read_or_empty(
            rd,
            l.listener.default_actions().iter().find_map(|a| a.target_group_arn()),
        );
}

/// A listener as listed, with the ARN of the load balancer it was listed for.
pub(crate) struct ListedListener {
    pub(crate) load_balancer: String,
    pub(crate) listener: aws_sdk_elasticloadbalancingv2::types::Listener,
}

impl Task for Listener {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        a.elb
            .create_listener()
            .load_balancer_arn(self.load_balancer.resolve(a.ids)?)
            .protocol(ProtocolEnum::from(self.protocol.as_str()))
            .port(port(&id, self.port)?)
            .default_actions(self.forward(a.ids)?)
            .set_tags(Some(tags(a.c, &id)))
            .send()
            .await
            .created(self, "CreateListener", |out| {
                out.listeners().first().and_then(|l| l.listener_arn())
            })
    }

    async fn update(&self, have: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        a.elb
            .modify_listener()
            .listener_arn(have.cloud_id()?)
            .port(port(&self.id(), self.port)?)
            .protocol(ProtocolEnum::from(self.protocol.as_str()))
            .default_actions(self.forward(a.ids)?)
            .send()
            .await
            .ctx("ModifyListener")?;
        Ok(())
    }
}

delete_by_id!(Listener: elb.delete_listener().listener_arn, "DeleteListener");

impl Listener {
    fn forward(&self, ids: &IdMap) -> Result<Action, CloudError> {
        Ok(Action::builder()
            .r#type(ActionTypeEnum::Forward)
            .target_group_arn(self.target_group.resolve(ids)?)
            .build())
    }
}
