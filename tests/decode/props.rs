//! Property tests: random Examples encoded by prost (and by a hand-written
//! encoder in every other valid way) decode through the schema parser to the
//! values they hold; random bytes never panic.

use std::collections::BTreeMap;

use proptest::prelude::*;
use prost::Message;
use tfpipe::example::proto::{self, feature::Kind};
use tfpipe::example::{BatchParser, DType, Example, FeatureSpec, Schema, SequenceExample};
use tfpipe::{Batch, Values};

#[derive(Debug, Clone)]
enum List {
    Bytes(Vec<Vec<u8>>),
    Float(Vec<f32>),
    Int(Vec<i64>),
}

impl List {
    fn len(&self) -> usize {
        match self {
            List::Bytes(v) => v.len(),
            List::Float(v) => v.len(),
            List::Int(v) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            List::Bytes(_) => DType::Bytes,
            List::Float(_) => DType::Float32,
            List::Int(_) => DType::Int64,
        }
    }

    fn to_proto(&self) -> proto::Feature {
        proto::Feature {
            kind: Some(match self {
                List::Bytes(v) => Kind::BytesList(proto::BytesList { value: v.clone() }),
                List::Float(v) => Kind::FloatList(proto::FloatList { value: v.clone() }),
                List::Int(v) => Kind::Int64List(proto::Int64List { value: v.clone() }),
            }),
        }
    }
}

fn list() -> impl Strategy<Value = List> {
    prop_oneof![
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..5)
            .prop_map(List::Bytes),
        // Any bit pattern, NaN payloads included.
        prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..7).prop_map(List::Float),
        prop::collection::vec(any::<i64>(), 0..7).prop_map(List::Int),
    ]
}

/// How each schema feature is read: 0 = var-length, 1 = fixed of its count,
/// 2 = uint8 (a single bytes value, fixed of its length) where possible.
fn spec_for(name: &str, list: &List, how: u8) -> FeatureSpec {
    match (how, list) {
        (2, List::Bytes(v)) if v.len() == 1 && !v[0].is_empty() => {
            FeatureSpec::fixed(name, DType::Uint8, &[v[0].len()])
        }
        (1 | 2, l) if l.len() > 0 => FeatureSpec::fixed(name, l.dtype(), &[l.len()]),
        (_, l) => FeatureSpec::var(name, l.dtype()),
    }
}

// ---- a hand-written encoder, for the encodings prost does not produce ----

#[derive(Debug, Clone, Copy)]
struct Encoding {
    unpacked: bool,
    value_first: bool,
    unknown_fields: bool,
    split_features: bool,
    duplicate_keys: bool,
    /// 0: one list; 1: the values split over two value fields of the map entry
    /// (protobuf merges them); 2: over two lists of one `Feature` (the oneof merges).
    split: u8,
    /// A list of another kind before the real one in the same `Feature` (replaced).
    decoy_kind: bool,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    varint(out, field << 3 | wire_type);
}

