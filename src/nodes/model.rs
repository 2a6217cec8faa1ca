//! The node core (issue 19): what the node plan and the provisioner both speak of, below both,
//! so neither imports the other for it (`provision::plan` reads a host's facts, and
//! `provision::orchestrate` gathers them in preflight).

use crate::spec::assets::Arch;

/// What preflight learnt about a host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    pub(crate) hostname: String,
    pub(crate) machine: String,
    pub(crate) product_uuid: String,
    pub(crate) macs: Vec<String>,
}

impl Facts {
    pub(crate) fn parse(text: &str) -> Facts {
        let mut f = Facts::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let v = v.trim();
            match k {
                "hostname" => f.hostname = v.to_string(),
                "machine" => f.machine = v.to_string(),
                "product_uuid" => f.product_uuid = v.to_string(),
                "macs" => f.macs = v.split_whitespace().map(str::to_string).collect(),
                _ => {}
            }
        }
        f
    }

    pub(crate) fn arch(&self) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.uname() == self.machine)
    }
}
