//! The list options of `metav1.ListOptions`, parsed from a request's [`Query`] and validated
//! as kube-apiserver does (conversion errors 400 BadRequest, validation errors 422 Invalid).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use address_controller_serving::request::{Query, parse_bool};
use address_controller_serving::status::ApiError;

use crate::selector::{FieldSelector, LabelSelector};

/// `resourceVersionMatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RvMatch {
    NotOlderThan,
    Exact,
}

/// Where a paged list continues: after `start`, from a list made at `rv` (`-1`: from the
/// current state, the token kube-apiserver hands out when the list's revision has expired).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    /// The token's format, as kube-apiserver's (`meta.k8s.io/v1`).
    pub v: String,
    pub rv: i64,
    pub start: String,
}

/// Go's `base64.RawURLEncoding` error: the offset of the first byte it cannot take.
fn go_base64_error(s: &str) -> Option<String> {
    let ok = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    if let Some(i) = s.bytes().position(|c| !ok(c)) {
        return Some(format!("illegal base64 data at input byte {i}"));
    }
    // A lone character in the last quantum cannot be decoded.
    (s.len() % 4 == 1).then(|| format!("illegal base64 data at input byte {}", s.len() - 1))
}

impl ContinueToken {
    pub fn encode(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Decodes a token, refusing it as kube-apiserver's `DecodeContinue` does.
    fn decode(s: &str) -> Result<ContinueToken, String> {
        let invalid = |why: String| format!("continue key is not valid: {why}");
        if let Some(e) = go_base64_error(s) {
            return Err(invalid(e));
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|e| invalid(e.to_string()))?;
        let t: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            invalid(if e.is_eof() {
                "unexpected end of JSON input".into()
            } else {
                e.to_string()
            })
        })?;
        let v = t["v"].as_str().unwrap_or_default();
        if v != "meta.k8s.io/v1" {
            return Err(format!(
                "continue key is not valid: server does not recognize this encoded version {v}"
            ));
        }
        let t: ContinueToken = serde_json::from_value(t).map_err(|e| invalid(e.to_string()))?;
        if t.rv == 0 {
            return Err(invalid(
                "incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into(),
            ));
        }
        if t.start.is_empty() {
            return Err(invalid(
                "encoded start key empty (version meta.k8s.io/v1)".into(),
            ));
        }
        Ok(t)
    }
}

/// A field label a view computes at request time from an object's stored fields
/// (kube-apiserver's field selectors compare stored values only; `heldAt=T` asks whether a
/// holding covers T). Its value is parsed once per request, then judged per object.
pub struct ComputedField {
    pub label: &'static str,
    /// The selector's value, parsed (`Err`: the 400's message).
    pub parse: fn(&str) -> Result<i64, String>,
    /// Whether an object's stored fields hold for the parsed value.
    pub holds: fn(&BTreeMap<&'static str, String>, i64) -> bool,
}

impl std::fmt::Debug for ComputedField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label)
    }
}

/// `metav1.ListOptions`, validated.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub watch: bool,
    pub bookmarks: bool,
    /// `None`: unset or empty (the most recent); `Some(0)`: any.
    pub resource_version: Option<u64>,
    pub rv_match: Option<RvMatch>,
    pub send_initial_events: Option<bool>,
    pub timeout: Option<Duration>,
    /// `None` or ≤ 0: everything.
    pub limit: Option<i64>,
    pub continue_from: Option<ContinueToken>,
    /// The field selector's terms on computed fields, their values parsed
    /// ([`ListOptions::resolve_fields`]).
    pub computed: Vec<(&'static ComputedField, i64)>,
}

fn invalid(field: &str, reason: &str, message: String) -> ApiError {
    ApiError::invalid_list_options(field, reason, message)
}

impl ListOptions {
    /// Checks the field selector against a view's labels — `stored`, and `computed` whose
    /// values are parsed here, once for the request — as kube-apiserver refuses an unknown
    /// label: 400 BadRequest, as for a computed value that does not parse.
    pub fn resolve_fields(
        &mut self,
        stored: &[&str],
        computed: &'static [ComputedField],
    ) -> Result<(), ApiError> {
        self.fields
            .check(stored)
            .map_err(|e| ApiError::bad_request(e.0))?;
        self.computed.clear();
        for (label, _, value) in &self.fields.0 {
            if let Some(c) = computed.iter().find(|c| c.label == label) {
                let parsed = (c.parse)(value).map_err(ApiError::bad_request)?;
                self.computed.push((c, parsed));
            }
        }
        Ok(())
    }

    /// Whether stored `fields` hold for the computed term `label=value`; `None` when
    /// `label` is not a computed one.
    pub fn computed_holds(
        &self,
        label: &str,
        fields: &BTreeMap<&'static str, String>,
    ) -> Option<bool> {
        self.computed
            .iter()
            .find(|(c, _)| c.label == label)
            .map(|(c, v)| (c.holds)(fields, *v))
    }
}

