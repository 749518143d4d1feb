//! Image folders: PNG and JPEG files generated here, read back with the
//! sizes from their headers and classes in sorted order.

use std::io::Write;
use std::path::Path;

use tfpipe::convert::{ConvertError, Format, ImagesLayout, ImagesOptions};
use tfpipe::example::DType;

use super::common::*;

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = crc32fast::Hasher::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.finalize().to_be_bytes());
}

/// A valid RGB PNG of `w` x `h` pixels, all of one colour.
pub fn png(w: u32, h: u32, colour: [u8; 3]) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut out, b"IHDR", &ihdr);
    // Each scanline: filter type 0 (none), then the pixels.
    let mut line = vec![0u8];
    line.extend(colour.repeat(w as usize));
    let raw = line.repeat(h as usize);
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw).unwrap();
    chunk(&mut out, b"IDAT", &z.finish().unwrap());
    chunk(&mut out, b"IEND", &[]);
    out
}

/// The segments a JPEG header has up to its frame header: SOI, APP0 (JFIF),
/// SOF0 with the size, then EOI. Enough for header reading (no decoding).
pub fn jpeg_header(w: u16, h: u16) -> Vec<u8> {
    let mut out = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
    out.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
    out.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x11, 0x08]);
    out.extend_from_slice(&h.to_be_bytes());
    out.extend_from_slice(&w.to_be_bytes());
    out.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

fn tree(root: &Path) {
    for (class, files) in [
        (
            "dog",
            vec![
                ("b.png", png(4, 3, [1, 2, 3])),
                ("a.JPG", jpeg_header(640, 480)),
            ],
        ),
        (
            "cat",
            vec![
                ("z.jpeg", jpeg_header(7, 9)),
                ("y.png", png(2, 5, [9, 9, 9])),
                ("notes.txt", b"x".to_vec()),
            ],
        ),
    ] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for (name, bytes) in files {
            std::fs::write(root.join(class).join(name), bytes).unwrap();
        }
    }
    std::fs::write(root.join("README"), "not a class").unwrap();
}

#[test]
fn folders_become_classes_with_sizes_from_headers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("photos");
    tree(&root);
    let summary = run(
        &Format::Images(ImagesOptions {
            layout: ImagesLayout::Imagenet,
            ..ImagesOptions::default()
        }),
        std::slice::from_ref(&root),
        dir.path(),
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.records, 4);
    let (schema, meta) = load_schema(&summary);
    assert_eq!(schema.label.as_deref(), Some("image/class/label"));
    // The encoded bytes are marked as an image, as in the TFDS layout, so
    // that `train --schema` decodes them (the sizes here differ).
    assert_eq!(
        schema.feature("image/encoded").unwrap().to_string(),
        "image/encoded:image:224x224x3:center"
    );
    assert_eq!(schema.feature("image/format").unwrap().dtype, DType::Bytes);
    assert_eq!(meta["source"]["classes"], serde_json::json!(["cat", "dog"]));
    assert_eq!(meta["source"]["files_ignored"], 2);
    let rows = read_rows(&summary);
    // cat/y.png, cat/z.jpeg, dog/a.JPG, dog/b.png.
    let expect = [
        ("cat", 0, "y.png", "png", 2, 5),
        ("cat", 0, "z.jpeg", "jpeg", 7, 9),
        ("dog", 1, "a.JPG", "jpeg", 640, 480),
        ("dog", 1, "b.png", "png", 4, 3),
    ];
    for (row, (class, label, file, format, w, h)) in rows.iter().zip(expect) {
        let bytes = std::fs::read(root.join(class).join(file)).unwrap();
        assert_eq!(row["image/encoded"], Feat::B(vec![bytes]));
        assert_eq!(
            row["image/format"],
            Feat::B(vec![format.as_bytes().to_vec()])
        );
        assert_eq!(row["image/width"], Feat::I(vec![w]));
        assert_eq!(row["image/height"], Feat::I(vec![h]));
        assert_eq!(row["image/class/label"], Feat::I(vec![label]));
        assert_eq!(
            row["image/class/text"],
            Feat::B(vec![class.as_bytes().to_vec()])
        );
    }
}

