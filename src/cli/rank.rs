//! `--rank R --world-size W`, shared by `train`, `bench` and `predict`
//! (flattened into each), and the launcher's environment.
//!
//! Resolution, first match wins:
//! 1. the flags (both or neither: clap enforces it);
//! 2. `RANK`/`WORLD_SIZE` (torchrun and most launchers);
//! 3. `SLURM_PROCID`/`SLURM_NTASKS` inside an `srun` step
//!    ([`Rank::from_vars`] says why only there).
//!
//! A flag that overrides a different value from the environment is noted
//! on stderr (a launcher and a script that disagree are usually a mistake,
//! but the flag is what the user typed). Values that make no sense (rank
//! not below the world size, one variable of a pair missing, not a number)
//! are errors that name where they came from. `--device cuda` becomes
//! `cuda:LOCAL_RANK` when the launcher set `LOCAL_RANK` (or, in an `srun`
//! step, `SLURM_LOCALID`). Output paths (`--save`, `--logdir`,
//! `--report-json`, `predict --output`) and `--resume` take `{rank}`, and
//! need it with more than one rank ([`per_rank_paths`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tfpipe::pipeline::{Rank, Remainder, ShareBy, TfRecordFiles};

/// The rank flags of a command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RankArgs {
    /// This process's rank in a data-parallel job (0-based): it reads only
    /// its share of the files. By default from RANK, or SLURM_PROCID in an
    /// srun step. With more than one rank, output paths (and --resume) name
    /// the rank with {rank}, e.g. --save ck-{rank}.
    #[arg(long, requires = "world_size", value_name = "R")]
    pub rank: Option<usize>,
    /// The number of processes sharing the data. By default from
    /// WORLD_SIZE, or SLURM_NTASKS in an srun step.
    #[arg(long, requires = "rank", value_name = "W")]
    pub world_size: Option<usize>,
}

impl RankArgs {
    /// The rank in effect: `None` for a single process (a world of one,
    /// as `torchrun --nproc-per-node 1` sets, reads everything and counts
    /// nothing).
    pub fn resolve(&self) -> anyhow::Result<Option<Rank>> {
        let rank = self.resolve_with(|name| std::env::var(name).ok())?;
        Ok(rank.filter(|r| r.world_size() > 1))
    }

    /// [`resolve`](Self::resolve) with the environment looked up by `var`.
    pub fn resolve_with(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<Rank>> {
        let (Some(rank), Some(world)) = (self.rank, self.world_size) else {
            return Rank::from_vars(var).context(
                "the launcher's rank variables (override them with --rank and --world-size)",
            );
        };
        let flags = Rank::new(rank, world).context("--rank and --world-size")?;
        // The environment is only compared with: a flag overrides it, even
        // when it is broken.
        if let Ok(Some(env)) = Rank::from_vars(var)
            && env != flags
        {
            eprintln!(
                "tfpipe: note: --rank {rank} --world-size {world} override the launcher's rank {} of {}",
                env.rank(),
                env.world_size()
            );
        }
        Ok(Some(flags))
    }
}

/// Where a path names the rank: `--save ck-{rank}`.
pub const PLACEHOLDER: &str = "{rank}";

/// Makes each path this process's own: [`PLACEHOLDER`] becomes the rank (0
/// for a single process). With more than one rank, a path without it is
/// refused, naming its flag: the ranks would write over each other's
/// files, and a checkpoint would hold another rank's pipeline state (its
/// resume would read another share). `-` (stdout) is left alone.
pub fn per_rank_paths<const N: usize>(
    rank: Option<Rank>,
    paths: [(&str, &mut Option<PathBuf>); N],
) -> anyhow::Result<()> {
    let (r, world) = rank.map_or((0, 1), |rank| (rank.rank(), rank.world_size()));
    for (flag, path) in paths {
        let Some(given) = path.as_ref() else { continue };
        if given.as_os_str() == "-" {
            continue;
        }
        match given.to_str() {
            Some(text) if text.contains(PLACEHOLDER) => {
                *path = Some(PathBuf::from(text.replace(PLACEHOLDER, &r.to_string())));
            }
            _ if world > 1 => bail!(
                "{flag} {}: with {world} ranks every rank needs its own; put {PLACEHOLDER} in it \
                 (e.g. {flag} {}), which becomes the rank",
                given.display(),
                example(given)
            ),
            _ => {}
        }
    }
    Ok(())
}

/// `PATH-{rank}` (before the extension, if any).
fn example(path: &Path) -> String {
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => path
            .with_file_name(format!(
                "{}-{PLACEHOLDER}.{}",
                stem.to_string_lossy(),
                ext.to_string_lossy()
            ))
            .display()
            .to_string(),
        _ => format!("{}-{PLACEHOLDER}", path.display()),
    }
}

/// `cuda` on rank `LOCAL_RANK` of a node is `cuda:LOCAL_RANK`; any other
/// device name (`cpu`, `cuda:N`) is kept.
pub fn device(name: &str) -> anyhow::Result<String> {
    device_with(name, |n| std::env::var(n).ok())
}

fn device_with(name: &str, var: impl Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    if !name.trim().eq_ignore_ascii_case("cuda") {
        return Ok(name.to_string());
    }
    match Rank::local_rank_from_vars(var).context("the device index for --device cuda")? {
        Some(local) => Ok(format!("cuda:{local}")),
        None => Ok(name.to_string()),
    }
}

