//! Combining pipelines: [`zip`](Pipeline::zip) and [`zip_all`](Pipeline::zip_all), [`concatenate`](Pipeline::concatenate),
//! [`sample_from`](Pipeline::sample_from) (weighted, seeded) and
//! [`choose_from`](Pipeline::choose_from) (a selector pipeline picks), with
//! the semantics of `tf.data`'s `Dataset.zip`, `concatenate`,
//! `sample_from_datasets` and `choose_from_datasets`.
//!
//! Each input is a whole pipeline of its own, built when the combined one
//! starts (and again each epoch under `repeat`): it keeps its own stages,
//! threads (a `prefetch`, `map_parallel` or parallel `interleave` inside it)
//! and errors. The combining stage pulls its inputs on the thread that pulls
//! it, so an input that should run ahead of the mixture needs its own
//! `prefetch`.
//!
//! Invariants:
//! - **Epoch markers** of the inputs are dropped: an input's `repeat` only
//!   makes it longer (`tf.data` has no markers; its `repeat` inside an input
//!   is the same). The combined pipeline may be repeated itself; each pass
//!   rebuilds every input at the new epoch, so their shuffles reshuffle, and
//!   `sample_from` draws a new sequence (seeded from the seed and the epoch,
//!   as `shuffle` reseeds).
//! - **Errors** from an input arrive as [`PipelineError::Source`], naming the
//!   input (`sample_from[1]`) and its first file where it reads files; the
//!   combined pipeline goes on after one, as every stage does.
//! - **Metrics**: input `i`'s stages are named `OP[i]/stage`, and a row
//!   `OP[i]` after them counts what the combining stage took from that input
//!   and the time it waited on it (sampled, as the file source samples). The
//!   input the mixture waited on most is the one that starves it
//!   ([`PipelineMetrics::starving_input`](crate::PipelineMetrics::starving_input)).
//! - **State**: the stage's own fields (cursor, RNG, done) and one state per
//!   input (`end` for an exhausted one), so a combined pipeline resumes
//!   exactly where it stood, each input at its own position.
//! - An exhausted input is dropped at once (its threads joined); a finished
//!   combined pipeline drops every input.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::state::{END, StageState, StageStream, StateError};
use super::{Env, Event, Invalid, Pipeline, PipelineError, Sampler, Stream, byte_size};
use crate::metrics::StageCounters;
use crate::rng::{SplitMix64, epoch_seed};

/// What [`Pipeline::sample_from`] does when the input it drew is exhausted
/// (`tf.data`'s `stop_on_empty_dataset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exhausted {
    /// End the mixture at once (`stop_on_empty_dataset=True`): the
    /// proportions hold to the end, and the shortest input (relative to its
    /// weight) ends the mixture.
    Stop,
    /// Drop the input and draw again among the others, their weights
    /// renormalised (`stop_on_empty_dataset=False`, `tf.data`'s default for
    /// `sample_from_datasets`): every element of every input comes out.
    #[default]
    Renormalize,
}

/// One weighted source of a mixture of TFRecord files, as the command
/// line's `--mix 'GLOB=WEIGHT'` names it: paths, a glob or a dataset
/// directory, and its weight for [`Pipeline::sample_from`].
///
/// Parsed from `PATTERN=WEIGHT`, split at the last `=` (so partition
/// directories such as `out/year=2024/` stay in the pattern):
///
/// ```
/// use tfpipe::pipeline::MixSource;
/// let s: MixSource = "web/*.tfrecord=0.7".parse()?;
/// assert_eq!((s.files.as_str(), s.weight), ("web/*.tfrecord", 0.7));
/// let p: MixSource = "out/lang=en/=2".parse()?;
/// assert_eq!((p.files.as_str(), p.weight), ("out/lang=en/", 2.0));
/// assert!("web/*.tfrecord".parse::<MixSource>().is_err());
/// assert!("web/*=-1".parse::<MixSource>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MixSource {
    /// The files: a path, glob, directory or URL.
    pub files: String,
    /// The source's weight (finite, not negative).
    pub weight: f64,
}

