//! Fused CPU kernels for the training step, as candle custom ops.
//!
//! candle's CPU backend runs every elementwise op as its own pass into a
//! fresh allocation, and its autograd computes the gradient of every input
//! of a matmul, including the data batch's. For the small models we train
//! that overhead is most of a step. The kernels here do the same math in
//! fewer passes:
//!
//! - [`linear`]: `relu(x @ w^T + b)` as one GEMM into an output preloaded
//!   with the bias, ReLU applied in place. Backward: the ReLU mask, `dW`
//!   and `db` in one pass each, `dx` only when `x` needs a gradient (never
//!   for the data batch).
//! - [`softmax_cross_entropy`]: the mean cross-entropy of logits against
//!   class ids in one pass; backward `(softmax - onehot) / batch`.
//! - [`conv2d`]: a convolution + bias + ReLU, the batch split over the
//!   compute threads: for a first layer (a 5x5 window over 1-3 channels
//!   into 6 outputs) directly, 32 output pixels at a time held in
//!   registers (`ops/direct.rs`); otherwise as im2col + GEMM, block by block
//!   (L2-sized im2col blocks, the GEMM's long side on the pixels); backward
//!   the same walks (candle's CPU conv backward goes through a slow
//!   transposed convolution). Details in `ops/conv.rs`.
//! - [`update_in_place`]: an optimizer's update on the variable's own
//!   storage (no copy out of candle, no `Var::set`, no intermediate
//!   tensors); the arithmetic lives in `optim.rs`.
//!
//! Every kernel takes f32 tensors on the CPU; on other devices or dtypes
//! each falls back to the same math in candle ops, so models written with
//! them run anywhere. Before/after numbers: `cargo bench --bench train`
//! (README, "Training speed").

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, InplaceOp2, Layout, Result, Shape,
    Tensor, bail,
};

use crate::spawn::Cancel;

mod conv;
mod direct;

/// The fused kernels' thread count; 0: candle's own (see [`compute_threads`]).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets how many threads the fused kernels' GEMMs use, from now on (the
/// trainer lowers it while training if the input pipeline starts to
/// stall). 0 restores the default.
pub fn set_compute_threads(threads: usize) {
    THREADS.store(threads, Ordering::Relaxed);
}

/// How many threads the fused kernels' GEMMs use. By default candle's
/// count: `RAYON_NUM_THREADS` (which `--compute-threads` sets) or the
/// physical cores, read at the first call.
pub fn compute_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => default_compute_threads(),
        n => n,
    }
}

/// candle's thread count, asked once: candle reads the environment and,
/// without `RAYON_NUM_THREADS`, parses `/proc/cpuinfo` on every call, and
/// the kernels ask for each convolution and pooling (3.3% of a LeNet step's
/// samples went to formatting `/proc/cpuinfo`).
fn default_compute_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| candle_core::utils::get_num_threads().max(1))
}

/// Runs `f` on each job of a kernel (the convolution's and the max-pool's
/// runs of images) and returns the results in job order (or the
/// first error): the first job on the calling thread, each other one on a
/// scoped [`crate::spawn`] thread (the project's one way to start threads;
/// candle's rayon pool is left to candle).
fn run_tasks<J: Send, R: Send>(jobs: Vec<J>, f: impl Fn(J) -> Result<R> + Sync) -> Result<Vec<R>> {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Ok(Vec::new());
    };
    if jobs.len() == 0 {
        return Ok(vec![f(first)?]);
    }
    let f = &f;
    std::thread::scope(|s| {
        let mut threads = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.enumerate() {
            let t =
                crate::spawn::scoped(s, format!("kernel-{}", i + 1), Cancel::new(), move |_| {
                    f(job)
                })
                .map_err(|e| candle_core::Error::Msg(format!("starting a kernel thread: {e}")))?;
            threads.push(t);
        }
        let mut results = Vec::with_capacity(threads.len() + 1);
        results.push(f(first));
        for t in threads {
            results.push(
                t.join()
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))?,
            );
        }
        results.into_iter().collect()
    })
}

/// GEMM parallelism on the rayon pool candle's kernels share.
fn parallelism() -> gemm::Parallelism {
    match compute_threads() {
        1 => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    }
}

/// A strided 2-D view into an f32 buffer: element `(i, j)` sits at
/// `offset + i * rs + j * cs`.
#[derive(Clone, Copy)]
struct View {
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
    offset: usize,
}

impl View {
    /// A dense `rows x cols` matrix stored row by row.
    fn row_major(rows: usize, cols: usize) -> View {
        View {
            rows,
            cols,
            rs: cols as isize,
            cs: 1,
            offset: 0,
        }
    }

    /// A dense `rows x cols` matrix stored column by column.
    fn col_major(rows: usize, cols: usize) -> View {
        View::row_major(cols, rows).transposed()
    }

    fn of(layout: &Layout, what: &str) -> Result<View> {
        match (layout.dims(), layout.stride()) {
            ([rows, cols], [rs, cs]) => Ok(View {
                rows: *rows,
                cols: *cols,
                rs: *rs as isize,
                cs: *cs as isize,
                offset: layout.start_offset(),
            }),
            (dims, _) => bail!("{what}: expected a matrix, got shape {dims:?}"),
        }
    }

    fn transposed(self) -> View {
        View {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            offset: self.offset,
        }
    }

    /// The largest index this view reads, plus one.
    fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return self.offset;
        }
        self.offset + (self.rows - 1) * self.rs as usize + (self.cols - 1) * self.cs as usize + 1
    }

    fn check(&self, data: &[f32], what: &str) -> Result<()> {
        if self.rs < 0 || self.cs < 0 || self.extent() > data.len() {
            bail!("{what}: layout does not fit its storage");
        }
        Ok(())
    }
}

