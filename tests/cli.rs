//! The `tfpipe` binary as a whole: exit codes, signals, closed pipes, flags
//! shared by every subcommand.

use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};

fn tfpipe_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tfpipe"))
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// SIGINT, SIGTERM and SIGHUP each stop a conversion with 128 + the signal,
/// say so, and leave no output. The input is a FIFO, so the signal arrives
/// while tfpipe waits for the first bytes, after its handlers are installed
/// (it opens the input after installing them, and opening the writing end
/// waits for that); the data follows the signal.
#[cfg(unix)]
#[test]
fn a_signal_stops_convert_with_128_plus_the_signal_and_leaves_nothing() {
    use std::io::{Read, Write};
    for (name, code) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("in.csv");
        let made = StdCommand::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let mut child = StdCommand::new(tfpipe_path())
            .args(["convert", "csv"])
            .arg(&fifo)
            .arg("--output")
            .arg(dir.path().join("p"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let killed = StdCommand::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(killed.success());
        // Only now the data: until it comes, tfpipe waits in its first read.
        writer.write_all(b"a,b\n1,2\n3,4\n").unwrap();
        drop(writer);
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(code), "SIG{name}: {status:?} {stderr}");
        assert!(
            stderr.contains(&format!("interrupted by SIG{name}")),
            "{stderr}"
        );
        assert_eq!(files_in(dir.path()), ["in.csv"], "SIG{name}: {stderr}");
    }
}

