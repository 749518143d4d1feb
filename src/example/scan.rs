//! A borrowed, validating walk over one serialized `Example` or
//! `SequenceExample`: which features it holds, the kind of each one's list,
//! how many values, and the bytes values themselves, without building prost
//! structs or copying a value.
//!
//! [`RecordScanner::scan`] accepts what prost's `SequenceExample::decode`
//! accepts (an `Example`'s `features` is field 1, as a `SequenceExample`'s
//! `context` is, so every record reads as a `SequenceExample`) and applies
//! protobuf's merge rules, as the schema parser does: two `features` fields
//! are one map, a key given twice keeps its last entry, two values in one
//! entry are one `Feature`, and within a `Feature` a list of the same kind
//! is appended to while a list of another kind replaces it. Keys must be
//! UTF-8 (they are protobuf `string`s). Every list is validated, including
//! those a later list replaces, because a decoder meets them all.
//!
//! It exists for `tfpipe inspect`: on records of 100 KB, decoding into prost
//! structs copied every value into a fresh allocation, which cost more than
//! reading the file. A [`RecordScanner`] keeps its two small index buffers
//! between records, so scanning allocates nothing once they have grown.

use super::decode::{
    FIXED32, KIND_BYTES, KIND_FLOAT, KIND_INT64, Kinds, LEN, VARINT, Wire, WireResult,
};
use super::json::RecordType;

/// The kind of a feature's value list (the `kind` oneof of `tf.train.Feature`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKind {
    /// `bytes_list`.
    Bytes,
    /// `float_list`.
    Float,
    /// `int64_list`.
    Int64,
}

impl ListKind {
    fn of(kind: u64) -> ListKind {
        match kind {
            KIND_BYTES => ListKind::Bytes,
            KIND_FLOAT => ListKind::Float,
            _ => ListKind::Int64,
        }
    }
}

/// Why a record is not a valid `tf.train.Example` or `SequenceExample`:
/// what is wrong and the byte offset inside the record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {offset}")]
pub struct ScanError {
    /// Offset of the offending byte in the record.
    pub offset: usize,
    /// What is wrong there.
    pub what: &'static str,
}

/// One map entry of the record: its key's span and the whole entry's span.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key: (usize, usize),
    entry: (usize, usize),
    /// The resolved `Feature` (features) or the step count (feature lists).
    kind: Option<ListKind>,
    len: usize,
    /// Lists of the entry to pass over before the final kind's run.
    skip_lists: usize,
}

impl Entry {
    fn key<'a>(&self, record: &'a [u8]) -> &'a [u8] {
        &record[self.key.0..self.key.0 + self.key.1]
    }

    fn entry<'a>(&self, record: &'a [u8]) -> Wire<'a> {
        Wire::new(&record[self.entry.0..self.entry.0 + self.entry.1])
    }
}

/// Scans records one after another, reusing its index buffers.
///
/// ```
/// use prost::Message;
/// use tfpipe::example::proto::{BytesList, Feature, Features, feature::Kind};
/// use tfpipe::example::scan::{ListKind, RecordScanner};
/// use tfpipe::example::Example;
///
/// let mut features = Features::default();
/// let text = Feature { kind: Some(Kind::BytesList(BytesList { value: vec![b"hi".to_vec()] })) };
/// features.feature.insert("text".into(), text);
/// let record = Example { features: Some(features) }.encode_to_vec();
///
/// let mut scanner = RecordScanner::new();
/// let shape = scanner.scan(&record)?;
/// let (name, feature) = shape.features().next().unwrap();
/// assert_eq!((name, feature.kind(), feature.len()), ("text", Some(ListKind::Bytes), 1));
/// assert_eq!(feature.bytes_values().collect::<Vec<_>>(), [b"hi"]);
/// # Ok::<(), tfpipe::example::scan::ScanError>(())
/// ```
#[derive(Debug, Default)]
pub struct RecordScanner {
    features: Vec<Entry>,
    lists: Vec<Entry>,
}

/// What one record holds, borrowed from it (see [`RecordScanner::scan`]).
#[derive(Debug)]
pub struct RecordShape<'a> {
    record: &'a [u8],
    features: &'a [Entry],
    lists: &'a [Entry],
    record_type: RecordType,
}

/// One feature's value list, as protobuf's merge rules resolve it.
#[derive(Debug, Clone, Copy)]
pub struct FeatureView<'a> {
    kind: Option<ListKind>,
    len: usize,
    source: Kinds<'a>,
    skip_lists: usize,
}

