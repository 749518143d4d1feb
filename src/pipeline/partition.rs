//! Partition values as features. A dataset written with `key=value/`
//! directories (Spark's `partitionBy`, Hive) keeps those columns in the
//! path, not in the records; the parse stage adds them back, per row, from
//! each record's file ([`Pipeline::parse_batches_partitioned`](crate::pipeline::Pipeline::parse_batches_partitioned)).
//!
//! Invariants: a partition feature is a scalar `int64`, `float32` or
//! `bytes` feature of the schema (a name the schema lacks is added as a
//! `bytes` scalar after the others); its column sits where the schema puts
//! it, and it may be the schema's label. A record whose path lacks the key (or holds Hive's null,
//! `__HIVE_DEFAULT_PARTITION__`) takes the feature's default, and without
//! one is a bad record (a [`PipelineError::Parse`](crate::pipeline::PipelineError::Parse) with its location, like
//! a record that does not parse), as is a value that does not parse as the
//! dtype.

use std::path::Path;

use crate::batch::{Batch, Column, Values};
use crate::example::{DType, FeatureSpec, Layout, Schema, Value};

/// Hive's name for a null partition value.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// One partition value, typed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scalar {
    Int64(i64),
    Float32(f32),
    Bytes(Vec<u8>),
}

/// The schema's features that come from paths, with their place among the
/// schema's columns.
#[derive(Debug, Clone)]
pub(crate) struct PartitionPlan {
    features: Vec<(usize, FeatureSpec)>,
}

impl PartitionPlan {
    /// Splits `schema` into the features read from records and the plan for
    /// those named in `names`, or says why a name cannot be a partition
    /// feature.
    pub(crate) fn split<S: AsRef<str>>(
        schema: &Schema,
        names: &[S],
    ) -> Result<(Schema, PartitionPlan), String> {
        let mut full = schema.clone();
        for name in names {
            let name = name.as_ref();
            if !full.features.iter().any(|f| f.name == name) {
                full.features
                    .push(FeatureSpec::fixed(name, DType::Bytes, &[]));
            }
        }
        let mut records = full.clone();
        records.features.clear();
        // A label from the path (`label=3/`) is not in the records: the
        // records' schema has no label, and the column is added back.
        if records
            .label
            .as_ref()
            .is_some_and(|label| names.iter().any(|n| n.as_ref() == label))
        {
            records.label = None;
        }
        let mut features = Vec::new();
        for (index, spec) in full.features.into_iter().enumerate() {
            if !names.iter().any(|n| n.as_ref() == spec.name) {
                records.features.push(spec);
                continue;
            }
            let scalar = matches!(&spec.layout, Layout::Fixed(shape) if shape.iter().product::<usize>() == 1);
            let dtype = matches!(spec.dtype, DType::Int64 | DType::Float32 | DType::Bytes);
            if !scalar || !dtype {
                return Err(format!(
                    "partition feature {:?}: a partition value is one int64, float32 or bytes \
                     value (the spec says {:?} {:?})",
                    spec.name, spec.dtype, spec.layout
                ));
            }
            features.push((index, spec));
        }
        Ok((records, PartitionPlan { features }))
    }

    /// The partition values of a record read from `path` (`None`: not read
    /// from a file), or the feature that has none and why.
    pub(crate) fn values(&self, path: Option<&Path>) -> Result<Vec<Scalar>, (String, String)> {
        let found = path
            .map(crate::storage::partition_values)
            .unwrap_or_default();
        self.features
            .iter()
            .map(|(_, spec)| {
                let raw = found
                    .iter()
                    .rev()
                    .find(|(key, _)| *key == spec.name)
                    .map(|(_, value)| value.as_str());
                scalar(spec, raw, path.is_some()).map_err(|why| (spec.name.clone(), why))
            })
            .collect()
    }

    /// Puts one column per partition feature into `batch`, at its schema
    /// place, from `rows` (each row's values, in plan order).
    pub(crate) fn insert(&self, batch: &mut Batch, rows: &[Vec<Scalar>]) {
        for (k, (index, spec)) in self.features.iter().enumerate() {
            let column = Column {
                name: spec.name.clone(),
                values: column_values(spec.dtype, rows.iter().map(|row| &row[k])),
                row_splits: Vec::new(),
                inner_shape: match &spec.layout {
                    Layout::Fixed(shape) => shape.clone(),
                    _ => Vec::new(),
                },
            };
            let at = (*index).min(batch.columns.len());
            batch.columns.insert(at, column);
        }
    }
}

/// The typed value of `spec` from the path's text `raw` (or its default).
fn scalar(spec: &FeatureSpec, raw: Option<&str>, has_path: bool) -> Result<Scalar, String> {
    let missing = match raw {
        _ if !has_path => Some("the record was not read from a file".to_string()),
        None => Some(format!(
            "no `{}=VALUE` directory in the record's path",
            spec.name
        )),
        Some(HIVE_NULL) => Some(format!("the record's path holds Hive's null ({HIVE_NULL})")),
        Some(_) => None,
    };
    if let Some(why) = missing {
        return match &spec.default {
            Some(Value::Int64(v)) if v.len() == 1 => Ok(Scalar::Int64(v[0])),
            Some(Value::Float32(v)) if v.len() == 1 => Ok(Scalar::Float32(v[0])),
            Some(Value::Bytes(v)) if v.len() == 1 => Ok(Scalar::Bytes(v[0].clone())),
            _ => Err(format!("{why}, and the feature has no default")),
        };
    }
    let raw = raw.unwrap_or_default();
    match spec.dtype {
        DType::Int64 => raw
            .parse()
            .map(Scalar::Int64)
            .map_err(|_| format!("partition value {raw:?} is not an int64")),
        DType::Float32 => raw
            .parse()
            .map(Scalar::Float32)
            .map_err(|_| format!("partition value {raw:?} is not a float32")),
        _ => Ok(Scalar::Bytes(raw.as_bytes().to_vec())),
    }
}

fn column_values<'a>(dtype: DType, values: impl Iterator<Item = &'a Scalar>) -> Values {
    match dtype {
        DType::Int64 => Values::Int64(
            values
                .map(|v| if let Scalar::Int64(x) = v { *x } else { 0 })
                .collect(),
        ),
        DType::Float32 => Values::Float32(
            values
                .map(|v| if let Scalar::Float32(x) = v { *x } else { 0.0 })
                .collect(),
        ),
        _ => {
            let mut data = Vec::new();
            let mut offsets = vec![0];
            for v in values {
                if let Scalar::Bytes(b) = v {
                    data.extend_from_slice(b);
                }
                offsets.push(data.len());
            }
            Values::Bytes { data, offsets }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_from_the_path_leaves_the_records_schema_without_it() {
        let mut schema = Schema::from_feature_texts(&["x:float32:8", "label:int64"]).unwrap();
        schema.label = Some("label".into());
        let (records, plan) = PartitionPlan::split(&schema, &["label"]).unwrap();
        assert_eq!(records.label, None);
        assert_eq!(records.features.len(), 1);
        assert_eq!(plan.features[0].0, 1, "the label column keeps its place");
        // Another partition feature leaves the label where it was.
        let (records, _) = PartitionPlan::split(&schema, &["year"]).unwrap();
        assert_eq!(records.label.as_deref(), Some("label"));
    }
}