/// `dst (m x n, row-major, contiguous) = (accumulate ? dst : 0) + lhs @ rhs`,
/// on [`compute_threads`] threads.
fn gemm_into(
    dst: &mut [f32],
    accumulate: bool,
    lhs: (&[f32], View),
    rhs: (&[f32], View),
) -> Result<()> {
    let (m, n) = (lhs.1.rows, rhs.1.cols);
    if dst.len() != m * n {
        bail!("gemm: a {m}x{n} product into {} values", dst.len());
    }
    let view = View::row_major(m, n);
    gemm_strided((dst, view), accumulate, lhs, rhs, parallelism())
}

/// `dst = (accumulate ? dst : 0) + lhs @ rhs` for any non-negative strides
/// (a destination whose views overlap itself gives unspecified values).
///
/// gemm computes a row-major destination as the transposed problem, so
/// the destination's layout decides which side is its microkernel's long
/// (64-row) dimension: callers with few output columns write them
/// column-major (see `conv.rs`).
fn gemm_strided(
    dst: (&mut [f32], View),
    accumulate: bool,
    lhs: (&[f32], View),
    rhs: (&[f32], View),
    parallelism: gemm::Parallelism,
) -> Result<()> {
    let ((d, ld), (a, la), (b, lb)) = (dst, lhs, rhs);
    let (m, k, n) = (la.rows, la.cols, lb.cols);
    if lb.rows != k || ld.rows != m || ld.cols != n {
        bail!(
            "gemm: shapes {m}x{k} @ {}x{n} into {}x{}",
            lb.rows,
            ld.rows,
            ld.cols
        );
    }
    la.check(a, "gemm lhs")?;
    lb.check(b, "gemm rhs")?;
    ld.check(d, "gemm destination")?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    d[ld.offset + i * ld.rs as usize + j * ld.cs as usize] = 0.0;
                }
            }
        }
        return Ok(());
    }
    // SAFETY: the checks above keep every access to `d`, `a` and `b`
    // inside their slices (strides are non-negative and the last element
    // of each view is in bounds); `d` is borrowed mutably, so it aliases
    // neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            d.as_mut_ptr().add(ld.offset),
            ld.cs,
            ld.rs,
            accumulate,
            a.as_ptr().add(la.offset),
            la.cs,
            la.rs,
            b.as_ptr().add(lb.offset),
            lb.cs,
            lb.rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

fn f32s<'a>(s: &'a CpuStorage, what: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        other => bail!(
            "{what}: expected f32, got {:?}",
            candle_core::backend::BackendStorage::dtype(other)
        ),
    }
}

/// Runs `f` on the f32 data and layout of a CPU tensor.
fn with_cpu_f32<R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(&[f32], &Layout) -> Result<R>,
) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(s) => f(f32s(s, what)?, layout),
        _ => bail!("{what}: expected a CPU tensor"),
    }
}

fn fused_ok(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}

// ---------------------------------------------------------------- linear

/// `x @ w^T + b`, then ReLU when `relu`: `x` is `[batch, in]`, `w`
/// `[out, in]` (candle-nn's `Linear` layout), `b` `[out]`.
///
/// On the CPU in f32 this is one fused op (see the module doc); elsewhere
/// it is candle's `matmul`, `broadcast_add` and `relu`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>, relu: bool) -> Result<Tensor> {
    match b {
        Some(b) if fused_ok(&[x, w, b]) && x.rank() == 2 => x.apply_op3(w, b, LinearOp { relu }),
        _ => {
            let y = x.matmul(&w.t()?)?;
            let y = match b {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            };
            if relu { y.relu() } else { Ok(y) }
        }
    }
}