/// One feature list of a `SequenceExample`: its steps.
#[derive(Debug, Clone, Copy)]
pub struct FeatureListView<'a> {
    steps: usize,
    entry: Wire<'a>,
}

impl RecordScanner {
    /// A scanner with empty buffers.
    pub fn new() -> RecordScanner {
        RecordScanner::default()
    }

    /// Validates `record` as a `SequenceExample` (which every `Example` also
    /// is) and indexes its features and feature lists, each key once (the
    /// last entry of a repeated key), sorted by key.
    pub fn scan<'a>(&'a mut self, record: &'a [u8]) -> Result<RecordShape<'a>, ScanError> {
        self.features.clear();
        self.lists.clear();
        let sequence = self.scan_top(record).map_err(|e| {
            let e = e.offset_in(record);
            ScanError {
                offset: e.at,
                what: e.what,
            }
        })?;
        keep_last_of_each_key(&mut self.features, record);
        keep_last_of_each_key(&mut self.lists, record);
        Ok(RecordShape {
            record,
            features: &self.features,
            lists: &self.lists,
            record_type: if sequence {
                RecordType::Sequence
            } else {
                RecordType::Example
            },
        })
    }

    /// Walks the top-level message; true when it has feature lists (field 2).
    fn scan_top(&mut self, record: &[u8]) -> WireResult<bool> {
        let mut top = Wire::new(record);
        let mut sequence = false;
        while !top.done() {
            let start = top;
            let (field, wt) = top.tag()?;
            if field != 1 && field != 2 {
                top.skip(field, wt)?;
                continue;
            }
            if wt != LEN {
                return Err(start.err("wrong wire type for a message field"));
            }
            let map = top.sub()?;
            if field == 1 {
                self.scan_map(map, record, false)?;
            } else {
                sequence = true;
                self.scan_map(map, record, true)?;
            }
        }
        Ok(sequence)
    }

    /// Walks a `Features` (or `FeatureLists`) message: its map entries.
    fn scan_map(&mut self, mut map: Wire<'_>, record: &[u8], lists: bool) -> WireResult<()> {
        while !map.done() {
            let Some(entry) = map.next_len_field(1)? else {
                continue;
            };
            let key = entry_key(entry, record)?;
            let scanned = if lists {
                scan_feature_list_entry(entry, key, record)?
            } else {
                scan_feature_entry(entry, key, record)?
            };
            if lists {
                self.lists.push(scanned);
            } else {
                self.features.push(scanned);
            }
        }
        Ok(())
    }
}

/// The key of a map entry (field 1, a UTF-8 string; `""` when absent, the
/// last one when repeated), as a span of `record`; checks the entry's other
/// fields' wire types on the way.
fn entry_key(mut entry: Wire<'_>, record: &[u8]) -> WireResult<(usize, usize)> {
    let mut key = (0, 0);
    while !entry.done() {
        let start = entry;
        let (field, wt) = entry.tag()?;
        match (field, wt) {
            (1, LEN) => {
                let text = entry.sub()?;
                if std::str::from_utf8(text.bytes()).is_err() {
                    return Err(text.err("feature name is not UTF-8"));
                }
                key = text.span_in(record);
            }
            (1 | 2, _) if wt != LEN => {
                return Err(start.err("wrong wire type for a map entry field"));
            }
            (2, _) => drop(entry.sub()?),
            _ => entry.skip(field, wt)?,
        }
    }
    Ok(key)
}

/// A `Features` map entry: validates every list of its value and resolves
/// the final kind and its value count.
fn scan_feature_entry(entry: Wire<'_>, key: (usize, usize), record: &[u8]) -> WireResult<Entry> {
    let (kind, len, skip_lists) = resolve(Kinds::of_entry(entry))?;
    Ok(Entry {
        key,
        entry: entry.span_in(record),
        kind,
        len,
        skip_lists,
    })
}

/// A `FeatureLists` map entry: validates every step of its value(s) and
/// counts the steps.
fn scan_feature_list_entry(
    entry: Wire<'_>,
    key: (usize, usize),
    record: &[u8],
) -> WireResult<Entry> {
    let mut steps = 0;
    let mut walk = Steps::new(entry);
    while let Some(step) = walk.next_step()? {
        resolve(Kinds::of_feature(step))?;
        steps += 1;
    }
    Ok(Entry {
        key,
        entry: entry.span_in(record),
        kind: None,
        len: steps,
        skip_lists: 0,
    })
}

