//! CSV with a header row to Examples: one feature per column.
//!
//! Two passes over the input (read into memory, never mapped: see
//! `output::Input`), both parallel over chunks of
//! whole rows: the first validates rows and infers each column's type over the
//! whole input, the second parses and encodes. Chunks are cut at line ends;
//! when the file contains quotes, a sequential scan with the CSV parser finds
//! the row boundaries instead, so a quoted field with a newline never gets cut.
//!
//! A bad row (wrong number of fields, a value that does not fit a declared
//! `--column` type, a missing label) is judged identically in both passes, so
//! `--skip-bad-rows` skips exactly the rows the first pass counted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use csv::{ByteRecord, ReaderBuilder};

use super::driver::{Scanned, Source};
use super::encode::ExampleEncoder;
use super::error::{ConvertError, ConvertOption, SourceLocation, quote};
use super::infer::{self, Column, Kind, classify, fits, parse_f32, parse_i64, trim};
use super::output::{BadRows, Chunk, Ctx, Input};
use super::{FixedSchema, Missing, Phase};
use crate::example::DType;

/// Options of the CSV converter.
#[derive(Debug, Clone)]
pub struct CsvOptions {
    /// The field delimiter. By default `,`.
    pub delimiter: u8,
    /// Column types that override inference (`--column NAME:DTYPE`).
    pub columns: Vec<(String, DType)>,
    /// Values meaning "missing" besides the empty string and `NA` (`--na`).
    pub na: Vec<String>,
    /// The label column (`--label`).
    pub label: Option<String>,
    /// What a column with missing values becomes in the schema.
    /// By default [`Missing::Default`].
    pub missing: Missing,
    /// Convert with this schema instead of inferring one (`--schema`): the
    /// same types, defaults and label vocabulary, so several conversions
    /// (splits, workers) agree. By default `None`.
    pub schema: Option<FixedSchema>,
    /// Where the column names come from. By default the first row
    /// ([`Header::FirstRow`]).
    pub header: Header,
}

/// How the warning about a header row that looks like data begins (a front
/// end may add how its users choose [`Header::None`] or [`Header::Names`]).
pub const HEADER_LOOKS_LIKE_DATA: &str = "the header row looks like data";

/// Where a CSV file's column names come from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Header {
    /// The first row holds them (the usual CSV). A first row that looks like
    /// data (numbers in columns of numbers) gets a warning.
    #[default]
    FirstRow,
    /// There is no header row: every row is data, and the columns are named
    /// `column_1`, `column_2`, ... (`--no-header`).
    None,
    /// There is no header row, and these are the names, one per column
    /// (`--names`).
    Names(Vec<String>),
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            delimiter: b',',
            columns: Vec::new(),
            na: Vec::new(),
            label: None,
            missing: Missing::Default,
            schema: None,
            header: Header::FirstRow,
        }
    }
}

impl CsvOptions {
    /// Parses `--column NAME:DTYPE` texts into `columns`.
    pub fn with_column_texts<S: AsRef<str>>(mut self, texts: &[S]) -> Result<Self, ConvertError> {
        for t in texts {
            self.columns.push(infer::parse_override(t.as_ref())?);
        }
        Ok(self)
    }
}

/// Target size of one chunk of rows.
const CHUNK_BYTES: usize = 1 << 20;

struct File {
    path: PathBuf,
    data: Input,
    /// Offset of the first data row (after the header).
    data_start: usize,
    /// Line number of the first data row.
    first_line: u64,
    /// Whether the data rows contain a quote anywhere (found once here, so
    /// the chunks of a file without any skip their own search in both passes).
    quoted: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Task {
    file: usize,
    start: usize,
    end: usize,
    /// The line of the first row (found by the scan, for the encoder's errors).
    line_base: u64,
}

/// What the converter knows about the columns while it reads rows.
#[derive(Debug, Default)]
struct Shape {
    names: Vec<String>,
    declared: Vec<Option<DType>>,
    label: Option<usize>,
    na: Vec<Vec<u8>>,
    delimiter: u8,
    /// The label vocabulary of a fixed schema: other labels are bad rows.
    vocab: Option<Vec<Vec<u8>>>,
    /// Columns a fixed schema gives no default: a missing value is a bad row.
    required: Vec<bool>,
    /// The columns `check` looks at: declared ones and the label.
    checked: Vec<usize>,
}

impl Shape {
    #[inline]
    fn is_missing(&self, value: &[u8]) -> bool {
        value.is_empty() || value == b"NA" || self.na.iter().any(|na| na.as_slice() == value)
    }

