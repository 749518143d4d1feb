//! `shuffle`: a uniformly random pick from a bounded buffer (`tf.data`'s
//! algorithm), seeded, reshuffled each epoch.
//!
//! Normal mode fills the buffer with `buffer_size` elements before the first
//! output, as `tf.data` does; the fill time is this stage's `first_output_ns`
//! metric, so a slow start is visible. Early-start mode emits one element for
//! every two it reads until the buffer is full: the first output comes after
//! two reads instead of `buffer_size`, and the buffer reaches full size after
//! `2 * buffer_size` reads. The cost is weaker mixing at the start of each
//! epoch: output `k < buffer_size` is drawn from about `k + 2` candidates
//! rather than `buffer_size`, so the first elements of the input stay near the
//! front. After that the two modes behave alike.

use std::sync::Arc;

use super::state::{self, StageState, StageStream, StateError};
use super::{Clock, Env, Event, Pipeline, Sampler, Stream};
use crate::metrics::StageCounters;
use crate::rng::{SplitMix64, epoch_seed};

/// How [`Pipeline::shuffle_with`] shuffles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffleOptions {
    /// Elements held to pick from. By default 10,000.
    pub buffer_size: usize,
    /// The seed: the same seed gives the same order. By default 0.
    pub seed: u64,
    /// Use a different order each epoch (derived from the seed and the epoch
    /// number). By default `true`.
    pub reshuffle_each_epoch: bool,
    /// Start emitting before the buffer is full (see the module docs for the
    /// effect on randomness). By default `false`.
    pub early_start: bool,
}

impl Default for ShuffleOptions {
    fn default() -> Self {
        ShuffleOptions {
            buffer_size: 10_000,
            seed: 0,
            reshuffle_each_epoch: true,
            early_start: false,
        }
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// Shuffles with a buffer of `buffer_size` elements and `seed`,
    /// reshuffling each epoch. Each epoch's output is a permutation of its
    /// input: an epoch marker drains the buffer before passing.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let mut v: Vec<u32> = Pipeline::from_vec((0..100).collect()).shuffle(10, 42).start()?.collect::<Result<_, _>>()?;
    /// assert_ne!(v, (0..100).collect::<Vec<_>>());
    /// v.sort();
    /// assert_eq!(v, (0..100).collect::<Vec<_>>());
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn shuffle(self, buffer_size: usize, seed: u64) -> Pipeline<T> {
        self.shuffle_with(ShuffleOptions {
            buffer_size,
            seed,
            ..ShuffleOptions::default()
        })
    }

    /// Shuffles with all the options.
    pub fn shuffle_with(self, options: ShuffleOptions) -> Pipeline<T> {
        self.invalid_if(options.buffer_size == 0, "shuffle", || {
            "the buffer size must be positive".into()
        })
        .then("shuffle", move |env, up, counters| {
            let mut shuffle = Shuffle::new(env, up, counters, options);
            if let Some(state) = env.resume_state()
                && let Err(error) = shuffle.restore(state)
            {
                env.restore_failed(error);
            }
            Box::new(shuffle) as Stream<T>
        })
    }
}

struct Shuffle<T> {
    up: Stream<T>,
    counters: Arc<StageCounters>,
    env: Env,
    options: ShuffleOptions,
    buffer: Vec<T>,
    rng: SplitMix64,
    /// Epochs seen by this stage (the build epoch plus markers passed).
    epoch: u64,
    /// The buffer has been full this epoch (early start stops emitting early).
    reached_full: bool,
    read_this_epoch: u64,
    emitted_this_epoch: u64,
    /// Draining: upstream ended (`marker` None) or sent this marker.
    draining: bool,
    marker: Option<u64>,
    finished: bool,
    first_output: bool,
    /// Times about one steady-state call in [`Sampler::MEAN_GAP`].
    sampler: Sampler,
}

impl<T> Shuffle<T> {
    fn new(
        env: &Env,
        up: Stream<T>,
        counters: Arc<StageCounters>,
        options: ShuffleOptions,
    ) -> Self {
        let mut s = Shuffle {
            up,
            counters,
            env: env.clone(),
            options,
            buffer: Vec::new(),
            rng: SplitMix64(0),
            epoch: env.epoch,
            reached_full: false,
            read_this_epoch: 0,
            emitted_this_epoch: 0,
            draining: false,
            marker: None,
            finished: false,
            first_output: true,
            sampler: Sampler::new(),
        };
        s.reseed();
        s
    }

    fn reseed(&mut self) {
        let epoch = if self.options.reshuffle_each_epoch {
            self.epoch
        } else {
            0
        };
        let mut mix = SplitMix64(epoch_seed(self.options.seed, epoch));
        self.rng = SplitMix64(mix.next_u64());
        self.reached_full = false;
        self.read_this_epoch = 0;
        self.emitted_this_epoch = 0;
    }

    fn pick(&mut self) -> T {
        let i = self.rng.below(self.buffer.len() as u64) as usize;
        self.emitted_this_epoch += 1;
        self.buffer.swap_remove(i)
    }

    /// Asks the CPU for the slot the next steady-state pick will take.
    /// The pick is a uniform index into a buffer larger than the caches
    /// (10,000 records' handles, 480 KB), so without this each pick stalls
    /// on a cache miss; the pull of the next element hides the wait. The
    /// index comes from a copy of the generator, so the order and the
    /// saved state are untouched.
    fn prefetch_next_pick(&self) {
        let mut rng = self.rng;
        let next = rng.below(self.buffer.len() as u64) as usize;
        if let Some(slot) = self.buffer.get(next) {
            prefetch_value(slot);
        }
    }