/// Validates every list of a `Feature` (or of every value of a map entry)
/// and resolves protobuf's oneof merge: the final kind, its value count, and
/// how many lists come before the run of that kind which makes up the value.
fn resolve(mut kinds: Kinds<'_>) -> WireResult<(Option<ListKind>, usize, usize)> {
    let (mut kind, mut len, mut run_start, mut index) = (None, 0, 0, 0);
    while let Some((k, list)) = kinds.next()? {
        let count = count_values(k, list)?;
        if kind != Some(k) {
            kind = Some(k);
            len = 0;
            run_start = index;
        }
        len += count;
        index += 1;
    }
    Ok((kind.map(ListKind::of), len, run_start))
}

/// Validates one `BytesList`/`FloatList`/`Int64List` and counts its values.
fn count_values(kind: u64, mut list: Wire<'_>) -> WireResult<usize> {
    let mut count = 0;
    while !list.done() {
        let start = list;
        let (field, wt) = list.tag()?;
        count += match (kind, field, wt) {
            (KIND_BYTES, 1, LEN) => list.sub().map(|_| 1)?,
            (KIND_FLOAT, 1, LEN) => packed_floats(list.sub()?)?,
            (KIND_FLOAT, 1, FIXED32) => list.fixed::<4>().map(|_| 1)?,
            (KIND_INT64, 1, LEN) => packed_varints(list.sub()?)?,
            (KIND_INT64, 1, VARINT) => list.varint().map(|_| 1)?,
            (_, 1, _) => return Err(start.err("wrong wire type for a list's values")),
            _ => list.skip(field, wt).map(|()| 0)?,
        };
    }
    Ok(count)
}

fn packed_floats(packed: Wire<'_>) -> WireResult<usize> {
    match packed.bytes().len() {
        n if n % 4 == 0 => Ok(n / 4),
        _ => Err(packed.err("packed float_list length is not a multiple of 4")),
    }
}

fn packed_varints(mut packed: Wire<'_>) -> WireResult<usize> {
    let mut count = 0;
    while !packed.done() {
        packed.varint()?;
        count += 1;
    }
    Ok(count)
}

/// Sorts `entries` by key (stably) and keeps the last entry of each key, as
/// protobuf's map decoding does.
fn keep_last_of_each_key(entries: &mut Vec<Entry>, record: &[u8]) {
    entries.sort_by(|a, b| a.key(record).cmp(b.key(record)));
    let mut kept = 0;
    for i in 0..entries.len() {
        let last_of_key = entries
            .get(i + 1)
            .is_none_or(|next| next.key(record) != entries[i].key(record));
        if last_of_key {
            entries[kept] = entries[i];
            kept += 1;
        }
    }
    entries.truncate(kept);
}

/// The `Feature` steps of a `FeatureLists` map entry: field 1 of every value
/// (field 2) of the entry, in order.
struct Steps<'a> {
    entry: Wire<'a>,
    list: Option<Wire<'a>>,
}

impl<'a> Steps<'a> {
    fn new(entry: Wire<'a>) -> Steps<'a> {
        Steps { entry, list: None }
    }

    fn next_step(&mut self) -> WireResult<Option<Wire<'a>>> {
        loop {
            if let Some(list) = &mut self.list {
                if !list.done() {
                    let start = *list;
                    let (field, wt) = list.tag()?;
                    match (field, wt) {
                        (1, LEN) => return list.sub().map(Some),
                        (1, _) => return Err(start.err("wrong wire type for a message field")),
                        _ => list.skip(field, wt)?,
                    }
                    continue;
                }
                self.list = None;
            }
            if self.entry.done() {
                return Ok(None);
            }
            self.list = self.entry.next_len_field(2)?;
        }
    }
}

impl<'a> RecordShape<'a> {
    /// `Sequence` when the record has feature lists (field 2), which an
    /// `Example` never has.
    pub fn record_type(&self) -> RecordType {
        self.record_type
    }

    /// The features of an `Example`'s `features` (a `SequenceExample`'s
    /// `context`), by name.
    pub fn features(&self) -> impl Iterator<Item = (&'a str, FeatureView<'a>)> + use<'a> {
        let record = self.record;
        self.features.iter().map(move |e| {
            let view = FeatureView {
                kind: e.kind,
                len: e.len,
                source: Kinds::of_entry(e.entry(record)),
                skip_lists: e.skip_lists,
            };
            (key_text(e, record), view)
        })
    }

    /// The feature lists of a `SequenceExample`, by name.
    pub fn feature_lists(&self) -> impl Iterator<Item = (&'a str, FeatureListView<'a>)> + use<'a> {
        let record = self.record;
        self.lists.iter().map(move |e| {
            let view = FeatureListView {
                steps: e.len,
                entry: e.entry(record),
            };
            (key_text(e, record), view)
        })
    }
}