    /// Judges a row; the same verdict in both passes. `Err` carries the
    /// field index (or none for a ragged row) and the problem.
    fn check(&self, row: &Row<'_>) -> Result<(), (Option<usize>, String)> {
        if row.len() != self.names.len() {
            let shown = (0..row.len().min(3))
                .map(|i| quote(row.get(i)))
                .collect::<Vec<_>>()
                .join(", ");
            return Err((
                None,
                format!(
                    "ragged row: expected {} fields (as the header), found {} (row starts {shown}{})",
                    self.names.len(),
                    row.len(),
                    if row.len() > 3 { ", ..." } else { "" }
                ),
            ));
        }
        // Only declared columns and the label can make a row bad.
        for &i in &self.checked {
            let raw = row.get(i);
            let value = trim(raw);
            if self.is_missing(value) {
                if Some(i) == self.label {
                    return Err((
                        Some(i),
                        format!(
                            "the label column is missing ({}): every row needs a label",
                            quote(raw)
                        ),
                    ));
                }
                if self.required[i] {
                    return Err((
                        Some(i),
                        format!(
                            "the value is missing ({}), and the schema gives column {:?} no default",
                            quote(raw),
                            self.names[i]
                        ),
                    ));
                }
                continue;
            }
            if Some(i) == self.label
                && let Some(vocab) = self.vocab.as_deref()
                && vocab.binary_search_by(|v| v.as_slice().cmp(value)).is_err()
            {
                return Err((
                    Some(i),
                    format!(
                        "label {} is not in the schema's vocabulary of {} classes",
                        quote(raw),
                        vocab.len()
                    ),
                ));
            }
            if let Some(dtype) = &self.declared[i]
                && !fits(classify(value), *dtype)
            {
                let example = match dtype {
                    DType::Int64 => "an integer like 42",
                    _ => "a number like 3.25",
                };
                return Err((
                    Some(i),
                    format!(
                        "{} is not {} (the column is declared {}; expected {example}, or a missing value: empty or NA)",
                        quote(raw),
                        infer::dtype_name(*dtype),
                        infer::dtype_name(*dtype),
                    ),
                ));
            }
            if self.declared[i] == Some(DType::Float32) && infer::beyond_f32(value) {
                return Err((Some(i), infer::beyond_f32_problem(raw)));
            }
        }
        Ok(())
    }

    fn bad_row(
        &self,
        path: &Path,
        line: u64,
        byte: u64,
        field: Option<usize>,
        problem: String,
    ) -> ConvertError {
        ConvertError::BadRow {
            location: SourceLocation {
                path: path.to_path_buf(),
                line: Some(line),
                column: field.map(|f| f as u64 + 1),
                field: field.map(|f| self.names[f].clone()),
                byte,
            },
            problem,
        }
    }
}

fn reader(delimiter: u8, data: &[u8]) -> csv::Reader<&[u8]> {
    ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(data)
}

/// Reads the column names: the header row's, or those `given` (then the
/// data starts at the first row). Returns the names, the data's first byte
/// and line.
fn header(
    path: &Path,
    data: &[u8],
    delimiter: u8,
    given: &Header,
) -> Result<(Vec<String>, usize, u64), ConvertError> {
    let bom = if data.starts_with(b"\xEF\xBB\xBF") {
        3
    } else {
        0
    };
    let names = match given {
        Header::FirstRow => return header_row(path, data, delimiter, bom),
        Header::Names(names) => names.clone(),
        Header::None => {
            let mut rdr = reader(delimiter, &data[bom..]);
            let mut record = ByteRecord::new();
            let fields = match rdr.read_byte_record(&mut record) {
                Ok(true) => record.len(),
                _ => 0,
            };
            (1..=fields).map(|i| format!("column_{i}")).collect()
        }
    };
    if let Some(name) = duplicate(&names) {
        return Err(ConvertError::options(
            ConvertOption::Names,
            format!("duplicate column name {name:?} in the names given"),
        ));
    }
    Ok((names, bom, 1))
}

/// A warning when the header row looks like a data row: some of its names
/// are numbers, each in a column whose values are numbers (sklearn's
/// `iris.csv` starts `150,4,setosa,...`, and a headerless file's first row
/// would become the names).
fn header_looks_like_data(names: &[String], kinds: &[Kind]) -> Option<String> {
    let numeric: Vec<&String> = names
        .iter()
        .zip(kinds)
        .filter(|(name, _)| name.trim().parse::<f64>().is_ok())
        .filter(|(_, kind)| matches!(kind, Kind::Int | Kind::Float | Kind::BigInt))
        .map(|(name, _)| name)
        .collect();
    let all_numbers_in_number_columns = names
        .iter()
        .zip(kinds)
        .filter(|(name, _)| name.trim().parse::<f64>().is_ok())
        .count()
        == numeric.len();
    (!numeric.is_empty() && all_numbers_in_number_columns).then(|| {
        format!(
            "{HEADER_LOOKS_LIKE_DATA} (column names {numeric:?} are numbers, in columns of numbers): if the file has no header row, convert it as headerless (with no names, or with the names given)"
        )
    })
}

/// The first name that appears twice.
fn duplicate(names: &[String]) -> Option<&String> {
    names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
        .map(|(_, n)| n)
}

/// Reads the header row: the names and where the data starts.
fn header_row(
    path: &Path,
    data: &[u8],
    delimiter: u8,
    bom: usize,
) -> Result<(Vec<String>, usize, u64), ConvertError> {
    let mut rdr = reader(delimiter, &data[bom..]);
    let mut record = ByteRecord::new();
    let has = rdr
        .read_byte_record(&mut record)
        .map_err(|e| ConvertError::BadInput {
            location: SourceLocation::in_text(path, data, bom),
            problem: format!("cannot read the header row: {e}"),
        })?;
    if !has {
        return Err(ConvertError::BadInput {
            location: SourceLocation::in_text(path, data, 0),
            problem: "empty file: expected a header row with the column names".into(),
        });
    }
    let mut names = Vec::with_capacity(record.len());
    for (i, raw) in record.iter().enumerate() {
        let name = std::str::from_utf8(raw).map_err(|_| ConvertError::BadInput {
            location: SourceLocation::in_text(path, data, bom),
            problem: format!("header field {} {} is not UTF-8", i + 1, quote(raw)),
        })?;
        if names.iter().any(|n: &String| n == name) {
            return Err(ConvertError::BadInput {
                location: SourceLocation::in_text(path, data, bom),
                problem: format!("duplicate column name {name:?} in the header"),
            });
        }
        names.push(name.to_string());
    }
    let start = bom + rdr.position().byte() as usize;
    let first_line = rdr.position().line();
    Ok((names, start, first_line))
}

/// Where a quoted field opens that is still open at the end of `data`, read
/// from `start` (a row start) as the `csv` crate reads it: a quote opens a
/// field only at the field's start, `""` inside is an escaped quote, and a
/// quote in the middle of an unquoted field is an ordinary byte.
fn unclosed_quote(data: &[u8], start: usize, delimiter: u8) -> Option<usize> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        FieldStart,
        Unquoted,
        Quoted,
        QuoteInQuoted,
    }
    let mut state = State::FieldStart;
    let mut opened = 0;
    for (i, &b) in data.iter().enumerate().skip(start) {
        state = match state {
            State::FieldStart | State::Unquoted if b == delimiter || b == b'\n' || b == b'\r' => {
                State::FieldStart
            }
            State::FieldStart if b == b'"' => {
                opened = i;
                State::Quoted
            }
            State::FieldStart | State::Unquoted => State::Unquoted,
            State::Quoted if b == b'"' => State::QuoteInQuoted,
            State::Quoted => State::Quoted,
            State::QuoteInQuoted if b == b'"' => State::Quoted,
            State::QuoteInQuoted if b == delimiter || b == b'\n' || b == b'\r' => State::FieldStart,
            State::QuoteInQuoted => State::Unquoted,
        };
    }
    (state == State::Quoted).then_some(opened)
}

