//! The cluster's Route 53 zone (`spec.dns.zone`): adopted by name, never made, changed or
//! deleted by kprov; the plan checks it exists and is as private as the spec says.

use super::{Apply, Delete, Done, Task, never_created};
use crate::cloud::aws::dns::ZoneRead;
use crate::cloud::aws::kinds::{AwsKind, DnsKind};
use crate::cloud::engine::{CloudError, CloudId};

task! {
    struct DnsZone: AwsKind::Dns(DnsKind::Zone), listed ZoneRead as z;
    /// Fully qualified, with its trailing dot (as Route 53 lists it).
    zone_name: String = ZONE_NAME("zoneName") <- z.name.clone();
    private: bool = PRIVATE("private") <- z.is_private;
}

impl Task for DnsZone {
    /// Adopted (ExistsAndValidates): the engine never creates it.
    async fn create(&self, _: Apply<'_>) -> Result<CloudId, CloudError> {
        Err(never_created(self))
    }
}

impl Delete for DnsZone {
    /// Adopted (ExistsAndValidates): the engine never deletes it.
    async fn delete(&self, _: Apply<'_>) -> Done {
        Err(CloudError::Model(format!(
            "{}: kprov does not delete a DNS zone",
            self.id()
        )))
    }
}
