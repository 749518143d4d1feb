//! Outputs that appear all at once, durably, or not at all.
//!
//! Every file tfpipe writes for a user (shards, schema files, checkpoints,
//! predictions, reports, caches) goes through this module, so three promises
//! hold everywhere:
//!
//! - **Never half-written under a final name.** Data is written under a
//!   temporary name beside the target (`.NAME.XXXXXX.tmp`, in the same
//!   directory, so the final rename stays on one file system) and renamed into
//!   place only when complete. Dropped before that (an error, a panic, an
//!   interrupt), the temporary file is removed.
//! - **Durable before visible.** The file's data is `fsync`ed before the
//!   rename and the directory after it, so a power cut never leaves a renamed
//!   file whose data is not on disk.
//! - **One permission rule.** Outputs get the mode a plain `File::create` or
//!   `mkdir` would give: `0666` (files) or `0777` (directories) less the
//!   process umask, so with the usual umask 022 every output is `0644` and
//!   every output directory `0755`. (tempfile's own default, owner-only `0600`,
//!   is not used.) Directories above an output that do not exist yet are
//!   created, like `mkdir -p`, under the same rule.
//!
//! Four shapes of output:
//!
//! - one file: [`AtomicFile`] (or [`write()`] for bytes already in memory);
//! - one file finished now but made visible later, with others:
//!   [`AtomicFile::seal`] gives a [`Pending`];
//! - several files in one directory that switch together: [`FileSet`]
//!   (a conversion's shards and their schema file);
//! - a directory whose contents switch together: [`AtomicDir`] (a
//!   checkpoint).
//!
//! ```
//! use std::io::Write;
//! use tfpipe::atomic_file::AtomicFile;
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("reports/run.json"); // `reports/` is created
//! let mut out = AtomicFile::create(&path)?;
//! out.write_all(b"{}\n")?;
//! assert!(!path.exists()); // not visible until committed
//! out.commit()?;
//! assert_eq!(std::fs::read(&path)?, b"{}\n");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tempfile::{NamedTempFile, TempDir, TempPath};