impl ListOptions {
    pub fn parse(q: &Query) -> Result<ListOptions, ApiError> {
        let mut o = ListOptions::convert(q)?;
        let rv = q.get("resourceVersion").unwrap_or("");
        let rv_match = q.get("resourceVersionMatch").unwrap_or("");
        // Validation (422).
        if o.send_initial_events.is_some() && !o.watch {
            return Err(invalid(
                "sendInitialEvents",
                "FieldValueForbidden",
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list".into(),
            ));
        }
        if !rv_match.is_empty() {
            o.validate_rv_match(rv, rv_match)?;
        }
        if o.watch
            && o.send_initial_events == Some(true)
            && o.rv_match != Some(RvMatch::NotOlderThan)
        {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
            ));
        }
        if !rv.is_empty() {
            o.resource_version = Some(rv.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid resource version: resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
                ))
            })?);
        }
        if let Some(c) = q.get("continue").filter(|c| !c.is_empty()) {
            o.continue_from = Some(
                ContinueToken::decode(c)
                    .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?,
            );
            if o.resource_version.is_some_and(|v| v != 0) && !o.watch {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
        }
        Ok(o)
    }

    /// Conversion (400), in the order kube-apiserver converts: selectors, timeout, limit,
    /// sendInitialEvents.
    fn convert(q: &Query) -> Result<ListOptions, ApiError> {
        let mut o = ListOptions {
            watch: q.watch(),
            bookmarks: q
                .get("allowWatchBookmarks")
                .and_then(parse_bool)
                .unwrap_or(false),
            ..Default::default()
        };
        // Conversion (400): the order kube-apiserver converts in.
        if let Some(l) = q.get("labelSelector") {
            o.labels = LabelSelector::parse(l).map_err(|e| ApiError::bad_request(e.0))?;
        }
        if let Some(f) = q.get("fieldSelector") {
            o.fields = FieldSelector::parse(f).map_err(|e| ApiError::bad_request(e.0))?;
        }
        if let Some(t) = q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
            let secs: i64 = t.parse().map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {t:?}: invalid syntax"))
            })?;
            o.timeout = Some(Duration::from_secs(secs.max(0).unsigned_abs()));
        }
        if let Some(l) = q.get("limit").filter(|l| !l.is_empty()) {
            o.limit = Some(l.parse().map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {l:?}: invalid syntax"))
            })?);
        }
        if let Some(s) = q.get("sendInitialEvents").filter(|s| !s.is_empty()) {
            o.send_initial_events = Some(parse_bool(s).ok_or_else(|| {
                ApiError::bad_request(format!("strconv.ParseBool: parsing {s:?}: invalid syntax"))
            })?);
        }
        Ok(o)
    }

    /// `resourceVersionMatch` (given): allowed here, and a value kube-apiserver knows (422).
    fn validate_rv_match(&mut self, rv: &str, rv_match: &str) -> Result<(), ApiError> {
        let o = self;
        if o.watch && o.send_initial_events.is_none() {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
            ));
        }
        o.rv_match = Some(match rv_match {
            "NotOlderThan" => RvMatch::NotOlderThan,
            "Exact" => RvMatch::Exact,
            other => {
                return Err(invalid(
                    "resourceVersionMatch",
                    "FieldValueNotSupported",
                    format!(
                        "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                    ),
                ));
            }
        });
        if rv.is_empty() && !(o.watch && o.send_initial_events.is_some()) {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
            ));
        }
        if o.rv_match == Some(RvMatch::Exact) && rv == "0" {
            return Err(invalid(
                "resourceVersionMatch",
                "FieldValueForbidden",
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn opts(q: &str) -> Result<ListOptions, ApiError> {
        ListOptions::parse(&Query::parse(Some(q)))
    }

    #[test]
    fn list_options_are_refused_as_kube_apiserver_refuses_them() {
        let code = |q: &str| opts(q).err().map(|e| (e.code.as_u16(), e.reason));
        let rows: &[(&str, Option<(u16, &str)>)] = &[
            ("", None),
            ("limit=10&continue=", None),
            ("limit=abc", Some((400, "BadRequest"))),
            ("limit=-1", None),
            ("timeoutSeconds=abc", Some((400, "BadRequest"))),
            ("resourceVersion=abc", Some((400, "BadRequest"))),
            ("continue=bogus", Some((400, "BadRequest"))),
            ("labelSelector=a%20in%20(x", Some((400, "BadRequest"))),
            ("fieldSelector=metadata.name", Some((400, "BadRequest"))),
            ("resourceVersionMatch=Exact", Some((422, "Invalid"))),
            (
                "resourceVersion=0&resourceVersionMatch=Exact",
                Some((422, "Invalid")),
            ),
            (
                "resourceVersion=5&resourceVersionMatch=Bogus",
                Some((422, "Invalid")),
            ),
            ("sendInitialEvents=true", Some((422, "Invalid"))),
            (
                "watch=true&resourceVersion=1&resourceVersionMatch=NotOlderThan",
                Some((422, "Invalid")),
            ),
            ("watch=true&sendInitialEvents=true", Some((422, "Invalid"))),
            (
                "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
                None,
            ),
            ("resourceVersion=5&resourceVersionMatch=NotOlderThan", None),
        ];
        for (q, want) in rows {
            assert_eq!(code(q), *want, "{q}");
        }
        let t = ContinueToken {
            v: "meta.k8s.io/v1".into(),
            rv: 7,
            start: "a/b\u{0}".into(),
        };
        let o = opts(&format!("continue={}", t.encode())).unwrap();
        assert_eq!(o.continue_from, Some(t));
    }
}
