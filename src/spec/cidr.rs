//! Subnet CIDR allocation for clusters created from flags (kops's layout: a /19 per zone for
//! node subnets, a /22 per zone for utility subnets of private topologies).

use ipnet::Ipv4Net;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CidrError {
    #[error(
        "networkCIDR {network} is too small for {wanted} subnets of /{prefix} (use a /16 or larger)"
    )]
    TooSmall {
        network: Ipv4Net,
        wanted: usize,
        prefix: u8,
    },
}

/// Picks `count` consecutive, non-overlapping subnets of `prefix` inside `network`, skipping
/// any that overlap `taken`.
pub(crate) fn allocate(
    network: Ipv4Net,
    prefix: u8,
    count: usize,
    taken: &[Ipv4Net],
) -> Result<Vec<Ipv4Net>, CidrError> {
    let too_small = || CidrError::TooSmall {
        network,
        wanted: count,
        prefix,
    };
    if count == 0 {
        return Ok(Vec::new());
    }
    let candidates = network.subnets(prefix).map_err(|_| too_small())?;
    let out: Vec<Ipv4Net> = candidates
        .filter(|c| !taken.iter().any(|t| overlaps(*c, *t)))
        .take(count)
        .collect();
    if out.len() < count {
        Err(too_small())
    } else {
        Ok(out)
    }
}

pub(crate) fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// kops layout: node subnets (/19) first but leaving the first /19 for utility /22s, so
/// zones a, b, c get 172.20.32.0/19, 172.20.64.0/19, ... and utility 172.20.0.0/22, ...
pub(crate) fn kops_layout(
    network: Ipv4Net,
    zones: usize,
    utility: bool,
) -> Result<(Vec<Ipv4Net>, Vec<Ipv4Net>), CidrError> {
    let node_prefix = (network.prefix_len() + 3).clamp(19, 28);
    let first_block = network.subnets(node_prefix).ok().and_then(|mut s| s.next());
    let reserved: Vec<Ipv4Net> = first_block.into_iter().collect();
    let nodes = allocate(network, node_prefix, zones, &reserved)?;
    let utilities = if utility {
        let util_prefix = (node_prefix + 3).min(28);
        allocate(network, util_prefix, zones, &nodes)?
    } else {
        Vec::new()
    };
    Ok((nodes, utilities))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kops_default_layout() {
        let net: Ipv4Net = "172.20.0.0/16".parse().unwrap();
        let (nodes, util) = kops_layout(net, 3, true).unwrap();
        let n: Vec<String> = nodes.iter().map(|c| c.to_string()).collect();
        let u: Vec<String> = util.iter().map(|c| c.to_string()).collect();
        assert_eq!(n, ["172.20.32.0/19", "172.20.64.0/19", "172.20.96.0/19"]);
        assert_eq!(u, ["172.20.0.0/22", "172.20.4.0/22", "172.20.8.0/22"]);
    }

    #[test]
    fn too_small_network_is_an_error() {
        let net: Ipv4Net = "10.0.0.0/28".parse().unwrap();
        assert!(kops_layout(net, 3, true).is_err());
    }

    proptest! {
        #[test]
        fn allocations_are_inside_and_disjoint(a in any::<u32>(), len in 8u8..=24, zones in 1usize..8, util in any::<bool>()) {
            let net = Ipv4Net::new(std::net::Ipv4Addr::from(a), len).unwrap().trunc();
            if let Ok((nodes, utils)) = kops_layout(net, zones, util) {
                prop_assert_eq!(nodes.len(), zones);
                prop_assert_eq!(utils.len(), if util { zones } else { 0 });
                let all: Vec<Ipv4Net> = nodes.iter().chain(utils.iter()).copied().collect();
                for (i, x) in all.iter().enumerate() {
                    prop_assert!(net.contains(x));
                    for y in &all[i + 1..] {
                        prop_assert!(!overlaps(*x, *y), "{} overlaps {}", x, y);
                    }
                }
            }
        }
    }
}