/// Cuts `data[start..]` into chunks of whole rows.
fn cut(data: &[u8], start: usize, delimiter: u8, quoted: bool) -> Vec<(usize, usize)> {
    let end = data.len();
    let mut cuts = Vec::new();
    if start >= end {
        return cuts;
    }
    let chunk = (end - start).div_ceil(64).clamp(64 << 10, CHUNK_BYTES);
    if !quoted {
        let mut from = start;
        while from < end {
            let target = from + chunk;
            let to = if target >= end {
                end
            } else {
                match data[target..].iter().position(|&b| b == b'\n') {
                    Some(i) => target + i + 1,
                    None => end,
                }
            };
            cuts.push((from, to));
            from = to;
        }
    } else {
        // Quotes may hide newlines inside fields: let the parser find rows.
        let mut rdr = reader(delimiter, &data[start..]);
        let mut record = ByteRecord::new();
        let mut from = start;
        loop {
            let pos = start + rdr.position().byte() as usize;
            if pos >= from + chunk {
                cuts.push((from, pos));
                from = pos;
            }
            match rdr.read_byte_record(&mut record) {
                Ok(true) => {}
                // The byte-record reader only fails on I/O, impossible on a slice.
                Ok(false) | Err(_) => break,
            }
        }
        if from < end {
            cuts.push((from, end));
        }
    }
    cuts
}

struct Scan {
    rows: u64,
    newlines: u64,
    kinds: Vec<Kind>,
    present: Vec<u64>,
    missing: Vec<u64>,
    labels: BTreeSet<Vec<u8>>,
    bad: BadRows,
    bytes: u64,
    /// Per column, the first number beyond float32's range: an error if the
    /// column turns out float32 (lines chunk-relative).
    beyond_f32: Vec<Option<ConvertError>>,
    /// Per column, the first integer beyond int64 (kept as text), for the warning.
    big_int: Vec<Option<ConvertError>>,
}

/// The CSV converter as a [`Source`]: the scan is the first pass
/// (validate, count, infer), the encoding the second.
pub(crate) struct CsvSource<'a> {
    inputs: &'a [PathBuf],
    options: &'a CsvOptions,
    files: Vec<File>,
    shape: Shape,
    columns: Vec<Column>,
    /// Column indices in key order (Examples are written with sorted keys).
    order: Vec<usize>,
    /// Whether the scan found bad rows (then the encoder judges every row).
    any_bad: bool,
}

