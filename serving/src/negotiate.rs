//! Content negotiation as kube-apiserver does it for custom resources: JSON, YAML, a
//! server-side `Table` (meta.k8s.io v1 or v1beta1) or `PartialObjectMetadata(List)`; the first
//! acceptable media range of the Accept header wins; none acceptable is 406.

use crate::status::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    /// A Table of the given meta.k8s.io version.
    Table(&'static str),
    /// PartialObjectMetadata of the given meta.k8s.io version (one object; a watch's).
    Partial(&'static str),
    /// PartialObjectMetadataList of the given meta.k8s.io version (a list).
    PartialList(&'static str),
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Yaml => "application/yaml",
            _ => "application/json",
        }
    }
}

fn meta_version(v: Option<&str>) -> Option<&'static str> {
    match v {
        Some("v1") => Some("v1"),
        Some("v1beta1") => Some("v1beta1"),
        _ => None,
    }
}

/// The format for an `Accept` header (absent: JSON).
pub fn negotiate(accept: Option<&str>) -> Result<Format, ApiError> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(Format::Json);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            })
            .collect();
        let param = |k: &str| {
            params
                .iter()
                .find(|(pk, _)| pk == k)
                .map(|(_, v)| v.as_str())
        };
        match media.as_str() {
            "application/json" | "*/*" | "application/*" => match param("as") {
                None => return Ok(Format::Json),
                Some("Table") if param("g") == Some("meta.k8s.io") => {
                    if let Some(v) = meta_version(param("v")) {
                        return Ok(Format::Table(v));
                    }
                }
                Some(kind @ ("PartialObjectMetadata" | "PartialObjectMetadataList"))
                    if param("g") == Some("meta.k8s.io") =>
                {
                    if let Some(v) = meta_version(param("v")) {
                        return Ok(if kind == "PartialObjectMetadata" {
                            Format::Partial(v)
                        } else {
                            Format::PartialList(v)
                        });
                    }
                }
                Some(_) => {}
            },
            "application/yaml" if param("as").is_none() => return Ok(Format::Yaml),
            _ => {}
        }
    }
    Err(ApiError::not_acceptable())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn formats_by_accept() {
        let f = |a: &str| negotiate(Some(a)).ok();
        assert_eq!(
            f(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Some(Format::Table("v1"))
        );
        assert_eq!(
            f("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
            Some(Format::Table("v1beta1"))
        );
        assert_eq!(
            f("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"),
            Some(Format::PartialList("v1"))
        );
        assert_eq!(
            f("application/vnd.kubernetes.protobuf,application/json"),
            Some(Format::Json)
        );
        assert_eq!(f("application/yaml"), Some(Format::Yaml));
        assert_eq!(f("*/*"), Some(Format::Json));
        assert_eq!(negotiate(None).ok(), Some(Format::Json));
        for refused in [
            "application/vnd.kubernetes.protobuf",
            "application/cbor",
            "text/html",
        ] {
            assert_eq!(
                negotiate(Some(refused)).unwrap_err().code.as_u16(),
                406,
                "{refused}"
            );
        }
    }
}