/// This rank's share of `files` (all of them for `None`). With `report`,
/// says on stderr what the share is and warns about balance.
pub fn share(
    files: TfRecordFiles,
    rank: Option<Rank>,
    remainder: Remainder,
    report: bool,
) -> anyhow::Result<TfRecordFiles> {
    let Some(rank) = rank else {
        return Ok(files);
    };
    let files = files.rank(rank, remainder)?;
    if let (true, Some(share)) = (report, files.rank_share()) {
        let by = match share.by {
            ShareBy::File => "whole files",
            ShareBy::Record => "a file split by record",
        };
        eprintln!(
            "tfpipe: rank {} of {}: {} of {} records per epoch ({by}; {} dropped on this rank, {} per epoch over all ranks, as DistributedSampler's drop_last)",
            rank.rank(),
            rank.world_size(),
            share.records,
            share.total_records,
            share.dropped,
            share.dropped_total
        );
        if let Some(warning) = &share.warning {
            eprintln!("tfpipe: warning: {warning}");
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn flags(rank: Option<usize>, world_size: Option<usize>) -> RankArgs {
        RankArgs { rank, world_size }
    }

    #[test]
    fn flags_override_the_environment() {
        let env = [("RANK", "1"), ("WORLD_SIZE", "4")];
        let got = flags(Some(0), Some(2)).resolve_with(vars(&env)).unwrap();
        assert_eq!(got, Some(Rank::new(0, 2).unwrap()));
        // Even a broken environment.
        let broken = [("RANK", "x")];
        let got = flags(Some(1), Some(2)).resolve_with(vars(&broken)).unwrap();
        assert_eq!(got, Some(Rank::new(1, 2).unwrap()));
    }

    #[test]
    fn the_environment_applies_without_flags() {
        let none = flags(None, None);
        assert_eq!(none.resolve_with(vars(&[])).unwrap(), None);
        let torchrun = [("RANK", "2"), ("WORLD_SIZE", "3"), ("LOCAL_RANK", "0")];
        assert_eq!(
            none.resolve_with(vars(&torchrun)).unwrap(),
            Some(Rank::new(2, 3).unwrap())
        );
        // Slurm only inside a step; RANK wins over it (torchrun under srun).
        let batch_script = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")];
        assert_eq!(none.resolve_with(vars(&batch_script)).unwrap(), None);
        let step = [
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
        ];
        assert_eq!(
            none.resolve_with(vars(&step)).unwrap(),
            Some(Rank::new(3, 4).unwrap())
        );
        let both = [
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
        ];
        assert_eq!(
            none.resolve_with(vars(&both)).unwrap(),
            Some(Rank::new(5, 16).unwrap())
        );
    }

    #[test]
    fn inconsistent_values_are_errors_that_name_their_source() {
        let err = flags(Some(2), Some(2)).resolve_with(vars(&[])).unwrap_err();
        assert!(
            format!("{err:#}").contains("--rank and --world-size"),
            "{err:#}"
        );
        let none = flags(None, None);
        for (env, needle) in [
            (&[("RANK", "1")][..], "WORLD_SIZE is not set"),
            (&[("WORLD_SIZE", "2")][..], "RANK is not set"),
            (&[("RANK", "one"), ("WORLD_SIZE", "2")][..], "RANK=\"one\""),
            (
                &[("RANK", "4"), ("WORLD_SIZE", "4")][..],
                "rank 4 of world size 4",
            ),
        ] {
            let err = none.resolve_with(vars(env)).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.contains(needle), "{text}");
            assert!(text.contains("--rank and --world-size"), "{text}");
        }
    }

    #[test]
    fn output_paths_are_per_rank() {
        let two = Some(Rank::new(1, 2).unwrap());
        let mut save = Some(PathBuf::from("ck-{rank}"));
        let mut json = Some(PathBuf::from("-"));
        let mut none = None;
        per_rank_paths(
            two,
            [
                ("--save", &mut save),
                ("--report-json", &mut json),
                ("--logdir", &mut none),
            ],
        )
        .unwrap();
        assert_eq!(save, Some(PathBuf::from("ck-1")));
        assert_eq!(json, Some(PathBuf::from("-")));
        assert_eq!(none, None);
        let mut shared = Some(PathBuf::from("out/report.json"));
        let err = per_rank_paths(two, [("--report-json", &mut shared)]).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("--report-json out/report.json: with 2 ranks"),
            "{text}"
        );
        assert!(text.contains("out/report-{rank}.json"), "{text}");
        // A single process may name the rank, or not.
        let mut single = Some(PathBuf::from("ck-{rank}"));
        let mut plain = Some(PathBuf::from("ck"));
        per_rank_paths(None, [("--save", &mut single), ("--resume", &mut plain)]).unwrap();
        assert_eq!((single, plain), (Some("ck-0".into()), Some("ck".into())));
    }

    #[test]
    fn cuda_takes_the_local_rank() {
        let env = [("LOCAL_RANK", "3")];
        assert_eq!(device_with("cuda", vars(&env)).unwrap(), "cuda:3");
        assert_eq!(device_with("cuda:1", vars(&env)).unwrap(), "cuda:1");
        assert_eq!(device_with("cpu", vars(&env)).unwrap(), "cpu");
        assert_eq!(device_with("cuda", vars(&[])).unwrap(), "cuda");
        let step = [("SLURM_STEP_ID", "0"), ("SLURM_LOCALID", "2")];
        assert_eq!(device_with("cuda", vars(&step)).unwrap(), "cuda:2");
        assert!(device_with("cuda", vars(&[("LOCAL_RANK", "x")])).is_err());
    }
}