impl<'a> CsvSource<'a> {
    pub(crate) fn new(inputs: &'a [PathBuf], options: &'a CsvOptions) -> Self {
        CsvSource {
            inputs,
            options,
            files: Vec::new(),
            shape: Shape::default(),
            columns: Vec::new(),
            order: Vec::new(),
            any_bad: false,
        }
    }
}

impl Source for CsvSource<'_> {
    type Task = Task;

    fn scan(&mut self, ctx: &Ctx<'_>) -> Result<Scanned<Task>, ConvertError> {
        let (inputs, options) = (self.inputs, self.options);
        scan_all(inputs, options, ctx, self)
    }

    fn encode(&self, task: Task) -> Result<Chunk, ConvertError> {
        encode(
            &self.files[task.file],
            &task,
            &self.shape,
            &self.columns,
            &self.order,
            self.any_bad,
        )
    }

    fn locate(&self, task: &Task) -> SourceLocation {
        let file = &self.files[task.file];
        SourceLocation::in_text(&file.path, &file.data, task.start)
    }
}

/// The first pass: reads the headers, judges every row, infers the types;
/// leaves in `out` what the encoder needs.
fn scan_all(
    inputs: &[PathBuf],
    options: &CsvOptions,
    ctx: &Ctx<'_>,
    out: &mut CsvSource<'_>,
) -> Result<Scanned<Task>, ConvertError> {
    let d = options.delimiter;
    let mut files = Vec::with_capacity(inputs.len());
    let mut names: Option<Vec<String>> = None;
    for path in inputs {
        let data = Input::load(path)?;
        let (header_names, data_start, first_line) = header(path, &data, d, &options.header)?;
        match &names {
            None => names = Some(header_names),
            Some(first) if *first != header_names => {
                return Err(ConvertError::BadInput {
                    location: SourceLocation::in_text(path, &data, 0),
                    problem: format!(
                        "the header {header_names:?} differs from the first file's {first:?}"
                    ),
                });
            }
            Some(_) => {}
        }
        let quoted = memchr::memchr(b'"', data.get(data_start..).unwrap_or_default()).is_some();
        if quoted && let Some(open) = unclosed_quote(&data, data_start, d) {
            return Err(ConvertError::BadInput {
                location: SourceLocation::in_text(path, &data, open),
                problem: "this quoted field is never closed: the quote runs to the end of the file"
                    .into(),
            });
        }
        files.push(File {
            path: path.clone(),
            data,
            data_start,
            first_line,
            quoted,
        });
    }
    let names = names.unwrap_or_default();
    let find = |name: &str, flag: &str| {
        names.iter().position(|n| n == name).ok_or_else(|| {
            ConvertError::options(
                ConvertOption::Columns,
                format!("{flag} {name:?}: no such column (the header has {names:?})"),
            )
        })
    };
    let mut declared = vec![None; names.len()];
    for (name, dtype) in &options.columns {
        declared[find(name, "column type for")?] = Some(*dtype);
    }
    let label_name = match &options.schema {
        Some(fixed) => fixed.label_for(options.label.as_deref())?,
        None => options.label.clone(),
    };
    let label = label_name
        .as_deref()
        .map(|l| find(l, "label column"))
        .transpose()?;
    // With a fixed schema: every column's type, whether it may be missing,
    // and the label vocabulary come from it.
    let mut required = vec![false; names.len()];
    let fixed_vocab: Option<Vec<Vec<u8>>> = match &options.schema {
        None => None,
        Some(fixed) => {
            fixed.check_columns(&names)?;
            for (c, name) in names.iter().enumerate() {
                let (dtype, may_miss) = fixed.column(name)?;
                required[c] = !may_miss;
                if Some(c) != label || fixed.vocabulary.is_none() {
                    declared[c] = Some(dtype);
                }
            }
            fixed
                .vocabulary
                .as_ref()
                .map(|v| v.iter().map(|s| s.as_bytes().to_vec()).collect())
        }
    };
    let na: Vec<Vec<u8>> = options.na.iter().map(|s| s.as_bytes().to_vec()).collect();
    let shape = Shape {
        checked: (0..names.len())
            .filter(|&i| declared[i].is_some() || Some(i) == label || required[i])
            .collect(),
        names: names.clone(),
        declared: declared.clone(),
        label,
        na,
        delimiter: d,
        vocab: fixed_vocab.clone(),
        required,
    };

    let mut tasks = Vec::new();
    for (i, f) in files.iter().enumerate() {
        for (start, end) in cut(&f.data, f.data_start, d, f.quoted) {
            tasks.push(Task {
                file: i,
                start,
                end,
                line_base: 0,
            });
        }
    }
    let bytes_total: u64 = files.iter().map(|f| f.data.len() as u64).sum();
    let skip = ctx.options.skip_bad_rows;

    // Pass 1: validate, count, infer.
    ctx.begin_phase(Phase::Scanning, bytes_total);
    let ncols = names.len();
    let mut kinds = vec![Kind::Empty; ncols];
    let mut present = vec![0u64; ncols];
    let mut missing = vec![0u64; ncols];
    let mut labels = BTreeSet::new();
    let mut rows = 0u64;
    let mut bad = BadRows::default();
    let mut line_base: Vec<u64> = Vec::with_capacity(tasks.len());
    let mut beyond_f32: Vec<Option<ConvertError>> = (0..ncols).map(|_| None).collect();
    let mut big_int: Vec<Option<ConvertError>> = (0..ncols).map(|_| None).collect();
    {
        let mut current_file = usize::MAX;
        let mut line = 0;
        let task_files: Vec<usize> = tasks.iter().map(|t| t.file).collect();
        let mut index = 0;
        let scan_tasks: Vec<&Task> = tasks.iter().collect();
        ctx.run_ordered(
            scan_tasks,
            |task| scan(&files[task.file], task, &shape, skip),
            |task| {
                SourceLocation::in_text(&files[task.file].path, &files[task.file].data, task.start)
            },
            |mut s: Scan| {
                let file = task_files[index];
                index += 1;
                if file != current_file {
                    current_file = file;
                    line = files[file].first_line;
                }
                line_base.push(line);
                let firsts = s
                    .beyond_f32
                    .iter_mut()
                    .chain(s.big_int.iter_mut())
                    .flatten();
                for e in s.bad.kept.iter_mut().chain(firsts) {
                    if let ConvertError::BadRow { location, .. } = e {
                        location.line = location.line.map(|rel| line + rel - 1);
                    }
                }
                for c in 0..ncols {
                    if beyond_f32[c].is_none() {
                        beyond_f32[c] = s.beyond_f32[c].take();
                    }
                    if big_int[c].is_none() {
                        big_int[c] = s.big_int[c].take();
                    }
                }
                line += s.newlines;
                rows += s.rows;
                bad.merge(s.bad);
                for c in 0..ncols {
                    kinds[c] = kinds[c].join(s.kinds[c]);
                    present[c] += s.present[c];
                    missing[c] += s.missing[c];
                }
                for value in std::mem::take(&mut s.labels) {
                    infer::note_label(&mut labels, &value);
                }
                ctx.advance(Phase::Scanning, bytes_total, s.bytes, s.rows);
                Ok(())
            },
        )
        .map_err(|e| fix_first_error(e, &files, &tasks))?;
    }
    let mut columns = Vec::with_capacity(ncols);
    let mut warnings = Vec::new();
    if options.header == Header::FirstRow
        && let Some(warning) = header_looks_like_data(&names, &kinds)
    {
        warnings.push(warning);
    }
    for c in 0..ncols {
        let dtype = declared[c].unwrap_or(kinds[c].dtype());
        if dtype == DType::Float32
            && let Some(e) = beyond_f32[c].take()
        {
            // Not a bad row that --skip-bad-rows may skip: the first pass
            // could not know the column's type yet, so it counted the row.
            return Err(e);
        }
        if kinds[c] == Kind::BigInt
            && dtype == DType::Bytes
            && let Some(e) = big_int[c].take()
        {
            warnings.push(format!(
                "column {:?} holds integers beyond int64, kept exactly as text (bytes): first at {}",
                names[c],
                e.location().map(|l| l.to_string()).unwrap_or_default()
            ));
        }
        let vocab = if Some(c) == label && fixed_vocab.is_some() {
            fixed_vocab.clone()
        } else if Some(c) == label && dtype == DType::Bytes {
            Some(infer::label_vocabulary(
                &names[c],
                std::mem::take(&mut labels),
            )?)
        } else {
            None
        };
        columns.push(Column {
            name: names[c].clone(),
            dtype,
            list: false,
            present: present[c],
            missing: missing[c],
            vocab,
        });
    }

    let mut order: Vec<usize> = (0..ncols).collect();
    order.sort_by(|&a, &b| names[a].as_bytes().cmp(names[b].as_bytes()));
    for (task, base) in tasks.iter_mut().zip(line_base) {
        task.line_base = base;
    }
    let done = infer::TabularDone {
        format: "csv",
        columns: &columns,
        label: label_name.as_deref(),
        missing: options.missing,
        inputs,
        bytes_in: bytes_total,
        bad,
        warnings,
        fixed: options.schema.as_ref().map(|f| &f.schema),
    };
    let done = done.finished();
    out.any_bad = done.rows_skipped > 0;
    out.files = files;
    out.shape = shape;
    out.columns = columns;
    out.order = order;
    Ok(Scanned {
        records: rows,
        tasks,
        done,
    })
}

