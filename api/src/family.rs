//! IP family rules. An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) counts as IPv4: it
//! names an IPv4 endpoint, and counting it as IPv6 would let one IPv4 address satisfy the
//! IPv6 half of a `Dual` claim.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The family of one concrete address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Family {
    IPv4,
    IPv6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::IPv4, Family::IPv6];

    pub fn as_str(self) -> &'static str {
        match self {
            Family::IPv4 => "IPv4",
            Family::IPv6 => "IPv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a string is not a usable address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("{0:?} is not a valid IP address")]
    Invalid(String),
    #[error("{0:?} carries a zone; addresses must not have one")]
    Zoned(String),
}

/// Parses an address as the API accepts it: a plain IPv4 or IPv6 address, no zone, no
/// surrounding whitespace, no prefix length.
pub fn parse_address(s: &str) -> Result<IpAddr, AddressError> {
    if s.contains('%') {
        return Err(AddressError::Zoned(s.to_string()));
    }
    s.parse::<IpAddr>()
        .map_err(|_| AddressError::Invalid(s.to_string()))
}

/// The family an address counts as (IPv4-mapped IPv6 is IPv4).
pub fn family_of_ip(ip: IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::IPv4,
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Family::IPv4,
        IpAddr::V6(_) => Family::IPv6,
    }
}

/// The order in which this project lists addresses wherever it lists more than one (a
/// Service's pins, a claim's, a report): IPv4 first, then by address.
pub fn ipv4_first(ip: IpAddr) -> (bool, IpAddr) {
    (family_of_ip(ip) != Family::IPv4, ip)
}

/// Sorts IPS in the [`ipv4_first`] order and drops duplicates.
pub fn sort_ipv4_first(ips: &mut Vec<IpAddr>) {
    ips.sort_by_key(|ip| ipv4_first(*ip));
    ips.dedup();
}

/// Parses `s` and returns the family it counts as.
pub fn family_of(s: &str) -> Result<Family, AddressError> {
    parse_address(s).map(family_of_ip)
}

/// The default object name of an address: `ipv4-192-0-2-1`, or the fully expanded
/// `ipv6-2001-0db8-0000-…` — every spelling of an address gives one name.
pub fn object_name(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("ipv4-{}-{}-{}-{}", o[0], o[1], o[2], o[3])
        }
        std::net::IpAddr::V6(v6) => {
            let s: Vec<String> = v6.segments().iter().map(|s| format!("{s:04x}")).collect();
            format!("ipv6-{}", s.join("-"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_listed_ipv4_first_then_by_address_once_each() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let mut ips = vec![
            ip("2001:db8::1"),
            ip("192.0.2.9"),
            ip("::ffff:192.0.2.1"),
            ip("192.0.2.9"),
            ip("10.0.0.1"),
        ];
        sort_ipv4_first(&mut ips);
        // IPv4-mapped IPv6 counts as IPv4 (as family_of_ip says), ordered after the plain
        // IPv4 addresses by IpAddr's own order.
        assert_eq!(
            ips,
            [
                ip("10.0.0.1"),
                ip("192.0.2.9"),
                ip("::ffff:192.0.2.1"),
                ip("2001:db8::1")
            ]
        );
    }

    #[test]
    fn families() {
        let cases = [
            ("192.0.2.1", Some(Family::IPv4)),
            ("0.0.0.0", Some(Family::IPv4)),
            ("2001:db8::1", Some(Family::IPv6)),
            ("::", Some(Family::IPv6)),
            ("::1", Some(Family::IPv6)),
            ("::ffff:192.0.2.1", Some(Family::IPv4)),
            ("::ffff:c000:201", Some(Family::IPv4)),
            // IPv4-compatible (deprecated, not mapped) stays IPv6.
            ("::192.0.2.1", Some(Family::IPv6)),
            ("64:ff9b::192.0.2.1", Some(Family::IPv6)),
            ("192.0.2.256", None),
            ("192.0.2.1/32", None),
            (" 192.0.2.1", None),
            ("", None),
            ("example.com", None),
        ];
        for (input, want) in cases {
            assert_eq!(family_of(input).ok(), want, "{input:?}");
        }
    }

    #[test]
    fn zones_are_rejected_with_their_own_error() {
        assert_eq!(
            family_of("fe80::1%eth0"),
            Err(AddressError::Zoned("fe80::1%eth0".into()))
        );
        assert!(
            family_of("nonsense")
                .unwrap_err()
                .to_string()
                .contains("not a valid IP")
        );
    }
}
