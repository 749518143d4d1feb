//! The one resolver from user-given paths, URLs and globs to files.
//!
//! A directory (or a URL ending in `/`) is read as a dataset, the way Spark,
//! Hadoop and linkedin/spark-tfrecord write one: its `part-*` files, through
//! `key=value/` partition directories, leaving out markers and checksums
//! ([`is_dataset_file`] is the rule, for local directories and object
//! listings alike).

use std::path::{Path, PathBuf};

use super::StorageError;

/// Whether `path` is an object-store URL (`scheme://...` with a scheme tfpipe
/// reads: `s3`, `s3a`, `gs`, `az`, `azure`, `abfs`, `abfss`, `http`, `https`).
///
/// ```
/// use tfpipe::storage::is_url;
/// assert!(is_url("s3://bucket/train-0.tfrecord"));
/// assert!(!is_url("data/train-0.tfrecord"));
/// ```
pub fn is_url(path: impl AsRef<Path>) -> bool {
    url_str(path.as_ref()).is_some()
}

/// The URL text of `path`, if it is an object-store URL.
pub(crate) fn url_str(path: &Path) -> Option<&str> {
    let text = path.to_str()?;
    let (scheme, rest) = text.split_once("://")?;
    let known = [
        "s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https",
    ];
    (known.contains(&scheme.to_ascii_lowercase().as_str()) && !rest.is_empty()).then_some(text)
}

/// Whether `text` has a glob wildcard (`*`, `?` or `[`).
pub(crate) fn has_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// Resolves paths, URLs and globs to the files they name, in order: each
/// entry's glob matches sorted, entries in the order given. A local entry
/// without wildcards must be a file; a URL without wildcards must name an
/// existing object (one `HEAD`); a glob must match at least one.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// for name in ["b.tfrecord", "a.tfrecord", "notes.txt"] {
///     std::fs::write(dir.path().join(name), b"")?;
/// }
/// let pattern = dir.path().join("*.tfrecord");
/// let files = tfpipe::storage::resolve([pattern.to_string_lossy()])?;
/// assert_eq!(files, [dir.path().join("a.tfrecord"), dir.path().join("b.tfrecord")]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A directory is read as a dataset: every `part-*` file in it, through
/// nested `key=value/` partition directories, sorted by path, leaving out
/// `_SUCCESS`, `_committed_*`, `*.crc` and hidden files (see
/// [`is_dataset_file`]); one without such files is an error.
///
/// A glob's matches leave out record index files (`NAME.idx` where the same
/// glob also matches `NAME`, as `tfpipe index` writes them), so that
/// `'out/train-*'` names the data and not its indexes;
/// [`resolve_listing`] also says which it left out.
pub fn resolve<P: AsRef<str>>(
    patterns: impl IntoIterator<Item = P>,
) -> Result<Vec<PathBuf>, StorageError> {
    resolve_listing(patterns).map(|listing| listing.files)
}

/// What [`resolve_listing`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The files, in order.
    pub files: Vec<PathBuf>,
    /// Record index files that globs matched beside their data files, left out.
    pub skipped_indexes: Vec<PathBuf>,
}

/// [`resolve`], also returning the index files its globs left out (for a
/// note to the user).
pub fn resolve_listing<P: AsRef<str>>(
    patterns: impl IntoIterator<Item = P>,
) -> Result<Listing, StorageError> {
    let mut listing = Listing::default();
    for pattern in patterns {
        let pattern = pattern.as_ref();
        let matches = if url_str(Path::new(pattern)).is_some() {
            resolve_url(pattern)?
        } else {
            resolve_local(pattern)?
        };
        if !has_glob(pattern) {
            listing.files.extend(matches);
            continue;
        }
        let (indexes, data): (Vec<PathBuf>, Vec<PathBuf>) = matches
            .iter()
            .cloned()
            .partition(|path| data_of_index(path).is_some_and(|d| matches.contains(&d)));
        listing.files.extend(data);
        listing.skipped_indexes.extend(indexes);
    }
    Ok(listing)
}