/// A bad row that stopped the first pass carries a chunk-relative line:
/// make it absolute (rare, so counting the lines here is fine).
fn fix_first_error(e: ConvertError, files: &[File], tasks: &[Task]) -> ConvertError {
    match e {
        ConvertError::BadRow {
            mut location,
            problem,
        } => {
            if let Some(task) = tasks.iter().find(|t| {
                files[t.file].path == location.path
                    && (t.start as u64) <= location.byte
                    && location.byte < t.end as u64
            }) {
                let data = &files[task.file].data;
                let before = data[..task.start].iter().filter(|&&b| b == b'\n').count() as u64;
                location.line = location.line.map(|rel| before + rel);
            }
            ConvertError::BadRow { location, problem }
        }
        other => other,
    }
}

fn scan(file: &File, task: &Task, shape: &Shape, skip: bool) -> Result<Scan, ConvertError> {
    let n = shape.names.len();
    let data = &file.data[task.start..task.end];
    let mut s = Scan {
        rows: 0,
        newlines: memchr::memchr_iter(b'\n', data).count() as u64,
        kinds: vec![Kind::Empty; n],
        present: vec![0; n],
        missing: vec![0; n],
        labels: BTreeSet::new(),
        bad: BadRows::default(),
        bytes: data.len() as u64,
        beyond_f32: (0..n).map(|_| None).collect(),
        big_int: (0..n).map(|_| None).collect(),
    };
    let mut rows = Rows::with_quotes(data, shape.delimiter, file.quoted);
    while let Some((row, start, line)) = rows.next_row() {
        if let Err((field, problem)) = shape.check(&row) {
            // Lines are chunk-relative here; the caller makes them absolute.
            let at = field.and_then(|f| row.offset(f)).unwrap_or(start);
            let e = shape.bad_row(&file.path, line, (task.start + at) as u64, field, problem);
            if !skip {
                return Err(e);
            }
            if s.bad.kept.len() < super::output::BAD_ROWS_KEPT {
                s.bad.push(e);
            } else {
                s.bad.count += 1;
            }
            continue;
        }
        s.rows += 1;
        for c in 0..n {
            let value = trim(row.get(c));
            if shape.is_missing(value) {
                s.missing[c] += 1;
                continue;
            }
            s.present[c] += 1;
            if Some(c) == shape.label {
                infer::note_label(&mut s.labels, value);
            }
            if shape.declared[c].is_none() && s.kinds[c] != Kind::Text {
                let kind = classify(value);
                s.kinds[c] = s.kinds[c].join(kind);
                let first = match kind {
                    Kind::Float if s.beyond_f32[c].is_none() && infer::beyond_f32(value) => {
                        Some((&mut s.beyond_f32[c], infer::beyond_f32_problem(value)))
                    }
                    Kind::BigInt if s.big_int[c].is_none() => Some((
                        &mut s.big_int[c],
                        format!("{} is beyond int64", quote(value)),
                    )),
                    _ => None,
                };
                if let Some((slot, problem)) = first {
                    let at = row.offset(c).unwrap_or(start);
                    *slot = Some(shape.bad_row(
                        &file.path,
                        line,
                        (task.start + at) as u64,
                        Some(c),
                        problem,
                    ));
                }
            }
        }
    }
    Ok(s)
}