    fn step(&mut self, clock: &mut Clock) -> Option<Event<T>> {
        loop {
            if self.draining {
                if !self.buffer.is_empty() {
                    return Some(Event::Item(Ok(self.pick())));
                }
                self.draining = false;
                match self.marker.take() {
                    Some(marker) => {
                        self.epoch += 1;
                        self.reseed();
                        return Some(Event::EpochEnd(marker));
                    }
                    None => {
                        self.finished = true;
                        self.buffer = Vec::new();
                        return None;
                    }
                }
            }
            if self.read_this_epoch % 4096 == 4095 && self.env.cancelled() {
                self.finished = true;
                return None;
            }
            match clock.pull_next(&mut self.up) {
                Some(Event::Item(Ok(item))) => {
                    self.read_this_epoch += 1;
                    let cap = self.options.buffer_size;
                    if self.buffer.len() < cap {
                        if self.buffer.capacity() == 0 {
                            // Grow to the first fill's needs only, up to the buffer size.
                            self.buffer.reserve(cap.min(1024));
                        }
                        self.buffer.push(item);
                        if self.buffer.len() == cap {
                            self.reached_full = true;
                        }
                        if self.options.early_start
                            && !self.reached_full
                            && self.read_this_epoch >= 2 * self.emitted_this_epoch + 2
                        {
                            return Some(Event::Item(Ok(self.pick())));
                        }
                    } else {
                        let i = self.rng.below(cap as u64) as usize;
                        self.emitted_this_epoch += 1;
                        let out = std::mem::replace(&mut self.buffer[i], item);
                        self.prefetch_next_pick();
                        return Some(Event::Item(Ok(out)));
                    }
                }
                Some(Event::Item(Err(err))) => return Some(Event::Item(Err(err))),
                Some(Event::EpochEnd(marker)) => {
                    self.draining = true;
                    self.marker = Some(marker);
                }
                None => {
                    self.draining = true;
                    self.marker = None;
                }
            }
        }
    }
}

impl<T: Send + 'static> Iterator for Shuffle<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        if self.finished {
            return None;
        }
        // Only steady-state calls (buffer full: one pull, one swap) are
        // sampled; filling and draining calls differ from them and are timed
        // exactly.
        let forced =
            self.first_output || self.draining || self.buffer.len() < self.options.buffer_size;
        let mut clock = self.sampler.clock(forced);
        let out = self.step(&mut clock);
        if let Some(Event::Item(Ok(_))) = &out {
            self.counters.add_in(1, 0);
            self.counters.add_out(1, 0);
            if self.first_output {
                self.first_output = false;
                self.counters.set_first_output(clock.elapsed());
            }
        }
        self.sampler.finish(clock, forced, &self.counters);
        if !matches!(out, Some(Event::Item(_))) {
            self.sampler.flush(&self.counters);
        }
        out
    }
}

/// Asks the CPU to bring `value` (the one or two cache lines it lies on)
/// into cache: a hint with no effect on the program's meaning.
#[inline(always)]
fn prefetch_value<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let first = (value as *const T).cast::<i8>();
        // The value may straddle two lines: ask for its first and last byte.
        let last = first.wrapping_add(size_of::<T>().saturating_sub(1));
        for at in [first, last] {
            // SAFETY: a prefetch never faults and changes nothing the
            // program can see; both addresses are inside a live value.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// What a shuffle stores besides its buffer (which goes as positions).
#[derive(serde::Serialize, serde::Deserialize)]
struct ShuffleState {
    rng: u64,
    epoch: u64,
    reached_full: bool,
    read_this_epoch: u64,
    emitted_this_epoch: u64,
    draining: bool,
    marker: Option<u64>,
    finished: bool,
    first_output: bool,
}

impl<T: Send + 'static> StageStream<T> for Shuffle<T> {
    fn save(&self) -> Result<StageState, StateError> {
        let data = ShuffleState {
            rng: self.rng.0,
            epoch: self.epoch,
            reached_full: self.reached_full,
            read_this_epoch: self.read_this_epoch,
            emitted_this_epoch: self.emitted_this_epoch,
            draining: self.draining,
            marker: self.marker,
            finished: self.finished,
            first_output: self.first_output,
        };
        let mut state = StageState::new("shuffle", serde_json::json!(data));
        state.records = state::positions_of("shuffle", &self.buffer)?;
        if !self.finished {
            state = state.with_input(self.up.save()?);
        }
        Ok(state)
    }
}

impl<T: 'static> Shuffle<T> {
    /// Takes a saved state: counters, RNG, and the buffer re-read from
    /// its records' positions (in the same order, so picks agree).
    fn restore(&mut self, state: &StageState) -> Result<(), StateError> {
        let data: ShuffleState = state.data("shuffle")?;
        self.rng = SplitMix64(data.rng);
        self.epoch = data.epoch;
        self.reached_full = data.reached_full;
        self.read_this_epoch = data.read_this_epoch;
        self.emitted_this_epoch = data.emitted_this_epoch;
        self.draining = data.draining;
        self.marker = data.marker;
        self.finished = data.finished;
        self.first_output = data.first_output;
        self.buffer = state::reread("shuffle", &state.records)?;
        Ok(())
    }
}