/// The fused linear layer (see [`linear`]).
struct LinearOp {
    relu: bool,
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        if self.relu {
            "tfpipe-linear-relu"
        } else {
            "tfpipe-linear"
        }
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = View::of(xl, "linear input")?;
        let w = View::of(wl, "linear weight")?;
        let (bias, out) = match (bl.contiguous_offsets(), bl.dims()) {
            (Some((start, end)), [out]) => (&f32s(bs, "linear bias")?[start..end], *out),
            _ => bail!("linear bias: expected a contiguous vector"),
        };
        if w.rows != out || w.cols != x.cols {
            bail!(
                "linear: input [{}, {}], weight [{}, {}], bias [{out}] do not fit",
                x.rows,
                x.cols,
                w.rows,
                w.cols
            );
        }
        let mut y = Vec::with_capacity(x.rows * out);
        for _ in 0..x.rows {
            y.extend_from_slice(bias);
        }
        gemm_into(
            &mut y,
            true,
            (f32s(xs, "linear input")?, x),
            (f32s(ws, "linear weight")?, w.transposed()),
        )?;
        if self.relu {
            for v in &mut y {
                *v = v.max(0.0);
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((x.rows, out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (rows, out) = res.dims2()?;
        let inputs = x.dim(1)?;
        let grad = grad.contiguous()?;
        // The gradient before the ReLU, `[rows, out]`, row-major.
        let g: Vec<f32> = with_cpu_f32(&grad, "linear gradient", |g, gl| {
            let (start, end) = gl
                .contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg("linear gradient: not contiguous".into()))?;
            let g = &g[start..end];
            if !self.relu {
                return Ok(g.to_vec());
            }
            let res = res.contiguous()?;
            with_cpu_f32(&res, "linear output", |r, rl| {
                let (rs, re) = rl.contiguous_offsets().ok_or_else(|| {
                    candle_core::Error::Msg("linear output: not contiguous".into())
                })?;
                Ok(g.iter()
                    .zip(&r[rs..re])
                    .map(|(&g, &r)| if r > 0.0 { g } else { 0.0 })
                    .collect())
            })
        })?;
        if g.len() != rows * out {
            bail!("linear gradient: {} values for [{rows}, {out}]", g.len());
        }
        let gv = View::row_major(rows, out);
        let mut db = vec![0f32; out];
        for row in g.chunks_exact(out.max(1)) {
            for (d, v) in db.iter_mut().zip(row) {
                *d += v;
            }
        }
        let mut dw = vec![0f32; out * inputs];
        with_cpu_f32(x, "linear input", |xd, xl| {
            gemm_into(
                &mut dw,
                false,
                (&g, gv.transposed()),
                (xd, View::of(xl, "linear input")?),
            )
        })?;
        let dx = if x.track_op() {
            let mut dx = vec![0f32; rows * inputs];
            with_cpu_f32(w, "linear weight", |wd, wl| {
                gemm_into(
                    &mut dx,
                    false,
                    (&g, gv),
                    (wd, View::of(wl, "linear weight")?),
                )
            })?;
            Some(Tensor::from_vec(dx, (rows, inputs), &Device::Cpu)?)
        } else {
            None
        };
        Ok((
            dx,
            Some(Tensor::from_vec(dw, (out, inputs), &Device::Cpu)?),
            Some(Tensor::from_vec(db, out, &Device::Cpu)?),
        ))
    }
}

// ------------------------------------------------------- cross-entropy

/// The mean softmax cross-entropy of `logits` `[batch, classes]` against
/// class ids `labels` `[batch]` (u32): candle-nn's
/// `loss::cross_entropy`, as one pass on the CPU in f32.
pub fn softmax_cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    if fused_ok(&[logits]) && labels.dtype() == DType::U32 && logits.rank() == 2 {
        logits.apply_op2(labels, SoftmaxCrossEntropy)
    } else {
        candle_nn::loss::cross_entropy(logits, labels)
    }
}

struct SoftmaxCrossEntropy;

fn labels_u32<'a>(s: &'a CpuStorage, l: &Layout, rows: usize) -> Result<&'a [u32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::U32(v), Some((start, end))) if end - start == rows => Ok(&v[start..end]),
        _ => bail!("cross-entropy: labels must be {rows} contiguous u32 class ids"),
    }
}

/// Calls `f(row, label, log_sum_exp)` for each row of contiguous logits.
fn each_row(
    logits: &[f32],
    classes: usize,
    labels: &[u32],
    mut f: impl FnMut(&[f32], usize, f32),
) -> Result<()> {
    for (row, &label) in logits.chunks_exact(classes).zip(labels) {
        let label = label as usize;
        if label >= classes {
            bail!("cross-entropy: label {label} is not below the {classes} classes");
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
        f(row, label, max + sum.ln());
    }
    Ok(())
}

impl CustomOp2 for SoftmaxCrossEntropy {
    fn name(&self) -> &'static str {
        "tfpipe-softmax-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        ls: &CpuStorage,
        ll: &Layout,
        ys: &CpuStorage,
        yl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, classes) = ll.shape().dims2()?;
        let logits = match ll.contiguous_offsets() {
            Some((start, end)) => &f32s(ls, "cross-entropy logits")?[start..end],
            None => bail!("cross-entropy: logits are not contiguous"),
        };
        let labels = labels_u32(ys, yl, rows)?;
        let mut total = 0f64;
        each_row(logits, classes, labels, |row, label, lse| {
            total += f64::from(lse - row[label]);
        })?;
        let mean = if rows == 0 {
            f32::NAN
        } else {
            (total / rows as f64) as f32
        };
        Ok((CpuStorage::F32(vec![mean]), Shape::from(())))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, classes) = logits.dims2()?;
        let scale = grad.to_scalar::<f32>()? / rows.max(1) as f32;
        let logits = logits.contiguous()?;
        let labels: Vec<u32> = labels.to_vec1()?;
        let mut d = Vec::with_capacity(rows * classes);
        with_cpu_f32(&logits, "cross-entropy logits", |l, layout| {
            let (start, end) = layout
                .contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg("logits: not contiguous".into()))?;
            each_row(&l[start..end], classes, &labels, |row, label, lse| {
                let base = d.len();
                d.extend(row.iter().map(|&v| (v - lse).exp() * scale));
                d[base + label] -= scale;
            })
        })?;
        Ok((
            Some(Tensor::from_vec(d, (rows, classes), &Device::Cpu)?),
            None,
        ))
    }
}

// ------------------------------------------------------------- conv2d

/// A 2-D convolution, stride 1, with bias and optional ReLU, on NHWC data:
/// `x` `[batch, height, width, channels]`, `kernel` candle's
/// `[out, channels, k, k]`; the result is NHWC `[batch, oh, ow, out]`.
///
/// On the CPU in f32: one fused op, im2col + GEMM + bias + ReLU block by
/// block over the batch, on [`compute_threads`] threads (see `conv.rs`);
/// its backward is the same walk (ReLU mask, `db`, `dW`, and `dx` by
/// col2im only when `x` needs a gradient). Elsewhere: candle's `conv2d`
/// between permutes.
///
/// ```
/// use candle_core::{Device, Tensor};
///
/// // One 3x3 image of ones, one 2x2 kernel of ones: each output sums 4.
/// let x = Tensor::ones((1, 3, 3, 1), candle_core::DType::F32, &Device::Cpu)?;
/// let k = Tensor::ones((1, 1, 2, 2), candle_core::DType::F32, &Device::Cpu)?;
/// let y = tfpipe::train::ops::conv2d(&x, &k, None, 0, false)?;
/// assert_eq!(y.dims(), &[1, 2, 2, 1]);
/// assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![4.0; 4]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn conv2d(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    padding: usize,
    relu: bool,
) -> Result<Tensor> {
    let plan = conv::Plan {
        tasks: compute_threads(),
        block_rows: None,
        method: None,
    };
    conv2d_with(x, kernel, bias, padding, relu, plan)
}