fn len_field(out: &mut Vec<u8>, field: u64, body: &[u8]) {
    tag(out, field, 2);
    varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// Unknown fields of every wire type, a group among them.
fn unknown(out: &mut Vec<u8>) {
    tag(out, 15, 0);
    varint(out, 300);
    tag(out, 16, 1);
    out.extend_from_slice(&[1; 8]);
    len_field(out, 17, b"junk");
    tag(out, 18, 5);
    out.extend_from_slice(&[2; 4]);
    tag(out, 19, 3);
    tag(out, 1, 0);
    varint(out, 7);
    tag(out, 19, 4);
}

fn split_list(list: &List) -> (List, List) {
    fn halves<T: Clone>(v: &[T]) -> (Vec<T>, Vec<T>) {
        let (a, b) = v.split_at(v.len() / 2);
        (a.to_vec(), b.to_vec())
    }
    match list {
        List::Bytes(v) => {
            let (a, b) = halves(v);
            (List::Bytes(a), List::Bytes(b))
        }
        List::Float(v) => {
            let (a, b) = halves(v);
            (List::Float(a), List::Float(b))
        }
        List::Int(v) => {
            let (a, b) = halves(v);
            (List::Int(a), List::Int(b))
        }
    }
}

/// The value fields of a map entry holding `list` (several when split).
fn encode_values(list: &List, e: Encoding) -> Vec<Vec<u8>> {
    let (first, second) = split_list(list);
    let mut features = match e.split {
        1 => vec![encode_list(&first, e), encode_list(&second, e)],
        2 => {
            let mut both = encode_list(&first, e);
            both.extend(encode_list(&second, e));
            vec![both]
        }
        _ => vec![encode_list(list, e)],
    };
    if e.decoy_kind {
        let decoy = match list {
            List::Int(_) => List::Float(vec![1.5]),
            _ => List::Int(vec![42]),
        };
        let mut with_decoy = encode_list(&decoy, e);
        with_decoy.extend(features.remove(0));
        features.insert(0, with_decoy);
    }
    features
}

fn encode_list(list: &List, e: Encoding) -> Vec<u8> {
    let mut body = Vec::new();
    if e.unknown_fields {
        unknown(&mut body);
    }
    match list {
        List::Bytes(v) => v.iter().for_each(|b| len_field(&mut body, 1, b)),
        List::Float(v) if e.unpacked => v.iter().for_each(|x| {
            tag(&mut body, 1, 5);
            body.extend_from_slice(&x.to_le_bytes());
        }),
        List::Float(v) => {
            let packed: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            len_field(&mut body, 1, &packed);
        }
        List::Int(v) if e.unpacked => v.iter().for_each(|&x| {
            tag(&mut body, 1, 0);
            varint(&mut body, x as u64);
        }),
        List::Int(v) => {
            let mut packed = Vec::new();
            v.iter().for_each(|&x| varint(&mut packed, x as u64));
            len_field(&mut body, 1, &packed);
        }
    }
    let mut feature = Vec::new();
    let field = match list {
        List::Bytes(_) => 1,
        List::Float(_) => 2,
        List::Int(_) => 3,
    };
    if e.unknown_fields {
        unknown(&mut feature);
    }
    len_field(&mut feature, field, &body);
    feature
}

fn encode_entry(key: &str, features: &[Vec<u8>], e: Encoding) -> Vec<u8> {
    let mut entry = Vec::new();
    if e.value_first {
        features.iter().for_each(|f| len_field(&mut entry, 2, f));
        if e.unknown_fields {
            unknown(&mut entry);
        }
        len_field(&mut entry, 1, key.as_bytes());
    } else {
        len_field(&mut entry, 1, key.as_bytes());
        features.iter().for_each(|f| len_field(&mut entry, 2, f));
    }
    entry
}

fn encode_example(features: &BTreeMap<String, List>, e: Encoding) -> Vec<u8> {
    let mut maps: Vec<Vec<u8>> = vec![Vec::new()];
    for (i, (key, list)) in features.iter().enumerate() {
        if e.split_features && i % 2 == 1 {
            maps.push(Vec::new());
        }
        let map = maps.last_mut().unwrap_or_else(|| unreachable!());
        if e.duplicate_keys {
            // A first entry for the same key, of another kind: the last one wins.
            let decoy = encode_list(&List::Bytes(vec![b"decoy".to_vec()]), e);
            len_field(map, 1, &encode_entry(key, &[decoy], e));
        }
        len_field(map, 1, &encode_entry(key, &encode_values(list, e), e));
        if e.unknown_fields {
            unknown(map);
        }
    }
    let mut example = Vec::new();
    for map in maps {
        if e.unknown_fields {
            unknown(&mut example);
        }
        len_field(&mut example, 1, &map);
    }
    example
}

fn encoding() -> impl Strategy<Value = Encoding> {
    let flags = (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    (flags, 0u8..3, any::<bool>()).prop_map(
        |(
            (unpacked, value_first, unknown_fields, split_features, duplicate_keys),
            split,
            decoy_kind,
        )| Encoding {
            unpacked,
            value_first,
            unknown_fields,
            split_features,
            duplicate_keys,
            split,
            decoy_kind,
        },
    )
}

/// Checks row `row` of `batch`'s column `index` against `list`.
fn check(batch: &Batch, index: usize, row: usize, list: &List) -> Result<(), TestCaseError> {
    let column = &batch.columns[index];
    let range = column.row_range(row).unwrap();
    match (&column.values, list) {
        (Values::Int64(v), List::Int(want)) => prop_assert_eq!(&v[range], &want[..]),
        (Values::Float32(v), List::Float(want)) => {
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&v[range]), bits(want));
        }
        (Values::Bytes { .. }, List::Bytes(want)) => {
            let ours: Vec<&[u8]> = range.map(|i| column.bytes(i).unwrap()).collect();
            let want: Vec<&[u8]> = want.iter().map(|b| &b[..]).collect();
            prop_assert_eq!(ours, want);
        }
        (Values::Uint8(v), List::Bytes(want)) => prop_assert_eq!(&v[range], &want[0][..]),
        (values, list) => prop_assert!(false, "{values:?} for {list:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prost_examples_decode_to_their_values(
        features in prop::collection::btree_map("[a-f]{1,3}", list(), 0..6),
        noise in prop::collection::btree_map("[x-z]{1,3}", list(), 0..3),
        hows in prop::collection::vec(0u8..3, 6),
        encoding in encoding(),
    ) {
        let schema = Schema {
            features: features.iter().zip(&hows).map(|((n, l), &how)| spec_for(n, l, how)).collect(),
            label: None,
        };
        let mut all = features.clone();
        all.extend(noise.clone());
        let example = Example {
            features: Some(proto::Features {
                feature: all.iter().map(|(k, l)| (k.clone(), l.to_proto())).collect(),
            }),
        };
        let canonical = example.encode_to_vec();
        let mut parser = BatchParser::new(schema).unwrap();
        let batch = parser.parse(&[&canonical, &canonical]).unwrap();
        prop_assert_eq!(batch.num_rows, 2);
        for (index, list) in features.values().enumerate() {
            check(&batch, index, 0, list)?;
            check(&batch, index, 1, list)?;
        }
        // Every other valid encoding of the same record decodes identically.
        let other = encode_example(&all, encoding);
        // prost reads it as the same message (compared encoded: NaN != NaN).
        prop_assert_eq!(&Example::decode(&other[..]).unwrap().encode_to_vec(), &canonical, "{:?}", encoding);
        let again = parser.parse(&[&canonical, &other]).unwrap();
        prop_assert_eq!(format!("{batch:?}"), format!("{again:?}"));
    }

    #[test]
    fn prost_sequence_examples_decode_to_their_values(
        steps in prop::collection::vec(prop::collection::vec(any::<i64>(), 0..4), 0..5),
        frames in prop::collection::vec(prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 2), 0..4),
        context in any::<i64>(),
    ) {
        let feature = |l: List| l.to_proto();
        let mut lists = BTreeMap::new();
        if !steps.is_empty() {
            lists.insert("tokens".to_string(), proto::FeatureList {
                feature: steps.iter().map(|s| feature(List::Int(s.clone()))).collect(),
            });
        }
        lists.insert("frames".to_string(), proto::FeatureList {
            feature: frames.iter().map(|s| feature(List::Float(s.clone()))).collect(),
        });
        let record = SequenceExample {
            context: Some(proto::Features {
                feature: [("id".to_string(), feature(List::Int(vec![context])))].into(),
            }),
            feature_lists: Some(proto::FeatureLists { feature_list: lists }),
        }
        .encode_to_vec();
        let schema = Schema::from_feature_texts(&["id:int64", "tokens:int64:seq:var", "frames:float32:seq:2"]).unwrap();
        let mut parser = BatchParser::new(schema).unwrap();
        let batch = parser.parse(&[&record, &record]).unwrap();
        prop_assert_eq!(batch.columns[0].as_i64().unwrap(), &[context, context][..]);
        let tokens = &batch.columns[1];
        let flat: Vec<i64> = steps.iter().flatten().copied().collect();
        prop_assert_eq!(&tokens.as_i64().unwrap()[tokens.row_range(1).unwrap()], &flat[..]);
        prop_assert_eq!(tokens.row_splits[0].clone(), vec![0, steps.len(), 2 * steps.len()]);
        let per_step: Vec<usize> = tokens.row_splits[1].windows(2).map(|w| w[1] - w[0]).collect();
        let want: Vec<usize> = steps.iter().chain(&steps).map(Vec::len).collect();
        prop_assert_eq!(per_step, want);
        let frames_col = &batch.columns[2];
        let bits: Vec<u32> = frames.iter().flatten().map(|f| f.to_bits()).collect();
        let ours: Vec<u32> = frames_col.as_f32().unwrap()[frames_col.row_range(0).unwrap()].iter().map(|f| f.to_bits()).collect();
        prop_assert_eq!(ours, bits);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        for texts in [
            &["a:int64:var", "b:float32:var", "c:bytes:var"][..],
            &["a:int64=1", "b:float32:2=0", "c:bytes=x", "d:uint8:4=0"][..],
            &["a:int64", "s:int64:seq:var", "f:float32:seq:2", "u:uint8:seq:2"][..],
        ] {
            let mut parser = BatchParser::new(Schema::from_feature_texts(texts).unwrap()).unwrap();
            let _ = parser.parse(&[&bytes]);
        }
    }

    #[test]
    fn mutated_records_never_panic(
        features in prop::collection::btree_map("[a-c]", list(), 1..4),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let example = Example {
            features: Some(proto::Features {
                feature: features.iter().map(|(k, l)| (k.clone(), l.to_proto())).collect(),
            }),
        };
        let mut record = example.encode_to_vec();
        for (at, byte) in flips {
            let i = at.index(record.len());
            record[i] ^= byte | 1;
        }
        let schema = Schema {
            features: features.iter().map(|(n, l)| FeatureSpec::var(n.as_str(), l.dtype())).collect(),
            label: None,
        };
        let mut parser = BatchParser::new(schema).unwrap();
        let _ = parser.parse(&[&record]);
        let _ = parser.parse(&[&record[..cut.index(record.len() + 1)]]);
    }
}

#[test]
fn layouts_of_parsed_columns() {
    let schema = Schema::from_feature_texts(&[
        "a:int64:2",
        "b:bytes:var",
        "c:float32:seq:3",
        "d:int64:seq:var",
    ])
    .unwrap();
    let batch = BatchParser::new(schema)
        .unwrap()
        .parse::<&[u8]>(&[])
        .unwrap();
    let layouts: Vec<(usize, Vec<usize>)> = batch
        .columns
        .iter()
        .map(|c| (c.row_splits.len(), c.inner_shape.clone()))
        .collect();
    assert_eq!(
        layouts,
        vec![(0, vec![2]), (1, vec![]), (1, vec![3]), (2, vec![])]
    );
    assert!(
        batch
            .columns
            .iter()
            .all(|c| c.row_splits.iter().all(|s| s == &[0]))
    );
}