// ---------------------------------------------------------------------------
// Exit codes, closed pipes, destinations, sizes and flags, per subcommand.

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Out {
    let output = StdCommand::new(tfpipe_path())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Out {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .to_string_lossy()
        .into_owned()
}

fn s(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// `testdata/tabular/penguins.csv` converted into `dir` as one shard:
/// (schema file, the shard).
fn penguins(dir: &Path) -> (String, String) {
    let out = run(&[
        "convert",
        "csv",
        &repo("testdata/tabular/penguins.csv"),
        "--label",
        "species",
        "--shards",
        "1",
        "-o",
        &s(&dir.join("p")),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    (
        s(&dir.join("p.features.json")),
        s(&dir.join("p-00000-of-00001.tfrecord")),
    )
}

/// A checkpoint trained for one epoch on the penguins, in `dir/ck`.
fn checkpoint(dir: &Path) -> (String, String, String) {
    let (schema, data) = penguins(dir);
    let ck = s(&dir.join("ck"));
    let out = run(&[
        "train", "--schema", &schema, "--data", &data, "--impute", "mean", "--epochs", "1",
        "--save", &ck,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    (schema, data, ck)
}

/// A copy of `data` with one payload byte flipped in its 3rd record, so its
/// data CRC fails: bad data, with a location.
fn corrupt_copy(data: &str, to: &Path) -> String {
    let mut bytes = std::fs::read(data).unwrap();
    // Walk the framing: 8-byte length, 4-byte CRC, payload, 4-byte CRC.
    let mut at = 0;
    for _ in 0..2 {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        at += 12 + len + 4;
    }
    bytes[at + 12] ^= 0xff;
    std::fs::write(to, bytes).unwrap();
    s(to)
}

/// The golden Examples file, and a feature spec that parses it.
fn golden() -> (String, &'static str) {
    (repo("testdata/tf-golden/examples.tfrecord"), "id:int64")
}

/// Every subcommand that prints to stdout exits 0, without a panic, when
/// stdout is closed before it writes (`tfpipe bench ... | head -1`).
#[test]
fn every_subcommand_exits_0_on_a_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data, ck) = checkpoint(dir.path());
    let (examples, spec) = golden();
    let out = |name: &str| s(&dir.path().join(name));
    let commands: Vec<Vec<String>> = [
        vec!["cat", &examples],
        vec!["inspect", &examples],
        vec!["inspect", "--json", &examples],
        vec!["bench", "--data", &examples, "--feature", spec],
        vec!["bench", "--data", &examples, "--feature", spec, "--json"],
        vec!["bench", "--data", &examples, "--feature", spec, "--sweep"],
        vec![
            "convert",
            "csv",
            &repo("testdata/tabular/penguins.csv"),
            "-o",
            &out("q"),
        ],
        vec![
            "train", "--schema", &schema, "--data", &data, "--impute", "mean", "--epochs", "1",
        ],
        vec!["predict", "--checkpoint", &ck, "--data", &data],
        vec!["demo", "--epochs", "1", "--out", &out("demo")],
    ]
    .iter()
    .map(|args| args.iter().map(|a| a.to_string()).collect())
    .collect();
    for args in commands {
        let mut child = StdCommand::new(tfpipe_path())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reading end closes before the command writes anything.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A schema error stops `bench` at the first bad record: one error line,
/// with file, record and byte offset, no report, exit 1.
#[test]
fn bench_stops_at_the_first_error_and_says_where_once() {
    let (examples, _) = golden();
    let out = run(&[
        "bench",
        "--data",
        &examples,
        "--feature",
        "nosuch:int64",
        "--shuffle-buffer",
        "0",
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stdout.is_empty(),
        "a report after the error: {}",
        out.stdout
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    let line = lines[0];
    assert!(line.starts_with("tfpipe: "), "{line}");
    assert!(line.contains("examples.tfrecord"), "{line}");
    assert!(line.contains("record 0") && line.contains("byte"), "{line}");
    assert_eq!(line.matches("nosuch").count(), 1, "{line}");
}

/// Corrupt data is exit 1 with its location, for every command that reads
/// records; a file that cannot be read is exit 2.
#[test]
fn exit_codes_follow_the_readme() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data, ck) = checkpoint(dir.path());
    let bad = corrupt_copy(&data, &dir.path().join("bad.tfrecord"));
    let located = |out: &Out, what: &str| {
        assert_eq!(out.code, 1, "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("bad.tfrecord") && out.stderr.contains("record 2"),
            "{what}: {}",
            out.stderr
        );
        assert!(out.stderr.contains("byte"), "{what}: {}", out.stderr);
        assert_each_cause_once(&out.stderr);
    };
    let out = run(&[
        "train", "--schema", &schema, "--data", &bad, "--impute", "mean", "--epochs", "1",
    ]);
    located(&out, "train");
    let out = run(&["predict", "--checkpoint", &ck, "--data", &bad]);
    located(&out, "predict");
    // The two good records before the bad one share its batch: predicted
    // all the same (they were dropped with the batch).
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    let out = run(&[
        "bench",
        "--schema",
        &schema,
        "--data",
        &bad,
        "--shuffle-buffer",
        "0",
    ]);
    located(&out, "bench");

    // Not readable: a directory where a file should be.
    let unreadable = dir.path().join("dir.tfrecord");
    std::fs::create_dir(&unreadable).unwrap();
    let out = run(&["bench", "--schema", &schema, "--data", &s(&unreadable)]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("dir.tfrecord"), "{}", out.stderr);
    assert_each_cause_once(&out.stderr);
    let out = run(&["train", "--schema", &schema, "--data", &s(&unreadable)]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_each_cause_once(&out.stderr);
}

/// Fails when an error line prints a cause twice: a `: `-separated part
/// that repeats, whole, inside an earlier part (`stage parse: X: X`, or
/// `reading: bad CRC at 8: bad CRC at 8`). Errors keep the convention of
/// `tfpipe::error`, and the binary no longer removes repeats by substring.
fn assert_each_cause_once(stderr: &str) {
    for line in stderr.lines().filter(|l| l.starts_with("tfpipe")) {
        let parts: Vec<&str> = line.split(": ").collect();
        for (i, later) in parts.iter().enumerate().skip(1) {
            if later.len() < 12 {
                continue;
            }
            let before = parts[..i].join(": ");
            assert!(
                !before.contains(later),
                "{later:?} is printed twice in: {line}"
            );
        }
    }
}

/// `convert idx` on a damaged .gz: exit 1, with the file and an offset.
#[test]
fn convert_idx_with_a_corrupt_gzip_exits_1_with_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("t10k-images-idx3-ubyte.gz");
    let labels = dir.path().join("t10k-labels-idx1-ubyte.gz");
    let mut bytes = std::fs::read(repo("testdata/mnist/test-images-idx3-ubyte.gz")).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&images, bytes).unwrap();
    std::fs::copy(repo("testdata/mnist/test-labels-idx1-ubyte.gz"), &labels).unwrap();
    let out = run(&[
        "convert",
        "idx",
        &s(&images),
        "--labels",
        &s(&labels),
        "-o",
        &s(&dir.path().join("out/m")),
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("t10k-images-idx3-ubyte.gz"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("byte") || out.stderr.contains("offset"),
        "{}",
        out.stderr
    );
    assert_each_cause_once(&out.stderr);
    assert!(!dir.path().join("out/m.features.json").exists());
}

/// Every destination is checked before any work: a file where a directory
/// is needed, a directory where a file is needed, a directory that does not
/// exist. Each fails at once with exit 2, naming the flag, and writes nothing.
#[test]
fn destinations_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data, ck) = checkpoint(dir.path());
    let file = s(&dir.path().join("a-file"));
    std::fs::write(&file, "x").unwrap();
    let missing_dir = s(&dir.path().join("no/such/dir/out.json"));
    let is_dir = s(dir.path());
    let train = |flag: &str, value: &str| {
        run(&[
            "train", "--schema", &schema, "--data", &data, "--impute", "mean", "--epochs", "50",
            flag, value,
        ])
    };
    for (out, flag) in [
        (train("--save", &file), "--save"),
        (train("--logdir", &file), "--logdir"),
        (train("--report-json", &is_dir), "--report-json"),
        (train("--report-json", &missing_dir), "--report-json"),
        (
            run(&[
                "predict",
                "--checkpoint",
                &ck,
                "--data",
                &data,
                "--output",
                &is_dir,
            ]),
            "--output",
        ),
        (
            run(&[
                "predict",
                "--checkpoint",
                &ck,
                "--data",
                &data,
                "--output",
                &missing_dir,
            ]),
            "--output",
        ),
        (
            run(&[
                "predict",
                "--checkpoint",
                &ck,
                "--data",
                &data,
                "--report-json",
                &is_dir,
            ]),
            "--report-json",
        ),
        (
            run(&[
                "convert",
                "csv",
                &repo("testdata/tabular/penguins.csv"),
                "-o",
                &format!("{file}/p"),
            ]),
            "-o",
        ),
    ] {
        assert_eq!(out.code, 2, "{flag}: {}", out.stderr);
        assert!(out.stderr.contains(flag), "{flag}: {}", out.stderr);
        assert!(
            out.stdout.is_empty(),
            "{flag}: work was done: {}",
            out.stdout
        );
    }
    // A directory where convert's schema file must go is refused before any
    // work, not moved aside under a hidden name.
    let taken = dir.path().join("taken");
    std::fs::create_dir_all(taken.join("q.features.json")).unwrap();
    let out = run(&[
        "convert",
        "csv",
        &repo("testdata/tabular/penguins.csv"),
        "-o",
        &s(&taken.join("q")),
    ]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("is a directory"), "{}", out.stderr);
    let left: Vec<_> = std::fs::read_dir(&taken)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["q.features.json"], "work was done");
}

/// Sizes that cannot fit in memory are an error that says how much memory
/// they would need, never an abort.
#[test]
fn absurd_sizes_say_how_much_memory_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data, ck) = checkpoint(dir.path());
    let huge = dir.path().join("huge.features.json");
    std::fs::write(
        &huge,
        r#"{"format": "tfpipe-schema/1", "features": [{"name": "x", "dtype": "uint8", "shape": [1073741824]}, {"name": "species", "dtype": "int64"}], "label": "species"}"#,
    )
    .unwrap();
    let (examples, spec) = golden();
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--data", &examples, "--feature", spec];
        args.extend_from_slice(extra);
        run(&args)
    };
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train", "--schema", &schema, "--data", &data, "--impute", "mean",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    for (what, out) in [
        (
            "bench --batch-size",
            bench(&["--batch-size", "1000000000000"]),
        ),
        ("bench --prefetch", bench(&["--prefetch", "1e12"])),
        (
            "bench --shuffle-buffer",
            bench(&["--shuffle-buffer", "1e15"]),
        ),
        (
            "bench huge schema",
            run(&["bench", "--data", &data, "--schema", &s(&huge)]),
        ),
        (
            "train --batch-size",
            train(&["--batch-size", "1000000000000"]),
        ),
        ("train --prefetch", train(&["--prefetch", "1e12"])),
        ("train --hidden", train(&["--hidden", "100000000"])),
        ("train --classes", train(&["--classes", "1e12"])),
        (
            "train huge schema",
            run(&["train", "--schema", &s(&huge), "--data", &data]),
        ),
        (
            "predict --batch-size",
            run(&[
                "predict",
                "--checkpoint",
                &ck,
                "--data",
                &data,
                "--batch-size",
                "1e15",
            ]),
        ),
        (
            "bench-train --batch-size",
            run(&["bench-train", &data, "--batch-size", "1000000000000"]),
        ),
    ] {
        assert_eq!(out.code, 2, "{what}: {}", out.stderr);
        assert!(out.stderr.contains("memory"), "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("B of memory") || out.stderr.contains("bytes of memory"),
            "{what}: says no amount: {}",
            out.stderr
        );
        assert!(
            !out.stderr.contains("memory allocation of"),
            "{what}: {}",
            out.stderr
        );
    }
}