/// [`conv2d`] with the fused op's task count, block size and method chosen
/// (tests exercise every split and both methods with them).
fn conv2d_with(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    padding: usize,
    relu: bool,
    plan: conv::Plan,
) -> Result<Tensor> {
    let (b, h, w, c) = x.dims4()?;
    let (out, kc, kh, kw) = kernel.dims4()?;
    if kc != c || kh != kw {
        bail!("conv2d: input has {c} channels, kernel is [{out}, {kc}, {kh}, {kw}]");
    }
    let k = kh;
    let geometry = conv::Geometry::new((b, h, w, c), k, padding, out)?;
    if fused_ok(&[x, kernel]) {
        let zeros;
        let bias = match bias {
            Some(bias) => bias,
            None => {
                zeros = Tensor::zeros(out, DType::F32, &Device::Cpu)?;
                &zeros
            }
        };
        let op = conv::Conv2dOp {
            k,
            pad: padding,
            relu,
            tasks: plan.tasks.clamp(1, b.max(1)),
            block_rows: plan.block_rows,
            method: plan
                .method
                .unwrap_or_else(|| conv::Method::for_geometry(&geometry)),
        };
        x.contiguous()?
            .apply_op3(&kernel.contiguous()?, &bias.contiguous()?, op)
    } else {
        let y = x
            .permute((0, 3, 1, 2))?
            .contiguous()?
            .conv2d(kernel, padding, 1, 1, 1)?;
        let y = match bias {
            Some(bias) => y.broadcast_add(&bias.reshape((1, out, 1, 1))?)?,
            None => y,
        };
        let y = if relu { y.relu()? } else { y };
        y.permute((0, 2, 3, 1))?.contiguous()
    }
}

/// 2x2 max pooling, stride 2, on NHWC `[batch, h, w, c]` (odd edges
/// dropped, as candle does). With `to_nchw` the result is laid out
/// `[batch, c, h/2, w/2]`, so that flattening it matches candle's NCHW
/// models.
///
/// The gradient goes to each window's maximum (the first one on ties), as
/// in TensorFlow and PyTorch. (candle 0.11's own `max_pool2d` backward
/// scales it by the number of maxima over 4, i.e. a unique maximum gets a
/// quarter of its gradient; off the CPU this function therefore pools
/// with a reshape and two `max` reductions, whose backward is exact.)
pub fn max_pool2x2(x: &Tensor, to_nchw: bool) -> Result<Tensor> {
    if fused_ok(&[x]) {
        x.contiguous()?.apply_op1(MaxPool2x2::new(to_nchw))
    } else {
        let y = max_pool2x2_nchw(&x.permute((0, 3, 1, 2))?)?;
        if to_nchw {
            Ok(y)
        } else {
            y.permute((0, 2, 3, 1))?.contiguous()
        }
    }
}

/// 2x2 max pooling of NCHW `x` in candle ops with an exact backward: a
/// reshape to `[b, c, h/2, 2, w/2, 2]` and a max over each pair of axes.
pub fn max_pool2x2_nchw(x: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let (oh, ow) = (h / 2, w / 2);
    x.narrow(2, 0, 2 * oh)?
        .narrow(3, 0, 2 * ow)?
        .contiguous()?
        .reshape((b, c, oh, 2, ow, 2))?
        .max(5)?
        .max(3)
}

struct MaxPool2x2 {
    to_nchw: bool,
    /// Runs of images pooled in parallel, at most.
    tasks: usize,
    /// Input values per run, at least (except for a batch of fewer).
    min_task_values: usize,
}

impl MaxPool2x2 {
    fn new(to_nchw: bool) -> MaxPool2x2 {
        MaxPool2x2 {
            to_nchw,
            tasks: compute_threads(),
            min_task_values: POOL_VALUES_PER_TASK,
        }
    }

    /// How a max-pool over `b x h x w x c` is split into runs of images
    /// (the batch over `tasks`, each run at least `min_task_values` input
    /// values, at least 1 image): the input values and the output values
    /// per run, and the input values per image. Each at least 1, so that
    /// an empty input or output makes no runs.
    fn runs(&self, (b, h, w, c): (usize, usize, usize, usize)) -> (usize, usize, usize) {
        let image = (h * w * c).max(1);
        let by_size = b * image / self.min_task_values.max(1);
        let images = b.div_ceil(self.tasks.min(by_size).max(1)).max(1);
        (
            images * image,
            (images * (h / 2) * (w / 2) * c).max(1),
            image,
        )
    }
}

impl MaxPool2x2 {
    /// Calls `f(window, out, stride)` per window position: `window` holds
    /// the input indices of its 4 pixels' channel 0 (each pixel's `c`
    /// channels follow contiguously, NHWC), `out` the output index of
    /// channel 0 and `stride` the step between channels in the output.
    fn walk(
        &self,
        (b, h, w, c): (usize, usize, usize, usize),
        mut f: impl FnMut([usize; 4], usize, usize),
    ) {
        let (oh, ow) = (h / 2, w / 2);
        let stride = if self.to_nchw { oh * ow } else { 1 };
        for n in 0..b {
            for oy in 0..oh {
                let top = (n * h + 2 * oy) * w * c;
                let bottom = top + w * c;
                for ox in 0..ow {
                    let x0 = 2 * ox * c;
                    let window = [top + x0, top + x0 + c, bottom + x0, bottom + x0 + c];
                    let out = if self.to_nchw {
                        (n * c * oh + oy) * ow + ox
                    } else {
                        ((n * oh + oy) * ow + ox) * c
                    };
                    f(window, out, stride);
                }
            }
        }
    }