fn encode(
    file: &File,
    task: &Task,
    shape: &Shape,
    columns: &[Column],
    order: &[usize],
    any_bad: bool,
) -> Result<Chunk, ConvertError> {
    let data = &file.data[task.start..task.end];
    let mut chunk = Chunk {
        bytes_in: data.len() as u64,
        ..Chunk::default()
    };
    let mut rows = Rows::with_quotes(data, shape.delimiter, file.quoted);
    // Numeric rows grow about 2.5x as Examples.
    let mut enc = ExampleEncoder::with_capacity(data.len() * 5 / 2);
    while let Some((row, start, line)) = rows.next_row() {
        // Bad rows were counted (or were fatal) in the first pass; when it
        // found none, only the cheap field count is checked here.
        let bad = if any_bad {
            shape.check(&row).is_err()
        } else {
            row.len() != shape.names.len()
        };
        if bad {
            continue;
        }
        enc.begin();
        for &c in order {
            let raw = row.get(c);
            let value = trim(raw);
            if shape.is_missing(value) {
                continue;
            }
            let col = &columns[c];
            let key = col.name.as_bytes();
            let ok = match (&col.vocab, col.dtype) {
                (Some(vocab), _) => match vocab.binary_search_by(|v| v.as_slice().cmp(value)) {
                    Ok(index) => {
                        enc.int64(key, index as i64);
                        true
                    }
                    Err(_) => false,
                },
                (None, DType::Int64) => parse_i64(value).map(|v| enc.int64(key, v)).is_some(),
                (None, DType::Float32) => parse_f32(value).map(|v| enc.float(key, v)).is_some(),
                (None, _) => {
                    enc.bytes(key, raw);
                    true
                }
            };
            if !ok {
                // Only if the input changed between the passes.
                return Err(shape.bad_row(
                    &file.path,
                    task.line_base + line - 1,
                    (task.start + row.offset(c).unwrap_or(start)) as u64,
                    Some(c),
                    format!(
                        "{} does not parse as {} although the first pass said it would: did the file change?",
                        quote(raw),
                        infer::dtype_name(col.stored_dtype())
                    ),
                ));
            }
        }
        enc.end();
    }
    chunk.fill(enc);
    Ok(chunk)
}

/// One row's fields, as ranges into `buf`.
struct Row<'r> {
    buf: &'r [u8],
    ranges: &'r [(usize, usize)],
    /// Whether `buf` is the chunk itself (so ranges are input offsets).
    raw: bool,
}