/// An output could not be created, written, synced or moved into place.
/// The message names the path and the step; the operating system's reason is
/// the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot {action}", path.display())]
pub struct OutputError {
    /// The output's final path (or the directory, for a directory step).
    pub path: PathBuf,
    /// What failed: "create a temporary file", "sync to disk", ...
    pub action: &'static str,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl OutputError {
    fn new(path: &Path, action: &'static str, source: io::Error) -> OutputError {
        OutputError {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

impl From<OutputError> for io::Error {
    fn from(e: OutputError) -> io::Error {
        io::Error::new(e.source.kind(), e)
    }
}

/// The directory `path` lives in (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

fn file_name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Creates the directories above `path` that are missing (mode `0777` less the
/// umask) and syncs the directory each new one was created in.
pub fn create_parent_dirs(path: &Path) -> Result<(), OutputError> {
    let dir = parent_of(path);
    if dir.is_dir() {
        return Ok(());
    }
    // The highest missing ancestor: its parent must learn about it durably.
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        if d.as_os_str().is_empty() || d.is_dir() {
            break;
        }
        missing.push(d.to_path_buf());
        at = d.parent();
    }
    fs::create_dir_all(dir).map_err(|e| OutputError::new(dir, "create the directory", e))?;
    for d in missing.iter().rev() {
        sync_dir(parent_of(d))?;
    }
    Ok(())
}

/// Syncs a directory, so that renames and creations in it are on disk.
///
/// On platforms where a directory cannot be opened for syncing this does
/// nothing.
pub fn sync_dir(dir: &Path) -> Result<(), OutputError> {
    #[cfg(unix)]
    {
        let handle = File::open(dir)
            .map_err(|e| OutputError::new(dir, "open the directory to sync it", e))?;
        handle
            .sync_all()
            .map_err(|e| OutputError::new(dir, "sync the directory to disk", e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// A new temporary file beside `path`, named `.NAME.XXXXXX.tmp`, with the
/// mode of a plain create; removed when dropped unless persisted. Creates
/// missing parent directories.
pub(crate) fn temp_file_for(path: &Path) -> Result<NamedTempFile, OutputError> {
    create_parent_dirs(path)?;
    let prefix = format!(".{}.", file_name_of(path));
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    builder
        .tempfile_in(parent_of(path))
        .map_err(|e| OutputError::new(path, "create a temporary file", e))
}

/// A file being written under a temporary name; [`commit`](AtomicFile::commit)
/// syncs it and renames it into place. Dropped uncommitted, it is removed.
///
/// Writes go straight to the file: wrap it in a [`io::BufWriter`] for many
/// small writes.
#[derive(Debug)]
pub struct AtomicFile {
    temp: NamedTempFile,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`, which appears only on commit. Creates missing
    /// parent directories.
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile, OutputError> {
        let path = path.as_ref().to_path_buf();
        let temp = temp_file_for(&path)?;
        Ok(AtomicFile { temp, path })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file's path (where the data is until commit).
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    /// The open file.
    pub fn as_file(&self) -> &File {
        self.temp.as_file()
    }

    /// The open file, for writing.
    pub fn as_file_mut(&mut self) -> &mut File {
        self.temp.as_file_mut()
    }

    /// Splits into the open file and a [`Pending`]-to-be: for writers that
    /// own their file (such as a record writer) and hand it back when done,
    /// to [`seal`](AtomicFile::seal).
    pub fn into_parts(self) -> (File, Unsealed) {
        let (file, temp) = self.temp.into_parts();
        (
            file,
            Unsealed {
                temp,
                path: self.path,
            },
        )
    }

    /// Syncs the data to disk and closes the file, leaving it under its
    /// temporary name: for outputs made visible together with others (see
    /// [`FileSet`]).
    pub fn seal(self) -> Result<Pending, OutputError> {
        let (file, unsealed) = self.into_parts();
        unsealed.seal(file)
    }

    /// Syncs the data, renames the file into place, and syncs the directory.
    pub fn commit(self) -> Result<PathBuf, OutputError> {
        self.seal()?.commit()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.temp.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.temp.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.temp.flush()
    }
}

/// The temporary name of an [`AtomicFile`] whose open file was taken by
/// [`AtomicFile::into_parts`]; removed when dropped unsealed.
#[derive(Debug)]
pub struct Unsealed {
    temp: TempPath,
    path: PathBuf,
}

impl Unsealed {
    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Syncs `file` (the one taken by `into_parts`, flushed by its writer)
    /// to disk and closes it.
    pub fn seal(self, file: File) -> Result<Pending, OutputError> {
        file.sync_all()
            .map_err(|e| OutputError::new(&self.path, "sync the file to disk", e))?;
        drop(file);
        Ok(Pending {
            temp: self.temp,
            path: self.path,
        })
    }
}

/// A complete file, synced to disk, still under its temporary name: removed
/// when dropped uncommitted.
#[derive(Debug)]
pub struct Pending {
    temp: TempPath,
    path: PathBuf,
}

impl Pending {
    /// The final path it will get.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its temporary path.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Renames it into place (replacing any file there) and syncs the
    /// directory.
    pub fn commit(self) -> Result<PathBuf, OutputError> {
        let path = self.path;
        self.temp.persist(&path).map_err(|e| {
            OutputError::new(&path, "rename the temporary file into place", e.error)
        })?;
        sync_dir(parent_of(&path))?;
        Ok(path)
    }
}

/// Writes `bytes` to `path` atomically and durably (see the module doc).
pub fn write(path: impl AsRef<Path>, bytes: &[u8]) -> Result<(), OutputError> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)
        .map_err(|e| OutputError::new(&file.path, "write", e))?;
    file.commit()?;
    Ok(())
}

/// Several files that switch together: all are written and sealed first, then
/// [`commit`](FileSet::commit) renames them into place in the order added (put
/// the file that describes the others, such as a schema file, last).
///
/// A failure at any step of the commit restores every file it had replaced,
/// so the directory holds the previous complete set again; the previous
/// files are kept (as hard links under temporary names) until every new one
/// is in place, and removed only then. The switch is one rename per file, so
/// a crash of the machine *during* the commit (microseconds) can leave some
/// new files beside old ones; the previous versions then remain as
/// `.NAME.XXXXXX.old` files beside them. For a switch that is atomic even
/// across a crash, write a directory with [`AtomicDir`].
///
/// ```
/// use std::io::Write;
/// use tfpipe::atomic_file::{AtomicFile, FileSet};
///
/// let dir = tempfile::tempdir()?;
/// let mut set = FileSet::new();
/// for name in ["part-0", "part-1", "index.json"] {
///     let mut file = AtomicFile::create(dir.path().join(name))?;
///     file.write_all(name.as_bytes())?;
///     set.push(file.seal()?);
/// }
/// assert!(!dir.path().join("part-0").exists());
/// let paths = set.commit()?;
/// assert_eq!(paths.len(), 3);
/// assert_eq!(std::fs::read(dir.path().join("index.json"))?, b"index.json");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct FileSet {
    files: Vec<Pending>,
}

/// One step of a commit done so far, for the rollback.
struct Switched {
    path: PathBuf,
    /// The previous file, kept under a temporary name.
    backup: Option<TempPath>,
}

impl FileSet {
    /// An empty set.
    pub fn new() -> FileSet {
        FileSet::default()
    }

    /// Adds a sealed file; files are committed in the order added.
    pub fn push(&mut self, file: Pending) {
        self.files.push(file);
    }

    /// The files so far, in order.
    pub fn files(&self) -> &[Pending] {
        &self.files
    }

    /// Renames every file into place, in order; all or nothing (see the type's
    /// doc). Returns the final paths.
    pub fn commit(self) -> Result<Vec<PathBuf>, OutputError> {
        self.commit_with(|_| Ok(()))
    }

    /// [`commit`](FileSet::commit) with a hook called before each rename,
    /// with the index of the file: an error from it aborts the commit, like a
    /// failed rename would (tests use it to fail at every step).
    pub(crate) fn commit_with(
        self,
        mut before: impl FnMut(usize) -> io::Result<()>,
    ) -> Result<Vec<PathBuf>, OutputError> {
        let mut done: Vec<Switched> = Vec::with_capacity(self.files.len());
        let mut result = Ok(());
        for (i, file) in self.files.into_iter().enumerate() {
            if let Err(e) = before(i) {
                result = Err(OutputError::new(
                    &file.path,
                    "rename the temporary file into place",
                    e,
                ));
                break;
            }
            match switch_one(file) {
                Ok(step) => done.push(step),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        for step in &done {
            let dir = parent_of(&step.path).to_path_buf();
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        if let Err(e) = result.and_then(|()| dirs.iter().try_for_each(|d| sync_dir(d))) {
            // Put the previous set back, newest first.
            for step in done.into_iter().rev() {
                match step.backup {
                    Some(backup) => {
                        if backup.persist(&step.path).is_err() {
                            // Cannot restore: leave what is there rather than delete it.
                        }
                    }
                    None => {
                        let _ = fs::remove_file(&step.path);
                    }
                }
            }
            for dir in &dirs {
                let _ = sync_dir(dir);
            }
            return Err(e);
        }
        // Every new file is in place and on disk: the backups go (on drop).
        Ok(done.into_iter().map(|step| step.path).collect())
    }
}

/// Renames `file` into place, keeping the file it replaces as a hard link
/// under a temporary name (or, where hard links are not possible, moved to
/// that name first).
fn switch_one(file: Pending) -> Result<Switched, OutputError> {
    let path = file.path.clone();
    let backup = match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(OutputError::new(&path, "look at the previous file", e)),
        Ok(_) => {
            let name = tempfile::Builder::new()
                .prefix(&format!(".{}.", file_name_of(&path)))
                .suffix(".old")
                .make_in(parent_of(&path), |p| fs::hard_link(&path, p));
            match name {
                Ok(named) => Some(named.into_temp_path()),
                Err(_) => {
                    // No hard links here: move it aside (it is briefly absent).
                    let named = tempfile::Builder::new()
                        .prefix(&format!(".{}.", file_name_of(&path)))
                        .suffix(".old")
                        .make_in(parent_of(&path), |p| fs::rename(&path, p))
                        .map_err(|e| OutputError::new(&path, "keep the previous file aside", e))?;
                    Some(named.into_temp_path())
                }
            }
        }
    };
    match file.temp.persist(&path) {
        Ok(()) => Ok(Switched { path, backup }),
        Err(e) => {
            if let Some(backup) = backup
                && !path.exists()
            {
                let _ = backup.persist(&path);
            }
            Err(OutputError::new(
                &path,
                "rename the temporary file into place",
                e.error,
            ))
        }
    }
}

/// A directory written under a temporary name beside its target and switched
/// into place as one unit by [`commit`](AtomicDir::commit): readers see the
/// old complete directory or the new complete one, never a mix, and the old
/// one is not touched until the switch. Dropped uncommitted, the temporary
/// directory and everything in it is removed.
///
/// On Linux the switch is one `renameat2(RENAME_EXCHANGE)`, atomic even
/// across a crash; where that is not available (other systems, some file
/// systems), the old directory is first renamed aside to `.NAME.XXXXXX.old`
/// and then the new one into place, so for the moment between the two
/// renames the target is absent, but the old set is still whole under the
/// aside name.
///
/// ```
/// use tfpipe::atomic_file::AtomicDir;
///
/// let root = tempfile::tempdir()?;
/// let target = root.path().join("checkpoint");
/// for version in ["1", "2"] {
///     let dir = AtomicDir::create(&target)?;
///     std::fs::write(dir.path().join("weights"), version)?;
///     std::fs::write(dir.path().join("meta.json"), version)?;
///     dir.commit()?;
/// }
/// assert_eq!(std::fs::read_to_string(target.join("weights"))?, "2");
/// assert_eq!(std::fs::read_dir(root.path())?.count(), 1); // nothing left over
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AtomicDir {
    temp: TempDir,
    target: PathBuf,
}

impl AtomicDir {
    /// Starts a new version of the directory `target` (which need not
    /// exist). Write into [`path`](AtomicDir::path). Creates missing parent
    /// directories.
    pub fn create(target: impl AsRef<Path>) -> Result<AtomicDir, OutputError> {
        let target = target.as_ref().to_path_buf();
        if target.is_file() {
            return Err(OutputError::new(
                &target,
                "write a directory here",
                io::Error::new(io::ErrorKind::AlreadyExists, "a file is in the way"),
            ));
        }
        create_parent_dirs(&target)?;
        let prefix = format!(".{}.", file_name_of(&target));
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(fs::Permissions::from_mode(0o777));
        }
        let temp = builder
            .tempdir_in(parent_of(&target))
            .map_err(|e| OutputError::new(&target, "create a temporary directory", e))?;
        Ok(AtomicDir { temp, target })
    }

    /// The temporary directory to write into.
    pub fn path(&self) -> &Path {
        self.temp.path()
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// A file in the temporary directory (`self.path().join(name)`) created
    /// with the output mode. Files written in the directory by other means
    /// are fine too: commit syncs them all.
    pub fn create_file(&self, name: impl AsRef<Path>) -> Result<File, OutputError> {
        let path = self.temp.path().join(name);
        File::create(&path).map_err(|e| OutputError::new(&path, "create", e))
    }

    /// Syncs every file and directory in it, switches it into place, syncs the
    /// parent, and removes the previous version.
    pub fn commit(self) -> Result<PathBuf, OutputError> {
        sync_tree(self.temp.path())?;
        let parent = parent_of(&self.target).to_path_buf();
        let target = self.target;
        let temp = self.temp.path().to_path_buf();
        // From here on the temporary directory is ours to remove.
        let guard = self.temp;
        let old = match fs::symlink_metadata(&target) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::rename(&temp, &target)
                    .map_err(|e| OutputError::new(&target, "rename the directory into place", e))?;
                // `guard` would delete the target's new contents otherwise.
                let _ = guard.keep();
                None
            }
            Err(e) => {
                return Err(OutputError::new(
                    &target,
                    "look at the previous directory",
                    e,
                ));
            }
            Ok(meta) if !meta.is_dir() => {
                return Err(OutputError::new(
                    &target,
                    "replace it with a directory",
                    io::Error::new(io::ErrorKind::AlreadyExists, "a file is in the way"),
                ));
            }
            Ok(_) => match exchange(&temp, &target) {
                // `temp` now holds the old directory: the guard removes it below.
                Ok(()) => Some(guard),
                Err(_) => {
                    let aside = tempfile::Builder::new()
                        .prefix(&format!(".{}.", file_name_of(&target)))
                        .suffix(".old")
                        .make_in(&parent, |p| fs::rename(&target, p))
                        .map_err(|e| {
                            OutputError::new(&target, "move the previous directory aside", e)
                        })?
                        .into_temp_path();
                    let aside = aside.keep().map_err(|e| {
                        OutputError::new(&target, "move the previous directory aside", e.error)
                    })?;
                    if let Err(e) = fs::rename(&temp, &target) {
                        let _ = fs::rename(&aside, &target);
                        return Err(OutputError::new(
                            &target,
                            "rename the directory into place",
                            e,
                        ));
                    }
                    let _ = guard.keep();
                    sync_dir(&parent)?;
                    let _ = fs::remove_dir_all(&aside);
                    return Ok(target);
                }
            },
        };
        sync_dir(&parent)?;
        drop(old); // removes the previous version (now under the temporary name)
        Ok(target)
    }
}

/// Syncs every regular file and directory under `dir`, then `dir` itself.
fn sync_tree(dir: &Path) -> Result<(), OutputError> {
    let entries = fs::read_dir(dir).map_err(|e| OutputError::new(dir, "list the directory", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| OutputError::new(dir, "list the directory", e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| OutputError::new(&path, "look at the file", e))?;
        if kind.is_dir() {
            sync_tree(&path)?;
        } else if kind.is_file() {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| OutputError::new(&path, "sync the file to disk", e))?;
        }
    }
    sync_dir(dir)
}

/// Swaps two paths atomically (Linux `renameat2(RENAME_EXCHANGE)`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let a = CString::new(a.as_os_str().as_bytes())?;
    let b = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both are valid NUL-terminated paths that outlive the call; the
    // syscall reads them and touches no other memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

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
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path).expect("metadata").permissions().mode() & 0o777
    }

    #[cfg(unix)]
    #[test]
    fn every_output_gets_the_mode_of_a_plain_create() {
        let dir = tempfile::tempdir().expect("temp dir");
        let plain_file = dir.path().join("plain");
        File::create(&plain_file).expect("plain file");
        let plain_dir = dir.path().join("plain-dir");
        fs::create_dir(&plain_dir).expect("plain dir");

        let file = dir.path().join("new/sub/file");
        write(&file, b"x").expect("write");
        assert_eq!(mode(&file), mode(&plain_file));
        assert_eq!(mode(&dir.path().join("new")), mode(&plain_dir));

        let mut set = FileSet::new();
        let mut shard = AtomicFile::create(dir.path().join("shard")).expect("create");
        shard.write_all(b"s").expect("write");
        set.push(shard.seal().expect("seal"));
        set.commit().expect("commit");
        assert_eq!(mode(&dir.path().join("shard")), mode(&plain_file));

        let ckpt = AtomicDir::create(dir.path().join("ckpt")).expect("dir");
        ckpt.create_file("w").expect("file");
        let ckpt = ckpt.commit().expect("commit");
        assert_eq!(mode(&ckpt), mode(&plain_dir));
        assert_eq!(mode(&ckpt.join("w")), mode(&plain_file));
    }

    #[test]
    fn dropped_file_leaves_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut file = AtomicFile::create(dir.path().join("x")).expect("create");
        file.write_all(b"half").expect("write");
        drop(file);
        assert!(names(dir.path()).is_empty());
        let sealed = AtomicFile::create(dir.path().join("y"))
            .expect("create")
            .seal()
            .expect("seal");
        drop(sealed);
        assert!(names(dir.path()).is_empty());
    }

    fn set_of(dir: &Path, files: &[(&str, &str)]) -> FileSet {
        let mut set = FileSet::new();
        for (name, text) in files {
            let mut file = AtomicFile::create(dir.join(name)).expect("create");
            file.write_all(text.as_bytes()).expect("write");
            set.push(file.seal().expect("seal"));
        }
        set
    }

    fn contents(dir: &Path) -> Vec<(String, String)> {
        names(dir)
            .into_iter()
            .map(|n| {
                let text = fs::read_to_string(dir.join(&n)).expect("read");
                (n, text)
            })
            .collect()
    }

    #[test]
    fn a_file_set_failing_at_any_step_restores_the_previous_set() {
        let old = [("a", "old a"), ("b", "old b"), ("schema", "old schema")];
        // The new set has one more file than the old one.
        let new = [("a", "A"), ("b", "B"), ("c", "C"), ("schema", "SCHEMA")];
        for fail_at in 0..new.len() {
            let dir = tempfile::tempdir().expect("temp dir");
            set_of(dir.path(), &old).commit().expect("first commit");
            let before = contents(dir.path());
            let err = set_of(dir.path(), &new)
                .commit_with(|i| {
                    if i == fail_at {
                        Err(io::Error::other("injected"))
                    } else {
                        Ok(())
                    }
                })
                .expect_err("must fail");
            assert_eq!(err.path, dir.path().join(new[fail_at].0));
            assert_eq!(contents(dir.path()), before, "failed at step {fail_at}");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        set_of(dir.path(), &old).commit().expect("first commit");
        set_of(dir.path(), &new).commit().expect("second commit");
        let want: Vec<(String, String)> = new
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        assert_eq!(contents(dir.path()), want, "no backups left over");
    }

    #[test]
    fn a_directory_switches_as_one_and_a_dropped_one_leaves_the_old() {
        let root = tempfile::tempdir().expect("temp dir");
        let target = root.path().join("ckpt");
        let first = AtomicDir::create(&target).expect("create");
        fs::write(first.path().join("w"), "1").expect("write");
        fs::write(first.path().join("m"), "1").expect("write");
        first.commit().expect("commit");

        let second = AtomicDir::create(&target).expect("create");
        fs::write(second.path().join("w"), "2").expect("write");
        drop(second); // failed half-way: the old set is untouched
        assert_eq!(names(root.path()), ["ckpt"]);
        assert_eq!(fs::read_to_string(target.join("w")).expect("read"), "1");

        let third = AtomicDir::create(&target).expect("create");
        fs::write(third.path().join("w"), "3").expect("write");
        third.commit().expect("commit");
        assert_eq!(names(root.path()), ["ckpt"]);
        assert_eq!(names(&target), ["w"]);
        assert_eq!(fs::read_to_string(target.join("w")).expect("read"), "3");
    }

    #[test]
    fn a_directory_is_not_written_over_a_file() {
        let root = tempfile::tempdir().expect("temp dir");
        let target = root.path().join("ckpt");
        fs::write(&target, "a file").expect("write");
        let err = AtomicDir::create(&target).expect_err("a file is in the way");
        assert!(err.to_string().contains("ckpt"));
    }
}
