//! The command line the floor examples share (`read_cpu`, `alloc_count`):
//! files, and feature specs given with `--feature`.

/// The files, and the feature specs given with `--feature`; `usage` is the
/// error when no file is named.
pub fn files_and_specs(usage: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let (mut files, mut specs) = (Vec::new(), Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--feature" => specs.push(args.next().ok_or("--feature takes a SPEC")?),
            _ => files.push(arg),
        }
    }
    if files.is_empty() {
        return Err(usage.into());
    }
    Ok((files, specs))
}