/// Whether `relative`, a path under a dataset directory (with `/`
/// separators), is one of the dataset's data files: every directory on the
/// way is a partition (`key=value`), and the file is a part (`part-*`, as
/// Spark and Hadoop name their output; any compression suffix), not a
/// checksum (`*.crc`). Names starting with `.` or `_` are never data
/// (`_SUCCESS`, `_committed_*`, `_temporary/`, `.part-00000.crc`).
///
/// ```
/// use tfpipe::storage::is_dataset_file;
/// assert!(is_dataset_file("part-r-00000.gz"));
/// assert!(is_dataset_file("year=2024/country=fr/part-00003-1b2c.tfrecord"));
/// assert!(!is_dataset_file("_SUCCESS"));
/// assert!(!is_dataset_file("_temporary/0/part-00000"));
/// assert!(!is_dataset_file("year=2024/.part-00000.crc"));
/// assert!(!is_dataset_file("part-00000.crc"));
/// assert!(!is_dataset_file("logs/part-00000"));
/// ```
pub fn is_dataset_file(relative: &str) -> bool {
    let mut segments: Vec<&str> = relative.split('/').filter(|s| !s.is_empty()).collect();
    let Some(name) = segments.pop() else {
        return false;
    };
    segments.iter().all(|dir| is_partition_dir(dir))
        && name.starts_with("part-")
        && !name.ends_with(".crc")
}

/// The partition values in `path`'s directories: each `key=value`
/// directory (Hive's layout, as Spark's `partitionBy` writes it), with
/// Hive's `%XX` escapes decoded, outermost first. The file name itself is
/// not one.
///
/// ```
/// use std::path::Path;
/// use tfpipe::storage::partition_values;
/// let found = partition_values(Path::new("out/year=2024/city=S%C3%A3o Paulo/part-00000.gz"));
/// assert_eq!(found, [("year".into(), "2024".into()), ("city".into(), "São Paulo".into())]);
/// ```
pub fn partition_values(path: &Path) -> Vec<(String, String)> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    dir.iter()
        .filter_map(|segment| segment.to_str())
        .filter(|segment| is_partition_dir(segment))
        .filter_map(|segment| {
            let (key, value) = segment.split_once('=')?;
            Some((percent_decode(key), percent_decode(value)))
        })
        .collect()
}

/// Decodes `%XX` escapes (Hive's partition paths, links in HTTP index
/// pages); a malformed escape stays as it is.
pub(super) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if bytes[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a directory name is a partition, `key=value` (not hidden).
fn is_partition_dir(name: &str) -> bool {
    !name.starts_with(['.', '_']) && name.split_once('=').is_some_and(|(key, _)| !key.is_empty())
}

/// The `part-*` files of a local dataset directory, sorted by path.
fn dataset_files(dir: &Path, pattern: &str) -> Result<Vec<PathBuf>, StorageError> {
    let mut found = Vec::new();
    walk_dataset(dir, &mut found).map_err(|error| StorageError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    if found.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: format!("{pattern} (a directory: its part-* files)"),
        });
    }
    found.sort();
    Ok(found)
}

/// Collects the data files under `dir`, descending only into partitions.
fn walk_dataset(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if path.is_dir() {
            if is_partition_dir(name) {
                walk_dataset(&path, found)?;
            }
        } else if is_dataset_file(name) {
            found.push(path);
        }
    }
    Ok(())
}

/// The data file an index file `NAME.idx` describes: `NAME`.
fn data_of_index(path: &Path) -> Option<PathBuf> {
    let text = path.to_str()?;
    let data = text.strip_suffix(".idx")?;
    (!data.is_empty()).then(|| PathBuf::from(data))
}