    fn out_shape(&self, (b, h, w, c): (usize, usize, usize, usize)) -> Shape {
        if self.to_nchw {
            Shape::from((b, c, h / 2, w / 2))
        } else {
            Shape::from((b, h / 2, w / 2, c))
        }
    }
}

impl MaxPool2x2 {
    /// The forward pass, a pair of input rows at a time: their elementwise
    /// maximum (one vectorised pass over `2 * ow * c` values), then each
    /// output pixel's channels from two neighbours of it. The same value
    /// as `v[argmax4(v)]` per window (up to the sign of a zero), NaN
    /// included: each `max_first` keeps its first argument unless the
    /// second is greater, as `argmax4` does.
    /// (The per-window walk with `argmax4` took 15% of a LeNet step.)
    fn pool_rows(&self, x: &[f32], (b, h, w, c): (usize, usize, usize, usize), out: &mut [f32]) {
        let (oh, ow) = (h / 2, w / 2);
        let (row, used) = (w * c, 2 * ow * c);
        let mut pair = vec![0f32; used];
        for n in 0..b {
            for oy in 0..oh {
                let top = &x[(n * h + 2 * oy) * row..][..used];
                let bottom = &x[(n * h + 2 * oy + 1) * row..][..used];
                for ((p, &t), &u) in pair.iter_mut().zip(top).zip(bottom) {
                    *p = max_first(t, u);
                }
                for ox in 0..ow {
                    let (left, right) = pair[2 * ox * c..(2 * ox + 2) * c].split_at(c);
                    if self.to_nchw {
                        for (ch, (&l, &r)) in left.iter().zip(right).enumerate() {
                            out[((n * c + ch) * oh + oy) * ow + ox] = max_first(l, r);
                        }
                    } else {
                        let o = &mut out[((n * oh + oy) * ow + ox) * c..][..c];
                        for ((o, &l), &r) in o.iter_mut().zip(left).zip(right) {
                            *o = max_first(l, r);
                        }
                    }
                }
            }
        }
    }
}

/// `b` if it is greater than `a`, else `a` (NaN only when `a` is).
#[inline]
fn max_first(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

/// Which of the 4 values is the maximum (the first one on ties).
fn argmax4(v: [f32; 4]) -> usize {
    let mut best = 0;
    for i in 1..4 {
        if v[i] > v[best] {
            best = i;
        }
    }
    best
}

/// Input values per task of a max-pool, at least: starting a thread costs
/// about 50 us (conv.rs) and more when it wakes an idle core, so a run
/// must be long. At batch 64 the 64x64x3 CNN's poolings (1.57M and 803k
/// values) are split over two threads, the LeNet-like CNN's (301k, 102k)
/// are not: split at 128k, its first made the LeNet step 1.11x as long
/// (with candle's elementwise pool off, as `tfpipe train` runs), while at
/// 64x64x3 the split took the step from 30.8 to 27.7 ms.
const POOL_VALUES_PER_TASK: usize = 384 * 1024;

/// Checks that `x` holds the whole `b x h x w x c` input: every window
/// [`MaxPool2x2::walk`] yields then lies inside it, so one check per call
/// stands for one per window.
fn check_pool_input(x: &[f32], (b, h, w, c): (usize, usize, usize, usize)) -> Result<()> {
    if x.len() < b * h * w * c {
        bail!("max-pool: window outside its input");
    }
    Ok(())
}

impl CustomOp1 for MaxPool2x2 {
    fn name(&self) -> &'static str {
        "tfpipe-max-pool-2x2"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = l.shape().dims4()?;
        let x = match l.contiguous_offsets() {
            Some((start, end)) => &f32s(s, "max-pool input")?[start..end],
            None => bail!("max-pool: input is not contiguous"),
        };
        let shape = self.out_shape(d);
        let mut out = vec![0f32; shape.elem_count()];
        check_pool_input(x, d)?;
        let (_, h, w, c) = d;
        let (run_in, run_out, image_in) = self.runs(d);
        let jobs: Vec<_> = x.chunks(run_in).zip(out.chunks_mut(run_out)).collect();
        run_tasks(jobs, |(x, out)| {
            self.pool_rows(x, (x.len() / image_in, h, w, c), out);
            Ok(())
        })?;
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let d = arg.dims4()?;
        let arg = arg.contiguous()?;
        let grad = grad.contiguous()?;
        let mut dx = vec![0f32; arg.elem_count()];
        with_cpu_f32(&arg, "max-pool input", |x, xl| {
            let x = &x[xl.start_offset()..];
            with_cpu_f32(&grad, "max-pool gradient", |g, gl| {
                let g = &g[gl.start_offset()..];
                if g.len() < self.out_shape(d).elem_count() {
                    bail!("max-pool gradient: too few values");
                }
                let (_, h, w, c) = d;
                check_pool_input(x, d)?;
                let (run_in, run_out, image_in) = self.runs(d);
                let jobs: Vec<_> = x
                    .chunks(run_in)
                    .zip(dx.chunks_mut(run_in))
                    .zip(g.chunks(run_out))
                    .collect();
                run_tasks(jobs, |((x, dx), g)| {
                    let run = (x.len() / image_in, h, w, c);
                    self.walk(run, |window, o, stride| {
                        for ch in 0..c {
                            let best = argmax4(window.map(|at| x[at + ch]));
                            // Windows do not overlap: each input gets at most one value.
                            dx[window[best] + ch] = g[o + ch * stride];
                        }
                    });
                    Ok(())
                })?;
                Ok(())
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, arg.shape(), &Device::Cpu)?))
    }
}

// --------------------------------------------------------- optimizers

/// Runs `update(weights, gradient)` on the storage of `theta` itself, so
/// that every tensor sharing it (the model's layers) sees the new weights:
/// no copy out of candle and back, no `Var::set`, no new allocation.
///
/// Returns `Ok(false)`, having done nothing, unless `theta` and `grad` are
/// both float32 on the CPU (the optimizers then use tensor operations).
/// `theta` must be contiguous and `grad` have as many elements.
///
/// ```
/// use candle_core::{Device, Tensor, Var};
///
/// let theta = Var::from_vec(vec![1.0f32, 2.0], 2, &Device::Cpu)?;
/// let view = theta.as_tensor().clone();
/// let grad = Tensor::new(&[0.5f32, -0.5], &Device::Cpu)?;
/// let done = tfpipe::train::ops::update_in_place(&theta, &grad, |p, g| {
///     for (p, g) in p.iter_mut().zip(g) {
///         *p -= 2.0 * g;
///     }
/// })?;
/// assert!(done);
/// assert_eq!(view.to_vec1::<f32>()?, vec![0.0, 3.0]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn update_in_place(
    theta: &Tensor,
    grad: &Tensor,
    update: impl FnOnce(&mut [f32], &[f32]),
) -> Result<bool> {
    if !fused_ok(&[theta, grad]) {
        return Ok(false);
    }
    if grad.elem_count() != theta.elem_count() {
        bail!(
            "update: {} weights but {} gradients",
            theta.elem_count(),
            grad.elem_count()
        );
    }
    let grad = grad.contiguous()?;
    theta.inplace_op2(
        &grad,
        &InPlace {
            update: RefCell::new(Some(update)),
        },
    )?;
    Ok(true)
}