impl std::str::FromStr for MixSource {
    type Err = String;

    fn from_str(text: &str) -> Result<MixSource, String> {
        let usage = || {
            format!(
                "{text:?}: expected FILES=WEIGHT (a glob, directory or path, and a number >= 0), e.g. 'web/*.tfrecord=0.7'"
            )
        };
        let (files, weight) = text.rsplit_once('=').ok_or_else(usage)?;
        let weight: f64 = weight.trim().parse().map_err(|_| usage())?;
        if files.is_empty() || !weight.is_finite() || weight < 0.0 {
            return Err(usage());
        }
        Ok(MixSource {
            files: files.to_string(),
            weight,
        })
    }
}

/// Splits `total` (files open at once, reader threads) between the inputs
/// of a mixture in proportion to their weights, at least 1 each, so that a
/// mixture of sources keeps as many files open as one source would
/// (largest remainder; ties go to the earlier input). With as many inputs
/// as `total` or more, every input gets 1 and the sum is the number of
/// inputs.
///
/// ```
/// use tfpipe::pipeline::split_by_weight;
/// assert_eq!(split_by_weight(4, &[3.0, 3.0, 2.0]), [2, 1, 1]);
/// assert_eq!(split_by_weight(8, &[0.7, 0.3]), [6, 2]);
/// assert_eq!(split_by_weight(2, &[1.0, 1.0, 1.0]), [1, 1, 1]);
/// assert_eq!(split_by_weight(4, &[100.0, 1.0, 1.0]), [2, 1, 1]);
/// ```
pub fn split_by_weight(total: usize, weights: &[f64]) -> Vec<usize> {
    let n = weights.len();
    let positive = |w: f64| if w.is_finite() && w > 0.0 { w } else { 0.0 };
    let sum: f64 = weights.iter().map(|w| positive(*w)).sum();
    if total <= n || sum <= 0.0 {
        return vec![1; n];
    }
    let exact: Vec<f64> = weights
        .iter()
        .map(|w| positive(*w) / sum * total as f64)
        .collect();
    let mut shares: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut order: Vec<usize> = (0..n).collect();
    let fraction = |i: usize| exact[i] - exact[i].floor();
    order.sort_by(|&a, &b| fraction(b).total_cmp(&fraction(a)));
    let left = total.saturating_sub(shares.iter().sum());
    for &i in order.iter().take(left) {
        shares[i] += 1;
    }
    // Every input reads at least one file: the largest shares give way.
    while let Some(empty) = shares.iter().position(|s| *s == 0) {
        shares[empty] = 1;
        // Among the largest, the lightest gives way (so heavier never gets less).
        let largest = (0..n).filter(|i| shares[*i] > 1).max_by(|&a, &b| {
            (shares[a].cmp(&shares[b])).then(positive(weights[b]).total_cmp(&positive(weights[a])))
        });
        if let Some(largest) = largest {
            shares[largest] -= 1;
        }
    }
    shares
}

/// Salt for the sampling RNG, so that a `sample_from` and a `shuffle` given
/// the same seed do not draw the same stream.
const SAMPLE_SALT: u64 = 0x6D69_7874_7572_6573;

