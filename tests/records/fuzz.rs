//! A bounded, seeded fuzz pass over the same target bodies as the cargo-fuzz
//! crate in `fuzz/` (`tfpipe::fuzzing`): random bytes and mutations of the
//! golden files and test images, a few thousand inputs per target, the same
//! every run.

use tfpipe::fuzzing;

use crate::common::golden;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// `seed` with a few bytes flipped, inserted, removed, or cut short.
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut out = seed.to_vec();
        for _ in 0..1 + self.below(4) {
            if out.is_empty() {
                out.push(self.next() as u8);
            }
            let at = self.below(out.len());
            match self.below(4) {
                0 => out[at] ^= 1 << self.below(8),
                1 => out.insert(at, self.next() as u8),
                2 => {
                    out.remove(at);
                }
                _ => out.truncate(at),
            }
        }
        out
    }
}

#[test]
fn record_reader_survives_random_and_mutated_streams() {
    let mut rng = Rng(0x5eed_0001);
    let seeds: Vec<Vec<u8>> = [
        "examples.tfrecord",
        "examples.tfrecord.gz",
        "examples.tfrecord.zlib",
    ]
    .iter()
    .map(|name| std::fs::read(golden(name)).unwrap())
    .collect();
    for i in 0..1500 {
        let mut input = vec![rng.next() as u8];
        if i % 2 == 0 {
            input.extend(rng.bytes(200));
        } else {
            let seed = &seeds[i / 2 % 3];
            // The mode byte: compression (matching the seed's), policy, buffer.
            input[0] = (rng.below(28) * 9 + rng.below(3) * 3 + i / 2 % 3) as u8;
            input.extend(rng.mutate(seed));
        }
        fuzzing::record_reader(&input);
    }
}

#[test]
fn schema_parser_agrees_with_itself_on_random_schemas_and_records() {
    let mut rng = Rng(0x5eed_0002);
    let (mut good, mut bad) = (0, 0);
    for _ in 0..3000 {
        let (g, b) = fuzzing::schema_parser(&rng.bytes(400));
        good += g;
        bad += b;
    }
    // The pass reaches both the parsing and the rollback paths, often.
    assert!(good > 1000 && bad > 1000, "good {good}, bad {bad}");
}

#[test]
fn schema_file_parser_survives_random_and_mutated_files() {
    let mut rng = Rng(0x5eed_0003);
    let schema = tfpipe::Schema::from_feature_texts(&[
        "image_raw:uint8:28x28",
        "label:int64",
        "tags:bytes:var",
        "w:float32:2=0.5",
    ])
    .unwrap();
    let seed = schema.to_json_value().to_string().into_bytes();
    fuzzing::schema_file(&seed);
    for i in 0..3000 {
        let input = if i % 4 == 0 {
            rng.bytes(100)
        } else {
            rng.mutate(&seed)
        };
        fuzzing::schema_file(&input);
    }
}

#[cfg(feature = "images")]
#[test]
fn image_decoder_survives_random_and_mutated_images() {
    let mut rng = Rng(0x5eed_0004);
    let images = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/images");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&images)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            ["jpg", "png", "gif", "bmp"].contains(&ext)
        })
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 15, "the test images");
    // Each seed whole first (every path's invariants on valid images), then
    // mutated: flipped, inserted, removed bytes and truncations.
    for seed in &seeds {
        for picks in 0..4u8 {
            let mut input = vec![picks.wrapping_mul(67); 6];
            input.extend_from_slice(seed);
            assert!(fuzzing::image_decoder(&input), "a test image decodes");
        }
    }
    let (mut decoded, mut failed) = (0, 0);
    for i in 0..3000 {
        let mut input: Vec<u8> = (0..6).map(|_| rng.next() as u8).collect();
        if i % 10 == 0 {
            input.extend(rng.bytes(300));
        } else {
            let seed = &seeds[rng.below(seeds.len())];
            input.extend(rng.mutate(seed));
        }
        if fuzzing::image_decoder(&input) {
            decoded += 1;
        } else {
            failed += 1;
        }
    }
    // Both paths, often: mutated images that still decode, and errors.
    assert!(
        decoded > 300 && failed > 300,
        "decoded {decoded}, failed {failed}"
    );
}

#[cfg(feature = "serve")]
#[test]
fn serve_inputs_become_their_rows_or_a_400_naming_the_field() {
    let mut rng = Rng(0x5eed_0005);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..4000 {
        let (a, r) = fuzzing::serve_inputs(&rng.bytes(300));
        accepted += a;
        refused += r;
    }
    // Both paths, often.
    assert!(
        accepted > 2000 && refused > 10000,
        "accepted {accepted}, refused {refused}"
    );
}