/// The in-place update (see [`update_in_place`]); `update` runs once.
struct InPlace<F> {
    update: RefCell<Option<F>>,
}

impl<F: FnOnce(&mut [f32], &[f32])> InplaceOp2 for InPlace<F> {
    fn name(&self) -> &'static str {
        "tfpipe-update-in-place"
    }

    fn cpu_fwd(
        &self,
        ts: &mut CpuStorage,
        tl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<()> {
        let theta = match (ts, tl.contiguous_offsets()) {
            (CpuStorage::F32(v), Some((start, end))) => &mut v[start..end],
            _ => bail!("update: expected contiguous f32 weights"),
        };
        let g = match gl.contiguous_offsets() {
            Some((start, end)) => &f32s(gs, "update gradient")?[start..end],
            None => bail!("update: expected a contiguous gradient"),
        };
        if theta.len() != g.len() {
            bail!("update: {} weights but {} gradients", theta.len(), g.len());
        }
        let update = self.update.borrow_mut().take();
        match update {
            Some(update) => update(theta, g),
            None => bail!("update: applied twice"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// Deterministic values in [-1, 1) (the kernels' tests in `ops/` use
    /// them too).
    pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn var(shape: &[usize], seed: u64) -> Var {
        let n = shape.iter().product();
        Var::from_vec(values(n, seed), shape, &Device::Cpu).unwrap()
    }

    fn close(a: &Tensor, b: &Tensor, tol: f32) {
        assert_eq!(a.dims(), b.dims());
        let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
        }
    }

    /// Forward and every gradient of `fused` match `reference` on the same
    /// variables (the loss is a weighted sum, so each output matters).
    fn same_function(
        vars: &[&Var],
        out_shape: &[usize],
        fused: impl Fn() -> Tensor,
        reference: impl Fn() -> Tensor,
    ) {
        let weights = Tensor::from_vec(
            values(out_shape.iter().product(), 99),
            out_shape,
            &Device::Cpu,
        )
        .unwrap();
        let (a, b) = (fused(), reference());
        close(&a, &b, 1e-5);
        let ga = (a * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gb = (b * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for v in vars {
            close(ga.get(v).unwrap(), gb.get(v).unwrap(), 1e-4);
        }
    }

    #[test]
    fn linear_matches_candle_with_and_without_relu() {
        let x = var(&[5, 7], 1);
        let w = var(&[3, 7], 2);
        let b = var(&[3], 3);
        for relu in [false, true] {
            same_function(
                &[&x, &w, &b],
                &[5, 3],
                || linear(&x, &w, Some(&b), relu).unwrap(),
                || {
                    let y = x
                        .matmul(&w.t().unwrap())
                        .unwrap()
                        .broadcast_add(&b)
                        .unwrap();
                    if relu { y.relu().unwrap() } else { y }
                },
            );
        }
    }

    #[test]
    fn linear_reads_strided_inputs_and_skips_the_data_gradient() {
        // A transposed (non-contiguous) input that tracks no gradient.
        let xt = Tensor::from_vec(values(14, 4), (7, 2), &Device::Cpu).unwrap();
        let x = xt.t().unwrap();
        let w = var(&[3, 7], 5);
        let b = var(&[3], 6);
        let y = linear(&x, &w, Some(&b), true).unwrap();
        let r = x
            .matmul(&w.t().unwrap())
            .unwrap()
            .broadcast_add(&b)
            .unwrap()
            .relu()
            .unwrap();
        close(&y, &r, 1e-5);
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(&x).is_none());
        assert!(grads.get(&w).is_some());
    }

    #[test]
    fn cross_entropy_matches_candle() {
        let logits = var(&[6, 4], 7);
        let scaled = (logits.as_tensor() * 5.0).unwrap();
        let labels = Tensor::new(&[0u32, 3, 1, 2, 3, 0], &Device::Cpu).unwrap();
        let a = softmax_cross_entropy(&scaled, &labels).unwrap();
        let b = candle_nn::loss::cross_entropy(&scaled, &labels).unwrap();
        close(&a, &b, 1e-6);
        let ga = a.backward().unwrap();
        let gb = b.backward().unwrap();
        close(ga.get(&logits).unwrap(), gb.get(&logits).unwrap(), 1e-5);
    }

    #[test]
    fn cross_entropy_refuses_a_label_out_of_range() {
        let logits = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let labels = Tensor::new(&[0u32, 3], &Device::Cpu).unwrap();
        let err = softmax_cross_entropy(&logits, &labels).unwrap_err();
        assert!(err.to_string().contains("label 3"), "{err}");
    }

    /// An input with no whole window pools to nothing, and its gradient
    /// is zeros, however it is split.
    #[test]
    fn pool_without_a_window_is_empty_and_its_gradient_zero() {
        let x = var(&[4, 1, 5, 2], 13);
        for tasks in [1, 3] {
            let pool = MaxPool2x2 {
                to_nchw: false,
                tasks,
                min_task_values: 1,
            };
            let y = x.apply_op1(pool).unwrap();
            assert_eq!(y.dims(), &[4, 0, 2, 2]);
            let grads = y.sum_all().unwrap().backward().unwrap();
            let dx = grads.get(&x).unwrap().flatten_all().unwrap();
            assert!(dx.to_vec1::<f32>().unwrap().iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn pool_split_over_tasks_matches_one_task() {
        // 5 images of 6x8x3, odd runs included (2 + 2 + 1, 3 + 2, ...).
        let x = var(&[5, 6, 8, 3], 12);
        for to_nchw in [false, true] {
            let out = if to_nchw { [5, 3, 3, 4] } else { [5, 3, 4, 3] };
            let pool = |tasks| MaxPool2x2 {
                to_nchw,
                tasks,
                min_task_values: 1,
            };
            for tasks in [2, 3, 4, 5, 8] {
                same_function(
                    &[&x],
                    &out,
                    || x.apply_op1(pool(tasks)).unwrap(),
                    || x.apply_op1(pool(1)).unwrap(),
                );
            }
        }
    }

    /// candle's own convolution + bias + ReLU of the NHWC input `x`, on its
    /// NCHW view (the output NCHW): the reference of the fused conv2d.
    fn candle_conv_relu_nchw(x: &Var, kernel: &Var, bias: &Var, padding: usize) -> Tensor {
        let outputs = bias.dims1().unwrap();
        x.permute((0, 3, 1, 2))
            .unwrap()
            .conv2d(kernel, padding, 1, 1, 1)
            .unwrap()
            .broadcast_add(&bias.reshape((1, outputs, 1, 1)).unwrap())
            .unwrap()
            .relu()
            .unwrap()
    }

    #[test]
    fn conv2d_and_pool_match_candle_nchw() {
        // NHWC input [2, 6, 6, 3]; the reference runs on its NCHW view.
        let x = var(&[2, 6, 6, 3], 8);
        let k = var(&[4, 3, 3, 3], 9);
        let b = var(&[4], 10);
        for padding in [0, 1] {
            let o = 6 + 2 * padding - 2;
            same_function(
                &[&x, &k, &b],
                &[2, 4, o / 2, o / 2],
                || {
                    let y = conv2d(&x, &k, Some(&b), padding, true).unwrap();
                    max_pool2x2(&y, true).unwrap()
                },
                || {
                    candle_conv_relu_nchw(&x, &k, &b, padding)
                        .apply(&max_pool2x2_nchw)
                        .unwrap()
                },
            );
        }
        // NHWC output of the pool; the forward is candle's max_pool2d, on
        // even and odd sides (an odd edge is dropped), in both layouts.
        let odd = var(&[2, 5, 7, 3], 11);
        for x in [&x, &odd] {
            let nchw = x.permute((0, 3, 1, 2)).unwrap().max_pool2d(2).unwrap();
            let y = max_pool2x2(x.as_tensor(), false).unwrap();
            close(&y, &nchw.permute((0, 2, 3, 1)).unwrap(), 0.0);
            close(&max_pool2x2(x.as_tensor(), true).unwrap(), &nchw, 0.0);
        }
        // Gradients too, odd edges getting none, in both layouts.
        let reference = || max_pool2x2_nchw(&odd.permute((0, 3, 1, 2)).unwrap()).unwrap();
        same_function(
            &[&odd],
            &[2, 3, 2, 3],
            || max_pool2x2(odd.as_tensor(), true).unwrap(),
            reference,
        );
        same_function(
            &[&odd],
            &[2, 2, 3, 3],
            || max_pool2x2(odd.as_tensor(), false).unwrap(),
            || reference().permute((0, 2, 3, 1)).unwrap(),
        );
    }

    /// The fused convolution, split into every number of tasks and block
    /// sizes (blocks of output lines that end inside an image, and that
    /// span two), computes candle's convolution and its three gradients: with
    /// and without padding, one and several input channels, and a kernel
    /// wider than the padding (edge windows reading only part of a row).
    #[test]
    fn conv2d_matches_candle_for_every_split() {
        use conv::Method::{Direct, Im2col};
        for (c, k, padding) in [(1, 5, 2), (3, 3, 0), (2, 3, 1), (4, 2, 3)] {
            let x = var(&[5, 7, 6, c], 30 + c as u64);
            let data = x.as_tensor().detach();
            let kernel = var(&[3, c, k, k], 40 + k as u64);
            let b = var(&[3], 50);
            let (oh, ow) = (7 + 2 * padding + 1 - k, 6 + 2 * padding + 1 - k);
            let reference = || {
                candle_conv_relu_nchw(&x, &kernel, &b, padding)
                    .permute((0, 2, 3, 1))
                    .unwrap()
            };
            for (tasks, block) in [
                (1, None),
                (2, Some(1)),
                (3, Some(2)),
                (5, Some(4)),
                (2, Some(5)),
                (1, Some(11)),
                (8, None),
            ] {
                for method in [Im2col, Direct] {
                    let plan = conv::Plan {
                        tasks,
                        block_rows: block,
                        method: Some(method),
                    };
                    let conv = |x: &Tensor| {
                        conv2d_with(x, &kernel, Some(&b), padding, true, plan).unwrap()
                    };
                    // The input a variable (its gradient too), and data.
                    same_function(&[&x, &kernel, &b], &[5, oh, ow, 3], || conv(&x), reference);
                    same_function(&[&kernel, &b], &[5, oh, ow, 3], || conv(&data), reference);
                }
            }
        }
    }

    #[test]
    fn conv2d_without_bias_or_relu_and_with_a_bad_kernel() {
        let x = var(&[2, 4, 4, 2], 60);
        let kernel = var(&[3, 2, 3, 3], 61);
        let y = conv2d(&x, &kernel, None, 1, false).unwrap();
        let r = x
            .permute((0, 3, 1, 2))
            .unwrap()
            .conv2d(&kernel, 1, 1, 1, 1)
            .unwrap()
            .permute((0, 2, 3, 1))
            .unwrap();
        close(&y, &r, 1e-5);
        let wrong_channels = var(&[3, 1, 3, 3], 62);
        let err = conv2d(&x, &wrong_channels, None, 1, false).unwrap_err();
        assert!(err.to_string().contains("2 channels"), "{err}");
        let too_big = var(&[3, 2, 7, 7], 63);
        let err = conv2d(&x, &too_big, None, 1, false).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
    }

    /// candle 0.11's `max_pool2d` backward gives a unique maximum a quarter
    /// of its gradient; ours (and the reshape + max reference) all of it.
    #[test]
    fn pool_gradient_is_exact_where_candles_is_a_quarter() {
        let x = Var::from_vec(vec![1.0f32, 4.0, 2.0, 3.0], (1, 2, 2, 1), &Device::Cpu).unwrap();
        let ours = max_pool2x2(x.as_tensor(), true).unwrap();
        let g = ours.sum_all().unwrap().backward().unwrap();
        let g: Vec<f32> = g.get(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(g, vec![0.0, 1.0, 0.0, 0.0]);
        let nchw = x.as_tensor().permute((0, 3, 1, 2)).unwrap();
        let candle = nchw.max_pool2d(2).unwrap();
        let g = candle.sum_all().unwrap().backward().unwrap();
        let g: Vec<f32> = g.get(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(
            g,
            vec![0.0, 0.25, 0.0, 0.0],
            "candle's backward changed: revisit the docs"
        );
    }

    #[test]
    fn update_in_place_writes_the_shared_storage() {
        let theta = var(&[4, 5], 11);
        let view = theta.as_tensor().clone();
        let before: Vec<f32> = view.flatten_all().unwrap().to_vec1().unwrap();
        // A transposed gradient is made contiguous first.
        let g = Tensor::from_vec(values(20, 12), (5, 4), &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        let expected: Vec<f32> = (theta.as_tensor() - (&g * 0.5).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let done = update_in_place(&theta, &g, |p, g| {
            for (p, g) in p.iter_mut().zip(g) {
                *p -= 0.5 * g;
            }
        })
        .unwrap();
        assert!(done);
        let after: Vec<f32> = view.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(after, expected);
        assert_ne!(after, before);
        // Not f32: nothing done, the caller falls back.
        let t64 = theta.as_tensor().to_dtype(DType::F64).unwrap();
        let g64 = g.to_dtype(DType::F64).unwrap();
        assert!(!update_in_place(&t64, &g64, |_, _| unreachable!()).unwrap());
        // A gradient of the wrong size is an error, not a partial update.
        let short = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        assert!(update_in_place(&theta, &short, |_, _| unreachable!()).is_err());
    }

    /// On a CUDA device the kernels fall back to candle's ops; they must
    /// compute what the fused CPU kernels compute. Skips without a GPU.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_fallbacks_match_the_cpu_kernels() {
        let Ok(gpu) = Device::new_cuda(0) else {
            eprintln!("cuda_fallbacks_match_the_cpu_kernels: no CUDA device, skipped");
            return;
        };
        let to_gpu = |v: &Var| v.as_tensor().to_device(&gpu).unwrap();
        let back = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
        let x = var(&[2, 6, 6, 3], 21);
        let k = var(&[4, 3, 3, 3], 22);
        let b = var(&[4], 23);
        let cpu = max_pool2x2(&conv2d(&x, &k, Some(&b), 1, true).unwrap(), true).unwrap();
        let on_gpu = max_pool2x2(
            &conv2d(&to_gpu(&x), &to_gpu(&k), Some(&to_gpu(&b)), 1, true).unwrap(),
            true,
        )
        .unwrap();
        close(&back(&on_gpu), &cpu, 1e-4);
        let w = var(&[3, 7], 24);
        let xb = var(&[5, 7], 25);
        let lb = var(&[3], 26);
        let cpu = linear(&xb, &w, Some(&lb), true).unwrap();
        let on_gpu = linear(&to_gpu(&xb), &to_gpu(&w), Some(&to_gpu(&lb)), true).unwrap();
        close(&back(&on_gpu), &cpu, 1e-4);
        let labels = Tensor::new(&[0u32, 2, 1, 1, 0], &Device::Cpu).unwrap();
        let cpu = softmax_cross_entropy(&cpu, &labels).unwrap();
        let on_gpu = softmax_cross_entropy(&on_gpu, &labels.to_device(&gpu).unwrap()).unwrap();
        close(&back(&on_gpu), &cpu, 1e-4);
    }
}
