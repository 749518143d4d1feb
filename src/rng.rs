//! The crate's one seeded random number generator, and its one formula for
//! an epoch's seed.
//!
//! Everything random in tfpipe draws from [`SplitMix64`]: shuffle buffers,
//! the global shuffle, validation splits, weight initialisation and generated
//! token data; every per-epoch reshuffle seeds from [`epoch_seed`]. Seeded
//! results are promised to stay the same across versions, so neither may
//! change (tests pin their outputs).

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): small, fast, and good enough to pick indices
/// and draw weights. Its whole state is the one `u64`, which iterator state
/// saves as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n >= 1`), by Lemire's multiply-shift: the bias,
    /// below `n / 2^64`, is far under anything a shuffle or split can show.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The seed of epoch `epoch` of a run seeded with `seed`.
///
/// The seed scheme of training is the pipeline's: a run seeded `seed`
/// shuffles with `shuffle(buffer, seed)` inside one `repeat`, and the
/// shuffle reseeds itself for each epoch with this formula. It is also the
/// seed that gives epoch `epoch`'s order to a *single pass* shuffled with
/// `reshuffle_each_epoch: false` (how a run resumed without a pipeline state
/// reads its first epoch, exactly as the uninterrupted run would have):
/// `shuffle_with(ShuffleOptions { seed: epoch_seed(seed, e),
/// reshuffle_each_epoch: false, .. })` yields epoch `e` of `shuffle(buffer,
/// seed).repeat(None)` (`tests/train.rs` checks that they agree).
///
/// ```
/// use tfpipe::train::epoch_seed;
/// assert_eq!(epoch_seed(7, 0), 7);
/// assert_ne!(epoch_seed(7, 1), epoch_seed(7, 2));
/// ```
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    seed ^ epoch.wrapping_mul(0xA076_1D64_78BD_642F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_fixed_forever() {
        // The reference values of SplitMix64 seeded with 0.
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(epoch_seed(1, 1), 1 ^ 0xA076_1D64_78BD_642F);
    }

    #[test]
    fn below_stays_in_range_and_unit_in_zero_one() {
        let mut rng = SplitMix64(42);
        for n in [1u64, 2, 3, 1000, u64::MAX] {
            assert!(rng.below(n) < n);
        }
        assert!((0.0..1.0).contains(&rng.unit()));
    }
}
