//! Output files that appear all at once: written under a temporary name in
//! the destination's directory (so the final rename stays on one file system)
//! and renamed into place only when complete.
//!
//! The temporary file gets the permissions a plain `File::create` would give
//! (0666 less the umask), not tempfile's owner-only 0600, so outputs can be
//! shared like any other data file once renamed.

use std::io;
use std::path::Path;

use tempfile::NamedTempFile;

/// A new temporary file beside `path`, named `.NAME.XXXXXX.tmp`; it is
/// removed when dropped unless persisted.
pub(crate) fn temp_file_for(path: &Path) -> io::Result<NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    builder.tempfile_in(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_file_sits_beside_the_target_and_vanishes_on_drop() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("out.tfrecord");
        let temp = temp_file_for(&target).expect("temp file");
        assert_eq!(temp.path().parent(), Some(dir.path()));
        let name = temp.path().file_name().expect("name").to_string_lossy();
        assert!(name.starts_with(".out.tfrecord.") && name.ends_with(".tmp"));
        let temp_path = temp.path().to_path_buf();
        drop(temp);
        assert!(!temp_path.exists());
    }

    #[cfg(unix)]
    #[test]
    fn temp_file_gets_the_mode_of_a_plain_create() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let plain = dir.path().join("plain");
        let plain_mode = std::fs::File::create(&plain)
            .and_then(|f| f.metadata())
            .expect("plain file")
            .permissions()
            .mode();
        let temp = temp_file_for(&dir.path().join("x")).expect("temp file");
        let mode = temp
            .as_file()
            .metadata()
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, plain_mode & 0o777);
    }
}