impl<T: Send + 'static> Pipeline<T> {
    /// Pairs the elements of `self` and `other` (`tf.data`'s `Dataset.zip`):
    /// ends when either ends (when `self` ends, `other` is not pulled again;
    /// when `other` ends, the element just taken from `self` is dropped, as
    /// `tf.data` does). An error from either input takes the pair's place.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let pairs: Vec<(u32, char)> = Pipeline::from_vec(vec![1u32, 2, 3])
    ///     .zip(Pipeline::from_vec(vec!['a', 'b']))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(pairs, [(1, 'a'), (2, 'b')]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn zip<U: Send + 'static>(self, other: Pipeline<U>) -> Pipeline<(T, U)> {
        let error = first_invalid([&self.error, &other.error]);
        let origin = self.origin.clone().or_else(|| other.origin.clone());
        let mut out = Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "zip");
            let (saved, inputs) = resumed::<Done>(env, "zip", 2);
            let mut zip = Zip {
                a: Input::start(&self, env, 0, "zip", inputs.as_ref().map(|s| &s[0])),
                b: Input::start(&other, env, 1, "zip", inputs.as_ref().map(|s| &s[1])),
                done: saved.unwrap_or_default(),
                counters,
                env: env.clone(),
            };
            if zip.done.done {
                zip.finish();
            }
            Box::new(zip) as Stream<(T, U)>
        });
        out.error = error;
        out.origin = origin;
        out
    }

    /// Zips any number of pipelines of one element type (`tf.data`'s
    /// `Dataset.zip(*datasets)`): the `i`-th output holds the `i`-th element
    /// of every input, in input order, and the stream ends when any input
    /// ends (the elements already taken from the inputs before it are
    /// dropped, as [`zip`](Self::zip) drops them). An error from an input
    /// takes the element's place, naming the input (`zip[1]`). No inputs is
    /// a configuration error.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let rows: Vec<Vec<u32>> = Pipeline::zip_all(vec![
    ///     Pipeline::from_vec(vec![1, 2, 3]),
    ///     Pipeline::from_vec(vec![10, 20]),
    ///     Pipeline::from_vec(vec![100, 200, 300]),
    /// ])
    /// .start()?
    /// .collect::<Result<_, _>>()?;
    /// assert_eq!(rows, [vec![1, 10, 100], vec![2, 20, 200]]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn zip_all(inputs: Vec<Pipeline<T>>) -> Pipeline<Vec<T>> {
        let empty = inputs.is_empty();
        let error = first_invalid(inputs.iter().map(|p| &p.error));
        let origin = inputs.iter().find_map(|p| p.origin.clone());
        let n = inputs.len();
        let mut out = Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "zip");
            let (saved, states) = resumed::<Done>(env, "zip", n);
            let mut zip = ZipAll {
                inputs: start_inputs(&inputs, env, "zip", states.as_deref()),
                done: saved.unwrap_or_default(),
                counters,
                env: env.clone(),
            };
            if zip.done.done {
                zip.finish();
            }
            Box::new(zip) as Stream<Vec<T>>
        });
        out.error = error;
        out.origin = origin;
        out.invalid_if(empty, "zip", || "needs at least one input".into())
    }

    /// The elements of `self`, then those of `other` (`tf.data`'s
    /// `concatenate`). Both are built at start (so `other`'s threads begin
    /// prefetching at once); a `batch` after it fills batches across the
    /// join, as in `tf.data`.
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let v: Vec<u32> = Pipeline::from_vec(vec![1u32, 2])
    ///     .concatenate(Pipeline::from_vec(vec![7, 8, 9]))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, [1, 2, 7, 8, 9]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn concatenate(self, other: Pipeline<T>) -> Pipeline<T> {
        let error = first_invalid([&self.error, &other.error]);
        let origin = self.origin.clone().or_else(|| other.origin.clone());
        let pipelines = [self, other];
        let mut out = Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "concatenate");
            let (saved, inputs) = resumed::<ConcatState>(env, "concatenate", 2);
            let inputs = start_inputs(&pipelines, env, "concatenate", inputs.as_deref());
            Box::new(Concat {
                inputs,
                current: saved.unwrap_or_default().current,
                counters,
                env: env.clone(),
            }) as Stream<T>
        });
        out.error = error;
        out.origin = origin;
        out
    }

    /// A weighted, seeded mixture (`tf.data`'s `sample_from_datasets`): each
    /// element comes from input `i` with probability `weights[i] / sum`,
    /// drawn from an RNG seeded with `seed` (and the epoch, under `repeat`),
    /// so the same seed gives the same sequence. `exhausted` says what
    /// happens when the drawn input has ended. Weights must be finite, not
    /// negative, one per input, and not all zero (else
    /// [`start`](Self::start) fails); an input of weight 0 is never drawn.
    ///
    /// ```
    /// use tfpipe::pipeline::{Exhausted, Pipeline};
    /// let web = Pipeline::from_generator(|| std::iter::repeat("web"));
    /// let books = Pipeline::from_generator(|| std::iter::repeat("books"));
    /// let mix: Vec<&str> = Pipeline::sample_from(vec![web, books], &[0.7, 0.3], 42, Exhausted::Stop)
    ///     .take(1000)
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// let web_share = mix.iter().filter(|s| **s == "web").count();
    /// assert!((600..800).contains(&web_share), "{web_share}");
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn sample_from(
        inputs: Vec<Pipeline<T>>,
        weights: &[f64],
        seed: u64,
        exhausted: Exhausted,
    ) -> Pipeline<T> {
        let problem = weights_problem(inputs.len(), weights);
        let error = first_invalid(inputs.iter().map(|p| &p.error));
        let origin = inputs.iter().find_map(|p| p.origin.clone());
        let weights: Arc<[f64]> = weights.into();
        let n = inputs.len();
        let mut out = Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "sample_from");
            let (saved, states) = resumed::<SampleState>(env, "sample_from", n);
            let seeded = SampleState {
                rng: SplitMix64(epoch_seed(seed, env.epoch) ^ SAMPLE_SALT).0,
                done: false,
            };
            let saved = saved.unwrap_or(seeded);
            let mut sample = Sample {
                inputs: start_inputs(&inputs, env, "sample_from", states.as_deref()),
                weights: Arc::clone(&weights),
                rng: SplitMix64(saved.rng),
                exhausted,
                done: saved.done,
                counters,
                env: env.clone(),
            };
            if sample.done {
                sample.finish();
            }
            Box::new(sample) as Stream<T>
        });
        out.error = error;
        out.origin = origin;
        match problem {
            Some(message) => out.invalid("sample_from", || message),
            None => out,
        }
    }

    /// Takes each element from the input that `selector` names
    /// (`tf.data`'s `choose_from_datasets`): the selector's `k`-th element
    /// `i` means "the next element of input `i`". Ends when the selector
    /// ends or names an exhausted input (`stop_on_empty_dataset=True`,
    /// `tf.data`'s default); a selector value out of range is an error item
    /// (and the mixture goes on).
    ///
    /// ```
    /// use tfpipe::pipeline::Pipeline;
    /// let inputs = vec![Pipeline::from_vec(vec!["a0", "a1"]), Pipeline::from_vec(vec!["b0", "b1"])];
    /// let v: Vec<&str> = Pipeline::choose_from(inputs, Pipeline::from_vec(vec![1usize, 0, 0, 1]))
    ///     .start()?
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(v, ["b0", "a0", "a1", "b1"]);
    /// # Ok::<(), tfpipe::pipeline::PipelineError>(())
    /// ```
    pub fn choose_from(inputs: Vec<Pipeline<T>>, selector: Pipeline<usize>) -> Pipeline<T> {
        let empty = inputs.is_empty();
        let error = first_invalid(inputs.iter().map(|p| &p.error).chain([&selector.error]));
        let origin = inputs.iter().find_map(|p| p.origin.clone());
        let n = inputs.len();
        let mut out = Pipeline::from_build(move |env: &Env| {
            let counters = env.stage(0, "choose_from");
            let (saved, states) = resumed::<Done>(env, "choose_from", n + 1);
            let mut choose = Choose {
                inputs: start_inputs(
                    &inputs,
                    env,
                    "choose_from",
                    states.as_ref().map(|s| &s[..n]),
                ),
                selector: Input::start_named(
                    &selector,
                    env,
                    n,
                    "choose_from[selector]".to_string(),
                    states.as_ref().map(|s| &s[n]),
                ),
                done: saved.unwrap_or_default(),
                counters,
                env: env.clone(),
            };
            if choose.done.done {
                choose.finish();
            }
            Box::new(choose) as Stream<T>
        });
        out.error = error;
        out.origin = origin;
        out.invalid_if(empty, "choose_from", || "needs at least one input".into())
    }
}