impl<'r> Row<'r> {
    fn len(&self) -> usize {
        self.ranges.len()
    }

    #[inline]
    fn get(&self, i: usize) -> &'r [u8] {
        self.ranges
            .get(i)
            .map_or(&[][..], |&(a, b)| &self.buf[a..b])
    }

    /// The chunk offset of field `i`, when known exactly.
    fn offset(&self, i: usize) -> Option<usize> {
        self.raw.then(|| self.ranges.get(i).map(|r| r.0)).flatten()
    }
}

/// Reads the rows of a chunk. A chunk without quotes and without lone
/// carriage returns is split by a simple byte loop (several times faster than
/// the general parser, and the common case for numeric data); any other
/// chunk goes through the `csv` crate. Both give the same rows (a test feeds
/// the same inputs through both), skipping blank lines as `csv` does.
struct Rows<'a> {
    data: &'a [u8],
    /// Simple path: finds delimiters and line ends eight bytes at a time.
    hits: Hits,
    pos: usize,
    /// 1-based line of the next row (simple path).
    line: u64,
    ranges: Vec<(usize, usize)>,
    parser: Option<(csv::Reader<&'a [u8]>, ByteRecord)>,
}

/// Finds every delimiter and line end with SWAR (eight bytes per step in a
/// u64; a set high bit marks a matching byte), so a hit costs a few
/// instructions: fields in numeric CSV are short, and a search that restarts
/// at every hit (memchr2) spent more time restarting than searching.
struct Hits {
    delimiter: u64,
    /// Start of the word `mask` describes.
    word: usize,
    /// Start of the next word to load.
    next_word: usize,
    /// High bit of byte k set: `word + k` is a hit not yet returned.
    mask: u64,
    pad: u8,
}

impl Hits {
    const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const NEWLINES: u64 = 0x0a0a_0a0a_0a0a_0a0a;

    fn new(delimiter: u8) -> Self {
        Hits {
            delimiter: u64::from_ne_bytes([delimiter; 8]),
            word: 0,
            next_word: 0,
            mask: 0,
            // Padding for the last partial word must match neither byte.
            pad: if delimiter == 0 { 1 } else { 0 },
        }
    }

    /// High bit set in each zero byte of `x`, exactly (no false positives).
    #[inline]
    fn zero_bytes(x: u64) -> u64 {
        !(((x & Self::LO7).wrapping_add(Self::LO7)) | x | Self::LO7)
    }

    #[inline]
    fn next(&mut self, data: &[u8]) -> Option<usize> {
        loop {
            if self.mask != 0 {
                let k = self.mask.trailing_zeros() as usize / 8;
                self.mask &= self.mask - 1;
                return Some(self.word + k);
            }
            let at = self.next_word;
            let w = match data.get(at..at + 8) {
                Some(bytes) => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(bytes);
                    u64::from_le_bytes(b)
                }
                None if at < data.len() => {
                    let mut b = [self.pad; 8];
                    b[..data.len() - at].copy_from_slice(&data[at..]);
                    u64::from_le_bytes(b)
                }
                None => return None,
            };
            self.word = at;
            self.next_word = at + 8;
            self.mask = Self::zero_bytes(w ^ self.delimiter) | Self::zero_bytes(w ^ Self::NEWLINES);
        }
    }
}

/// Whether every carriage return is part of a CRLF.
fn only_crlf(data: &[u8]) -> bool {
    memchr::memchr_iter(b'\r', data).all(|i| data.get(i + 1) == Some(&b'\n'))
}

impl<'a> Rows<'a> {
    #[cfg(test)]
    fn new(data: &'a [u8], delimiter: u8) -> Self {
        Self::with_quotes(data, delimiter, true)
    }

    /// `quoted`: whether `data` may contain a quote (false only when known
    /// to contain none).
    fn with_quotes(data: &'a [u8], delimiter: u8, quoted: bool) -> Self {
        let simple = !(quoted && memchr::memchr(b'"', data).is_some()) && only_crlf(data);
        Rows {
            data,
            hits: Hits::new(delimiter),
            pos: 0,
            line: 1,
            ranges: Vec::new(),
            parser: (!simple).then(|| (reader(delimiter, data), ByteRecord::new())),
        }
    }

