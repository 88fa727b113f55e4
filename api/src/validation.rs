//! Kubernetes' rules for object names, as the API server applies them: the CRD schema
//! carries the same patterns (so bad names are refused at admission) and code that reads
//! names written before the schema had them checks with these functions.

/// A DNS-1123 subdomain (names of most objects, claims included): at most 253 characters,
/// lowercase alphanumerics, '-' and '.', starting and ending alphanumeric.
pub const DNS1123_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
pub const DNS1123_SUBDOMAIN_MAX: u32 = 253;

/// A DNS-1123 label (namespace names): at most 63 characters, lowercase alphanumerics and
/// '-', starting and ending alphanumeric.
pub const DNS1123_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
pub const DNS1123_LABEL_MAX: u32 = 63;

fn label_ok(l: &str) -> bool {
    let b = l.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX as usize && label_ok(s)
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX as usize && is_dns1123_subdomain_text(s)
}

/// The subdomain pattern alone, whatever the length (apimachinery reports the two apart).
pub fn is_dns1123_subdomain_text(s: &str) -> bool {
    s.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kubernetes_and_the_patterns_agree() {
        let sub = regex::Regex::new(DNS1123_SUBDOMAIN).unwrap();
        let label = regex::Regex::new(DNS1123_LABEL).unwrap();
        for (s, is_sub, is_label) in [
            ("web", true, true),
            ("a-b.c", true, false),
            ("x y", false, false),
            ("-a", false, false),
            ("a-", false, false),
            ("A", false, false),
            ("a..b", false, false),
            ("", false, false),
            ("0", true, true),
        ] {
            assert_eq!(is_dns1123_subdomain(s), is_sub, "{s:?}");
            assert_eq!(sub.is_match(s), is_sub, "pattern {s:?}");
            assert_eq!(is_dns1123_label(s), is_label, "{s:?}");
            assert_eq!(label.is_match(s), is_label, "pattern {s:?}");
        }
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
    }
}