/// The first configuration error among the inputs.
fn first_invalid<'a>(errors: impl IntoIterator<Item = &'a Option<Invalid>>) -> Option<Invalid> {
    errors.into_iter().flatten().next().cloned()
}

/// What is wrong with `weights` for `inputs` inputs, if anything.
fn weights_problem(inputs: usize, weights: &[f64]) -> Option<String> {
    if inputs == 0 {
        return Some("needs at least one input".into());
    }
    if weights.len() != inputs {
        return Some(format!("{} weights for {inputs} inputs", weights.len()));
    }
    if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
        return Some(format!("weight {w} is not a finite number >= 0"));
    }
    if weights.iter().sum::<f64>() <= 0.0 {
        return Some("the weights are all zero".into());
    }
    None
}

/// The combined stage's saved fields and its inputs' states, when it is
/// being restored (`(None, None)` when starting afresh). A state of another
/// shape is reported, and the stage starts afresh (the start then fails).
fn resumed<D: for<'de> Deserialize<'de>>(
    env: &Env,
    op: &str,
    inputs: usize,
) -> (Option<D>, Option<Vec<StageState>>) {
    let Some(state) = env.resume_state() else {
        return (None, None);
    };
    match state.data::<D>(op) {
        Ok(data) if state.inputs.len() == inputs => (Some(data), Some(state.inputs.clone())),
        Ok(_) => {
            env.restore_failed(StateError::mismatch(
                op,
                format!(
                    "{} inputs in the state, {inputs} in the pipeline",
                    state.inputs.len()
                ),
            ));
            (None, None)
        }
        Err(error) => {
            env.restore_failed(error);
            (None, None)
        }
    }
}

