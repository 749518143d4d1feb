//! A bounded, seeded fuzz pass over the CSV and JSON converters, through the
//! same bodies as the cargo-fuzz targets in `fuzz/` (`tfpipe::fuzzing`):
//! random bytes, hand-picked tricky inputs and mutations of the bundled
//! tabular files, the same every run, a few seconds in all.

use tfpipe::fuzzing;

use super::common::testdata;

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

    /// Bytes drawn mostly from `alphabet`, so the parsers get past their
    /// first byte.
    fn text(&mut self, alphabet: &[u8], max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len)
            .map(|_| {
                if self.below(16) == 0 {
                    self.next() as u8
                } else {
                    alphabet[self.below(alphabet.len())]
                }
            })
            .collect()
    }

    /// `seed` with a few bytes flipped, inserted, removed, or cut short.
    fn mutate(&mut self, seed: &[u8], alphabet: &[u8]) -> Vec<u8> {
        let mut out = seed.to_vec();
        for _ in 0..1 + self.below(4) {
            if out.is_empty() {
                out.push(alphabet[0]);
            }
            let at = self.below(out.len());
            match self.below(5) {
                0 => out[at] ^= 1 << self.below(8),
                1 | 2 => out.insert(at, alphabet[self.below(alphabet.len())]),
                3 => {
                    out.remove(at);
                }
                _ => out.truncate(at),
            }
        }
        out
    }
}

/// The first `lines` lines of a bundled file (mutations stay small).
fn head(rel: &str, lines: usize) -> Vec<u8> {
    let text = std::fs::read(testdata(rel)).unwrap();
    let end = text
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(lines)
        .map_or(text.len(), |(i, _)| i + 1);
    text[..end].to_vec()
}

fn pass(body: fn(&[u8]) -> Option<u64>, seeds: &[Vec<u8>], alphabet: &[u8], seed: u64) {
    let mut rng = Rng(seed);
    let (mut ok, mut failed) = (0, 0);
    let mut run = |input: &[u8]| match body(input) {
        Some(_) => ok += 1,
        None => failed += 1,
    };
    for s in seeds {
        for options in 0..16u8 {
            let mut input = vec![options];
            input.extend_from_slice(s);
            run(&input);
        }
    }
    for i in 0..600 {
        let mut input = vec![rng.next() as u8];
        if i % 3 == 0 {
            input.extend(rng.text(alphabet, 80));
        } else {
            let s = &seeds[rng.below(seeds.len())];
            input.extend(rng.mutate(s, alphabet));
        }
        run(&input);
    }
    // Both paths were reached: some inputs convert, some are refused.
    assert!(ok > 20 && failed > 20, "ok {ok}, failed {failed}");
}

#[test]
fn csv_converter_survives_random_and_mutated_tables() {
    let seeds = vec![
        head("tabular/penguins.csv", 6),
        head("tabular/seattle-weather.csv", 6),
        b"a,b\n1,\"x\ny\"\n2,\"\"\"\"\n".to_vec(),
        b"a,b\n1,\"never closed\n2,3\n".to_vec(),
        b"a;b\n1e39;9223372036854775808\n-0;NA\n".to_vec(),
        b"\xEF\xBB\xBFa\tb\r\n1\t2\r\n\r\n3\t\n".to_vec(),
        b"a,a\n1,2\n".to_vec(),
        b"a\n".to_vec(),
    ];
    pass(
        fuzzing::csv_converter,
        &seeds,
        b"ab,;\t|\"\n\r0123456789.eE-+NA ",
        0x5eed_c5f0,
    );
}

#[test]
fn json_converter_survives_random_and_mutated_records() {
    let seeds = vec![
        head("tabular/cars.json", 12),
        br#"{"a": 1, "b": {"c": [1, 2.5]}, "d": null, "e": true}
{"a": "x", "b": {"c": []}}
"#
        .to_vec(),
        br#"[{"a": 12345678901234567890}, {"a": 1e39}, {"a": -0.0}]"#.to_vec(),
        br#"{"s": "\ud800"}
{"s": "\ud83d\ude00", "a": 2}
{"a": 3,
"#
        .to_vec(),
        b"[]".to_vec(),
        br#"{"a": {"a": {"a": {"a": 1}}}, "a.a.a.a": 2}"#.to_vec(),
    ];
    pass(
        fuzzing::json_converter,
        &seeds,
        b"{}[]:,\"\\uabd80123456789.eE-+ truefalsenul\n",
        0x5eed_150f,
    );
}