/// Counts that only make a command run forever are bounded too.
#[test]
fn absurd_counts_are_refused_before_any_loop() {
    let dir = tempfile::tempdir().unwrap();
    let (_, data, ck) = checkpoint(dir.path());
    let out = run(&[
        "predict",
        "--checkpoint",
        &ck,
        "--data",
        &data,
        "--warmup",
        "1000000000000",
    ]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--warmup"), "{}", out.stderr);
    assert!(out.stderr.contains("at most 1000000"), "{}", out.stderr);
    // 10^9 parse workers aborted on a 288 GB allocation.
    let (schema, data) = penguins(dir.path());
    for command in ["train", "bench"] {
        let out = run(&[
            command,
            "--schema",
            &schema,
            "--data",
            &data,
            "--num-parallel-calls",
            "1000000000",
        ]);
        assert_eq!(out.code, 2, "{}", out.stderr);
        assert!(out.stderr.contains("from 1 to 4096"), "{}", out.stderr);
    }
}

/// Negative numbers reach the flag's own check, which says what is wrong
/// (clap alone suggests `-- -3`).
#[test]
fn negative_numbers_get_a_message_about_the_number() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, data) = penguins(dir.path());
    let (examples, spec) = golden();
    for (args, needle) in [
        (
            vec![
                "train", "--schema", &schema, "--data", &data, "--impute", "mean", "--lr", "-0.1",
            ],
            "lr",
        ),
        (
            vec![
                "bench",
                "--data",
                &examples,
                "--feature",
                spec,
                "--batch-size",
                "-3",
            ],
            "--batch-size",
        ),
        (
            vec![
                "train", "--schema", &schema, "--data", &data, "--impute", "mean", "--epochs", "-1",
            ],
            "--epochs",
        ),
        (
            vec![
                "convert",
                "csv",
                &repo("testdata/tabular/penguins.csv"),
                "-o",
                &s(&dir.path().join("n")),
                "--shards",
                "-3",
            ],
            "--shards",
        ),
    ] {
        let out = run(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("'--'") && !out.stderr.contains("-- -"),
            "{args:?}: {}",
            out.stderr
        );
    }
}

