//! The row-regrouping stages (`unbatch`, `rebatch`, `window`,
//! `padded_batch` over parsed columns, `bucket_by_sequence_length`, `pack`):
//! their outputs, and resumption by replay: a pipeline resumed from the
//! state taken after `k` events yields exactly the rest of the
//! uninterrupted stream, for every `k`, over random inputs and upstreams
//! (parallel stages and `repeat` included). For `pack`, the uninterrupted
//! stream holds every input sequence exactly once, so head + resumed rest
//! loses and duplicates none.

use std::collections::BTreeMap;

use tfpipe::pipeline::{
    BucketOptions, Event, PackOptions, PadValue, PaddedShape, Padding, Parallelism, Pipeline,
    PipelineIter, PipelineState,
};
use tfpipe::{Batch, Column, Values};

use crate::common::watchdog;

/// xorshift64*, as in `state.rs`.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
    }
}

/// Value `j` of sequence `id`.
fn token(id: u64, j: usize) -> i64 {
    (id * 1000 + j as u64 + 1) as i64
}

/// Rows `(id, length)` as one batch: `t` var-length tokens, `id` a scalar.
fn batch_of(rows: &[(u64, usize)]) -> Batch {
    let mut values = Vec::new();
    let mut splits = vec![0];
    for &(id, n) in rows {
        values.extend((0..n).map(|j| token(id, j)));
        splits.push(values.len());
    }
    Batch {
        num_rows: rows.len(),
        columns: vec![
            Column {
                name: "t".into(),
                values: Values::Int64(values),
                row_splits: vec![splits],
                inner_shape: vec![],
            },
            Column {
                name: "id".into(),
                values: Values::Int64(rows.iter().map(|r| r.0 as i64).collect()),
                row_splits: vec![],
                inner_shape: vec![],
            },
        ],
    }
}

/// Random rows, split into batches of 1 to 5 rows (some empty sequences).
fn random_batches(rng: &mut Rng, max_len: u64) -> (Vec<(u64, usize)>, Vec<Batch>) {
    let n = 10 + rng.below(60);
    let rows: Vec<(u64, usize)> = (0..n)
        .map(|id| (id, rng.below(max_len + 1) as usize))
        .collect();
    let mut batches = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let k = (1 + rng.below(5) as usize).min(rows.len() - i);
        batches.push(batch_of(&rows[i..i + k]));
        i += k;
    }
    (rows, batches)
}

#[derive(Debug, PartialEq)]
enum Seen<T> {
    Item(T),
    Error(String),
    End(u64),
}

fn events<T>(it: &mut PipelineIter<T>, n: Option<usize>) -> Vec<Seen<T>> {
    let mut out = Vec::new();
    while n.is_none_or(|n| out.len() < n) {
        match it.next_event() {
            Some(Event::Item(Ok(item))) => out.push(Seen::Item(item)),
            Some(Event::Item(Err(e))) => out.push(Seen::Error(e.to_string())),
            Some(Event::EpochEnd(e)) => out.push(Seen::End(e)),
            None => break,
        }
    }
    out
}

/// Resumes `pipeline` after every event (or every `step`-th) and checks
/// the rest against the uninterrupted stream. Returns that stream.
fn check_resumes<T: std::fmt::Debug + PartialEq + Send + 'static>(
    pipeline: &Pipeline<T>,
    desc: &str,
    step: usize,
) -> Vec<Seen<T>> {
    let full = events(&mut pipeline.start().unwrap(), None);
    for cut in (0..=full.len()).step_by(step) {
        let mut it = pipeline.start().unwrap();
        let head = events(&mut it, Some(cut));
        assert_eq!(head[..], full[..cut], "{desc}");
        let json = it
            .state()
            .unwrap_or_else(|e| panic!("{desc} at {cut}: {e}"))
            .to_json();
        drop(it);
        let state = PipelineState::from_json(&json).unwrap();
        let mut resumed = pipeline
            .start_from(&state)
            .unwrap_or_else(|e| panic!("{desc} at {cut}: {e}"));
        let rest = events(&mut resumed, None);
        assert_eq!(
            rest[..],
            full[cut..],
            "{desc}, cut at {cut} of {}",
            full.len()
        );
    }
    full
}