/// Starts `pipelines` as inputs `0..` of the combined stage `op`.
fn start_inputs<T: Send + 'static>(
    pipelines: &[Pipeline<T>],
    env: &Env,
    op: &str,
    states: Option<&[StageState]>,
) -> Vec<Input<T>> {
    pipelines
        .iter()
        .enumerate()
        .map(|(i, p)| Input::start(p, env, i, op, states.map(|s| &s[i])))
        .collect()
}

/// One input of a combined stage: its running stages (`None` once
/// exhausted), its name and first file (for errors), and its metrics row.
struct Input<T> {
    stream: Option<Stream<T>>,
    name: String,
    origin: Option<Arc<str>>,
    row: Arc<StageCounters>,
    sampler: Sampler,
}

impl<T: Send + 'static> Input<T> {
    /// Input `index` of `op`, named `op[index]`.
    fn start(
        pipeline: &Pipeline<T>,
        env: &Env,
        index: usize,
        op: &str,
        resume: Option<&StageState>,
    ) -> Input<T> {
        Input::start_named(pipeline, env, index, format!("{op}[{index}]"), resume)
    }

    /// Builds the input's stages (restored from `resume`; none for an
    /// input saved as exhausted).
    fn start_named(
        pipeline: &Pipeline<T>,
        env: &Env,
        index: usize,
        name: String,
        resume: Option<&StageState>,
    ) -> Input<T> {
        let stream = match resume {
            Some(state) if state.stage == END => None,
            resume => {
                let input_env = env.input(0, index, &name).resuming(resume.cloned());
                let stream = pipeline.build_stream(&input_env);
                input_env.check_claimed(&name);
                Some(stream)
            }
        };
        Input {
            stream,
            row: env.input_row(0, index, &name),
            name,
            origin: pipeline.origin.clone(),
            sampler: Sampler::new(),
        }
    }

    /// The next element or error (markers dropped); `None` once exhausted.
    fn next(&mut self) -> Option<Result<T, PipelineError>> {
        loop {
            let stream = self.stream.as_mut()?;
            let mut clock = self.sampler.clock(false);
            let event = clock.pull(stream);
            self.sampler.finish(clock, false, &self.row);
            match event {
                Some(Event::Item(Ok(x))) => {
                    let bytes = byte_size(&x);
                    self.row.add_in(1, bytes);
                    self.row.add_out(1, bytes);
                    return Some(Ok(x));
                }
                Some(Event::Item(Err(error))) => {
                    self.row.add_error();
                    return Some(Err(self.wrap(error)));
                }
                Some(Event::EpochEnd(_)) => {}
                None => {
                    self.close();
                    return None;
                }
            }
        }
    }

    /// Drops the input's stages, joining their threads.
    fn close(&mut self) {
        self.sampler.flush(&self.row);
        self.stream = None;
    }

    fn wrap(&self, error: PipelineError) -> PipelineError {
        PipelineError::Source {
            input: self.name.clone(),
            origin: self.origin.as_deref().map(str::to_string),
            error: Box::new(error),
        }
    }

    fn save(&self) -> Result<StageState, StateError> {
        match &self.stream {
            Some(stream) => stream.save(),
            None => Ok(StageState::new(END, serde_json::Value::Null)),
        }
    }
}