fn resolve_local(pattern: &str) -> Result<Vec<PathBuf>, StorageError> {
    if !has_glob(pattern) {
        if Path::new(pattern).is_dir() {
            return dataset_files(Path::new(pattern), pattern);
        }
        return if Path::new(pattern).is_file() {
            Ok(vec![PathBuf::from(pattern)])
        } else {
            Err(StorageError::NoMatch {
                pattern: pattern.to_string(),
            })
        };
    }
    let matches = glob::glob(pattern).map_err(|e| StorageError::BadGlob {
        pattern: pattern.to_string(),
        reason: e.to_string(),
    })?;
    let mut found: Vec<PathBuf> = matches
        .filter_map(Result::ok)
        .filter(|p| p.is_file())
        .collect();
    if found.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: pattern.to_string(),
        });
    }
    found.sort();
    Ok(found)
}

#[cfg(feature = "object-store")]
fn resolve_url(pattern: &str) -> Result<Vec<PathBuf>, StorageError> {
    super::object::resolve(pattern)
}

#[cfg(not(feature = "object-store"))]
fn resolve_url(pattern: &str) -> Result<Vec<PathBuf>, StorageError> {
    Err(StorageError::NotBuilt {
        url: pattern.to_string(),
    })
}

/// Splits a key pattern at the last `/` before its first wildcard: the
/// listing prefix (a whole number of path segments) and the rest.
#[cfg_attr(
    not(feature = "object-store"),
    allow(
        dead_code,
        reason = "listing needs the object-store feature; tested without it"
    )
)]
pub(crate) fn list_prefix(key_pattern: &str) -> &str {
    let first = key_pattern
        .find(['*', '?', '['])
        .unwrap_or(key_pattern.len());
    match key_pattern[..first].rfind('/') {
        Some(slash) => &key_pattern[..slash],
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_recognised_by_scheme() {
        assert!(is_url("s3://b/k"));
        assert!(is_url("GS://b/k"));
        assert!(is_url("https://host/x.tfrecord"));
        assert!(!is_url("s3://"));
        assert!(!is_url("file.tfrecord"));
        assert!(!is_url("ftp://host/x"));
        assert!(!is_url("/data/s3:/x"));
    }

    #[test]
    fn list_prefix_stops_at_the_segment_before_the_wildcard() {
        assert_eq!(list_prefix("train/part-*.tfrecord"), "train");
        assert_eq!(list_prefix("a/b/c-?/d"), "a/b");
        assert_eq!(list_prefix("*.tfrecord"), "");
        assert_eq!(list_prefix("x/y/z"), "x/y");
    }

    #[test]
    fn globs_leave_out_index_files_beside_their_data() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["p-0", "p-0.idx", "p-1", "p-1.idx", "p-2.idx"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let pattern = dir.path().join("p-*").to_string_lossy().into_owned();
        let listing = resolve_listing([&pattern]).unwrap();
        // p-2.idx has no data file beside it: it is not an index of these
        // files, so it stays (and will be reported as what it is).
        let names = |paths: &[PathBuf]| -> Vec<String> {
            paths
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names(&listing.files), ["p-0", "p-1", "p-2.idx"]);
        assert_eq!(names(&listing.skipped_indexes), ["p-0.idx", "p-1.idx"]);
        // A name given without a glob is taken as given.
        let named = dir.path().join("p-0.idx").to_string_lossy().into_owned();
        assert_eq!(resolve([&named]).unwrap().len(), 1);
    }

    #[test]
    fn local_resolution_sorts_and_reports_misses() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["2.rec", "1.rec"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let pattern = dir.path().join("*.rec").to_string_lossy().into_owned();
        let files = resolve([&pattern]).unwrap();
        assert_eq!(files, [dir.path().join("1.rec"), dir.path().join("2.rec")]);
        let missing = dir.path().join("nope-*.rec").to_string_lossy().into_owned();
        let err = resolve([&missing]).unwrap_err();
        assert!(matches!(err, StorageError::NoMatch { .. }), "{err}");
        assert!(err.to_string().contains("nope-*.rec"), "{err}");
        let err = resolve([dir.path().join("x.rec").to_string_lossy()]).unwrap_err();
        assert!(matches!(err, StorageError::NoMatch { .. }), "{err}");
    }
}