/// `cat` and `inspect` expand quoted globs the way `--data` does.
#[test]
fn cat_and_inspect_take_quoted_globs_like_data() {
    let glob = repo("testdata/tf-golden/*.tfrecord");
    let out = run(&["inspect", &glob]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("total: 2 files, "), "{}", out.stdout);
    let out = run(&["cat", &glob]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let first = out.stdout.lines().next().unwrap_or_default();
    let examples = run(&["cat", &repo("testdata/tf-golden/examples.tfrecord")]);
    let sequences = run(&["cat", &repo("testdata/tf-golden/sequence.tfrecord")]);
    assert_eq!(out.stdout, examples.stdout + &sequences.stdout, "{first}");
    let out = run(&["cat", &repo("testdata/tf-golden/nothing-*.tfrecord")]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("nothing-*.tfrecord"), "{}", out.stderr);
}

/// `inspect` on MNIST shards suggests `image_raw:uint8:784`, and the specs
/// it prints, pasted, train.
#[test]
fn inspect_suggests_raw_pixels_and_its_specs_train() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "convert",
        "idx",
        &repo("testdata/mnist/test-images-idx3-ubyte.gz"),
        "--labels",
        &repo("testdata/mnist/test-labels-idx1-ubyte.gz"),
        "--shards",
        "1",
        "-o",
        &s(&dir.path().join("m")),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let data = s(&dir.path().join("m-00000-of-00001.tfrecord"));
    let out = run(&["inspect", &data]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("--feature image_raw:uint8:784 ")
            && out.stdout.contains("(as strings: image_raw:bytes)"),
        "{}",
        out.stdout
    );
    let specs: Vec<String> = out
        .stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("--feature "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(specs.len(), 2, "{}", out.stdout);
    let mut args = vec![
        "train", "--data", &data, "--label", "label", "--epochs", "1",
    ];
    for spec in &specs {
        args.extend(["--feature", spec]);
    }
    let out = run(&args);
    assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
    // On these plain pixels --image-size is how the CNN reads the values
    // (any HxW of 784); another count is refused with the flags to fix it.
    let cnn = |size: &str| {
        let mut cnn = vec![
            "train", "--data", &data, "--label", "label", "--model", "cnn",
        ];
        cnn.extend(["--steps", "2", "--image-size", size]);
        for spec in &specs {
            cnn.extend(["--feature", spec]);
        }
        run(&cnn)
    };
    let out = cnn("14x56");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("cnn lenet 1x14x56-10"),
        "{}",
        out.stdout
    );
    let out = cnn("20x20x1");
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("takes 400 input values per example; the features give 784")
            && out.stderr.contains("--image-size HxWxC"),
        "{}",
        out.stderr
    );
}