/// Saves a combined stage: its own fields, then each input's state.
fn save_combined<D: Serialize>(
    op: &str,
    data: &D,
    inputs: impl IntoIterator<Item = Result<StageState, StateError>>,
) -> Result<StageState, StateError> {
    let mut state = StageState::new(op, serde_json::json!(data));
    for input in inputs {
        state = state.with_input(input?);
    }
    Ok(state)
}

/// The one field of `zip` and `choose_from`: whether the stage has ended.
#[derive(Default, Serialize, Deserialize)]
struct Done {
    done: bool,
}

struct Zip<A, B> {
    a: Input<A>,
    b: Input<B>,
    done: Done,
    counters: Arc<StageCounters>,
    env: Env,
}

impl<A: Send + 'static, B: Send + 'static> Zip<A, B> {
    fn finish(&mut self) {
        self.done.done = true;
        self.a.close();
        self.b.close();
    }

    fn step(&mut self) -> Option<Result<(A, B), PipelineError>> {
        if self.done.done || self.env.cancelled() {
            return None;
        }
        let pair = match self.a.next() {
            Some(Ok(x)) => match self.b.next() {
                Some(Ok(y)) => Ok((x, y)),
                Some(Err(error)) => Err(error),
                None => {
                    self.finish();
                    return None;
                }
            },
            Some(Err(error)) => Err(error),
            None => {
                self.finish();
                return None;
            }
        };
        Some(pair)
    }
}

impl<A: Send + 'static, B: Send + 'static> Iterator for Zip<A, B> {
    type Item = Event<(A, B)>;

    fn next(&mut self) -> Option<Event<(A, B)>> {
        let item = self.step()?;
        count(&self.counters, &item, 2);
        Some(Event::Item(item))
    }
}

impl<A: Send + 'static, B: Send + 'static> StageStream<(A, B)> for Zip<A, B> {
    fn save(&self) -> Result<StageState, StateError> {
        save_combined("zip", &self.done, [self.a.save(), self.b.save()])
    }
}

struct ZipAll<T> {
    inputs: Vec<Input<T>>,
    done: Done,
    counters: Arc<StageCounters>,
    env: Env,
}

impl<T: Send + 'static> ZipAll<T> {
    fn finish(&mut self) {
        self.done.done = true;
        self.inputs.iter_mut().for_each(Input::close);
    }

    /// One element from each input in turn; the first error stops the
    /// round (the inputs after it are not pulled, as in [`Zip`]).
    fn step(&mut self) -> Option<Result<Vec<T>, PipelineError>> {
        if self.done.done || self.env.cancelled() {
            return None;
        }
        let mut row = Vec::with_capacity(self.inputs.len());
        for input in &mut self.inputs {
            match input.next() {
                Some(Ok(x)) => row.push(x),
                Some(Err(error)) => return Some(Err(error)),
                None => {
                    self.finish();
                    return None;
                }
            }
        }
        Some(Ok(row))
    }
}