    /// The next row, its byte offset and its 1-based line in the chunk.
    fn next_row(&mut self) -> Option<(Row<'_>, usize, u64)> {
        if let Some((rdr, record)) = &mut self.parser {
            // The byte-record reader fails only on I/O, impossible on a slice.
            if !rdr.read_byte_record(record).unwrap_or(false) {
                return None;
            }
            // Where the record starts (the reader's own position may still
            // be before a preceding line end).
            let (mut byte, mut line) = record
                .position()
                .map_or((0, 1), |p| (p.byte() as usize, p.line()));
            // csv counts the line ends before a record as part of it; a
            // record itself never starts with one (a quoted field starts
            // with a quote), so skip them for the exact start.
            while let Some(&c) = self.data.get(byte) {
                match c {
                    b'\n' => line += 1,
                    b'\r' => {}
                    _ => break,
                }
                byte += 1;
            }
            self.ranges.clear();
            for i in 0..record.len() {
                if let Some(r) = record.range(i) {
                    self.ranges.push((r.start, r.end));
                }
            }
            let buf = self.parser.as_ref().map_or(&[][..], |(_, r)| r.as_slice());
            let row = Row {
                buf,
                ranges: &self.ranges,
                raw: false,
            };
            return Some((row, byte, line));
        }
        let data = self.data;
        let n = data.len();
        loop {
            match data.get(self.pos) {
                None => return None,
                Some(b'\n') => self.pos += 1,
                Some(b'\r') if data.get(self.pos + 1) == Some(&b'\n') => self.pos += 2,
                Some(_) => break,
            }
            self.line += 1;
        }
        let start = self.pos;
        self.ranges.clear();
        let mut field = start;
        let mut i = n;
        while let Some(hit) = self.hits.next(data) {
            if hit < start {
                continue; // a blank line skipped above
            }
            if data[hit] == b'\n' {
                i = hit;
                break;
            }
            self.ranges.push((field, hit));
            field = hit + 1;
        }
        let mut end = i;
        if end > field && data[end - 1] == b'\r' {
            end -= 1;
        }
        self.ranges.push((field, end));
        self.pos = (i + 1).min(n);
        let line = self.line;
        self.line += 1;
        let row = Row {
            buf: data,
            ranges: &self.ranges,
            raw: true,
        };
        Some((row, start, line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Split = Vec<(Vec<Vec<u8>>, usize, u64)>;

    fn both(text: &str, delimiter: u8) -> (Split, Split) {
        let collect = |mut rows: Rows<'_>| {
            let mut out = Vec::new();
            while let Some((row, start, line)) = rows.next_row() {
                out.push((
                    (0..row.len()).map(|i| row.get(i).to_vec()).collect(),
                    start,
                    line,
                ));
            }
            out
        };
        let data = text.as_bytes();
        let simple = Rows::new(data, delimiter);
        assert!(
            simple.parser.is_none(),
            "{text:?} should take the simple path"
        );
        let general = Rows {
            parser: Some((reader(delimiter, data), ByteRecord::new())),
            ..Rows::new(data, delimiter)
        };
        (collect(simple), collect(general))
    }

    #[test]
    fn an_unclosed_quote_is_found_where_it_opens() {
        let open = |text: &str| unclosed_quote(text.as_bytes(), 0, b',');
        assert_eq!(open("a,b\n1,\"never closed\n2,3\n4,5\n"), Some(6));
        assert_eq!(open("a,b\n1,\"closed\"\n2,\"x\"\"y\"\n"), None);
        assert_eq!(
            open("a,b\n1,ab\"c\n"),
            None,
            "a quote inside a field is a byte"
        );
        assert_eq!(
            open("a\n\"\"\"\n"),
            Some(2),
            "an escaped quote does not close"
        );
        assert_eq!(open("a\n\"x\"y,\"\n"), Some(7));
    }

    #[test]
    fn simple_splitter_agrees_with_the_csv_parser() {
        for text in [
            "1,2,3\n4,5,6\n",
            "1,2,3\r\n4,5,6",
            "a,b\n\n\nc,d\n",
            "\r\n\na\n,\n,,\n x , y \n",
            "",
            "\n\n",
            "only",
            "1;2\n3;4\n",
        ] {
            let (simple, general) = both(text, if text.contains(';') { b';' } else { b',' });
            assert_eq!(simple, general, "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn simple_splitter_agrees_on_random_input(text in "[a-c0-9,\n ]{0,60}(\r\n[0-9,]{0,5})?") {
            let (simple, general) = both(&text, b',');
            proptest::prop_assert_eq!(simple, general);
        }
    }

    #[test]
    fn swar_hits_find_every_delimiter_and_line_end() {
        for delimiter in [b',', b'\t', 0u8, 0x8a] {
            let data: Vec<u8> = (0..=255u8)
                .chain([b',', b'\n', 0, 0x8a, b'\t'])
                .cycle()
                .take(1000)
                .collect();
            let expected: Vec<usize> = (0..data.len())
                .filter(|&i| data[i] == delimiter || data[i] == b'\n')
                .collect();
            for len in [0, 1, 7, 8, 9, 100, 1000] {
                let mut hits = Hits::new(delimiter);
                let got: Vec<usize> = std::iter::from_fn(|| hits.next(&data[..len])).collect();
                let want: Vec<usize> = expected.iter().copied().filter(|&i| i < len).collect();
                assert_eq!(got, want, "delimiter {delimiter} len {len}");
            }
        }
    }

    #[test]
    fn quotes_and_lone_carriage_returns_take_the_parser() {
        assert!(Rows::new(b"a,\"b\"\n", b',').parser.is_some());
        assert!(Rows::new(b"a\rb\n", b',').parser.is_some());
    }
}