/// Checkpoints, predictions and reports get the mode a plain
/// `File::create` gives (0666 less the umask), like the shards.
#[cfg(unix)]
#[test]
fn outputs_follow_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (_, data, ck) = checkpoint(dir.path());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let plain = dir.path().join("plain");
    std::fs::File::create(&plain).unwrap();
    let out = run(&[
        "predict",
        "--checkpoint",
        &ck,
        "--data",
        &data,
        "--output",
        &s(&dir.path().join("pred.jsonl")),
        "--report-json",
        &s(&dir.path().join("report.json")),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for file in [
        Path::new(&ck).join("model.safetensors"),
        Path::new(&ck).join("optimizer.safetensors"),
        Path::new(&ck).join("checkpoint.json"),
        dir.path().join("pred.jsonl"),
        dir.path().join("report.json"),
        PathBuf::from(&data),
    ] {
        assert_eq!(mode(&file), mode(&plain), "{}", file.display());
    }
}

/// `inspect` on TFRecords of encoded images written by TensorFlow (TFDS's
/// `image`/`label` layout with PNG digits, and ImageNet's `image/encoded`
/// with JPEGs of several sizes) suggests image specs, and the pasted specs
/// train the CNN (asked for by name, and chosen by the data), at the
/// spec's size or at `--image-size`'s.
#[test]
fn inspect_suggests_image_specs_that_train() {
    let digits = repo("testdata/images/digits-tfds.tfrecord");
    let out = run(&["inspect", &digits]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("--feature image:image:28x28x1 ")
            && out
                .stdout
                .contains("(encoded images; as bytes: image:bytes)"),
        "{}",
        out.stdout
    );
    let photos = repo("testdata/images/photos-imagenet.tfrecord");
    let out = run(&["inspect", &photos]);
    assert!(
        out.stdout
            .contains("--feature image/encoded:image:224x224x3:center "),
        "{}",
        out.stdout
    );
    let out = run(&[
        "train",
        "--data",
        &digits,
        "--feature",
        "image:image:28x28x1",
        "--feature",
        "label:int64",
        "--label",
        "label",
        "--model",
        "cnn",
        "--epochs",
        "1",
        "--batch-size",
        "32",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // JPEGs in ImageNet's layout, written by TensorFlow: the decoded RGB
    // image chooses the CNN at its size.
    let photo_args = [
        "train",
        "--data",
        &photos,
        "--feature",
        "image/encoded:image:16x16x3:center,area",
        "--feature",
        "image/class/label:int64",
        "--label",
        "image/class/label",
        "--epochs",
        "1",
    ];
    let out = run(&photo_args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "model cnn lenet 3x16x16-3 because \"image/encoded\" is an image decoded at 16x16x3"
        ),
        "{}",
        out.stderr
    );
    // --image-size decodes at another size (and channel count), for the CNN too.
    let out = run(&[&photo_args[..], &["--image-size", "12x20x1"]].concat());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("model cnn lenet 1x12x20-3 because"),
        "{}",
        out.stderr
    );
    // Too small for the CNN: refused before any work, with the flag to fix it.
    let out = run(&[&photo_args[..], &["--image-size", "8x8"]].concat());
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("at least 12x12") && out.stderr.contains("--image-size"),
        "{}",
        out.stderr
    );
}