impl<T: Send + 'static> Iterator for ZipAll<T> {
    type Item = Event<Vec<T>>;

    fn next(&mut self) -> Option<Event<Vec<T>>> {
        let item = self.step()?;
        count(&self.counters, &item, self.inputs.len() as u64);
        Some(Event::Item(item))
    }
}

impl<T: Send + 'static> StageStream<Vec<T>> for ZipAll<T> {
    fn save(&self) -> Result<StageState, StateError> {
        save_combined("zip", &self.done, self.inputs.iter().map(Input::save))
    }
}

/// Counts an element (or error) the combined stage hands on, made of
/// `taken` elements of its inputs (one, or one per input for a zip).
fn count<T: 'static>(counters: &StageCounters, item: &Result<T, PipelineError>, taken: u64) {
    match item {
        Ok(x) => {
            let bytes = byte_size(x);
            counters.add_in(taken, bytes);
            counters.add_out(1, bytes);
        }
        Err(_) => counters.add_error(),
    }
}

/// What a `concatenate` stores: the input being read.
#[derive(Default, Serialize, Deserialize)]
struct ConcatState {
    current: usize,
}

struct Concat<T> {
    inputs: Vec<Input<T>>,
    current: usize,
    counters: Arc<StageCounters>,
    env: Env,
}

impl<T: Send + 'static> Iterator for Concat<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        while !self.env.cancelled() {
            let input = self.inputs.get_mut(self.current)?;
            if let Some(item) = input.next() {
                count(&self.counters, &item, 1);
                return Some(Event::Item(item));
            }
            self.current += 1;
        }
        None
    }
}

impl<T: Send + 'static> StageStream<T> for Concat<T> {
    fn save(&self) -> Result<StageState, StateError> {
        let data = ConcatState {
            current: self.current,
        };
        save_combined("concatenate", &data, self.inputs.iter().map(Input::save))
    }
}

/// What a `sample_from` stores besides its inputs: the RNG and whether it ended.
#[derive(Serialize, Deserialize)]
struct SampleState {
    rng: u64,
    done: bool,
}

struct Sample<T> {
    inputs: Vec<Input<T>>,
    weights: Arc<[f64]>,
    rng: SplitMix64,
    exhausted: Exhausted,
    done: bool,
    counters: Arc<StageCounters>,
    env: Env,
}

impl<T: Send + 'static> Sample<T> {
    fn finish(&mut self) {
        self.done = true;
        self.inputs.iter_mut().for_each(Input::close);
    }

    /// Draws an input among those not exhausted, by weight; `None` when no
    /// input of positive weight is left.
    fn draw(&mut self) -> Option<usize> {
        let open = |i: &usize| self.inputs[*i].stream.is_some() && self.weights[*i] > 0.0;
        let total: f64 = (0..self.inputs.len())
            .filter(open)
            .map(|i| self.weights[i])
            .sum();
        let last = (0..self.inputs.len()).rfind(open)?;
        let u = self.rng.unit() * total;
        let mut sum = 0.0;
        let chosen = (0..self.inputs.len()).filter(open).find(|&i| {
            sum += self.weights[i];
            u < sum
        });
        // Rounding can leave `u` at the very top: the last open input.
        Some(chosen.unwrap_or(last))
    }

    fn step(&mut self) -> Option<Result<T, PipelineError>> {
        while !self.done && !self.env.cancelled() {
            let Some(i) = self.draw() else {
                self.finish();
                return None;
            };
            match self.inputs[i].next() {
                Some(item) => return Some(item),
                None if self.exhausted == Exhausted::Stop => self.finish(),
                None => {}
            }
        }
        None
    }
}

impl<T: Send + 'static> Iterator for Sample<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        let item = self.step()?;
        count(&self.counters, &item, 1);
        Some(Event::Item(item))
    }
}