#[test]
fn a_broken_image_is_reported_or_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("photos");
    tree(&root);
    std::fs::write(root.join("cat/broken.png"), b"\x89PNG\r\n\x1a\n\0\0").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let err = run(
        &Format::Images(ImagesOptions::default()),
        std::slice::from_ref(&root),
        &out,
        |_| {},
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("broken.png: byte 10: truncated PNG"),
        "{text}"
    );
    assert!(files_in(&out).is_empty());
    let summary = run(
        &Format::Images(ImagesOptions::default()),
        &[root],
        &out,
        |o| o.skip_bad_rows = true,
    )
    .unwrap();
    assert_eq!((summary.records, summary.rows_skipped), (4, 1));
    assert!(summary.bad_rows[0].to_string().contains("broken.png"));
}

#[cfg(not(feature = "images"))]
#[test]
fn resize_without_the_feature_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("photos");
    tree(&root);
    let err = run(
        &Format::Images(ImagesOptions {
            resize: Some((8, 8)),
            ..ImagesOptions::default()
        }),
        &[root],
        dir.path(),
        |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, ConvertError::ResizeUnavailable));
    assert!(err.to_string().contains("`images` cargo feature"));
}

#[cfg(feature = "images")]
#[test]
fn resize_stores_raw_rgb_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("photos");
    std::fs::create_dir_all(root.join("red")).unwrap();
    std::fs::write(root.join("red/a.png"), png(5, 7, [200, 10, 20])).unwrap();
    let summary = run(
        &Format::Images(ImagesOptions {
            layout: ImagesLayout::Imagenet,
            resize: Some((3, 2)),
            ..ImagesOptions::default()
        }),
        &[root],
        dir.path(),
        |_| {},
    )
    .unwrap();
    let (schema, _) = load_schema(&summary);
    assert_eq!(
        schema.feature("image/raw").unwrap().layout,
        tfpipe::example::Layout::Fixed(vec![2, 3, 3])
    );
    let rows = read_rows(&summary);
    assert_eq!(
        rows[0]["image/raw"],
        Feat::B(vec![[200u8, 10, 20].repeat(6)])
    );
    assert_eq!(rows[0]["image/width"], Feat::I(vec![3]));
    let _ = ConvertError::Interrupted;
}

/// By default the layout is TFDS's (`image`, `label`) and the schema marks
/// `image` as an image feature: at the common size (grey when every image
/// is), or a 224x224 centre crop when sizes differ; the schema decodes the
/// shards.
#[test]
fn the_default_layout_is_tfds_with_the_image_in_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("photos");
    tree(&root);
    let summary = run(
        &Format::Images(ImagesOptions::default()),
        std::slice::from_ref(&root),
        dir.path(),
        |_| {},
    )
    .unwrap();
    let (schema, _) = load_schema(&summary);
    let specs: Vec<String> = schema.features.iter().map(|f| f.to_string()).collect();
    assert_eq!(specs, ["image:image:224x224x3:center", "label:int64"]);
    assert_eq!(schema.label.as_deref(), Some("label"));
    let rows = read_rows(&summary);
    assert_eq!(
        rows[0]["image"],
        Feat::B(vec![std::fs::read(root.join("cat/y.png")).unwrap()])
    );
    assert_eq!(rows[0]["label"], Feat::I(vec![0]));
    assert_eq!(rows[0].len(), 2);

    let digits = dir.path().join("digits");
    let digit = std::fs::read(testdata("images/digit.png")).unwrap();
    for class in ["seven", "zero"] {
        std::fs::create_dir_all(digits.join(class)).unwrap();
        for name in ["1.png", "2.png"] {
            std::fs::write(digits.join(class).join(name), &digit).unwrap();
        }
    }
    let out = dir.path().join("digits-out");
    std::fs::create_dir(&out).unwrap();
    let summary = run(
        &Format::Images(ImagesOptions::default()),
        &[digits],
        &out,
        |_| {},
    )
    .unwrap();
    let (schema, _) = load_schema(&summary);
    assert_eq!(schema.features[0].to_string(), "image:image:28x28x1");
    let records: Vec<Vec<u8>> = {
        let mut reader = tfpipe::tfrecord::FileRecordReader::open(
            &summary.shards[0],
            tfpipe::tfrecord::ReaderOptions::default(),
        )
        .unwrap();
        let mut records = Vec::new();
        let mut buf = Vec::new();
        while reader.read_record(&mut buf).unwrap() {
            records.push(buf.clone());
        }
        records
    };
    let batch = tfpipe::BatchParser::new(schema)
        .unwrap()
        .parse(&records)
        .unwrap();
    assert_eq!(batch.num_rows, 4);
    assert_eq!(batch.columns[0].as_u8().unwrap().len(), 4 * 784);
}