/// The README's feature list names every cargo feature (`serve` was
/// missing from it).
#[test]
fn the_readme_names_every_cargo_feature() {
    let root = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let listed = readme
        .split("- **Cargo features:**")
        .nth(1)
        .and_then(|rest| rest.split("\n- ").next())
        .expect("the README's feature list");
    let table = manifest.split("\n[features]\n").nth(1).unwrap();
    let table = table.split("\n[").next().unwrap();
    let names: Vec<&str> = table
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(" = ").map(|(name, _)| name.trim()))
        .filter(|name| *name != "default")
        .collect();
    assert!(names.contains(&"serve"), "{names:?}");
    for name in names {
        assert!(
            listed.contains(&format!("`{name}`")),
            "{name} is not in: {listed}"
        );
    }
}

/// The issue's path: a folder of PNG digits through `convert images`
/// (default layout) then `train --schema` decodes the images and trains the
/// CNN, never the image's height and width.
#[test]
fn converted_image_folders_train_from_their_schema() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("digits");
    let digit = std::fs::read(repo("testdata/images/digit.png")).unwrap();
    for class in ["five", "zero"] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..8 {
            std::fs::write(root.join(class).join(format!("{i}.png")), &digit).unwrap();
        }
    }
    let convert = |prefix: &str, more: &[&str]| {
        let out = s(&dir.path().join(prefix));
        let args = ["convert", "images", &s(&root), "-o", &out, "--shards", "1"];
        let out = run(&[&args[..], more].concat());
        assert_eq!(out.code, 0, "{}", out.stderr);
    };
    convert("img", &[]);
    let schema = s(&dir.path().join("img.features.json"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema).unwrap()).unwrap();
    assert_eq!(json["features"][0]["dtype"], "image", "{json}");
    assert_eq!(
        json["features"][0]["shape"],
        serde_json::json!([28, 28, 1]),
        "{json}"
    );
    // No --model: the schema's image chooses the CNN, and says so.
    let train = |schema: &str, shards: &str| {
        let data = s(&dir.path().join(shards));
        let out = run(&[
            "train", "--schema", schema, "--data", &data, "--epochs", "1",
        ]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert!(
            out.stderr.contains("model cnn lenet 1x28x28-2 because"),
            "{}",
            out.stderr
        );
        out
    };
    train(&schema, "img-*");

    // The ImageNet layout marks `image/encoded` too; its height and width
    // are the image's metadata, skipped with a reason, and the CNN trains.
    convert("inet", &["--layout", "imagenet"]);
    let out = train(&s(&dir.path().join("inet.features.json")), "inet-*");
    assert!(
        out.stdout
            .contains("image/height (an image's size, beside the image)"),
        "{}",
        out.stdout
    );
}