/// A key checked to be UTF-8 by the scan.
fn key_text<'a>(entry: &Entry, record: &'a [u8]) -> &'a str {
    std::str::from_utf8(entry.key(record)).unwrap_or_default()
}

impl<'a> FeatureView<'a> {
    /// The list's kind; `None` for a `Feature` with no list set.
    pub fn kind(&self) -> Option<ListKind> {
        self.kind
    }

    /// How many values the list holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list holds no values (or none is set).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values of a `bytes_list`, borrowed from the record (none for
    /// another kind).
    pub fn bytes_values(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let mut kinds = self.source;
        let mut skip = self.skip_lists;
        let mut list: Option<Wire<'a>> = None;
        let bytes = self.kind == Some(ListKind::Bytes);
        std::iter::from_fn(move || {
            if !bytes {
                return None;
            }
            loop {
                if let Some(values) = &mut list {
                    // Validated by the scan, so an error cannot occur here.
                    while !values.done() {
                        if let Some(value) = values.next_len_field(1).ok()? {
                            return Some(value.bytes());
                        }
                    }
                }
                let (_, next) = kinds.next().ok()??;
                if skip > 0 {
                    skip -= 1;
                } else {
                    list = Some(next);
                }
            }
        })
    }
}

impl<'a> FeatureListView<'a> {
    /// How many steps (`Feature`s) the list holds.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Each step's value list.
    pub fn iter(&self) -> impl Iterator<Item = FeatureView<'a>> + use<'a> {
        let mut steps = Steps::new(self.entry);
        std::iter::from_fn(move || {
            // Validated by the scan, so an error cannot occur here.
            let step = steps.next_step().ok()??;
            let (kind, len, skip_lists) = resolve(Kinds::of_feature(step)).ok()?;
            Some(FeatureView {
                kind,
                len,
                source: Kinds::of_feature(step),
                skip_lists,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::example::proto::{
        BytesList, Feature, FeatureList, FeatureLists, Features, FloatList, Int64List,
        SequenceExample, feature::Kind,
    };

    /// A feature as both sides see it: kind, value count, bytes values.
    type Summary = (Option<ListKind>, usize, Vec<Vec<u8>>);

    fn prost_summary(feature: &Feature) -> Summary {
        match &feature.kind {
            Some(Kind::BytesList(l)) => (Some(ListKind::Bytes), l.value.len(), l.value.clone()),
            Some(Kind::FloatList(l)) => (Some(ListKind::Float), l.value.len(), vec![]),
            Some(Kind::Int64List(l)) => (Some(ListKind::Int64), l.value.len(), vec![]),
            None => (None, 0, vec![]),
        }
    }

    fn scan_summary(view: FeatureView<'_>) -> Summary {
        let bytes = view.bytes_values().map(<[u8]>::to_vec).collect();
        (view.kind(), view.len(), bytes)
    }

    type RecordSummary = (
        BTreeMap<String, Summary>,
        BTreeMap<String, Vec<Summary>>,
        bool,
    );

    fn by_prost(record: &[u8]) -> Option<RecordSummary> {
        let message = SequenceExample::decode(record).ok()?;
        let features = message
            .context
            .iter()
            .flat_map(|c| &c.feature)
            .map(|(k, f)| (k.clone(), prost_summary(f)))
            .collect();
        let lists = message
            .feature_lists
            .iter()
            .flat_map(|l| &l.feature_list)
            .map(|(k, l)| (k.clone(), l.feature.iter().map(prost_summary).collect()))
            .collect();
        Some((
            features,
            lists,
            RecordType::sniff(record) == RecordType::Sequence,
        ))
    }

    fn by_scan(record: &[u8]) -> Option<RecordSummary> {
        let mut scanner = RecordScanner::new();
        let shape = scanner.scan(record).ok()?;
        let features = shape
            .features()
            .map(|(k, f)| (k.to_string(), scan_summary(f)))
            .collect();
        let lists = shape
            .feature_lists()
            .map(|(k, l)| {
                assert_eq!(l.iter().count(), l.steps());
                (k.to_string(), l.iter().map(scan_summary).collect())
            })
            .collect();
        Some((features, lists, shape.record_type() == RecordType::Sequence))
    }

    fn feature(kind: u8, n: usize) -> Feature {
        let kind = match kind % 4 {
            0 => Some(Kind::BytesList(BytesList {
                value: (0..n).map(|i| vec![i as u8; i % 5]).collect(),
            })),
            1 => Some(Kind::FloatList(FloatList {
                value: (0..n).map(|i| i as f32).collect(),
            })),
            2 => Some(Kind::Int64List(Int64List {
                value: (0..n).map(|i| (i as i64) << (i % 60)).collect(),
            })),
            _ => None,
        };
        Feature { kind }
    }

    fn record(spec: &[(u8, usize)], steps: &[(u8, usize)]) -> Vec<u8> {
        let mut context = Features::default();
        for (i, &(kind, n)) in spec.iter().enumerate() {
            context.feature.insert(format!("f{i}"), feature(kind, n));
        }
        let feature_lists = (!steps.is_empty()).then(|| {
            let mut lists = FeatureLists::default();
            let list = steps.iter().map(|&(k, n)| feature(k, n)).collect();
            lists
                .feature_list
                .insert("seq".into(), FeatureList { feature: list });
            lists
        });
        SequenceExample {
            context: Some(context),
            feature_lists,
        }
        .encode_to_vec()
    }

    /// Hand-written wire bytes for the merge rules and the refusals.
    fn len_field(field: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![field << 3 | 2, body.len() as u8];
        out.extend_from_slice(body);
        out
    }

    fn entry(key: &[u8], values: &[&[u8]]) -> Vec<u8> {
        let mut body = len_field(1, key);
        for value in values {
            body.extend(len_field(2, value));
        }
        len_field(1, &len_field(1, &body)) // Features { feature: [entry] } as field 1
    }

    #[test]
    fn agrees_with_prost_on_merges_and_duplicates() {
        let bytes = len_field(1, &len_field(1, b"ab"));
        let ints = len_field(3, &[0x0a, 2, 5, 6]); // packed [5, 6]
        let int_unpacked = len_field(3, &[0x08, 7]);
        let cases: Vec<Vec<u8>> = vec![
            // Two values in one entry: same kind appends, another kind replaces.
            entry(b"k", &[&ints, &int_unpacked]),
            entry(b"k", &[&bytes, &ints]),
            entry(b"k", &[&ints, &bytes, &bytes]),
            // The same key twice: the last entry wins; two `features` fields merge.
            [entry(b"k", &[&ints]), entry(b"k", &[&bytes])].concat(),
            [entry(b"a", &[&ints]), entry(b"b", &[&bytes])].concat(),
            // A missing key is "", a missing value a Feature with no list.
            len_field(1, &len_field(1, &len_field(2, &ints))),
            len_field(1, &len_field(1, &len_field(1, b"only-key"))),
            // Unknown fields at every level, a group among them.
            [
                vec![0x18, 1],
                entry(b"k", &[&[&[0x23, 0x08, 1, 0x24][..], &ints].concat()]),
            ]
            .concat(),
            // Refused: a non-UTF-8 key, a wrong wire type, a bad packed float length.
            entry(&[0xff, 0xfe], &[&ints]),
            entry(b"k", &[&[0x08, 1]]),
            entry(b"k", &[&len_field(2, &len_field(1, &[0, 0, 0]))]),
            vec![0x08, 1, 0x0a, 5],
        ];
        for (i, case) in cases.iter().enumerate() {
            assert_eq!(by_scan(case), by_prost(case), "case {i}: {case:?}");
        }
        assert!(by_scan(&cases[8]).is_none() && by_scan(&cases[3]).is_some());
    }

    #[test]
    fn errors_give_the_offset() {
        // Field 1 claims 5 bytes where 1 is left: the length at byte 1 is wrong.
        let err = RecordScanner::new().scan(&[0x0a, 5, 0]).unwrap_err();
        assert_eq!(err.offset, 1);
        assert!(err.to_string().contains("runs past the end"), "{err}");
    }

    proptest! {
        /// Valid records, then the same records cut short or with one byte
        /// changed: the scan accepts exactly what prost accepts and reads the
        /// same features.
        #[test]
        fn agrees_with_prost(
            spec in proptest::collection::vec((0u8..4, 0usize..6), 0..5),
            steps in proptest::collection::vec((0u8..4, 0usize..4), 0..4),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            how in 0u8..3,
        ) {
            let mut raw = record(&spec, &steps);
            match how {
                0 => {}
                1 => raw.truncate(cut.index(raw.len() + 1)),
                _ if raw.is_empty() => {}
                _ => {
                    let at = flip.index(raw.len());
                    raw[at] = byte;
                }
            }
            prop_assert_eq!(by_scan(&raw), by_prost(&raw));
        }
    }
}