/// A random upstream over `batches`: parallel map, prefetch, repeat.
fn upstream(rng: &mut Rng, batches: Vec<Batch>, desc: &mut String) -> Pipeline<Batch> {
    let mut p = Pipeline::from_vec(batches);
    if rng.below(2) == 0 {
        *desc += ".map_parallel(2)";
        p = p.map_parallel(Parallelism::Fixed(2), Ok::<Batch, std::convert::Infallible>);
    }
    if rng.below(2) == 0 {
        *desc += ".prefetch(2)";
        p = p.prefetch(2);
    }
    if rng.below(3) == 0 {
        *desc += ".repeat(2)";
        p = p.repeat(Some(2));
    }
    p
}

#[test]
fn row_stages_over_parsed_batches_resume_exactly() {
    watchdog(240, || {
        let mut rng = Rng(0x005E_ED0F_5EC5);
        for case in 0..72 {
            let (_, batches) = random_batches(&mut rng, 12);
            let mut desc = format!("case {case}: from_vec");
            let up = upstream(&mut rng, batches, &mut desc);
            let drop = rng.below(2) == 0;
            let p = match case % 6 {
                0 => {
                    desc += ".unbatch()";
                    up.unbatch()
                }
                1 => {
                    let n = 1 + rng.below(7) as usize;
                    desc += &format!(".rebatch({n}, {drop})");
                    up.rebatch(n, drop)
                }
                2 => {
                    let n = 1 + rng.below(5) as usize;
                    desc += &format!(".padded_batch({n}, mask, {drop})");
                    up.padded_batch(n, Padding::new().mask(), drop)
                }
                3 => {
                    let to_boundary = rng.below(2) == 0;
                    desc += &format!(".bucket([3, 7, 13], to_boundary {to_boundary}, {drop})");
                    let options = BucketOptions::new("t", vec![3, 7, 13], vec![2, 3, 2, 1])
                        .pad_to_bucket_boundary(to_boundary)
                        .drop_remainder(drop)
                        .padding(Padding::new().lengths());
                    up.bucket_by_sequence_length(options)
                }
                4 => {
                    let (size, shift, stride) =
                        (1 + rng.below(4), 1 + rng.below(4), 1 + rng.below(2));
                    desc += &format!(".window_rows({size}, {shift}, {stride}, {drop})");
                    up.window_rows(size as usize, shift as usize, stride as usize, drop)
                }
                _ => {
                    let length = 8 + rng.below(5) as usize;
                    let bins = 1 + rng.below(3) as usize;
                    desc += &format!(".pack(t, {length}, {bins})");
                    up.pack(PackOptions::new(["t"], length, bins))
                }
            };
            let p = if rng.below(3) == 0 {
                desc += ".prefetch(1)";
                p.prefetch(1)
            } else {
                p
            };
            check_resumes(&p, &desc, 1);
        }
    });
}

