//! Address ranges of classes (the drivers', and `address-controller adopt`'s): CIDRs (`192.0.2.0/28`) and, where a driver allows them,
//! inclusive ranges (`192.0.2.10-192.0.2.20`) of one family; parsing a class's list of them,
//! overlaps between classes, capacity, and the first free address. Pure functions, no I/O —
//! every driver that hands out addresses from ranges needs them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::Family;
use crate::family::family_of_ip;

/// One block of a class's addresses: a CIDR, or (`range` set) the inclusive range from
/// `network` to `range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub network: IpAddr,
    pub prefix: u8,
    /// The last address of an `a-b` range (`prefix` is then the family's width).
    pub range: Option<IpAddr>,
}

/// Why the parameters of a class cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("spec.parameters.{0} is missing")]
    Missing(&'static str),
    #[error("spec.parameters.{0} must be a list of strings")]
    NotAList(&'static str),
    #[error("spec.parameters.{0} is empty")]
    Empty(&'static str),
    #[error("{0:?} is not a CIDR such as 192.0.2.0/28 or 2001:db8::/120")]
    Invalid(String),
    #[error("{0:?} is not a range such as 192.0.2.10-192.0.2.20 (one family, first before last)")]
    InvalidRange(String),
    #[error("{0:?} has host bits set; did you mean {1}?")]
    HostBits(String, String),
    #[error("{0} overlaps {1}")]
    Overlap(String, String),
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.range {
            Some(last) => write!(f, "{}-{}", self.network, last),
            None => write!(f, "{}/{}", self.network, self.prefix),
        }
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn width(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn from_bits(v4: bool, n: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, ParamError> {
        let invalid = || ParamError::Invalid(s.to_string());
        let (ip, prefix) = s.split_once('/').ok_or_else(invalid)?;
        let network: IpAddr = ip.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        if prefix > width(network) {
            return Err(invalid());
        }
        let cidr = Cidr {
            network,
            prefix,
            range: None,
        };
        if bits(network) != cidr.first_bits() {
            let fixed = Cidr {
                network: from_bits(network.is_ipv4(), cidr.first_bits()),
                prefix,
                range: None,
            };
            return Err(ParamError::HostBits(s.to_string(), fixed.to_string()));
        }
        Ok(cidr)
    }

    /// Parses an inclusive range `a-b` of one family.
    pub fn parse_range(s: &str) -> Result<Cidr, ParamError> {
        let invalid = || ParamError::InvalidRange(s.to_string());
        let (a, b) = s.split_once('-').ok_or_else(invalid)?;
        let first: IpAddr = a.trim().parse().map_err(|_| invalid())?;
        let last: IpAddr = b.trim().parse().map_err(|_| invalid())?;
        if first.is_ipv4() != last.is_ipv4() || bits(first) > bits(last) {
            return Err(invalid());
        }
        Ok(Cidr {
            network: first,
            prefix: width(first),
            range: Some(last),
        })
    }

    /// Parses a CIDR, or — with `ranges` — an `a-b` range too.
    pub fn parse_block(s: &str, ranges: bool) -> Result<Cidr, ParamError> {
        if ranges && s.contains('-') {
            Cidr::parse_range(s)
        } else {
            Cidr::parse(s)
        }
    }

    fn mask(&self) -> u128 {
        let w = width(self.network);
        let host = u32::from(w - self.prefix);
        let all = if w == 32 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        if host >= 128 {
            0
        } else {
            all & !((1u128 << host) - 1)
        }
    }

    fn first_bits(&self) -> u128 {
        if self.range.is_some() {
            return bits(self.network);
        }
        bits(self.network) & self.mask()
    }

    fn last_bits(&self) -> u128 {
        if let Some(last) = self.range {
            return bits(last);
        }
        let w = width(self.network);
        let all = if w == 32 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        self.first_bits() | (all & !self.mask())
    }

    pub fn family(&self) -> Family {
        family_of_ip(self.network)
    }

    /// The usable range: IPv4 network and broadcast addresses of a CIDR are skipped for
    /// prefixes shorter than /31 (RFC 3021 makes both addresses of a /31 usable); a range is
    /// used whole.
    fn usable(&self) -> (u128, u128) {
        let (first, last) = (self.first_bits(), self.last_bits());
        if self.network.is_ipv4() && self.prefix < 31 && self.range.is_none() {
            (first + 1, last - 1)
        } else {
            (first, last)
        }
    }

    /// How many addresses can be handed out (saturating).
    pub fn capacity(&self) -> u128 {
        let (first, last) = self.usable();
        (last - first).saturating_add(1)
    }

    /// Whether `ip` lies in this CIDR.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.network.is_ipv4()
            && (self.first_bits()..=self.last_bits()).contains(&bits(ip))
    }

    fn overlaps(&self, other: &Cidr) -> bool {
        self.network.is_ipv4() == other.network.is_ipv4()
            && self.first_bits() <= other.last_bits()
            && other.first_bits() <= self.last_bits()
    }
}

/// Parses `spec.parameters` of a class: `{"cidrs": ["192.0.2.0/28", "2001:db8::/120"]}`.
pub fn parse_parameters(parameters: Option<&serde_json::Value>) -> Result<Vec<Cidr>, ParamError> {
    parse_blocks(parameters, "cidrs", false)
}

/// Parses `spec.parameters` of a MetalLB or Cilium driver's class: `{"addresses": [...]}`, CIDRs and
/// `a-b` ranges as MetalLB's `IPAddressPool.spec.addresses`.
pub fn parse_metallb_addresses(
    parameters: Option<&serde_json::Value>,
) -> Result<Vec<Cidr>, ParamError> {
    parse_blocks(parameters, "addresses", true)
}

/// The addresses of a class of one of the drivers this project ships, by its provisioner
/// (`None`: another driver's class — only that driver reads its parameters).
pub fn shipped_class_blocks(
    provisioner: &str,
    parameters: Option<&serde_json::Value>,
) -> Option<Result<Vec<Cidr>, ParamError>> {
    use crate::names::driver::{CILIUM_PROVISIONER, METALLB_PROVISIONER, RANGE_PROVISIONER};
    match provisioner {
        RANGE_PROVISIONER => Some(parse_parameters(parameters)),
        METALLB_PROVISIONER | CILIUM_PROVISIONER => Some(parse_metallb_addresses(parameters)),
        _ => None,
    }
}

/// Parses the list under `key` of `spec.parameters`: CIDRs, and with `ranges` also `a-b`
/// ranges; no two may overlap.
pub fn parse_blocks(
    parameters: Option<&serde_json::Value>,
    key: &'static str,
    ranges: bool,
) -> Result<Vec<Cidr>, ParamError> {
    let list = parameters
        .and_then(|p| p.get(key))
        .ok_or(ParamError::Missing(key))?;
    let items = list.as_array().ok_or(ParamError::NotAList(key))?;
    if items.is_empty() {
        return Err(ParamError::Empty(key));
    }
    let mut cidrs = Vec::new();
    for item in items {
        let s = item.as_str().ok_or(ParamError::NotAList(key))?;
        let c = Cidr::parse_block(s, ranges)?;
        if let Some(prev) = cidrs.iter().find(|p: &&Cidr| p.overlaps(&c)) {
            return Err(ParamError::Overlap(c.to_string(), prev.to_string()));
        }
        cidrs.push(c);
    }
    Ok(cidrs)
}

/// The first CIDR of `theirs` that overlaps one of `ours`, as (ours, theirs).
pub fn overlap_between(ours: &[Cidr], theirs: &[Cidr]) -> Option<(Cidr, Cidr)> {
    ours.iter()
        .find_map(|a| theirs.iter().find(|b| a.overlaps(b)).map(|b| (*a, *b)))
}

/// Capacity per family, saturating at `i64::MAX` (an IPv6 /64 holds more than that).
pub fn capacity(cidrs: &[Cidr]) -> (i64, i64) {
    let sum = |f: Family| {
        let total = cidrs
            .iter()
            .filter(|c| c.family() == f)
            .fold(0u128, |acc, c| acc.saturating_add(c.capacity()));
        i64::try_from(total).unwrap_or(i64::MAX)
    };
    (sum(Family::IPv4), sum(Family::IPv6))
}

/// How many addresses the allocator looks at before it declares a range exhausted; keeps a
/// pass bounded on huge IPv6 ranges (the used set is what can block it, and that is finite).
const SCAN_LIMIT: u128 = 1 << 20;

/// The first free address of `family` in `cidrs`, in order, skipping those `in_use`.
pub fn first_free(
    cidrs: &[Cidr],
    family: Family,
    in_use: &dyn Fn(IpAddr) -> bool,
) -> Option<IpAddr> {
    for c in cidrs.iter().filter(|c| c.family() == family) {
        let (first, last) = c.usable();
        let end = last.min(first.saturating_add(SCAN_LIMIT));
        // An inclusive range: `end` may be the last address of the space (`ffff:…:ffff`),
        // where a `n += 1` loop would overflow.
        if let Some(ip) = (first..=end)
            .map(|n| from_bits(c.network.is_ipv4(), n))
            .find(|ip| !in_use(*ip))
        {
            return Some(ip);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// "In use" for the addresses of `list`.
    fn ips(list: &[&str]) -> impl Fn(IpAddr) -> bool {
        let set: std::collections::HashSet<IpAddr> =
            list.iter().map(|s| s.parse().unwrap()).collect();
        move |ip| set.contains(&ip)
    }

    #[test]
    fn parameters() {
        let ok =
            parse_parameters(Some(&json!({"cidrs": ["192.0.2.0/28", "2001:db8::/120"]}))).unwrap();
        assert_eq!(ok.len(), 2);
        let cases = [
            (None, ParamError::Missing("cidrs")),
            (Some(json!({})), ParamError::Missing("cidrs")),
            (
                Some(json!({"cidrs": "192.0.2.0/28"})),
                ParamError::NotAList("cidrs"),
            ),
            (Some(json!({"cidrs": [1]})), ParamError::NotAList("cidrs")),
            (Some(json!({"cidrs": []})), ParamError::Empty("cidrs")),
            (
                Some(json!({"cidrs": ["192.0.2.0"]})),
                ParamError::Invalid("192.0.2.0".into()),
            ),
            (
                Some(json!({"cidrs": ["192.0.2.0/33"]})),
                ParamError::Invalid("192.0.2.0/33".into()),
            ),
            (
                Some(json!({"cidrs": ["nonsense/8"]})),
                ParamError::Invalid("nonsense/8".into()),
            ),
            (
                Some(json!({"cidrs": ["192.0.2.1/28"]})),
                ParamError::HostBits("192.0.2.1/28".into(), "192.0.2.0/28".into()),
            ),
            (
                Some(json!({"cidrs": ["192.0.2.0/24", "192.0.2.128/25"]})),
                ParamError::Overlap("192.0.2.128/25".into(), "192.0.2.0/24".into()),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_parameters(input.as_ref()), Err(want), "{input:?}");
        }
        let a = parse_parameters(Some(&json!({"cidrs": ["192.0.2.0/28"]}))).unwrap();
        let b =
            parse_parameters(Some(&json!({"cidrs": ["192.0.2.8/29", "2001:db8::/64"]}))).unwrap();
        assert!(overlap_between(&a, &b).is_some());
        let c = parse_parameters(Some(&json!({"cidrs": ["192.0.2.16/28"]}))).unwrap();
        assert!(overlap_between(&a, &c).is_none());
    }

    #[test]
    fn first_free_skips_network_broadcast_and_used() {
        let cidrs = parse_parameters(Some(
            &json!({"cidrs": ["192.0.2.0/30", "198.51.100.0/31", "2001:db8::/127"]}),
        ))
        .unwrap();
        // /30: .1 and .2 usable; then the /31: both usable.
        assert_eq!(
            first_free(&cidrs, Family::IPv4, &ips(&[])),
            Some("192.0.2.1".parse().unwrap())
        );
        assert_eq!(
            first_free(&cidrs, Family::IPv4, &ips(&["192.0.2.1"])),
            Some("192.0.2.2".parse().unwrap())
        );
        assert_eq!(
            first_free(&cidrs, Family::IPv4, &ips(&["192.0.2.1", "192.0.2.2"])),
            Some("198.51.100.0".parse().unwrap())
        );
        assert_eq!(
            first_free(
                &cidrs,
                Family::IPv4,
                &ips(&["192.0.2.1", "192.0.2.2", "198.51.100.0", "198.51.100.1"])
            ),
            None
        );
        // IPv6 uses every address, including the first.
        assert_eq!(
            first_free(&cidrs, Family::IPv6, &ips(&[])),
            Some("2001:db8::".parse().unwrap())
        );
        assert_eq!(
            first_free(&cidrs, Family::IPv6, &ips(&["2001:db8::", "2001:db8::1"])),
            None
        );
        let one = parse_parameters(Some(&json!({"cidrs": ["192.0.2.7/32"]}))).unwrap();
        assert_eq!(
            first_free(&one, Family::IPv4, &ips(&[])),
            Some("192.0.2.7".parse().unwrap())
        );
        assert_eq!(first_free(&one, Family::IPv6, &ips(&[])), None);
    }

    #[test]
    fn ranges_are_used_whole() {
        let blocks = parse_blocks(
            Some(&json!({"addresses": ["192.0.2.10-192.0.2.12", "192.0.2.0/30"]})),
            "addresses",
            true,
        )
        .unwrap();
        assert_eq!(blocks[0].to_string(), "192.0.2.10-192.0.2.12");
        assert_eq!(capacity(&blocks), (3 + 2, 0));
        assert!(blocks[0].contains("192.0.2.12".parse().unwrap()));
        assert!(!blocks[0].contains("192.0.2.13".parse().unwrap()));
        assert_eq!(
            first_free(&blocks, Family::IPv4, &ips(&["192.0.2.10"])),
            Some("192.0.2.11".parse().unwrap())
        );
        for bad in ["192.0.2.12-192.0.2.10", "192.0.2.1-2001:db8::1", "a-b"] {
            assert!(
                matches!(
                    parse_blocks(Some(&json!({"addresses": [bad]})), "addresses", true),
                    Err(ParamError::InvalidRange(_))
                ),
                "{bad}"
            );
        }
        // Overlap between a range and a CIDR.
        assert!(
            parse_blocks(
                Some(&json!({"addresses": ["192.0.2.0/30", "192.0.2.2-192.0.2.5"]})),
                "addresses",
                true
            )
            .is_err()
        );
        // Without ranges, a dash is not a CIDR.
        assert!(parse_parameters(Some(&json!({"cidrs": ["192.0.2.10-192.0.2.12"]}))).is_err());
    }

    #[test]
    fn the_top_of_the_ipv6_space_is_exhausted_not_wrapped() {
        let top = parse_parameters(Some(
            &json!({"cidrs": ["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126"]}),
        ))
        .unwrap();
        let mut used: Vec<IpAddr> = Vec::new();
        while let Some(ip) = first_free(&top, Family::IPv6, &|ip| used.contains(&ip)) {
            assert!(top[0].contains(ip), "{ip} is outside the class");
            used.push(ip);
        }
        // Four addresses, then exhausted (a `n += 1` past ffff:…:ffff overflowed here).
        assert_eq!(used.len(), 4);
        assert_eq!(
            used.last().copied(),
            Some("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap())
        );
        assert_eq!(capacity(&top), (0, 4));
    }

    #[test]
    fn capacity_counts_usable_addresses() {
        let cidrs = parse_parameters(Some(&json!({"cidrs": ["192.0.2.0/28", "198.51.100.0/31", "203.0.113.9/32", "2001:db8::/120"]}))).unwrap();
        assert_eq!(capacity(&cidrs), (14 + 2 + 1, 256));
        let huge = parse_parameters(Some(&json!({"cidrs": ["2001:db8::/32"]}))).unwrap();
        assert_eq!(capacity(&huge), (0, i64::MAX));
        assert!(first_free(&huge, Family::IPv6, &ips(&[])).is_some());
    }
}
