//! Label-selector requirements and their matching, as apimachinery's `labels.Requirement`:
//! the one evaluator behind a class's `namespaceSelector` (a `metav1.LabelSelector`) and the
//! views' `?labelSelector=` (parsed by the apiserver crate).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One requirement; `values` is a sorted set (a lookup is a binary search).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
    pub values: Vec<String>,
}

impl Requirement {
    /// A requirement over VALUES, kept as a sorted set.
    pub fn new(key: impl Into<String>, op: Op, values: impl IntoIterator<Item = String>) -> Self {
        let values: BTreeSet<String> = values.into_iter().collect();
        Requirement {
            key: key.into(),
            op,
            values: values.into_iter().collect(),
        }
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match self.op {
            Op::In | Op::Equals | Op::DoubleEquals => {
                v.is_some_and(|v| self.values.binary_search(v).is_ok())
            }
            Op::NotIn | Op::NotEquals => v.is_none_or(|v| self.values.binary_search(v).is_err()),
            Op::Exists => v.is_some(),
            Op::DoesNotExist => v.is_none(),
            Op::GreaterThan | Op::LessThan => {
                let (Some(have), Some(want)) = (
                    v.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|w| w.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == Op::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// The requirements of a `metav1.LabelSelector` (`matchLabels` as equalities, then the
/// expressions); `None` when an expression's operator is not one the schema allows — such a
/// selector matches nothing.
pub fn requirements(selector: &LabelSelector) -> Option<Vec<Requirement>> {
    let mut out: Vec<Requirement> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| Requirement::new(k, Op::Equals, [v.clone()]))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let op = match e.operator.as_str() {
            "In" => Op::In,
            "NotIn" => Op::NotIn,
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            _ => return None,
        };
        out.push(Requirement::new(
            &e.key,
            op,
            e.values.iter().flatten().cloned(),
        ));
    }
    Some(out)
}