/// The sequences in a packed batch, as `id -> (length, position within its bin row)`.
fn unpack(batch: &Batch, length: usize) -> Vec<(u64, Vec<i64>)> {
    let values = batch.column("t").unwrap().as_i64().unwrap();
    let segments = match &batch.column("t_segment_ids").unwrap().values {
        Values::Int32(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    let positions = match &batch.column("t_positions").unwrap().values {
        Values::Int32(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    let mut out: Vec<(u64, Vec<i64>)> = Vec::new();
    for row in 0..batch.num_rows {
        let mut last = 0;
        for i in row * length..(row + 1) * length {
            let (s, p, v) = (segments[i], positions[i], values[i]);
            if s == 0 {
                assert_eq!((p, v), (0, 0), "padding at {i}");
                continue;
            }
            if s != last {
                // Up, not always by one: an empty sequence takes a segment
                // id and no cell, as in Grain.
                assert!(s > last, "segment ids count up in row {row}");
                assert_eq!(p, 0);
                last = s;
                out.push(((v as u64 - 1) / 1000, Vec::new()));
            }
            let seq = out.last_mut().unwrap();
            assert_eq!(p as usize, seq.1.len());
            seq.1.push(v);
        }
    }
    out
}

/// Packing keeps every non-empty sequence exactly once (truncated to the
/// length), fills rows first-fit, and resumes from every cut, its bins
/// shuffled or not.
#[test]
fn pack_keeps_every_sequence_once_across_restarts() {
    watchdog(240, || {
        let mut rng = Rng(0xFACE_B00C);
        for case in 0..20 {
            let (rows, batches) = random_batches(&mut rng, 14);
            let length = 6 + rng.below(6) as usize;
            let bins = 1 + rng.below(4) as usize;
            let mut desc = format!("case {case}: pack({length}, {bins})");
            let mut options = PackOptions::new(["t"], length, bins);
            if case % 2 == 1 {
                desc += ".shuffle_bins(5)";
                options = options.shuffle_bins(5);
            }
            let p = upstream(&mut rng, batches, &mut desc).pack(options);
            let full = check_resumes(&p, &desc, 1);
            let mut seen: BTreeMap<(u64, u64), usize> = BTreeMap::new();
            let mut epoch = 0;
            for event in &full {
                match event {
                    Seen::Item(batch) => {
                        assert!(batch.num_rows <= bins, "{desc}");
                        for (id, values) in unpack(batch, length) {
                            let n = rows[id as usize].1.min(length);
                            let expected: Vec<i64> = (0..n).map(|j| token(id, j)).collect();
                            assert_eq!(values, expected, "{desc}: sequence {id}");
                            *seen.entry((epoch, id)).or_default() += 1;
                        }
                    }
                    Seen::End(_) => epoch += 1,
                    Seen::Error(e) => panic!("{desc}: {e}"),
                }
            }
            let epochs = epoch.max(1);
            for e in 0..epochs {
                for &(id, n) in &rows {
                    let count = seen.get(&(e, id)).copied().unwrap_or(0);
                    // An empty sequence occupies no cell, so it cannot be seen.
                    let want = usize::from(n > 0);
                    assert_eq!(count, want, "{desc}: sequence {id} in epoch {e}");
                }
            }
        }
    });
}

/// First fit: a sequence goes to the first open row with room; a full set
/// of bins is emitted when one fits nowhere.
#[test]
fn pack_is_first_fit() {
    let rows = [(0, 3), (1, 4), (2, 1), (3, 2), (4, 5)];
    let out: Vec<Batch> = Pipeline::from_vec(vec![batch_of(&rows)])
        .pack(PackOptions::new(["t"], 5, 2).pad_value(PadValue::Int(0)))
        .start()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Bins: [0, 2] (3 + 1), [1] (4); 3 (2) fits nowhere: emit, start over.
    let ids: Vec<Vec<u64>> = out
        .iter()
        .map(|b| unpack(b, 5).into_iter().map(|(id, _)| id).collect())
        .collect();
    assert_eq!(ids, [vec![0, 2, 1], vec![3, 4]]);
    assert_eq!(out[0].num_rows, 2);
    assert_eq!(out[1].num_rows, 2);
    // A sequence longer than the length is truncated.
    let long = Pipeline::from_vec(vec![batch_of(&[(7, 9)])])
        .pack(PackOptions::new(["t"], 4, 1))
        .start()
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        long.column("t").unwrap().as_i64(),
        Some(&[7001, 7002, 7003, 7004][..])
    );
    // A missing feature is an error item, not a panic.
    let missing = Pipeline::from_vec(vec![batch_of(&[(1, 2)])])
        .pack(PackOptions::new(["nope"], 4, 1))
        .start()
        .unwrap()
        .next()
        .unwrap();
    assert!(missing.unwrap_err().to_string().contains("nope"));
}

#[test]
fn vec_stages_resume_exactly() {
    watchdog(240, || {
        let mut rng = Rng(0x00C0_FFEE);
        for case in 0..60 {
            let n = rng.below(40);
            let items: Vec<u64> = (0..n).collect();
            let mut desc = format!("case {case}: 0..{n}");
            let mut p = Pipeline::from_vec(items);
            if rng.below(2) == 0 {
                desc += ".prefetch(2)";
                p = p.prefetch(2);
            }
            if rng.below(3) == 0 {
                desc += ".repeat(2)";
                p = p.repeat(Some(2));
            }
            let drop = rng.below(2) == 0;
            match case % 3 {
                0 => {
                    let (size, shift, stride) = (
                        1 + rng.below(4) as usize,
                        1 + rng.below(4) as usize,
                        1 + rng.below(3) as usize,
                    );
                    desc += &format!(".window({size}, {shift}, {stride}, {drop})");
                    check_resumes(&p.window(size, shift, stride, drop), &desc, 1);
                }
                1 if rng.below(2) == 0 => {
                    let (a, b) = (1 + rng.below(5) as usize, 1 + rng.below(5) as usize);
                    desc += &format!(".batch({a}).rebatch({b}, {drop})");
                    check_resumes(&p.batch(a).rebatch(b, drop), &desc, 1);
                }
                1 => {
                    let a = 1 + rng.below(5) as usize;
                    let sizes: Vec<usize> = (0..1 + rng.below(3))
                        .map(|_| 1 + rng.below(4) as usize)
                        .collect();
                    desc += &format!(".batch({a}).rebatch_sizes({sizes:?}, {drop})");
                    check_resumes(&p.batch(a).rebatch_sizes(&sizes, drop), &desc, 1);
                }
                _ => {
                    let a = 1 + rng.below(5) as usize;
                    desc += &format!(".batch({a}).unbatch()");
                    let full = check_resumes(&p.batch(a).unbatch(), &desc, 1);
                    let items: Vec<u64> = full
                        .into_iter()
                        .filter_map(|s| match s {
                            Seen::Item(x) => Some(x),
                            _ => None,
                        })
                        .collect();
                    let once: Vec<u64> = (0..n).collect();
                    assert!(
                        items.chunks(n.max(1) as usize).all(|c| c == once || n == 0),
                        "{desc}"
                    );
                }
            }
        }
    });
}

/// Padding parsed columns of every layout and dtype.
#[test]
fn padding_covers_every_layout() {
    // A fixed sequence of float32 pairs: rows of 2 and 1 steps.
    let seq = Column {
        name: "f".into(),
        values: Values::Float32(vec![1., 2., 3., 4., 5., 6.]),
        row_splits: vec![vec![0, 2, 3]],
        inner_shape: vec![2],
    };
    // A var-length sequence of int16: [[1], [2, 3]] and [[]].
    let vs = Column {
        name: "v".into(),
        values: Values::Int16(vec![1, 2, 3]),
        row_splits: vec![vec![0, 2, 3], vec![0, 1, 3, 3]],
        inner_shape: vec![],
    };
    // Byte strings.
    let tags = Column {
        name: "b".into(),
        values: Values::Bytes {
            data: b"xyz".to_vec(),
            offsets: vec![0, 1, 3],
        },
        row_splits: vec![vec![0, 0, 2]],
        inner_shape: vec![],
    };
    let dense = Column {
        name: "d".into(),
        values: Values::Uint8(vec![9, 8]),
        row_splits: vec![],
        inner_shape: vec![],
    };
    let batch = Batch {
        num_rows: 2,
        columns: vec![seq, vs, tags, dense.clone()],
    };
    let padding = Padding::new().value(PadValue::Int(-1)).mask().feature(
        "b",
        tfpipe::pipeline::PadSpec {
            shape: PaddedShape::Fixed(3),
            step_shape: PaddedShape::BatchMax,
            value: PadValue::Bytes(b"?".to_vec()),
            info: tfpipe::pipeline::PadInfo::Lengths,
        },
    );
    let out = padding.apply(&batch).unwrap();
    let names: Vec<&str> = out.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["f", "f_mask", "v", "v_mask", "b", "b_length", "d"]);
    let f = out.column("f").unwrap();
    assert_eq!(f.inner_shape, [2, 2]);
    assert_eq!(f.as_f32(), Some(&[1., 2., 3., 4., 5., 6., -1., -1.][..]));
    assert_eq!(
        out.column("f_mask").unwrap().as_u8(),
        Some(&[1, 1, 1, 0][..])
    );
    let v = out.column("v").unwrap();
    assert_eq!(v.inner_shape, [2, 2]);
    assert_eq!(v.values, Values::Int16(vec![1, -1, 2, 3, -1, -1, -1, -1]));
    assert_eq!(
        out.column("v_mask").unwrap().as_u8(),
        Some(&[1, 0, 1, 1, 0, 0, 0, 0][..])
    );
    let b = out.column("b").unwrap();
    assert_eq!(b.inner_shape, [3]);
    let strings: Vec<&[u8]> = (0..6).map(|i| b.bytes(i).unwrap()).collect();
    assert_eq!(strings, [&b"?"[..], b"?", b"?", b"x", b"yz", b"?"]);
    assert_eq!(out.column("b_length").unwrap().as_i64(), Some(&[0, 2][..]));
    assert_eq!(out.column("d"), Some(&dense));
    // Too long for a fixed shape, and a pad value of the wrong type: errors.
    let short = Padding::new().shape(PaddedShape::Fixed(1)).apply(&batch);
    assert!(
        short
            .unwrap_err()
            .to_string()
            .contains("longer than the padded shape 1")
    );
    let wrong = Padding::new().value(PadValue::Bytes(vec![])).apply(&batch);
    assert!(wrong.is_err());
}

/// Buckets by length, flushes remainders in bucket order, pads to the
/// boundary when asked, and refuses bad settings at start.
#[test]
fn bucketing_groups_by_length() {
    let rows: Vec<(u64, usize)> = [1, 5, 2, 9, 6, 0, 3]
        .iter()
        .enumerate()
        .map(|(i, &n)| (i as u64, n))
        .collect();
    let run = |options: BucketOptions| -> Vec<(Vec<i64>, Vec<usize>)> {
        Pipeline::from_vec(vec![batch_of(&rows)])
            .bucket_by_sequence_length(options)
            .start()
            .unwrap()
            .map(|b| {
                let b = b.unwrap();
                let ids = b.column("id").unwrap().as_i64().unwrap().to_vec();
                (ids, b.column("t").unwrap().inner_shape.clone())
            })
            .collect()
    };
    // Buckets [0, 3), [3, 7), [7, inf) with batch sizes 2, 2, 2.
    let options = BucketOptions::new("t", vec![3, 7], vec![2, 2, 2]);
    assert_eq!(
        run(options.clone()),
        [
            (vec![0, 2], vec![2]),
            (vec![1, 4], vec![6]),
            (vec![5], vec![0]),
            (vec![6], vec![3]),
            (vec![3], vec![9]),
        ]
    );
    assert_eq!(run(options.clone().drop_remainder(true)).len(), 2);
    let to_boundary =
        BucketOptions::new("t", vec![3, 7, 10], vec![2, 2, 2, 2]).pad_to_bucket_boundary(true);
    let shapes: Vec<Vec<usize>> = run(to_boundary).into_iter().map(|(_, s)| s).collect();
    assert_eq!(shapes, [vec![2], vec![6], vec![2], vec![6], vec![9]]);
    let bad = Pipeline::from_vec(vec![batch_of(&rows)])
        .bucket_by_sequence_length(BucketOptions::new("t", vec![3, 3], vec![1, 1, 1]));
    assert!(bad.start().is_err());
}

/// A serialized `Example` with var-length int64 `t` (sequence `i`, of a
/// length from 0 to 12) and scalar `id`.
fn token_example(i: u64) -> Vec<u8> {
    use prost::Message;
    use tfpipe::example::Example;
    use tfpipe::example::proto::{Feature, Features, Int64List, feature};
    let n = ((i * 7) % 13) as usize;
    let int64 = |value: Vec<i64>| Feature {
        kind: Some(feature::Kind::Int64List(Int64List { value })),
    };
    let mut features = std::collections::BTreeMap::new();
    features.insert(
        "t".to_string(),
        int64((0..n).map(|j| token(i, j)).collect()),
    );
    features.insert("id".to_string(), int64(vec![i as i64]));
    Example {
        features: Some(Features { feature: features }),
    }
    .encode_to_vec()
}

/// From TFRecord files through a shuffle and a parallel parse: packing and
/// bucketing resume exactly (the replay re-reads the files from the anchor).
#[test]
fn pack_and_bucket_over_tfrecord_files_resume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    crate::common::write_shards(
        dir.path(),
        2,
        60,
        tfpipe::tfrecord::Compression::None,
        token_example,
    );
    let pattern = dir.path().join("part-*").display().to_string();
    watchdog(240, move || {
        let schema = tfpipe::Schema::from_feature_texts(&["t:int64:var", "id:int64"]).unwrap();
        let parsed = Pipeline::tfrecord_files([pattern])
            .unwrap()
            .interleave(2, 4)
            .shuffle(16, 3)
            .batch(7)
            .parse_batches(schema, Parallelism::Fixed(2))
            .repeat(Some(2));
        let packed = parsed.clone().pack(PackOptions::new(["t"], 16, 3));
        let full = check_resumes(&packed, "files.pack", 3);
        assert!(full.len() > 20, "{}", full.len());
        let options = BucketOptions::new("t", vec![4, 9], vec![3, 5, 4]);
        check_resumes(
            &parsed.bucket_by_sequence_length(options),
            "files.bucket",
            3,
        );
    });
}