impl<T: Send + 'static> StageStream<T> for Sample<T> {
    fn save(&self) -> Result<StageState, StateError> {
        let data = SampleState {
            rng: self.rng.0,
            done: self.done,
        };
        save_combined("sample_from", &data, self.inputs.iter().map(Input::save))
    }
}

struct Choose<T> {
    inputs: Vec<Input<T>>,
    selector: Input<usize>,
    done: Done,
    counters: Arc<StageCounters>,
    env: Env,
}

impl<T: Send + 'static> Choose<T> {
    fn finish(&mut self) {
        self.done.done = true;
        self.inputs.iter_mut().for_each(Input::close);
        self.selector.close();
    }

    fn step(&mut self) -> Option<Result<T, PipelineError>> {
        if self.done.done || self.env.cancelled() {
            return None;
        }
        let index = match self.selector.next() {
            Some(Ok(index)) => index,
            Some(Err(error)) => return Some(Err(error)),
            None => {
                self.finish();
                return None;
            }
        };
        let Some(input) = self.inputs.get_mut(index) else {
            return Some(Err(PipelineError::Element {
                stage: self.counters.name().to_string(),
                message: format!(
                    "selector value {index} is out of range for {} inputs",
                    self.inputs.len()
                ),
            }));
        };
        let item = input.next();
        if item.is_none() {
            self.finish();
        }
        item
    }
}

impl<T: Send + 'static> Iterator for Choose<T> {
    type Item = Event<T>;

    fn next(&mut self) -> Option<Event<T>> {
        let item = self.step()?;
        count(&self.counters, &item, 1);
        Some(Event::Item(item))
    }
}

impl<T: Send + 'static> StageStream<T> for Choose<T> {
    fn save(&self) -> Result<StageState, StateError> {
        let inputs = self.inputs.iter().map(Input::save);
        save_combined(
            "choose_from",
            &self.done,
            inputs.chain([self.selector.save()]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_checked() {
        assert_eq!(weights_problem(2, &[0.5, 0.5]), None);
        assert_eq!(weights_problem(2, &[1.0, 0.0]), None);
        for (n, w) in [
            (0, &[][..]),
            (2, &[1.0][..]),
            (2, &[1.0, -1.0][..]),
            (2, &[1.0, f64::NAN][..]),
            (1, &[f64::INFINITY][..]),
            (2, &[0.0, 0.0][..]),
        ] {
            assert!(weights_problem(n, w).is_some(), "{n} {w:?}");
        }
    }

    #[test]
    fn split_by_weight_keeps_the_total_and_gives_each_input_one() {
        let mut rng = SplitMix64(7);
        for _ in 0..500 {
            let n = 1 + (rng.unit() * 5.0) as usize;
            let total = (rng.unit() * 12.0) as usize;
            let mut weights: Vec<f64> = (0..n).map(|_| (rng.unit() * 4.0).floor()).collect();
            if weights.iter().all(|w| *w == 0.0) {
                weights[0] = 1.0;
            }
            let shares = split_by_weight(total, &weights);
            assert_eq!(shares.len(), n);
            assert!(
                shares.iter().all(|s| *s >= 1),
                "{total} {weights:?} {shares:?}"
            );
            let sum: usize = shares.iter().sum();
            assert_eq!(sum, total.max(n), "{total} {weights:?} {shares:?}");
            // A heavier input never gets fewer than a lighter one.
            for a in 0..n {
                for b in 0..n {
                    if weights[a] > weights[b] {
                        assert!(shares[a] >= shares[b], "{total} {weights:?} {shares:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_input_of_weight_zero_is_never_drawn() {
        let p = |c: char| Pipeline::from_generator(move || std::iter::repeat(c));
        let v: Vec<char> =
            Pipeline::sample_from(vec![p('a'), p('b')], &[0.0, 1.0], 1, Exhausted::Stop)
                .take(500)
                .start()
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        assert!(v.iter().all(|c| *c == 'b'));
    }
}
